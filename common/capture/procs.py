"""Child processes that never outlive the run: process groups, free ports, pidfiles, tool runs.

    port = free_port()                                   # the OS picks a free port (bind port 0)
    with Group(cmd, log_path, name="server") as g:       # own session + process group
        ...                                              # normal exit, error, Ctrl-C, SIGTERM, timeout:
    # the whole group (and any descendant that left it) is stopped: SIGTERM, then SIGKILL
    rc = run_tool(cmd, log_path, timeout=600)            # a CLI tool in its own group, killed on timeout
    s = timed_alone("import torch", "f()", 3)             # seconds of f() in 3 fresh processes, timed one at a time
    env = nccl_env()                                     # NVLink multicast off (the workbook's one policy)

Pidfiles: a Group started with ``pidfile=`` writes ``{pid, pgid, cmd, started, owner}`` there and removes
it on a clean stop. A run killed with SIGKILL leaves the file behind; :func:`reap_stale` stops the group
it names if its owner is gone and the group still runs the same command (so a server a killed run left
behind is found and stopped, never silently joined on another port). The servers of every script keep
their pidfiles in one registry (:func:`registry`, ``$HANDS_ON_CACHE/servers/<script>/``), and
:func:`reap_left` sweeps all of it: any script's next run, or a pipeline, stops what any killed run left.
Only processes a pidfile of the workbook recorded are ever signalled.

Every function here is stdlib only and works on a machine without a GPU; /proc is read where it
exists (Linux), elsewhere process-tree lookups return nothing and only the group is signalled.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

# NVLink multicast (NCCL NVLS, torch symmetric memory, NVSHMEM) stays off: the lent multi-GPU machines
# do not allow it. One policy for every system: a value the user set is kept only when it already
# says "off"; anything else is overridden (and the override is reported by the caller).
NCCL_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
FORBIDDEN_FLAGS = ("--enable-nccl-nvls", "--enable-symm-mem")
ALLOW_NVLS = "HANDS_ON_ALLOW_NVLS"


class ProcError(RuntimeError):
    """A child process failed to start, timed out or died."""


def nccl_env(environ=None) -> tuple[dict, list[str]]:
    """(the variables to set, notes on values that were overridden). ``HANDS_ON_ALLOW_NVLS=1`` keeps the
    user's own values (for machines that allow multicast)."""
    environ = os.environ if environ is None else environ
    if environ.get(ALLOW_NVLS) == "1":
        return {}, [f"{ALLOW_NVLS}=1: NVLink multicast settings left as they are"]
    notes = [f"{k}={environ[k]} overridden to {v} (NVLink multicast stays off)"
             for k, v in NCCL_OFF.items() if environ.get(k) not in (None, v)]
    return dict(NCCL_OFF), notes


def apply_nccl_env(log=print) -> dict:
    """Set :func:`nccl_env` in this process (before any NCCL init); returns what was set."""
    env, notes = nccl_env()
    for n in notes:
        log(f"note: {n}")
    os.environ.update(env)
    return env


