"""A pipeline's plan: the steps of a system (<system>/scripts/_steps.py), which run in a mode, their commands,
the services they share and the ETA from the previous run's step times (common.run.pipeline runs the plan)."""
from __future__ import annotations

import csv
import importlib.util
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from common import REPO_ROOT, SYSTEMS

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
    jit: tuple = ()                      # common.capture.jit modules it loads (the warm-up builds them first)
    jit_all: tuple = ()                  # ... and those it loads only in its full run
    under: str = ""                      # "nsys": run it under Nsight Systems (see nsys_main below)
    server: str | tuple = ""             # a SERVERS name, or several: the shared services it uses (in their modes)

    @property
    def servers(self) -> tuple:
        """The SERVERS names it uses, as a tuple."""
        return ((self.server,) if self.server else ()) if isinstance(self.server, str) else tuple(self.server)


@dataclass(frozen=True)
class Service:
    """A long-lived process several steps share (an inference server), declared in ``_steps.py`` as
    ``SERVERS = {name: Service(...)}`` (see the module docstring for the handle its provider returns)."""
    provider: str                        # "module:callable", the module in <system>/scripts/ (or importable)
    modes: tuple = ("quick",)            # the modes in which the runner shares it; otherwise each step starts its own
    why: str = ""                        # one line: what sharing it saves
    options: dict = field(default_factory=dict)   # keyword arguments for the provider
    held: bool = False                   # launched when the run begins, held (no GPU work) until its row: the
                                         # provider's launch(); its start then overlaps the steps before its row


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
    services: tuple = ()                 # measure: the shared services it uses; server: (the service it starts,)


class UsageError(Exception):
    """A bad command line or step declaration: one line, exit code 2."""


def load_steps(root: Path, system: str) -> tuple[list, dict]:
    """(STEPS, NOTES) of ``<root>/<system>/scripts/_steps.py``, checked against common.capture.jit's catalogue."""
    steps, notes, _servers = load_system(root, system)
    return steps, notes


