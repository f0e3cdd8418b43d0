"""A gate for a server started early: an SGLang general plugin (entry-point group ``sglang.srt.plugins``) that
holds the server's scheduler process after its imports and before it touches the GPU, until a file appears.

Why: a server's start is mostly Python imports (60 of the 74 s of 08's 2-layer server under ncu on an H100,
2026-11-27); started at the beginning of a run and held here, those imports overlap the run's own measurements,
and the GPU work of its start (weights, KV pool, CUDA graphs) begins only when :meth:`Gate.release` says so.

SGLang calls ``load_plugins()`` in the launcher process (Engine) and at the top of ``run_scheduler_process``
(after ``sglang.srt.managers.scheduler`` and its imports are loaded, before the scheduler is configured). The
hold applies in a child process only (the scheduler; the launcher must go on to spawn it). Without HANDS_ON_GATE
in the environment the plugin does nothing.

The gate fails closed: the scheduler goes on only when the release file appears. When the run that holds the
gate (its pid and start time in HANDS_ON_GATE_HOLDER) is gone -- killed, even with SIGKILL -- or the release does
not come within HANDS_ON_GATE_TIMEOUT seconds, the scheduler exits (code CLOSED_EXIT) before it touches the GPU;
SGLang's launcher, waiting for its scheduler's "ready", then exits too ("scheduler is dead"). A held server never
starts on its own. Stamped lines go to the server log: ``hands-on gate: holding ...``, then ``hands-on gate:
released after N s`` (a phase of _sgl_logs.START_PHASES) or ``hands-on gate: closed: <why> ...``. The gate also
writes what happened into its folder (``passed-<pid>.json`` when it let a scheduler through, ``closed.txt`` when it
closed), and the run checks it: :meth:`Gate.verify` after the server is ready (a start that was not held -- the
plugin not loaded -- is a GateError, so its counters are not trusted), :meth:`Gate.release` refuses a server that
is gone (naming why its gate closed).

    gate = Gate(run.dir / "gate")                 # writes the plugin and its entry point into that folder
    srv = sg.Server(..., env=gate.env())          # PYTHONPATH, HANDS_ON_GATE, HANDS_ON_GATE_HOLDER (this process)
    srv.launch()                                  # returns at once; imports run
    ...                                           # the GPU is someone else's meanwhile
    gate.release(srv); srv.wait_ready(); gate.verify(srv)
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path

ENV = "HANDS_ON_GATE"
HOLDER_ENV = "HANDS_ON_GATE_HOLDER"       # "<pid>:<start time>" of the run holding the gate; its death closes it
TIMEOUT_ENV = "HANDS_ON_GATE_TIMEOUT"     # seconds the scheduler waits at most (default 3600), then exits
DIST = "hands_on_gate-0.dist-info"
ENTRY = "[sglang.srt.plugins]\nhands_on_gate = _sgl_gate:hold\n"
CLOSED = "closed.txt"                     # in the gate's folder: why it closed
PASSED = "passed-{pid}.json"              # in the gate's folder: a scheduler it let through, after the release
CLOSED_EXIT = 3                           # the exit code of a scheduler whose gate closed
POLL_S = 0.05


class GateError(RuntimeError):
    """The held server cannot be trusted: it is gone (its gate closed) or it started without being held."""


def _say(text: str) -> None:
    now = datetime.now()
    print(f"[{now:%Y-%m-%d %H:%M:%S}.{now.microsecond // 1000:03d}] hands-on gate: {text}", file=sys.stderr, flush=True)


def _start_time(pid: int) -> str | None:
    """A process's start time (clock ticks since boot, /proc/<pid>/stat field 22): with the pid, it names that
    process and no later one that reuses its pid. None where /proc is absent or the process is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[19] if len(fields) > 19 and fields[0] != "Z" else None