def free_port(host: str = "127.0.0.1", lasting: bool = False) -> int:
    """A port nothing listens on, chosen by the OS (bind to port 0). Two runs at once get two ports.

    ``lasting``: for a port that is bound only minutes later (a held server's HTTP port): one outside the OS's
    ephemeral range (/proc/sys/net/ipv4/ip_local_port_range), which the OS never hands to a bind(0) or an outgoing
    connection meanwhile. A cold pipeline run on an H200 (2026-11-28) lost a held server to EADDRINUSE when its
    port, picked by bind(0) at launch, was handed to another process before the server bound it."""
    if lasting:
        import random
        lo, hi = ephemeral_range()
        ranges = [r for r in ((10000, lo - 1), (hi + 1, 65535)) if r[1] - r[0] >= 1000]
        rng = random.Random()
        for _ in range(200):
            a, b = rng.choice(ranges) if ranges else (10000, 65535)
            port = rng.randint(a, b)
            if port_free(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The OS's range of ports for bind(0) and outgoing connections (Linux's default 32768-60999 elsewhere)."""
    try:
        lo, hi = (int(x) for x in Path(path).read_text().split()[:2])
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def port_free(host: str, port: int) -> bool:
    """True when nothing listens on ``host:port`` (bind test with SO_REUSEADDR, as servers bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


# ------------------------------------------------------------------ the process tree (from /proc)

def _stat(pid) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return None


def _table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every live process ({} where /proc is absent)."""
    out = {}
    for d in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if d.isdigit():
            f = _stat(d)
            if f and len(f) > 2 and f[0] != "Z":
                out[int(d)] = (int(f[1]), int(f[2]))
    return out


def group_pids(pgid: int) -> list[int]:
    """Live processes of process group ``pgid``."""
    return sorted(p for p, (_pp, g) in _table().items() if g == pgid)


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``, whatever its group or session (a profiler may start the
    application in a session of its own, out of reach of killpg)."""
    par = {p: pp for p, (pp, _g) in _table().items()}
    out, todo = [], [pid]
    while todo:
        cur = todo.pop()
        kids = [c for c, p in par.items() if p == cur]
        out += kids
        todo += kids
    return out


def children(pid: int) -> list[int]:
    return [p for p, (pp, _g) in _table().items() if pp == pid]


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").rstrip("\0").split("\0")
    except OSError:
        return []


def alive(pid: int) -> bool:
    f = _stat(pid)
    if f is not None:
        return bool(f) and f[0] != "Z"
    try:
        os.kill(pid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _signal_pid(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_group(pgid: int, sig) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_gone(pids, timeout: float) -> bool:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return not any(alive(p) for p in pids)


def stop_tree(pgid: int, *, term_timeout: float = 20.0, members=None, first=(), on_kill=None) -> list[int]:
    """Stop process group ``pgid`` and every descendant: SIGTERM to ``first`` (e.g. the application
    inside a profiler), then to the group and the strays, SIGKILL after ``term_timeout`` (``on_kill()`` is
    called just before, to say so). Returns the pids still alive afterwards ([] when all are gone)."""
    members = set(members or ()) | set(group_pids(pgid)) | set(descendants(pgid)) | {pgid}
    for p in first:
        _signal_pid(p, signal.SIGTERM)
    _signal_group(pgid, signal.SIGTERM)
    for p in members:
        _signal_pid(p, signal.SIGTERM)
    if not wait_gone(members, term_timeout):
        if on_kill:
            on_kill()
        members |= set(group_pids(pgid)) | set(descendants(pgid))
        _signal_group(pgid, signal.SIGKILL)
        for p in members:
            _signal_pid(p, signal.SIGKILL)
        wait_gone(members, 10)
    return sorted(p for p in members if alive(p))


# ------------------------------------------------------------------ pidfiles

def write_pidfile(path, pid: int, cmd) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"pid": pid, "pgid": pid, "cmd": list(map(str, cmd)), "started": time.time(),
                               "owner": os.getpid()}))
    os.replace(tmp, path)


def reap_stale(path, echo=print) -> list[int]:
    """Stop the process group a pidfile names when its owner (the run that wrote it) is gone and the
    group still runs the recorded command; remove the file. Returns the pids that were stopped."""
    path = Path(path)
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        path.unlink(missing_ok=True)
        return []
    if rec.get("owner") and alive(int(rec["owner"])) and int(rec["owner"]) != os.getpid():
        return []   # its run is still going (another run at the same time): not stale
    pgid = int(rec.get("pgid", rec.get("pid", 0)) or 0)
    want = rec.get("cmd") or []
    left = [p for p in set(group_pids(pgid)) | ({pgid} if alive(pgid) else set())
            if not want or any(a in cmdline(p) for a in want[-3:])]
    if left:
        echo(f"found a process group left behind by a killed run ({path.name}: pid {pgid}, "
             f"`{shlex.join(want)[:120]}`); stopping it")
        stop_tree(pgid, members=left, term_timeout=15)
    path.unlink(missing_ok=True)
    return sorted(left)


