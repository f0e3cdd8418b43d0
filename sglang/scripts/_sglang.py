"""SGLang's own facts for the numbered scripts: its server, its client, its logs, its traces, its flags.

    import _sglang as sg
    with sg.Server(model_dir, sg.flags(load_format="dummy", attention_backend="flashinfer", enable_metrics=True),
                   log_path=run.path("server.log"), echo=run.log) as srv:
        mark = srv.log_mark()
        out = srv.generate(input_ids=ids, sampling_params={"max_new_tokens": 8, "temperature": 0})
        rows = sg.parse_batch_log(srv.log_since(mark))      # "Prefill batch" / "Decode batch" lines
        m = srv.metrics()                                   # /metrics (Prometheus text) -> Metrics
        (tr,), _ = srv.traced(run.dir / "profiles", lambda: srv.generate(...))   # /start_profile .. /stop_profile
        kt, steps = sg.steps(trace.read_chrome_trace(tr))
    # leaving the block -- normally, on an error, on Ctrl-C or SIGTERM -- stops the whole process tree

Server (``python -m sglang.launch_server``) is a common.procs.Group (own session and process group,
the whole tree stopped on exit, error, Ctrl-C, SIGTERM) with what SGLang needs around it:
  * a port from the OS (procs.free_port) unless one is given; a given port already in use is a
    SetupError (one line);
  * a pidfile (default ``$HANDS_ON_CACHE/servers/<script>/<run pid>-<name>.pid``, ``pidfile=False``: none):
    before it starts, every server that a run of any script killed with SIGKILL left behind (its
    pidfile's owner is dead; procs.reap_left over the whole registry) is stopped; servers of runs still
    going are left alone;
  * the environment: NVLink multicast off (procs.nccl_env, the workbook's one policy; --enable-nccl-nvls
    and --enable-symm-mem refused), the /health generation probe off (no 1-token prefills in the
    logs), HF offline for local model dirs;
  * waits for ``/health`` (200) up to ``start_timeout`` while watching the process: if it exits,
    ServerError with the last log lines;
  * with a ``wrapper`` (an ncu or nsys command line) the application inside is signalled first and
    the wrapper given ``wrapper_stop_timeout`` seconds to write its report, then the group is stopped;
  * ``run_bench(srv, ...)`` runs ``sglang.benchmark.serving`` in the server's BenchWorker: one process
    that imports it once and runs each benchmark's ``cli_main()`` (same arguments, output file and log
    as the command line), stopped with the server.

Parsers (pure functions; tests/test_sglang_helpers.py runs them on real H200 output):
  parse_batch_log(text)     scheduler lines -> rows (kind, time, new-seq, new-token, cached-token, token
                            usage, running-req, queue-req, ...); a line that starts like a batch line but
                            does not parse raises ParseError (format drift fails loudly)
  parse_metrics(text)       /metrics -> Metrics: .total(name, **labels), .get, .series, .histogram
  startup_breakdown(log, t_launch)  where a server start went, phase by phase, from the log's own time stamps
                            (imports of each process, weights, KV pool, each CUDA-graph capture, warm-up);
                            Server prints it once it is healthy (``srv.startup_phases``)
  hit_rate(before, after)   prefix-cache hit rate from counter deltas (never the cache_hit_rate gauge)
  read_bench_jsonl(path)    `sglang.benchmark.serving --output-file` -> one dict per run
  parse_step_name(name)     'step[EXTEND bs=1 toks=11]' -> {"mode", "bs", "toks"}
  steps(ev)                 SGLang's forward steps: their kernels (common.trace.step_kernels) and a row per step
  join_steps(steps, rows)   each traced step next to its scheduler log line (matched by sequence)
"""
from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import functools
import json
import math
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
from common import cli, procs, stats, trace  # noqa: E402
from common.checks import SetupError  # noqa: E402

SERVER_ENV = {"PYTHONUNBUFFERED": "1", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false"}
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}   # for local model dirs: never reach the Hub
# requests to the local server never go through an HTTP proxy the environment sets for downloads (with
# http_proxy set, urlopen sent /health to the proxy and a healthy server "never became ready")
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def local_env() -> dict:
    """no_proxy (both spellings) with 127.0.0.1 and localhost added, for the server and the benchmark clients."""
    have = [x.strip() for x in (os.environ.get("no_proxy") or os.environ.get("NO_PROXY") or "").split(",") if x.strip()]
    v = ",".join(dict.fromkeys(have + ["127.0.0.1", "localhost"]))
    return {"no_proxy": v, "NO_PROXY": v}
# per-step log lines with ms time stamps; torch-profiler traces without stacks and shapes (smaller, faster export)
TRACE_ENV = {"SGLANG_LOG_MS": "1", "SGLANG_PROFILE_WITH_STACK": "false", "SGLANG_PROFILE_RECORD_SHAPES": "false"}
SGLANG_PIP = "pip install -r requirements.txt  (sglang==0.5.17)"
GREEDY = {"temperature": 0, "ignore_eos": True}


class ServerError(RuntimeError):
    """The server did not come up, died, or answered an HTTP call with an error."""


class ParseError(ValueError):
    """Server output that cannot be trusted (format drift, truncation, wrong file)."""


# ================================================================== flags and the model options

def flags(**kw) -> list[str]:
    """ServerArgs-style keywords -> CLI flags: flags(tp_size=2, enable_metrics=True) ->
    ['--tp-size', '2', '--enable-metrics']. False/None are left out; lists become several values."""
    out: list[str] = []
    for k, v in kw.items():
        if v is None or v is False:
            continue
        name = "--" + k.replace("_", "-")
        if v is True:
            out.append(name)
        elif isinstance(v, (list, tuple)):
            out += [name, *map(str, v)]
        elif isinstance(v, dict):
            out += [name, json.dumps(v)]
        else:
            out += [name, str(v)]
    return out


def _server_arg(text: str) -> list[str]:
    """--server-arg '--flag value' -> ['--flag', 'value'] (checked at parse time)."""
    import argparse
    try:
        out = shlex.split(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"cannot split {text!r}: {e}") from None
    bad = [a for a in out if a.split("=")[0] in procs.FORBIDDEN_FLAGS]
    if bad and os.environ.get(procs.ALLOW_NVLS) != "1":
        raise argparse.ArgumentTypeError(f"{bad[0]} turns NVLink multicast on; the workbook keeps it off "
                                         f"(set {procs.ALLOW_NVLS}=1 if your machine allows it)")
    return out


def add_model_args(p, backend_default: str | None = "flashinfer", *, preset: bool = True,
                   mem_fraction: float = 0.8, start_timeout: float = 900) -> None:
    """The options every SGLang script takes (model preset or real weights, backend, memory, port), each
    checked by common.cli when parsed: a bad value ends the script before anything starts (exit 2)."""
    from common.models import PRESETS
    g = p.add_argument_group("model and server")
    if preset:
        g.add_argument("--preset", default="llama-3.1-8b", type=cli.preset, metavar="PRESET",
                       help=f"dummy-weight architecture preset, one of {', '.join(sorted(PRESETS))} "
                            "(default llama-3.1-8b; no download)")
        g.add_argument("--model-path", default=None, type=cli.model_dir,
                       help="a local model folder with config.json and real weights (load_format auto)")
    if backend_default is not None:
        g.add_argument("--backend", default=backend_default, choices=("flashinfer", "triton", "fa3"),
                       help=f"attention backend (default {backend_default}; fa3 needs sgl_kernel.flash_attn, "
                            "see 00_check_env)")
    g.add_argument("--mem-fraction", type=cli.fraction, default=mem_fraction,
                   help=f"--mem-fraction-static, in (0, 1] (default {mem_fraction})")
    g.add_argument("--port", type=cli.port, default=None, help="server port (default: a free port chosen by the OS)")
    g.add_argument("--server-arg", action="append", default=[], type=_server_arg, metavar="'--flag value'",
                   help="extra launch_server flags, repeatable (e.g. --server-arg='--page-size 16')")
    g.add_argument("--start-timeout", type=cli.positive_float, default=start_timeout,
                   help=f"seconds to wait for /health (default {start_timeout:g})")


