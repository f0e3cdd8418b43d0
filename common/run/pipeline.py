"""One pipeline runner for every system: each ``<system>/scripts/06_full_pipeline.sh`` execs it.

    python -m common pipeline --system flashinfer                  # = --quick: every step in its quick mode
    python -m common pipeline --system sglang --all                # the full runs
    python -m common pipeline --system flashinfer --quick --ncu --nsys
    python -m common pipeline --system mini-sglang --only 02_profile_index,03_profile_store --ncu
    python -m common pipeline --system sglang --dry-run            # the plan: steps, commands, ETA; runs nothing

Flags, the same meaning in every system:
    --quick      (default) every step in its quick mode          --all   every step's full run
    --ncu        adds the ncu passes: steps with an ncu variant get its flags, ncu-only steps are added
    --nsys       adds the timeline: steps with an nsys variant get its flags, nsys-only steps are added
    --only S,..  runs only these steps (any declared step, whatever the flags); the rows of the other
                 steps are carried over from the last run's steps.csv, so separate runs merge into one table
    --no-warmup  no JIT warm-up step          --dry-run  print the plan and exit 0

The steps are data: ``<system>/scripts/_steps.py`` defines ``STEPS = [Step(...), ...]`` (and optionally
``NOTES``, a line per flag that adds nothing there, and ``NEEDS``, the "module:callable" checks every step makes
first: torch with CUDA, a GPU, the system's package). NEEDS is checked once, in one child, before anything runs:
what is missing is that check's own [setup] line, said once, and no step runs (exit 2). Each step is a child
process in its own process group (common.capture.procs.Group), its output on the console and in
``logs/<step>.log``. First comes the warm-up (common.capture.jit: the FlashInfer / tvm-ffi modules the chosen steps load, built in parallel) so that compile time
is reported apart from measurement time; its status does not count towards the pipeline's.

Before the first step, the servers that a killed run of any script left behind (their pidfiles in the
workbook's one registry, $HANDS_ON_CACHE/servers/) are stopped: common.capture.procs.reap_left.

Shared services: ``_steps.py`` may declare ``SERVERS = {name: Service(provider, modes=("quick",), why=...)}``
and steps name one or several with ``Step(..., server=name | (name, ...))``. In those modes the runner starts each
service once, before the first step that names it -- its own row in steps.csv (kind "server", timed apart like the
warm-up) --, passes its address to the steps that name it (the variables of ``handle.env()``), checks it before
each of them (``handle.check()``; a service a step left dead or busy is restarted, a new row), and stops it after
its last step, on a failure, Ctrl-C and SIGTERM. At the start of every run ``handle.reap()`` stops what a
killed (SIGKILL) run of the pipeline left behind. A service that cannot start (or declines:
ServiceSkipped) is not offered: its steps then start what they need themselves, as when run on their own.
A held service (``Service(held=True)``) is launched when the run begins (``handle.launch``, after the reaping):
its slow, GPU-free part (a server's Python imports) runs while the steps before its row run, and it touches the
GPU only once its row (``handle.start``) lets it, when the step before has ended; its row then times only what
was left of its start. It is stopped like any service, also before its row (failure, Ctrl-C, SIGTERM).
What the service is and how it starts lives in the system's own helper (the provider, e.g.
``_sglang:SharedServer``); the runner knows only this protocol::

    handle = provider(name=..., mode="quick"|"all", echo=print_fn, **options)   # starts nothing
    handle.reap()            stop what a killed run of this pipeline left (called at every run's start)
    handle.describe() -> str the command it runs, for the plan
    handle.launch(log_dir)   (held services) start its GPU-free part now and return; raise as start() would
    handle.start(log_dir)    start (a launched one: let it go on), wait until usable; ServiceSkipped(why) declines
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
when ok, 130 when interrupted (Ctrl-C or SIGTERM), 2 for a bad command line, a results folder that
cannot be written or a NEEDS check that fails (one line, no step runs), else 1. Only an ok pipeline refreshes
the system's reports.

Writes ``<system>/results/06_full_pipeline/`` through common.run.results.Run (a run that is not ok is kept
beside the last good one, not over it): steps.csv (step, status, seconds, kind, command, started_utc, rc),
warmup.csv (per JIT module), server_starts.csv (one row per service start), logs/<step>.log (a service's
row: logs/server-<name>.log) and summary.json (status, headline steps_ok, steps, total_s, warmup_s,
server_s, measure_s, a story table). Needs only the standard library and common/ (no pandas, no torch).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from common import REPO_ROOT, SYSTEMS
from common.capture.procs import reap_left
from common.run.services import Services, Sink, utc_now
from common.run.steps import (
    measure_hints,
    COLUMNS,
    ROOT_ENV,
    STARTS_ENV,
    STEM,
    WARMUP,
    UsageError,
    _shown,
    attach_eta,
    choose,
    eta_text,
    fmt_s,
    load_provider,
    load_needs,
    load_system,
    needs_main,
    plan_services,
    previous_table,
    server_row,
    step_command,
    visible_gpus,
    warmup_command,
    warmup_modules,
)

# ------------------------------------------------------------------ plan


# ------------------------------------------------------------------ the last run's table (ETA, --only)


# ------------------------------------------------------------------ running one step

def child_env() -> dict:
    """The children's environment: this interpreter for the .sh wrappers, common/ importable, unbuffered
    output, and the workbook's NCCL policy (NVLink multicast off)."""
    from common.capture.procs import nccl_env
    env = dict(os.environ)
    env.update(nccl_env(env)[0])
    env["PYTHON"] = sys.executable
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def wants_forks(plan) -> bool:
    """Whether a run of ``plan`` has a fork server: a Python step to fork, and HANDS_ON_FORKSERVER not 0."""
    from common.run.forkserver import ForkServer, step_script
    return ForkServer.enabled() and any(p.kind == "measure" and step_script(p.argv) for p in plan)