def registry(script: str | None = None) -> Path:
    """The one record of the servers the workbook's runs started: ``<cache>/servers/`` (``script``: its
    folder there, one per script, created: a SetupError naming it when the cache cannot be written)."""
    from common.base.checks import cache_dir, cache_folder
    if script:
        return cache_folder("servers", re.sub(r"[^A-Za-z0-9_.-]", "_", script))
    return cache_dir() / "servers"


def _owner(path: Path):
    try:
        return json.loads(path.read_text()).get("owner")
    except (OSError, ValueError, AttributeError):
        return None


def reap_left(folder=None, echo=print) -> list[int]:
    """Stop every process group that a killed run left behind under ``folder`` (default: the whole
    :func:`registry`, whichever script started it): :func:`reap_stale` on each pidfile there, except this
    process's own (runs still going are left alone by reap_stale). Returns the pids stopped."""
    root = Path(folder) if folder else registry()
    stopped: list[int] = []
    for p in sorted(root.rglob("*.pid")) if root.is_dir() else ():
        if _owner(p) != os.getpid():
            stopped += reap_stale(p, echo)
    return stopped


# ------------------------------------------------------------------ a child process group

class Group:
    """A command in its own session and process group, stopped with its whole tree on exit.

    ``start()`` returns self; ``stop()`` is idempotent and returns a report dict (stop_s, returncode,
    left_over, killed: whether SIGTERM was not enough, said in one line when it happens). As a context manager it stops on normal exit, on an error, on Ctrl-C, and
    on SIGTERM/SIGHUP (turned into KeyboardInterrupt while the group runs in the main thread).
    """

    def __init__(self, cmd, log_path, *, env=None, name: str = "process", pidfile=None, echo=print,
                 stop_timeout: float = 20.0, cwd=None, stdin_pipe: bool = False):
        self.stdin_pipe = stdin_pipe   # True: the command reads requests from proc.stdin (a worker)
        self.cmd = [str(c) for c in cmd]
        self.log_path = Path(log_path)
        self.env = env
        self.name, self.echo, self.stop_timeout, self.cwd = name, echo, stop_timeout, cwd
        self.pidfile = Path(pidfile) if pidfile else None
        self.proc: subprocess.Popen | None = None
        self._log = None
        self._old: dict = {}
        self.stop_report: dict = {}

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> "Group":
        if self.pidfile:
            reap_stale(self.pidfile, self.echo)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self._log.write(f"$ {shlex.join(self.cmd)}\n".encode())
        self._log.flush()
        self._install_handlers()
        try:
            self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.PIPE if self.stdin_pipe else subprocess.DEVNULL,
                                         env=self.env, cwd=self.cwd,
                                         start_new_session=True)
        except OSError as e:
            self._close()
            raise ProcError(f"{self.name}: cannot start `{self.cmd[0]}`: {e}") from None
        if self.pidfile:
            write_pidfile(self.pidfile, self.proc.pid, self.cmd)
        return self

    def poll(self):
        return self.proc.poll() if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout: float | None = None, *, every: float = 60.0, heartbeat=None) -> int:
        """Wait for the command; ProcError on timeout (the group is then stopped). With ``heartbeat``, call
        ``heartbeat(seconds waited)`` every ``every`` s while the command runs: a long wait says it is alive."""
        t0 = time.monotonic()
        while True:
            left = None if timeout is None else timeout - (time.monotonic() - t0)
            step = left if heartbeat is None else (every if left is None else min(every, left))
            try:
                return self.proc.wait(None if step is None else max(step, 0.0))
            except subprocess.TimeoutExpired:
                if left is not None and time.monotonic() - t0 >= timeout:
                    self.stop()
                    raise ProcError(f"{self.name} did not finish within {timeout:.0f} s (stopped; log: "
                                    f"{self.log_path})") from None
                heartbeat(time.monotonic() - t0)

    def stop(self, first=()) -> dict:
        if self.proc is None:
            return self.stop_report
        proc, t0 = self.proc, time.time()
        self.proc = None
        if proc.stdin:
            try:
                proc.stdin.close()
            except OSError:
                pass
        killed = []

        def on_kill():
            killed.append(True)
            self.echo(f"{self.name}: still running {self.stop_timeout:.0f} s after SIGTERM; sending SIGKILL")
        try:
            left = stop_tree(proc.pid, term_timeout=self.stop_timeout, first=first, on_kill=on_kill)
        except KeyboardInterrupt:      # a second Ctrl-C while stopping: no more patience
            _signal_group(proc.pid, signal.SIGKILL)
            raise
        finally:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            self._close()
        self.stop_report = {"stop_s": round(time.time() - t0, 1), "returncode": proc.returncode,
                            "left_over": left, "killed": bool(killed)}
        if self.pidfile and not left:
            self.pidfile.unlink(missing_ok=True)
        if left:
            self.echo(f"{self.name}: WARNING processes still alive after SIGKILL: {left}")
        return self.stop_report

    def _close(self):
        if self._log:
            self._log.close()
            self._log = None
        self._restore_handlers()

    def _install_handlers(self):
        if threading.current_thread() is not threading.main_thread():
            return

        def on_term(signum, frame):
            raise KeyboardInterrupt(f"signal {signum}")
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                if signal.getsignal(sig) in (signal.SIG_DFL, None):
                    self._old[sig] = signal.signal(sig, on_term)
            except (ValueError, OSError):
                pass

    def _restore_handlers(self):
        for sig, h in self._old.items():
            try:
                signal.signal(sig, h)
            except (ValueError, OSError):
                pass
        self._old = {}

    def __enter__(self) -> "Group":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False


