"""SGLang 01, part 3b: the decode step against batch size, measured, with the two floors of a decode step beside it
(01_baseline_perf.py runs it after the ITL-vs-KV sweep; --reanalyse reads it back from itl_vs_batch.csv).

The sweep: batch 1 to 256 (BATCHES), at each batch that many requests sent at once as one batched /generate (token
IDs, PROMPT tokens in, NEW out, greedy), not streamed; the scheduler logs every decode step (--decode-log-interval 1) with its running
requests, the KV tokens they hold, whether the step replayed a CUDA graph, and its gen throughput (SGLang's own
clock), so the decode step at that batch is read from the server (_sgl_logs.decode_step_ms), not from a client that
would have to keep up with 256 streams. With --quick the pool is the pipeline's 32,768 tokens: 256 x (64 + 48) =
28,672 tokens fit in it, all admitted at once (two 8192-token prefill chunks), then 47 decode steps at the full batch;
a point takes about a second.

The two floors of a decode step at batch B with K tokens of KV (common.tables.flops.model_work):
  * read floor: the weights (read once a step) and every request's K and V over the measured DRAM read ceiling;
  * compute floor: the step's FLOPs (2 per weight per request, plus attention) over the measured bf16 ceiling.
The step stops being bound by reading the weights where the measured step grows faster than the bytes it reads: the
first batch whose step exceeds batch 1's, scaled by the read floor's growth, by more than LEAVE_TOL.

    batch_sweep(srv, P, run, quick)     the measured rows (itl_vs_batch.csv)
    with_floors(rows, cfg, pk)          each row with its read and compute floors (ms)
    leaves_read_floor(rows)             (batch where the step leaves the read floor's scaling, or None; the ratios)
    batch_figure(rows, pk)              the step against batch size, both floors drawn (itl_vs_batch.png)
    batch_findings(rows, pk)            the sentences the page shows (Run.finding)
    batch_items(rows)                   the story's section
"""
from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sglang as sg  # noqa: E402
from common.base import story  # noqa: E402
from common.capture import ceilings  # noqa: E402
from common.tables import flops  # noqa: E402

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SHAPES = {"quick": dict(prompt=64, new=48), "full": dict(prompt=256, new=128)}
LEAVE_TOL = 0.10     # the step "leaves" the read floor's scaling when it grows 10% more than the bytes it reads


def itl_rows(results, batch: int, prompt_len: int) -> list[dict]:
    """ITL per generated-token index, median over the requests, counted only once every request
    of the batch has its first token (before that the batch is still being prefilled)."""
    ok = [r["client"] for r in results if "error" not in r and r["client"].get("t_first")]
    if not ok:
        return []
    start = max(c["t_first"] for c in ok)
    by_i: dict[int, list] = {}
    for c in ok:
        t = c["t_first"]
        for i, d in enumerate(c["itl_s"], start=1):
            t += d
            if t - d >= start:
                by_i.setdefault(i, []).append(d * 1e3)
    return [{"batch": batch, "prompt_len": prompt_len, "token": i, "kv_tokens": batch * (prompt_len + i),
             "itl_ms": statistics.median(v), "requests": len(v)} for i, v in sorted(by_i.items())]


def point(lines: list[dict], batch: int) -> dict | None:
    """One sweep point from the scheduler's lines: the decode step at the full batch (median, SGLang's clock), the KV
    tokens those steps held (median), how many steps and how many of them replayed a CUDA graph. None: no decode
    line at that batch."""
    dec = [r for r in lines if r["kind"] == "decode" and r.get("running_req") == batch]
    if not dec:
        return None
    step = sg.decode_step_ms(dec)
    return {"batch": batch, "step_ms": step, "kv_tokens": statistics.median(r.get("num_token") or 0 for r in dec),
            "steps": len(dec), "graph_steps": sum(bool(r.get("cuda_graph")) for r in dec),
            "cuda_graph": all(bool(r.get("cuda_graph")) for r in dec)}


