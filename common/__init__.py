"""hands-on's shared helpers, in floors along the data's path; a floor imports only the floors below it.

    run      cli, results (Run), recording (--reanalyse), steps + pipeline (06_full_pipeline.sh), warmup (JIT)
    render   report (make reports), markdown, glossary, crossview (CROSS-SYSTEM.md), plots
    judge    verdicts (hypotheses on intervals), noise (run-to-run margins), bounds (what limits a kernel)
    tables   kernels (the kernel table), ncu_pass, trace (events, range -> kernel join), timeline, flops, waterfall
    capture  procs, gpu, clocks, ceilings + probes, timing, ncu, nsys, ranges, models, jit, store (a run on disk)
    base     checks (one-line errors, run_main), story (text: fmt, table, tree), stats (intervals)

Each floor's __init__ says what its modules do; `.importlinter` is the contract `make test` checks (no import
upward, no cycle). `python -m common TOOL` runs a tool (common/__main__.py lists them). Nothing here imports torch
at module import time: every script's --help works on a CPU box. What belongs to one system stays beside its
scripts: sglang/scripts/_sglang.py, flashinfer/scripts/_fi.py, mini-sglang/scripts/_msgl.py.
"""
import _signal  # the C module: `signal` imports enum first, 5 ms more without the handler
import os
import sys


def interrupted_at_start(signum, frame) -> None:
    """SIGINT before run_main runs (it puts Python's handler back): the line it prints for Ctrl-C, exit 130."""
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)          # one line, whatever comes after
    sys.stderr.write("[interrupted] stopped by Ctrl-C; earlier results were left as they were.\n")
    os._exit(130)


# `python -m common report` (make reports): a Ctrl-C while Python still compiles and imports it (its first
# 0.1 s) is that one line, not a KeyboardInterrupt traceback; first thing, with what is loaded already. Under
# `make reports` (common/run/reports.sh) SIGINT belongs to whoever first creates HANDS_ON_SIGINT_CLAIM: the file
# there already is a Ctrl-C the shell took before this point; creating it tells the shell SIGINT is ours from now on
if getattr(sys, "orig_argv", [])[1:4] == ["-m", "common", "report"]:
    _signal.signal(_signal.SIGINT, interrupted_at_start)
    _claim = os.environ.pop("HANDS_ON_SIGINT_CLAIM", "")
    if _claim:
        try:
            os.close(os.open(_claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            interrupted_at_start(_signal.SIGINT, None)
        except OSError:
            pass

from pathlib import Path  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = ("flashinfer", "mini-sglang", "sglang")
