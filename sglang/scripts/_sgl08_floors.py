"""SGLang 08, the floor of each step: for the served model on this GPU, the time a step cannot beat beside its traced
time, and where the rest goes (08_execution_story.py conducts; common.tables.flops.step_floor does the arithmetic).

A step's floor is the sum of its kernels' roofline minimums: each kernel's minimum bytes (common.tables.flops: the
weights read once, every request's K and V read once, activations in and out) over the measured DRAM read ceiling,
or its FLOPs over the measured bf16 ceiling, whichever is longer. A decode step at small batch is then the weights
and the KV over the read ceiling; a 512-token prefill its FLOPs over the bf16 ceiling. The step's traced period (its
first kernel to the next step's first kernel) minus the floor splits into what the traces measure: GEMM and
attention kernels below their ceiling, small kernels, the GPU idle between the step's kernels, and the CPU work the
overlap scheduler does not hide (from the step's last kernel to the next step's first).

The steps: the one-request story's prefill (512 tokens) and its median decode step (batch 1), the batch story's median
decode step at its batch, and a decode step at the batch 01's pressure load plateaus at (loaded_window: that many
requests of the load's shape decoding together on this server's pool, a few steps traced).

    loaded_window(srv, P, quick, prof_dir)   the traced window at the loaded batch (phase 1b, on the GPU)
    floor_rows(data, pk)                     one row per step: floor, period, the parts (floors.csv)
    floor_items(rows, data)                  the story's floor section
    floor_findings(rows, data)               the sentences the page shows (Run.finding), from the rows' figures
"""
from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sglang as sg  # noqa: E402
from _sgl01_pressure import load_shape, plateau  # noqa: E402
from _sgl08_stories import SP, spans_by_step  # noqa: E402
from common.base import story  # noqa: E402
from common.tables import timeline  # noqa: E402

LOADED_STEPS = 6       # decode steps traced at the loaded batch


# ------------------------------------------------------------------ phase 1b: a decode step at the loaded batch

def _at_least(lo: int, hi: int) -> str:
    """A regex alternation of the whole numbers lo..hi (the running count a Decode line may show)."""
    return "|".join(str(i) for i in range(max(lo, 1), hi + 1))


def loaded_window(srv, P, quick: bool, prof_dir) -> dict:
    """The batch 01's pressure load plateaus at on this server's pool (_sgl01_pressure.plateau: its admission
    arithmetic), that many requests of the load's shape sent at once, and LOADED_STEPS decode steps traced once they
    all decode. Returns {"trace", "log", "batch", "pool", "prompt", "new"} (the requests then run to their end; the pool
    may fill on the way and SGLang retract: after the traced steps)."""
    info = srv.server_info()
    pool = int(info.get("max_total_num_tokens") or P["pool"])
    shape = load_shape(quick)
    n = plateau(pool, shape["pressure_in"], shape["pressure_out"])
    srv.flush_cache()
    mark = srv.log_mark()
    before = list(Path(prof_dir).glob("*.trace.json*"))
    reqs = [{"input_ids": sg.random_ids(shape["pressure_in"], 90_000 + i),
             "sampling_params": {**SP, "max_new_tokens": shape["pressure_out"]}} for i in range(n)]
    # admission may stop a request or two short of the arithmetic (page and reserve details): trace from n - 3
    srv.while_decoding(reqs, lambda: srv.start_profile(prof_dir, num_steps=LOADED_STEPS), running=_at_least(n - 3, n),
                       timeout=180)
    srv.stop_profile()
    tr = srv.wait_traces(prof_dir, before)[0]
    return {"trace": tr, "log": srv.log_since(mark), "batch": n, "pool": pool, "prompt": shape["pressure_in"],
            "new": shape["pressure_out"]}


# ------------------------------------------------------------------ the floors of the traced steps

def floor_rows(data, pk: dict) -> list[dict]:
    """floors.csv: the one-request prefill and decode, the batch story's decode, the loaded window's decode (each
    where its story has such a step)."""
    rows = []
    for name, mode, label in (("one", "EXTEND", "prefill, one request"), ("one", "DECODE", "decode, one request"),
                              ("batch", "DECODE", "decode, the batch story"),
                              ("loaded", "DECODE", "decode, the pressure load's batch")):
        kt = data.get(f"kt_{name}")
        if kt is None or not len(kt):
            continue
        got = timeline.pick_step(kt, prefill=mode == "EXTEND")
        if got is None:
            continue
        step, per = got
        sp = spans_by_step(kt, data.get(f"spans_{name}")).get(step) or {}
        rows.append({"story": name, **timeline.floor_row(kt, step, per, pk, label, {
            "tokens": sp.get("tokens"), "kv_tokens": sp.get("kv_tokens")})})
    return rows


def floor_items(rows: list[dict], data: dict) -> list:
    """The story's section: one line per step (period, floor and what binds it, the parts), and how the floor is
    made."""
    if not rows:
        return [("floor of each step: no traced step to measure it on", [])]
    kids = []
    for r in rows:
        kv = f", KV {r['kv_tokens']:,.0f} tokens" if r.get("kv_tokens") == r.get("kv_tokens") and r.get("kv_tokens") \
            else ""
        kids.append(timeline.floor_node(r, kv))
    lw = data.get("loaded_info") or {}
    if lw:
        kids.append((f"the pressure load's batch: {lw['batch']} requests of {lw['prompt']} in / {lw['new']} out on a "
                     f"{lw['pool']:,}-token pool (01's admission arithmetic: pool / (in + 0.7 x out))", []))
    elif data.get("loaded_error"):
        kids.append((f"the pressure load's batch: not observed ({data['loaded_error']})", []))
    return [("floor of each step — the time it cannot beat on this GPU: each kernel's minimum bytes over the DRAM read "
             "ceiling or its FLOPs over the bf16 ceiling, whichever is longer, summed; period: the step's first kernel "
             "to the next step's first (traced)", kids)]


def floor_findings(rows: list[dict], data: dict) -> list[str]:
    """A sentence per step from its row: how far above its floor it runs, what binds the floor, the largest part
    of the rest; for decode, how the floor grows from batch 1 to the loaded batch."""
    out = [timeline.floor_sentence(r) for r in rows]
    f = story.fmt
    dec = [r for r in rows if r["mode"] == "DECODE"]
    if len(dec) >= 2 and dec[-1]["bs"] > dec[0]["bs"]:
        a, b = dec[0], dec[-1]
        same = a["bound"] == b["bound"]
        out.append(f"From batch {a['bs']} to batch {b['bs']} (x{f(b['bs'] / a['bs'])} the requests) the decode floor "
                   f"grows x{f(b['floor_ms'] / a['floor_ms'])} ({f(a['floor_ms'])} to {f(b['floor_ms'])} ms, "
                   + (f"{a['bound']}-bound at both" if same else f"{a['bound']}-bound, then {b['bound']}-bound")
                   + f") and the traced period x{f(b['period_ms'] / a['period_ms'])} ({f(a['period_ms'])} to "
                   f"{f(b['period_ms'])} ms).")
    one = untraced_decode_ms(data, "one")
    if dec and one == one:
        out.append(f"Untraced, the one-request decode step reads {f(one)} ms at the client (ITL median), beside its "
                   f"traced period of {f(dec[0]['period_ms'])} ms above.")
    return out


def untraced_decode_ms(data, story_name: str) -> float:
    """The untraced ITL median of a story (observer rows): the decode time no profiler watched."""
    v = [r["itl_ms"] for r in data.get("observer") or [] if r["story"] == story_name and not r["traced"]]
    return statistics.median(v) if v else math.nan