def batch_sweep(srv, P, run, quick: bool) -> list[dict]:
    """Each batch of BATCHES (those whose requests fit the pool), P["reps"] times: the decode step from the
    scheduler's lines. A point that fails is a point error; the sweep goes on."""
    shape = SHAPES["quick" if quick else "full"]
    pool = int(srv.server_info().get("max_total_num_tokens") or sg.QUICK_POOL_TOKENS)
    rows = []
    for b in BATCHES:
        if b * (shape["prompt"] + shape["new"]) > pool:
            run.log(f"batch sweep: batch {b} needs {b * (shape['prompt'] + shape['new']):,} tokens, the pool holds "
                    f"{pool:,}: left out")
            continue
        for rep in range(P["reps"]):
            try:
                srv.flush_cache()
                mark = srv.log_mark()
                srv.generate_batch([sg.random_ids(shape["prompt"], 200_000 + 1000 * b + 100 * rep + i) for i in range(b)],
                                   {**sg.GREEDY, "max_new_tokens": shape["new"]})
                got = point(sg.parse_batch_log(srv.log_since(mark)), b)
                if got is None:
                    raise RuntimeError(f"no decode step at batch {b} in the scheduler's lines")
                rows.append({**got, "rep": rep, "prompt": shape["prompt"], "new": shape["new"], "pool": pool})
                run.log(f"batch sweep: batch {b} rep {rep}: decode step {got['step_ms']:.2f} ms, "
                        f"{got['graph_steps']}/{got['steps']} steps replayed a CUDA graph")
            except Exception as e:  # noqa: BLE001 - a point fails, the sweep goes on
                run.point_error({"part": "batch sweep", "batch": b, "rep": rep}, e)
    return rows


def with_floors(rows: list[dict], cfg: dict, pk: dict) -> list[dict]:
    """Each row with the read floor and the compute floor of its decode step (ms): model_work at its batch and KV over
    the measured DRAM read and bf16 ceilings."""
    read, comp = ceilings.kind_ceiling(pk, "read"), pk["bf16_tflops"]
    out = []
    for r in rows:
        b, kv = int(r["batch"]), float(r.get("kv_tokens") or 0)
        w = flops.model_work(cfg, tokens=b, kv_lens=[max(kv / b, 1.0)] * b)
        out.append({**r, "read_ms": w["bytes"] / (read * 1e9), "compute_ms": w["flops"] / (comp * 1e9),
                    "weights_gb": w["weight_bytes"] / 1e9, "kv_gb": w["kv_bytes"] / 1e9})
    return out


def _medians(rows: list[dict]) -> list[dict]:
    """One row per batch: the median step and floors over its repetitions, and whether every step replayed a graph."""
    out = []
    for b in sorted({int(r["batch"]) for r in rows}):
        g = [r for r in rows if int(r["batch"]) == b and r.get("step_ms") == r.get("step_ms")]
        if g:
            out.append({"batch": b, **{k: statistics.median(float(r[k]) for r in g) for k in
                                       ("step_ms", "read_ms", "compute_ms", "kv_tokens")},
                        "cuda_graph": all(bool(r.get("cuda_graph")) for r in g)})
    return out


def leaves_read_floor(rows: list[dict]) -> tuple[int | None, list[dict]]:
    """(the first batch whose median step exceeds batch 1's scaled by the read floor's growth by more than LEAVE_TOL,
    or None when none does; per batch: step / (step at batch 1 x read floor / read floor at batch 1))."""
    med = _medians(rows)
    one = next((m for m in med if m["batch"] == 1), None)
    if one is None:
        return None, []
    ratios = [{"batch": m["batch"], "over_read_scaling": m["step_ms"] / (one["step_ms"] * m["read_ms"] / one["read_ms"])}
              for m in med]
    at = next((r["batch"] for r in ratios if r["over_read_scaling"] > 1 + LEAVE_TOL), None)
    return at, ratios