def model_and_flags(args, preset: str | None = None, write: bool = True) -> tuple[str, list[str]]:
    """(model dir, base flags) from :func:`add_model_args` options: a dummy-weight preset (``preset`` or
    --preset) unless --model-path names real weights. Every server runs SGLang's default CUDA-graph
    configuration (prefill and decode graphs captured) unless the experiment adds flags of its own.
    ``write=False``: the preset's folder is named, not written (a plan that starts nothing)."""
    from common.models import default_dir, write_model_dir
    extra = [f for part in getattr(args, "server_arg", []) or [] for f in part]
    mem = ["--mem-fraction-static", str(args.mem_fraction)]
    if getattr(args, "model_path", None) and preset is None:
        return str(args.model_path), [*mem, *extra]
    model = write_model_dir(preset or args.preset) if write else default_dir(preset or args.preset)
    return str(model), ["--load-format", "dummy", *mem, *extra]


# The serving configuration of the experiments that can share one server (01, 02, 03's FlashInfer variant, 08):
# one function builds it, so that equal settings give equal flags -- and the pipeline's shared server.
SERVING_ENV = dict(TRACE_ENV)                # ms time stamps in the log; torch-profiler traces without stacks/shapes
QUICK_POOL_TOKENS = 32768                    # --quick: --max-total-tokens (02's eviction and 08's pressure fill it)
QUICK_DECODE_GRAPH_BS = 64                   # --quick: --cuda-graph-max-bs-decode (SGLang: 256 on an 80-141 GB GPU)


def serving_flags(args, *, quick: bool, backend: str | None = "flashinfer", pool: int | None = None,
                  write: bool = True, **extra) -> tuple[str, list[str]]:
    """(model dir, launch_server flags) of the workbook's serving configuration: :func:`model_and_flags`
    (dummy weights or --model-path, --mem-fraction, --server-arg) + the attention backend (None: SGLang's
    own choice), --random-seed 0, metrics and a log line per step. With ``quick`` the KV pool is
    QUICK_POOL_TOKENS tokens and decode CUDA graphs are captured up to QUICK_DECODE_GRAPH_BS (see
    :func:`changes_from_defaults` for why); ``pool`` sets --max-total-tokens in any mode. ``extra``:
    further :func:`flags` keywords (e.g. schedule_policy="lpm"), appended last."""
    model_dir, base = model_and_flags(args, write=write)
    fl = base + flags(attention_backend=backend, random_seed=0, enable_metrics=True, log_level="info",
                      decode_log_interval=1, max_total_tokens=pool or (QUICK_POOL_TOKENS if quick else None),
                      cuda_graph_max_bs_decode=QUICK_DECODE_GRAPH_BS if quick else None, **extra)
    return model_dir, fl


# why each setting the workbook passes differs from SGLang's default (item 3 of issue #22: nothing --quick
# changes may pass for SGLang's default configuration)
CHANGE_WHY = {
    "--load-format": "dummy weights: the real architecture's shapes, random values, nothing downloaded",
    "--mem-fraction-static": "the workbook's share of GPU memory for weights + KV pool (SGLang derives one from "
                             "the GPU)",
    "--max-total-tokens": "a KV pool of this many tokens, small enough for 02's eviction and 08's pressure runs "
                          "to fill (SGLang sizes it from free memory: ~300k+ tokens of Llama-3.1-8B on 80 GB)",
    "--cuda-graph-max-bs-decode": "decode CUDA graphs captured up to this batch size (SGLang: 256 on 80-141 GB "
                                  "GPUs, 36 sizes, ~4 s of a warm H100 start; here 12 sizes); the --quick "
                                  "workloads decode at most ~51 requests at once, all inside a captured graph",
    "--attention-backend": "the backend under study (SGLang picks FA3 on Hopper where sgl_kernel has it)",
    "--enable-metrics": "observation: /metrics counters (hit rate, evictions, retractions)",
    "--log-level": "observation: the scheduler's per-batch lines",
    "--decode-log-interval": "observation: a log line for every decode step (SGLang: every 40th)",
    "--random-seed": "a fixed sampling seed (SGLang draws one; the greedy requests here do not sample)",
    "--schedule-policy": "the scheduling policy under comparison (SGLang: fcfs)",
    "--json-model-override-args": "the model cut to fewer layers, shapes unchanged",
    "--skip-server-warmup": "no warm-up request at start",
    "SGLANG_LOG_MS": "observation: ms time stamps in the log",
    "SGLANG_PROFILE_WITH_STACK": "smaller, faster torch-profiler traces (no Python stacks)",
    "SGLANG_PROFILE_RECORD_SHAPES": "smaller torch-profiler traces (no tensor shapes)",
    "SGLANG_FLASHINFER_USE_TENSOR_CORE": "FlashInfer's decode kernel on CUDA cores, not tensor cores",
}
QUICK_CHANGES = {"--max-total-tokens": str(QUICK_POOL_TOKENS), "--cuda-graph-max-bs-decode": str(QUICK_DECODE_GRAPH_BS)}


def parse_flags(server_flags) -> dict:
    """launch_server flags -> {flag: value} (True for a switch; a list for several values)."""
    out, cur = {}, None
    for a in map(str, server_flags):
        if a.startswith("--"):
            k, eq, v = a.partition("=")
            out[k], cur = (v if eq else True), (None if eq else k)
        elif cur is not None:
            prev = out[cur]
            out[cur] = a if prev is True else (prev if isinstance(prev, list) else [prev]) + [a]
    return out


def changes_from_defaults(server_flags, env=None, quick: bool = False) -> list[dict]:
    """Every setting of a server that is not SGLang's default, with why: [{setting, value, quick, why}];
    ``quick`` marks what --quick sets (its pool and captured decode sizes) -- the story's first line and
    summary.json carry this list, so no --quick figure passes for SGLang's default configuration."""
    out = []
    for k, v in parse_flags(server_flags).items():
        val = "" if v is True else " ".join(v) if isinstance(v, list) else str(v)
        out.append({"setting": k, "value": val, "quick": bool(quick and QUICK_CHANGES.get(k) == val),
                    "why": CHANGE_WHY.get(k, "an extra flag (--server-arg or the experiment's own)")})
    for k, v in (env or {}).items():
        if k.startswith("SGLANG_"):
            out.append({"setting": k, "value": str(v), "quick": False, "why": CHANGE_WHY.get(k, "an SGLang variable")})
    return out


def config_line(server_flags, env=None, quick: bool = False) -> str:
    """One line for the top of a story: what --quick changed from SGLang's defaults, then the rest."""
    ch = changes_from_defaults(server_flags, env, quick)
    q = [c for c in ch if c["quick"]]
    words = {"--max-total-tokens": "KV pool {} tokens (SGLang: sized from free memory)",
             "--cuda-graph-max-bs-decode": "decode CUDA graphs up to bs {} (SGLang: 256 on 80-141 GB GPUs)"}
    head = ("NOT SGLang's default configuration: --quick sets " + ", ".join(words[c["setting"]].format(c["value"])
                                                                         for c in q) + "; also" if q else
            "SGLang's defaults except")
    rest = [(f"{c['setting']}={c['value']}" if c["setting"].startswith("SGLANG_") else f"{c['setting']} {c['value']}")
            .strip() for c in ch if not c["quick"]]
    return f"{head} {', '.join(rest) or 'nothing'} (each with its reason: summary.json server_config)"


