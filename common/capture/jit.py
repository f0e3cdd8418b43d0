"""Cold start: build the JIT modules the pipeline's steps will load, in parallel, before anything is timed.

    python -m common jit --system flashinfer                      # every module flashinfer's steps load
    python -m common jit --modules fi:decode,msgl:store_2048      # just these
    python -m common jit --list [--system mini-sglang]            # the catalogue (no torch, no GPU needed)

FlashInfer compiles a module (nvcc through ninja) the first time a wrapper's plan() or an op's first call
needs it, and mini-SGLang its index/store kernels (tvm-ffi ``load_inline``, one module per row size) and
its radix / PyNCCL modules (``load_aot``) on first call. Inside a timed step that compile is paid serially
(240 s of a 397 s FlashInfer --quick pipeline on a fresh H100). Here it is paid once, up front, on all
CPU cores, and reported apart from the measurements:

* FlashInfer: the same JitSpec objects the wrappers create (so the cache folder -- the module's uri --
  is the one they look for), all in one ninja build over every core (FlashInfer's ``build_jit_specs``); its
  ninja logs are then handed to each module's folder, where a wrapper's first call runs ninja, and a dry run
  there proves the module is up to date. A module whose .so already exists is "cached".
* SGLang: its own JIT kernels (``sglang/kernels/ops``) through the builder functions its ops call, with the
  arguments a Llama-3.1-8B server passes, likewise in a thread pool.
* mini-SGLang: each module's own builder (``minisgl.kernel.index._jit_index_module(row, num_splits=)``,
  ``store._jit_store_module(row)``, ``radix._load_radix_module()``, ``pynccl._load_nccl_module()``) in a
  thread pool, at the same time as the FlashInfer build.

One line per module -- ``built 12.3 s`` (seconds from the start of the build to its .so), ``cached``,
``skipped: <why>``, ``failed: <reason>`` -- and a total; ``--csv PATH`` writes the table (warmup.csv in the
pipeline's results). A failed module never stops the others. Exit code: 0 every module built, cached or
skipped; 1 some failed; 2 a package or the GPU is missing (one [setup] line); 130 interrupted.
"""
from __future__ import annotations

import csv
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from common.base.checks import SetupError, require_module

# ------------------------------------------------------------------ the catalogue

# the attention modules the workbook loads: bf16 q/kv/o, int32 indptr/indices, head_dim 128 (Llama-3.1 8B/70B,
# Qwen2.5-7B), pos_encoding_mode NONE (0), no sliding window, no logits soft cap, no fp16 QK reduction
_ATTN = "dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_{idx}head_dim_qk_128_head_dim_vo_128_posenc_0_use_swa_False_use_logits_cap_False"
_DECODE_URI = "batch_decode_with_kv_cache_" + _ATTN.format(idx="dtype_idx_i32_")
_PREFILL_URI = "batch_prefill_with_kv_cache_" + _ATTN.format(idx="dtype_idx_i32_") + "_f16qk_False"
_SINGLE_URI = "single_prefill_with_kv_cache_" + _ATTN.format(idx="") + "_f16qk_False"


@dataclass(frozen=True)
class Module:
    name: str            # what _steps.py and --modules use
    kind: str            # "flashinfer" | "tvm-ffi" | "sgl-jit" (which builder)
    uri: str             # the cache folder's name: FlashInfer's uri, tvm-ffi's module name
    what: str            # which calls load it
    args: tuple = ()     # what the builder needs to make it


def _index(row: int, splits: int, what: str) -> Module:
    # minisgl/kernel/index.py: _jit_index_module(element_size, num_splits=) -> load_jit("index", row, splits, 128, 1, false)
    return Module(f"msgl:index_{row}_s{splits}", "tvm-ffi", f"minisgl__index_{row}_{splits}_128_1_false", what,
                  ("index", row, splits))


def _store(row: int, what: str) -> Module:
    # minisgl/kernel/store.py: _jit_store_module(element_size) -> load_jit("store", row, 128, 1, false)
    return Module(f"msgl:store_{row}", "tvm-ffi", f"minisgl__store_{row}_128_1_false", what, ("store", row))


