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
    and bf16 TFLOP/s (the best over a sweep of GEMM shapes), common.capture.ceilings.peaks, cached per GPU, every probe
    shown next to the datasheet (peaks.csv, from common.capture.ceilings.ceilings_table), and the L2 size (below 4x L2 a
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
    python flashinfer/scripts/00_check_env.py --reanalyse DIR --out OUT   # no GPU: the verdicts and story again from
                                                                          # what DIR recorded (no machine probed)
Writes flashinfer/results/00_check_env/: peaks.csv, packages.csv, tools.csv, jit_cache.csv, device.csv (the GPU's
properties the story prints), environment.json, story.txt, summary.json.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _fi  # noqa: E402
import _fi_jit  # noqa: E402
from common.base import story  # noqa: E402
from common.base.checks import run_main, SetupError  # noqa: E402
from common.capture import ceilings, gpu, probes  # noqa: E402
from common.capture.ncu import profilers  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.run import cli, recording  # noqa: E402
from common.run.results import Run  # noqa: E402

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
        judged on: one tiny kernel profiled (common.capture.ncu.profilers)
        source: PLAN.md session 3: hardware to read
    timeline = timeline-profiler: a timeline profiler is available (nsys; else torch.profiler)
        judged on: common.capture.nsys.find() / torch.profiler import
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
    recording.add_flag(p)
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
    """The measured ceilings every % column of this track divides by (common.capture.ceilings: cached per GPU), every probe
    beside the datasheet (common.capture.ceilings.ceilings_table), and the ridge point: peaks.csv."""
    import pandas as pd
    if refresh:
        probes.measure_peaks(0, refresh=True)
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
    mods = _fi_jit.jit_modules(jit_env.FLASHINFER_JIT_DIR)
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
    cnt, dev = x.prof["ncu"].get("counters"), x.device
    run.fact(H["ncu"], cnt == "ok" if cnt else None, f"ncu {x.prof['ncu'].get('version') or 'not found'}: counters "
             f"{cnt or 'not probed'}", "tools.csv")
    run.fact(H["timeline"], bool(x.prof["nsys"].get("path") or x.prof["torch_profiler"]["available"]),
             f"nsys: {x.prof['nsys'].get('path') or 'not usable'}; torch.profiler: {x.prof['torch_profiler']['available']}",
             "tools.csv")
    cc = f"{dev['cc_major']}.{dev['cc_minor']}"
    run.fact(H["auto"], x.info["prefill_auto_backend"] == "fa3", f'compute capability {cc}: '
             f'"auto" -> {x.info["prefill_auto_backend"]}', "environment.json",
             premise=True if dev["cc_major"] == 9 else f"compute capability {cc} is not sm90")
    cute = next(p["version"] for p in x.pkgs if p["package"] == "nvidia-cutlass-dsl") != "missing"
    run.fact(H["norm_path"], x.info["cuda_norm_path"] != cute, f"nvidia-cutlass-dsl "
             f"{'installed' if cute else 'missing'}; _USE_CUDA_NORM = {x.info['cuda_norm_path']}", "environment.json")


def tell(x) -> str:
    pk, info, prov, dev = x.pk, x.info, x.prov, x.device
    ds = pk.get("datasheet") or {}
    compiled = [m for m in info["modules"] if m["compiled"]]
    missing = [p["package"] for p in x.pkgs if p["version"] == "missing"]
    links = x.topo.get("links") or {}
    items = [
        (f"ceilings: {ceilings.kinds_text(pk)}", [
            (f"{ceilings.ceiling_text(pk, 'bf16_tflops')}; ridge {x.ridge or 0:.0f} FLOP/byte (bf16 / the fastest DRAM "
             f"kind: the roofline's roof) — datasheet {ds.get('dram_tb_s')} TB/s, {ds.get('bf16_tflops')} TFLOP/s", []),
            (f"L2 {pk.get('l2_mb')} MB: below {ceilings.STREAM_FACTOR}x L2 a formula's bytes / time is effective "
             "bandwidth, not a DRAM rate; DRAM % only from ncu's bytes there", [])]),
        (f"FlashInfer {info['flashinfer']}: prefill auto -> {info['prefill_auto_backend']}; FA3 usable: "
         f"{info['fa3_supported']}; RMSNorm path: {'CUDA JIT norm' if info['cuda_norm_path'] else 'CuTe-DSL'}", [
             (f"JIT cache {info['jit_modules_dir']}: {len(compiled)} compiled module(s), "
              f"{sum(m['so_mb'] or 0 for m in compiled):.1f} MB", [
                  (f"{_fi_jit.short_module(m['module'])}: {m['so_mb']} MB, {m['objects']} objects", []) for m in compiled[:12]]),
             (f"FLASHINFER_* env: {', '.join(f'{k}={v}' for k, v in info['flashinfer_env'].items()) or 'none set'}", [])]),
        ("tools and profilers", [(f"{t['tool']}: {t['version'] or 'not found'} {t['status']}", []) for t in x.tools]),
        (f"packages: {len(x.pkgs) - len(missing)}/{len(x.pkgs)} present" + (f"; missing: {', '.join(missing)}"
                                                                          if missing else ""), []),
        (f"topology: {len(x.topo.get('gpus', []))} GPU(s)" + (
            f"; links {', '.join(f'{k} {v}' for k, v in list(links.items())[:6])}" if links else ""), []),
    ]
    return story.tree(f"ENVIRONMENT — {dev['gpus']}x {dev['gpu_name']} ({dev['sm_count']} SMs, "
                      f"{dev['total_memory_bytes'] / 1e9:.0f} GB, L2 {dev['l2_bytes'] / 2**20:.0f} MB) · driver "
                      f"{prov.get('driver')} · CUDA {dev['cuda_runtime']} · nvcc {prov.get('nvcc', '?')}", items)


DEVICE_COLUMNS = ("gpu_name", "gpus", "sm_count", "total_memory_bytes", "l2_bytes", "cc_major", "cc_minor",
                  "cuda_runtime")


@dataclass
class Record:
    """What the analysis of one run reads: its provenance, the ceilings (peaks.csv, with the ridge), packages.csv,
    tools.csv, the profilers and FlashInfer's paths (environment.json) with the JIT modules (jit_cache.csv), the
    topology and the GPU's properties (device.csv)."""
    args: argparse.Namespace
    prov: dict
    device: dict = field(default_factory=dict)
    pk: dict = None
    ridge: float | None = None
    pkgs: list = field(default_factory=list)
    tools: list = field(default_factory=list)
    prof: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    topo: dict = field(default_factory=dict)


def device_of(torch, prov) -> dict:
    """The GPU's properties the story prints, as torch reports them (device.csv)."""
    p = torch.cuda.get_device_properties(0)
    return dict(zip(DEVICE_COLUMNS, (prov.get("gpu") or torch.cuda.get_device_name(0),
                                     prov.get("gpu_count") or torch.cuda.device_count(), p.multi_processor_count,
                                     p.total_memory, p.L2_cache_size, p.major, p.minor, torch.version.cuda)))


def analyse(run, x: Record) -> None:
    """Headline, the ceilings note, verdicts and story from the recorded tables (a GPU run and --reanalyse alike)."""
    compiled = [m for m in x.info["modules"] if m["compiled"]]
    run.headline(**{key: x.pk.get(key) for key in ceilings.DRAM_KEYS.values()}, bf16_ceiling_tflops=x.pk["bf16_tflops"],
                 ridge_flop_per_byte=x.ridge, jit_modules_compiled=len(compiled), sm_count=x.device["sm_count"])
    note = (f"every % column of this track divides by the DRAM ceiling its traffic matches ({ceilings.kinds_text(x.pk)}) "
            f"or {ceilings.ceiling_text(x.pk, 'bf16_tflops')}")
    if note not in run.summary["notes"]:          # a re-analysis carries the recording's notes over
        run.note(note)
    # ---- verdicts
    judge(run, x)
    # ---- the story
    run.story(tell(x), echo=True)


def _records(df) -> list[dict]:
    """A recorded table's rows as the GPU phase had them: an empty cell (NaN) is None."""
    return [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()} for r in df.to_dict("records")]


