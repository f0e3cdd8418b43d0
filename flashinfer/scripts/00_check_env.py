#!/usr/bin/env python3
"""00 · The machine under the FlashInfer track: GPU, CUDA, packages, profilers, JIT cache, measured peaks.

What it measures
    The GPU(s) (name, SMs, memory, clocks) and their topology (`nvidia-smi topo -m`), driver, CUDA
    runtime and nvcc (FlashInfer's JIT compiles with it), the Python packages the track uses and the
    ones FlashInfer needs at run time (ninja for the JIT, click/tabulate for its CLI, einops for
    flashinfer.testing, nvidia-cutlass-dsl for the CuTe-DSL norm path), the profilers (ncu and
    whether it may read the GPU counters — one tiny kernel is profiled to find out; nsys, else the
    torch-profiler fallback), FlashInfer's JIT cache (where it lives, which modules are compiled),
    which paths FlashInfer takes on this GPU (prefill backend "auto", FA3, the norm path), and the
    measured ceilings every other script divides by: DRAM TB/s per kind of traffic (read, mixed, copy, write:
    each the best of several streaming probes far above L2; a kernel is divided by the kind its traffic matches)
    and bf16 TFLOP/s (the best over a sweep of GEMM shapes), common.ceilings.peaks, cached per GPU, every probe
    shown next to the datasheet (peaks.csv, from common.ceilings.ceilings_table), and the L2 size (below 4x L2 a
    formula's bytes / time is effective bandwidth, not a DRAM rate).

What the plan expected (hypotheses: H_* below, facts with their sources)
    * the plan's figures were written for A100 80GB (~2 TB/s HBM, 312 TFLOP/s bf16); this run
      records what the GPU here is, and what it really reaches, so later scripts judge by % of
      the measured ceiling (and name it: it differs between an H100 and an H200);
    * the profilers needed for the hardware story work here (ncu counters readable);
    * from the source (analysis.md H-11, H-14): on sm90, FlashInfer's prefill "auto" backend is
      FA3; without nvidia-cutlass-dsl, RMSNorm uses the CUDA JIT `norm` module.

Run
    python flashinfer/scripts/00_check_env.py --quick            # ~20-40 s (ceilings cached after the first run)
    python flashinfer/scripts/00_check_env.py --refresh-peaks    # re-measure the DRAM / GEMM ceilings
Writes flashinfer/results/00_check_env/: peaks.csv, packages.csv, tools.csv, jit_cache.csv,
environment.json, story.txt, summary.json.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _fi  # noqa: E402
from common import ceilings, cli, gpu, kernels, story  # noqa: E402
from common.checks import profilers, run_main  # noqa: E402
from common.results import Run  # noqa: E402
from common.verdicts import declare  # noqa: E402

PACKAGES = (  # (distribution, why this track needs it)
    ("torch", "tensors, CUDA events, torch.profiler"),
    ("flashinfer-python", "the kernels under study"),
    ("apache-tvm-ffi", "FlashInfer loads its compiled JIT modules through tvm-ffi"),
    ("ninja", "FlashInfer's JIT runs ninja -> nvcc (the `ninja` binary on PATH is what counts)"),
    ("nvidia-cutlass-dsl", "CuTe-DSL RMSNorm kernels; absent -> the CUDA JIT `norm` module"),
    ("einops", "imported by flashinfer.testing (bench_gpu_time cross-check; stubbed when absent)"),
    ("cupti-python", "bench_gpu_time's CUPTI mode: the cross-check's reference (absent -> its spaced graph mode)"),
    ("click", "python -m flashinfer (CLI used by 07)"),
    ("tabulate", "python -m flashinfer (CLI used by 07)"),
    ("cuda-python", "FlashInfer's CUDA bindings"),
    ("flashinfer-cubin", "prebuilt cubins (optional; not needed for the kernels studied)"),
    ("flashinfer-jit-cache", "prebuilt JIT modules (optional; with it nothing compiles)"),
    ("nvtx", "NVTX ranges in nsys/ncu"),
    ("nvidia-ml-py", "pynvml: GPU provenance"),
    ("pandas", "result tables"),
    ("matplotlib", "figures"),
)


H = declare("""
    ncu = ncu-counters: ncu can read the GPU performance counters (every hardware column needs them)
        judged on: one tiny kernel profiled (common.checks.profilers)
        source: PLAN.md session 3: hardware to read
    timeline = timeline-profiler: a timeline profiler is available (nsys; else torch.profiler)
        judged on: common.nsys.find() / torch.profiler import
        source: PLAN.md session 3: process to capture
    auto = auto-is-fa3: on sm90 FlashInfer's prefill backend "auto" is FA3
        judged on: flashinfer.utils.determine_attention_backend for bf16, head_dim 128
        source: analysis.md H-11
    norm_path = norm-path: without nvidia-cutlass-dsl RMSNorm uses the CUDA JIT `norm` module
        judged on: flashinfer.norm._USE_CUDA_NORM against the package's presence
        source: analysis.md H-14
