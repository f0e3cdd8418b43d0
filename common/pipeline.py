"""One pipeline runner for every system: each ``<system>/scripts/06_full_pipeline.sh`` execs it.

    python -m common.pipeline --system flashinfer                  # = --quick: every step in its quick mode
    python -m common.pipeline --system sglang --all                # the full runs
    python -m common.pipeline --system flashinfer --quick --ncu --nsys
    python -m common.pipeline --system mini-sglang --only 02_profile_index,03_profile_store --ncu
    python -m common.pipeline --system sglang --dry-run            # the plan: steps, commands, ETA; runs nothing

Flags, the same meaning in every system:
    --quick      (default) every step in its quick mode          --all   every step's full run
    --ncu        adds the ncu passes: steps with an ncu variant get its flags, ncu-only steps are added
    --nsys       adds the timeline: steps with an nsys variant get its flags, nsys-only steps are added
    --only S,..  runs only these steps (any declared step, whatever the flags); the rows of the other
                 steps are carried over from the last run's steps.csv, so separate runs merge into one table
    --no-warmup  no JIT warm-up step          --dry-run  print the plan and exit 0

The steps are data: ``<system>/scripts/_steps.py`` defines ``STEPS = [Step(...), ...]`` (and optionally
``NOTES``, a line per flag that adds nothing there). Each step is a child process in its own process group
(common.procs.Group), its output on the console and in ``logs/<step>.log``. First comes the warm-up
(common.jit: the FlashInfer / tvm-ffi modules the chosen steps load, built in parallel) so that compile time
is reported apart from measurement time; its status does not count towards the pipeline's.

Before the first step, the servers that a killed run of any script left behind (their pidfiles in the
workbook's one registry, $HANDS_ON_CACHE/servers/) are stopped: common.procs.reap_left.

Shared services: ``_steps.py`` may declare ``SERVERS = {name: Service(provider, modes=("quick",), why=...)}``
and steps name one with ``Step(..., server=name)``. In those modes the runner starts the service once, before
the first step that names it -- its own row in steps.csv (kind "server", timed apart like the warm-up) --,
passes its address to the steps that name it (the variables of ``handle.env()``), checks it before each of
them (``handle.check()``; a service a step left dead or busy is restarted, a new row), and stops it after
its last step, on a failure, Ctrl-C and SIGTERM. At the start of every run ``handle.reap()`` stops what a
killed (SIGKILL) run of the pipeline left behind. A service that cannot start (or declines:
ServiceSkipped) is not offered: its steps then start what they need themselves, as when run on their own.
What the service is and how it starts lives in the system's own helper (the provider, e.g.
``_sglang:SharedServer``); the runner knows only this protocol::

    handle = provider(name=..., mode="quick"|"all", echo=print_fn, **options)   # starts nothing
    handle.reap()            stop what a killed run of this pipeline left (called at every run's start)
    handle.describe() -> str the command it runs, for the plan
    handle.start(log_dir)    start, wait until usable; raise ServiceSkipped(why) to decline
    handle.check() -> why    None when usable before a step, else why not (the runner restarts it)
    handle.env() -> dict     variables for the steps that use it
    handle.lines() -> list   lines for the pipeline's story (e.g. where its start went)
    handle.stop()

Every service start of a run -- the runner's and any a step makes itself -- may append one JSON object to
the file ``$HANDS_ON_SERVER_STARTS`` names; the runner keeps them as server_starts.csv.

Progress, one format everywhere (the ETA comes from the last run's step times)::

    [3/8] 02_profile_prefill  started  (elapsed 1m12s, ETA 4m30s)
    [3/8] 02_profile_prefill  ok  in 41s

Status of a step from its exit code: 0 ok ("ok (skipped)" when it printed a line starting "[skip]"),
2 setup-error, 130 interrupted, anything else failed; "missing" when its script does not exist. Ctrl-C or
SIGTERM stops the running step's whole process group, marks it interrupted and runs no further step.
The pipeline: ok (every step ok), partial (some ok), failed (none ok) or interrupted; exit code 0 only
when ok, 130 when interrupted (Ctrl-C or SIGTERM), 2 for a bad command line or a results folder that
cannot be written (one line, no step runs), else 1. Only an ok pipeline refreshes the system's reports.

Writes ``<system>/results/06_full_pipeline/`` through common.results.Run (a run that is not ok is kept
beside the last good one, not over it): steps.csv (step, status, seconds, kind, command, started_utc, rc),
warmup.csv (per JIT module), server_starts.csv (one row per service start), logs/<step>.log (a service's
row: logs/server-<name>.log) and summary.json (status, headline steps_ok, steps, total_s, warmup_s,
server_s, measure_s, a story table). Needs only the standard library and common/ (no pandas, no torch).
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import REPO_ROOT, SYSTEMS
from .procs import reap_left

ONLY = "only"                   # Step(ncu=ONLY) / Step(nsys=ONLY): the step runs only with that flag
STEM = "06_full_pipeline"
WARMUP = "jit_warmup"
ROOT_ENV = "HANDS_ON_PIPELINE_ROOT"    # tests: a folder holding a fake <system>/scripts/_steps.py
COLUMNS = ("step", "status", "seconds", "kind", "command", "started_utc", "rc")
STARTS_ENV = "HANDS_ON_SERVER_STARTS"  # a .jsonl: one object per service start of this run (runner's and steps')


@dataclass(frozen=True)
class Step:
    """One step of a system's pipeline, declared in ``<system>/scripts/_steps.py``.

    Its arguments (quick, full, ncu, nsys) may hold ``{python}`` (this interpreter) and ``{scripts}``
    (the system's scripts folder), e.g. for a profiler wrapper whose command line names another script."""
    name: str                            # the row in steps.csv, the log's name, what --only takes
    script: str                          # a file in <system>/scripts/: .py runs with python, .sh with bash
    quick: tuple = ("--quick",)          # its arguments with --quick
    full: tuple = ()                     # its arguments with --all
    ncu: tuple | str = ()                # added with --ncu; ONLY: a step that runs only with --ncu
    nsys: tuple | str = ()               # added with --nsys; ONLY: a step that runs only with --nsys
    only_all: bool = False               # in the plan only with --all (a long or multi-GPU sweep)
    min_gpus: int = 1                    # left out (with a note) when fewer GPUs are visible
    jit: tuple = ()                      # common.jit modules it loads (the warm-up builds them first)
    jit_all: tuple = ()                  # ... and those it loads only in its full run
    under: str = ""                      # "nsys": run it under Nsight Systems (see nsys_main below)
    server: str = ""                     # a SERVERS name: the shared service it uses (in that service's modes)


@dataclass(frozen=True)
class Service:
    """A long-lived process several steps share (an inference server), declared in ``_steps.py`` as
    ``SERVERS = {name: Service(...)}`` (see the module docstring for the handle its provider returns)."""
    provider: str                        # "module:callable", the module in <system>/scripts/ (or importable)
    modes: tuple = ("quick",)            # the modes in which the runner shares it; otherwise each step starts its own
    why: str = ""                        # one line: what sharing it saves
    options: dict = field(default_factory=dict)   # keyword arguments for the provider


class ServiceSkipped(Exception):
    """A provider declines to start its service here (e.g. the GPU is too small for a second server
    beside it): the steps start their own. The row says why, status "ok (skipped)"."""


@dataclass
class Planned:
    """A step with its command line for this run."""
    name: str
    kind: str                            # warmup | server | measure
    argv: list
    shown: str                           # the command as a user would type it (python, relative paths)
    script: Path | None                  # the file that must exist
    eta: float | None = None             # seconds, from the last run; None: never timed
    service: str = ""                    # measure: the shared service it uses; server: the service it starts


class UsageError(Exception):
    """A bad command line or step declaration: one line, exit code 2."""


# ------------------------------------------------------------------ plan

def load_steps(root: Path, system: str) -> tuple[list, dict]:
    """(STEPS, NOTES) of ``<root>/<system>/scripts/_steps.py``, checked against common.jit's catalogue."""
    steps, notes, _servers = load_system(root, system)
    return steps, notes


def load_system(root: Path, system: str) -> tuple[list, dict, dict]:
    """(STEPS, NOTES, SERVERS) of ``<root>/<system>/scripts/_steps.py``, checked: unique step names, JIT
    modules of common.jit's catalogue, every ``Step.server`` a declared service."""
    from . import jit
    path = root / system / "scripts" / "_steps.py"
    if not path.exists():
        found = sorted(p.parent.parent.name for p in root.glob("*/scripts/_steps.py"))
        raise UsageError(f"unknown system {system!r} (no {path}); systems: {', '.join(found) or 'none'}")
    try:
        spec = importlib.util.spec_from_file_location(f"_steps_{system.replace('-', '_')}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        steps, notes = list(mod.STEPS), dict(getattr(mod, "NOTES", {}))
        servers = dict(getattr(mod, "SERVERS", {}))
    except Exception as e:  # noqa: BLE001 - a broken declaration is one line, not a traceback
        raise UsageError(f"cannot read {path}: {e.__class__.__name__}: {e}") from None
    names = [s.name for s in steps]
    dup = sorted({n for n in names if names.count(n) > 1})
    bad = sorted({m for s in steps for m in (*s.jit, *s.jit_all) if m not in jit.MODULES})
    if dup or bad:
        raise UsageError(f"{path}: " + (f"duplicate step names {dup}" if dup else
                                        f"unknown JIT modules {bad} (python -m common.jit --list)"))
    unknown = sorted({s.server for s in steps if s.server and s.server not in servers})
    if unknown:
        raise UsageError(f"{path}: steps name undeclared servers {unknown} (SERVERS declares "
                         f"{sorted(servers) or 'none'})")
    return steps, notes, servers


def load_provider(root: Path, system: str, spec: str):
    """The callable ``module:name`` names: the module from ``<root>/<system>/scripts/<module>.py`` when that
    file exists (imported under its own name, as the steps import it), else an importable module."""
    mod_name, _, attr = spec.partition(":")
    path = root / system / "scripts" / f"{mod_name}.py"
    if mod_name in sys.modules and str(getattr(sys.modules[mod_name], "__file__", "")) == str(path):
        mod = sys.modules[mod_name]
    elif path.is_file():
        spec_ = importlib.util.spec_from_file_location(mod_name, path)
        mod = importlib.util.module_from_spec(spec_)
        sys.modules[mod_name] = mod
        spec_.loader.exec_module(mod)
    else:
        mod = importlib.import_module(mod_name)
    return getattr(mod, attr)


def visible_gpus() -> int:
    """GPUs the steps will see: `nvidia-smi -L`, capped by CUDA_VISIBLE_DEVICES; 0 without a driver."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    n = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    return n if cvd is None else min(n, len([x for x in cvd.split(",") if x.strip()]))


def choose(steps, mode: str, ncu: bool, nsys: bool, only: list | None, gpus: int) -> tuple[list, list]:
    """[(step, its arguments)] for this run, in declaration order, and notes on what was left out."""
    chosen, notes = [], []
    for s in steps:
        if only is not None:
            if s.name not in only:
                continue
        elif (s.ncu == ONLY and not ncu) or (s.nsys == ONLY and not nsys) or (s.only_all and mode != "all"):
            continue
        elif s.min_gpus > 1 and gpus < s.min_gpus:
            notes.append(f"{s.name} left out: it needs {s.min_gpus} GPUs, {gpus} visible")
            continue
        args = list(s.full if mode == "all" else s.quick)
        args += list(s.ncu) if ncu and s.ncu != ONLY else []
        args += list(s.nsys) if nsys and s.nsys != ONLY else []
        chosen.append((s, args))
    return chosen, notes


def warmup_modules(chosen, mode: str) -> list[str]:
    out = []
    for s, _ in chosen:
        for m in (*s.jit, *(s.jit_all if mode == "all" else ())):
            if m not in out:
                out.append(m)
    return out


def _shown(argv, root: Path) -> str:
    """The command as a user would type it from the repository root."""
    def one(a: str) -> str:
        if a == sys.executable:
            return "python"
        return a[len(str(root)) + 1:] if a.startswith(str(root) + os.sep) else a
    return shlex.join(one(str(a)) for a in argv)


def step_command(root: Path, system: str, s: Step, args: list, service: str = "") -> Planned:
    py, scripts = sys.executable, root / system / "scripts"
    path = scripts / s.script
    args = [a.replace("{python}", py).replace("{scripts}", str(scripts)) for a in args]
    argv = (["bash", str(path)] if s.script.endswith(".sh") else [py, str(path)]) + args
    if s.under == "nsys":
        out = root / system / "results" / "nsys_timeline" / s.name
        argv = [py, "-m", "common.pipeline", "nsys", "--out", str(out), "--"] + argv
    return Planned(s.name, "measure", argv, _shown(argv, root), path, service=service)


def server_row(name: str) -> str:
    return f"server:{name}"


def plan_services(plan: list[Planned], handles: dict) -> list[Planned]:
    """The plan with a "server" row before the first step of each shared service it uses."""
    out, seen = [], set()
    for p in plan:
        if p.service and p.service not in seen:
            seen.add(p.service)
            out.append(Planned(server_row(p.service), "server", [], handles[p.service].describe(), None,
                               service=p.service))
        out.append(p)
    return out


def warmup_command(system: str, modules: list[str]) -> Planned:
    argv = [sys.executable, "-m", "common.jit", "--system", system, "--modules", ",".join(modules)]
    return Planned(WARMUP, "warmup", argv, _shown(argv, REPO_ROOT), None)


# ------------------------------------------------------------------ the last run's table (ETA, --only)

def _results(root: Path, system: str) -> Path:
    return root / system / "results"


def previous_table(root: Path, system: str) -> tuple[list[dict], Path | None]:
    """Rows of the newest steps.csv of this pipeline (a good run, or one kept as failed/interrupted),
    normalised to COLUMNS; older layouts (steps.tsv, a 'script' column) are read too."""
    base = _results(root, system)
    cands = [base / STEM / "steps.csv", base / STEM / "steps.tsv", *base.glob(f"{STEM}/*/steps.csv"),
             *base.glob(f".failed/{STEM}/*/steps.csv")]
    cands = [p for p in cands if p.is_file()]
    if not cands:
        return [], None
    newest = max(cands, key=lambda p: p.stat().st_mtime)
    rows = []
    try:
        with open(newest, newline="") as f:
            for r in csv.DictReader(f, delimiter="\t" if newest.suffix == ".tsv" else ","):
                name = (r.get("step") or r.get("script") or "").split(" ")[0]
                name = name[:-3] if name.endswith((".py", ".sh")) else name
                try:
                    secs = float(r.get("seconds") or "nan")
                except ValueError:
                    secs = float("nan")
                rows.append({"step": name, "status": r.get("status", ""), "seconds": secs,
                             "kind": r.get("kind") or "measure", "command": r.get("command") or "",
                             "started_utc": r.get("started_utc") or "", "rc": r.get("rc", "")})
    except (OSError, csv.Error, UnicodeDecodeError):
        return [], None
    return rows, newest.parent


def attach_eta(plan: list[Planned], prev: list[dict]) -> None:
    """A step's ETA: its seconds in the last run when it ended ok with the same command."""
    by_name = {r["step"]: r for r in prev}
    for p in plan:
        r = by_name.get(p.name)
        if r and r["status"].startswith("ok") and r["seconds"] == r["seconds"] \
                and (not r["command"] or r["command"] == p.shown):
            p.eta = r["seconds"]


def fmt_s(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def eta_text(rest: list[Planned]) -> str:
    known = [p.eta for p in rest if p.eta is not None]
    unknown = len(rest) - len(known)
    if not known:
        return "ETA unknown: no earlier timing of these steps"
    tail = f" + {unknown} step{'s' if unknown > 1 else ''} never timed" if unknown else ""
    return f"ETA {fmt_s(sum(known))}{tail}"


# ------------------------------------------------------------------ running one step

def child_env() -> dict:
    """The children's environment: this interpreter for the .sh wrappers, common/ importable, unbuffered
    output, and the workbook's NCCL policy (NVLink multicast off)."""
    from .procs import nccl_env
    env = dict(os.environ)
    env.update(nccl_env(env)[0])
    env["PYTHON"] = sys.executable
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def run_child(argv, log: Path, cwd: Path, env: dict, name: str) -> tuple[int | None, bool]:
    """Run ``argv`` in its own process group, its output into ``log`` and onto the console.
    Returns (exit code, interrupted); Ctrl-C/SIGTERM stops the child's whole process tree."""
    from .procs import Group, ProcError
    g = Group(argv, log, env=env, cwd=cwd, name=name, echo=lambda m: print(m, flush=True))
    try:
        g.start()
    except ProcError as e:
        print(f"{name}: {e}", flush=True)
        return 127, False
    rc, interrupted, out = None, False, sys.stdout.buffer
    try:
        with open(log, "rb") as f:
            while True:
                done = g.poll() is not None
                chunk = f.read()
                if chunk:
                    out.write(chunk)
                    out.flush()
                if done:
                    break
                time.sleep(0.1)
        rc = g.proc.returncode if g.proc else None
    except KeyboardInterrupt:
        interrupted = True
    try:
        report = g.stop()               # also after a normal exit: reaps what the step left in its group
    except KeyboardInterrupt:           # a second Ctrl-C while stopping: Group already sent SIGKILL
        interrupted, report = True, {}
    if rc is None and not interrupted:
        rc = report.get("returncode")
    return rc, interrupted


INTERRUPTED_RCS = (130, 128 + signal.SIGTERM, -signal.SIGINT, -signal.SIGTERM)   # Ctrl-C / SIGTERM


def status_of(rc: int | None, interrupted: bool, log: Path) -> str:
    if interrupted or rc in INTERRUPTED_RCS:
        return "interrupted"
    if rc == 0:
        try:
            skipped = any(line.startswith("[skip]") for line in log.read_text(errors="replace").splitlines())
        except OSError:
            skipped = False
        return "ok (skipped)" if skipped else "ok"
    return "setup-error" if rc == 2 else "failed"


def overall(statuses: list[str]) -> str:
    if "interrupted" in statuses:
        return "interrupted"
    ok = sum(s.startswith("ok") for s in statuses)
    return "ok" if statuses and ok == len(statuses) else "partial" if ok else "failed"


# ------------------------------------------------------------------ the command line

class _Parser(argparse.ArgumentParser):
    def error(self, message):          # one line, exit 2 (argparse would print the usage block too)
        print(f"{self.prog}: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def _prog() -> str:
    cmd = os.environ.get("PIPELINE_COMMAND", "").split(" ")[0]
    return Path(cmd).name if cmd else "python -m common.pipeline"


def parse_args(argv):
    p = _Parser(prog=_prog(), description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--system", required=True, help=f"one of {', '.join(SYSTEMS)}")
    m = p.add_mutually_exclusive_group()
    m.add_argument("--quick", dest="mode", action="store_const", const="quick", help="(default) quick mode")
    m.add_argument("--all", dest="mode", action="store_const", const="all", help="the full runs")
    p.add_argument("--ncu", action="store_true", help="add the ncu passes")
    p.add_argument("--nsys", action="store_true", help="add the timeline")
    p.add_argument("--only", default=None, metavar="STEP,...", help="run only these steps")
    p.add_argument("--no-warmup", action="store_true", help="no JIT warm-up step")
    p.add_argument("--dry-run", action="store_true", help="print the plan (steps, commands, ETA) and exit")
    p.add_argument("--root", default=None, help=argparse.SUPPRESS)       # tests: a fake repository
    a, extra = p.parse_known_args(argv)
    if extra:
        p.error(f"unknown option {extra[0]!r}")
    a.mode = a.mode or "quick"
    return a


# ------------------------------------------------------------------ main

def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["nsys"]:
        return nsys_main(argv[1:])
    a = parse_args(argv)
    root = Path(a.root or os.environ.get(ROOT_ENV) or REPO_ROOT).resolve()
    try:
        steps, notes, servers = load_system(root, a.system)
        only = None
        if a.only is not None:
            only = [x.strip() for x in a.only.split(",") if x.strip()]
            bad = [x for x in only if x not in {s.name for s in steps}]
            if bad or not only:
                raise UsageError(f"--only: unknown step {', '.join(map(repr, bad)) or '(none given)'}; "
                                 f"the steps of {a.system}: {', '.join(s.name for s in steps)}")
    except UsageError as e:
        print(f"{_prog()}: {e}", file=sys.stderr)
        return 2
    chosen, left_out = choose(steps, a.mode, a.ncu, a.nsys, only, visible_gpus())
    for flag, on in (("ncu", a.ncu), ("nsys", a.nsys)):
        if on and only is None and not any(getattr(s, flag) for s, _ in chosen):
            left_out.append(notes.get(flag, f"--{flag} adds no step in {a.system}"))
    sinks = {n: _Sink() for n in servers}
    try:
        handles = {}
        for n, svc in servers.items():
            try:
                handles[n] = load_provider(root, a.system, svc.provider)(name=n, mode=a.mode, echo=sinks[n], **svc.options)
            except Exception as e:  # noqa: BLE001 - a broken provider is one line
                raise UsageError(f"server {n!r}: cannot load its provider {svc.provider}: "
                                 f"{e.__class__.__name__}: {e}") from None
    except UsageError as e:
        print(f"{_prog()}: {e}", file=sys.stderr)
        return 2
    shared = {s.name: s.server for s, _ in chosen if s.server and a.mode in servers[s.server].modes}
    plan = plan_services([step_command(root, a.system, s, args, shared.get(s.name, "")) for s, args in chosen], handles)
    mods = [] if a.no_warmup else warmup_modules(chosen, a.mode)
    if mods:
        plan.insert(0, warmup_command(a.system, mods))
    prev, prev_dir = previous_table(root, a.system)
    attach_eta(plan, prev)
    flags = " ".join(f"--{f}" for f, on in (("ncu", a.ncu), ("nsys", a.nsys)) if on)
    title = f"{a.system} pipeline --{a.mode}{' ' + flags if flags else ''}{' --only ' + ','.join(only) if only else ''}"
    width = max(len(p.name) for p in plan) if plan else 10
    print(f"{title}: {len(plan)} step{'s' if len(plan) != 1 else ''}, {eta_text(plan)}", flush=True)
    for note in left_out:
        print(f"note: {note}", flush=True)
    for p in plan:
        if p.kind == "server" and servers[p.service].why:
            print(f"note: {p.name}: {servers[p.service].why}", flush=True)
    if a.dry_run:
        for i, p in enumerate(plan, 1):
            miss = "  (missing: the script does not exist)" if p.script and not p.script.exists() else ""
            est = f"~{fmt_s(p.eta)}" if p.eta is not None else "?"
            print(f"  {_tag(i, len(plan))} {p.name:<{width}}  {p.kind:<7}  {est:>7}  {p.shown}{miss}")
        print("dry run: nothing was run.")
        return 0
    if not plan:
        print(f"{_prog()}: nothing to run", file=sys.stderr)
        return 2
    return execute(a, root, plan, width, only, prev, prev_dir, left_out, title, steps, handles, sinks)


class _Sink:
    """What a service says: on the console and in its row's log (once the run has a folder)."""

    def __init__(self):
        self.path: Path | None = None

    def __call__(self, msg) -> None:
        print(msg, flush=True)
        if self.path:
            with open(self.path, "a") as f:
                f.write(f"{msg}\n")


class _Services:
    """The shared services of one run: started at their row, checked (and restarted) before each step that
    uses them, offered to those steps through the environment, stopped after their last step and at the end."""

    def __init__(self, handles: dict, sinks: dict, plan: list, run, width: int):
        self.handles, self.sinks, self.run, self.width = handles, sinks, run, width
        self.last = {p.service: p.name for p in plan if p.kind == "measure" and p.service}
        self.up: set = set()
        self.down: dict = {}                   # name -> why it is not offered

    def reap(self) -> None:
        for n, h in self.handles.items():
            try:
                h.reap()
            except Exception as e:  # noqa: BLE001 - said, the run goes on
                print(f"{server_row(n)}: could not look for servers of killed runs: {e.__class__.__name__}: {e}",
                      flush=True)

    def start(self, name: str, row: dict, tag: str) -> None:
        """Start ``name``, filling its row (status, seconds); its steps start their own when it does not."""
        from .checks import SetupError
        h, sink = self.handles[name], self.sinks[name]
        sink.path = self.run.path(f"logs/server-{name}.log")
        t0 = time.time()
        try:
            h.start(sink.path.parent)
            row["status"] = "ok"
            self.up.add(name)
        except ServiceSkipped as e:
            row["status"], self.down[name] = "ok (skipped)", str(e)
            sink(f"{server_row(name)}: not started: {e}; its steps start their own servers")
        except KeyboardInterrupt:
            row["status"] = "interrupted"
            self._stop(name, quiet=True)
            raise
        except Exception as e:  # noqa: BLE001 - one line; the steps go on without it
            first = str(e).splitlines()[0][:300] if str(e) else ""
            row["status"] = "setup-error" if isinstance(e, SetupError) else "failed"
            self.down[name] = f"{e.__class__.__name__}: {first}"
            sink(f"{server_row(name)}: could not start ({self.down[name]}); its steps start their own servers")
            self._stop(name, quiet=True)
        finally:
            row["seconds"] = round(time.time() - t0, 1)
        print(f"{tag}  {row['status']}  in {fmt_s(row['seconds'])}", flush=True)

    def ready(self, name: str, step: str) -> list[dict]:
        """Before ``step``: the service is usable, or it is restarted (the new rows)."""
        if name not in self.up:
            return []
        try:
            why = self.handles[name].check()
        except Exception as e:  # noqa: BLE001
            why = f"its check failed: {e.__class__.__name__}: {e}"
        if not why:
            return []
        self.sinks[name](f"{server_row(name)}: not usable before {step} ({why}); restarting it")
        self._stop(name, quiet=True)
        row = {"step": server_row(name), "status": "", "seconds": 0.0, "kind": "server",
               "command": self.handles[name].describe(), "started_utc": _utc(), "rc": ""}
        tag = f"[restart] {server_row(name):<{self.width}}"
        print(f"{tag}  started  (before {step})", flush=True)
        self.start(name, row, tag)
        return [row]

    def env(self, name: str) -> dict:
        return self.handles[name].env() if name in self.up else {}

    def after(self, step: str) -> None:
        for n, last in self.last.items():
            if last == step and n in self.up:
                self._stop(n)

    def _stop(self, name: str, quiet: bool = False) -> None:
        t0 = time.time()
        try:
            self.handles[name].stop()
        finally:
            if name in self.up and not quiet:
                self.sinks[name](f"{server_row(name)}: stopped in {time.time() - t0:.1f} s")
            self.up.discard(name)

    def stop_all(self) -> None:
        for n in list(self.up):
            try:
                self._stop(n)
            except KeyboardInterrupt:           # a second Ctrl-C: the group got SIGKILL; once more, quickly
                self._stop(n, quiet=True)

    def lines(self) -> list[str]:
        out = []
        for n, h in self.handles.items():
            try:
                out += list(h.lines())
            except Exception:  # noqa: BLE001 - the story goes without them
                pass
        return out


def _utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def execute(a, root, plan, width, only, prev, prev_dir, notes, title, steps, handles=None, sinks=None) -> int:
    """Run the plan inside a results.Run; write steps.csv and summary.json; refresh reports when ok."""
    from .checks import SetupError
    from .results import Run
    for sig in (signal.SIGTERM, signal.SIGHUP):       # stop like Ctrl-C: the running step's group goes too
        signal.signal(sig, _raise_interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    command = os.environ.get("PIPELINE_COMMAND") or shlex.join(["python", "-m", "common.pipeline", *sys.argv[1:]])
    args = {"mode": a.mode, "ncu": a.ncu, "nsys": a.nsys, "only": only, "warmup": not a.no_warmup}
    try:
        run = Run(root / a.system / "scripts" / f"{STEM}.sh", args, quiet=True, command=command)
    except SetupError as e:  # a read-only or unusable results folder: the one [setup] line, nothing ran
        print(f"[setup] {str(e).replace(' or pass --out DIR', '')}; no step was run", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - one line
        print(f"{_prog()}: cannot open the results folder: {e.__class__.__name__}: {e}", file=sys.stderr)
        return 1
    os.environ[STARTS_ENV] = str(run.dir / "server_starts.jsonl")    # the steps inherit it (child_env)
    services = _Services(handles or {}, sinks or {}, plan, run, width)
    env, rows, t0, between = child_env(), [], time.time(), False
    try:
        reap_left(echo=lambda m: print(m, flush=True))    # servers a killed run of any script left behind
        services.reap()                     # what a killed run of this pipeline left behind
        for i, p in enumerate(plan, 1):
            tag = f"{_tag(i, len(plan))} {p.name:<{width}}"
            row = {"step": p.name, "status": "", "seconds": 0.0, "kind": p.kind, "command": p.shown,
                   "started_utc": _utc(), "rc": ""}
            rows.append(row)
            if p.script is not None and not p.script.exists():
                row["status"] = "missing"
                print(f"{tag}  missing: {_shown([str(p.script)], root)} does not exist", flush=True)
                continue
            step_env = env
            if p.service and p.kind == "measure":              # a shared service it uses: usable, or restarted
                rows[-1:-1] = services.ready(p.service, p.name)
                step_env = {**env, **services.env(p.service)}
                row["started_utc"] = _utc()
            print(f"{tag}  started  (elapsed {fmt_s(time.time() - t0)}, {eta_text(plan[i - 1:])})", flush=True)
            if p.kind == "server":
                services.start(p.service, row, tag)
                continue
            argv = p.argv + (["--csv", str(run.path("warmup.csv"))] if p.kind == "warmup" else [])
            log, ts = run.path(f"logs/{p.name}.log"), time.time()
            rc, interrupted = run_child(argv, log, root, step_env, p.name)
            row.update(status=status_of(rc, interrupted, log), seconds=round(time.time() - ts, 1),
                       rc="" if rc is None else rc)
            why = f" (exit {rc})" if row["status"] in ("failed", "setup-error") and rc is not None else ""
            print(f"{tag}  {row['status']}{why}  in {fmt_s(row['seconds'])}", flush=True)
            if row["status"] == "interrupted":
                break
            services.after(p.name)
    except KeyboardInterrupt:               # outside a step's run (nothing of it is running)
        between = True
        if rows and not rows[-1]["status"]:
            rows[-1]["status"] = "interrupted"
    finally:                                # normal end, a failure, Ctrl-C, SIGTERM: no service outlives the run
        try:
            services.stop_all()
        except KeyboardInterrupt:
            between = True
    measured = [r for r in rows if r["kind"] == "measure"]
    status = overall([r["status"] for r in measured] + [r["status"] for r in rows if r["status"] == "interrupted"]
                     + (["interrupted"] if between else []))
    recorded = False
    try:
        kept = record(run, root, rows, prev, prev_dir, only, status, title, notes, steps, time.time() - t0,
                      services.lines())
        recorded = True
    except KeyboardInterrupt:
        status, kept = "interrupted", None
    except Exception as e:  # noqa: BLE001 - the summary could not be written: one line
        print(f"{_prog()}: could not record the run: {e.__class__.__name__}: {e}", file=sys.stderr)
        kept = None
    ok_n = sum(r["status"].startswith("ok") for r in measured)
    print(f"\n{title}: {status} — {ok_n}/{len(measured)} steps ok in {fmt_s(time.time() - t0)}"
          + (f"; results and logs: {_shown([str(kept)], root)}" if kept else
             "" if recorded else "; the run could not be recorded"), flush=True)
    if status == "interrupted":
        print("interrupted: the running step's process group was stopped, no further step ran; "
              "reports not refreshed.", flush=True)
        return 130
    if status != "ok":
        print(f"reports not refreshed: the pipeline ended {status} (only a run whose every step is ok refreshes them).",
              flush=True)
        return 1
    if not recorded:
        print("reports not refreshed: the pipeline's own record could not be written (the line above says why).",
              flush=True)
        return 1
    return 0 if refresh_reports(root, a.system) else 1


def _tag(i: int, n: int) -> str:
    return f"[{i}/{n}]".ljust(len(f"[{n}/{n}]"))


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def record(run, root, rows, prev, prev_dir, only, status, title, notes, steps, total, service_lines=()) -> Path | None:
    """steps.csv (with the rows --only carried over), warmup.csv, server_starts.csv, headline, story;
    finish(status)."""
    table = list(rows)
    carried = []
    if only is not None:
        order = [WARMUP] + sorted({r["step"] for r in (*rows, *prev) if r["kind"] == "server"}) + [s.name for s in steps]
        ran = {r["step"] for r in rows}
        carried = [r for r in prev if r["step"] in order and r["step"] not in ran]
        for r in carried:                          # keep their logs beside their rows
            logs = (prev_dir / "logs" / f"{r['step']}.log", prev_dir / f"{r['step']}.log") if prev_dir else ()
            src = next((d for d in logs if d.is_file()), None)
            if src:
                shutil.copy2(src, run.path(f"logs/{r['step']}.log"))
        table = sorted(rows + carried, key=lambda r: order.index(r["step"]) if r["step"] in order else len(order))
    run.table("steps", [{c: "" if r.get(c) != r.get(c) else r.get(c, "") for c in COLUMNS} for r in table])
    wcsv = Path(run.path("warmup.csv")) if any(r["kind"] == "warmup" for r in rows) else None
    if wcsv and wcsv.is_file() and wcsv.stat().st_size:
        with open(wcsv, newline="") as f:
            run.table("warmup", list(csv.DictReader(f)))
    starts = Path(run.dir / "server_starts.jsonl")
    if starts.is_file() and starts.stat().st_size:
        srows = []
        for line in starts.read_text(errors="replace").splitlines():
            try:
                srows.append(json.loads(line))
            except ValueError:
                continue                  # a line cut by a killed step
        if srows:
            run.table("server_starts", srows)
    measured = [r for r in rows if r["kind"] == "measure"]
    warm = sum(r["seconds"] for r in rows if r["kind"] == "warmup")
    serv = sum(r["seconds"] for r in rows if r["kind"] == "server")
    meas = sum(r["seconds"] for r in measured)
    run.headline(steps_ok=sum(r["status"].startswith("ok") for r in measured), steps=len(measured),
                 total_s=round(total, 1), warmup_s=round(warm, 1), measure_s=round(meas, 1), carried=len(carried))
    if any(r["kind"] == "server" for r in rows):
        run.headline(server_s=round(serv, 1), server_starts=sum(r["kind"] == "server" for r in rows))
    for n in notes:
        run.note(n)
    system, _, rest = title.partition(" pipeline ")
    shared = f", shared servers {fmt_s(serv)}" if any(r["kind"] == "server" for r in rows) else ""
    lines = [f"{system.upper()} PIPELINE {rest}: {status} — {fmt_s(total)} "
             f"(warm-up {fmt_s(warm)}{shared}, measurement {fmt_s(meas)})"]
    w = max(len(r["step"]) for r in table) if table else 4
    lines.append(f"  {'step':<{w}}  {'status':<13} {'time':>7}  {'kind':<7}  started (UTC)")
    for r in table:
        mark = "  (carried over)" if r in carried else ""
        secs = fmt_s(r["seconds"]) if r["seconds"] == r["seconds"] else "-"
        lines.append(f"  {r['step']:<{w}}  {r['status']:<13} {secs:>7}  {r['kind']:<7}  {r['started_utc']}{mark}")
    lines += list(service_lines)
    run.story("\n".join(lines))
    kept = run.finish(status)
    return kept if isinstance(kept, Path) else None


def refresh_reports(root: Path, system: str) -> bool:
    """common.report for this system (in-process); a failure is one line and exit code 1."""
    try:
        from .report import refresh
        o = refresh(systems=(system,), root=root)
    except Exception as e:  # noqa: BLE001
        print(f"reports: refresh failed ({e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
              f"the results are kept", flush=True)
        return False
    written = getattr(o, "files_written", [])
    print(f"reports: {len(getattr(o, 'refreshed', []))} block(s) refreshed, {len(written)} file(s) changed"
          + (f" ({', '.join(written)})" if written else ""), flush=True)
    return True


# ------------------------------------------------------------------ a step under Nsight Systems

def nsys_main(argv) -> int:
    """``python -m common.pipeline nsys --out DIR -- CMD...``: CMD under nsys (common.nsys), the report in
    DIR/<name>.nsys-rep and the kernel summary printed; where nsys is not usable a [skip] line (exit 0)."""
    from .checks import SetupError
    if "--out" not in argv or "--" not in argv:
        print("usage: python -m common.pipeline nsys --out DIR -- COMMAND...", file=sys.stderr)
        return 2
    out, cmd = Path(argv[argv.index("--out") + 1]), argv[argv.index("--") + 1:]
    from . import nsys
    if nsys.find() is None:
        print("[skip] Nsight Systems is not usable here (common.nsys.find() found none); the torch-profiler "
              "traces the scripts write (results/*/trace.json, open in https://ui.perfetto.dev) are the timeline")
        return 0
    try:
        rep = nsys.profile(cmd, out, name=out.name)
        tables = nsys.stats(rep, ["cuda_gpu_kern_sum", "nvtx_sum"])
    except SetupError as e:
        print(f"[setup] {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001
        print(f"[failed] nsys: {e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}", file=sys.stderr)
        return 1
    print(f"timeline: {rep} (open it in Nsight Systems)")
    src = tables.get("cuda_gpu_kern_sum")
    lines = [l for l in src.read_text(errors="replace").splitlines() if l.strip()] if src else []
    head = next((i for i, l in enumerate(lines) if l.lstrip('"').startswith("Time")), None)
    if head is not None:
        rows = list(csv.DictReader(lines[head:]))[:8]
        print("top kernels by GPU time:")
        for r in rows:
            print(f"  {r.get('Time (%)', '?'):>6} %  {r.get('Instances', '?'):>6} x  {r.get('Name', '?')[:100]}")
    return 0


if __name__ == "__main__":
    from common.checks import run_main
    from common.pipeline import main as _main   # the module under its own name: _steps.py imports Step from it
    run_main(_main)
