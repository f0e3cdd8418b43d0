"""One server for several experiments: the pipeline's shared server and the scripts that attach to it when their
flags are its own (sg.server, sg.SharedServer). Part of _sglang."""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from common.capture import procs  # noqa: E402
from common.run import cli  # noqa: E402
from _sgl_facts import SERVING_ENV, ServerError, add_model_args, changes_from_defaults, config_line, parse_flags, require_sglang, serving_flags, table  # noqa: E402
from _sgl_logs import breakdown_lines, breakdown_row  # noqa: E402
from _sgl_server import Server, reap_servers, servers_dir  # noqa: E402


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


def _record_start(run, srv: "Server", started_by: str, quick: bool) -> dict:
    """One row for a server start: in the run (table server_start, headline server_start_s) and, inside a
    pipeline, in its file of starts (common.run.steps.STARTS_ENV -> server_starts.csv)."""
    from common.run.steps import STARTS_ENV
    row = {"started_by": started_by, "server": srv.name, "start_s": round(srv.startup_s or 0.0, 1),
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
           share: str = SHARED, **kw):
    """The server an experiment runs on, as a context manager yielding a :class:`Server`:

    * the pipeline's shared server ``share`` when the pipeline offers one (``SHARED_ENV``) and this
      experiment's model, flags and SGLANG_* environment are exactly its own (:func:`why_not_shared`):
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
    info = shared_info(share)
    why = why_not_shared(info, model_dir, fl, env, port) if info else None
    log = run.log if run is not None else print
    if info and not why:
        srv = Server.attach(info, echo=log, name=name, bench_log=run.path("bench_worker.log") if run else None)
        rec.update(how="shared", shared=share, pid=info["pid"], url=info["url"], start_s=0.0)
        log(f"{name}: runs on the pipeline's shared server '{share}' (pid {info['pid']}, {info['url']}, started "
            f"by the runner in {float(info.get('start_s') or 0):.0f} s; log {info['log']}): same model, flags and "
            f"environment, so no server is started here")
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
    rec.update(how="own", why=why or NO_SHARED)
    if info:
        log(f"{name}: starts its own server, not the pipeline's shared '{share}': {why}"
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

    Its configuration is :func:`serving_flags` of the scripts' default options in the pipeline's mode,
    with SERVING_ENV -- the very flags 01, 02 (its FCFS server), 03 (FlashInfer) and 08 compute when run
    with their defaults, so they attach to it (:func:`server`). Its pidfile is in
    ``servers_dir(PIPELINE_STEM)``: a pipeline killed with SIGKILL leaves its server behind, the next
    pipeline run stops it (:meth:`reap`). It declines to start (ServiceSkipped: each step starts its own
    server, one at a time, as before) on a GPU under ``min_gpu_gb``: an experiment that needs its own flags
    (02's LPM pass, 03's Triton) runs its server beside the shared one, and two Llama-3.1-8B servers with
    a 32768-token pool take ~46 GB. ``model_path``/``flags``/``launcher``: tests (a stand-in server)."""
    MIN_GPU_GB = 70.0

    def __init__(self, name: str = SHARED, mode: str = "quick", echo=print, *, model_path=None, flags=None,
                 env: dict | None = None, launcher=None, start_timeout: float = 900, stop_timeout: float = 30,
                 check_timeout: float = 30, min_gpu_gb: float | None = None):
        self.name, self.mode, self.echo = name, mode, echo
        self.model_path, self.flags = model_path, flags
        self.server_env = dict(SERVING_ENV if env is None else env)
        self.launcher, self.start_timeout, self.stop_timeout = launcher, start_timeout, stop_timeout
        self.check_timeout = check_timeout                # how long a check waits for a step's requests to end
        self.min_gpu_gb = self.MIN_GPU_GB if min_gpu_gb is None else min_gpu_gb
        self.srv: Server | None = None
        self._lines: list[str] = []

    def config(self, write: bool = True) -> tuple[str, list[str]]:
        """(model dir, flags): the given ones, else serving_flags() of the scripts' default options."""
        if self.flags is not None:
            return str(self.model_path), [str(f) for f in self.flags]
        import argparse
        p = argparse.ArgumentParser()
        add_model_args(p)
        return serving_flags(p.parse_args([]), quick=self.mode == "quick", write=write)

    def describe(self) -> str:
        model, fl = self.config(write=False)
        launcher = ["python" if a == sys.executable else str(a) for a in
                    (self.launcher or [sys.executable, "-m", "sglang.launch_server"])]
        env = " ".join(f"{k}={v}" for k, v in _sglang_env(self.server_env).items())
        return (env + " " if env else "") + shlex.join([*launcher, "--model-path", model, *fl])

    def reap(self) -> list[int]:
        return reap_servers(servers_dir(PIPELINE_STEM), self.echo)

    def start(self, log_dir) -> None:
        from common.run.steps import ServiceSkipped
        if self.launcher is None:               # the real launch_server: what it needs, one [setup] line each
            require_sglang()
            cli.check_gpus_for(1, "the shared SGLang server")
        gb = gpu_total_gb()
        if gb is not None and gb < self.min_gpu_gb:
            raise ServiceSkipped(f"GPU 0 has {gb:.0f} GB, under {self.min_gpu_gb:.0f} GB: a step that needs a "
                                 f"server of its own could not start it beside the shared one")
        model, fl = self.config()
        self.srv = Server(model, fl, log_path=Path(log_dir) / f"server-{self.name}.sglang.log", env=self.server_env,
                          name=f"shared server '{self.name}'", echo=self.echo, launcher=self.launcher,
                          start_timeout=self.start_timeout, stop_timeout=self.stop_timeout,
                          pidfile=servers_dir(PIPELINE_STEM) / f"{os.getpid()}-{self.name}.pid")
        try:
            self.srv.start()
            self.srv.fresh()
        except BaseException:
            self.srv.stop()
            self.srv = None
            raise
        quick = self.mode == "quick"
        self.echo(f"shared server '{self.name}': {config_line(fl, self.server_env, quick)}")
        _record_start(None, self.srv, "pipeline", quick)
        n = sum(l.startswith(f"shared server '{self.name}' start") for l in self._lines) + 1
        self._lines += [f"shared server '{self.name}' start {n}: {self.srv.startup_s:.1f} s, from its log's time "
                        f"stamps:", *breakdown_lines(self.srv.startup_phases, self.srv.startup_s),
                        f"  {config_line(fl, self.server_env, quick)}"]

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
                "env": _sglang_env(self.server_env), "start_s": round(s.startup_s or 0.0, 1), "mode": self.mode}

    def env(self) -> dict:
        return {SHARED_ENV + self.name.upper(): json.dumps(self.info())} if self.srv is not None else {}

    def stop(self) -> None:
        if self.srv is not None:
            self.srv.stop()
            self.srv = None

    def lines(self) -> list[str]:
        return list(self._lines)
