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
    measured peaks every other script divides by: device-to-device copy TB/s and bf16 GEMM TFLOP/s
    (common.gpu.peaks, cached per GPU), shown next to the datasheet.

What the plan expected (hypotheses)
    * the plan's figures were written for A100 80GB (~2 TB/s HBM, 312 TFLOP/s bf16); this run
      records what the GPU here is, and what it really reaches, so later scripts judge by % of
      the measured peak;
    * the profilers needed for the hardware story work here (ncu counters readable);
    * from the source (analysis.md H-11, H-14): on sm90, FlashInfer's prefill "auto" backend is
      FA3; without nvidia-cutlass-dsl, RMSNorm uses the CUDA JIT `norm` module.

Run
    python flashinfer/scripts/00_check_env.py --quick            # ~20-40 s (peaks cached after the first run)
    python flashinfer/scripts/00_check_env.py --refresh-peaks    # re-measure the copy / GEMM peaks
Writes flashinfer/results/00_check_env/: peaks.csv, packages.csv, tools.csv, jit_cache.csv,
environment.json, story.txt, summary.json.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _fi  # noqa: E402
from common import gpu, story  # noqa: E402
from common.checks import profilers, require_gpu, require_module, run_main  # noqa: E402
from common.results import Run  # noqa: E402

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


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="same checks (they are quick); peaks come from the cache")
    p.add_argument("--refresh-peaks", action="store_true", help="re-measure copy bandwidth and bf16 GEMM peak")
    p.add_argument("--out", default=None, help="results folder (default flashinfer/results/00_check_env)")
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


