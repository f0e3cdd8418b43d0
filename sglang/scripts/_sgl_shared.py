"""One server for several experiments: the pipeline's shared server and the scripts that attach to it when their
flags are its own (sg.server, sg.SharedServer). Part of _sglang."""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from common.capture import procs  # noqa: E402
from common.run import cli  # noqa: E402
from _sgl_facts import SERVING_ENV, ServerError, add_model_args, changes_from_defaults, config_line, parse_flags, require_sglang, serving_flags, table  # noqa: E402
from _sgl_logs import breakdown_lines, breakdown_row  # noqa: E402
from _sgl_server import Server, reap_servers, servers_dir  # noqa: E402
from _sgl_gate import Gate  # noqa: E402


# ================================================================== one server for several experiments

SHARED = "default"                     # the shared server's name in sglang/scripts/_steps.py (SERVERS)
SHARED_ENV = "HANDS_ON_SHARED_SERVER_"  # + NAME: the JSON record of a running shared server, set by the pipeline
PIPELINE_STEM = "06_full_pipeline"      # servers_dir(PIPELINE_STEM): the pidfiles of the pipeline's shared servers
NO_SHARED = "no shared server offered (run on its own, or not by a --quick pipeline)"


def _sglang_env(env) -> dict:
    return {k: str(v) for k, v in sorted((env or {}).items()) if k.startswith("SGLANG_")}


def shared_info(name: str = SHARED) -> dict | None:
    """The record of the shared server ``name`` the pipeline offers this process, or None."""
    raw = os.environ.get(SHARED_ENV + name.upper())
    try:
        info = json.loads(raw) if raw else None
    except ValueError:
        return None
    need = {"url", "host", "port", "pid", "log", "flags", "model_path"}
    return info if isinstance(info, dict) and need <= set(info) else None


def offered() -> dict:
    """{name: record} of every shared server the pipeline offers this process (one per configuration its
    step uses: the shared 'default', 02's 'lpm', 03's 'triton'), in the order of their names."""
    names = sorted(k[len(SHARED_ENV):].lower() for k in os.environ if k.startswith(SHARED_ENV))
    return {n: i for n in names for i in [shared_info(n)] if i}


def flag_diff(theirs, mine) -> str:
    """What ``mine`` changes against ``theirs`` (launch_server flags), e.g. 'adds --schedule-policy lpm'; ''
    when both mean the same (the order of the flags aside)."""
    a, b = parse_flags(theirs), parse_flags(mine)
    val = lambda v: "" if v is True else " ".join(v) if isinstance(v, list) else str(v)  # noqa: E731
    out = [f"adds {k} {val(b[k])}".strip() for k in b if k not in a]
    out += [f"lacks {k} {val(a[k])}".strip() for k in a if k not in b]
    out += [f"{k} {val(b[k])} (shared: {val(a[k])})" for k in b if k in a and a[k] != b[k]]
    return ", ".join(out)


def why_not_shared(info: dict, model_dir, fl, env=None, port=None) -> str | None:
    """Why an experiment with these settings cannot run on the shared server ``info`` (None: it can):
    it attaches only when its model, its flags and its SGLANG_* environment are the shared server's."""
    if port is not None:
        return f"--port {port} was asked for"
    if str(model_dir) != str(info["model_path"]):
        return f"another model ({model_dir}; the shared server serves {info['model_path']})"
    d = flag_diff(info["flags"], fl)
    if d:
        return f"its flags differ from the shared server's: {d}"
    mine, theirs = _sglang_env(env), info.get("env") or {}
    if mine != theirs:
        diff = sorted(set(mine.items()) ^ set(theirs.items()))
        return "its SGLANG_* environment differs: " + ", ".join(f"{k}={v}" for k, v in diff)
    if not procs.alive(int(info["pid"])):
        return f"the shared server (pid {info['pid']}) is not running"
    return None


def _record_start(run, srv: "Server", started_by: str, quick: bool, waited_s: float | None = None) -> dict:
    """One row for a server start: in the run (table server_start, headline server_start_s) and, inside a
    pipeline, in its file of starts (common.run.steps.STARTS_ENV -> server_starts.csv). ``start_s``: from its
    launch to ready; ``waited_s``: what the run waited for it (a held server: from its release; else start_s)."""
    from common.run.steps import STARTS_ENV
    start_s = round(srv.startup_s or 0.0, 1)
    row = {"started_by": started_by, "server": srv.name, "start_s": start_s,
           "waited_s": start_s if waited_s is None else round(waited_s, 1),
           "quick_changes": "; ".join(f"{c['setting']} {c['value']}" for c in
                                      changes_from_defaults(srv.args, {}, quick) if c["quick"]),
           **breakdown_row(srv.startup_phases)}
    if run is not None:
        rows = run.summary.setdefault("server_starts", [])
        rows.append(row)
        table(run, "server_start", rows)
        run.headline(server_start_s=round(sum(r["start_s"] for r in rows), 1))
    path = os.environ.get(STARTS_ENV)
    if path:
        try:
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")
        except OSError:
            pass                                # the pipeline's record is a convenience, never a failure
    return row