def fa3_usable(timeout: float = 120) -> tuple[bool, str]:
    """Whether SGLang's FA3 backend can run here: `import sgl_kernel.flash_attn` in a child process (the
    module may exist and raise on import, as in a trimmed sgl_kernel; the import also loads torch, so a
    child keeps this process free of CUDA). Returns (usable, the reason in a few words)."""
    import subprocess
    try:
        p = subprocess.run([sys.executable, "-c", "import sgl_kernel.flash_attn"], capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"importing sgl_kernel.flash_attn took over {timeout:.0f} s"
    if p.returncode == 0:
        return True, "sgl_kernel.flash_attn imports"
    last = [l for l in p.stderr.strip().splitlines() if l.strip()]
    return False, (last[-1][:160] if last else f"exit code {p.returncode}")


def graphs_text(server_flags) -> str:
    """Which CUDA graphs a server with ``server_flags`` captures, for the stories."""
    f = set(server_flags)
    pre = "off" if f & {"--disable-prefill-cuda-graph", "--disable-cuda-graph"} else "on"
    dec = "off" if f & {"--disable-decode-cuda-graph", "--disable-cuda-graph"} else "on"
    cap = list(server_flags)
    bs = cap[cap.index("--cuda-graph-max-bs-decode") + 1] if "--cuda-graph-max-bs-decode" in cap else None
    return (f"CUDA graphs: prefill {pre}, decode {dec}" + (f" (decode captured up to bs {bs})" if bs and dec == "on" else "")
            + (" — SGLang's defaults" if pre == dec == "on" else ""))


def model_shape(model_dir) -> dict:
    """layers, q heads, kv heads, head_dim of a model folder's config.json (and the config itself)."""
    c = json.loads((Path(model_dir) / "config.json").read_text())
    return {"layers": c["num_hidden_layers"], "hq": c["num_attention_heads"], "hkv": c["num_key_value_heads"],
            "d": c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"], "config": c}


def require_sglang() -> None:
    """SetupError unless sglang is installed (found without importing it: the import takes ~8 s)."""
    if not sglang_installed():
        raise SetupError(f"Python package 'sglang' is not installed. Install it: {SGLANG_PIP}")


def require_stack(gpus: int | None = 1):
    """What an SGLang experiment needs before a server starts, each missing piece one SetupError line:
    sglang, ``gpus`` visible GPUs (None: the script checks its own TP sizes), pandas and matplotlib.
    Returns pandas."""
    from common import cli
    from common.checks import require_modules
    require_sglang()
    if gpus:
        cli.check_gpus_for(gpus)
    pd, _ = require_modules(("pandas", None), ("matplotlib", None))
    return pd


def sglang_installed() -> bool:
    """True when the real sglang package is importable. The workbook's own ``sglang/`` folder (no
    __init__.py) is a namespace package from the repository root, which does not count."""
    import importlib.util
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin not in (None, "namespace")


def table(run, name: str, rows) -> bool:
    """``run.table(name, rows)`` only when there are rows: an empty CSV has no header for
    `make reports` to read, and the report block then keeps its last content instead."""
    n = len(rows) if rows is not None else 0
    if n:
        run.table(name, rows)
    else:
        run.log(f"table {name}: no rows, not written")
    return bool(n)


def random_ids(n: int, seed: int, lo: int = 1000, hi: int = 120000) -> list[int]:
    """``n`` token ids from a seeded generator, away from special tokens (prompts that share nothing)."""
    import random
    r = random.Random(seed)
    return [r.randrange(lo, hi) for _ in range(n)]


def random_text(n_chars: int, seed: int) -> str:
    """ASCII text of exactly ``n_chars`` characters (= tokens with the presets' byte-level tokenizer)."""
    import random
    r = random.Random(seed)
    words = []
    while sum(len(w) + 1 for w in words) < n_chars:
        words.append("".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(r.randint(2, 9))))
    return " ".join(words)[:n_chars]


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


def _last_stop(owner) -> None:
    """atexit's stop of a Server or BenchWorker whose own stop was cut short (a second Ctrl-C): without a
    word, since the run's log is closed by then (a message there raised, the stop ended before its
    SIGKILL and the server stayed), and without waiting for a third Ctrl-C."""
    quiet = lambda *_: None  # noqa: E731
    bench = getattr(owner, "_bench", None)
    for o in (owner, owner.group, bench, bench and bench.group):
        if o is not None:
            o.echo = quiet
    try:
        owner.stop()
    except KeyboardInterrupt:
        pass


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
        self.port = port if port is not None else procs.free_port(host)
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
        mark, t0 = self.log_mark(), time.time()
        try:
            self.group.start()
        except procs.ProcError as e:
            raise ServerError(str(e)) from None
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
            if self.wrapper and g.alive():
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
    pipeline, in its file of starts (common.pipeline.STARTS_ENV -> server_starts.csv)."""
    from common.pipeline import STARTS_ENV
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
    """The pipeline's shared SGLang server: a common.pipeline service provider, declared in
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
        from common.pipeline import ServiceSkipped
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


# ================================================================== where a server start goes

_STAMPED = re.compile(r"^\[(?P<time>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:\.(?P<ms>\d{3}))?[^\]\n]*\]")
# (phase, the log line that ends it, what ran between the previous line and this one). A phase whose line
# is missing (a graph phase that is switched off) is merged into the next one found.
START_PHASES = (
    ("imports", None, "launch_server process: python starts, imports sglang.srt.server_args (torch, transformers); "
                      "nothing is logged before"),
    ("server_args", r"server_args=ServerArgs\(", "ServerArgs resolved; the HTTP server, Engine and tokenizer-manager "
                                                 "modules imported"),
    ("scheduler_start", r"Init torch distributed begin", "scheduler process spawned, importing "
                        "sglang.srt.managers.scheduler (torch again, the model registry); the main process builds "
                        "the tokenizer manager meanwhile"),
    ("dist_init", r"Init torch distributed ends", "torch.distributed initialised"),
    ("model_setup", r"Load weight begin", "model runner set up (model classes imported)"),
    ("weights", r"Load weight end", "weights loaded"),
    ("kv_pool", r"Memory pool end", "memory profiled, KV pool allocated"),
    ("backend_init", r"Capture target (?:prefill|decode) CUDA graph begin", "attention backend set up"),
    ("prefill_graphs", r"Capture target prefill CUDA graph end", "prefill CUDA graphs captured"),
    ("decode_graphs", r"Capture target decode CUDA graph end", "decode CUDA graphs captured"),
    ("scheduler_ready", r"Engine startup timings", "scheduler ready (radix cache, sampler)"),
    ("warmup", r"The server is fired up and ready to roll", "HTTP server up; its warm-up request (/generate)"),
)
_JIT_FIRST_S = 20.0   # a first graph size slower than this compiled JIT modules (a warm first size takes ~1 s)


def _stamp_ts(m: re.Match, tz) -> float:
    t = _dt.datetime.strptime(m["time"], "%Y-%m-%d %H:%M:%S")
    t = t.replace(tzinfo=tz) if tz is not None else t
    return t.timestamp() + (int(m["ms"]) / 1000 if m["ms"] else 0.0)


def _sizes(line: str, key: str) -> str:
    m = re.search(rf"{key}=\[([\d, ]+)\]", line)
    if not m:
        return ""
    v = [int(x) for x in m.group(1).split(",") if x.strip()]
    what = "token sizes" if key == "num_tokens" else "batch sizes"
    return f"{len(v)} {what} {min(v)}-{max(v)}" if v else ""


def _first_size_s(text: str, label: str) -> float | None:
    """tqdm's seconds for the first captured size (its rate after one item, exact for n = 1)."""
    m = re.search(rf"{label}[^\r\n]*?\|\s*1/\d+ \[[^\]]*?(?:(?P<spi>[\d.]+)s/it|(?P<ips>[\d.]+)it/s)\]", text)
    if not m:
        return None
    return float(m["spi"]) if m["spi"] else 1.0 / float(m["ips"])


def startup_breakdown(log_text: str, t_launch: float, t_ready: float | None = None, tz=None) -> list[dict]:
    """Where a server start went, from the server log's own time stamps (SGLANG_LOG_MS=1 gives ms; lines
    without ms have 1 s resolution and are clamped so that no phase is negative).

    ``t_launch``: epoch seconds when the command was started; ``t_ready``: when /health first answered
    200 (adds a "health" phase). ``tz``: the zone of the log's clock (None: this machine's, as for a
    server started here). Returns one dict per phase found, in order: phase, what, start_s (since
    launch), seconds, note (figures read from the same lines: pool size, graph sizes, a JIT-slow first
    graph size, SGLang's own "Engine startup timings"). [] when the log has no time-stamped line."""
    lines = log_text.split("\n")
    stamped = [(i, m) for i, l in enumerate(lines) for m in [_STAMPED.match(l)] if m]
    if not stamped:
        return []
    found, pos = [], 0
    for key, rx, what in START_PHASES:
        hit = next(((i, m) for i, m in stamped if i >= pos and (rx is None or re.search(rx, lines[i]))), None)
        if hit:
            found.append((key, what, hit[0], hit[1]))
            pos = hit[0]
    text = {k: lines[i] for k, _w, i, _m in found}

    def line_of(rx):
        return next((l for l in lines if re.search(rx, l)), "")
    notes = {}
    if not found[0][3]["ms"]:
        notes["imports"] = "ends at a time stamp of 1 s resolution"
    tmpl = next((_stamp_ts(m, tz) for i, m in stamped if "chat template" in lines[i]), None)
    eng = re.search(r"scheduler_e2e=([\d.]+).*tokenizer_e2e=([\d.]+)", text.get("scheduler_ready", ""))
    sched = []
    if tmpl is not None:
        sched.append(f"tokenizer manager ready at +{tmpl - t_launch:.1f} s")
    if eng:
        sched.append(f"SGLang's own tokenizer_e2e - scheduler_e2e = {float(eng[2]) - float(eng[1]):.1f} s")
    notes["scheduler_start"] = "; ".join(sched)
    w = re.search(r"elapsed=([\d.]+) s.*?mem usage=([\d.]+) GB", text.get("weights", ""))
    fmt_ = re.search(r"load_format='([^']+)'", text.get("server_args", ""))
    notes["weights"] = ", ".join(x for x in ((f"load_format {fmt_[1]}" if fmt_ else ""),
                                              (f"{w[2]} GB in {w[1]} s" if w else "")) if x)
    kv = re.search(r"#tokens: (\d+), K size: ([\d.]+ GB), V size: ([\d.]+ GB)", line_of(r"KV Cache is allocated"))
    notes["kv_pool"] = f"{int(kv[1])} tokens, K {kv[2]} + V {kv[3]}" if kv else ""
    for key, phase, label, size_key in (("prefill_graphs", "prefill", "Capturing num tokens", "num_tokens"),
                                        ("decode_graphs", "decode", "Capturing batches", "bs")):
        begin = line_of(rf"Capture target {phase} CUDA graph begin")
        parts = [x for x in (_sizes(begin, size_key),) if x]
        first = _first_size_s(log_text, label) if begin else None
        if first is not None:
            parts.append(f"first size {first:.2f} s" + (" (JIT compiles on first use)" if first > _JIT_FIRST_S else ""))
        notes[key] = ", ".join(parts)
    if eng:
        m = re.search(r"Engine startup timings \(s\): (.*)$", text["scheduler_ready"])
        notes["scheduler_ready"] = "SGLang: " + re.sub(r", (?:target_verify|draft_\w+)=0\.00", "", m[1]) if m else ""
    fwd = re.search(r"forward_duration=([\d.]+)ms", line_of(r"ReqTimeStats\("))
    if fwd:
        notes["warmup"] = f"its forward took {float(fwd[1]) / 1e3:.2f} s" + (
            " (JIT compiles on first use)" if float(fwd[1]) / 1e3 > _JIT_FIRST_S / 4 else "")
    out, prev = [], t_launch
    for key, what, _i, m in found:
        t = max(_stamp_ts(m, tz), prev)
        out.append({"phase": key, "what": what, "start_s": round(prev - t_launch, 3), "seconds": round(t - prev, 3),
                    "note": notes.get(key, "")})
        prev = t
    if t_ready is not None and t_ready >= prev:
        out.append({"phase": "health", "what": "until /health answered 200 (polled every 0.5 s)",
                    "start_s": round(prev - t_launch, 3), "seconds": round(t_ready - prev, 3), "note": ""})
    return out


def breakdown_lines(phases: list[dict], total_s: float | None = None) -> list[str]:
    """The breakdown as aligned text lines (one per phase), for a log."""
    if not phases:
        return []
    total = total_s if total_s is not None else phases[-1]["start_s"] + phases[-1]["seconds"]
    w = max(len(p["phase"]) for p in phases)
    return [f"  +{p['start_s']:6.1f} s {p['seconds']:7.1f} s {100 * p['seconds'] / total if total else 0:4.0f}%  "
            f"{p['phase']:<{w}}  {p['what']}" + (f" [{p['note']}]" if p["note"] else "") for p in phases]


def breakdown_row(phases: list[dict]) -> dict:
    """One flat row: ``<phase>_s`` for every phase of START_PHASES (+ health; None when absent) and the notes."""
    by = {p["phase"]: p for p in phases}
    row = {f"{k}_s": (round(by[k]["seconds"], 2) if k in by else None) for k, _r, _w in START_PHASES}
    row["health_s"] = round(by["health"]["seconds"], 2) if "health" in by else None
    row["notes"] = "; ".join(f"{k}: {by[k]['note']}" for k in by if by[k]["note"])
    return row


# ================================================================== scheduler log lines

_HDR = (r"\[(?P<time>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:\.(?P<ms>\d{3}))?"
        r"(?:\s+DP(?P<dp>\d+))?(?:\s+TP(?P<tp>\d+))?(?:\s+EP(?P<ep>\d+))?(?:\s+PP(?P<pp>\d+))?\]\s+")
_ITER = r"(?: \[(?P<iter>\d+)\])?"
PREFILL_RE = re.compile(
    _HDR + r"Prefill batch" + _ITER + r", #new-seq: (?P<new_seq>\d+), #new-token: (?P<new_token>\d+), "
    r"#cached-token: (?P<cached_token>\d+), token usage: (?P<token_usage>[0-9.]+), "
    r"#running-req: (?P<running_req>\d+), #queue-req: (?P<queue_req>\d+), "
    r"(?:#pending-token: (?P<pending_token>\d+), )?.*?cuda graph: (?P<cuda_graph>True|False), "
    r"input throughput \(token/s\): (?P<input_tput>[0-9.]+)")
DECODE_RE = re.compile(
    _HDR + r"Decode batch" + _ITER + r", #running-req: (?P<running_req>\d+), #token: (?P<num_token>\d+), "
    r"token usage: (?P<token_usage>[0-9.]+), .*?cuda graph: (?P<cuda_graph>True|False), "
    r"gen throughput \(token/s\): (?P<gen_tput>[0-9.]+), #queue-req: (?P<queue_req>\d+)")
RETRACT_RE = re.compile(
    _HDR + r"KV cache pool is full\. Retract requests\. #retracted_reqs: (?P<retracted>\d+), "
    r"#new_tokens_gained: (?P<gained>-?\d+)(?:, .*?#new_token_ratio: (?P<ratio_before>[0-9.]+) -> (?P<ratio_after>[0-9.]+))?")
_BATCH_START = re.compile(r"\]\s+(?:Prefill|Decode) batch\b")
_INTS = ("iter", "new_seq", "new_token", "cached_token", "running_req", "queue_req", "pending_token", "num_token",
         "retracted", "gained")
_FLOATS = ("token_usage", "input_tput", "gen_tput", "ratio_before", "ratio_after")


def _row(kind: str, m: re.Match, line_no: int) -> dict:
    g = m.groupdict()
    t = _dt.datetime.strptime(g["time"], "%Y-%m-%d %H:%M:%S")
    ts = t.timestamp() + (int(g["ms"]) / 1000 if g.get("ms") else 0.0)
    row = {"kind": kind, "line": line_no, "time": g["time"] + (f".{g['ms']}" if g.get("ms") else ""), "ts": ts,
           "tp": int(g["tp"]) if g.get("tp") else None}
    for k, v in g.items():
        if k in _INTS:
            row[k] = int(v) if v is not None else None
        elif k in _FLOATS:
            row[k] = float(v) if v is not None else None
        elif k == "cuda_graph":
            row[k] = v == "True"
    return row


def parse_batch_log(text: str, strict: bool = True) -> list[dict]:
    """Scheduler "Prefill batch" / "Decode batch" / retraction lines -> rows, in log order.

    Every row: kind (prefill|decode|retract), line (1-based in ``text``), time, ts (epoch s, ms
    resolution with SGLANG_LOG_MS=1), tp. Prefill: new_seq, new_token, cached_token, token_usage,
    running_req, queue_req, pending_token, cuda_graph, input_tput. Decode: running_req, num_token,
    token_usage, cuda_graph, gen_tput, queue_req. Retract: retracted, gained, ratio_before/after.
    With ``strict`` a line that starts like a batch line but does not parse raises ParseError,
    except a last line still being written (no trailing newline).
    """
    if not isinstance(text, str):
        raise ParseError(f"expected log text, got {type(text).__name__}")
    lines = text.split("\n")
    partial_last = not text.endswith("\n")
    rows = []
    for i, line in enumerate(lines, start=1):
        if not line:
            continue
        for kind, rx in (("prefill", PREFILL_RE), ("decode", DECODE_RE), ("retract", RETRACT_RE)):
            m = rx.search(line)
            if m:
                rows.append(_row(kind, m, i))
                break
        else:
            if strict and _BATCH_START.search(line) and not (partial_last and i == len(lines)):
                raise ParseError(f"log line {i} looks like a scheduler batch line but does not parse "
                                 f"(format changed or line cut?): {line[:200]!r}")
    return rows


def is_probe(row: dict) -> bool:
    """A /health generation probe (input_ids=[0]): 1 new sequence, 1 token, nothing cached."""
    return row.get("kind") == "prefill" and row.get("new_seq") == 1 and row.get("new_token") == 1 \
        and row.get("cached_token") == 0


# ================================================================== Prometheus /metrics

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+-?\d+)?$")
_LABEL = re.compile(r'\s*(?P<k>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<v>(?:[^"\\]|\\.)*)"\s*(?:,|$)')


