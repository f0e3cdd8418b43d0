#!/usr/bin/env python3
"""00 · Environment: GPU, topology, CUDA, mini-SGLang version, JIT readiness, caches, measured ceilings.

What it measures
    Everything the later mini-SGLang scripts rely on, so a failure there can be traced back here:
    the GPUs and how they are linked (nvidia-smi topo), driver, CUDA runtime, SM count; torch,
    FlashInfer, tvm-ffi and mini-SGLang (commit, source folder, the torch/transformers pins it
    declares); the tvm-ffi JIT toolchain (nvcc, ninja, host c++, the target architecture) and its
    cache (~/.cache/tvm-ffi or $TVM_FFI_CACHE_DIR) with the mini-SGLang modules already built;
    FlashInfer's JIT cache; which attention backends mini-SGLang can use on this GPU; the NCCL
    version and whether `-lnccl` can link PyNCCL; ncu/nsys; and the measured ceilings every "% of
    peak" in this track divides by (common.capture.ceilings.peaks: DRAM per kind of traffic, read, mixed, copy and write,
    each the best of several streaming probes far above L2, a kernel divided by the kind its traffic matches;
    bf16 = best over a GEMM shape sweep; cached per GPU, the same set every system reads; peaks.csv).
    Then it calls index (8 KiB rows), store (2 KiB and 256-B rows) and the radix compare once (building
    them if needed), times how 3 fresh processes load the cached index module, and (full run) builds PyNCCL.

What the plan expected (hypotheses: H_* below)
    * JIT readiness: the index/store kernels compile on first use (nvcc via tvm-ffi) and are
      cached, so a second process loads them in milliseconds (judged: < 500 ms in 3 fresh processes).
    * Radix and PyNCCL are "AOT" modules. Reading kernel/utils.py:load_aot says they are compiled
      on first use too, just from fixed sources; this run shows which.

Run
    python mini-sglang/scripts/00_check_env.py --quick     # ~40 s; skips the PyNCCL build and the ncu probe
    python mini-sglang/scripts/00_check_env.py             # full: + PyNCCL build (-lnccl), ncu counter probe
    python mini-sglang/scripts/00_check_env.py --reanalyse DIR --out OUT   # no GPU: the verdicts and story again
        from a recording (its tables, profilers.json and facts.csv; a recording from before facts.csv: its log.txt
        and story.txt)
    (no ncu/nsys variant: this script checks that ncu and nsys work)
Writes mini-sglang/results/00_check_env/: gpus.csv, packages.csv, peaks.csv, jit_cache.csv, flashinfer_cache.csv,
backends.csv, profilers.json, facts.csv (first-call and reload times, cache and link paths: what the verdicts and
story read), story.txt, summary.json (refreshes reports/environment.md).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _msgl  # noqa: E402
from _msgl import REPEATS  # noqa: E402
from common.base import story  # noqa: E402
from common.base.checks import require_gpu, require_module, run_main, SetupError  # noqa: E402
from common.capture import ceilings, gpu, procs  # noqa: E402
from common.capture.ncu import profilers  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.run import cli, recording  # noqa: E402
from common.run.results import Run  # noqa: E402

INDEX_ROW = 8192                      # Llama-3.1-8B embedding row: hidden 4096 bf16
STORE_ROWS = (2048, 256)              # Llama-3.1-8B KV rows: 8 KV heads x 128 x bf16 (TP1), 1 head (TP8)
PLAN = "PLAN.md session 2 / mini-sglang/reports/plan.md (00)"

H = declare(f"""
    jit = jit-first-use: index/store compile on first use (nvcc via tvm-ffi) and are cached per row size
        judged on: each JIT module called here (index {INDEX_ROW} B, store {STORE_ROWS[0]} B and {STORE_ROWS[1]} B
            rows) built in the tvm-ffi cache after its first call
        source: {PLAN}: 'JIT readiness (tvm-ffi, nvcc)'
    reload = jit-reload-ms: a second process loads a cached module in milliseconds
        judged on: ms for a fresh process to load the cached index module (torch import excluded), {REPEATS} fresh
            processes
        confirmed: <= 500 ms
        source: {PLAN}: 'cached, so a second process loads them in milliseconds', read as < 500 ms
    aot = aot-prebuilt: radix (and PyNCCL) are AOT modules, prebuilt before first use
        judged on: each AOT-listed module used here (radix; PyNCCL in the full run) absent from the JIT cache's
            first-use builds
        source: seed 002 kernel catalog ('CPU AOT', 'CUDA AOT'); kernel/utils.py:load_aot
    pynccl = pynccl-builds: PyNCCL builds here (nvcc + -lnccl; needs NCCL >= 2.27 at run time)
        judged on: the PyNCCL module builds and loads
        source: {PLAN} (05 needs it); analysis.md (reading the source)
