"""SGLang 01, part 4b: continuous batching under a load that fills the KV pool (01_baseline_perf.py runs it after
its request-rate runs; --reanalyse reads it back from its tables).

The load: one prompt longer than a prefill chunk, then a burst of N prompts of I tokens that each generate O
tokens, all sent at once (sglang.benchmark.serving --request-rate inf, random token IDs, fixed lengths). With
--quick the pool is the pipeline's 32,768 tokens (sg.QUICK_POOL_TOKENS) and SGLang's chunked_prefill_size 8192:
I = 384, O = 192, N = ceil(2 x pool / (I + O)) = 114.
  * offered: 114 x (384 + 192) = 65,664 tokens = 2.0x the pool, all at once: what waits is in tokens, not in
    time, so no GPU is fast enough to keep the queue empty (a rate spreads the arrivals, and a fast GPU finishes
    requests before the next arrive: 200 prompts of 512 / 128 at 50 req/s reached a token usage of 0.40 on an H100);
  * admitted: SGLang's PrefillAdder (managers/schedule_policy.py) takes a request while its prompt + max_new_tokens
    fit beside the running requests' tokens + 0.7 x their remaining output (SGLANG_INIT_NEW_TOKEN_RATIO; it decays
    toward 0.1 while nothing is retracted), at most 8192 new tokens per prefill step: 21 prompts a step, up to
    32,768 / (384 + 0.7 x 192) ~ 63 running (plateau()) -- a captured decode CUDA graph -- the other ~51 queue;
  * those 63 need 63 x (384 + 192) = 36,288 tokens = 1.11x the pool by their last token: the pool is full ~136
    tokens into their 192 (63 x (384 + 136) = 32,760), so SGLang must retract ("KV cache pool is full. Retract
    requests"), whatever the GPU's speed; the margin is the 56 decode steps between the two, not a rate;
  * the long prompt: 10,000 tokens (at least 1.25 chunks), sent first and alone: its first 8192 tokens are one
    prefill step of one sequence (a "chunked prefill" line), before the burst is admitted.
  On an H100 a decode step at batch ~63 takes ~8 ms: two waves of 192 steps, ~3-4 s of load. Without --quick the
  pool is SGLang's own (sized from free memory: ~300k+ tokens of Llama-3.1-8B on 80 GB); N follows it
  (/server_info max_total_num_tokens), with I = 1024, O = 512, a 20,000-token long prompt.

What it records: the scheduler's lines (running, queued, token usage, prefill/decode mix, retractions, the wall
time of each step), GPU memory over time (common.capture.clocks.Sampler's used_gb, every 100 ms) split into the
owners SGLang's start-up log names, the benchmark's headline and /metrics' retractions.

    pressure_run(srv, run, P)        the load on a running server -> the record (steps, mem, run, own)
    record_pressure(run, pr)         pressure_run.csv, pressure_steps.csv, gpu_memory.csv, server_memory.csv
                                     (PRESSURE_TABLES: what --reanalyse reads back)
    write_pressure(run, pr, evs)     gpu_memory_owners.csv, pressure_events.csv, story_pressure.json
    read_pressure(tables, records)   the record back from those tables (None when the recording has none)
    pressure_events(pr, cls, floor)  each change of the scheduler's state as an event, at its step of the load, with
                                     what the GPU did in that step (its kind, batch, KV, wall time and floor)
    pressure_figure(pr)              batch dynamics per step, step wall time, GPU memory by owner
    pressure_items(pr, evs, plat)    the story's pressure section
    top_usage(pr)                    the fullest steps' token usage (retract-at-plateau's premise)
    retractions(pr)                  how many requests SGLang retracted in the load (its lines, else /metrics)
    line_floor_ms(row, cfg, pk)      the floor of the step a scheduler line stands for (no trace: its batch and KV)
    at_plateau(pr, cfg, pk)          the decode steps once the pool is full: batch, KV, step (SGLang's clock), floor

Nothing here may end 01 on a load that went otherwise than planned (it has run on no GPU in this shape yet): a step,
an event or a verdict that did not happen is "not observed", never an exception.
"""
from __future__ import annotations