class Metrics:
    """Parsed /metrics samples. Names may be given with or without the ``sglang:`` prefix."""

    def __init__(self, samples: list[tuple[str, dict, float]], types: dict):
        self.samples, self.types = samples, types
        self._by: dict[str, list] = {}
        for n, lab, v in samples:
            self._by.setdefault(n, []).append((lab, v))

    def _name(self, name: str) -> str:
        if name in self._by:
            return name
        if "sglang:" + name in self._by:
            return "sglang:" + name
        return name

    def names(self) -> list[str]:
        return sorted(self._by)

    def has(self, name: str) -> bool:
        return self._name(name) in self._by

    def series(self, name: str) -> list[tuple[dict, float]]:
        return list(self._by.get(self._name(name), []))

    def total(self, name: str, default: float | None = None, **labels) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels`` (all samples by default)."""
        s = self._by.get(self._name(name))
        if s is None:
            if default is not None:
                return default
            raise KeyError(f"metric {name!r} not in /metrics ({len(self._by)} names; was --enable-metrics given?)")
        return float(sum(v for lab, v in s if all(lab.get(k) == str(w) for k, w in labels.items())))

    def get(self, name: str, **labels) -> float:
        """The one sample of ``name`` matching ``labels`` (KeyError when none or several match)."""
        hits = [v for lab, v in self.series(name) if all(lab.get(k) == str(w) for k, w in labels.items())]
        if len(hits) != 1:
            raise KeyError(f"{name} {labels}: {len(hits)} samples match, expected 1")
        return hits[0]

    def histogram(self, name: str, **labels) -> dict:
        """{count, sum, buckets: [(le, cumulative count)]} summed over the other labels."""
        name = name.removesuffix("_bucket")
        base = name if name + "_bucket" in self._by or name.startswith("sglang:") else "sglang:" + name
        buckets: dict[float, float] = {}
        for lab, v in self._by.get(base + "_bucket", []):
            if all(lab.get(k) == str(w) for k, w in labels.items()):
                le = float(lab["le"])
                buckets[le] = buckets.get(le, 0.0) + v
        return {"count": self.total(base + "_count", 0.0, **labels), "sum": self.total(base + "_sum", 0.0, **labels),
                "buckets": sorted(buckets.items())}


def parse_metrics(text: str) -> Metrics:
    """Prometheus text exposition -> :class:`Metrics`; a malformed sample line raises ParseError."""
    samples, types = [], {}
    for i, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            parts = s.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3]
            continue
        m = _SAMPLE.match(s)
        if not m:
            raise ParseError(f"/metrics line {i} is not a Prometheus sample: {s[:160]!r}")
        labels, raw = {}, m.group("labels") or ""
        pos = 0
        while pos < len(raw):
            lm = _LABEL.match(raw, pos)
            if not lm:
                raise ParseError(f"/metrics line {i}: bad label set {{{raw[:120]}}}")
            labels[lm.group("k")] = lm.group("v").replace('\\"', '"').replace("\\\\", "\\")
            pos = lm.end()
        try:
            value = float(m.group("value"))
        except ValueError:
            raise ParseError(f"/metrics line {i}: value {m.group('value')!r} is not a number") from None
        samples.append((m.group("name"), labels, value))
    if not samples:
        raise ParseError("no metric samples in /metrics text (was the server started with --enable-metrics?)")
    return Metrics(samples, types)


def hit_rate(before: Metrics, after: Metrics) -> dict:
    """Prefix-cache hit rate between two scrapes, from the counters (never the cache_hit_rate gauge,
    which every decode report resets to 0): cached/prompt of finished requests (tokenizer side) and
    prefill_cache/(prefill_cache+prefill_compute) (scheduler side)."""
    d = lambda n, **l: after.total(n, 0.0, **l) - before.total(n, 0.0, **l)  # noqa: E731
    cached, prompt = d("cached_tokens_total"), d("prompt_tokens_total")
    pc, pn = d("realtime_tokens_total", mode="prefill_cache"), d("realtime_tokens_total", mode="prefill_compute")
    return {"cached_tokens": cached, "prompt_tokens": prompt,
            "hit_rate_requests": cached / prompt if prompt else math.nan,
            "prefill_cache_tokens": pc, "prefill_compute_tokens": pn,
            "hit_rate_scheduler": pc / (pc + pn) if (pc + pn) else math.nan,
            "evicted_tokens": d("evicted_tokens_total"), "retracted_requests": d("num_retracted_requests_total")}


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


def bench_cmd(srv: Server, out_file, *, num_prompts: int, input_len: int, output_len: int, rate="inf",
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
    from common.results import write_json_atomic
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
    The worker is a common.procs.Group (own process group, stopped with its tree on exit, error,
    Ctrl-C, SIGTERM); a run past its timeout stops the worker (ProcError) and the next run starts a
    new one; a worker that dies is a ProcError with its log's last lines."""

    def __init__(self, env: dict, log_path, *, echo=print, module: str = BENCH_MODULE, python=sys.executable):
        self.env, self.log_path, self.echo, self.module = env, Path(log_path), echo, module
        self.cmd = [python, str(Path(__file__).resolve()), "--bench-worker", module]
        self.group: procs.Group | None = None
        self.runs = 0
        self._at_exit = None
        self.started_at: float | None = None     # when the worker process was spawned (time.time())
        self.start_s: float | None = None        # spawn -> its import done: what every separate process pays
        self.last: dict = {}                     # the timing of the last run (see run())

    @property
    def pid(self) -> int | None:
        return self.group.pid if self.group else None

    def _start(self) -> None:
        self.started_at, self.start_s = time.time(), None
        self.group = procs.Group(self.cmd, self.log_path, env={**os.environ, **self.env}, name="bench_serving worker",
                                 echo=self.echo, stdin_pipe=True).start()
        self._at_exit = functools.partial(_last_stop, self)
        atexit.register(self._at_exit)

    def run(self, argv, log, timeout: float | None = 900) -> int:
        """One benchmark (``argv``: the module's arguments); its exit code. Output appended to ``log``.
        ``self.last``: {run (1 = the worker's first), wall_s (request sent -> done, here), run_s (its
        cli_main in the worker), start_s (the worker's spawn -> import done, paid by this run; 0 after)}."""
        started = self.group is None or not self.group.alive()
        if started:
            self._start()
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
        t0 = time.time()
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
        rep = json.loads(done.read_text())
        done.unlink(missing_ok=True)
        if started and rep.get("ready_at") and self.started_at:
            self.start_s = round(float(rep["ready_at"]) - self.started_at, 3)
        self.last = {"run": self.runs, "wall_s": round(time.time() - (self.started_at if started else t0), 3),
                     "run_s": rep.get("run_s"), "start_s": self.start_s if started else 0.0}
        return int(rep["rc"])

    def stop(self) -> None:
        if self.group is not None:
            self.group.stop()
            self.group = None
        try:
            atexit.unregister(self._at_exit)
        except Exception:  # noqa: BLE001 - interpreter shutting down
            pass


