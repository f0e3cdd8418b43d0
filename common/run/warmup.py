"""The JIT warm-up as a pipeline step: which modules a system's steps load, built before anything is timed.

    python -m common jit --system flashinfer                      # every module flashinfer's steps load
    python -m common jit --modules fi:decode,msgl:store_2048      # just these
    python -m common jit --list [--system mini-sglang]            # the catalogue (no torch, no GPU needed)

The builders are common.capture.jit; this module knows the steps (common.run.steps).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from common.base.checks import SetupError
from common.capture import jit
from common.capture.jit import _require_cuda, CATALOGUE, exit_code, format_total, MODULES, Result, warm, write_csv


def system_modules(system: str, root: Path | None = None) -> dict[str, list[str]]:
    """{module: [steps that load it]} over every step of ``system`` (quick and full runs)."""
    from common import REPO_ROOT
    from common.run.steps import load_steps
    steps, _ = load_steps(Path(root or REPO_ROOT), system)
    out: dict[str, list[str]] = {}
    for s in steps:
        for m in (*s.jit, *s.jit_all):
            out.setdefault(m, [])
            if s.name not in out[m]:
                out[m].append(s.name)
    return out


def list_text(system: str | None = None, needs: dict | None = None) -> str:
    mods = [m for m in CATALOGUE if needs is None or m.name in needs]
    head = (f"JIT modules the {system} steps load" if system else "JIT modules common.capture.jit can build")
    lines = [f"{head} ({len(mods)}):"]
    w = max((len(m.name) for m in mods), default=10)
    for m in mods:
        lines.append(f"  {m.name:<{w}}  {m.kind:<10}  {m.what}")
        lines.append(f"  {'':<{w}}  {'':<10}  cache: {m.uri}"
                     + (f"; steps: {', '.join(needs[m.name])}" if needs else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    from common import SYSTEMS
    doc = jit.__doc__                              # the builders' docstring says what a build is
    p = argparse.ArgumentParser(prog="python -m common jit", description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=doc.split("\n\n", 1)[1])
    p.add_argument("--system", default=None, help=f"build what its steps load ({', '.join(SYSTEMS)})")
    p.add_argument("--modules", default=None, help="comma-separated module names (see --list)")
    p.add_argument("--list", action="store_true", help="print the catalogue and exit (no torch needed)")
    p.add_argument("--csv", default=None, help="write the per-module table here")
    a = p.parse_args(argv)
    needs = None
    try:
        if a.system and (a.list or not a.modules):
            needs = system_modules(a.system)
    except Exception as e:  # noqa: BLE001 - UsageError from the step declarations
        print(f"common.capture.jit: {e}", file=sys.stderr)
        return 2
    if a.list:
        print(list_text(a.system, needs))
        return 0
    names = [x.strip() for x in a.modules.split(",") if x.strip()] if a.modules else list(needs or [])
    bad = [n for n in names if n not in MODULES]
    if bad or not names:
        print(f"common.capture.jit: {'unknown module ' + ', '.join(map(repr, bad)) if bad else 'no module chosen'}; "
              f"give --system or --modules from: {', '.join(MODULES)}", file=sys.stderr)
        return 2
    mods = [MODULES[n] for n in names]
    jobs = int(os.environ.get("MAX_JOBS") or os.cpu_count() or 1)
    print(f"warm-up: {len(mods)} JIT module(s) on {jobs} CPU cores: {', '.join(names)}", flush=True)
    t0 = time.perf_counter()
    known = jit.cached_by_stamp(mods)             # all built before on this GPU, these versions: no torch needed
    if known is not None:
        for r in known:
            print(jit.format_line(r, max(len(n) for n in names)), flush=True)
        print(format_total(known, time.perf_counter() - t0, jobs) + " [files known from the last warm-up: "
              f"{jit.STAMP} in the workbook's cache; torch not imported]", flush=True)
        if a.csv:
            _try_csv(a.csv, known)
        return 0
    try:
        _require_cuda()                            # no GPU or no torch: one [setup] line, nothing to build
    except SetupError as e:
        results = [Result(m.name, m.kind, "setup", None, str(e), m.uri) for m in mods]
        print(f"[setup] {e}", file=sys.stderr)
        if a.csv:
            _try_csv(a.csv, results)
        return 2
    try:
        results = warm(mods, echo=lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        print("[interrupted] warm-up stopped; modules already built stay in their caches", file=sys.stderr)
        os._exit(130)                              # worker threads may still wait on a compiler
    wall = time.perf_counter() - t0
    print(format_total(results, wall, jobs), flush=True)
    setup = sorted({r.detail for r in results if r.status == "setup"})
    for msg in setup:
        print(f"[setup] {msg}", file=sys.stderr)
    if a.csv:
        _try_csv(a.csv, results)
    if exit_code(results) == 0:
        try:
            jit.write_stamp(mods, results)
        except Exception as e:  # noqa: BLE001 - the next warm-up then looks the slow way
            print(f"  note: could not keep the modules' files for the next warm-up: {e}", flush=True)
    return exit_code(results)


def _try_csv(path, results) -> None:
    try:
        write_csv(path, results)
    except OSError as e:
        print(f"common.capture.jit: cannot write {path}: {e}", file=sys.stderr)