def run_tool(cmd, log_path, timeout: float | None = None, env: dict | None = None, echo=print,
             name: str | None = None, pidfile=None) -> int:
    """Run a command-line tool in its own process group with its output in ``log_path``; the whole
    group is stopped on timeout (ProcError), error or Ctrl-C. Returns the exit code."""
    echo(f"$ {shlex.join(map(str, cmd))[:300]}")
    full_env = {**os.environ, **(env or {})}
    with Group(cmd, log_path, env=full_env, name=name or Path(str(cmd[0])).name, pidfile=pidfile, echo=echo) as g:
        return g.wait(timeout)


def timed_alone(setup: str, timed: str, n: int, timeout: float = 300.0,
                python: str | None = None) -> list[float | None]:
    """Seconds that ``timed`` (Python source) takes in each of ``n`` fresh Python processes, after ``setup`` ran in
    the same process (imports: not timed). The ``n`` setups run side by side; each timed part runs only once every
    setup has ended, and the timed parts one at a time, so no timing shares the machine with another process's
    imports or timing. None for a process that failed, or did not finish within ``timeout`` seconds."""
    import sys
    code = (f"{setup}\nimport sys as _s, time as _t\nprint('READY', flush=True)\n_s.stdin.readline()\n"
            f"_t0 = _t.perf_counter()\n{timed}\nprint('TIMED', _t.perf_counter() - _t0, flush=True)\n")
    barrier, alone = threading.Barrier(n), threading.Lock()

    def one() -> float | None:
        p = subprocess.Popen([python or sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
        killer = threading.Timer(timeout, p.kill)
        killer.start()
        try:
            ready = False
            for line in p.stdout:                                    # ends when it died in its setup
                if line.startswith("READY"):
                    ready = True
                    break
            try:
                barrier.wait(timeout)
            except threading.BrokenBarrierError:
                pass
            if not ready:
                return None
            with alone:
                p.stdin.write("go\n")
                p.stdin.flush()
                out = p.stdout.read()
            m = re.search(r"^TIMED ([\d.e+-]+)$", out, re.M)
            return float(m.group(1)) if m and p.wait() == 0 else None
        except OSError:
            return None
        finally:
            killer.cancel()
            if p.poll() is None:
                p.kill()
            p.wait()

    threads, out = [], [None] * n

    def slot(i: int) -> None:
        out[i] = one()

    for i in range(n):
        threads.append(threading.Thread(target=slot, args=(i,), daemon=True))
        threads[-1].start()
    for t in threads:
        t.join()
    return out
