"""SGLang's server as a context manager: start, health, logs, HTTP calls, profiler windows, stop (the whole tree),
and the registry of servers a killed run left behind. Part of _sglang (import _sglang as sg; sg.Server)."""
from __future__ import annotations

import atexit
import functools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from common.base.checks import SetupError  # noqa: E402
from common.capture import procs  # noqa: E402
from _sgl_facts import OFFLINE_ENV, SERVER_ENV, ServerError, _LOCAL, _last_stop, local_env, parse_flags  # noqa: E402
from _sgl_logs import Metrics, breakdown_lines, parse_metrics, startup_breakdown  # noqa: E402
from _sgl_bench import BenchWorker, tool_env  # noqa: E402


# ================================================================== the server

def servers_dir(script: str | None = None) -> Path:
    """Where the servers of ``script`` (default: the running script's stem) keep their pidfiles: its folder
    in the workbook's one registry (procs.registry)."""
    return procs.registry(script or Path(sys.argv[0] or "python").stem or "python")


def reap_servers(folder=None, echo=print) -> list[int]:
    """Stop every server that a killed run left behind in ``folder`` (default: the whole registry, whichever
    script started it; procs.reap_left). Pidfiles of runs that are still going, this one included, are left
    alone. Returns the pids stopped."""
    return procs.reap_left(folder, echo)