@contextlib.contextmanager
def server(run, model_dir, fl, *, quick: bool, env: dict | None = None, name: str = "server",
           log_name: str = "server.log", port: int | None = None, start_timeout: float = 900, own_why: str = "",
           **kw):
    """The server an experiment runs on, as a context manager yielding a :class:`Server`:

    * a shared server the pipeline offers (:func:`offered`: ``SHARED_ENV`` + its name, one per configuration)
      whose model, flags and SGLANG_* environment are exactly this experiment's (:func:`why_not_shared`):
      nothing is started or stopped here; the log names the server used, and the server's log lines of
      this run are copied to ``run.path(log_name)`` at the end;
    * else a server of its own (a :class:`Server` with ``kw``), started and stopped as always; inside a
      pipeline the log says why (and ``own_why``, the experiment's own reason for its flags); its start
      is recorded (:func:`_record_start`).
    Either way the experiment starts from :meth:`Server.fresh` (cache flushed, nothing running or
    queued), and ``summary.json`` gets ``servers`` (each server: how, why, flags, every setting changed
    from SGLang's defaults with its reason) and ``server_config`` (those of the first)."""
    env = dict(SERVING_ENV if env is None else env)
    rec = {"name": name, "flags": [str(f) for f in fl], "env": _sglang_env(env),
           "changes": changes_from_defaults(fl, env, quick)}
    if run is not None:
        run.summary.setdefault("servers", []).append(rec)
        run.summary.setdefault("server_config", rec["changes"])
    offers = offered()
    whys = {n: why_not_shared(i, model_dir, fl, env, port) for n, i in offers.items()}
    share = next((n for n, w in whys.items() if w is None), None)
    log = run.log if run is not None else print
    if share is not None:
        info = offers[share]
        srv = Server.attach(info, echo=log, name=name, bench_log=run.path("bench_worker.log") if run else None)
        rec.update(how="shared", shared=share, pid=info["pid"], url=info["url"], start_s=0.0)
        held = float(info.get("held_s") or 0)
        log(f"{name}: runs on the pipeline's shared server '{share}' (pid {info['pid']}, {info['url']}, started "
            f"by the runner in {float(info.get('start_s') or 0):.0f} s"
            + (f", {held:.0f} s of it held at its gate while earlier steps ran" if held else "")
            + f"; log {info['log']}): same model, flags and environment, so no server is started here")
        mark = srv.log_mark()
        try:
            srv.fresh()
            log(f"{name}: radix cache flushed, no request running or queued: the experiment starts from an "
                f"empty server")
            yield srv
        finally:
            srv.stop()                          # its bench_serving worker only
            if run is not None:
                with contextlib.suppress(OSError):
                    run.path(log_name).write_text(f"# the shared server's log ({info['log']}) while "
                                                  f"{run.stem} used it\n" + srv.log_since(mark))
        return
    why = "; ".join(f"'{n}': {w}" if len(whys) > 1 else w for n, w in whys.items())
    rec.update(how="own", why=why or NO_SHARED)
    if offers:
        names = ", ".join(f"'{n}'" for n in offers)
        log(f"{name}: starts its own server, not the pipeline's shared {names}: {why}"
            + (f" -- {own_why}" if own_why else ""))
    with Server(model_dir, fl, port=port, log_path=run.path(log_name) if run else log_name, echo=log,
                start_timeout=start_timeout, env=env, name=name, **kw) as srv:
        rec.update(start_s=round(srv.startup_s, 1), pid=srv.group.pid)
        _record_start(run, srv, run.stem if run is not None else Path(sys.argv[0]).stem, quick)
        srv.fresh()
        yield srv


def gpu_total_gb(index: int = 0) -> float | None:
    """Memory of the first visible GPU (nvidia-smi), GB; None where there is no nvidia-smi answer."""
    import shutil
    if not shutil.which("nvidia-smi"):
        return None
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    first = cvd.split(",")[0].strip() if cvd.strip() else str(index)
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", first],
                             capture_output=True, text=True, timeout=30).stdout.split()
        return float(out[0]) / 1024 if out else None
    except (subprocess.SubprocessError, OSError, ValueError):
        return None