def start_forks(root: Path, system: str, plan):
    """The pipeline's fork server, started before the check of what every step needs, so that its imports overlap
    that check; its log is ``results/.forkserver-<pid>.log`` until the run's folder exists. None: no Python step,
    HANDS_ON_FORKSERVER=0, or no writable results folder (the run then starts one itself, or says why not)."""
    from common.run.forkserver import ForkServer
    if not wants_forks(plan):
        return None
    folder = root / system / "results"
    made = None if folder.is_dir() else folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        log = folder / f".forkserver-{os.getpid()}.log"
        log.touch()
    except OSError:
        return None
    forks = ForkServer(env=child_env(), log=log).start()
    forks.made_folder = made                # a run that stops before its first step leaves no folder behind
    return forks


def drop_forks(forks) -> None:
    """Stop a fork server of :func:`start_forks` and remove its log if no run took it (idempotent)."""
    if forks is None:
        return
    forks.close()
    if forks.log and Path(forks.log).name.startswith(".forkserver-"):
        Path(forks.log).unlink(missing_ok=True)
        made = getattr(forks, "made_folder", None)
        if made is not None:
            try:
                made.rmdir()                    # only when empty: nothing else was written there
            except OSError:
                pass


def run_child(argv, log: Path, cwd: Path, env: dict, name: str, forks=None) -> tuple[int | None, bool]:
    """Run ``argv`` in its own process group, its output into ``log`` and onto the console; a Python step through
    the fork server ``forks`` when there is one (common.run.forkserver: the same process group, environment and
    exit code, without paying the imports again). Returns (exit code, interrupted); Ctrl-C/SIGTERM stops the
    child's whole process tree."""
    from common.capture.procs import Group, ProcError
    from common.run.forkserver import ForkGroup, step_script
    echo = lambda m: print(m, flush=True)  # noqa: E731
    use = forks is not None and step_script(argv)
    if use and forks.ready_now() is None:       # still importing: waiting would cost the step the rest of them
        print(f"{name}: runs as a fresh process (the fork server is still importing)", flush=True)
        use = False
    if use:                                     # a server that is not usable: ForkGroup runs it fresh (forks.why)
        g = ForkGroup(forks, argv, log, env=env, cwd=cwd, name=name, echo=echo)
    else:
        g = Group(argv, log, env=env, cwd=cwd, name=name, echo=echo)
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