def peaks_of(rec, rows: list[dict]) -> tuple[dict, float | None]:
    """The ceilings the run divided by (its provenance) with what its peaks.csv says of them: which are measured,
    the best probe of each kind and GEMM shape (the method the story names), the datasheet row of its GPU (the
    repository's common/capture/datasheet.csv), and the ridge point."""
    pk = dict(rec.peaks)
    prov = rec.summary.get("provenance") or {}
    pk["l2_mb"] = prov.get("l2_mb") or pk.get("l2_mb")
    pk["datasheet"] = gpu.device_spec(pk.get("gpu"))
    best = {r["ceiling"]: r for r in rows if r.get("is_ceiling") == "yes" and r.get("measured") is not None}
    ridge = next((r["measured"] for r in rows if str(r["ceiling"]).startswith("ridge")), None)
    if not best:
        pk.update(source="datasheet", sources={k: "datasheet" for k in ("dram_tb_s", "bf16_tflops",
                                                                       *ceilings.DRAM_KEYS.values())}, method={})
        return pk, ridge
    name = lambda r: re.sub(r" \([^()]*\)$", "", str(r["probe"]))       # noqa: E731 - the probe without its size
    dram = [r for c, r in best.items() if c.startswith("DRAM ")]
    gemm = best.get("bf16 tensor throughput")
    n_shapes = next((int(m.group(1)) for r in rows if (m := re.search(r"sweep \((\d+) shapes\)", str(r["method"])))),
                    sum(r["ceiling"] == "bf16 tensor throughput" for r in rows))
    method = {key: f"fastest {kind} probe: {name(best[f'DRAM {kind}'])}" for kind, key in ceilings.DRAM_KEYS.items()
              if f"DRAM {kind}" in best}
    if dram:
        method["dram_tb_s"] = (f"fastest of {sum(str(r['ceiling']).startswith('DRAM ') for r in rows)} probes: "
                               f"{name(max(dram, key=lambda r: r['measured']))}")
    if gemm:
        method["bf16_tflops"] = f"best of {n_shapes} GEMM shapes: {str(gemm['probe']).removeprefix('GEMM ')}"
    pk.update(source="measured", method=method,
              sources={"dram_tb_s": "measured", "bf16_tflops": "measured",
                       **{key: "measured" if f"DRAM {kind}" in best else "measured (fastest probe)"
                          for kind, key in ceilings.DRAM_KEYS.items()}})
    return pk, ridge