""")


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="skip the PyNCCL build and the ncu counter probe (~40 s)")
    recording.add_flag(p)
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


def built(rows, module: str, args_prefix: str = "") -> list[dict]:
    return [r for r in rows if r["module"] == module and r["built"] and r["template_args"].startswith(args_prefix)]


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
    return {"linker": hit, "wheel": wheel}


def reload_ms(row_bytes: int, splits: int, n: int) -> list[float | None]:
    """Milliseconds each of ``n`` fresh Python processes needs to load the (cached) index module, torch import
    excluded: the imports run side by side (each ~5 s; one after another they took 15.6 s of a 19 s step on an H200,
    2026-11-28), the timed loads one at a time after all of them (common.capture.procs.timed_alone)."""
    got = procs.timed_alone("import torch\nfrom minisgl.kernel.index import _jit_index_module as j",
                            f"j({row_bytes}, num_splits={splits})", n)
    return [s * 1e3 if s is not None else None for s in got]


def software(run, x):
    """Versions, pins, the JIT toolchain and the mini-SGLang source (packages.csv)."""
    torch, prov = x.torch, run.summary["provenance"]
    x.fi = require_module("flashinfer", "pip install flashinfer-python==0.6.15.post1")
    x.tvm_ffi = require_module("tvm_ffi", "pip install apache-tvm-ffi==0.1.11")
    x.kernel = _msgl.require_minisgl("minisgl.kernel")
    x.src = _msgl.source_root()
    x.commit = prov["packages"].get("minisgl") or (gpu.minisgl_commit(x.src.parents[1]) if x.src else "unknown")
    x.nccl = ".".join(map(str, torch.cuda.nccl.version()))
    x.tools = [tool("nvcc"), tool("ninja"), tool(os.environ.get("CXX", "c++")), tool("nvidia-smi", ("--version",))]
    x.arch = os.environ.get("TVM_FFI_CUDA_ARCH_LIST") or f"{x.cc} (from nvidia-smi compute_cap)"
    pkgs = [{"package": k, "version": v} for k, v in prov["packages"].items()]
    pkgs += [{"package": "apache-tvm-ffi (import)", "version": getattr(x.tvm_ffi, "__version__", "?")},
             {"package": "NCCL (torch)", "version": x.nccl}, {"package": "minisgl source", "version": str(x.src)},
             {"package": "minisgl declared pins", "version": declared_pins()},
             {"package": "tvm-ffi CUDA target", "version": x.arch}]
    pkgs += [{"package": f"tool: {t['tool']}", "version": f"{t['version']} ({t['path']})" if t["path"] else "MISSING"}
             for t in x.tools]
    run.table("packages", pkgs)
    missing = [t["tool"] for t in x.tools[:3] if not t["path"]]
    if missing:
        run.note(f"JIT toolchain incomplete: {', '.join(missing)} not on PATH; index/store builds will fail")


def jit_calls(run, x):
    """Index, store (two row sizes) and radix once each, checked against torch; then what the cache holds."""
    torch, K = x.torch, x.kernel
    x.root = tvm_cache_root()
    before = {r["folder"] for r in jit_cache_rows(x.root)}
    run.log(f"tvm-ffi cache {x.root}: {len(before)} mini-SGLang module folder(s) before this run")
    w = torch.randn(1024, INDEX_ROW // 2, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 1024, (64,), device="cuda", dtype=torch.int32)
    out, t_index = _msgl.first_call(lambda: K.indexing(w, ids), f"index ({INDEX_ROW}-B rows)")
    checks = {"index": bool(torch.equal(out, torch.nn.functional.embedding(ids.long(), w)))}
    x.first = {"index": t_index}
    for row in STORE_ROWS:
        kv = torch.randn(2, 4096, row // 2, device="cuda", dtype=torch.bfloat16)
        loc = torch.randperm(4096, device="cuda")[:64].to(torch.int32)
        k, v = torch.randn(64, row // 2, device="cuda", dtype=torch.bfloat16), torch.randn(64, row // 2, device="cuda",
                                                                                          dtype=torch.bfloat16)
        _, x.first[f"store {row}"] = _msgl.first_call(lambda: K.store_cache(kv[0], kv[1], loc, k, v), f"store ({row}-B rows)")
        checks[f"store {row}"] = bool(torch.equal(kv[0][loc.long()], k) and torch.equal(kv[1][loc.long()], v))
    a = torch.arange(4096, dtype=torch.int32)
    b = a.clone()
    b[3000] = -1
    res, x.first["radix"] = _msgl.first_call(lambda: K.fast_compare_key(a, b), "radix (host c++)")
    checks["radix"] = int(res) == 3000
    torch.cuda.synchronize()
    run.log("first calls: " + ", ".join(f"{k} {x.first[k]:.2f} s ({'ok' if checks[k] else 'WRONG'})" for k in checks))
    if not all(checks.values()):
        raise RuntimeError("a mini-SGLang kernel disagrees with its torch reference; run 01_test_kernels.py")
    x.reload = reload_ms(INDEX_ROW, _msgl.index_splits(INDEX_ROW), REPEATS)
    run.log(f"{REPEATS} fresh processes load the cached index module in {x.reload} ms (torch import excluded)")
    x.nccl_link, x.t_nccl, x.nccl_err = libnccl_for_link(), None, None
    if not x.args.quick:
        run.log("building PyNCCL (nvcc + -lnccl) ...")
        try:
            from minisgl.kernel.pynccl import _load_nccl_module
            _, x.t_nccl = _msgl.first_call(_load_nccl_module, "pynccl")
        except Exception as e:  # a failed build is a finding here, not a crash
            x.nccl_err = str(e).splitlines()[0][:240]
            run.log(f"[ERROR] PyNCCL build: {x.nccl_err}")
    x.jit = [{**r, "new_in_this_run": r["folder"] not in before} for r in jit_cache_rows(x.root)]
    x.radix_cached_before = any(f.startswith("minisgl__radix") for f in before)
    run.table("jit_cache", x.jit)


def caches_and_backends(run, x):
    """FlashInfer's JIT cache; the attention backends mini-SGLang offers here (engine/engine.py:_adjust_config,
    attention/__init__.py)."""
    try:
        from flashinfer.jit import env as fi_env
        x.fi_dir = Path(fi_env.FLASHINFER_JIT_DIR)
    except Exception:
        x.fi_dir = Path(os.environ.get("FLASHINFER_WORKSPACE_BASE", Path.home())) / ".cache" / "flashinfer"
    x.fi_rows = [{"module": d.name, "built": bool(list(d.glob("*.so")))} for d in sorted(x.fi_dir.glob("*"))
                 if d.is_dir()] if x.fi_dir.is_dir() else []
    run.table("flashinfer_cache", x.fi_rows or [{"module": "(empty)", "built": False}])
    try:
        import sgl_kernel.flash_attn  # noqa: F401
        fa_ok, fa_why = True, "sgl_kernel.flash_attn imports"
    except Exception as e:
        fa_ok, fa_why = False, f"sgl_kernel.flash_attn: {e.__class__.__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
    major = x.props.major
    auto = "trtllm" if major == 10 else ("fa,fi" if major == 9 else "fi")
    auto_ok = auto == "fi" or (auto == "fa,fi" and fa_ok) or (auto == "trtllm" and major == 10)
    x.backends = [{"backend": "fi", "usable": True, "why": f"flashinfer {x.fi.__version__}"},
                  {"backend": "fa", "usable": fa_ok and major >= 9, "why": fa_why},
                  {"backend": "trtllm", "usable": major == 10, "why": "needs sm100 (Blackwell)"},
                  {"backend": f"auto -> {auto}", "usable": auto_ok, "why": "what LLM(...) picks without attention_backend="}]
    run.table("backends", x.backends)
    if not auto_ok:
        run.note(f"the default attention backend ({auto}) is not usable here: pass attention_backend='fi'")


@dataclass
class Record:
    """What the verdicts, headline and story read: the tables, profilers.json and the facts (facts.csv)."""
    args: object
    prov: dict
    pk: dict
    gpus: list
    jit: list
    fi_rows: list
    backends: list
    tools: list                 # {tool, path, version}: the JIT toolchain (packages.csv's 'tool:' rows)
    prof: dict
    first: dict                 # module -> s of its first call
    reload: list                # ms, one per fresh process
    nccl_link: dict             # linker, wheel
    radix_cached_before: bool
    t_nccl: float | None = None
    nccl_err: str | None = None
    f: dict | None = None       # the facts: versions, paths, links (strings)


FIRST = ("index", *(f"store {r}" for r in STORE_ROWS), "radix")


def facts_rows(x, links: str) -> list[dict]:
    """facts.csv: one fact a row, what the verdicts and story read that no other table holds."""
    rows = [("torch", x.torch.__version__), ("cuda_runtime", x.torch.version.cuda),
            ("sm_count", x.props.multi_processor_count), ("compute_capability", x.cc),
            ("flashinfer", x.fi.__version__), ("tvm_ffi", getattr(x.tvm_ffi, "__version__", "?")), ("nccl", x.nccl),
            ("minisgl_commit", x.commit), ("minisgl_source", x.src), ("declared_pins", declared_pins()),
            ("cuda_target", x.arch), ("links", links), ("tvm_ffi_cache", x.root)]
    rows += [(f"first_call_s {k}", x.first[k]) for k in x.first]
    rows += [(f"reload_ms {i + 1}", v) for i, v in enumerate(x.reload)]
    rows += [("pynccl_build_s", x.t_nccl), ("pynccl_error", x.nccl_err), ("libnccl_linker", x.nccl_link["linker"]),
             ("libnccl_wheel_dir", x.nccl_link["wheel"]), ("flashinfer_cache", x.fi_dir),
             ("radix_cached_before", x.radix_cached_before)]
    return [{"fact": k, "value": None if v is None else str(v)} for k, v in rows]


def judge(run, x: Record):
    """The JIT facts (one observation per module), the reload time (3 fresh processes), the AOT claim."""
    idx = _msgl.index_splits(INDEX_ROW)
    mods = {"index": built(x.jit, "index", f"{INDEX_ROW}_{idx}_128_1_false"),
            **{f"store {r}": built(x.jit, "store", f"{r}_") for r in STORE_ROWS}}
    _msgl.fact(run, H["jit"], [bool(v) for v in mods.values()], "jit_cache.csv",
               detail="; ".join(f"{k}: {', '.join(r['folder'] for r in v) or 'not in the cache'} (first call "
                                f"{x.first[k]:.2f} s)" for k, v in mods.items()))
    run.judge(H["reload"], x.reload, evidence="log.txt (reload_ms in 3 fresh processes)", digits=3)
    aot = {"radix": bool(built(x.jit, "radix"))}
    if not x.args.quick:   # a failed PyNCCL build was a build at first use too: not prebuilt either
        aot["pynccl"] = bool(built(x.jit, "pynccl")) or x.nccl_err is not None
    _msgl.fact(run, H["aot"], [not v for v in aot.values()], "jit_cache.csv",
               detail="; ".join(f"{k} {'built by tvm-ffi at first use' if v else 'not in the JIT cache'}" for k, v in aot.items())
               + (" (radix was already cached before this run)" if x.radix_cached_before else ""))
    if not x.args.quick:
        _msgl.fact(run, H["pynccl"], x.nccl_err is None, "log.txt",
                   detail=f"build {'ok in %.1f s' % x.t_nccl if x.nccl_err is None else 'FAILED: ' + x.nccl_err}; torch "
                          f"NCCL {x.f['nccl']}; libnccl.so for the linker: {x.nccl_link['linker'] or 'not found'}")


def tell(run, x: Record) -> str:
    prov, pk, f = run.summary["provenance"], x.pk, x.f
    ncu_d, nsys_d = x.prof.get("ncu", {}), x.prof.get("nsys", {})
    reload = ", ".join("?" if v is None else f"{v:.0f}" for v in x.reload)
    items = [
        (f"GPUs: {len(x.gpus)} x {prov['gpu']} · driver {prov['driver']} · CUDA {f['cuda_runtime']} · "
         f"{f['sm_count']} SMs · cc {f['compute_capability']} · L2 {prov.get('l2_mb')} MB", [(f"links: {f['links']}", [])]),
        (f"software: torch {f['torch']} · flashinfer {f['flashinfer']} · tvm-ffi {f['tvm_ffi']} · NCCL {f['nccl']}",
         [(f"mini-SGLang {f['minisgl_commit']} from {f['minisgl_source']}", []),
          (f"declared pins: {f['declared_pins']}", [])]),
        ("JIT toolchain: " + " · ".join(f"{t['tool']} {t['version'] or 'MISSING'}" for t in x.tools[:3])
         + f" · target {f['cuda_target']}", []),
        (f"tvm-ffi cache {f['tvm_ffi_cache']}: {len(x.jit)} mini-SGLang module(s)", [
            ("first calls: " + ", ".join(f"{k} {v:.2f} s" for k, v in x.first.items()), []),
            (f"a fresh process loads the cached index module in {reload} ms", []),
            (("pynccl: " + ("built in %.1f s" % x.t_nccl if x.nccl_err is None else "FAILED " + x.nccl_err))
             if not x.args.quick else "pynccl: not built (--quick)", []),
            (f"libnccl.so for -lnccl: {x.nccl_link['linker'] or 'not found'}; wheel lib dir: {x.nccl_link['wheel']}", [])]),
        (f"FlashInfer JIT cache {f['flashinfer_cache']}: {len(x.fi_rows)} module(s)", []),
        ("attention backends: " + " · ".join(f"{b['backend']} {'yes' if b['usable'] else 'no'}" for b in x.backends), []),
        (f"profilers: ncu {ncu_d.get('version') or 'missing'} (counters: {ncu_d.get('counters', 'not probed')}) · "
         f"nsys {nsys_d.get('version') or 'missing -> torch.profiler fallback'}", []),
        (f"measured ceilings: {ceilings.kinds_text(pk)}", [
            (f"bf16 {pk['bf16_tflops']:.0f} TFLOP/s; L2 {pk.get('l2_mb')} MB: below {ceilings.STREAM_FACTOR}x L2 formula bytes / time is "
             f"effective bandwidth, not a DRAM rate (datasheet {(pk.get('datasheet') or {}).get('dram_tb_s', '?')} TB/s, "
             f"{(pk.get('datasheet') or {}).get('bf16_tflops', '?')} TFLOP/s); every probe in peaks.csv", [])]),
    ]
    return story.tree(f"ENVIRONMENT for mini-SGLang — {prov['gpu']}", items)


def analyse(run, x: Record) -> None:
    """Verdicts, headline and story from the record (a GPU run and --reanalyse alike)."""
    prov = run.summary["provenance"]
    judge(run, x)
    run.headline(gpu=prov["gpu"], gpu_count=len(x.gpus), sm_count=int(x.f["sm_count"]), nccl=x.f["nccl"],
                 minisgl_commit=x.f["minisgl_commit"], **{key: x.pk.get(key) for key in ceilings.DRAM_KEYS.values()},
                 bf16_tflops=x.pk["bf16_tflops"],
                 ceilings_source=x.pk.get("source"), index_first_call_s=x.first["index"],
                 store_first_call_s=x.first[f"store {STORE_ROWS[0]}"], radix_first_call_s=x.first["radix"],
                 index_reload_ms=statistics.median(x.reload) if None not in x.reload else None)
    run.story(tell(run, x), echo=True)


# ---- --reanalyse: the record again from a recording

def _records(df) -> list[dict]:
    return [] if df is None else [{k: (None if v != v else v) for k, v in r.items()} for r in df.to_dict("records")]


def _num(v) -> float | None:
    return None if v in (None, "", "None") else float(v)


def _story_field(text: str, label: str) -> str | None:
    """The text after ``label`` on a story line, its wrapped continuation lines joined back (story.tree)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if label in line:
            out = line.split(label, 1)[1].strip()
            for nxt in lines[i + 1:]:
                if not re.match(r"^[│ ]*[^│ ├└]", nxt) or re.match(r"^[│ ]*[├└]", nxt):
                    break
                out += " " + nxt.lstrip("│ ").strip()
            return out
    return None