CATALOGUE = [
    # decode.py BatchDecodeWithPagedKVCacheWrapper.plan(), use_tensor_cores=False: get_batch_decode_module(q, kv, o,
    #   indptr.dtype, head_dim, head_dim, PosEncodingMode[pos_encoding_mode], window_left != -1, logits_soft_cap > 0)
    Module("fi:decode", "flashinfer", _DECODE_URI,
           "BatchDecodeWithPagedKVCacheWrapper (CUDA cores; its split-KV merge kernel is in the same module)",
           ("batch_decode",)),
    # prefill.py Batch{Paged,Ragged}KVCacheWrapper.plan(): get_batch_prefill_module(backend, q, kv, o, indptr.dtype,
    #   head_dim_qk, head_dim_vo, posenc, window_left >= 0, logits_soft_cap > 0, use_fp16_qk_reduction); decode with
    #   use_tensor_cores=True calls it with backend "fa2" (backend "auto" resolves to fa2 for bf16 there)
    Module("fi:prefill_fa2", "flashinfer", _PREFILL_URI,
           'Batch{Paged,Ragged}PrefillWrapper backend="fa2"; BatchDecode with use_tensor_cores=True '
           "(SGLang and mini-SGLang decode at GQA >= 4)", ("batch_prefill", "fa2")),
    Module("fi:prefill_fa3", "flashinfer", _PREFILL_URI + "_sm90",
           'Batch{Paged,Ragged}PrefillWrapper backend="fa3", or "auto" on sm90 (SGLang\'s ragged prefill); '
           "Hopper only", ("batch_prefill", "fa3")),
    # prefill.py single_prefill_with_kv_cache(): get_single_prefill_module(backend, q, k, o, head_dim_qk, head_dim_vo,
    #   posenc, window_left >= 0, logits_soft_cap > 0, use_fp16_qk_reduction); backend "auto": fa3 on sm90, else fa2
    Module("fi:single_prefill_fa2", "flashinfer", _SINGLE_URI, 'single_prefill_with_kv_cache backend="fa2"',
           ("single_prefill", "fa2")),
    Module("fi:single_prefill_fa3", "flashinfer", _SINGLE_URI + "_sm90",
           'single_prefill_with_kv_cache backend="fa3" (or "auto" on sm90); Hopper only', ("single_prefill", "fa3")),
    Module("fi:norm", "flashinfer", "norm", "rmsnorm, fused_add_rmsnorm (the CUDA path; without nvidia-cutlass-dsl "
           "it is the one that runs)", ("norm",)),
    Module("fi:rope", "flashinfer", "rope", "apply_rope*, apply_llama31_rope*, apply_rope_with_cos_sin_cache(_inplace)",
           ("rope",)),
    Module("fi:cascade", "flashinfer", "cascade", "merge_state, merge_states (SGLang's prefix + extend merge)",
           ("cascade",)),
    Module("fi:sampling", "flashinfer", "sampling", "flashinfer.sampling (non-greedy sampling)", ("sampling",)),
    Module("fi:silu_and_mul", "flashinfer", "silu_and_mul", "silu_and_mul (mini-SGLang's MLP)", ("act", "silu")),
    _index(8192, 4, "indexing(): Llama-3.1-8B embedding rows (hidden 4096 bf16), 4 warps per row"),
    _index(16384, 4, "indexing(): Llama-3.1-70B embedding rows (hidden 8192 bf16)"),
    _index(7168, 2, "indexing(): Qwen2.5-7B embedding rows (hidden 3584 bf16), 2 warps per row"),
    _index(2048, 4, "indexing(): the tiny preset's rows (hidden 1024 bf16)"),
    *(_index(8192, s, f"02's warps-per-row sweep: {s} warp(s) per 8192-B row") for s in (1, 2, 8, 16)),
    *(_store(r, f"store_cache(): {r}-B KV rows (Llama-3.1-8B, {tp})")
      for r, tp in ((2048, "TP1"), (1024, "TP2"), (512, "TP4"), (256, "TP8"))),
    Module("msgl:radix", "tvm-ffi", "minisgl__radix", "fast_compare_key (the radix cache; host C++, g++)", ("radix",)),
    Module("msgl:pynccl", "tvm-ffi", "minisgl__pynccl", "PyNCCL all-reduce (nvcc + -lnccl)", ("pynccl",)),
    # SGLang's own JIT kernels (sglang/kernels/ops, tvm-ffi load_jit, cached as sgl_kernel_jit_<args>_<source hash>
    # in TVM_FFI_CACHE_DIR, make_cpp_args spelling: bf16_t, int64_t, true): a server compiled them one after another
    # inside its first prefill CUDA graph capture
    # (33.6 s of a cold start on an H200, 2026-11-28). The arguments are the ones a Llama-3.1-8B bf16 server at TP 1
    # passes: activation_module(input.dtype) for SiluAndMul; clamp_position on ForwardBatch.seq_lens (int64,
    # schedule_batch.py); the fused RoPE with is_neox (Llama's rope_is_neox_style), rope_dim = head_dim 128, k and
    # q dtype; store_cache with K and V rows of num_kv_heads x head_dim x 2 bytes (8 x 128 x 2 at TP 1).
    Module("sgl:activation", "sgl-jit", "sgl_kernel_jit_activation_bf16_t", "SiluAndMul (the MLP's activation)",
           ("activation", "bfloat16")),
    Module("sgl:clamp_position", "sgl-jit", "sgl_kernel_jit_clamp_position_int64_t",
           "decode positions from seq_lens (ForwardBatch)", ("clamp_position", "int64")),
    Module("sgl:fused_rope", "sgl-jit", "sgl_kernel_jit_fused_rope_true_128",
           "the fused rotary embedding (NeoX style, rope_dim 128, bf16)", ("fused_rope", True, 128, "bfloat16")),
    Module("sgl:kvcache_2048", "sgl-jit", "sgl_kernel_jit_kvcache_2048_2048",
           "store_cache(): 2048-B K and V rows (Llama-3.1-8B at TP 1)", ("kvcache", 2048, 2048)),
]
MODULES = {m.name: m for m in CATALOGUE}