import math
import sys
import textwrap
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sglang as sg  # noqa: E402
from common.base import story  # noqa: E402
from common.capture import ceilings, clocks  # noqa: E402
from common.tables import flops  # noqa: E402

CHUNK = 8192      # SGLang's default chunked_prefill_size on H100/H200 (a run records /server_info's own)
FILL = 2.0        # tokens offered / the pool's tokens
LONG_NEW = 8      # tokens the long prompt generates: its prefill is the point
NEW_TOKEN_RATIO = 0.7    # SGLANG_INIT_NEW_TOKEN_RATIO: the share of a running request's remaining output PrefillAdder keeps
SHAPES = {"quick": dict(pressure_in=384, pressure_out=192, long_prompt=10000),
          "full": dict(pressure_in=1024, pressure_out=512, long_prompt=20000)}


def load_shape(quick: bool) -> dict:
    """The load's prompt and output lengths and its long prompt (01's QUICK / FULL take them from here, and 08 traces
    a decode step at the batch this shape plateaus at)."""
    return dict(SHAPES["quick" if quick else "full"])


def plateau(pool: int, prompt_in: int, out: int, ratio: float = NEW_TOKEN_RATIO) -> int:
    """The running batch PrefillAdder admits before the pool's budget is spent: pool / (prompt + ratio x output),
    whole requests (32,768 / (384 + 0.7 x 192) = 63 with --quick)."""
    return max(1, int(pool // (prompt_in + ratio * out)))


def burst_size(pool: int, P: dict) -> int:
    """How many prompts offer FILL x the pool's tokens (prompt + output each)."""
    return math.ceil(FILL * pool / (P["pressure_in"] + P["pressure_out"]))


def pressure_run(srv, run, P) -> dict:
    """The long prompt, then the burst, on ``srv`` (its cache flushed first); GPU memory sampled throughout."""
    srv.flush_cache()
    info = srv.server_info()
    pool = int(info.get("max_total_num_tokens") or sg.QUICK_POOL_TOKENS)
    chunk = int(info.get("chunked_prefill_size") or CHUNK)
    n, long_len = burst_size(pool, P), max(P["long_prompt"], chunk + chunk // 4)
    run.log(f"pressure: pool {pool:,} tokens, chunk {chunk}: a {long_len:,}-token prompt, then {n} x "
            f"({P['pressure_in']} in, {P['pressure_out']} out) at once = {n * (P['pressure_in'] + P['pressure_out']):,} "
            "tokens offered")
    m0, mark, t0 = srv.metrics(), srv.log_mark(), time.time()
    with clocks.Sampler(0, period_s=0.1) as mem:              # GPU memory in use, every 100 ms
        long = threading.Thread(target=srv.generate, kwargs=dict(
            input_ids=sg.random_ids(long_len, 77), sampling_params={**sg.GREEDY, "max_new_tokens": LONG_NEW}))
        long.start()
        try:                 # its first chunk is a prefill step of its own before the burst arrives
            srv.wait_log(r"Prefill batch(?: \[\d+\])?, #new-seq: 1, #new-token: \d+", mark, timeout=120, while_alive=long)
        except sg.ServerError as e:
            run.note(f"pressure: the long prompt's first chunk was not seen before the burst ({e})")
        rec = sg.run_bench(srv, run.dir / "bench", "pressure", num_prompts=n, input_len=P["pressure_in"],
                           output_len=P["pressure_out"], rate="inf", echo=run.log)
        long.join()
    rows = sg.parse_batch_log(srv.log_since(mark))
    for a, b in zip(rows, rows[1:]):
        a["step_wall_ms"] = (b["ts"] - a["ts"]) * 1e3
    hm = sg.hit_rate(m0, srv.metrics())
    pr = {"steps": rows, "mem": [(r["t"], r["used_gb"]) for r in mem.rows],
          "own": sg.startup_memory(sg.memory_lines(srv.log_since(0))),
          "run": {"requests": n, "input_len": P["pressure_in"], "output_len": P["pressure_out"], "rate": "inf",
                  "pool_tokens": pool, "chunk": chunk, "long_prompt": long_len,
                  "offered_tokens": n * (P["pressure_in"] + P["pressure_out"]), "wall_s": time.time() - t0,
                  "retracted_requests": hm["retracted_requests"], **sg.bench_headline(rec)}}
    pr["run"].update(summary(pr))
    run.log(f"pressure: {len(rows)} scheduler lines, max usage {pr['run']['max_token_usage']:.2f}, max queue "
            f"{pr['run']['max_queue']}, retractions {pr['run']['retract_lines']} line(s) "
            f"({hm['retracted_requests']:.0f} request(s), /metrics), chunked prefill lines {pr['run']['chunk_lines']}")
    return pr


def summary(pr) -> dict:
    """The run's maxima from its scheduler lines: running, queued, token usage, retraction and chunk lines."""
    rows, chunk = pr["steps"], pr["run"].get("chunk") or CHUNK
    return {"max_running": max((r.get("running_req") or 0 for r in rows), default=0),
            "max_queue": max((r.get("queue_req") or 0 for r in rows), default=0),
            "max_token_usage": max((r.get("token_usage") or 0 for r in rows), default=0),
            "retract_lines": sum(r["kind"] == "retract" for r in rows),
            "retracted_in_log": sum(r.get("retracted") or 0 for r in rows if r["kind"] == "retract"),
            "chunk_lines": sum(1 for r in rows if is_chunk(r, chunk))}


def is_chunk(row, chunk: int = CHUNK) -> bool:
    """A scheduler line that is one chunk of a prompt longer than a prefill chunk: one new request whose new
    tokens fill the whole chunk."""
    return row["kind"] == "prefill" and row.get("new_seq") == 1 and (row.get("new_token") or 0) >= chunk


def top_usage(pr) -> list[float]:
    """The token usage of the fullest 5% of the scheduler's steps (at least 3): what pressure-usage is judged on."""
    use = [r.get("token_usage") or 0 for r in pr["steps"] if r["kind"] in ("prefill", "decode")]
    return sorted(use)[-max(3, len(use) // 20):]


def memory_by_owner(mem, own) -> list[dict]:
    """NVML's used memory over time (``mem``: (epoch s, GB) pairs), split into the owners SGLang's start-up log names
    (``own``: _sgl_logs.startup_memory: weights, KV pool, other pools, CUDA-graph pools) and the rest (CUDA context,
    the allocator's cache, activations: used - the owners)."""
    if not mem:
        return []
    graphs = sum(v for k, v in own.items() if k.startswith("cuda_graph_"))
    fixed = {"weights_gb": own.get("weights_gb"), "kv_pool_gb": own.get("kv_pool_gb"),
             "other_pools_gb": own.get("other_pools_gb"), "cuda_graphs_gb": graphs if own else None}
    known = sum(v for v in fixed.values() if v)
    return [{"t": t, "t_s": t - mem[0][0], "used_gb": v, **fixed, "rest_gb": v - known if own else None} for t, v in mem]


def retractions(pr) -> int | None:
    """Requests SGLang retracted in the load: the scheduler's retract lines (each says how many), else /metrics'
    retracted_requests; None when neither was recorded."""
    r = pr["run"]
    if r.get("retract_lines"):
        return int(r.get("retracted_in_log") or r["retract_lines"])
    m = r.get("retracted_requests")
    return int(m) if isinstance(m, (int, float)) and m == m else (0 if r.get("retract_lines") == 0 else None)


def line_floor_ms(row: dict, cfg: dict | None, pk: dict | None) -> float | None:
    """The floor of the step a scheduler line stands for, from the line alone (the load is not traced): a decode
    line's running requests and the KV they hold (#token), a prefill line's new tokens over its new sequences on top
    of its cached tokens; the step's bytes over the DRAM read ceiling or its FLOPs over the bf16 ceiling, whichever is
    longer (common.tables.flops.model_work, roofline_s). None without a config, ceilings or the line's fields."""
    if not cfg or not pk or not pk.get("bf16_tflops"):
        return None
    read = ceilings.kind_ceiling(pk, "read")
    try:
        if row["kind"] == "decode" and row.get("running_req"):
            b = int(row["running_req"])
            kv = max(float(row.get("num_token") or b) / b, 1.0)
            w = flops.model_work(cfg, tokens=b, kv_lens=[kv] * b)
        elif row["kind"] == "prefill" and row.get("new_seq") and row.get("new_token"):
            n, new = int(row["new_seq"]), int(row["new_token"])
            q = [new // n] * n
            q[-1] += new - sum(q)
            cached = int(row.get("cached_token") or 0) // n
            w = flops.model_work(cfg, tokens=new, kv_lens=[x + cached for x in q], qo_lens=q)
        else:
            return None
    except (TypeError, ValueError, KeyError):
        return None
    return 1e3 * flops.roofline_s(w["bytes"], w["flops"], read, pk["bf16_tflops"])[0]


def _decode_ms(rows: list[dict], j: int) -> float | None:
    """The decode step of line ``j`` by SGLang's clock (running requests over its gen throughput), only when the line
    before it is a decode line of the same batch: after a prefill or a batch change the throughput spans other work
    (as _sgl_logs.decode_step_ms leaves it out)."""
    r = rows[j]
    prev = next((x for x in reversed(rows[:j]) if x["kind"] in ("prefill", "decode")), None)
    if r["kind"] != "decode" or not r.get("gen_tput") or not r.get("running_req") or prev is None or \
            prev["kind"] != "decode" or prev.get("running_req") != r["running_req"]:
        return None
    return 1e3 * r["running_req"] / r["gen_tput"]


def _gpu_text(r: dict, floor_ms: float | None, step_ms: float | None) -> str:
    """What the GPU did in the step a line stands for: its kind, batch, tokens, its floor and, for a decode step, its
    time by SGLang's clock (_decode_ms). The gap between two lines is not a step's time (the overlap scheduler logs
    a step when it schedules it), so it is not shown."""
    fl = f", floor {floor_ms:.2f} ms" if floor_ms else ""
    if r["kind"] == "decode":
        step = f", {step_ms:.2f} ms by SGLang's clock" if step_ms else ""
        return f"a decode step of {r.get('running_req')} requests over {r.get('num_token')} KV tokens{step}{fl}"
    if r["kind"] == "prefill":
        n = r.get("new_seq")
        return f"a prefill step of {r.get('new_token')} new tokens ({n} sequence{'' if n == 1 else 's'}){fl}"
    return "no forward (a retraction line)"


def pressure_events(pr, cls: dict | None = None, floor=None) -> list[dict]:
    """Per scheduler step under pressure, each change of state as an event (t: epoch s, kind, step: the step of the
    load it happened at, counting prefill and decode lines from 1, t_s: seconds since the load's first line, text):
    the queue starts / drains, token usage crosses 0.9, a retraction, a chunk of a long prompt; with what the GPU did
    in that step (a retraction: in the step that follows it) and, with ``floor`` (a row -> ms function: line_floor_ms),
    its floor; with the kernel classes a step of that kind ran (``cls``: {"prefill" | "decode": "gemm 82%, ..."}, from
    the traced steps: the load itself is not traced)."""
    cls, chunk = cls or {}, pr["run"].get("chunk") or CHUNK
    rows = pr["steps"]
    t0 = rows[0]["ts"] if rows else 0.0
    out, q, hot, state, n = [], 0, False, "before the first step", 0
    for i, r in enumerate(rows):
        if r["kind"] in ("prefill", "decode"):
            n += 1
            state = f"running {r.get('running_req')}, queued {r.get('queue_req')}, usage {r.get('token_usage')}"
        kinds = []
        if r["kind"] == "retract":
            kinds.append(("retraction", f"{r.get('retracted')} request(s) retracted, {r.get('gained')} tokens freed"))
        elif is_chunk(r, chunk):
            kinds.append(("chunked prefill", f"one chunk of {r.get('new_token')} tokens of a long prompt"))
        if r["kind"] in ("prefill", "decode"):
            qq = r.get("queue_req") or 0
            if qq and not q:
                kinds.append(("queue starts", "requests wait for KV space or a batch slot"))
            elif q and not qq:
                kinds.append(("queue drains", "every waiting request was admitted"))
            q = qq
            u = r.get("token_usage") or 0
            if u >= 0.9 and not hot:
                kinds.append(("pool full", "token usage crossed 0.9"))
            hot = u >= 0.9 if u >= 0.9 or u < 0.8 else hot
        if not kinds:
            continue
        j = i if r["kind"] != "retract" else next((k for k in range(i + 1, len(rows))
                                                   if rows[k]["kind"] in ("prefill", "decode")), i)
        step_row = rows[j]
        try:
            fl = floor(step_row) if floor else None
        except Exception:  # noqa: BLE001 - a floor that cannot be made is left out, the event stays
            fl = None
        gpu = _gpu_text(step_row, fl, _decode_ms(rows, j))
        k_cls = f"; its kernels: {cls[step_row['kind']]} (traced steps of that kind)" if step_row["kind"] in cls else ""
        step_no = n + (1 if r["kind"] == "retract" else 0)
        for kind, what in kinds:
            out.append({"t": r["ts"], "kind": kind, "step": step_no, "t_s": r["ts"] - t0, "floor_ms": fl, "gpu": gpu,
                        "text": f"{kind} at step {step_no} ({r['ts'] - t0:.2f} s): {what}; scheduler: {state}; the GPU: "
                                f"{gpu}{k_cls}"})
    return out


def at_plateau(pr, cfg: dict | None = None, pk: dict | None = None) -> dict | None:
    """The decode steps of the load once the pool is full (token usage >= 0.9) at their most common batch: that batch,
    the KV tokens they held (median), the step from SGLang's clock (_sgl_logs.decode_step_ms) and its floor
    (line_floor_ms of the median line). None when no decode step ran on a full pool (not observed)."""
    import collections
    import statistics
    full = [r for r in pr["steps"] if r["kind"] == "decode" and (r.get("token_usage") or 0) >= 0.9 and r.get("running_req")]
    if not full:
        return None
    b = collections.Counter(r["running_req"] for r in full).most_common(1)[0][0]
    at = [r for r in full if r["running_req"] == b]
    kv = statistics.median(r.get("num_token") or 0 for r in at)
    step = sg.decode_step_ms(at)
    return {"batch": b, "steps": len(at), "kv_tokens": kv, "step_ms": step,
            "floor_ms": line_floor_ms({"kind": "decode", "running_req": b, "num_token": kv}, cfg, pk)}


PRESSURE_TABLES = ("pressure_run", "pressure_steps", "gpu_memory", "server_memory")


def record_pressure(run, pr) -> None:
    """The record as the tables --reanalyse reads back (PRESSURE_TABLES; read_pressure)."""
    sg.table(run, "pressure_run", [pr["run"]])
    sg.table(run, "pressure_steps", pr["steps"])
    sg.table(run, "gpu_memory", [{"t": t, "t_s": t - pr["mem"][0][0], "used_gb": v} for t, v in pr["mem"]])
    sg.table(run, "server_memory", [pr["own"]] if pr["own"] else [])


def write_pressure(run, pr, evs) -> None:
    """What the analysis makes of the record: memory by owner, the events, and the load as a Perfetto trace
    (story_pressure.json: running, queued, token usage and memory by owner as counter tracks, the events as
    instants)."""
    from common.tables import timeline
    owners = memory_by_owner(pr["mem"], pr["own"])
    sg.table(run, "gpu_memory_owners", owners)
    sg.table(run, "pressure_events", evs)
    steps = [r for r in pr["steps"] if r["kind"] in ("prefill", "decode")]
    if not steps:
        return
    us = lambda t: t * 1e6  # noqa: E731
    tracks = {k: [(us(r["ts"]), r.get(f)) for r in steps] for k, f in (("running", "running_req"), ("queued", "queue_req"),
                                                                       ("token usage", "token_usage"))}
    for k, name in (("used_gb", "GPU memory used (GB)"), ("weights_gb", "weights (GB)"), ("kv_pool_gb", "KV pool (GB)"),
                    ("cuda_graphs_gb", "CUDA-graph pools (GB)"), ("rest_gb", "rest (GB)")):
        if owners and owners[0].get(k) is not None:
            tracks[name] = [(us(m["t"]), m[k]) for m in owners]
    ev, meta = timeline.perfetto_events(None, counters=tracks, marks=[(us(x["t"]), x["kind"], {"what": x["text"]})
                                                                      for x in evs])
    timeline.write_perfetto(run.path("story_pressure.json"), ev, meta)


def read_pressure(tables: dict, records) -> dict | None:
    """The record back from a recording's tables (``records``: the table -> rows reader of 01); None when it has no
    pressure run (a recording made before 01 ran one)."""
    if tables.get("pressure_run") is None or tables.get("pressure_steps") is None:
        return None
    run_row = records(tables["pressure_run"])[0]
    mem = [(r["t"], r["used_gb"]) for r in records(tables.get("gpu_memory"))]
    own = (records(tables.get("server_memory")) or [{}])[0]
    pr = {"run": run_row, "steps": records(tables["pressure_steps"]), "mem": mem, "own": own}
    pr["run"].update(summary(pr))              # read from the scheduler's lines again
    return pr


def pressure_figure(pr):
    """Batch dynamics per scheduler step (running, queued, token usage; every retraction and chunked-prefill mark),
    the wall time per step, and GPU memory by owner (weights, KV pool, other pools, CUDA graphs, the rest). An idle
    gap > 2 s (the benchmark client's own start-up) is cut out of the time axis and said so; nothing is left out."""
    from common.render.plots import _plt
    plt = _plt()
    rows, chunk = pr["steps"], pr["run"].get("chunk") or CHUNK
    owners = memory_by_owner(pr["mem"], pr["own"])
    fig, (a1, a2, a3) = plt.subplots(3, 1, figsize=(9, 7.5), sharex=True)
    steps = [r for r in rows if r["kind"] in ("prefill", "decode")]
    t0 = rows[0]["ts"] if rows else 0.0
    gaps = [(b["ts"] - a["ts"], a["ts"], b["ts"]) for a, b in zip(rows, rows[1:])]
    g = max(gaps) if gaps else (0.0, 0.0, 0.0)
    cut = (g[1] + 0.5, g[2] - 0.5) if g[0] > 2.0 else None        # the idle stretch taken out of the axis

    def x(ts):
        return ts - t0 - (cut[1] - cut[0] if cut and ts >= cut[1] else 0.0)
    t = [x(r["ts"]) for r in steps]
    a1.plot(t, [r.get("running_req") for r in steps], label="running", color="tab:blue")
    a1.plot(t, [r.get("queue_req") for r in steps], label="queued", color="tab:orange")
    n_ret = n_chunk = 0
    for r in rows:
        if r["kind"] == "retract":
            a1.axvline(x(r["ts"]), color="tab:red", lw=0.8)
            n_ret += 1
        elif is_chunk(r, chunk):
            a1.axvline(x(r["ts"]), color="tab:purple", lw=0.8, ls=":")
            n_chunk += 1
    ax = a1.twinx()
    ax.plot(t, [r.get("token_usage") for r in steps], color="tab:green", lw=0.8)
    ax.set_ylabel("token usage", color="tab:green")
    a1.set_ylabel("requests")
    a1.legend(fontsize=7, loc="upper left", title=f"red: {n_ret} retraction(s), purple: {n_chunk} chunked-prefill "
              "line(s)", title_fontsize=7)
    CLIP = 1000.0
    wall = [r.get("step_wall_ms") or 0 for r in steps]
    a2.scatter(t, [min(w, CLIP) for w in wall], s=3, c=["tab:red" if r["kind"] == "prefill" else "tab:blue" for r in steps])
    clipped = [w for w in wall if w > CLIP]
    a2.set_ylabel("step wall time (ms)\nred: prefill")
    if clipped:
        a2.set_title(f"{len(clipped)} step(s) clipped at {CLIP:.0f} ms (largest {max(clipped):,.0f} ms: an idle gap "
                     "before the next step)", fontsize=7)
    for ax_ in (a1, a2, a3):
        if cut:
            ax_.axvline(x(cut[1]), color="black", lw=0.6, ls="--")
    if cut:
        a1.text(x(cut[1]), a1.get_ylim()[1], f" {g[0]:.1f} s idle gap shown as 1 s", fontsize=7, va="top")
    mem = owners or [{"t": m[0], "used_gb": m[1]} for m in pr["mem"] or []]
    if mem:
        tm = [x(m["t"]) for m in mem]
        if mem[0].get("rest_gb") is not None:
            keys = [("weights_gb", "weights"), ("kv_pool_gb", "KV pool"), ("other_pools_gb", "other pools"),
                    ("cuda_graphs_gb", "CUDA-graph pools"), ("rest_gb", "rest (context, cache, activations)")]
            a3.stackplot(tm, *[[m.get(k) or 0 for m in mem] for k, _ in keys], labels=[n for _, n in keys], alpha=0.8)
            a3.legend(fontsize=6, loc="lower right")
        else:
            a3.plot(tm, [m["used_gb"] for m in mem], color="grey", lw=0.8, label="used (no start-up log recorded: no owners)")
            a3.legend(fontsize=6, loc="lower right")
    a3.set_ylabel("GPU memory (GB, NVML)")
    a3.set_xlabel("time since the first scheduler line of the pressure load (s)" + (", idle gap cut out" if cut else ""))
    return fig


def step_classes(classes) -> dict:
    """{"prefill" | "decode": "gemm 82%, attention 6%, norm 3%"}: the top kernel classes of 01's traced steps
    (class_table rows), which pressure_events names for each step of the untraced load."""
    return {kind: ", ".join(f"{r['class']} {r[col]:.0f}%" for r in sorted(classes, key=lambda r: -r[col])[:3])
            for kind, col in (("prefill", "prefill_pct"), ("decode", "decode_pct")) if classes}


def load_text(r) -> str:
    """'114 x (384 in, 192 out) at once' (a run's row of pressure_run.csv; a recording of 08's load: at its rate)."""
    how = "at once" if str(r.get("rate")) == "inf" else f"at {r.get('rate')} req/s"
    return f"{r['requests']} x ({r['input_len']} in, {r['output_len']} out) {how}"


def pressure_items(pr, evs, plateau_row: dict | None = None) -> list:
    """The story's pressure section: the load, what the scheduler did, the decode step on a full pool against its
    floor, the first event of each kind (all of them: pressure_events.csv)."""
    f, r = story.fmt, pr["run"]
    head = (f"pressure: {load_text(r)} after a "
            f"{r['long_prompt']:,}-token prompt, pool {r['pool_tokens']:,} tokens (offered {r['offered_tokens']:,} tokens = "
            f"{r['offered_tokens'] / r['pool_tokens']:.1f}x the pool)")
    metrics = f" (/metrics: {f(r['retracted_requests'])})" if r.get("retracted_requests") is not None else ""
    kids = [(f"max running {r['max_running']}, max queued {r['max_queue']}, max token usage {f(r['max_token_usage'])}, "
             f"retractions {r['retracted_in_log']} in {r['retract_lines']} line(s){metrics}, chunked prefill lines "
             f"{r['chunk_lines']}", [])]
    if plateau_row:
        p = plateau_row
        kids.append((f"on a full pool (usage >= 0.9) the decode step at its most common batch, {p['batch']} requests "
                     f"over {p['kv_tokens']:,.0f} KV tokens: {f(p['step_ms'])} ms (SGLang's clock, {p['steps']} steps)"
                     + (f", floor {f(p['floor_ms'])} ms (weights + KV over the DRAM read ceiling)" if p.get("floor_ms")
                        else ""), []))
    else:
        kids.append(("on a full pool: no decode step observed (the pool never reached 0.9)", []))
    if r.get("median_ttft_ms") is not None:
        kids.append((f"bench_serving: {f(r.get('output_throughput'))} out tok/s, TTFT p50 {f(r['median_ttft_ms'])} / p99 "
                     f"{f(r.get('p99_ttft_ms'))} ms, ITL p50 {f(r.get('median_itl_ms'))} / p99 {f(r.get('p99_itl_ms'))} ms",
                     []))
    first = list({e["kind"]: e for e in reversed(evs)}.values())[::-1]          # the first event of each kind
    for e in sorted(first, key=lambda e: e["t"]):
        lines = textwrap.wrap(e["text"], 100) or [""]
        kids.append((lines[0], [(ln, []) for ln in lines[1:]]))
    if len(evs) > len(first):
        kids.append((f"... {len(evs) - len(first)} more events in pressure_events.csv (instants in story_pressure.json)",
                     []))
    return [(head, kids)]


def pressure_findings(pr, evs, plateau_row: dict | None) -> list[str]:
    """Sentences from the load's own figures: where the pool filled and what followed, the decode step on a full pool
    against its floor."""
    f, out = story.fmt, []
    first = {}
    for e in evs:
        first.setdefault(e["kind"], e)
    full, ret, chunk = first.get("pool full"), first.get("retraction"), first.get("chunked prefill")
    queue = first.get("queue starts")
    n = retractions(pr)
    if chunk:
        out.append(f"The long prompt is prefilled in chunks: its first chunk is step {chunk['step']} of the load, "
                   f"{chunk['gpu']}.")
    else:
        out.append("No chunked prefill was observed in this load (the long prompt's first chunk has no line of its own).")
    if queue:
        out.append(f"Requests start to queue at step {queue['step']} ({f(queue['t_s'])} s into the load): there the GPU "
                   f"runs {queue['gpu']}.")
    if full:
        out.append(f"The pool fills at step {full['step']} ({f(full['t_s'])} s), during {full['gpu']}"
                   + (f"; the first retraction follows at step {ret['step']}, {ret['step'] - full['step']} steps later, "
                      f"before {ret['gpu']}; {n} request(s) are retracted in all" if ret else
                      "; no retraction followed (not observed)") + ".")
    else:
        out.append("The pool never filled in this load (token usage stayed under 0.9): no retraction could follow.")
    p = plateau_row
    if p and p.get("floor_ms") and p.get("step_ms") == p.get("step_ms"):
        out.append(f"On a full pool the decode step of {p['batch']} requests over {p['kv_tokens']:,.0f} KV tokens takes "
                   f"{f(p['step_ms'])} ms against a floor of {f(p['floor_ms'])} ms (its weights and KV over the DRAM read "
                   f"ceiling): {f(100 * p['floor_ms'] / p['step_ms'])}% of the step.")
    return out