class Server:
    """``python -m sglang.launch_server`` as a context manager (see the module docstring).

    ``args``: extra CLI flags (list, e.g. from :func:`flags`). ``wrapper``: a profiler command line the
    server command is appended to. ``launcher``: the command that starts the server (default
    ``[python, -m, sglang.launch_server]``; tests pass a stand-in). ``pidfile``: None for the default
    place (see :func:`servers_dir`), a path, or False for none.
    """

    def __init__(self, model_path, args=(), *, log_path, port: int | None = None, host: str = "127.0.0.1",
                 env: dict | None = None, wrapper=(), launcher=None, start_timeout: float = 900,
                 stop_timeout: float = 30, wrapper_stop_timeout: float = 600, echo=print, name: str = "server",
                 pidfile=None):
        args = [str(a) for a in args]
        bad = [a for a in args if a.split("=")[0] in procs.FORBIDDEN_FLAGS]
        if bad and os.environ.get(procs.ALLOW_NVLS) != "1":
            raise SetupError(f"{bad[0]} turns NVLink multicast on (sets NCCL_NVLS_ENABLE=1); the workbook "
                             f"keeps it off. Set {procs.ALLOW_NVLS}=1 if your machine allows it.")
        self.model_path, self.args, self.host = str(model_path), args, host
        self.port_fixed = port is not None
        self.port = port if port is not None else procs.free_port(host, lasting=True)   # bound once it serves
        self.log_path = Path(log_path)
        nccl, self.env_notes = procs.nccl_env()
        offline = OFFLINE_ENV if Path(self.model_path).is_dir() else {}
        self.env = {**os.environ, **SERVER_ENV, **local_env(), **offline, **nccl, **(env or {})}
        self.wrapper = [str(w) for w in wrapper]
        self.launcher = list(launcher) if launcher else [sys.executable, "-m", "sglang.launch_server"]
        self.start_timeout, self.stop_timeout, self.wrapper_stop_timeout = start_timeout, stop_timeout, wrapper_stop_timeout
        self.echo, self.name = echo, name
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "server"
        self.pidfile = (servers_dir() / f"{os.getpid()}-{safe}.pid" if pidfile is None
                        else Path(pidfile) if pidfile else None)
        self.group: procs.Group | None = None
        self._at_exit = None
        self.startup_s: float | None = None
        self.startup_phases: list[dict] = []         # startup_breakdown() of the last start
        self.stop_report: dict = {}
        self._bench: BenchWorker | None = None
        self.shared: dict | None = None              # attach(): the running server's record; never stopped here
        self._bench_log: Path | None = None

    @classmethod
    def attach(cls, info: dict, *, echo=print, name: str = "server", bench_log=None) -> "Server":
        """A handle on a server that someone else started and stops (the pipeline's shared server, ``info``
        as :meth:`SharedServer.info` gives it): the same client, log and profiler methods, reading the
        server's own log; :meth:`stop` stops only this handle's bench_serving worker, never the server."""
        srv = cls(info["model_path"], info["flags"], log_path=info["log"], port=int(info["port"]), host=info["host"],
                  echo=echo, name=name, pidfile=False)
        srv.shared, srv._bench_log = dict(info), Path(bench_log) if bench_log else None
        srv.startup_s = 0.0
        return srv

    def bench_worker(self, echo=None) -> "BenchWorker":
        """The bench_serving worker of this server (started on first use, stopped with the server)."""
        if self._bench is None:
            self._bench = BenchWorker(tool_env(self.model_path), self._bench_log or self.log_path.with_name(
                "bench_worker.log"), echo=echo or self.echo)
        return self._bench

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def cmd(self) -> list[str]:
        return [*self.wrapper, *self.launcher, "--model-path", self.model_path, "--host", self.host,
                "--port", str(self.port), *self.args]

    @property
    def proc(self):
        """The Popen of the started command (None before start and after stop)."""
        return self.group.proc if self.group else None

    def start(self) -> "Server":
        """Launch and wait until healthy."""
        return self.launch().wait_ready()

    def launch(self) -> "Server":
        """Start the command and return at once (:meth:`wait_ready` waits for /health)."""
        reap_servers(echo=self.echo)          # servers a SIGKILLed run of any script left behind
        if self.pidfile:
            reap_servers(self.pidfile.parent, self.echo)       # and beside a pidfile given outside the registry
        if not procs.port_free(self.host, self.port):
            hint = "choose another with --port" if self.port_fixed else "the OS gave it a moment ago"
            raise SetupError(f"port {self.port} on {self.host} is already in use (another server running? "
                             f"`ss -ltnp | grep {self.port}`); {hint}")
        for n in self.env_notes:
            self.echo(f"{self.name}: note: {n}")
        self.group = procs.Group(self.cmd, self.log_path, env=self.env, name=self.name, pidfile=self.pidfile,
                                 echo=self.echo, stop_timeout=self.stop_timeout)
        self._at_exit = functools.partial(_last_stop, self)
        atexit.register(self._at_exit)
        self.echo(f"{self.name}: starting on port {self.port}: {shlex.join(self.cmd)[:400]}")
        self._mark, self._t0 = self.log_mark(), time.time()
        try:
            self.group.start()
        except procs.ProcError as e:
            raise ServerError(str(e)) from None
        return self

    def wait_ready(self) -> "Server":
        """Wait for /health after :meth:`launch` (start() is both); logs where the start went."""
        mark, t0 = self._mark, self._t0
        self._wait_ready(t0)
        t1 = time.time()
        self.startup_s = t1 - t0
        self.echo(f"{self.name}: ready after {self.startup_s:.0f} s (log: {self.log_path})")
        self.startup_phases = startup_breakdown(self.log_since(mark), t0, t1)
        if self.startup_phases:
            self.echo(f"{self.name}: where the {self.startup_s:.1f} s of its start went (its log's time stamps):\n"
                      + "\n".join(breakdown_lines(self.startup_phases, self.startup_s)))
        return self

    def _wait_ready(self, t0: float) -> None:
        last_note = t0
        while True:
            rc = self.group.poll()
            if rc is not None:
                raise ServerError(f"{self.name} exited with code {rc} during start-up after {time.time() - t0:.0f} s. "
                                  f"Last log lines ({self.log_path}): {self.last_lines()}")
            try:
                with _LOCAL.open(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            now = time.time()
            if now - t0 > self.start_timeout:
                raise ServerError(f"{self.name} not healthy after {self.start_timeout:.0f} s (start_timeout). "
                                  f"Last log lines ({self.log_path}): {self.last_lines()}")
            if now - last_note > 30:
                last_note = now
                self.echo(f"{self.name}: still starting ({now - t0:.0f} s): {self.log_tail(1)[:160]}")
            time.sleep(0.5)

    def stop(self) -> dict:
        """Stop the whole process tree (idempotent); returns what happened. With a wrapper, the
        application inside is signalled first and the wrapper gets time to write its report."""
        if self._bench is not None:
            self._bench.stop()
        g = self.group
        if g is None or g.proc is None:
            return self.stop_report
        pgid = g.pid
        members = set(procs.group_pids(pgid)) | set(procs.descendants(pgid)) | {pgid}
        try:
            if not self.wrapper and g.alive():
                # SGLang's launcher first, with SIGKILL: it holds no GPU memory, and its scheduler and detokenizer
                # die with it (SGLang sets PR_SET_PDEATHSIG on them). A SIGTERM to the whole group (as below) makes
                # the launcher see its detokenizer exit with -15, call it a crash and sleep 5 s "to let GPU activity
                # settle" before it kills its tree: each stop of a --quick pipeline's server took 5.3-5.8 s that
                # way (H200, 2026-11-28), in the pipeline's path. What is left is stopped as before.
                try:
                    os.kill(pgid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            elif self.wrapper and g.alive():
                apps = self._app_pids(members) or procs.children(pgid)
                self._log_tree(members, apps)
                for p in apps:
                    try:
                        os.kill(p, signal.SIGTERM)
                    except (ProcessLookupError, PermissionError):
                        pass
                try:
                    g.proc.wait(self.wrapper_stop_timeout)
                except subprocess.TimeoutExpired:
                    self.echo(f"{self.name}: wrapper still running after {self.wrapper_stop_timeout:.0f} s; stopping it")
        finally:
            rep = g.stop()
            strays = [p for p in members if procs.alive(p)]    # left the tree when their parent (the app) exited
            if strays:
                rep["left_over"] = procs.stop_tree(pgid, members=strays, term_timeout=self.stop_timeout,
                                                   on_kill=lambda: rep.update(killed=True))
            try:
                atexit.unregister(self._at_exit)
            except Exception:  # noqa: BLE001 - interpreter shutting down
                pass
        self.stop_report = {**rep, "processes": len(members), "gpu_left_over": _gpu_pids_left(members)}
        gl = self.stop_report["gpu_left_over"]
        killed = f"; killed with SIGKILL after {self.stop_timeout:.0f} s of SIGTERM" if rep.get("killed") else ""
        self.echo(f"{self.name}: stopped ({len(members)} processes, {rep['stop_s']} s{killed})"
                  + (f" WARNING: processes still alive: {rep['left_over']}" if rep["left_over"] else "")
                  + (f" WARNING: still holding GPU memory: {gl}" if gl else ""))
        return self.stop_report

    def _app_pids(self, members) -> list[int]:
        """The server's own Python processes inside the wrapper (not the profiler, whose command line
        also names the server): their arguments contain the launcher's last word."""
        needle = self.launcher[-1]
        out = []
        for p in sorted(members - {self.group.pid}):
            argv = procs.cmdline(p)
            if argv and Path(argv[0]).name.startswith("python") and any(needle in a for a in argv[1:]):
                out.append(p)
        return out

    def _log_tree(self, pids, apps) -> None:
        """Write the wrapped process tree into the server log (which process got the SIGTERM)."""
        lines = []
        for p in sorted(pids):
            try:
                pg = os.getpgid(p)
            except (OSError, ProcessLookupError):
                continue
            lines.append(f"#   pid {p} pgid {pg}{' <- SIGTERM' if p in apps else ''}: {' '.join(procs.cmdline(p))[:120]}")
        with open(self.log_path, "ab") as f:
            f.write(("# stopping the wrapped server; process tree:\n" + "\n".join(lines) + "\n").encode())

    def __enter__(self) -> "Server":
        try:
            return self.start()
        except BaseException:   # also Ctrl-C while waiting: never leave a half-started server behind
            self.stop()
            raise

    def __exit__(self, et, exc, tb) -> bool:
        self.stop()
        return False

    def alive(self) -> bool:
        if self.shared is not None:
            return procs.alive(int(self.shared["pid"]))
        return self.group is not None and self.group.alive()

    # ------------------------------------------------------------------ the log
    def log_mark(self) -> int:
        """A position in the log; :meth:`log_since` returns what was written after it."""
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_since(self, mark: int = 0) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(mark)
            return f.read().decode(errors="replace")

    def log_tail(self, n: int = 20) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, 2) - 64_000))
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def last_lines(self, n: int = 3) -> str:
        """The last ``n`` lines the server wrote, on one line ('a | b | c'; the launch command left out): what an
        error's one line shows of the log."""
        lines = [ln.strip()[:240] for ln in self.log_tail(n + 40).splitlines() if ln.strip() and not ln.startswith("$ ")]
        return " | ".join(lines[-n:]) or "(the log is empty)"

    def wait_log(self, pattern: str, mark: int = 0, timeout: float = 60, while_alive=None) -> re.Match:
        """Block until a log line after ``mark`` matches ``pattern``. ServerError on timeout, when the
        server dies, or when the thread ``while_alive`` (the client sending the load) has finished."""
        rx, t0 = re.compile(pattern, re.M), time.time()
        while time.time() - t0 < timeout:
            m = rx.search(self.log_since(mark))
            if m:
                return m
            if not self.alive():
                raise ServerError(f"{self.name} died; last log lines ({self.log_path}): {self.last_lines()}")
            if while_alive is not None and not while_alive.is_alive():
                raise ServerError(f"the requests finished before a log line matched {pattern!r}")
            time.sleep(0.05)
        raise ServerError(f"no log line matching {pattern!r} within {timeout:.0f} s")

    # ------------------------------------------------------------------ HTTP
    def request(self, path: str, body=None, timeout: float = 600, method: str | None = None) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method or ("POST" if data else "GET"),
                                     headers={"Content-Type": "application/json"})
        try:
            with _LOCAL.open(req, timeout=timeout) as r:
                return r.read()
        except urllib.error.HTTPError as e:
            raise ServerError(f"{path}: HTTP {e.code}: {e.read()[:300].decode(errors='replace')}") from None
        except (urllib.error.URLError, OSError) as e:
            dead = "" if self.alive() else f" The server is no longer running; last log lines ({self.log_path}): {self.last_lines()}"
            raise ServerError(f"{path}: {e.__class__.__name__}: {e}.{dead}") from None

    def get_json(self, path: str, timeout: float = 60):
        return json.loads(self.request(path, timeout=timeout))

    def get_text(self, path: str, timeout: float = 60) -> str:
        return self.request(path, timeout=timeout).decode(errors="replace")

    def post(self, path: str, body: dict | None = None, timeout: float = 600) -> str:
        return self.request(path, body if body is not None else {}, timeout=timeout, method="POST").decode(errors="replace")

    def metrics(self) -> "Metrics":
        return parse_metrics(self.get_text("/metrics"))

    def server_info(self) -> dict:
        return self.get_json("/server_info")

    def flush_cache(self, timeout: float = 30) -> None:
        """Empty the radix cache (waits up to ``timeout`` s for running requests to finish)."""
        self.request(f"/flush_cache?timeout={timeout}", timeout=timeout + 30, method="POST")

    def fresh(self, timeout: float = 30, settle: float = 5.0) -> dict:
        """Start an experiment from an empty server: /flush_cache (SGLang flushes only once no request is
        running or queued, waiting up to ``timeout`` s; HTTP 400 otherwise), its "Cache flushed
        successfully!" log line (the radix tree and the KV pool were reset; checked when the server logs
        at info level), and /v1/loads with no running or waiting request and no KV token held (polled up
        to ``settle`` s: the scheduler publishes its idle state a moment after the flush). ServerError
        when any of these fails; returns the idle loads."""
        mark = self.log_mark()
        try:
            self.flush_cache(timeout)
        except ServerError as e:
            raise ServerError(f"{self.name}: the radix cache could not be flushed (a request still running or "
                              f"queued after {timeout:.0f} s?): {e}") from None
        keys = ("num_running_reqs", "num_waiting_reqs", "num_used_tokens")
        t0, busy = time.time(), None
        while True:
            try:
                loads = self.get_json("/v1/loads?include=core", timeout=30).get("loads") or []
            except ServerError as e:
                if "HTTP 404" not in str(e):
                    raise
                loads = None                         # an SGLang without /v1/loads: the flush's own check stands
            busy = {k: sum(int(x.get(k) or 0) for x in loads) for k in keys} if loads is not None else {}
            if not any(busy.values()) or time.time() - t0 > settle:
                break
            time.sleep(0.1)
        if any(busy.values()):
            raise ServerError(f"{self.name} is not idle after /flush_cache: {busy}")
        level = parse_flags(self.args).get("--log-level", "info")
        while level in ("info", "debug") and "Cache flushed successfully" not in self.log_since(mark):
            if time.time() - t0 > settle:
                raise ServerError(f"{self.name}: /flush_cache answered, but its log has no 'Cache flushed "
                                  f"successfully' line ({self.log_path})")
            time.sleep(0.05)
        return busy

    def generate(self, input_ids=None, text=None, sampling_params=None, stream: bool = False,
                 timeout: float = 600) -> dict:
        """One /generate call. Adds ``client``: send/first/done times (s, time.time()), ttft_s,
        itl_s (between streamed chunks), e2e_s. With ``stream`` the last chunk is returned."""
        body = {"sampling_params": sampling_params or {}, "stream": stream}
        if input_ids is not None:
            body["input_ids"] = list(input_ids)
        else:
            body["text"] = text
        t_send = time.time()
        if not stream:
            out = json.loads(self.request("/generate", body, timeout=timeout))
            out["client"] = {"t_send": t_send, "t_done": time.time(), "e2e_s": time.time() - t_send}
            return out
        req = urllib.request.Request(self.url + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        last, times, ntok = None, [], 0
        try:
            with _LOCAL.open(req, timeout=timeout) as r:
                for raw in r:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        break
                    chunk = json.loads(payload)
                    if "error" in chunk:
                        raise ServerError(f"/generate stream error: {chunk['error']}")
                    n = (chunk.get("meta_info") or {}).get("completion_tokens", ntok + 1)
                    if n > ntok:
                        times.append(time.time())
                        ntok = n
                    last = chunk
        except urllib.error.HTTPError as e:
            raise ServerError(f"/generate: HTTP {e.code}: {e.read()[:300].decode(errors='replace')}") from None
        except (urllib.error.URLError, OSError) as e:
            raise ServerError(f"/generate stream: {e}") from None
        if last is None:
            raise ServerError("/generate stream returned no chunk")
        t_done = time.time()
        last["client"] = {"t_send": t_send, "t_first": times[0] if times else None, "t_done": t_done,
                          "ttft_s": (times[0] - t_send) if times else None,
                          "itl_s": [b - a for a, b in zip(times, times[1:])], "e2e_s": t_done - t_send}
        return last

    def generate_batch(self, input_ids: list[list[int]], sampling_params=None, timeout: float = 600) -> list[dict]:
        """One /generate call carrying a batch (SGLang's list of input_ids): its tokenizer manager hands every request
        to the scheduler in one loop, so the batch forms at once. From a thread per request (generate_many) a few of
        128 could arrive after the others had started decoding (H200, 2026-11-28: 125 then 3). Results in input
        order, each with ``client`` (the batch's send and done times)."""
        t_send = time.time()
        out = json.loads(self.request("/generate", {"input_ids": [list(x) for x in input_ids],
                                                    "sampling_params": sampling_params or {}}, timeout=timeout))
        if not isinstance(out, list) or len(out) != len(input_ids):
            raise ServerError(f"/generate with a batch of {len(input_ids)} returned "
                              f"{len(out) if isinstance(out, list) else type(out).__name__} result(s)")
        t_done = time.time()
        for o in out:
            o["client"] = {"t_send": t_send, "t_done": t_done, "e2e_s": t_done - t_send}
        return out

    def generate_many(self, requests: list[dict], stream: bool = False, max_workers: int = 512,
                      stagger_s: float = 0.0) -> list[dict]:
        """Send ``requests`` (kwargs of :meth:`generate`) from a thread pool: all at once, or request i
        at i x ``stagger_s`` seconds. Results in input order; a failed request becomes {"error": ...}."""
        t0 = time.time()

        def one(item):
            i, kw = item
            if stagger_s:
                time.sleep(max(0.0, t0 + i * stagger_s - time.time()))
            try:
                return self.generate(stream=stream, **kw)
            except ServerError as e:
                return {"error": str(e)}
        if not requests:
            return []
        with ThreadPoolExecutor(max_workers=min(len(requests), max_workers)) as ex:
            return list(ex.map(one, enumerate(requests)))

    def while_decoding(self, requests: list[dict], action, running: int | str, timeout: float = 300,
                       stream: bool = False, stagger_s: float = 0.0):
        """Send ``requests`` in the background, wait for the scheduler's first "Decode batch" line with
        ``running`` (an int or a regex) running requests, call ``action()``, let the requests finish.
        Returns (what action returned, the requests' results)."""
        res, mark = {}, self.log_mark()
        th = threading.Thread(target=lambda: res.update(out=self.generate_many(requests, stream=stream,
                                                                               stagger_s=stagger_s)))
        th.start()
        try:
            self.wait_log(rf"Decode batch(?: \[\d+\])?, #running-req: (?:{running}),", mark, timeout=timeout,
                          while_alive=th)
            got = action()
        finally:
            th.join()
        return got, res.get("out", [])

    # ------------------------------------------------------------------ SGLang's profiler endpoints
    def start_profile(self, output_dir, activities=("CPU", "GPU"), num_steps: int | None = None, **kw) -> str:
        """POST /start_profile. Traces go to ``output_dir`` (an absolute path the server can write);
        activities ["CUDA_PROFILER"] opens a cudaProfilerStart/Stop window instead (ncu, nsys)."""
        body = {"output_dir": str(Path(output_dir).resolve()), "activities": list(activities),
                "with_stack": False, "record_shapes": False, **kw}
        if num_steps:
            body["num_steps"] = int(num_steps)
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        return self.post("/start_profile", body, timeout=120)

    def stop_profile(self, ignore_not_running: bool = True) -> None:
        try:
            self.post("/stop_profile", timeout=600)
        except ServerError:
            if not ignore_not_running:
                raise

    @staticmethod
    def wait_traces(output_dir, before=(), timeout: float = 180, ranks: int = 1) -> list[Path]:
        """Wait until ``ranks`` new ``*.trace.json.gz`` files exist in ``output_dir`` and stop growing."""
        d, before, t0, sizes = Path(output_dir), set(map(str, before)), time.time(), {}
        while time.time() - t0 < timeout:
            new = sorted(p for p in d.glob("*.trace.json*") if str(p) not in before)
            cur = {str(p): p.stat().st_size for p in new}
            if len(new) >= ranks and cur == sizes and all(cur.values()):
                return new
            sizes = cur
            time.sleep(1.0)
        raise ServerError(f"no complete profiler trace in {d} after {timeout:.0f} s")

    def traced(self, output_dir, action, num_steps: int | None = None, ranks: int = 1):
        """Run ``action()`` under SGLang's torch profiler (/start_profile, then /stop_profile, also when
        ``action`` fails). Returns (the new trace files, one per rank, what ``action`` returned)."""
        d = Path(output_dir)
        before = list(d.glob("*.trace.json*")) if d.exists() else []
        self.start_profile(d, num_steps=num_steps)
        try:
            out = action()
        finally:
            self.stop_profile()
        return self.wait_traces(d, before, ranks=ranks), out



def _gpu_pids_left(pids, wait_s: float = 10.0) -> list[int]:
    """Which of ``pids`` nvidia-smi still lists as holding GPU memory (waits up to ``wait_s``);
    [] where there is no nvidia-smi."""
    import shutil
    if not shutil.which("nvidia-smi") or not pids:
        return []
    t0 = time.time()
    while True:
        try:
            out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout
        except (subprocess.SubprocessError, OSError):
            return []
        held = sorted({int(x) for x in out.split() if x.strip().isdigit()} & set(pids))
        if not held or time.time() - t0 > wait_s:
            return held
        time.sleep(1.0)