# ------------------------------------------------------------------ results and their report

@dataclass
class Result:
    name: str
    kind: str
    status: str                      # built | cached | skipped | failed | setup
    seconds: float | None = None
    detail: str = ""
    uri: str = ""


def short_reason(e) -> str:
    """The informative line of an exception or build log: the first line naming an error."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if not lines:
        return e.__class__.__name__ if isinstance(e, BaseException) else "no message"
    hit = next((line for line in lines if any(w in line.lower() for w in ("error", "cannot", "fatal", "undefined"))),
               lines[0])
    return hit[:200]


def format_line(r: Result, width: int = 22) -> str:
    if r.status == "built":
        what = f"built {r.seconds:.1f} s"
    elif r.status == "cached":
        what = "cached"
    elif r.status == "setup":
        what = "not built: the machine is not ready (the [setup] line below)"
    else:
        what = f"{r.status}: {r.detail}"
    return f"  {r.name:<{width}} {what}"


def format_total(results: list[Result], wall: float, jobs: int) -> str:
    counts = {s: sum(r.status == s for r in results) for s in ("built", "cached", "skipped", "failed", "setup")}
    parts = [f"{n} {s if s != 'setup' else 'not built (setup)'}" for s, n in counts.items() if n]
    return (f"warm-up: {len(results)} module(s) — {', '.join(parts) or 'nothing'} — {wall:.1f} s wall on {jobs} "
            f"CPU cores (compile time, kept apart from every measurement)")


def exit_code(results: list[Result]) -> int:
    if any(r.status == "setup" for r in results):
        return 2
    return 1 if any(r.status == "failed" for r in results) else 0


def write_csv(path, results: list[Result]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["module", "kind", "status", "seconds", "uri", "detail"])
        for r in results:
            w.writerow([r.name, r.kind, r.status, "" if r.seconds is None else round(r.seconds, 1), r.uri, r.detail])


# ------------------------------------------------------------------ running the builders

class Reporter:
    """``done(name, status, seconds, detail)``: records a module's outcome once and prints its line."""

    def __init__(self, mods, echo):
        self.mods = {m.name: m for m in mods}
        self.results: dict[str, Result] = {}
        self.width = max((len(m.name) for m in mods), default=10)
        self.echo, self.lock = echo, threading.Lock()

    def __call__(self, name, status, seconds=None, detail=""):
        with self.lock:
            if name in self.results:
                return
            m = self.mods[name]
            r = self.results[name] = Result(name, m.kind, status, seconds, detail, m.uri)
            self.echo(format_line(r, self.width))

    def pending(self, mods):
        with self.lock:
            return [m for m in mods if m.name not in self.results]


def build_each(mods, done, fn, jobs: int | None = None) -> None:
    """Call ``fn(module)`` for every module in a thread pool; fn returns "built", "cached" or ("skipped", why);
    an exception is that module's failure (a SetupError its [setup] line) and the others go on."""
    def one(m):
        t = time.perf_counter()
        try:
            out = fn(m)
        except SetupError as e:
            done(m.name, "setup", detail=str(e))
        except Exception as e:  # noqa: BLE001 - a failed build is one line in the report
            done(m.name, "failed", detail=short_reason(e))
        else:
            status, why = out if isinstance(out, tuple) else (out, "")
            done(m.name, status, time.perf_counter() - t if status == "built" else None, why)
    with ThreadPoolExecutor(max_workers=max(1, min(len(mods), jobs or os.cpu_count() or 1))) as pool:
        list(pool.map(one, mods))


