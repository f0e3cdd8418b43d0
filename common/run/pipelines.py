"""`make quick` / `make all`: every system's pipeline, one after another, each as its 06_full_pipeline.sh.

    python -m common pipelines --quick flashinfer mini-sglang sglang      # what `make quick` runs, then reports

Every later pipeline is started when this begins, with HANDS_ON_START_AFTER naming a file: it launches its held
services (SGLang's three servers in --quick), which import (most of a server start) and wait at their gate before
they touch the GPU, and its fork server (torch and the rest its steps import: 9-13 s that its first step waited
for when it started at its turn, warm H200 run of 2026-11-28); then it waits for that file, which appears when the
pipelines before it have ended. Its output is kept until then and shown in order; its own clock starts at its turn.
Nothing of it touches the GPU before its turn, so the earlier pipelines' measurements see only its imports (CPU).
HANDS_ON_EARLY=0 runs every pipeline only at its turn.

Exit code: 0 every pipeline ended ok (the caller then refreshes the reports); 1 one did not; 130 one was
interrupted (Ctrl-C or SIGTERM: the pipelines still running are stopped, their held servers with them), no later
pipeline runs.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from common.run.pipeline import _raise_interrupt, START_AFTER_ENV


def starts_early(root: Path, system: str, mode: str) -> bool:
    """Whether ``system``'s pipeline in ``mode`` has something to prepare before its turn: a held service, or steps
    for its fork server (common.run.forkserver; HANDS_ON_FORKSERVER=0 turns that off)."""
    from common.run.forkserver import ForkServer
    from common.run.steps import load_system
    try:
        steps, _notes, servers = load_system(root, system)
    except Exception:  # noqa: BLE001 - its own run says what is wrong with it
        return False
    return any(s.held and mode in s.modes for s in servers.values()) or (ForkServer.enabled() and bool(steps))


class Early:
    """A pipeline started before its turn: its output kept until :meth:`go`, then shown as it comes."""

    def __init__(self, cmd, env: dict, cwd: Path, start_file: Path):
        self.start_file = start_file
        self.proc = subprocess.Popen(cmd, cwd=cwd, env={**env, START_AFTER_ENV: str(start_file), "PYTHONUNBUFFERED": "1"},
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        self.kept: list[str] = []
        self.live = threading.Event()
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self.lock:
                if self.live.is_set():
                    sys.stdout.write(line)
                    sys.stdout.flush()
                else:
                    self.kept.append(line)

    def go(self) -> int:
        """Its turn: show what it said so far, let it begin, wait for it."""
        with self.lock:
            sys.stdout.write("".join(self.kept))
            sys.stdout.flush()
            self.kept.clear()
            self.live.set()
        self.start_file.write_text("go\n")
        rc = self.proc.wait()
        self.reader.join(10)
        return rc

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(120)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m common pipelines", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--quick", action="store_const", dest="mode", const="quick", help="each pipeline's --quick run")
    g.add_argument("--all", action="store_const", dest="mode", const="all", help="each pipeline's full run (hours)")
    p.add_argument("systems", nargs="+", help="in the order they run")
    p.add_argument("--root", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    from common import REPO_ROOT
    root = Path(a.root or REPO_ROOT).resolve()
    bad = [s for s in a.systems if not (root / s / "scripts" / "06_full_pipeline.sh").is_file()]
    if bad:
        print(f"python -m common pipelines: no {bad[0]}/scripts/06_full_pipeline.sh under {root}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    cmd = {s: ["bash", str(root / s / "scripts" / "06_full_pipeline.sh"), f"--{a.mode}"] for s in a.systems}
    tmp = Path(tempfile.mkdtemp(prefix="hands-on-pipelines-"))
    early: dict[str, Early] = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_interrupt)
    failed, rc = [], 0
    try:
        if env.get("HANDS_ON_EARLY", "1") != "0":
            for s in a.systems[1:]:
                if starts_early(root, s, a.mode):
                    early[s] = Early(cmd[s], env, root, tmp / f"start-{s}")
        for s in a.systems:
            rc = early.pop(s).go() if s in early else subprocess.run(cmd[s], cwd=root, env=env).returncode
            if rc == 130:
                print(f"make: {s} pipeline interrupted; reports not refreshed", flush=True)
                return 130
            if rc != 0:
                failed.append(s)
    except KeyboardInterrupt:
        print("make: interrupted; reports not refreshed", flush=True)
        return 130
    finally:
        for e in early.values():            # not reached (an interrupted run): stopped with their held servers
            e.stop()
        for f in tmp.glob("*"):
            f.unlink(missing_ok=True)
        tmp.rmdir()
    if failed:
        print(f"make: a pipeline did not end ok ({', '.join(failed)}); reports not refreshed", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
