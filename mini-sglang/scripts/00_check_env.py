#!/usr/bin/env python3
"""00 · Environment: GPU, topology, CUDA, mini-SGLang version, JIT readiness, caches, measured peaks.

What it measures
    Everything the later mini-SGLang scripts rely on, so a failure there can be traced back here:
    the GPUs and how they are linked (nvidia-smi topo), driver, CUDA runtime, SM count; torch,
    FlashInfer, tvm-ffi and mini-SGLang (commit, source folder, the torch/transformers pins it
    declares); the tvm-ffi JIT toolchain (nvcc, ninja, host c++, the target architecture) and its
    cache (~/.cache/tvm-ffi or $TVM_FFI_CACHE_DIR) with the mini-SGLang modules already built;
    FlashInfer's JIT cache; which attention backends mini-SGLang can use on this GPU; the NCCL
    version and whether `-lnccl` can link PyNCCL; ncu/nsys; and the measured copy bandwidth and
    bf16 GEMM throughput that every "% of peak" in this track divides by.
    Then it calls index, store and the radix compare once (building them if needed), times how a
    fresh process loads the cached index module, and (full run) builds PyNCCL.

What the plan expected (hypotheses)
    * JIT readiness: the index/store kernels compile on first use (nvcc via tvm-ffi) and are
      cached, so a second process loads them in milliseconds.
    * Radix and PyNCCL are "AOT" modules. Reading kernel/utils.py:load_aot says they are compiled
      on first use too, just from fixed sources; this run shows which.

Run
    python mini-sglang/scripts/00_check_env.py --quick     # ~30 s; skips the PyNCCL build and the ncu probe
    python mini-sglang/scripts/00_check_env.py             # full: + PyNCCL build (-lnccl), ncu counter probe
    (no ncu/nsys variant: this script checks that ncu and nsys work)
Writes mini-sglang/results/00_check_env/: gpus.csv, packages.csv, jit_cache.csv, flashinfer_cache.csv,
backends.csv, story.txt, summary.json (refreshes reports/environment.md).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import gpu, story  # noqa: E402
from common.checks import profilers, require_gpu, require_module, run_main  # noqa: E402
from common.results import Run  # noqa: E402
import _msgl  # noqa: E402

INDEX_ROW, STORE_ROW = 8192, 2048   # Llama-3.1-8B: hidden 4096 bf16; 8 KV heads x 128 x bf16


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="skip the PyNCCL build and the ncu counter probe (~30 s)")
    p.add_argument("--out", default=None, help="results folder (default mini-sglang/results/00_check_env)")
    return p.parse_args(argv)


def tvm_cache_root() -> Path:
    return Path(os.environ.get("TVM_FFI_CACHE_DIR", Path("~/.cache/tvm-ffi").expanduser()))


def jit_cache_rows(root: Path) -> list[dict]:
    """The mini-SGLang modules in the tvm-ffi cache: name (template arguments), built or not, size."""
    rows = []
    for d in sorted(root.glob("minisgl__*")) if root.is_dir() else []:
        sos = list(d.glob("*.so"))
        body = re.sub(r"_[0-9a-f]{16}$", "", d.name[len("minisgl__"):])   # <module>_<template args>_<hash>
        module, _, targs = body.partition("_")
        rows.append({"module": module, "template_args": targs, "folder": d.name, "built": bool(sos),
                     "size_kb": round(sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) / 1024, 1),
                     "modified_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(d.stat().st_mtime))})
    return rows


def tool(name: str, args=("--version",)) -> dict:
    path = shutil.which(name)
    if not path:
        return {"tool": name, "path": None, "version": None}
    try:
        out = subprocess.run([path, *args], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    m = re.search(r"release ([\d.]+)|(\d+\.\d+(\.\d+)*)", out)
    return {"tool": name, "path": path, "version": (m.group(1) or m.group(2)) if m else out[:60]}


def declared_pins() -> str:
    """What the installed minisgl distribution declares for torch/transformers (pip metadata)."""
    try:
        reqs = metadata.requires("minisgl") or []
    except metadata.PackageNotFoundError:
        return "not pip-installed (source tree on PYTHONPATH): pins not enforced"
    pins = [r for r in reqs if re.match(r"(torch|transformers)\b", r)]
    return "; ".join(pins) or "no torch/transformers pins declared"


def libnccl_for_link() -> dict:
    """Can `-lnccl` (PyNCCL's link flag) find an unversioned libnccl.so?"""
    dirs = [d for d in os.environ.get("LIBRARY_PATH", "").split(":") if d] + ["/usr/lib/x86_64-linux-gnu", "/usr/lib64",
                                                                            "/usr/local/lib", "/usr/local/cuda/lib64"]
    hit = next((str(Path(d) / "libnccl.so") for d in dirs if (Path(d) / "libnccl.so").exists()), None)
    wheel = None
    try:
        import nvidia.nccl as nn  # the pip wheel torch depends on ships only libnccl.so.2
        wheel = str(Path(list(nn.__path__)[0]) / "lib")
    except ImportError:
        pass
    return {"libnccl.so on the linker path": hit, "nvidia-nccl wheel lib dir": wheel}


def reload_time_in_new_process(row_bytes: int, splits: int) -> float | None:
    """Seconds a fresh Python process needs to load the (cached) index module, torch import excluded."""
    code = ("import time,torch; from minisgl.kernel.index import _jit_index_module as j; t=time.perf_counter(); "
            f"j({row_bytes}, num_splits={splits}); print('LOAD', time.perf_counter()-t)")
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return None
    m = re.search(r"LOAD ([\d.e-]+)", p.stdout)
    return float(m.group(1)) if m else None


def main(argv=None) -> int:
    args = parse_args(argv)
    torch = require_module("torch", "pip install -r requirements.txt")
    require_gpu(torch)
    with Run(__file__, args, out=args.out) as run:
        prov = run.summary["provenance"]
        g = gpu.gpus()
        run.table("gpus", g or [{"name": torch.cuda.get_device_name(0)}])
        topo = gpu.topology()
        props = torch.cuda.get_device_properties(0)
        cc = f"{props.major}.{props.minor}"
        run.log(f"{len(g)} GPU(s): {prov['gpu']}, driver {prov['driver']}, CUDA runtime {torch.version.cuda}, "
                f"{props.multi_processor_count} SMs, compute capability {cc}")
        nccl_v = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None

        # ---- software
        fi = require_module("flashinfer", "pip install flashinfer-python==0.6.15.post1")
        tvm_ffi = require_module("tvm_ffi", "pip install apache-tvm-ffi==0.1.11")
        kernel = _msgl.require_minisgl("minisgl.kernel")
        src = _msgl.source_root()
        commit = prov["packages"].get("minisgl") or (gpu.minisgl_commit(src.parents[1]) if src else "unknown")
        pkgs = [{"package": k, "version": v} for k, v in prov["packages"].items()]
        pkgs += [{"package": "apache-tvm-ffi (import)", "version": getattr(tvm_ffi, "__version__", "?")},
                 {"package": "NCCL (torch)", "version": nccl_v},
                 {"package": "minisgl source", "version": str(src) if src else "?"},
                 {"package": "minisgl declared pins", "version": declared_pins()}]
        tools = [tool("nvcc"), tool("ninja"), tool(os.environ.get("CXX", "c++")), tool("nvidia-smi", ("--version",))]
        for t in tools:
            pkgs.append({"package": f"tool: {t['tool']}", "version": f"{t['version']} ({t['path']})" if t["path"] else "MISSING"})
        arch = os.environ.get("TVM_FFI_CUDA_ARCH_LIST") or f"{cc} (from nvidia-smi compute_cap)"
        pkgs.append({"package": "tvm-ffi CUDA target", "version": arch})
        run.table("packages", pkgs)
        missing = [t["tool"] for t in tools[:3] if not t["path"]]
        if missing:
            run.note(f"JIT toolchain incomplete: {', '.join(missing)} not on PATH; index/store builds will fail")

        # ---- JIT: call each custom module once; see what the cache holds afterwards
        root = tvm_cache_root()
        before = {r["folder"] for r in jit_cache_rows(root)}
        run.log(f"tvm-ffi cache {root}: {len(before)} mini-SGLang module folder(s) before this run")
        w = torch.randn(1024, INDEX_ROW // 2, device="cuda", dtype=torch.bfloat16)
        ids = torch.randint(0, 1024, (64,), device="cuda", dtype=torch.int32)
        out, t_index = _msgl.first_call(lambda: kernel.indexing(w, ids), "index (8192-B rows)")
        ok_index = bool(torch.equal(out, torch.nn.functional.embedding(ids.long(), w)))
        kv = torch.randn(2, 4096, STORE_ROW // 2, device="cuda", dtype=torch.bfloat16)
        loc = torch.randperm(4096, device="cuda")[:64].to(torch.int32)
        k = torch.randn(64, STORE_ROW // 2, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        _, t_store = _msgl.first_call(lambda: kernel.store_cache(kv[0], kv[1], loc, k, v), "store (2048-B rows)")
        ok_store = bool(torch.equal(kv[0][loc.long()], k) and torch.equal(kv[1][loc.long()], v))
        a = torch.arange(4096, dtype=torch.int32)
        b = a.clone()
        b[3000] = -1
        res, t_radix = _msgl.first_call(lambda: kernel.fast_compare_key(a, b), "radix (host c++)")
        ok_radix = int(res) == 3000
        torch.cuda.synchronize()
        run.log(f"first calls: index {t_index:.2f} s ({'ok' if ok_index else 'WRONG'}), store {t_store:.2f} s "
                f"({'ok' if ok_store else 'WRONG'}), radix {t_radix:.2f} s ({'ok' if ok_radix else 'WRONG'})")
        if not (ok_index and ok_store and ok_radix):
            raise RuntimeError("a mini-SGLang kernel disagrees with its torch reference; run 01_test_kernels.py")
        t_reload = reload_time_in_new_process(INDEX_ROW, _msgl.index_splits(INDEX_ROW))
        run.log(f"a fresh process loads the cached index module in "
                f"{'?' if t_reload is None else f'{t_reload * 1e3:.1f} ms'} (torch import excluded)")

        nccl_link = libnccl_for_link()
        t_nccl, nccl_err = None, None
        if not args.quick:
            run.log("building PyNCCL (nvcc + -lnccl) ...")
            try:
                from minisgl.kernel.pynccl import _load_nccl_module
                _, t_nccl = _msgl.first_call(_load_nccl_module, "pynccl")
            except Exception as e:  # a failed build is a finding here, not a crash
                nccl_err = str(e).splitlines()[0][:240]
                run.log(f"[ERROR] PyNCCL build: {nccl_err}")
        jit = jit_cache_rows(root)
        for r in jit:
            r["new_in_this_run"] = r["folder"] not in before
        run.table("jit_cache", jit)

        # ---- FlashInfer's own JIT cache
        try:
            from flashinfer.jit import env as fi_env
            fi_dir = Path(fi_env.FLASHINFER_JIT_DIR)
        except Exception:
            fi_dir = Path(os.environ.get("FLASHINFER_WORKSPACE_BASE", Path.home())) / ".cache" / "flashinfer"
        fi_rows = [{"module": d.name, "built": bool(list(d.glob("*.so")))} for d in sorted(fi_dir.glob("*"))
                   if d.is_dir()] if fi_dir.is_dir() else []
        run.table("flashinfer_cache", fi_rows or [{"module": "(empty)", "built": False}])

        # ---- attention backends mini-SGLang offers here (engine/engine.py:_adjust_config, attention/__init__.py)
        try:
            import sgl_kernel.flash_attn  # noqa: F401
            fa_ok, fa_why = True, "sgl_kernel.flash_attn imports"
        except Exception as e:
            fa_ok, fa_why = False, f"sgl_kernel.flash_attn: {e.__class__.__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
        sm100 = props.major == 10
        auto = "trtllm" if sm100 else ("fa,fi" if props.major == 9 else "fi")
        auto_ok = auto == "fi" or (auto == "fa,fi" and fa_ok) or (auto == "trtllm" and sm100)
        backends = [{"backend": "fi", "usable": True, "why": f"flashinfer {fi.__version__}"},
                    {"backend": "fa", "usable": fa_ok and props.major >= 9, "why": fa_why},
                    {"backend": "trtllm", "usable": sm100, "why": "needs sm100 (Blackwell)"},
                    {"backend": f"auto -> {auto}", "usable": auto_ok, "why": "what LLM(...) picks without attention_backend="}]
        run.table("backends", backends)
        if not backends[-1]["usable"]:
            run.note(f"the default attention backend ({auto}) is not usable here: pass attention_backend='fi'")

        # ---- profilers and peaks
        prof = profilers(probe=not args.quick)
        pk = gpu.peaks()
        ds = pk.get("datasheet") or {}
        run.headline(gpu=prov["gpu"], gpu_count=len(g), sm_count=props.multi_processor_count, nccl=nccl_v,
                     minisgl_commit=commit, copy_tb_s=pk["dram_tb_s"], bf16_tflops=pk["bf16_tflops"],
                     index_first_call_s=t_index, store_first_call_s=t_store, radix_first_call_s=t_radix,
                     index_reload_ms=None if t_reload is None else t_reload * 1e3)

        # ---- verdicts
        def built(mod, args_=""):
            return [r for r in jit if r["module"] == mod and r["built"] and r["template_args"].startswith(args_)]
        idx_mod = built("index", f"{INDEX_ROW}_{_msgl.index_splits(INDEX_ROW)}_128_1_false")
        run.observe("index/store compile on first use (nvcc via tvm-ffi) and are cached per row size",
                    f"cache holds {', '.join(r['folder'] for r in idx_mod + built('store', str(STORE_ROW))) or 'nothing'}; "
                    f"first calls in this process: index {t_index:.2f} s, store {t_store:.2f} s",
                    "confirmed" if idx_mod and built("store", str(STORE_ROW)) else "refuted", "jit_cache.csv")
        if t_reload is not None:
            run.observe("a second process loads a cached module in milliseconds",
                        f"fresh process: {t_reload * 1e3:.1f} ms to load the index module (threshold 500 ms)",
                        "confirmed" if t_reload < 0.5 else "refuted", "log.txt")
        run.observe("radix (and PyNCCL) are AOT modules, prebuilt before first use",
                    f"radix lives in {', '.join(r['folder'] for r in built('radix')) or '(not found)'} of the JIT "
                    f"cache; first call {t_radix:.2f} s" + ("" if "minisgl__radix" not in " ".join(before)
                                                          else " (already cached before this run)"),
                    "refuted" if built("radix") else "inconclusive", "jit_cache.csv")
        if not args.quick:
            run.observe("PyNCCL builds here (nvcc + -lnccl; needs NCCL >= 2.27 at run time)",
                        f"build {'ok in %.1f s' % t_nccl if nccl_err is None else 'FAILED: ' + nccl_err}; torch NCCL "
                        f"{nccl_v}; libnccl.so for the linker: {nccl_link['libnccl.so on the linker path'] or 'not found'}",
                        "confirmed" if nccl_err is None else "refuted", "log.txt")

        # ---- story
        links = ", ".join(f"{k} {v}" for k, v in list(topo.get("links", {}).items())[: 2 * len(g)]) or "single GPU"
        ncu_d, nsys_d = prof.get("ncu", {}), prof.get("nsys", {})
        items = [
            (f"GPUs: {len(g)} x {prov['gpu']} · driver {prov['driver']} · CUDA {torch.version.cuda} · "
             f"{props.multi_processor_count} SMs · cc {cc} · L2 {prov.get('l2_mb')} MB", [(f"links: {links}", [])]),
            (f"software: torch {torch.__version__} · flashinfer {fi.__version__} · tvm-ffi "
             f"{getattr(tvm_ffi, '__version__', '?')} · NCCL {nccl_v}", [(f"mini-SGLang {commit} from {src}", []),
                                                                        (f"declared pins: {declared_pins()}", [])]),
            ("JIT toolchain: " + " · ".join(f"{t['tool']} {t['version'] or 'MISSING'}" for t in tools[:3])
             + f" · target {arch}", []),
            (f"tvm-ffi cache {root}: {len(jit)} mini-SGLang module(s)", [
                (f"index {INDEX_ROW} B: first call {t_index:.2f} s; new process load "
                 f"{'?' if t_reload is None else f'{t_reload * 1e3:.1f} ms'}", []),
                (f"store {STORE_ROW} B: {t_store:.2f} s · radix (host c++): {t_radix:.2f} s", []),
                (("pynccl: " + ("built in %.1f s" % t_nccl if nccl_err is None else "FAILED " + nccl_err))
                 if not args.quick else "pynccl: not built (--quick)", []),
                (f"libnccl.so for -lnccl: {nccl_link['libnccl.so on the linker path'] or 'not found'}; wheel lib "
                 f"dir: {nccl_link['nvidia-nccl wheel lib dir']}", [])]),
            (f"FlashInfer JIT cache {fi_dir}: {len(fi_rows)} module(s)", []),
            ("attention backends: " + " · ".join(f"{b['backend']} {'yes' if b['usable'] else 'no'}" for b in backends), []),
            (f"profilers: ncu {ncu_d.get('version') or 'missing'} (counters: {ncu_d.get('counters', 'not probed')}) · "
             f"nsys {nsys_d.get('version') or 'missing -> torch.profiler fallback'}", []),
            (f"measured peaks: copy {pk['dram_tb_s']:.2f} TB/s (datasheet {ds.get('dram_tb_s', '?')}) · bf16 GEMM "
             f"{pk['bf16_tflops']:.0f} TFLOP/s (datasheet {ds.get('bf16_tflops', '?')})", []),
        ]
        run.json("profilers", prof)
        run.story(story.tree(f"ENVIRONMENT for mini-SGLang — {prov['gpu']}", items))
        print(run.summary["story"])
    return 0


if __name__ == "__main__":
    run_main(main)