def warm(mods, builders=None, echo=print, jobs: int | None = None) -> list[Result]:
    """Build ``mods``: one thread per builder kind, all at once. ``builders`` maps a kind to
    ``fn(modules, done)`` (default BUILDERS); a builder that raises fails only its own modules."""
    builders = BUILDERS if builders is None else builders
    done = Reporter(mods, echo)
    kinds: dict[str, list] = {}
    for m in mods:
        kinds.setdefault(m.kind, []).append(m)

    def guard(kind, ms):
        try:
            if kind not in builders:
                raise RuntimeError(f"no builder for {kind} modules")
            builders[kind](ms, done)
        except SetupError as e:
            for m in done.pending(ms):
                done(m.name, "setup", detail=str(e))
        except Exception as e:  # noqa: BLE001
            for m in done.pending(ms):
                done(m.name, "failed", detail=short_reason(e))
        for m in done.pending(ms):
            done(m.name, "failed", detail="its builder did not report it")

    threads = [threading.Thread(target=guard, args=kv, daemon=True) for kv in kinds.items()]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):       # join with a timeout: Ctrl-C still reaches this thread
        for t in threads:
            t.join(0.2)
    return [done.results[m.name] for m in mods]


def _require_cuda():
    torch = require_module("torch", "pip install -r requirements.txt")
    if not torch.cuda.is_available():
        raise SetupError("no CUDA GPU visible: the JIT modules are compiled for this machine's GPU, so there "
                         "is nothing to warm up here")
    return torch


def build_flashinfer(mods, done) -> None:
    """FlashInfer's modules in one ninja build over the wrappers' own JitSpecs."""
    torch = _require_cuda()
    require_module("flashinfer", "pip install flashinfer-python==0.6.15.post1")
    import flashinfer.jit as J
    from flashinfer.utils import is_sm90a_supported
    sm90a = is_sm90a_supported(torch.device("cuda"))
    bf, i32 = torch.bfloat16, torch.int32

    def spec(m):
        op = m.args[0]
        if op == "batch_decode":
            return J.gen_batch_decode_module(bf, bf, bf, i32, 128, 128, 0, False, False)
        if op == "batch_prefill":
            return J.gen_batch_prefill_module(m.args[1], bf, bf, bf, i32, 128, 128, 0, False, False, False)
        if op == "single_prefill":
            return J.gen_single_prefill_module(m.args[1], bf, bf, bf, 128, 128, 0, False, False, False)
        if op == "act":
            return J.gen_act_and_mul_module(m.args[1])
        import importlib
        return getattr(importlib.import_module(f"flashinfer.jit.{op}"), f"gen_{op}_module")()

    specs = {}
    for m in mods:
        if m.args[-1] == "fa3" and not sm90a:
            done(m.name, "skipped", detail="not an sm90a GPU: FA3 is Hopper-only (the wrappers run fa2 here)")
            continue
        try:
            s = specs[m.name] = spec(m)
        except Exception as e:  # noqa: BLE001
            done(m.name, "failed", detail=f"cannot make its JitSpec: {short_reason(e)}")
            continue
        if s.name != m.uri:
            print(f"  note: {m.name} is {s.name} in this FlashInfer (the catalogue says {m.uri})", flush=True)
    for name, s in list(specs.items()):
        if s.is_compiled:
            done(name, "cached")
            del specs[name]
    if not specs:
        return
    # One ninja over every module (subninja lines, FlashInfer's own build_jit_specs layout): every core works on
    # whichever objects are left, so no module waits for a slot. Built module by module, two at a time, this took
    # 177 s on a fresh H100 (2026-11-28) where one combined build takes about the longest module's time.
    # A combined build leaves its .ninja_log/.ninja_deps in the JIT folder, while a wrapper's first call runs
    # ninja in the module's own folder: without those logs that ninja rebuilds the module (seen on an H200,
    # 2026-11-23: 9.9 s and 23 s first calls). The outputs are absolute paths, so handing the two logs to each
    # module's folder (hand_over_logs) lets its ninja find them; a dry run per module proves it, and a module
    # that would still rebuild is built here, by its own spec.build(), never inside a timed step.
    import flashinfer.jit.env as jit_env
    cpus = os.cpu_count() or 1
    os.environ["MAX_JOBS"] = os.environ.get("HANDS_ON_MAX_JOBS") or str(cpus)
    print(f"  building {len(specs)} FlashInfer module(s) in one ninja (-j {os.environ['MAX_JOBS']}, {cpus} CPU "
          f"cores) ...", flush=True)
    t0 = time.perf_counter()
    root = Path(jit_env.FLASHINFER_JIT_DIR)
    stop = threading.Event()

    def watch():                                   # a module's line when its .so appears
        while not stop.is_set():
            for name, s in list(specs.items()):
                if name not in done.results and s.is_compiled:
                    done(name, "built", time.perf_counter() - t0)
            stop.wait(0.5)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        combined_build(list(specs.values()), root)
    except Exception as e:  # noqa: BLE001 - the modules it did not make fail with its reason
        stop.set()
        watcher.join()
        for name, s in specs.items():
            if not s.is_compiled:
                done(name, "failed", detail=short_reason(e))
    stop.set()
    watcher.join()
    for name, s in specs.items():
        if not s.is_compiled:
            continue
        hand_over_logs(root, Path(s.build_dir))
        if not up_to_date(s):                      # its own ninja would rebuild: do it now, untimed
            print(f"  note: {name}: its folder's ninja still saw work after the combined build; built again "
                  f"by its own spec.build()", flush=True)
            s.build(verbose=False)
        done(name, "built", time.perf_counter() - t0)


