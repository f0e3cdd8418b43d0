"""SGLang's own load client, sglang.benchmark.serving: its command line, its records, and the one-process worker
that imports it once per server (BenchWorker, run_bench). Part of _sglang."""
from __future__ import annotations

import atexit
import functools
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from common.base import stats  # noqa: E402
from common.capture import procs  # noqa: E402
from _sgl_facts import OFFLINE_ENV, ParseError, SERVER_ENV, ServerError, _last_stop, local_env  # noqa: E402


# ================================================================== bench_serving

BENCH_KEYS = ("completed", "duration", "request_throughput", "output_throughput", "total_throughput",
              "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms")
BENCH_SCALARS = ("request_rate", "max_concurrency", "completed", "duration", "total_input_tokens",
                 "total_output_tokens", "request_throughput", "input_throughput", "output_throughput",
                 "total_throughput", "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
                 "mean_itl_ms", "median_itl_ms", "p90_itl_ms", "p99_itl_ms", "median_tpot_ms",
                 "median_e2e_latency_ms", "p99_e2e_latency_ms", "concurrency", "max_concurrent_requests")


def read_bench_jsonl(path) -> list[dict]:
    """`sglang.benchmark.serving --output-file` (one JSON object appended per run) -> list of dicts."""
    p = Path(path)
    if not p.is_file():
        raise ParseError(f"{p}: no bench_serving output file (did the benchmark fail? see its log)")
    runs = []
    for i, line in enumerate(p.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise ParseError(f"{p.name} line {i} is not complete JSON (truncated?): {e}") from None
        missing = [k for k in BENCH_KEYS if k not in rec]
        if missing:
            raise ParseError(f"{p.name} line {i} lacks {missing}: not a bench_serving result")
        runs.append(rec)
    if not runs:
        raise ParseError(f"{p}: empty bench_serving output")
    return runs


def bench_headline(rec: dict) -> dict:
    """The scalar results of one bench_serving run (no server_info, no per-request lists)."""
    return {k: rec.get(k) for k in BENCH_SCALARS}


def bench_cmd(srv, out_file, *, num_prompts: int, input_len: int, output_len: int, rate="inf",
              dataset: str = "random-ids", seed: int = 1, max_concurrency: int | None = None,
              tokenize_prompt: bool = True, details: bool = True, extra=()) -> list[str]:
    """`python -m sglang.benchmark.serving` against ``srv`` with fixed lengths (range ratio 1.0),
    token ids sent as ids (``--tokenize-prompt``), cache flushed after the warm-up request."""
    cmd = [sys.executable, "-m", "sglang.benchmark.serving", "--backend", "sglang", "--host", srv.host,
           "--port", str(srv.port), "--model", srv.model_path, "--tokenizer", srv.model_path,
           "--dataset-name", dataset, "--num-prompts", str(num_prompts), "--random-input-len", str(input_len),
           "--random-output-len", str(output_len), "--random-range-ratio", "1.0", "--request-rate", str(rate),
           "--seed", str(seed), "--output-file", str(out_file), "--disable-tqdm", "--flush-cache"]
    if tokenize_prompt and dataset != "generated-shared-prefix":
        cmd.append("--tokenize-prompt")
    if max_concurrency:
        cmd += ["--max-concurrency", str(max_concurrency)]
    if details:
        cmd.append("--output-details")
    return cmd + list(extra)


def tool_env(model_path) -> dict:
    """The environment of an SGLang CLI tool (bench_serving, bench_offline_throughput) next to a server."""
    return {**SERVER_ENV, **local_env(), **(OFFLINE_ENV if Path(model_path).is_dir() else {})}


BENCH_MODULE = "sglang.benchmark.serving"


def _bench_worker(module: str) -> int:
    """The worker's side of :class:`BenchWorker`: import ``module`` once, then for each JSON request
    read on stdin ({"argv", "log", "done"}) run its ``cli_main()`` with that argv, its output in the
    request's log, and write {"rc": exit code, "run_s": seconds of cli_main, "ready_at": epoch time the
    import had finished} to ``done`` (atomically). Ends when stdin closes."""
    import contextlib
    import importlib
    import traceback
    from common.capture.store import write_json_atomic
    mod = importlib.import_module(module)
    ready_at = time.time()
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        rc, t0 = 0, time.time()
        with open(req["log"], "a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            sys.argv = [module, *req["argv"]]
            try:
                mod.cli_main()
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except Exception:  # noqa: BLE001 - the run failed: its traceback in its log, the worker goes on
                traceback.print_exc()
                rc = 1
        write_json_atomic(req["done"], {"rc": rc, "run_s": round(time.time() - t0, 3), "ready_at": ready_at})
    return 0


class BenchWorker:
    """One ``sglang.benchmark.serving`` process for all the runs against a server. Run as its own
    ``python -m sglang.benchmark.serving``, each benchmark took ~22 s of wall time for a "Benchmark
    duration" of 1.5-5 s (01 --quick on the H200, 2026-11-23: log.txt time stamps against the bench
    JSONs), most of it the start of a Python process that imports sglang; the worker starts once. A run is
    the module's own ``cli_main()`` with the same arguments, output file and log as the command line.
    The worker is a common.capture.procs.Group (own process group, stopped with its tree on exit, error,
    Ctrl-C, SIGTERM); a run past its timeout stops the worker (ProcError) and the next run starts a
    new one; a worker that dies is a ProcError with its log's last lines."""

    def __init__(self, env: dict, log_path, *, echo=print, module: str = BENCH_MODULE, python=sys.executable):
        self.env, self.log_path, self.echo, self.module = env, Path(log_path), echo, module
        self.cmd = [python, str(Path(__file__).resolve().with_name("_sgl_bench.py")), "--bench-worker", module]
        self.group: procs.Group | None = None
        self.runs = 0
        self._at_exit = None
        self.started_at: float | None = None     # when the worker process was spawned (time.time())
        self.start_s: float | None = None        # the part of spawn -> import done that the first run waited for
        self._proc_runs = 0                      # runs of the current worker process
        self.last: dict = {}                     # the timing of the last run (see run())

    @property
    def pid(self) -> int | None:
        return self.group.pid if self.group else None

    def warm(self) -> "BenchWorker":
        """Start the worker now (if it is not running), so that its import overlaps other work; the first run
        then pays only what is left of it (``start_s``)."""
        if self.group is None or not self.group.alive():
            self._start()
        return self

    def _start(self) -> None:
        self.started_at, self.start_s, self._proc_runs = time.time(), None, 0
        self.group = procs.Group(self.cmd, self.log_path, env={**os.environ, **self.env}, name="bench_serving worker",
                                 echo=self.echo, stdin_pipe=True).start()
        self._at_exit = functools.partial(_last_stop, self)
        atexit.register(self._at_exit)

    def run(self, argv, log, timeout: float | None = 900) -> int:
        """One benchmark (``argv``: the module's arguments); its exit code. Output appended to ``log``.
        ``self.last``: {run (1 = the worker's first), wall_s (request sent -> done, here), run_s (its
        cli_main in the worker), start_s (the worker's spawn -> import done, paid by this run; 0 after)}."""
        t0 = time.time()
        if self.group is None or not self.group.alive():
            self._start()
        first = self._proc_runs == 0       # this worker process's first run: it may wait for the import
        log = Path(log)
        done = log.with_name(log.name + ".done")
        done.unlink(missing_ok=True)
        line = shlex.join([sys.executable, "-m", self.module, *map(str, argv)])
        self.echo(f"$ {line[:300]}")
        with open(log, "a") as f:
            f.write(f"$ {line}\n# in the bench_serving worker (pid {self.pid}, run {self.runs + 1})\n")
        try:
            self.group.proc.stdin.write((json.dumps({"argv": list(map(str, argv)), "log": str(log),
                                                     "done": str(done)}) + "\n").encode())
            self.group.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass                                    # the worker is gone: said just below
        while not done.exists():
            if not self.group.alive():
                rc = self.group.poll()
                self.stop()
                raise procs.ProcError(f"the bench_serving worker exited (code {rc}) during a run; "
                                      f"its log: {self.log_path}, the run's: {log}")
            if timeout is not None and time.time() - t0 > timeout:
                self.stop()
                raise procs.ProcError(f"bench_serving did not finish within {timeout:.0f} s (worker stopped; "
                                      f"log: {log})")
            time.sleep(0.05)
        self.runs += 1
        self._proc_runs += 1
        rep = json.loads(done.read_text())
        done.unlink(missing_ok=True)
        paid, imp = 0.0, None
        if first and rep.get("ready_at"):           # the import still running when this run was asked for
            paid = round(max(0.0, float(rep["ready_at"]) - t0), 3)
            self.start_s = paid
            if self.started_at is not None:         # spawn -> import done, whether or not a run waited for it
                imp = round(max(0.0, float(rep["ready_at"]) - self.started_at), 3)
        self.last = {"run": self.runs, "wall_s": round(time.time() - t0, 3), "run_s": rep.get("run_s"),
                     "start_s": paid, "import_s": imp}
        return int(rep["rc"])

    def stop(self) -> None:
        if self.group is not None:
            self.group.stop()
            self.group = None
        try:
            atexit.unregister(self._at_exit)
        except Exception:  # noqa: BLE001 - interpreter shutting down
            pass


def run_bench(srv, out_dir, name: str, timeout: float = 900, echo=print, own_process: bool = False,
              **kw) -> dict:
    """Run bench_serving once, in the server's :class:`BenchWorker` (started on first use, stopped with
    the server); returns its result dict + ``_wall_s`` and ``_bench`` (the worker's timing of the run, see
    BenchWorker.run). ``own_process``: as its own ``python -m sglang.benchmark.serving`` instead (the way
    before the worker, for a measured comparison). ``kw`` go to :func:`bench_cmd`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out_file, log = out_dir / f"{name}.jsonl", out_dir / f"{name}.log"
    out_file.unlink(missing_ok=True)
    t0 = time.time()
    if own_process:
        rc = procs.run_tool(bench_cmd(srv, out_file, **kw), log, timeout=timeout, env=tool_env(srv.model_path),
                            echo=echo, name="bench_serving")
        timing = {"run": 0, "wall_s": round(time.time() - t0, 3), "run_s": None, "start_s": None}
    else:
        worker = srv.bench_worker(echo)
        worker.echo = echo
        rc = worker.run(bench_cmd(srv, out_file, **kw)[3:], log, timeout=timeout)
        timing = dict(worker.last)
    if rc != 0 or not out_file.exists():
        lines = [l for l in log.read_text(errors="replace").splitlines() if l.strip()] if log.exists() else []
        raise ServerError(f"bench_serving {name} failed (rc={rc}): {lines[-1][:200] if lines else 'no output'} "
                          f"(log: {log})\n" + "\n".join(lines[-8:]))
    rec = read_bench_jsonl(out_file)[-1]
    rec["_wall_s"] = time.time() - t0
    rec["_bench"] = timing
    return rec


def bench_timing(rec: dict, name: str) -> dict:
    """One row of where a bench_serving run's wall time went: wall_s (here), duration_s (its own
    "Benchmark duration"), start_s (the worker's start this run paid: spawn + import; 0 for the worker's
    later runs, and less than the import for a worker started early with BenchWorker.warm(); None for an own
    process, whose wall includes its start), import_s (the worker's spawn -> import done, on its first run),
    run_s (cli_main in the worker), overhead_s = wall - duration."""
    t = rec.get("_bench") or {}
    wall, dur = rec.get("_wall_s"), rec.get("duration")
    return {"name": name, "how": "own process" if t.get("run") == 0 else "worker", "worker_run": t.get("run"),
            "wall_s": round(wall, 3) if wall is not None else None, "duration_s": dur, "start_s": t.get("start_s"),
            "import_s": t.get("import_s"), "run_s": t.get("run_s"),
            "overhead_s": round(wall - dur, 3) if wall is not None and dur is not None else None}


def latency_summary(results: list[dict]) -> dict:
    """TTFT / ITL / e2e percentiles (ms, common.base.stats.percentiles) and throughput from
    :meth:`Server.generate_many` results."""
    ok = [r for r in results if "error" not in r]
    cl = [r["client"] for r in ok]
    out = {"requests": len(results), "failed": len(results) - len(ok)}
    if not ok:
        return out
    t0, t1 = min(c["t_send"] for c in cl), max(c["t_done"] for c in cl)
    comp = sum((r.get("meta_info") or {}).get("completion_tokens", 0) for r in ok)
    prompt = sum((r.get("meta_info") or {}).get("prompt_tokens", 0) for r in ok)
    cached = sum((r.get("meta_info") or {}).get("cached_tokens", 0) for r in ok)
    out.update(wall_s=t1 - t0, prompt_tokens=prompt, completion_tokens=comp, cached_tokens=cached,
               hit_rate=cached / prompt if prompt else math.nan,
               output_throughput=comp / (t1 - t0) if t1 > t0 else math.nan,
               total_throughput=(comp + prompt) / (t1 - t0) if t1 > t0 else math.nan)
    for key, vals in (("ttft_ms", [c.get("ttft_s") for c in cl]),
                      ("itl_ms", [x for c in cl for x in c.get("itl_s", [])]),
                      ("e2e_ms", [c["e2e_s"] for c in cl])):
        vals = [v * 1e3 for v in vals if v is not None]
        if vals:
            out.update({f"{p}_{key}": v for p, v in stats.percentiles(vals).items()})
    return out


if __name__ == "__main__" and sys.argv[1:2] == ["--bench-worker"]:    # BenchWorker starts this file so
    sys.exit(_bench_worker(sys.argv[2] if len(sys.argv) > 2 else BENCH_MODULE))