def run_bench(srv: Server, out_dir, name: str, timeout: float = 900, echo=print, own_process: bool = False,
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
    later runs; None for an own process, whose wall includes its start), run_s (cli_main in the worker),
    overhead_s = wall - duration."""
    t = rec.get("_bench") or {}
    wall, dur = rec.get("_wall_s"), rec.get("duration")
    return {"name": name, "how": "own process" if t.get("run") == 0 else "worker", "worker_run": t.get("run"),
            "wall_s": round(wall, 3) if wall is not None else None, "duration_s": dur, "start_s": t.get("start_s"),
            "run_s": t.get("run_s"), "overhead_s": round(wall - dur, 3) if wall is not None and dur is not None else None}


def latency_summary(results: list[dict]) -> dict:
    """TTFT / ITL / e2e percentiles (ms, common.stats.percentiles) and throughput from
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


# ================================================================== traces: steps and their kernels

STEP_RANGE = r"^step\["                       # SGLang's forward-step range: step[EXTEND bs=1 toks=11]
OUTER_RANGE = r"^scheduler\.run_batch$"       # the scheduler range around it (also holds the sampling kernels)
STEP_RE = re.compile(r"^step\[(?P<mode>[A-Z_]+) bs=(?P<bs>\d+)(?: toks=(?P<toks>\d+))?\]$")


