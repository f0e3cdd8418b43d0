"""A fork server for the pipeline's Python steps: torch, pandas and matplotlib imported once, each step forked.

A numbered script is a fresh ``python script.py`` when a user runs it. In a pipeline, twenty of them in a row
each paid the same imports before their first line: torch alone took 4.7-5.9 s on a fresh H200 (2026-11-28:
torch 4.7-5.9 s, pandas 0.3-0.7 s, matplotlib 0.5-1.0 s per process; flashinfer 1.6 s, but importing it
initialises CUDA, so it is not preloaded). The pipeline runner starts this server when the run begins (its imports
overlap the JIT warm-up); each ``python <system>/scripts/NN_*.py ...`` step is then a fork of it that behaves as
that command would:

* its own session and process group (as ``common.capture.procs.Group`` gives a child: Ctrl-C and the runner's
  stop reach the whole tree), stdin /dev/null, stdout and stderr appended to the step's log;
* the step's environment, working directory, ``sys.argv`` and ``sys.path[0]`` (its scripts folder), the script
  run as ``__main__`` (``runpy.run_path``), its exit code, atexit handlers and non-daemon threads as at a normal
  interpreter exit;
* CUDA starts in the step: the server refuses to start if a preload initialised CUDA (a forked CUDA context is
  unusable), and never touches the GPU itself.

Protocol (one JSON object per line): the runner writes ``{"argv": [script, *args], "env": {...}, "cwd": ...,
"log": ...}`` to the server's stdin; the server answers ``{"ready": ...}`` once after its imports, then
``{"pid": N}`` per request and ``{"exit": N, "status": S}`` when a step ends (S: os.waitstatus_to_exitcode).
End of stdin ends the server. ``HANDS_ON_FORKSERVER=0`` turns it off (every step a fresh process, as before);
``HANDS_ON_PRELOAD`` lists the modules to import (default below). A server that fails to start, or dies, is one
line in the pipeline's output, and its steps run as fresh processes.
"""
from __future__ import annotations

import json
import os
import queue
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from common.capture.procs import Group

PRELOAD = ("torch", "numpy", "pandas", "matplotlib", "matplotlib.pyplot")
# Optional preloads, tried after PRELOAD one by one: what the steps import next (mini-SGLang's steps pull in
# transformers and torch._dynamo through minisgl and flashinfer; each fresh step paid them again). One that
# initialises CUDA or starts a thread is dropped: the server starts over without it (and those after it) and its
# ready line names it. HANDS_ON_PRELOAD_EXTRA replaces the list ("" for none). Not flashinfer: its import initialises
# CUDA (tried on an H200, 2026-11-28: dropped, and the server had to start over).
PRELOAD_EXTRA = ("torch._dynamo", "transformers")
READY_TIMEOUT_S = 180.0


# ------------------------------------------------------------------ the server (its own process)

def _preload(names) -> tuple[list[str], list[str]]:
    os.environ.setdefault("MPLBACKEND", "Agg")
    done, missing = [], []
    for n in names:
        try:
            __import__(n)
            done.append(n)
        except Exception as e:  # noqa: BLE001 - a module that is not installed is simply not preloaded
            missing.append(f"{n} ({e.__class__.__name__})")
    return done, missing


def _cuda_started() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001
        return False


def _unsafe() -> str | None:
    """Why forking this process now would give steps an unusable GPU or a broken lock (None: safe)."""
    if _cuda_started():
        return "a preloaded module initialised CUDA: a fork could not use the GPU"
    if threading.active_count() > 1:
        return f"{threading.active_count()} threads after the imports: forking them is unsafe"
    return None


def _extra_names() -> list[str]:
    raw = os.environ.get("HANDS_ON_PRELOAD_EXTRA")
    return [n.strip() for n in (",".join(PRELOAD_EXTRA) if raw is None else raw).split(",") if n.strip()]


def _restart_without(stdout, keep: list[str], dropped: str) -> None:
    """exec this server again with only ``keep`` as the optional preloads (stdin and the protocol kept)."""
    os.environ["HANDS_ON_PRELOAD_EXTRA"] = ",".join(keep)
    os.environ["HANDS_ON_PRELOAD_DROPPED"] = "; ".join(
        x for x in (os.environ.get("HANDS_ON_PRELOAD_DROPPED"), dropped) if x)
    stdout.flush()
    os.dup2(stdout.fileno(), 1)                         # the protocol back on fd 1: main() takes it again
    os.execv(sys.executable, [sys.executable, "-m", "common.run.forkserver"])