""")


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="same checks (they are quick); peaks come from the cache")
    p.add_argument("--refresh-peaks", action="store_true", help="re-measure the DRAM and bf16 GEMM ceilings")
    return p.parse_args(argv)


def version_of(cmd: list[str]) -> str | None:
    if not shutil.which(cmd[0]):
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "error"
    lines = (out.stdout or out.stderr).strip().splitlines()
    return lines[-1][:80] if lines else "?"


def measure_peaks(run, refresh: bool):
    """The measured ceilings every % column of this track divides by (common.ceilings: cached per GPU), every probe
    beside the datasheet (common.ceilings.ceilings_table), and the ridge point: peaks.csv."""
    import pandas as pd
    if refresh:
        ceilings.measure_peaks(0, refresh=True)
    pk = ceilings.peaks()
    rows = ceilings.ceilings_table(pk)
    ds = pk.get("datasheet") or {}
    ridge = pk["bf16_tflops"] / pk["dram_tb_s"] if pk.get("dram_tb_s") and pk.get("bf16_tflops") else None
    rows.append({"ceiling": "ridge point (bf16 / DRAM)", "probe": "-", "measured": ridge, "unit": "FLOP/byte",
                 "datasheet": ds["bf16_tflops"] / ds["dram_tb_s"] if ds.get("dram_tb_s") else None,
                 "pct_of_datasheet": None, "is_ceiling": "", "method": "bf16 ceiling / DRAM ceiling"})
    run.table("peaks", pd.DataFrame(rows))
    run.log(f"ceilings: {ceilings.kinds_text(pk)}; {ceilings.ceiling_text(pk, 'bf16_tflops')}; L2 {pk.get('l2_mb')} MB; "
            f"datasheet {ds.get('dram_tb_s')} TB/s, {ds.get('bf16_tflops')} TFLOP/s")
    return pk, ridge


def packages(run) -> list[dict]:
    import pandas as pd
    pkgs = []
    for name, why in PACKAGES:
        try:
            v = metadata.version(name)
        except metadata.PackageNotFoundError:
            v = "missing"
        pkgs.append({"package": name, "version": v, "needed_for": why})
    run.table("packages", pd.DataFrame(pkgs))
    return pkgs


def tools(run, torch) -> tuple[list[dict], dict]:
    """nvcc (FlashInfer's JIT), ninja, ncu (and whether it may read the counters), nsys, torch.profiler."""
    import pandas as pd
    from flashinfer.jit.cpp_ext import get_cuda_path
    prof = profilers(probe=True)
    nvcc = os.path.join(get_cuda_path(), "bin", "nvcc")
    rows = [{"tool": "nvcc (FlashInfer JIT)", "path": nvcc, "version": version_of([nvcc, "--version"]), "status": ""},
            {"tool": "ninja", "path": shutil.which("ninja"), "version": version_of(["ninja", "--version"]), "status": ""},
            {"tool": "ncu", "path": prof["ncu"].get("path"), "version": prof["ncu"].get("version"),
             "status": f"counters: {prof['ncu'].get('counters', 'not probed')}"},
            {"tool": "nsys", "path": prof["nsys"].get("path"), "version": prof["nsys"].get("version"),
             "status": "usable" if prof["nsys"].get("path") else f"fallback: {prof['nsys'].get('fallback')}"},
            {"tool": "torch.profiler", "path": "", "version": torch.__version__,
             "status": "available" if prof["torch_profiler"]["available"] else "missing"}]
    run.table("tools", pd.DataFrame(rows))
    for t in rows:
        run.log(f"tool {t['tool']}: {t['version'] or 'not found'} {t['status']}")
    return rows, prof


def flashinfer_paths(run, torch, fi, topo, prof) -> dict:
    """Which paths FlashInfer takes on this GPU (prefill "auto", FA3, the norm path) and its JIT cache."""
    import pandas as pd
    import flashinfer.norm as fnorm
    from flashinfer.jit import env as jit_env
    from flashinfer.jit.cpp_ext import get_cuda_path
    from flashinfer.utils import determine_attention_backend, is_sm90a_supported
    dev, props = torch.device("cuda"), torch.cuda.get_device_properties(0)
    mods = _fi.jit_modules(jit_env.FLASHINFER_JIT_DIR)
    run.table("jit_cache", pd.DataFrame(mods, columns=["module", "compiled", "so_mb", "objects", "nvcc_sum_s",
                                                       "nvcc_max_s", "build_span_s", "so_mtime"]))
    info = {"flashinfer": fi.__version__, "jit_cache_dir": str(jit_env.FLASHINFER_CACHE_DIR),
            "jit_workspace": str(jit_env.FLASHINFER_WORKSPACE_DIR), "jit_modules_dir": str(jit_env.FLASHINFER_JIT_DIR),
            "fa3_supported": bool(is_sm90a_supported(dev)),
            "prefill_auto_backend": determine_attention_backend(dev, 0, False, False, torch.bfloat16, torch.bfloat16,
                                                                head_dim_qk=128, head_dim_vo=128),
            "cuda_norm_path": bool(getattr(fnorm, "_USE_CUDA_NORM", True)), "cuda_home": get_cuda_path(),
            "flashinfer_env": {k: v for k, v in os.environ.items() if k.startswith("FLASHINFER_")}, "topology": topo,
            "profilers": prof, "sm_count": props.multi_processor_count, "l2_mb": props.L2_cache_size / 2**20,
            "modules": mods}
    run.json("environment", {k: v for k, v in info.items() if k != "modules"})
    return info


def judge(run, x):
    cnt, props = x.prof["ncu"].get("counters"), x.props
    run.fact(H["ncu"], cnt == "ok" if cnt else None, f"ncu {x.prof['ncu'].get('version') or 'not found'}: counters "
             f"{cnt or 'not probed'}", "tools.csv")
    run.fact(H["timeline"], bool(x.prof["nsys"].get("path") or x.prof["torch_profiler"]["available"]),
             f"nsys: {x.prof['nsys'].get('path') or 'not usable'}; torch.profiler: {x.prof['torch_profiler']['available']}",
             "tools.csv")
    run.fact(H["auto"], x.info["prefill_auto_backend"] == "fa3", f'compute capability {props.major}.{props.minor}: '
             f'"auto" -> {x.info["prefill_auto_backend"]}', "environment.json",
             premise=True if props.major == 9 else f"compute capability {props.major}.{props.minor} is not sm90")
    cute = next(p["version"] for p in x.pkgs if p["package"] == "nvidia-cutlass-dsl") != "missing"
    run.fact(H["norm_path"], x.info["cuda_norm_path"] != cute, f"nvidia-cutlass-dsl "
             f"{'installed' if cute else 'missing'}; _USE_CUDA_NORM = {x.info['cuda_norm_path']}", "environment.json")


def tell(x) -> str:
    pk, info, prov, props = x.pk, x.info, x.prov, x.props
    ds = pk.get("datasheet") or {}
    compiled = [m for m in info["modules"] if m["compiled"]]
    missing = [p["package"] for p in x.pkgs if p["version"] == "missing"]
    links = x.topo.get("links") or {}
    items = [
        (f"ceilings: {ceilings.kinds_text(pk)}", [
            (f"{ceilings.ceiling_text(pk, 'bf16_tflops')}; ridge {x.ridge or 0:.0f} FLOP/byte (bf16 / the fastest DRAM "
             f"kind: the roofline's roof) — datasheet {ds.get('dram_tb_s')} TB/s, {ds.get('bf16_tflops')} TFLOP/s", []),
            (f"L2 {pk.get('l2_mb')} MB: below {kernels.STREAM_FACTOR}x L2 a formula's bytes / time is effective "
             "bandwidth, not a DRAM rate; DRAM % only from ncu's bytes there", [])]),
        (f"FlashInfer {info['flashinfer']}: prefill auto -> {info['prefill_auto_backend']}; FA3 usable: "
         f"{info['fa3_supported']}; RMSNorm path: {'CUDA JIT norm' if info['cuda_norm_path'] else 'CuTe-DSL'}", [
             (f"JIT cache {info['jit_modules_dir']}: {len(compiled)} compiled module(s), "
              f"{sum(m['so_mb'] or 0 for m in compiled):.1f} MB", [
                  (f"{_fi.short_module(m['module'])}: {m['so_mb']} MB, {m['objects']} objects", []) for m in compiled[:12]]),
             (f"FLASHINFER_* env: {', '.join(f'{k}={v}' for k, v in info['flashinfer_env'].items()) or 'none set'}", [])]),
        ("tools and profilers", [(f"{t['tool']}: {t['version'] or 'not found'} {t['status']}", []) for t in x.tools]),
        (f"packages: {len(x.pkgs) - len(missing)}/{len(x.pkgs)} present" + (f"; missing: {', '.join(missing)}"
                                                                          if missing else ""), []),
        (f"topology: {len(x.topo.get('gpus', []))} GPU(s)" + (
            f"; links {', '.join(f'{k} {v}' for k, v in list(links.items())[:6])}" if links else ""), []),
    ]
    return story.tree(f"ENVIRONMENT — {x.n_gpu}x {x.gpu_name} ({props.multi_processor_count} SMs, "
                      f"{props.total_memory / 1e9:.0f} GB, L2 {props.L2_cache_size / 2**20:.0f} MB) · driver "
                      f"{prov.get('driver')} · CUDA {x.torch.version.cuda} · nvcc {prov.get('nvcc', '?')}", items)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch, fi = _fi.require_stack()
    with Run(__file__, args, out=args.out) as run:
        # ---- check: the machine
        prov = run.summary["provenance"]
        x = SimpleNamespace(torch=torch, prov=prov, props=torch.cuda.get_device_properties(0),
                            gpu_name=prov.get("gpu") or torch.cuda.get_device_name(0),
                            n_gpu=prov.get("gpu_count") or torch.cuda.device_count(), topo=gpu.topology())
        run.log(f"{x.n_gpu}x {x.gpu_name} · {x.props.multi_processor_count} SMs · cc {x.props.major}.{x.props.minor} "
                f"· driver {prov.get('driver')} · CUDA runtime {torch.version.cuda} · nvcc {prov.get('nvcc', 'not found')}")
        # ---- measure: the ceilings, packages, tools, FlashInfer's paths and JIT cache
        x.pk, x.ridge = measure_peaks(run, args.refresh_peaks)
        x.pkgs = packages(run)
        x.tools, x.prof = tools(run, torch)
        x.info = flashinfer_paths(run, torch, fi, x.topo, x.prof)
        # ---- analyse
        compiled = [m for m in x.info["modules"] if m["compiled"]]
        run.headline(**{key: x.pk.get(key) for key in ceilings.DRAM_KEYS.values()}, bf16_ceiling_tflops=x.pk["bf16_tflops"],
                     ridge_flop_per_byte=x.ridge, jit_modules_compiled=len(compiled),
                     sm_count=x.props.multi_processor_count)
        run.note(f"every % column of this track divides by the DRAM ceiling its traffic matches ({ceilings.kinds_text(x.pk)}) "
                 f"or {ceilings.ceiling_text(x.pk, 'bf16_tflops')}")
        # ---- verdicts
        judge(run, x)
        # ---- the story
        run.story(tell(x), echo=True)
    return 0


if __name__ == "__main__":
    run_main(main)
