"""hands-on shared helpers: one small module per job, each used by two or more of the three systems.

Measuring
    timing    the one GPU timer (CUPTI / events / CUDA graph, cold L2) and the one CPU timer; rates and % of a ceiling
    gpu       provenance snapshot, the visible GPUs, the datasheet row, the topology
    ceilings  this GPU's measured ceilings (DRAM read / write / copy, bf16 GEMM, NVLink), cached per GPU UUID;
              dram_for: the ceiling that matches a kernel's traffic
    probes    the probes behind the ceilings (DRAM streams, the GEMM sweep with its clocks, NCCL all-reduce)
    clocks    NVML clocks, power and clock-event reasons sampled while something runs
    flops     FLOPs and minimum bytes of every kernel class (attention, GEMM, norms, RoPE, store, collectives, a layer)
    ncu       Nsight Compute: command lines, the one log reader, CSV parsing, per-kernel summary, bound() and stalls
    nsys      Nsight Systems: find a usable nsys, profile, stats tables
    ranges    NVTX ranges that also show in torch-profiler traces
Reading what happened
    trace     traces -> one event table; the one range->kernel join (correlation ids, CUDA-graph replays);
              labelled-call capture; layers of a step; kernel classes
    timeline  the joined story: steps -> layers -> kernels -> counters; layer tree; Perfetto export
    story     ASCII trees, timelines and tables
    plots     the figures several scripts draw (roofline from measured ceilings, sweeps, joined timeline, layer tree)
Judging
    stats     percentiles, intervals (range of repetitions, bootstrap), the range over swept items
    verdicts  hypotheses declared as text (declare); verdicts on intervals and on facts
Running
    cli       argparse types and the parser every numbered script starts from (values checked before GPU work)
    checks    one-line errors (SetupError, run_main) for a missing GPU, package, tool or permission
    procs     child processes in their own group (stopped whole), OS-chosen ports, pidfiles, NCCL policy
    results   run folders that replace the previous one whole; failed runs kept apart; summary.json last
    report    `make reports`: auto blocks of <system>/reports/*.md refreshed all-or-nothing from finished runs
    pipeline  the one runner behind every 06_full_pipeline.sh (steps as data in <system>/scripts/_steps.py;
              a service several steps share -- SGLang's server -- started once, checked, restarted, stopped)
    jit       the JIT warm-up: FlashInfer and tvm-ffi modules built in parallel before anything is timed
    models    dummy-weight model presets (real architecture configs) as local model dirs

Nothing here imports torch at module import time: every script's --help works on a CPU box.
What belongs to one system stays beside its scripts: sglang/scripts/_sglang.py (server, client, logs),
flashinfer/scripts/_fi.py (layouts, references, plan_info, JIT cache), mini-sglang/scripts/_msgl.py.
"""
import _signal  # the C module: `signal` imports enum first, 5 ms more without the handler
import os
import sys


def interrupted_at_start(signum, frame) -> None:
    """SIGINT before run_main runs (it puts Python's handler back): the line it prints for Ctrl-C, exit 130."""
    sys.stderr.write("[interrupted] stopped by Ctrl-C; earlier results were left as they were.\n")
    os._exit(130)


# `python -m common.report` (make reports): a Ctrl-C while Python still compiles and imports it (its first
# 0.1 s) is that one line, not a KeyboardInterrupt traceback; first thing, with what is loaded already
if getattr(sys, "orig_argv", [])[1:3] == ["-m", "common.report"]:
    _signal.signal(_signal.SIGINT, interrupted_at_start)

from pathlib import Path  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = ("flashinfer", "mini-sglang", "sglang")