def _declaration(root: Path, system: str):
    """The module ``<root>/<system>/scripts/_steps.py``, executed (a broken one: UsageError, one line)."""
    path = root / system / "scripts" / "_steps.py"
    if not path.exists():
        found = sorted(p.parent.parent.name for p in root.glob("*/scripts/_steps.py"))
        raise UsageError(f"unknown system {system!r} (no {path}); systems: {', '.join(found) or 'none'}")
    try:
        spec = importlib.util.spec_from_file_location(f"_steps_{system.replace('-', '_')}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    except Exception as e:  # noqa: BLE001 - a broken declaration is one line, not a traceback
        raise UsageError(f"cannot read {path}: {e.__class__.__name__}: {e}") from None


def load_needs(root: Path, system: str) -> tuple:
    """``NEEDS`` of the system's _steps.py: "module:callable" checks that every one of its steps makes first
    (torch with CUDA, a GPU, the system's package); the runner makes them once, before any step (:func:`needs_main`)."""
    return tuple(getattr(_declaration(root, system), "NEEDS", ()))


def load_system(root: Path, system: str) -> tuple[list, dict, dict]:
    """(STEPS, NOTES, SERVERS) of ``<root>/<system>/scripts/_steps.py``, checked: unique step names, JIT
    modules of common.capture.jit's catalogue, every ``Step.server`` a declared service."""
    from common.capture import jit
    path = root / system / "scripts" / "_steps.py"
    mod = _declaration(root, system)
    try:
        steps, notes = list(mod.STEPS), dict(getattr(mod, "NOTES", {}))
        servers = dict(getattr(mod, "SERVERS", {}))
    except Exception as e:  # noqa: BLE001 - a broken declaration is one line, not a traceback
        raise UsageError(f"cannot read {path}: {e.__class__.__name__}: {e}") from None
    names = [s.name for s in steps]
    dup = sorted({n for n in names if names.count(n) > 1})
    bad = sorted({m for s in steps for m in (*s.jit, *s.jit_all) if m not in jit.MODULES})
    if dup or bad:
        raise UsageError(f"{path}: " + (f"duplicate step names {dup}" if dup else
                                        f"unknown JIT modules {bad} (python -m common jit --list)"))
    unknown = sorted({n for s in steps for n in s.servers if n and n not in servers})
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


def step_command(root: Path, system: str, s: Step, args: list, services: tuple = ()) -> Planned:
    py, scripts = sys.executable, root / system / "scripts"
    path = scripts / s.script
    args = [a.replace("{python}", py).replace("{scripts}", str(scripts)) for a in args]
    argv = (["bash", str(path)] if s.script.endswith(".sh") else [py, str(path)]) + args
    if s.under == "nsys":
        out = root / system / "results" / "nsys_timeline" / s.name
        argv = [py, "-m", "common", "pipeline", "nsys", "--out", str(out), "--"] + argv
    return Planned(s.name, "measure", argv, _shown(argv, root), path, services=tuple(services))


def server_row(name: str) -> str:
    return f"server:{name}"


def plan_services(plan: list[Planned], handles: dict) -> list[Planned]:
    """The plan with a "server" row before the first step of each shared service it uses."""
    out, seen = [], set()
    for p in plan:
        for n in p.services:
            if n not in seen:
                seen.add(n)
                out.append(Planned(server_row(n), "server", [], handles[n].describe(), None, services=(n,)))
        out.append(p)
    return out


def warmup_command(system: str, modules: list[str]) -> Planned:
    argv = [sys.executable, "-m", "common", "jit", "--system", system, "--modules", ",".join(modules)]
    return Planned(WARMUP, "warmup", argv, _shown(argv, REPO_ROOT), None)


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


def measure_hints(root: Path = REPO_ROOT, systems=SYSTEMS) -> dict:
    """{system: {stem: {"run": the command that measures the stem, "ncu" / "nsys" / "all": the command for the parts a
    run without that flag leaves out, "gpus": the GPUs it needs where more than one}}}, from each system's steps: what a page says a block this run did not measure
    needs (common.render.report). A system whose steps cannot be read gets none (the page then names the script)."""
    out: dict = {}
    for system in systems:
        try:
            steps, _notes, _servers = load_system(root, system)
        except UsageError:
            continue
        pipe = f"./{system}/scripts/06_full_pipeline.sh"
        mine = out.setdefault(system, {})
        for s in steps:
            stem = Path(s.script).stem
            where = f" (on a machine with >= {s.min_gpus} GPUs)" if s.min_gpus > 1 else ""
            flag = "--ncu" if s.ncu == ONLY else "--nsys" if s.nsys == ONLY else ""
            mode = "--all" if s.only_all else "--quick"
            h = {"run": f"{pipe} {mode}{' ' + flag if flag else ''} --only {s.name}{where}"}
            if s.min_gpus > 1:
                h["gpus"] = s.min_gpus
            if s.ncu and s.ncu != ONLY:
                h["ncu"] = f"{pipe} --quick --ncu --only {s.name}{where}"
            if s.nsys and s.nsys != ONLY:
                h["nsys"] = f"{pipe} --quick --nsys --only {s.name}{where}"
            if s.full != s.quick:
                h["all"] = f"{pipe} --all --only {s.name}{where}"
            mine[stem] = mine.get(stem) or h
    return out


def needs_main(argv) -> int:
    """``python -m common pipeline needs --system S [--root R]``: the system's NEEDS checks, in order, in this one
    process (the runner starts it before any step). A missing piece is the check's own [setup] line -- the very
    line each step would print -- and exit 2 (common.base.checks.run_main runs every `python -m common` tool)."""
    opts = dict(zip(argv[::2], argv[1::2]))
    root, system = Path(opts.get("--root") or REPO_ROOT), opts.get("--system", "")
    for spec in load_needs(root, system):
        load_provider(root, system, spec)()
    return 0


def report_main(argv=None) -> int:
    """`make reports` (python -m common report): common.render.report with the pipeline's hints for what measures a
    block this run left out."""
    from common.render import report
    return report.main(argv, hints=measure_hints)
