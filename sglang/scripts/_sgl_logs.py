"""What SGLang writes: where a server start goes (its own log time stamps), the scheduler's batch lines,
Prometheus /metrics, and GPU memory by owner from the start-up log. Pure parsers, tested on real output.
Part of _sglang."""
from __future__ import annotations

import datetime as _dt
import math
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from _sgl_facts import ParseError  # noqa: E402


# ================================================================== where a server start goes

_STAMPED = re.compile(r"^\[(?P<time>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:\.(?P<ms>\d{3}))?[^\]\n]*\]")
# (phase, the log line that ends it, what ran between the previous line and this one). A phase whose line
# is missing (a graph phase that is switched off) is merged into the next one found.
START_PHASES = (
    ("imports", None, "launch_server process: python starts, imports sglang.srt.server_args (torch, transformers); "
                      "nothing is logged before"),
    ("server_args", r"server_args=ServerArgs\(", "ServerArgs resolved; the HTTP server, Engine and tokenizer-manager "
                                                 "modules imported"),
    # a server started early under a gate (_sgl_gate): its scheduler's imports, then the wait for the GPU
    ("scheduler_imports", r"hands-on gate: holding", "scheduler process spawned and its imports done (the main "
                          "process builds the tokenizer manager meanwhile)"),
    ("gate", r"hands-on gate: released after", "held by the workbook's gate until the GPU was free for it "
                                                          "(the run's measurements ran meanwhile)"),
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
    if any(k == "gate" for k, *_ in found):      # gated: the scheduler's imports are a phase of their own
        found = [(k, "after the gate: the scheduler process configured" if k == "scheduler_start" else w, i, m)
                 for k, w, i, m in found]
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


def decode_step_ms(rows: list[dict]) -> float:
    """The scheduler's decode step (ms), median over its Decode lines, from SGLang's own clock: with
    --decode-log-interval 1 each line's gen throughput is the tokens of one step (its running requests) over the
    perf_counter time since the previous line, so a step takes running_req / gen_tput. The first line after a
    change of batch size (or a prefill) spans other work and is left out. The lines' time stamps (whole ms) cannot
    resolve a 5 ms step: their mean gap, used before, read 7% above the client's ITL on an H200. NaN: no such line."""
    dec = [r for r in rows if r["kind"] == "decode"]
    per = [1e3 * b["running_req"] / b["gen_tput"] for a, b in zip(dec, dec[1:])
           if a["running_req"] == b["running_req"] and b.get("gen_tput")]
    return statistics.median(per) if per else math.nan


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


_STAGE_LINE = re.compile(r"^sglang:per_stage_req_latency_seconds_(?:sum|count)\{")


def stage_lines(metrics_text: str) -> str:
    """The /metrics lines a request's waterfall needs (per-stage latency sums and counts): what a recording keeps of
    a scrape (request_stamps reads them)."""
    return "\n".join(ln for ln in metrics_text.splitlines() if _STAGE_LINE.match(ln))


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
