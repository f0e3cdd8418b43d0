"""A gate for a server started early: an SGLang general plugin (entry-point group ``sglang.srt.plugins``) that
holds the server's scheduler process after its imports and before it touches the GPU, until a file appears.

Why: a server's start is mostly Python imports (60 of the 74 s of 08's 2-layer server under ncu on an H100,
2026-11-27); started at the beginning of a run and held here, those imports overlap the run's own measurements,
and the GPU work of its start (weights, KV pool, CUDA graphs) begins only when :meth:`Gate.release` says so.

SGLang calls ``load_plugins()`` in the launcher process (Engine) and at the top of ``run_scheduler_process``
(after ``sglang.srt.managers.scheduler`` and its imports are loaded, before the scheduler is configured). The
hold applies in a child process only (the scheduler; the launcher must go on to spawn it). Two stamped lines go
to the server log, ``hands-on gate: holding ...`` and ``hands-on gate: released after N s`` (common startup
phases in _sgl_logs.START_PHASES). Without HANDS_ON_GATE in the environment the plugin does nothing.

    gate = Gate(run.dir / "gate")                 # writes the plugin and its entry point into that folder
    srv = sg.Server(..., env=gate.env())          # PYTHONPATH + HANDS_ON_GATE
    srv.launch()                                  # returns at once; imports run
    ...                                           # the GPU is someone else's meanwhile
    gate.release(); srv.wait_ready()
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path

ENV = "HANDS_ON_GATE"
TIMEOUT_ENV = "HANDS_ON_GATE_TIMEOUT"     # seconds the scheduler waits at most (default 3600), then goes on
DIST = "hands_on_gate-0.dist-info"
ENTRY = "[sglang.srt.plugins]\nhands_on_gate = _sgl_gate:hold\n"


def _say(text: str) -> None:
    now = datetime.now()
    print(f"[{now:%Y-%m-%d %H:%M:%S}.{now.microsecond // 1000:03d}] hands-on gate: {text}", file=sys.stderr, flush=True)


def hold() -> None:
    """The plugin: in a child process with HANDS_ON_GATE set, wait until that file exists."""
    path = os.environ.get(ENV)
    if not path:
        return
    import multiprocessing
    if multiprocessing.parent_process() is None:
        return                          # the launcher: it spawns the scheduler, never held
    limit = float(os.environ.get(TIMEOUT_ENV) or 3600)
    t0 = time.time()
    _say(f"holding the scheduler (pid {os.getpid()}) before it touches the GPU, until {path} exists")
    while not os.path.exists(path) and time.time() - t0 < limit:
        time.sleep(0.05)
    why = "released" if os.path.exists(path) else f"not released within {limit:.0f} s: going on"
    _say(f"{why} after {time.time() - t0:.1f} s")


class Gate:
    """The folder that carries the plugin (this module and its entry point) and the release file."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.file = self.folder / "released"
        self.released_at: float | None = None
        self.folder.mkdir(parents=True, exist_ok=True)
        self.file.unlink(missing_ok=True)
        shutil.copyfile(Path(__file__), self.folder / "_sgl_gate.py")
        dist = self.folder / DIST
        dist.mkdir(exist_ok=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hands-on-gate\nVersion: 0\n")
        (dist / "entry_points.txt").write_text(ENTRY)

    def env(self, base: dict | None = None) -> dict:
        """The server's environment additions: the plugin's folder first on PYTHONPATH, the release file."""
        old = (base if base is not None else os.environ).get("PYTHONPATH", "")
        return {"PYTHONPATH": os.pathsep.join(p for p in (str(self.folder), old) if p), ENV: str(self.file)}

    def release(self) -> None:
        self.file.write_text(f"{time.time()}\n")
        self.released_at = time.time()