def parse_step_name(name: str) -> dict | None:
    """'step[EXTEND bs=1 toks=11]' -> {"mode": "EXTEND", "bs": 1, "toks": 11}; None for other names."""
    m = STEP_RE.match(name or "")
    if not m:
        return None
    return {"mode": m["mode"], "bs": int(m["bs"]), "toks": int(m["toks"]) if m["toks"] else None}


def steps(ev):
    """SGLang's forward steps in a torch-profiler trace: (the kernel table of common.trace.step_kernels, the one
    join: each step's kernels from the ``scheduler.run_batch`` range around its ``step[...]`` range, which also
    holds the sampling kernels; one summary row per step from common.trace.step_summary)."""
    kt = trace.step_kernels(ev, STEP_RANGE, outer=OUTER_RANGE, parse=parse_step_name)
    return kt, trace.step_summary(kt)


def _sig_step(s: dict):
    return ("P", s["bs"], s.get("toks")) if s["mode"] in ("EXTEND", "MIXED") else ("D", s["bs"])


def _sig_row(r: dict):
    return ("P", r["new_seq"], r["new_token"]) if r["kind"] == "prefill" else ("D", r["running_req"])


LOG_FIELDS = ("time", "new_seq", "new_token", "cached_token", "running_req", "queue_req", "token_usage",
              "num_token", "cuda_graph")


def join_steps(steps: list[dict], rows: list[dict], min_match: float = 0.8) -> tuple[list[dict], dict]:
    """Put each traced step next to the scheduler log line of the same forward.

    Traced steps are a contiguous run of the forwards that the log lists in the same order (one
    Prefill line per prefill forward; one Decode line per decode forward when the server runs
    with --decode-log-interval 1). The alignment is the offset at which the signatures
    (EXTEND bs/toks <-> #new-seq/#new-token, DECODE bs <-> #running-req) agree most. Returns
    (steps with log fields added under ``log_*``, {"offset", "matched", "of", "ok"}).
    """
    rows = [r for r in rows if r["kind"] in ("prefill", "decode")]
    st = [_sig_step(s) for s in steps]
    lg = [_sig_row(r) for r in rows]
    best, best_off = -1, None
    for off in range(-len(st) + 1, len(lg)):
        score = sum(1 for i, sig in enumerate(st) if 0 <= off + i < len(lg) and lg[off + i] == sig)
        if score > best:
            best, best_off = score, off
    info = {"offset": best_off, "matched": max(best, 0), "of": len(st),
            "ok": bool(st) and best >= min_match * len(st)}
    joined = []
    for i, s in enumerate(steps):
        j = (best_off or 0) + i
        r = rows[j] if info["ok"] and 0 <= j < len(rows) else {}
        joined.append({**s, "log_match": bool(r) and lg[j] == st[i], **{f"log_{k}": r.get(k) for k in LOG_FIELDS}})
    return joined, info

# ================================================================== a request's own clock: the waterfall's stamps

# SGLang 0.5.17's per-request stamps (epoch seconds) in the order a request meets them, each with the part that
# ends there (common.waterfall builds the parts). Where each one is set:
#   request_received   TokenizerManager: time_stats.set_created_time (tokenizer_manager.py:3480), the FastAPI
#                      handler's first call -> meta_info request_received_ts
#   dispatch_finish    after the ZMQ send to the scheduler (_send_one_request, tokenizer_manager.py:1553) ->
#                      meta_info api_server_dispatch_finish_ts; tokenize_finish_time (:1426) is not exported
#   scheduler_recv     Req built in the scheduler (schedule_batch.py:1109); not exported: wait_queue_entry minus
#                      the request_process stage of /metrics (per_stage_req_latency_seconds{stage=request_process})
#   wait_queue_entry   into the waiting queue (scheduler.py:2637): forward_entry_time - queue_time
#   forward_entry      taken into a batch by get_next_batch_to_run (scheduler.py:3288) -> meta_info forward_entry_time
#   prefill_finished   process_batch_result of the prefill (batch_result_processor.py:264) -> prefill_finished_time
#   response_sent      TokenizerManager yields the first chunk (tokenizer_manager.py:1752) -> response_sent_to_client_ts
#   client_first       the client's own clock when the first chunk arrived (Server.generate)
TTFT_CHAIN = [("client_send", None), ("request_received", "HTTP receive"), ("dispatch_finish", "tokenize + dispatch"),
              ("scheduler_recv", "to the scheduler"), ("wait_queue_entry", "request processing"),
              ("forward_entry", "queue wait"), ("prefill_finished", "prefill forward"),
              ("response_sent", "detokenize + return"), ("client_first", "HTTP stream")]
TTFT_WHAT = {
    "HTTP receive": "client -> uvicorn -> FastAPI -> TokenizerManager (request_received_ts)",
    "tokenize + dispatch": "the tokenizer (text) or the ids as given, then the ZMQ send to the scheduler",
    "to the scheduler": "ZMQ transit and the scheduler loop reaching recv_requests",
    "request processing": "Req built and checked, into the waiting queue (/metrics stage request_process)",
    "queue wait": "until get_next_batch_to_run takes it into a batch (meta_info queue_time)",
    "prefill forward": "batch scheduling, planning, GPU forward, sampling, result (/metrics stage prefill_forward)",
    "detokenize + return": "scheduler -> detokenizer process -> TokenizerManager writes the first chunk",
    "HTTP stream": "the first chunk through uvicorn to the client",
}