def _send(out, obj) -> None:
    out.write(json.dumps(obj) + "\n")
    out.flush()


def _child(req: dict) -> int:
    """In the forked process: become the step, run it, return its exit code."""
    os.setsid()
    fd = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(null)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    script = os.path.abspath(req["argv"][0])
    sys.argv = [script, *req["argv"][1:]]
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.path.dirname(script)] + [p for p in extra if p not in sys.path] + \
        [p for p in sys.path[1:] if p]
    import runpy
    try:
        runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)       # die of SIGINT, as python does
        os.kill(os.getpid(), signal.SIGINT)
        return 130
    except BaseException:  # noqa: BLE001 - the traceback a fresh python would print
        import traceback
        traceback.print_exc()
        return 1


def serve(names=None, stdin=None, stdout=None) -> int:
    """The server's loop. Returns in the parent when stdin ends; in a forked step, returns the step's exit code."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    t0 = time.perf_counter()
    names = names if names is not None else [n for n in (os.environ.get("HANDS_ON_PRELOAD") or ",".join(PRELOAD))
                                             .split(",") if n.strip()]
    done, missing = _preload(names)
    why = _unsafe()
    if why:
        _send(stdout, {"ready": False, "why": why})
        return 3
    extra = _extra_names()
    for i, n in enumerate(extra):
        d, m = _preload([n])
        why = _unsafe()
        if why:                       # this import cannot be undone: start over without it and the ones after it
            _restart_without(stdout, extra[:i], f"{n} ({why})")
        done += d
        missing += m
    ready = {"ready": True, "preloaded": done, "missing": missing, "s": round(time.perf_counter() - t0, 2)}
    if os.environ.get("HANDS_ON_PRELOAD_DROPPED"):
        ready["dropped"] = os.environ["HANDS_ON_PRELOAD_DROPPED"]
    _send(stdout, ready)
    children: set[int] = set()
    fd = stdin.fileno()
    buf = b""
    while True:
        r, _, _ = select.select([fd], [], [], 0.05)
        for pid in list(children):                          # reap every step that ended
            try:
                got, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                children.discard(pid)
                continue
            if got:
                children.discard(pid)
                _send(stdout, {"exit": pid, "status": os.waitstatus_to_exitcode(status)})
        if not r:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:                                       # the runner closed our stdin (or died): done
            return 0
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if not line.strip():
                continue
            req = json.loads(line)
            stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                stdout.close()                              # the protocol pipe is the server's, not the step's
                return _child(req)                          # the step: never back in this loop
            children.add(pid)
            _send(stdout, {"pid": pid})


def main() -> int:
    # stdout carries the protocol; anything a preloaded module prints goes to stderr instead
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    code = serve(stdout=proto)
    return code


# ------------------------------------------------------------------ the runner's side

class Forked:
    """A step forked by the server, with the part of subprocess.Popen that procs.Group uses."""

    stdin = None

    def __init__(self, server: "ForkServer", pid: int):
        self.server, self.pid, self.returncode = server, pid, None

    def poll(self):
        if self.returncode is None:
            self.returncode = self.server.exit_of(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None):
        if self.returncode is None:
            self.returncode = self.server.exit_of(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"step pid {self.pid}", timeout)
        return self.returncode


class ForkServer:
    """The runner's handle: ``start()`` (returns at once), ``spawn(argv, env, cwd, log)`` -> Forked or None (None:
    not usable; the caller starts a fresh process and ``why`` says why, once), ``close()``."""

    def __init__(self, python: str = sys.executable, env: dict | None = None, log: Path | None = None):
        self.python, self.env, self.log = python, env, log
        self.proc: subprocess.Popen | None = None
        self.why: str | None = None
        self.ready: dict | None = None
        self._lines: queue.Queue = queue.Queue()
        self._exits: dict[int, int] = {}
        self._cond = threading.Condition()
        self._pids: queue.Queue = queue.Queue()

    @staticmethod
    def enabled() -> bool:
        return os.environ.get("HANDS_ON_FORKSERVER", "1") not in ("0", "no", "off", "false")

    def start(self) -> "ForkServer":
        err = open(self.log, "ab") if self.log else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen([self.python, "-m", "common.run.forkserver"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, env=self.env)
        except OSError as e:
            self.why = f"cannot start it: {e}"
            return self
        finally:
            if err is not subprocess.DEVNULL:
                err.close()
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        for raw in self.proc.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if "exit" in msg:
                with self._cond:
                    self._exits[msg["exit"]] = msg["status"]
                    self._cond.notify_all()
            elif "pid" in msg:
                self._pids.put(msg["pid"])
            else:
                self._said(msg)
                self._lines.put(msg)
        with self._cond:                                  # the server is gone: no exit will come any more
            self._cond.notify_all()
        self._lines.put(None)
        self._pids.put(None)

    def _said(self, msg: dict) -> None:
        """Its ready line in its log, when it comes: how long its imports took and what a step no longer imports."""
        if not self.log or msg.get("ready") is not True:
            return
        try:
            with open(self.log, "a") as f:
                f.write(f"fork server ready after {msg.get('s')} s: preloaded {', '.join(msg.get('preloaded') or [])}"
                        + (f"; missing {', '.join(msg['missing'])}" if msg.get("missing") else "")
                        + (f"; dropped {msg['dropped']}" if msg.get("dropped") else "") + "\n")
        except OSError:
            pass

    def _wait_ready(self, timeout: float = READY_TIMEOUT_S) -> bool | None:
        """True: ready; False: not usable (``why``); None: still importing after ``timeout`` (0: do not wait)."""
        if self.ready is not None:
            return self.ready.get("ready") is True
        if self.proc is None:
            return False
        try:
            msg = self._lines.get(timeout=timeout) if timeout > 0 else self._lines.get_nowait()
        except queue.Empty:
            if timeout < READY_TIMEOUT_S:
                return None
            msg = {"ready": False, "why": f"not ready after {READY_TIMEOUT_S:.0f} s"}
        if msg is None:
            msg = {"ready": False, "why": f"it exited (code {self.proc.poll()}) before it was ready"}
        self.ready = msg
        if msg.get("ready") is not True:
            self.why = msg.get("why", "not ready")
        return msg.get("ready") is True

    def ready_now(self) -> bool | None:
        """Without waiting: True ready, False not usable, None still importing (a step then runs as a fresh
        process: waiting would cost it the rest of the server's imports, 9-13 s for a warm run's first step)."""
        return self._wait_ready(0)

    def spawn(self, argv, env: dict, cwd, log) -> Forked | None:
        if self.why or not self._wait_ready() or self.proc.poll() is not None:
            self.why = self.why or "it is no longer running"
            return None
        req = {"argv": [str(a) for a in argv], "env": dict(env), "cwd": str(cwd), "log": str(log)}
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as e:
            self.why = f"it stopped taking steps ({e.__class__.__name__})"
            return None
        try:
            pid = self._pids.get(timeout=30)
        except queue.Empty:
            pid = None
        if pid is None:
            self.why = "it did not fork the step"
            return None
        return Forked(self, pid)

    def exit_of(self, pid: int, timeout: float | None):
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while pid not in self._exits:
                if self.proc.poll() is not None and pid not in self._exits:
                    # the server died: its steps were orphaned; one that is gone ended unknown (-9 like a kill)
                    if not _alive(pid):
                        return -signal.SIGKILL
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(0.2 if left is None else min(left, 0.2))
            return self._exits[pid]

    def move_log(self, path: Path) -> None:
        """Its log to ``path`` (same file system: the server keeps writing to the file it has open); kept where it
        was when that cannot be done."""
        if not self.log or Path(self.log) == Path(path):
            return
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.log, path)
            self.log = Path(path)
        except OSError:
            pass

    def close(self) -> None:
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None


class ForkGroup(Group):
    """procs.Group whose child is forked by ``server`` (a fresh process when the server is not usable)."""

    def __init__(self, server: ForkServer, cmd, log_path, **kw):
        super().__init__(cmd, log_path, **kw)
        self.server = server

    def start(self) -> "ForkGroup":
        if self.server.why:
            return super().start()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self._log.write(f"$ {shlex.join(self.cmd)}\n".encode())
        self._log.flush()
        self._install_handlers()
        proc = self.server.spawn(self.cmd[1:], env=self.env if self.env is not None else dict(os.environ),
                                 cwd=self.cwd or os.getcwd(), log=self.log_path)
        if proc is None:                         # not usable: a fresh process, as without the server
            self._close()
            return super().start()
        self.proc = proc
        return self


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def step_script(argv) -> bool:
    """A step the server can run: ``python path/to/script.py ...`` (with this interpreter)."""
    return len(argv) >= 2 and argv[0] == sys.executable and str(argv[1]).endswith(".py") and \
        not str(argv[1]).startswith("-")


if __name__ == "__main__":
    sys.exit(main())