def combined_build(specs, root: Path) -> None:
    """FlashInfer's build_jit_specs: each spec's ninja file, one subninja build over all, in ``root``."""
    from flashinfer.jit.core import build_jit_specs
    build_jit_specs(specs, verbose=False, skip_prebuilt=True)


def hand_over_logs(root: Path, build_dir: Path) -> None:
    """Copy the combined build's .ninja_log and .ninja_deps into ``build_dir`` (absolute output paths: the
    module's own ninja finds its entries there). Proven on a two-module toy build (tests/test_jit.py)."""
    import shutil
    for f in (".ninja_log", ".ninja_deps"):
        if (root / f).exists():
            shutil.copyfile(root / f, build_dir / f)


def up_to_date(spec) -> bool:
    """``ninja -n`` in the module's folder, as a wrapper's first call would run it: no work to do?"""
    return dry_run_clean(Path(spec.build_dir), Path(spec.ninja_path))


def dry_run_clean(build_dir: Path, ninja_file: Path) -> bool:
    import subprocess
    try:
        r = subprocess.run(["ninja", "-n", "-C", str(build_dir), "-f", str(ninja_file)], capture_output=True,
                           text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0 and "no work to do" in r.stdout


def build_tvm_ffi(mods, done) -> None:
    """mini-SGLang's tvm-ffi modules, each through its own builder, in a thread pool."""
    _require_cuda()
    require_module("tvm_ffi", "pip install apache-tvm-ffi==0.1.11")
    require_module("minisgl.kernel", "pip install --no-deps mini-sglang at the README's commit, or put its "
                   "python/ folder on PYTHONPATH")
    from minisgl.kernel.index import _jit_index_module
    from minisgl.kernel.pynccl import _load_nccl_module
    from minisgl.kernel.radix import _load_radix_module
    from minisgl.kernel.store import _jit_store_module
    call = {"index": lambda row, s: _jit_index_module(row, num_splits=s), "store": _jit_store_module,
            "radix": _load_radix_module, "pynccl": _load_nccl_module}
    build_calls(mods, done, call, "tvm-ffi")


def build_calls(mods, done, call: dict, what: str) -> None:
    """Each module through ``call[its args[0]](*its other args)`` in a thread pool; "cached" where its file was
    there before (module_file), else "built"."""
    def one(m):
        cached = module_file(m) is not None
        call[m.args[0]](*m.args[1:])
        return "cached" if cached else "built"
    print(f"  building {len(mods)} {what} module(s) in a pool of {min(len(mods), os.cpu_count() or 1)} "
          f"thread(s) ...", flush=True)
    build_each(mods, done, one)


def build_sglang(mods, done) -> None:
    """SGLang's own JIT modules, each through the builder function its op calls, in a thread pool (nvcc only: the
    builders compile and load a module, they launch nothing)."""
    torch = _require_cuda()
    require_module("sglang", "pip install -r requirements.txt")
    from sglang.kernels.ops.activation.activation import activation_module
    from sglang.kernels.ops.attention.clamp_position import _jit_clamp_position_module
    from sglang.kernels.ops.attention.rope import _jit_fused_rope_module
    from sglang.kernels.ops.kvcache.kvcache import _jit_kvcache_module
    dt = {"bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32}
    call = {"activation": lambda d: activation_module(dt[d]),
            "clamp_position": lambda d: _jit_clamp_position_module(dt[d]),
            "fused_rope": lambda neox, dim, d: _jit_fused_rope_module(neox, dim, dt[d], dt[d]),
            "kvcache": _jit_kvcache_module}
    build_calls(mods, done, call, "SGLang JIT")


BUILDERS = {"flashinfer": build_flashinfer, "tvm-ffi": build_tvm_ffi, "sgl-jit": build_sglang}


# ------------------------------------------------------------------ a warm machine: known-built modules, no torch

# A warm-up whose modules are all built still paid torch's and flashinfer's imports to find out (about 7 s a
# pipeline on an H100, 2026-11-28). After a warm-up that built or found every module, the .so paths it found are
# kept with what decides them (GPU, FlashInfer and tvm-ffi versions); the next warm-up that asks for no other
# module, on the same GPU and versions, checks those files exist and says "cached" without importing torch.

STAMP = "jit-warm.json"


def stamp_key() -> dict | None:
    """What decides a module's file: the first visible GPU (common.capture.gpu.gpus: NVML or nvidia-smi, no CUDA
    context; its model and UUID) and the builders' versions. None without a GPU."""
    from importlib.metadata import PackageNotFoundError, version
    from common.capture.gpu import gpus
    seen = gpus()
    if not seen:
        return None
    gpu = f"{seen[0]['name']}, {seen[0].get('uuid') or '?'}"

    def ver(dist):
        try:
            return version(dist)
        except PackageNotFoundError:
            return None
    return {"gpu": gpu, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "flashinfer": ver("flashinfer-python"), "tvm_ffi": ver("apache-tvm-ffi"),
            "flashinfer_workspace": os.environ.get("FLASHINFER_WORKSPACE_BASE", ""),
            "tvm_ffi_cache": os.environ.get("TVM_FFI_CACHE_DIR", "")}


def _stamp_path() -> Path:
    from common.base.checks import cache_dir
    return Path(cache_dir()) / STAMP


def module_file(m: Module) -> Path | None:
    """The built file of ``m`` (after its builder ran in this process), None when there is none."""
    if m.kind == "flashinfer":
        import flashinfer.jit.env as jit_env
        f = Path(jit_env.FLASHINFER_JIT_DIR) / m.uri / f"{m.uri}.so"
        return f if f.exists() else None
    cache = Path(os.environ.get("TVM_FFI_CACHE_DIR", "~/.cache/tvm-ffi")).expanduser()
    if m.kind == "sgl-jit":           # <cache>/<build dir>/<uri>[_<more args>]_<source hash>.so
        return next(iter(sorted(cache.glob(f"*/{m.uri}_*.so"))), None)
    return next(iter(sorted(cache.glob(f"{m.uri}_*/*.so"))), None)


def write_stamp(mods, results) -> None:
    """After a warm-up in which every module was built, cached or skipped: keep their files for the next one."""
    ok = {r.name for r in results if r.status in ("built", "cached")}
    files = {}
    for m in mods:
        if m.name in ok:
            f = module_file(m)
            if f is None:
                return
            files[m.name] = str(f)
    key = stamp_key()
    if key is None:
        return
    try:
        old = json.loads(_stamp_path().read_text())
        if old.get("key") == key:
            files = {**old.get("files", {}), **files}
    except (OSError, ValueError):
        pass
    path = _stamp_path()
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"key": key, "files": files}, indent=1))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def cached_by_stamp(mods) -> list[Result] | None:
    """Every module of ``mods`` built on this GPU with these versions, its file still there: their "cached"
    results; else None (the warm-up imports torch and looks, as before)."""
    try:
        rec = json.loads(_stamp_path().read_text())
    except (OSError, ValueError, Exception):  # noqa: BLE001 - no stamp, or an unreadable one: look the slow way
        return None
    files = rec.get("files", {})
    if not all(m.name in files and Path(files[m.name]).is_file() for m in mods):
        return None
    if rec.get("key") != stamp_key():
        return None
    return [Result(m.name, m.kind, "cached", None, "", m.uri) for m in mods]


# ------------------------------------------------------------------ which modules a system needs


# ------------------------------------------------------------------ command line
