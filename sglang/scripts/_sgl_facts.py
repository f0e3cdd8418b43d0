"""SGLang's facts, the bottom room of the SGLang helper (_sglang.py is its face): the flags a server is started
with and why each differs from SGLang's defaults, the model options every script takes, the errors, and small
helpers (which backend can run, seeded prompts). Nothing here starts a process."""
from __future__ import annotations

import json
import os
import shlex
import sys
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from common.base.checks import SetupError  # noqa: E402
from common.capture import procs  # noqa: E402
from common.capture.models import random_text  # noqa: E402,F401 - re-exported by _sglang
from common.run import cli  # noqa: E402

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
    checked by common.run.cli when parsed: a bad value ends the script before anything starts (exit 2)."""
    from common.capture.models import PRESETS
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
    from common.capture.models import default_dir, write_model_dir
    extra = [f for part in getattr(args, "server_arg", []) or [] for f in part]
    mem = ["--mem-fraction-static", str(args.mem_fraction)]
    if getattr(args, "model_path", None) and preset is None:
        return str(args.model_path), [*mem, *extra]
    model = write_model_dir(preset or args.preset) if write else default_dir(preset or args.preset)
    return str(model), ["--load-format", "dummy", *mem, *extra]


# The serving configuration of the experiments that can share one server (01, 02, 03's FlashInfer variant, 08):
# one function builds it, so that equal settings give equal flags -- and the pipeline's shared server.
SERVING_ENV = dict(TRACE_ENV)                # ms time stamps in the log; torch-profiler traces without stacks/shapes
QUICK_POOL_TOKENS = 32768                    # --quick: --max-total-tokens (02's eviction and 01's pressure load fill it)
# --quick keeps SGLang's own decode CUDA-graph sizes (256 on an 80-141 GB GPU, 36 sizes): 01's decode sweep runs to
# batch 256 and every point replays a graph (a cap of 64 sent the batches above it to eager launches)


def serving_flags(args, *, quick: bool, backend: str | None = "flashinfer", pool: int | None = None,
                  write: bool = True, **extra) -> tuple[str, list[str]]:
    """(model dir, launch_server flags) of the workbook's serving configuration: :func:`model_and_flags`
    (dummy weights or --model-path, --mem-fraction, --server-arg) + the attention backend (None: SGLang's
    own choice), --random-seed 0, metrics and a log line per step. With ``quick`` the KV pool is
    QUICK_POOL_TOKENS tokens (see :func:`changes_from_defaults` for why; the decode CUDA graphs stay SGLang's
    own); ``pool`` sets --max-total-tokens in any mode. ``extra``:
    further :func:`flags` keywords (e.g. schedule_policy="lpm"), appended last."""
    model_dir, base = model_and_flags(args, write=write)
    fl = base + flags(attention_backend=backend, random_seed=0, enable_metrics=True, log_level="info",
                      decode_log_interval=1, max_total_tokens=pool or (QUICK_POOL_TOKENS if quick else None),
                      **extra)
    return model_dir, fl


# why each setting the workbook passes differs from SGLang's default (item 3 of issue #22: nothing --quick
# changes may pass for SGLang's default configuration)
CHANGE_WHY = {
    "--load-format": "dummy weights: the real architecture's shapes, random values, nothing downloaded",
    "--mem-fraction-static": "the workbook's share of GPU memory for weights + KV pool (SGLang derives one from "
                             "the GPU)",
    "--max-total-tokens": "a KV pool of this many tokens, small enough for 02's eviction and 01's pressure load "
                          "to fill (SGLang sizes it from free memory: ~300k+ tokens of Llama-3.1-8B on 80 GB)",
    "--cuda-graph-max-bs-decode": "decode CUDA graphs captured up to this batch size (SGLang: 256 on 80-141 GB "
                                  "GPUs, 36 sizes); a batch above it decodes with eager launches",
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
QUICK_CHANGES = {"--max-total-tokens": str(QUICK_POOL_TOKENS)}


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
    from common.run import cli
    from common.base.checks import require_modules
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