def preflight(root: Path, system: str) -> str | None:
    """What every step of the system needs (its _steps.py NEEDS: torch with CUDA, a GPU, the system's package),
    checked once in a child (``python -m common pipeline needs``, common.run.steps.needs_main) before any step:
    None when it is there (or nothing is declared), else the one line to print -- the check's own [setup] line,
    the one each step would have printed. A check that fails otherwise is a note; the steps then check themselves."""
    if not load_needs(root, system):
        return None
    argv = [sys.executable, "-m", "common", "pipeline", "needs", "--root", str(root), "--system", system]
    try:
        r = subprocess.run(argv, cwd=root, env=child_env(), capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        print(f"note: the check of what every step needs did not run ({e.__class__.__name__}: {e})", flush=True)
        return None
    said = [ln for ln in r.stderr.splitlines() if ln.startswith("[")]
    if r.returncode == 2 and said and said[-1].startswith("[setup] "):
        return f"{said[-1]} -- every step of this pipeline needs it: no step was run"
    if r.returncode != 0:
        print(f"note: the check of what every step needs ended with exit {r.returncode} "
              f"({said[-1] if said else 'no line'}); each step checks for itself", flush=True)
    return None


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
    return Path(cmd).name if cmd else "python -m common pipeline"


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
    if argv[:1] == ["needs"]:
        return needs_main(argv[1:])
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
    sinks = {n: Sink() for n in servers}
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
    shared = {s.name: tuple(n for n in s.servers if a.mode in servers[n].modes) for s, _ in chosen}
    plan = plan_services([step_command(root, a.system, s, args, shared[s.name]) for s, args in chosen], handles)
    mods = [] if a.no_warmup else warmup_modules(chosen, a.mode)
    if mods:
        plan.insert(0, warmup_command(a.system, mods))
    prev, prev_dir = previous_table(root, a.system)
    attach_eta(plan, prev)
    forks, said = None, None
    try:                                   # whatever ends the run (Ctrl-C in the check too), its fork server goes
        if not a.dry_run and any(p.kind == "measure" for p in plan):
            from common.base.checks import bytecode_home
            said = bytecode_home()         # before any child, so that all inherit it; said below, once the check passed
            forks = start_forks(root, a.system, plan)      # its imports overlap the check (a fresh python, 5-7 s)
            missing = preflight(root, a.system)
            if missing:                        # what every step needs is missing: said once, no step runs
                print(missing, file=sys.stderr)
                return 2
        flags = " ".join(f"--{f}" for f, on in (("ncu", a.ncu), ("nsys", a.nsys)) if on)
        title = f"{a.system} pipeline --{a.mode}{' ' + flags if flags else ''}{' --only ' + ','.join(only) if only else ''}"
        width = max(len(p.name) for p in plan) if plan else 10
        print(f"{title}: {len(plan)} step{'s' if len(plan) != 1 else ''}, {eta_text(plan)}", flush=True)
        for note in left_out:
            print(f"note: {note}", flush=True)
        if said:
            print(said, flush=True)
        for p in plan:
            if p.kind == "server" and servers[p.services[0]].why:
                print(f"note: {p.name}: {servers[p.services[0]].why}", flush=True)
        held = [p.services[0] for p in plan if p.kind == "server" and servers[p.services[0]].held]
        if held:
            print(f"note: {', '.join(map(server_row, held))}: launched when the run begins, each held after its imports "
                  f"(no GPU work) until its row, so that its start overlaps the steps before it", flush=True)
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
        return execute(a, root, plan, width, only, prev, prev_dir, left_out, title, steps, handles, sinks, held,
                       forks)
    finally:
        drop_forks(forks)                  # idempotent: a run that opened its results folder moved the log there


def execute(a, root, plan, width, only, prev, prev_dir, notes, title, steps, handles=None, sinks=None, held=(),
            forks=None) -> int:
    """Run the plan inside a results.Run; write steps.csv and summary.json; refresh reports when ok."""
    from common.base.checks import SetupError
    from common.run.results import Run
    for sig in (signal.SIGTERM, signal.SIGHUP):       # stop like Ctrl-C: the running step's group goes too
        signal.signal(sig, _raise_interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    command = os.environ.get("PIPELINE_COMMAND") or shlex.join(["python", "-m", "common", "pipeline", *sys.argv[1:]])
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
    services = Services(handles or {}, sinks or {}, plan, run, width, held)
    env, rows, t0, between = child_env(), [], time.time(), False
    from common.run.forkserver import ForkServer
    told = False
    if forks is not None:                   # started before the check of what every step needs: its log moves in
        forks.move_log(run.path("logs/forkserver.log"))
    try:
        reap_left(echo=lambda m: print(m, flush=True))    # servers a killed run of any script left behind
        services.reap()                     # what a killed run of this pipeline left behind
        services.launch()                   # the held services: their imports overlap the steps before their rows
        if forks is None and wants_forks(plan):
            forks = ForkServer(env=env, log=run.path("logs/forkserver.log")).start()
        waited = wait_turn(os.environ.get(START_AFTER_ENV), services.held)
        if waited is not None:              # started early by `python -m common pipelines`: its own time from here
            t0 = time.time()
            run.restart_clock()
            what = "its held servers and fork server" if services.held else "its fork server"
            notes = [*notes, f"began {fmt_s(waited)} after its launch, when the pipelines before it had ended; {what} "
                             f"imported meanwhile (no GPU work before its first row)"]
        for i, p in enumerate(plan, 1):
            tag = f"{_tag(i, len(plan))} {p.name:<{width}}"
            row = {"step": p.name, "status": "", "seconds": 0.0, "kind": p.kind, "command": p.shown,
                   "started_utc": utc_now(), "rc": ""}
            rows.append(row)
            if p.script is not None and not p.script.exists():
                row["status"] = "missing"
                print(f"{tag}  missing: {_shown([str(p.script)], root)} does not exist", flush=True)
                continue
            step_env = env
            for n in p.services if p.kind == "measure" else ():   # the shared services it uses: usable, or restarted
                rows[-1:-1] = services.ready(n, p.name)
                step_env = {**step_env, **services.env(n)}
                row["started_utc"] = utc_now()
            print(f"{tag}  started  (elapsed {fmt_s(time.time() - t0)}, {eta_text(plan[i - 1:])})", flush=True)
            if p.kind == "server":
                services.start(p.services[0], row, tag)
                continue
            argv = p.argv + (["--csv", str(run.path("warmup.csv"))] if p.kind == "warmup" else [])
            log, ts = run.path(f"logs/{p.name}.log"), time.time()
            rc, interrupted = run_child(argv, log, root, step_env, p.name, forks)
            if forks is not None and forks.why and not told:
                told = True
                print(f"fork server: not used ({forks.why}); the steps run as fresh processes", flush=True)
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
        if forks is not None:
            forks.close()
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


START_AFTER_ENV = "HANDS_ON_START_AFTER"     # a file: the run launches its held services, then waits for it


def wait_turn(path: str | None, held=()) -> float | None:
    """With HANDS_ON_START_AFTER set (``python -m common pipelines`` starts a later pipeline early, while the ones
    before it run): say so once, wait until that file exists, return the seconds waited. None: not set."""
    if not path:
        return None
    t0, parent = time.time(), os.getppid()
    what = f"its held servers ({', '.join(map(server_row, held))}) import" if held else "its fork server imports"
    print(f"waiting for the pipelines before this one to end; {what} meanwhile, nothing touches the GPU", flush=True)
    while not os.path.exists(path):
        if os.getppid() != parent:          # the run that started it is gone: stop as if interrupted
            raise KeyboardInterrupt("the run that started this pipeline is gone")
        time.sleep(0.2)
    return time.time() - t0


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
    """common.render.report for this system (in-process); a failure is one line and exit code 1."""
    try:
        from common.render.report import refresh
        o = refresh(systems=(system,), root=root, hints=measure_hints(root, (system,)))
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
    """``python -m common pipeline nsys --out DIR -- CMD...``: CMD under nsys (common.capture.nsys), the report in
    DIR/<name>.nsys-rep and the kernel summary printed; where nsys is not usable a [skip] line (exit 0)."""
    from common.base.checks import SetupError
    if "--out" not in argv or "--" not in argv:
        print("usage: python -m common pipeline nsys --out DIR -- COMMAND...", file=sys.stderr)
        return 2
    out, cmd = Path(argv[argv.index("--out") + 1]), argv[argv.index("--") + 1:]
    from common.capture import nsys
    if nsys.find() is None:
        print("[skip] Nsight Systems is not usable here (common.capture.nsys.find() found none); the torch-profiler "
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