def holder_alive(holder: str) -> bool:
    """Whether the process ``holder`` ("<pid>:<start time>", or "<pid>:") still runs."""
    pid_s, _, start = holder.partition(":")
    if not pid_s.isdigit():
        return True                     # not a holder this gate can watch: the timeout still closes it
    pid = int(pid_s)
    # this file is copied alone into the gate's folder and imported inside SGLang's scheduler process, where
    # common/ is not on the path: the liveness test below is common.capture.store's, kept here on purpose
    if os.path.isdir("/proc"):
        now = _start_time(pid)
        return now is not None and (not start or now == start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def hold() -> None:
    """The plugin: in a child process with HANDS_ON_GATE set, wait until that file exists; exit when the gate
    closes (its holder gone, or no release within the timeout)."""
    path = os.environ.get(ENV)
    if not path:
        return
    import multiprocessing
    if multiprocessing.parent_process() is None:
        return                          # the launcher: it spawns the scheduler, never held
    limit = float(os.environ.get(TIMEOUT_ENV) or 3600)
    holder = os.environ.get(HOLDER_ENV) or ""
    folder = Path(path).parent
    t0 = time.time()
    _say(f"holding the scheduler (pid {os.getpid()}) before it touches the GPU, until {path} exists"
         + (f" (holder pid {holder.partition(':')[0]})" if holder else ""))
    while not os.path.exists(path):
        why = (f"its holder (pid {holder.partition(':')[0]}) is gone" if holder and not holder_alive(holder) else
               f"not released within {limit:.0f} s ({TIMEOUT_ENV})" if time.time() - t0 >= limit else None)
        if why and not os.path.exists(path):       # a release at the last moment still wins
            text = f"{why}, so the scheduler exits after {time.time() - t0:.1f} s, before it touches the GPU"
            _say(f"closed: {text}")
            try:
                (folder / CLOSED).write_text(text + "\n")
            except OSError:
                pass
            os._exit(CLOSED_EXIT)
        time.sleep(POLL_S)
    held = time.time() - t0
    _say(f"released after {held:.1f} s")
    try:
        (folder / PASSED.format(pid=os.getpid())).write_text(json.dumps(
            {"pid": os.getpid(), "held_s": round(held, 3), "since": t0, "passed": time.time()}))
    except OSError:
        pass


class Gate:
    """The folder that carries the plugin (this module and its entry point) and the release file. ``holder``: the
    pid of the run that holds the gate (default: this process); when it is gone the held scheduler exits."""

    def __init__(self, folder, holder: int | None = None):
        self.folder = Path(folder)
        self.file = self.folder / "released"
        self.holder = os.getpid() if holder is None else int(holder)
        self.released_at: float | None = None
        self.folder.mkdir(parents=True, exist_ok=True)
        for old in (self.file, self.folder / CLOSED, *self.folder.glob(PASSED.format(pid="*"))):
            old.unlink(missing_ok=True)
        shutil.copyfile(Path(__file__), self.folder / "_sgl_gate.py")
        dist = self.folder / DIST
        dist.mkdir(exist_ok=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hands-on-gate\nVersion: 0\n")
        (dist / "entry_points.txt").write_text(ENTRY)

    def env(self, base: dict | None = None) -> dict:
        """The server's environment additions: the plugin's folder first on PYTHONPATH, the release file, the
        holder (pid and start time)."""
        old = (base if base is not None else os.environ).get("PYTHONPATH", "")
        return {"PYTHONPATH": os.pathsep.join(p for p in (str(self.folder), old) if p), ENV: str(self.file),
                HOLDER_ENV: f"{self.holder}:{_start_time(self.holder) or ''}"}

    def closed(self) -> str | None:
        """Why the gate closed (its held scheduler exited), or None."""
        try:
            return (self.folder / CLOSED).read_text().strip() or None
        except OSError:
            return None

    def release(self, srv=None) -> None:
        """Let the held scheduler go on. ``srv``: the held server (a _sgl_server.Server); one that is gone already is
        a GateError that says why (its gate closed, or the last lines of its log), never a release."""
        if srv is not None and not srv.alive():
            why = self.closed()
            raise GateError(f"{srv.name} exited while held by its gate, "
                            + (f"which closed: {why}" if why else f"which stayed shut (last log lines: {srv.last_lines()})")
                            + f"; log {srv.log_path}")
        self.file.write_text(f"{time.time()}\n")
        self.released_at = time.time()

    def verify(self, srv=None) -> float:
        """After the server is ready: the seconds its scheduler was held, proven by the file the gate wrote when it
        let the scheduler through after the release. A GateError when there is none: the server started without
        being held (the plugin was not loaded), so it may have used the GPU while it should not have."""
        name = getattr(srv, "name", "the server")
        passed = []
        for p in sorted(self.folder.glob(PASSED.format(pid="*"))):
            try:
                passed.append(json.loads(p.read_text()))
            except (OSError, ValueError):
                pass
        if not passed:
            raise GateError(f"{name} started without being held by its gate (no {PASSED.format(pid='<pid>')} in "
                            f"{self.folder}: SGLang did not load the hands_on_gate plugin), so it may have used the GPU "
                            "before the release; its measurements are not trusted")
        early = [p for p in passed if self.released_at is None or p["passed"] < self.released_at - 1.0]
        if early:
            raise GateError(f"{name}: its scheduler (pid {early[0]['pid']}) went past the gate before the release; "
                            "its measurements are not trusted")
        return max(p["held_s"] for p in passed)