def facts_from_old(rec, pkgs: dict) -> tuple[dict, str]:
    """A recording from before facts.csv: the facts from its log.txt (first calls, reload times, the tvm-ffi cache),
    story.txt (the libnccl paths, the FlashInfer cache, torch's full version, the links), packages.csv, the
    provenance and the headline (first calls at full precision)."""
    log, txt = (rec.src / "log.txt"), (rec.src / "story.txt")
    if not (log.is_file() and txt.is_file()):
        raise SetupError(f"--reanalyse {rec.src}: no facts.csv, and no log.txt and story.txt to read the first-call and "
                         "reload times, the cache folders and the libnccl paths from (recorded in facts.csv since)")
    log, txt = log.read_text(), txt.read_text()
    prov, head = rec.summary.get("provenance") or {}, rec.summary.get("headline") or {}
    f = {"cuda_runtime": prov.get("cuda_runtime"), "sm_count": prov.get("sm_count") or head.get("sm_count"),
         "compute_capability": prov.get("compute_capability"), "flashinfer": pkgs.get("flashinfer-python"),
         "tvm_ffi": pkgs.get("apache-tvm-ffi (import)"), "nccl": pkgs.get("NCCL (torch)") or head.get("nccl"),
         "minisgl_commit": head.get("minisgl_commit"), "minisgl_source": pkgs.get("minisgl source"),
         "declared_pins": pkgs.get("minisgl declared pins"), "cuda_target": pkgs.get("tvm-ffi CUDA target")}
    m = re.search(r"software: torch (\S+)", txt)
    f["torch"] = m.group(1) if m else pkgs.get("torch")
    f["links"] = _story_field(txt, "links: ")
    m = re.search(r"tvm-ffi cache (\S+): \d+ mini-SGLang module folder", log)
    f["tvm_ffi_cache"] = m.group(1) if m else None
    m = re.search(r"first calls: (.*)", log)
    for k, v in re.findall(r"([a-z]+(?: \d+)?) ([\d.]+) s \(", m.group(1) if m else ""):
        f[f"first_call_s {k}"] = v
    for k, key in (("index", "index_first_call_s"), (f"store {STORE_ROWS[0]}", "store_first_call_s"),
                   ("radix", "radix_first_call_s")):
        if head.get(key) is not None:           # the headline holds these at full precision, the log at 2 digits
            f[f"first_call_s {k}"] = head[key]
    m = re.search(r"fresh processes load the cached index module in \[([^\]]*)\] ms", log)
    for i, v in enumerate(m.group(1).split(",") if m else []):
        f[f"reload_ms {i + 1}"] = v.strip()
    m = re.search(r"libnccl\.so for -lnccl: (\S+); wheel lib dir:\s*(\S+)", " ".join(
        ln.lstrip("│├└─ ") for ln in txt.splitlines()))
    f["libnccl_linker"], f["libnccl_wheel_dir"] = (m.group(1), m.group(2)) if m else (None, None)
    m = re.search(r"pynccl: built in ([\d.]+) s", txt)
    f["pynccl_build_s"] = m.group(1) if m else None
    m = re.search(r"\[ERROR\] PyNCCL build: (.*)", log)
    f["pynccl_error"] = m.group(1).strip() if m else None
    f["flashinfer_cache"] = _story_field(txt, "FlashInfer JIT cache ")
    if f["flashinfer_cache"]:
        f["flashinfer_cache"] = re.sub(r": \d+ module\(s\)$", "", f["flashinfer_cache"])
    f["radix_cached_before"] = None             # from jit_cache.csv's new_in_this_run
    need = [k for k in ("tvm_ffi_cache", "libnccl_linker", "flashinfer_cache") if not f.get(k)]
    need += [f"first_call_s {k}" for k in FIRST if f.get(f"first_call_s {k}") is None]
    need += [] if f.get("reload_ms 1") else ["reload_ms"]
    if need:
        raise SetupError(f"--reanalyse {rec.src}: no facts.csv, and its log.txt/story.txt do not state "
                         f"{', '.join(need)}")
    return f, "no facts.csv (a recording from before it): first-call and reload times and the cache folders read " \
              "from its log.txt, the libnccl paths, torch's version and the links from its story.txt"