class SharedServer:
    """The pipeline's shared SGLang server: a common.run.pipeline service provider, declared in
    sglang/scripts/_steps.py (``SERVERS = {"default": Service("_sglang:SharedServer")}``).

    Its configuration is :func:`serving_flags` of the scripts' default options in the pipeline's mode (and
    ``settings``, more serving_flags keywords: ``{"schedule_policy": "lpm"}`` is 02's LPM server,
    ``{"backend": "triton"}`` 03's Triton one), with SERVING_ENV -- the very flags the scripts compute when run
    with their defaults, so they attach to it (:func:`server`). Its pidfile is in
    ``servers_dir(PIPELINE_STEM)``: a pipeline killed with SIGKILL leaves its server behind, the next
    pipeline run stops it (:meth:`reap`). A held service (``Service(held=True)``) is launched when the run
    begins (:meth:`launch`): its scheduler is held by a gate (_sgl_gate) after its imports, before it touches
    the GPU, and :meth:`start` releases it at its row. It declines to start (ServiceSkipped: each step starts
    its own server, one at a time, as before) on a GPU under ``min_gpu_gb``: an experiment that needs its own
    flags runs its server beside the shared one, and two Llama-3.1-8B servers with a 32768-token pool take
    ~46 GB. ``model_path``/``flags``/``launcher``: tests (a stand-in server)."""
    MIN_GPU_GB = 70.0
    # GPU memory one --quick server holds once it serves: 139.13 -> 116.30 GB free ("avail mem" lines of its log)
    # on an H200, 2026-11-28 (weights 15.02 GB, KV pool 4.00 GB, CUDA graphs and buffers the rest)
    FOOTPRINT_GB = 23.0

    def __init__(self, name: str = SHARED, mode: str = "quick", echo=print, *, model_path=None, flags=None,
                 env: dict | None = None, launcher=None, start_timeout: float = 900, stop_timeout: float = 30,
                 check_timeout: float = 30, min_gpu_gb: float | None = None, settings: dict | None = None,
                 gpu_gb: float | None = None):
        self.name, self.mode, self.echo = name, mode, echo
        self.model_path, self.flags, self.settings = model_path, flags, dict(settings or {})
        self.server_env = dict(SERVING_ENV if env is None else env)
        self.launcher, self.start_timeout, self.stop_timeout = launcher, start_timeout, stop_timeout
        self.check_timeout = check_timeout                # how long a check waits for a step's requests to end
        self.min_gpu_gb = self.MIN_GPU_GB if min_gpu_gb is None else min_gpu_gb
        self.gpu_gb = gpu_gb                              # GPU 0's memory when the caller knows it (else nvidia-smi)
        self.srv: Server | None = None
        self.gate: Gate | None = None                     # launch(): the gate its scheduler waits at
        self.gate_dir: Path | None = None                 # ... and its folder (removed with the server)
        self.launched_at: float | None = None
        self.released_at: float | None = None             # release(): its gate opened before its row
        self._lines: list[str] = []

    def config(self, write: bool = True) -> tuple[str, list[str]]:
        """(model dir, flags): the given ones, else serving_flags() of the scripts' default options."""
        if self.flags is not None:
            return str(self.model_path), [str(f) for f in self.flags]
        import argparse
        p = argparse.ArgumentParser()
        add_model_args(p)
        return serving_flags(p.parse_args([]), quick=self.mode == "quick", write=write, **self.settings)

    def describe(self) -> str:
        model, fl = self.config(write=False)
        launcher = ["python" if a == sys.executable else str(a) for a in
                    (self.launcher or [sys.executable, "-m", "sglang.launch_server"])]
        env = " ".join(f"{k}={v}" for k, v in _sglang_env(self.server_env).items())
        return (env + " " if env else "") + shlex.join([*launcher, "--model-path", model, *fl])

    def reap(self) -> list[int]:
        return reap_servers(servers_dir(PIPELINE_STEM), self.echo)

    def _server(self, log_dir, env: dict) -> Server:
        """The Server of its configuration, not started (a machine that cannot run it: one [setup] line, or
        ServiceSkipped on a small GPU)."""
        from common.run.steps import ServiceSkipped
        if self.launcher is None:               # the real launch_server: what it needs, one [setup] line each
            require_sglang()
            cli.check_gpus_for(1, "the shared SGLang server")
        gb = gpu_total_gb()
        if gb is not None and gb < self.min_gpu_gb:
            raise ServiceSkipped(f"GPU 0 has {gb:.0f} GB, under {self.min_gpu_gb:.0f} GB: a step that needs a "
                                 f"server of its own could not start it beside the shared one")
        model, fl = self.config()
        return Server(model, fl, log_path=Path(log_dir) / f"server-{self.name}.sglang.log",
                      env={**self.server_env, **env}, name=f"shared server '{self.name}'", echo=self.echo,
                      launcher=self.launcher, start_timeout=self.start_timeout, stop_timeout=self.stop_timeout,
                      pidfile=servers_dir(PIPELINE_STEM) / f"{os.getpid()}-{self.name}.pid")

    def launch(self, log_dir) -> None:
        """Start it now, held: its processes import (most of a start is Python) while the run's steps
        go on; its scheduler waits at a gate (_sgl_gate) before it touches the GPU, until :meth:`start`."""
        self.gate_dir = Path(log_dir) / f"gate-{self.name}"
        self.gate = Gate(self.gate_dir)
        try:
            self.srv = self._server(log_dir, self.gate.env())
            self.srv.launch()
            self.launched_at = time.time()
        except BaseException:
            self.stop()
            raise

    def together_ok(self, n: int) -> bool:
        """Whether ``n`` such servers fit on GPU 0 at once with room to spare: n x FOOTPRINT_GB within the share of the
        GPU its --mem-fraction-static lets SGLang's static memory take (0.8 by default: 3 servers fit on a 141 GB
        H200, not on 80 GB). Without that flag among its flags: no (one at a time, as before)."""
        gb = self.gpu_gb if self.gpu_gb is not None else gpu_total_gb()
        fl = self.config(write=False)[1]
        frac = next((float(fl[i + 1]) for i, f in enumerate(fl[:-1]) if f == "--mem-fraction-static"), None)
        return gb is not None and frac is not None and n * self.FOOTPRINT_GB <= frac * gb

    def release(self) -> None:
        """Open a held server's gate now, without waiting for it: it loads its weights and captures its graphs
        beside the server started at this row (no step is measuring); :meth:`start` then only waits for it."""
        if self.srv is None or self.gate is None or self.released_at is not None:
            return
        self.gate.release(self.srv)
        self.released_at = time.time()
        self.srv.start_timeout += self.released_at - self.launched_at     # the time it was held is no start time

    def start(self, log_dir) -> None:
        """Start it and wait until it serves, idle; a launched one is released (it touches the GPU from now on),
        one that died while held is started anew; one released early (:meth:`release`) is only waited for."""
        held = self.srv is not None and self.gate is not None
        t0 = self.released_at or time.time()
        if held and not self.srv.alive():
            rc = self.srv.group.poll() if self.srv.group else None
            self.echo(f"shared server '{self.name}': gone while held (exit code {rc}; log {self.srv.log_path}: "
                      f"{self.srv.last_lines()}); starting it anew")
            self.stop()
            held, t0 = False, time.time()
        try:
            if held:
                self.release()                                        # no-op where release() opened it already
            else:
                self.srv = self._server(log_dir, {})
                self.srv.launch()
            self.srv.wait_ready()
            self.srv.fresh()
        except BaseException:
            self.stop()
            raise
        quick = self.mode == "quick"
        fl = self.srv.args
        waited = time.time() - t0
        self.echo(f"shared server '{self.name}': {config_line(fl, self.server_env, quick)}")
        _record_start(None, self.srv, "pipeline", quick, waited_s=waited)
        n = sum(l.startswith(f"shared server '{self.name}' start") for l in self._lines) + 1
        how = (f", launched when the run began and held {self._held_s():.1f} s at its gate while earlier steps ran; "
               f"ready {waited:.1f} s after its release" if held else "")
        self._lines += [f"shared server '{self.name}' start {n}: {self.srv.startup_s:.1f} s{how}, from its log's "
                        f"time stamps:", *breakdown_lines(self.srv.startup_phases, self.srv.startup_s),
                        f"  {config_line(fl, self.server_env, quick)}"]

    def _held_s(self) -> float:
        """Seconds its scheduler waited at the gate (its log's 'gate' phase); 0 when not held."""
        return next((p["seconds"] for p in (self.srv.startup_phases if self.srv else []) if p["phase"] == "gate"), 0.0)

    def check(self) -> str | None:
        if self.srv is None or not self.srv.alive():
            rc = self.srv.group.poll() if self.srv is not None and self.srv.group else None
            return "its process is gone" + (f" (exit code {rc})" if rc is not None else "")
        try:
            self.srv.fresh(timeout=self.check_timeout)
        except ServerError as e:
            return str(e).splitlines()[0][:300]
        return None

    def info(self) -> dict:
        s = self.srv
        return {"name": self.name, "url": s.url, "host": s.host, "port": s.port, "pid": s.group.pid,
                "log": str(s.log_path), "flags": list(s.args), "model_path": s.model_path,
                "env": _sglang_env(self.server_env), "start_s": round(s.startup_s or 0.0, 1),
                "held_s": round(self._held_s(), 1), "mode": self.mode}

    def env(self) -> dict:
        return {SHARED_ENV + self.name.upper(): json.dumps(self.info())} if self.srv is not None else {}

    def stop(self) -> None:
        if self.srv is not None:
            self.srv.stop()
            self.srv = None
        if self.gate_dir is not None:                     # its plugin and release file: of no use any more
            shutil.rmtree(self.gate_dir, ignore_errors=True)
        self.gate = self.gate_dir = None
        self.released_at = None

    def lines(self) -> list[str]:
        return list(self._lines)