def request_stamps(result: dict, metrics_before=None, metrics_after=None) -> dict:
    """The stamps of one streamed /generate (a :meth:`Server.generate` result: ``client`` and the last chunk's
    ``meta_info``) on the epoch clock, with scheduler_recv from the /metrics request_process stage when the two
    scrapes (text or :class:`Metrics`) around this one request are given. Missing stamps are left out."""
    mi, cl = result.get("meta_info") or {}, result.get("client") or {}
    st = {"client_send": cl.get("t_send"), "request_received": mi.get("request_received_ts"),
          "dispatch_finish": mi.get("api_server_dispatch_finish_ts"), "forward_entry": mi.get("forward_entry_time"),
          "prefill_finished": mi.get("prefill_finished_time"), "response_sent": mi.get("response_sent_to_client_ts"),
          "client_first": cl.get("t_first"), "client_done": cl.get("t_done")}
    if st["forward_entry"] and mi.get("queue_time") is not None:
        st["wait_queue_entry"] = st["forward_entry"] - mi["queue_time"]
    rp = stage_delta(metrics_before, metrics_after, "request_process")
    if rp is not None and st.get("wait_queue_entry"):
        st["scheduler_recv"] = st["wait_queue_entry"] - rp
    return {k: float(v) for k, v in st.items() if isinstance(v, (int, float)) and v}


def stage_delta(before, after, stage: str) -> float | None:
    """Seconds one request spent in a /metrics stage (per_stage_req_latency_seconds{stage}) between two scrapes
    taken around it; None unless exactly one observation was added."""
    if before is None or after is None:
        return None
    b = before if isinstance(before, Metrics) else parse_metrics(before)
    a = after if isinstance(after, Metrics) else parse_metrics(after)
    name = "per_stage_req_latency_seconds"
    dn = a.total(name + "_count", 0.0, stage=stage) - b.total(name + "_count", 0.0, stage=stage)
    if dn != 1:
        return None
    return a.total(name + "_sum", 0.0, stage=stage) - b.total(name + "_sum", 0.0, stage=stage)


def ttft_waterfall(result: dict, metrics_before=None, metrics_after=None, label: str = "", source: str = "untraced"):
    """common.waterfall of one request's TTFT from its stamps; total: the client's own TTFT."""
    from common import waterfall
    st = request_stamps(result, metrics_before, metrics_after)
    ttft = (result.get("client") or {}).get("ttft_s")
    return waterfall.build(st, TTFT_CHAIN, total_ms=ttft * 1e3 if ttft else None, label=label, source=source,
                           what=TTFT_WHAT)


_LAUNCH = re.compile(r"^(cudaGraphLaunch|cudaLaunchKernel|cuLaunchKernel|cuLaunchKernelEx|cudaLaunchKernelExC)$")


def _plan_calls(ev, lo: float, hi: float, tid) -> list[tuple]:
    """FlashInfer plan() calls on the scheduler thread between ``lo`` and ``hi`` (trace us): a cudaMemcpyAsync that
    no aten op encloses (plan() copies its host-built schedule to the GPU from C++, after asking the SM count with
    cudaDeviceGetAttribute). Each call: (start = end of the aten op before it, end of its copy)."""
    th = ev[(ev["tid"] == tid) & (ev["ts_us"] >= lo) & (ev["end_us"] <= hi)]
    ops = th[th["kind"] == "cpu_op"]
    out = []
    for m in th[(th["kind"] == "runtime") & (th["name"] == "cudaMemcpyAsync")].itertuples():
        if ((ops["ts_us"] <= m.ts_us) & (ops["end_us"] >= m.end_us)).any():
            continue
        before = ops[ops["end_us"] <= m.ts_us]["end_us"]
        out.append((float(before.max()) if len(before) else float(m.ts_us), float(m.end_us)))
    return out


def prefill_split(ev, stamps: dict, layers: int | None = None) -> dict:
    """The prefill forward stage of one traced request (forward_entry -> prefill_finished) split on the trace,
    as a common.waterfall: batch scheduling (the rest of get_next_batch_to_run), run_batch before the step range,
    forward input prep + attention planning (FlashInfer plan() calls found by _plan_calls), the GPU forward
    (embedding to logits, GPU clock), sampling (the kernels of run_batch after the forward), the overlap scheduler's
    next iteration (it schedules and launches the next step before it reads this result) and result processing
    until prefill_finished_time. ``ev``: common.trace.read_chrome_trace of the traced run (its base_us puts the
    trace on the epoch clock of the stamps); ``stamps``: request_stamps of the traced request."""
    from common import timeline, waterfall
    base = ev.attrs.get("base_us")
    if base is None:
        raise trace.TraceError("the trace has no baseTimeNanoseconds: its clock cannot be put beside the stamps")
    us = lambda s: s * 1e6 - base  # noqa: E731
    sec = lambda u: (u + base) / 1e6  # noqa: E731
    fe, pf = us(stamps["forward_entry"]), us(stamps["prefill_finished"])
    ua = ev[ev["kind"] == "user_annotation"]
    gnb = ua[(ua["name"] == "scheduler.get_next_batch_to_run") & (ua["ts_us"] <= fe) & (ua["end_us"] >= fe)]
    steps = ua[ua["name"].str.match(STEP_RANGE) & (ua["ts_us"] >= fe) & (ua["ts_us"] <= pf)].sort_values("ts_us")
    steps = steps[steps["name"].str.contains("EXTEND")]
    if gnb.empty or steps.empty:
        raise trace.TraceError("the traced request's forward_entry_time falls in no get_next_batch_to_run range, or "
                               "no EXTEND step follows it: was the request traced whole?")
    step = steps.iloc[0]
    rb = ua[(ua["name"] == "scheduler.run_batch") & (ua["ts_us"] <= step["ts_us"]) & (ua["end_us"] >= step["end_us"])]
    pbr = ua[(ua["name"] == "scheduler.process_batch_result") & (ua["ts_us"] >= rb["end_us"].iloc[0])
             & (ua["ts_us"] <= pf)].sort_values("ts_us")
    kt = timeline.layered(trace.step_kernels(ev, STEP_RANGE, outer=OUTER_RANGE, parse=parse_step_name), layers=layers)
    mine = kt[(kt["ts_us"] >= step["ts_us"]) & (kt["step_name"] == step["name"])]
    mine = mine[mine["step"] == mine["step"].min()]
    fwd = mine[(mine["segment"] == "layer") | mine["role"].isin(("embedding", "final_norm", "lm_head"))]
    if fwd.empty:
        fwd = mine
    plans = _plan_calls(ev, float(step["ts_us"]), float(fwd["ts_us"].min()), step["tid"])
    plan_ms = sum(b - a for a, b in plans) / 1e3
    busy = 100 * trace.busy_fraction(fwd.rename(columns={}), float(fwd["ts_us"].min()), float(fwd["end_us"].max()))
    st = {"forward_entry": stamps["forward_entry"], "scheduled": sec(float(gnb["end_us"].iloc[0])),
          "step_start": sec(float(step["ts_us"])), "gpu_forward_start": sec(float(fwd["ts_us"].min())),
          "gpu_forward_end": sec(float(fwd["end_us"].max())), "sampled": sec(float(mine["end_us"].max())),
          "result_start": sec(float(pbr["ts_us"].iloc[0])) if len(pbr) else None,
          "prefill_finished": stamps["prefill_finished"]}
    n_k = len(fwd)
    what = {"batch scheduling": "the rest of get_next_batch_to_run after the request joined the batch",
            "run_batch before the forward": "ScheduleBatch -> ModelWorkerBatch -> ForwardBatch, copies to the GPU",
            "forward prep + attention plan": f"inputs, positions; FlashInfer plan(): {plan_ms:.2f} ms in {len(plans)} "
                                             "call(s)",
            "GPU forward": f"{n_k} kernels, embedding to logits; GPU busy {busy:.0f}% of the span",
            "sampling": "the sampling kernels of run_batch after the forward",
            "overlap: next step first": "the scheduler launches the next step before it reads this result",
            "result processing": "process_batch_result until prefill_finished_time"}
    chain = [("forward_entry", None), ("scheduled", "batch scheduling"), ("step_start", "run_batch before the forward"),
             ("gpu_forward_start", "forward prep + attention plan"), ("gpu_forward_end", "GPU forward"),
             ("sampled", "sampling"), ("result_start", "overlap: next step first"),
             ("prefill_finished", "result processing")]
    wf = waterfall.build(st, chain, label=f"traced {step['name']}", source="traced", what=what)
    wf.update(plan_ms=plan_ms, plan_calls=len(plans), gpu_busy_pct=busy, kernels=n_k,
              kernel_ms=float(fwd["dur_us"].sum()) / 1e3)
    return wf


