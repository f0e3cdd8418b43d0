"""hands-on shared helpers: one small module per job.

    timing   time a GPU callable (events / CUDA graph / CUPTI), rates and % of peak
    ranges   NVTX ranges that also show in torch-profiler traces
    ncu      build and run Nsight Compute command lines, parse its CSVs, per-kernel summary
    trace    torch-profiler Chrome traces and `nsys stats` CSVs -> one event table
    story    ASCII execution stories: trees, timelines, tables
    gpu      provenance snapshot, device peak table, measured-peak probe
    results  results/<script-stem>/ run folders, atomic summary.json, failed runs
    report   `make reports`: refresh auto blocks in <system>/reports/*.md, build INDEX.md
    models   dummy-weight model presets (real architecture configs) as local model dirs
    checks   one-line errors for a missing GPU, package, tool or permission
    plots    the few figures several scripts draw (roofline, sweeps)

Nothing here imports torch at module import time: every script's --help works on a CPU box.
"""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = ("flashinfer", "mini-sglang", "sglang")