def main(argv=None) -> int:
    args = parse_args(argv)
    torch = require_module("torch", "pip install -r requirements.txt")
    require_gpu(torch)
    fi = require_module("flashinfer", "pip install flashinfer-python==0.6.15.post1")
    import pandas as pd
    from flashinfer.jit import env as jit_env
    with Run(__file__, args, out=args.out) as run:
        prov = run.summary["provenance"]
        gpu_name = prov.get("gpu") or torch.cuda.get_device_name(0)
        n_gpu = prov.get("gpu_count") or torch.cuda.device_count()
        props = torch.cuda.get_device_properties(0)
        run.log(f"{n_gpu}x {gpu_name} · {props.multi_processor_count} SMs · cc {props.major}.{props.minor} "
                f"· driver {prov.get('driver')} · CUDA runtime {torch.version.cuda} · nvcc {prov.get('nvcc', 'not found')}")
        topo = gpu.topology()

        # ---- measured peaks (what every % column divides by)
        if args.refresh_peaks:
            gpu.measure_peaks(0, refresh=True)
        pk = gpu.peaks()
        ds = pk.get("datasheet") or {}
        prow = []
        for key, what, unit in (("dram_tb_s", "copy bandwidth (device-to-device, read + write)", "TB/s"),
                                ("bf16_tflops", "bf16 dense GEMM (8192^3, torch.matmul)", "TFLOP/s")):
            m, d = pk.get(key), ds.get(key)
            prow.append({"quantity": what, "measured": m, "datasheet": d, "unit": unit,
                         "measured_pct_of_datasheet": 100 * m / d if m and d else None, "source": pk.get("source")})
        ridge = pk["bf16_tflops"] / pk["dram_tb_s"] if pk.get("dram_tb_s") else None
        prow.append({"quantity": "ridge point (bf16 / copy)", "measured": ridge,
                     "datasheet": ds["bf16_tflops"] / ds["dram_tb_s"] if ds else None, "unit": "FLOP/byte",
                     "measured_pct_of_datasheet": None, "source": pk.get("source")})
        run.table("peaks", pd.DataFrame(prow))
        run.log(f"peaks: copy {pk['dram_tb_s']:.2f} TB/s, bf16 {pk['bf16_tflops']:.0f} TFLOP/s ({pk['source']}); "
                f"datasheet {ds.get('dram_tb_s')} TB/s, {ds.get('bf16_tflops')} TFLOP/s")

        # ---- packages and tools
        pkgs = []
        for name, why in PACKAGES:
            try:
                v = metadata.version(name)
            except metadata.PackageNotFoundError:
                v = "missing"
            pkgs.append({"package": name, "version": v, "needed_for": why})
        run.table("packages", pd.DataFrame(pkgs))
        prof = profilers(probe=True)
        from flashinfer.jit.cpp_ext import get_cuda_path
        cuda_home = get_cuda_path()
        tools = [{"tool": "nvcc (FlashInfer JIT)", "path": os.path.join(cuda_home, "bin", "nvcc"),
                  "version": version_of([os.path.join(cuda_home, "bin", "nvcc"), "--version"]), "status": ""},
                 {"tool": "ninja", "path": shutil.which("ninja"), "version": version_of(["ninja", "--version"]), "status": ""},
                 {"tool": "ncu", "path": prof["ncu"].get("path"), "version": prof["ncu"].get("version"),
                  "status": f"counters: {prof['ncu'].get('counters', 'not probed')}"},
                 {"tool": "nsys", "path": prof["nsys"].get("path"), "version": prof["nsys"].get("version"),
                  "status": "usable" if prof["nsys"].get("path") else f"fallback: {prof['nsys'].get('fallback')}"},
                 {"tool": "torch.profiler", "path": "", "version": torch.__version__,
                  "status": "available" if prof["torch_profiler"]["available"] else "missing"}]
        run.table("tools", pd.DataFrame(tools))
        for t in tools:
            run.log(f"tool {t['tool']}: {t['version'] or 'not found'} {t['status']}")

        # ---- FlashInfer: paths on this GPU, JIT cache
        from flashinfer.utils import determine_attention_backend, is_sm90a_supported
        import flashinfer.norm as fnorm
        dev = torch.device("cuda")
        auto = determine_attention_backend(dev, 0, False, False, torch.bfloat16, torch.bfloat16,
                                           head_dim_qk=128, head_dim_vo=128)
        cuda_norm = bool(getattr(fnorm, "_USE_CUDA_NORM", True))
        mods = _fi.jit_modules(jit_env.FLASHINFER_JIT_DIR)
        run.table("jit_cache", pd.DataFrame(mods, columns=["module", "compiled", "so_mb", "objects", "nvcc_sum_s",
                                                           "nvcc_max_s", "build_span_s", "so_mtime"]))
        fi_env = {k: v for k, v in os.environ.items() if k.startswith("FLASHINFER_")}
        info = {"flashinfer": fi.__version__, "jit_cache_dir": str(jit_env.FLASHINFER_CACHE_DIR),
                "jit_workspace": str(jit_env.FLASHINFER_WORKSPACE_DIR), "jit_modules_dir": str(jit_env.FLASHINFER_JIT_DIR),
                "fa3_supported": bool(is_sm90a_supported(dev)), "prefill_auto_backend": auto, "cuda_norm_path": cuda_norm,
                "cuda_home": cuda_home, "flashinfer_env": fi_env, "topology": topo, "profilers": prof,
                "sm_count": props.multi_processor_count, "l2_mb": props.L2_cache_size / 2**20}
        run.json("environment", info)
        compiled = [m for m in mods if m["compiled"]]
        size = sum(m["so_mb"] or 0 for m in compiled)
        run.headline(copy_tb_s=pk["dram_tb_s"], bf16_tflops=pk["bf16_tflops"], ridge_flop_per_byte=ridge,
                     jit_modules_compiled=len(compiled), sm_count=props.multi_processor_count)

        # ---- verdicts
        run.note("measured vs datasheet: " + "; ".join(
            f"{r['quantity'].split(' (')[0]} {r['measured']:.2f} {r['unit']} = "
            + (f"{r['measured_pct_of_datasheet']:.0f}% of {r['datasheet']}" if r["measured_pct_of_datasheet"] else
               "no datasheet row") for r in prow[:2]) + " — every % column of this track divides by the measured value")
        cnt = prof["ncu"].get("counters")
        run.observe("ncu can read the GPU performance counters (every hardware column needs them)",
                    f"ncu {prof['ncu'].get('version') or 'not found'}: counters {cnt or 'not probed'}",
                    "confirmed" if cnt == "ok" else ("refuted" if cnt else "inconclusive"), "tools.csv")
        run.observe("a timeline profiler is available (nsys; else torch.profiler)",
                    f"nsys: {prof['nsys'].get('path') or 'not usable'}; torch.profiler: "
                    f"{prof['torch_profiler']['available']}",
                    "confirmed" if prof["nsys"].get("path") or prof["torch_profiler"]["available"] else "refuted",
                    "tools.csv")
        run.observe('on sm90 FlashInfer\'s prefill backend "auto" is FA3 (analysis H-11)',
                    f'compute capability {props.major}.{props.minor}: "auto" -> {auto}',
                    ("confirmed" if auto == "fa3" else "refuted") if props.major == 9 else "inconclusive",
                    "environment.json")
        cute = next(p["version"] for p in pkgs if p["package"] == "nvidia-cutlass-dsl") != "missing"
        run.observe("without nvidia-cutlass-dsl RMSNorm uses the CUDA JIT `norm` module (analysis H-14)",
                    f"nvidia-cutlass-dsl {'installed' if cute else 'missing'}; _USE_CUDA_NORM = {cuda_norm}",
                    "confirmed" if cuda_norm != cute else "refuted", "environment.json")

        # ---- the story
        missing = [p["package"] for p in pkgs if p["version"] == "missing"]
        links = topo.get("links") or {}
        items = [
            (f"peaks (measured, {pk.get('source')}): copy {pk['dram_tb_s']:.2f} TB/s, bf16 {pk['bf16_tflops']:.0f} "
             f"TFLOP/s, ridge {ridge:.0f} FLOP/byte — datasheet {ds.get('dram_tb_s')} TB/s, {ds.get('bf16_tflops')} TFLOP/s", []),
            (f"FlashInfer {fi.__version__}: prefill auto -> {auto}; FA3 usable: {info['fa3_supported']}; RMSNorm path: "
             f"{'CUDA JIT norm' if cuda_norm else 'CuTe-DSL'}", [
                 (f"JIT cache {jit_env.FLASHINFER_JIT_DIR}: {len(compiled)} compiled module(s), {size:.1f} MB", [
                     (f"{_fi.short_module(m['module'])}: {m['so_mb']} MB, {m['objects']} objects", [])
                     for m in compiled[:12]]),
                 (f"FLASHINFER_* env: {', '.join(f'{k}={v}' for k, v in fi_env.items()) or 'none set'}", [])]),
            ("tools and profilers", [(f"{t['tool']}: {t['version'] or 'not found'} {t['status']}", []) for t in tools]),
            (f"packages: {len(pkgs) - len(missing)}/{len(pkgs)} present" + (f"; missing: {', '.join(missing)}"
                                                                              if missing else ""), []),
            (f"topology: {len(topo.get('gpus', []))} GPU(s)" + (f"; links {', '.join(f'{k} {v}' for k, v in list(links.items())[:6])}"
                                                               if links else ""), []),
        ]
        run.story(story.tree(f"ENVIRONMENT — {n_gpu}x {gpu_name} ({props.multi_processor_count} SMs, "
                             f"{props.total_memory / 1e9:.0f} GB, L2 {props.L2_cache_size / 2**20:.0f} MB) · driver "
                             f"{prov.get('driver')} · CUDA {torch.version.cuda} · nvcc {prov.get('nvcc', '?')}", items))
        print(run.summary["story"])
    return 0


if __name__ == "__main__":
    run_main(main)