def device_from(rec, env: dict) -> tuple[dict, str | None]:
    """device.csv of the recording; for one made before it existed (a5d3c27): the GPU, SM count, L2, compute
    capability and CUDA runtime from its provenance and environment.json, the memory as its story printed it."""
    t = rec.tables.get("device")
    if t is not None and len(t):
        return _records(t)[0], None
    prov = rec.summary.get("provenance") or {}
    cc = str(prov.get("compute_capability") or "?.?").split(".")
    mem = re.search(r"\(\d+ SMs, (\d+) GB, L2", rec.summary.get("story") or "")
    if not mem:
        raise SetupError(f"--reanalyse {rec.src}: no device.csv, and the recording's story does not state the GPU's "
                         "memory as torch reported it (re-run 00_check_env.py on the GPU)")
    return (dict(zip(DEVICE_COLUMNS, (prov.get("gpu"), prov.get("gpu_count"), prov.get("sm_count") or env.get("sm_count"),
                                      int(mem.group(1)) * 1e9, (env.get("l2_mb") or prov.get("l2_mb")) * 2**20,
                                      int(cc[0]) if cc[0].isdigit() else None, int(cc[1]) if cc[1].isdigit() else None,
                                      prov.get("cuda_runtime")))),
            "recorded before device.csv: the GPU's properties from its provenance and environment.json, its memory "
            "as its story printed it")


def main_reanalyse(args) -> int:
    """The verdicts and story again from what the run recorded about its machine: nothing here is probed (the
    profilers, FlashInfer's paths and the topology are the recording's environment.json)."""
    rec = recording.open(args.reanalyse, __file__, tables=("peaks", "packages", "tools", "jit_cache"),
                         optional=("device",), copy=("environment.json",))
    if "environment.json" not in rec.files:
        raise SetupError(f"--reanalyse {rec.src}: no environment.json: the profilers, FlashInfer's prefill 'auto' "
                         "backend and norm path are probed on the GPU machine and recorded only there")
    env = json.loads(rec.files["environment.json"])
    device, how = device_from(rec, env)
    pk, ridge = peaks_of(rec, _records(rec.tables["peaks"]))
    tools = [{**t, "status": t["status"] or ""} for t in _records(rec.tables["tools"])]
    x = Record(args=rec.args_like(args), prov=rec.summary.get("provenance") or {}, device=device, pk=pk, ridge=ridge,
               pkgs=_records(rec.tables["packages"]), tools=tools, prof=env.get("profilers") or {},
               info={**env, "modules": _records(rec.tables["jit_cache"])}, topo=env.get("topology") or {})
    with recording.run(__file__, args, rec) as run:
        if how:
            run.note(f"re-analysis: {how}")
        analyse(run, x)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    torch, fi = _fi.require_stack()
    import pandas as pd
    with Run(__file__, args, out=args.out) as run:
        # ---- check: the machine
        prov = run.summary["provenance"]
        x = Record(args=args, prov=prov, device=device_of(torch, prov), topo=gpu.topology())
        d = x.device
        run.log(f"{d['gpus']}x {d['gpu_name']} · {d['sm_count']} SMs · cc {d['cc_major']}.{d['cc_minor']} "
                f"· driver {prov.get('driver')} · CUDA runtime {torch.version.cuda} · nvcc {prov.get('nvcc', 'not found')}")
        # ---- measure: the ceilings, packages, tools, FlashInfer's paths and JIT cache
        x.pk, x.ridge = measure_peaks(run, args.refresh_peaks)
        x.pkgs = packages(run)
        x.tools, x.prof = tools(run, torch)
        x.info = flashinfer_paths(run, torch, fi, x.topo, x.prof)
        run.table("device", pd.DataFrame([x.device], columns=DEVICE_COLUMNS))
        # ---- analyse: headline, the ceilings note, verdicts, the story
        analyse(run, x)
    return 0


if __name__ == "__main__":
    run_main(main)