def main_reanalyse(args) -> int:
    """The verdicts and story again from what the run recorded: nothing is probed here."""
    rec = recording.open(args.reanalyse, __file__, tables=("gpus", "packages", "jit_cache", "flashinfer_cache",
                                                           "backends"),
                         optional=("facts",), copy=("profilers.json",))
    pkgs = {r["package"]: (None if r["version"] is None else str(r["version"]))
            for r in _records(rec.tables["packages"])}
    if rec.tables["facts"] is not None:
        f, how = {r["fact"]: r["value"] for r in _records(rec.tables["facts"])}, None
    else:
        f, how = facts_from_old(rec, pkgs)
    tools = []
    for k, v in pkgs.items():
        if k.startswith("tool: "):
            m = re.match(r"(.*) \((.*)\)$", v or "")
            tools.append({"tool": k[len("tool: "):], "path": m.group(2) if m else None,
                          "version": (m.group(1) if m and m.group(1) != "None" else None)})
    jit = _records(rec.tables["jit_cache"])
    for r in jit:
        r["template_args"] = "" if r["template_args"] is None else str(r["template_args"])
        r["built"] = str(r["built"]) == "True"
    radix_before = f.get("radix_cached_before")
    radix_before = (any(r["module"] == "radix" and str(r.get("new_in_this_run")) == "False" for r in jit)
                    if radix_before is None else str(radix_before) == "True")
    fi_rows = [r for r in _records(rec.tables["flashinfer_cache"]) if r["module"] != "(empty)"]
    reload = [_num(f[k]) for k in sorted((k for k in f if k.startswith("reload_ms ")), key=lambda k: int(k.split()[1]))]
    prov = rec.summary.get("provenance") or {}
    pk = dict(rec.peaks)                        # + what the story reads beside the ceilings: L2, the datasheet row
    pk["l2_mb"] = prov.get("l2_mb") or pk.get("l2_mb")
    pk["datasheet"] = pk.get("datasheet") or gpu.device_spec(pk.get("gpu"))
    x = Record(args=rec.args_like(args), prov=prov, pk=pk,
               gpus=_records(rec.tables["gpus"]), jit=jit, fi_rows=fi_rows,
               backends=[{**b, "usable": str(b["usable"]) == "True"} for b in _records(rec.tables["backends"])],
               tools=tools, prof=json.loads(rec.files.get("profilers.json") or b"{}"),
               first={k: _num(f[f"first_call_s {k}"]) for k in FIRST if f.get(f"first_call_s {k}") is not None},
               reload=reload, nccl_link={"linker": f.get("libnccl_linker"), "wheel": f.get("libnccl_wheel_dir")},
               radix_cached_before=radix_before, t_nccl=_num(f.get("pynccl_build_s")), nccl_err=f.get("pynccl_error"),
               f=f)
    with recording.run(__file__, args, rec) as run:
        if how:
            run.note(f"re-analysis: {how}")
        analyse(run, x)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    torch = require_module("torch", "pip install -r requirements.txt")
    require_gpu(torch)
    props = torch.cuda.get_device_properties(0)
    x = SimpleNamespace(args=args, torch=torch, props=props, cc=f"{props.major}.{props.minor}")
    with Run(__file__, args, out=args.out) as run:
        # ---- check: the machine, the software, the ceilings every % divides by
        prov = run.summary["provenance"]
        x.gpus, x.topo = gpu.gpus(), gpu.topology()
        run.table("gpus", x.gpus or [{"name": torch.cuda.get_device_name(0)}])
        run.log(f"{len(x.gpus)} GPU(s): {prov['gpu']}, driver {prov['driver']}, CUDA runtime {torch.version.cuda}, "
                f"{props.multi_processor_count} SMs, compute capability {x.cc}")
        software(run, x)
        x.pk = ceilings.peaks(quick=args.quick)
        run.table("peaks", ceilings.ceilings_table(x.pk))
        # ---- measure: first calls (JIT), fresh-process loads, caches, backends, profilers
        jit_calls(run, x)
        caches_and_backends(run, x)
        x.prof = profilers(probe=not args.quick)
        run.json("profilers", x.prof)
        links = ", ".join(f"{k} {v}" for k, v in list(x.topo.get("links", {}).items())[: 2 * len(x.gpus)]) or "single GPU"
        facts = facts_rows(x, links)
        run.table("facts", facts)
        # ---- verdicts, headline, story (the same analysis as --reanalyse)
        analyse(run, Record(args=args, prov=prov, pk=x.pk, gpus=x.gpus, jit=x.jit, fi_rows=x.fi_rows,
                            backends=x.backends, tools=x.tools, prof=x.prof, first=x.first, reload=x.reload,
                            nccl_link=x.nccl_link, radix_cached_before=x.radix_cached_before, t_nccl=x.t_nccl,
                            nccl_err=x.nccl_err, f={r["fact"]: r["value"] for r in facts}))
    return 0


if __name__ == "__main__":
    run_main(main)