def batch_figure(rows: list[dict], pk: dict):
    """itl_vs_batch.png: the measured decode step (each repetition; the line through the medians) against batch size,
    the read floor and the compute floor as lines, the batch where the step leaves the read floor's scaling marked;
    a point whose steps did not all replay a CUDA graph is hollow."""
    from common.render import plots
    at, _ = leaves_read_floor(rows)
    return plots.against_floors(
        rows, "batch", "step_ms", {"read floor: weights + KV over the DRAM read ceiling": "read_ms",
                                   "compute floor: FLOPs over the bf16 ceiling": "compute_ms"},
        mark=(f"leaves the read floor's scaling (+{100 * LEAVE_TOL:.0f}%)", at) if at else None,
        hollow_key="cuda_graph", hollow_label="steps without a CUDA graph (above the captured sizes)",
        label="measured decode step",
        xlabel="batch (requests decoding together)", ylabel="decode step = ITL (ms, the scheduler's clock)",
        title=f"Decode step against batch size — {pk.get('gpu', '')}, measured; floors from its measured ceilings")


def batch_findings(rows: list[dict]) -> list[str]:
    """Sentences from the sweep's medians: how the step and the throughput grow, where the step leaves the read
    floor's scaling (or that it does not in the sweep), the floors at the largest batch, the graph coverage."""
    f = story.fmt
    med = _medians(rows)
    if len(med) < 2:
        return []
    a, b = med[0], med[-1]
    out = [f"From batch {a['batch']} to batch {b['batch']} the decode step goes from {f(a['step_ms'])} to "
           f"{f(b['step_ms'])} ms (x{f(b['step_ms'] / a['step_ms'])}) while the tokens per step grow "
           f"x{f(b['batch'] / a['batch'])}: decode throughput x{f(b['batch'] * a['step_ms'] / (a['batch'] * b['step_ms']))}."]
    at, ratios = leaves_read_floor(rows)
    if at is None:
        out.append(f"Up to batch {b['batch']} the step stays within {100 * LEAVE_TOL:.0f}% of batch {a['batch']}'s "
                   f"scaled by the bytes it must read (at most {f(100 * (max(r['over_read_scaling'] for r in ratios) - 1))}"
                   "% above): in this sweep the step stays bound by reading the weights.")
    else:
        r = next(x for x in ratios if x["batch"] == at)
        prev = [x["batch"] for x in ratios if x["batch"] < at]
        out.append(f"The step stops being bound by reading the weights at batch {at}: there it runs "
                   f"{f(100 * (r['over_read_scaling'] - 1))}% above batch {a['batch']}'s step scaled by the bytes it "
                   f"must read" + (f" (up to batch {prev[-1]} within {100 * LEAVE_TOL:.0f}%)" if prev else "") + ".")
    cross = next((m["batch"] for m in med if m["compute_ms"] >= m["read_ms"]), None)
    out.append(f"At batch {b['batch']} the compute floor is {f(b['compute_ms'])} ms and the read floor "
               f"{f(b['read_ms'])} ms: " + (f"the compute floor passes the read floor from batch {cross}" if cross else
                                            f"the compute floor is {f(100 * b['compute_ms'] / b['read_ms'])}% of the "
                                            "read floor, so no swept batch is compute-bound by the floors")
               + f"; the measured step is {f(b['step_ms'] / max(b['read_ms'], b['compute_ms']))}x the larger floor.")
    eager = [m["batch"] for m in med if not m["cuda_graph"]]
    out.append("Every point's decode steps replayed a CUDA graph." if not eager else
               f"Batches {', '.join(map(str, eager))} decoded with eager launches (above the captured graph sizes): "
               "hollow in the figure, their step holds the launches too.")
    return out


def batch_items(rows: list[dict]) -> list:
    """The story's section: one line per batch (median step, floors, graph)."""
    med = _medians(rows)
    if not med:
        return []
    at, ratios = leaves_read_floor(rows)
    over = {r["batch"]: r["over_read_scaling"] for r in ratios}
    f = story.fmt
    return [(f"decode step against batch size (the scheduler's clock, median of the repetitions; floors from the "
             f"measured ceilings){f'; leaves the read floor scaling at batch {at}' if at else ''}", [
        (f"batch {m['batch']:>3}: step {f(m['step_ms'])} ms, read floor {f(m['read_ms'])} ms, compute floor "
         f"{f(m['compute_ms'])} ms, KV {m['kv_tokens']:,.0f} tokens, x{f(over.get(m['batch'], math.nan))} of the "
         f"read scaling{'' if m['cuda_graph'] else ', eager (no CUDA graph)'}", []) for m in med])]