LOOP_RANGES = ("scheduler.recv_requests", "scheduler.process_input_requests", "scheduler.get_next_batch_to_run",
               "scheduler.run_batch", "scheduler.process_batch_result")
LOOP_WHAT = {"scheduler.recv_requests": "poll the ZMQ socket for new requests",
             "scheduler.process_input_requests": "turn them into Reqs",
             "scheduler.get_next_batch_to_run": "decide the next batch (the running batch grows by a token)",
             "scheduler.run_batch": "ForwardBatch, attention metadata, the decode CUDA-graph launch, sampling launch",
             "scheduler.process_batch_result": "the previous step's result: waits for its copy to the CPU, then "
                                               "appends tokens, sends them to the detokenizer"}


def decode_split(ev, bs: int | None = None) -> dict:
    """One decode step of the traced run, as the scheduler loop spends it (a common.waterfall): the median
    iteration between two consecutive decode run_batch ranges (batch ``bs``, default the largest traced),
    split into the loop's ranges (LOOP_RANGES; copy_result_to_cpu is inside run_batch) and what no range covers
    (the remainder). Also: that step's GPU kernel span, kernel time and GPU busy share."""
    from common import waterfall
    ua = ev[ev["kind"] == "user_annotation"]
    steps = ua[ua["name"].str.match(STEP_RANGE) & ua["name"].str.contains("DECODE")]
    rb = ua[ua["name"] == "scheduler.run_batch"].sort_values("ts_us")
    dec = []
    for r in rb.itertuples():
        inside = steps[(steps["ts_us"] >= r.ts_us) & (steps["end_us"] <= r.end_us) & (steps["tid"] == r.tid)]
        meta = parse_step_name(inside["name"].iloc[0]) if len(inside) else None
        dec.append((r, meta))
    want = bs or max((m["bs"] for _r, m in dec if m), default=None)
    its = [(a, b) for (a, ma), (b, mb) in zip(dec, dec[1:]) if ma and mb and ma["bs"] == mb["bs"] == want]
    if not its:
        raise trace.TraceError("no two consecutive decode steps of one batch size in the trace")
    periods = [b.ts_us - a.ts_us for a, b in its]
    a, b = its[waterfall.median_index(periods)]
    lo, hi = a.ts_us, b.ts_us
    parts = []
    for name in LOOP_RANGES:
        g = ua[(ua["name"] == name) & (ua["tid"] == a.tid) & (ua["ts_us"] >= lo) & (ua["ts_us"] < hi)]
        ms = float((g["end_us"].clip(upper=hi) - g["ts_us"]).sum()) / 1e3
        parts.append({"name": name.removeprefix("scheduler."), "ms": ms, "start": None, "end": None, "from": None,
                      "to": None, "source": "traced", "what": LOOP_WHAT[name], "split": None})
    j = trace.kernels_in_ranges(ev, OUTER_RANGE, empty_rows=False)
    k = j[(j["range_ts_us"] == a.ts_us) & (j["gpu_kind"] == "kernel")]
    span = float(k["end_us"].max() - k["ts_us"].min()) / 1e3 if len(k) else math.nan
    wf = waterfall._finish({"label": f"traced decode step bs {want} (median of {len(its)} iterations)",
                            "total_ms": (hi - lo) / 1e3, "parts": parts, "source": "traced"})
    wf.update(bs=want, iterations=len(its), periods_ms=[p / 1e3 for p in periods], gpu_span_ms=span,
              kernel_ms=float(k["dur_us"].sum()) / 1e3, kernels=int(len(k)),
              gpu_busy_pct=100 * float(k["dur_us"].sum()) / 1e3 / span if span else math.nan)
    return wf


def itl_waterfall(itl_ms: float, step_ms: float, label: str = "", source: str = "untraced") -> dict:
    """A decode step's ITL at the client (median) against the scheduler's decode step (the mean period of its
    Decode lines, --decode-log-interval 1): the step is the one part, the rest is delivery (the remainder)."""
    from common import waterfall
    return waterfall._finish({"label": label, "total_ms": itl_ms, "source": source, "parts": [
        {"name": "scheduler decode step", "ms": step_ms, "start": None, "end": None, "from": None, "to": None,
         "source": source, "what": "mean period of the scheduler's Decode lines (log, ms stamps)", "split": None}]})


# ================================================================== GPU memory by owner (the start-up log)

_GB = r"([0-9.]+) GB"
MEM_LINES = {
    "weights": re.compile(r"Load weight end\..*?avail mem=" + _GB + r", mem usage=" + _GB),
    "kv": re.compile(r"KV Cache is allocated\..*?K size: " + _GB + r", V size: " + _GB),
    "pool_end": re.compile(r"Memory pool end\. avail mem=" + _GB),
    "graph": re.compile(r"Capture (?:target )?(\w+) CUDA graph end\..*?mem usage=" + _GB),
    "weights_begin": re.compile(r"Load weight begin\. avail mem=" + _GB),
}


def startup_memory(log_text: str) -> dict:
    """GPU memory SGLang 0.5.17 says it took at start-up, by owner (GB, from its own log lines): weights ("Load weight
    end ... mem usage"), the KV pool ("KV Cache is allocated ... K size, V size"), the rest of the memory-pool step
    (req_to_token and other pools: avail mem before minus after, minus K and V), each CUDA-graph capture ("Capture ...
    CUDA graph end ... mem usage", prefill and decode). {} when the log has none of them."""
    out: dict = {}
    m = MEM_LINES["weights"].search(log_text)
    if m:
        out["weights_gb"], avail_after_weights = float(m.group(2)), float(m.group(1))
        p = MEM_LINES["pool_end"].search(log_text)
        k = MEM_LINES["kv"].search(log_text)
        if k:
            out["kv_pool_gb"] = float(k.group(1)) + float(k.group(2))
        if p and k:
            out["other_pools_gb"] = max(avail_after_weights - float(p.group(1)) - out["kv_pool_gb"], 0.0)
    b = MEM_LINES["weights_begin"].search(log_text)
    if b:
        out["avail_before_weights_gb"] = float(b.group(1))
    for g in MEM_LINES["graph"].finditer(log_text):
        out[f"cuda_graph_{g.group(1)}_gb"] = out.get(f"cuda_graph_{g.group(1)}_gb", 0.0) + float(g.group(2))
    return out


def memory_lines(log_text: str) -> str:
    """The start-up log lines startup_memory reads (what a recording keeps of server.log for a re-analysis)."""
    keep = [ln for ln in log_text.splitlines() if any(rx.search(ln) for rx in MEM_LINES.values())]
    return "\n".join(keep)


if __name__ == "__main__" and sys.argv[1:2] == ["--bench-worker"]:
    sys.exit(_bench_worker(sys.argv[2] if len(sys.argv) > 2 else BENCH_MODULE))
