"""SGLang 08, phase 0: every millisecond of one request, untraced, before any profiler runs -- the TTFT and ITL
waterfalls (common.tables.waterfall), the traced split of the prefill forward and of one decode step, and their
add-up checks (08_execution_story.py conducts).

    waterfall_phase(srv, run, P)   WATERFALL_REPS text and input_ids requests, one at a time, between /metrics scrapes
    waterfalls(data, cfg)          the untraced waterfalls (medians), the traced ones beside them, the splits
    waterfall_text(w)              the story's waterfall block (every line <= 120 characters)
    write_waterfalls(run, w)       waterfall.csv and the checks that can fail, as observations

What is judged and what is not. The TTFT waterfall's parts are differences of consecutive stamps and its total is
their span (the client's send to its first chunk), so they add up by construction: shown, not judged. The traced
split of its prefill forward is built the same way between the request's forward_entry and prefill_finished stamps:
also shown, not judged; what it can get wrong is the two clocks it puts together (SGLang's stamps, the profiler's
trace), so that is judged instead (stamps-clock: the traced GPU forward of each traced repetition lies inside its
stamps' prefill-forward part). The ITL waterfall sets the scheduler's decode step (SGLang's own clock: a Decode
line's gen throughput) against the client's ITL (the client's clock): two clocks, judged within 5%. The split of
one decode step sums the scheduler loop's traced ranges inside one iteration: code outside every range shows up as
the remainder, judged within 5%.
"""
from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sglang as sg  # noqa: E402
from _sgl08_stories import SP, median_traced, step_key, story_events  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.tables import trace  # noqa: E402

H = declare("""
    stamps_clock = stamps-clock: SGLang's stamps and the profiler's clock agree: the traced prefill step's kernels lie
            inside the stamps' prefill-forward part (forward_entry to prefill_finished)
        judged on: the smaller of (the prefill step's first kernel start - forward_entry) and (prefill_finished - its
            last kernel end), ms, per traced repetition (the trace put on the epoch clock by its baseTimeNanoseconds)
        confirmed: >= 0 ms
        source: the waterfall's split reads both clocks on one axis; a negative margin means they disagree
""")


WATERFALL_REPS = 5       # untraced requests of each kind in the waterfall phase (text, input_ids), one at a time


def waterfall_phase(srv, run, P) -> dict:
    """One request at a time, untraced, before any profiler ran: WATERFALL_REPS text prompts (SGLang's tokenizer)
    and as many input_ids prompts (no tokenizer, no cached BOS), each between two /metrics scrapes (its
    request_process stage dates the scheduler's receipt). Returns {"text": [...], "ids": [...]} records."""
    out = {"text": [], "ids": []}
    srv.generate(text=sg.random_text(P["prompt"], 800), sampling_params={**SP, "max_new_tokens": 2})   # the text path once
    for rep in range(max(WATERFALL_REPS, P["reps"])):
        for kind in ("text", "ids"):
            before = sg.stage_lines(srv.get_text("/metrics"))
            kw = ({"text": sg.random_text(P["prompt"], 820 + rep)} if kind == "text" else
                  {"input_ids": sg.random_ids(P["prompt"], 840 + rep)})
            r = srv.generate(stream=True, sampling_params={**SP, "max_new_tokens": P["new"]}, **kw)
            out[kind].append({"result": {"meta_info": r["meta_info"], "client": r["client"]},
                              "metrics_before": before, "metrics_after": sg.stage_lines(srv.get_text("/metrics"))})
    for kind, recs in out.items():
        run.log(f"waterfall {kind}: TTFT " + ", ".join(f"{r['result']['client']['ttft_s'] * 1e3:.1f}" for r in recs)
                + " ms (untraced)")
    return out


def waterfalls(data, cfg) -> dict:
    """The untraced TTFT and ITL waterfalls (medians of the repetitions), the traced ones beside them part by part,
    the prefill stage split on the median traced repetition, one decode step split on the scheduler loop."""
    from common.tables import waterfall
    out, notes = {}, []
    per_kind = {}
    for kind, recs in (data.get("waterfall") or {}).items():
        ws = [sg.ttft_waterfall(r["result"], r["metrics_before"], r["metrics_after"], label=f"{kind} rep {i}")
              for i, r in enumerate(recs)]
        per_kind[kind] = waterfall.median(ws, label=f"untraced {kind}, median of {len(ws)} requests")
    ones = data["traced_one"]
    pick = data.get("pick_one", median_traced(ones))
    splits, margins = {}, []
    for i, t in enumerate(ones):        # every traced repetition: are the two clocks in order around its forward?
        ev, kt = story_events(t["trace"])
        stamps = sg.request_stamps(t["results"][0])
        m = clock_margin_ms(ev, kt, stamps)
        if m is None:
            notes.append(f"traced repetition {i}: no prefill step or no forward_entry / prefill_finished stamp: the "
                         "clocks are not compared")
        else:
            margins.append(m)
        try:
            splits[i] = sg.prefill_split(ev, stamps, layers=cfg["num_hidden_layers"])
        except (trace.TraceError, KeyError, IndexError) as e:
            notes.append(f"traced repetition {i} not split: {str(e).splitlines()[0][:160] if str(e) else e}")
    tr = waterfall.median([sg.ttft_waterfall(t["results"][0], label=f"traced rep {i}", source="traced")
                           for i, t in enumerate(ones)], label=f"traced, median of {len(ones)}")
    split, dec = splits.get(pick), None
    try:
        dec = sg.decode_split(story_events(ones[pick]["trace"])[0])
    except (trace.TraceError, KeyError, IndexError) as e:
        notes.append(f"decode split not possible on traced repetition {pick}: {str(e).splitlines()[0][:160]}")
    u = per_kind.get("text")
    if u is None:
        notes.append("no untraced waterfall in this recording (it predates the waterfall phase): traced parts only")
        u, t = tr, None
    else:
        u, t = waterfall.align(u, tr)
    if split:
        u = waterfall.with_split(u, "prefill forward", split)
    obs = data["observer"]
    med = lambda key, traced: statistics.median(r[key] for r in obs if r["story"] == "one" and r["traced"] == traced)  # noqa: E731
    sk = step_key(obs)
    itl_u = sg.itl_waterfall(med("itl_ms", False), med(sk, False), label="untraced, median of the repetitions",
                             step_from=sk)
    itl_t = sg.itl_waterfall(med("itl_ms", True), med(sk, True), label="traced", source="traced", step_from=sk)
    if dec:
        itl_u = waterfall.with_split(itl_u, "scheduler decode step", dec)
    out.update(ttft=u, ttft_traced=t, ttft_by_kind=per_kind, itl=itl_u, itl_traced=itl_t, split=split, decode=dec,
               pick=pick, clock_margins_ms=margins, picks=[statistics.median([r["client"]["ttft_s"] * 1e3 for r in x["results"] if "error" not in r])
                                 for x in ones], notes=notes)
    return out


def waterfall_text(w: dict) -> list:
    """The story's waterfall block: (label, children) items, every line <= 120 characters."""
    from common.tables import waterfall
    u, t = w["ttft"], w["ttft_traced"]
    src = ("measured untraced: every top-level part (SGLang's own stamps, /metrics, the client's clock); taken from "
           "the traced median repetition: the split of the prefill forward (traced ms, not scaled)" if t is not None else
           "measured traced only (this recording has no untraced waterfall); the split: the traced median repetition")
    kids = [(ln, []) for ln in waterfall.render(u, traced=t, total_name="client TTFT (median)", width=110,
                                                judged=False)]
    kids.append(wrapped(src))
    if w.get("clock_margins_ms"):
        kids.append(wrapped("not judged: the parts are differences of consecutive stamps and the total their span, so "
                            "they add up by construction (the split too); judged instead: the two clocks agree, the "
                            "traced prefill kernels inside the stamps' prefill-forward part by "
                            + ", ".join(f"{m:.2f}" for m in w["clock_margins_ms"]) + " ms at least (each traced "
                            "repetition)"))
    pk = w["ttft_by_kind"]
    if {"text", "ids"} <= set(pk):
        # per-part medians over each kind's requests (the parts shown above are the median repetition's)
        g = {k: {p["name"]: p.get("median_ms", p["ms"]) for p in v["parts"]} for k, v in pk.items()}
        tok = g["text"].get("tokenize + dispatch", math.nan) - g["ids"].get("tokenize + dispatch", math.nan)
        kids.append(wrapped(f"tokenizer: text prompts spend {tok:+.2f} ms more in tokenize + dispatch than input_ids "
                             f"ones (medians, {pk['text']['n']} each)"))
        pf = {k: next((ms for n, ms in v.items() if "prefill forward" in n), math.nan) for k, v in g.items()}
        kids.append(wrapped(f"prefill forward: text {pf['text']:.1f} ms (BOS cached: ragged + paged + merge) vs "
                             f"input_ids {pf['ids']:.1f} ms (nothing cached: ragged only)"))
    pick, picks = w["pick"], w["picks"]
    kids.append((f"traced tree and split: repetition {pick} of {len(picks)} (median TTFT; the repetitions: "
                 + ", ".join(f"{x:.1f}" for x in picks) + " ms)", []))
    items = [("TTFT waterfall — one request, " + (u.get("label") or ""), kids)]
    itl = [(ln, []) for ln in waterfall.render(w["itl"], traced=w["itl_traced"], total_name="client ITL (median)",
                                               width=110)]
    d = w.get("decode")
    if d:
        itl.append(wrapped(f"split: one scheduler iteration of the traced median repetition ({d['iterations']} decode "
                            f"steps); its GPU step {d['gpu_span_ms']:.2f} ms, busy {d['gpu_busy_pct']:.0f}%"))
    items.append(("ITL waterfall — one decode step (client ITL = the scheduler's decode step + delivery)", itl))
    for n in w["notes"]:
        items.append(wrapped(n))
    return items


def wrapped(text: str, width: int = 100):
    """(first line, [continuation lines]) of a long text for story.tree: nothing cut off."""
    import textwrap
    lines = textwrap.wrap(text, width) or [""]
    return (lines[0], [(ln, []) for ln in lines[1:]])


def clock_margin_ms(ev, kt, stamps: dict) -> float | None:
    """How far inside the stamps' prefill-forward part (forward_entry to prefill_finished, SGLang's clock) the traced
    prefill step's kernels lie (the profiler's clock, put on the epoch by the trace's baseTimeNanoseconds), in ms:
    the smaller of the first kernel's start after forward_entry and the last kernel's end before prefill_finished.
    Negative: the two clocks disagree (or a stamp is set before the work it stands for). ``kt``: the trace's step
    kernels (story_events); None without a prefill step or the two stamps."""
    base = ev.attrs.get("base_us")
    ext = kt[kt["mode"] == "EXTEND"] if "mode" in kt else kt.iloc[0:0]
    if base is None or not len(ext) or not {"forward_entry", "prefill_finished"} <= set(stamps):
        return None
    g = ext[ext["step"] == ext["step"].min()]
    a, b = (float(g["ts_us"].min()) + base) / 1e6, (float(g["end_us"].max()) + base) / 1e6
    return 1e3 * min(a - stamps["forward_entry"], stamps["prefill_finished"] - b)


def judge_waterfalls(run, w) -> None:
    """The checks that can fail (see the module's docstring), as observations; the TTFT waterfall and its split add
    up by construction and are not judged (the story says so)."""
    itl = w["itl"]
    run.observe("the client's ITL is the scheduler's decode step: SGLang's step clock (a Decode line's gen throughput) "
                f"and the client's clock agree within 5% ({itl.get('label')})",
                f"step {itl['sum_ms']:.2f} ms vs client ITL {itl['total_ms']:.2f} ms: {itl['remainder_ms']:+.2f} ms "
                f"between them ({itl['remainder_pct']:+.1f}%)" + (f"; negative: {itl['negative']}" if itl["negative"]
                                                                   else ""),
                "confirmed" if itl["ok"] else "refuted", "waterfall.csv")
    sp = (w.get("decode") or {})
    if sp:
        sp = next((p["split"] for p in itl["parts"] if p.get("split")), sp)
        run.observe(f"the scheduler loop's ranges cover its decode iteration: at most 5% of it outside them "
                    f"({sp.get('label')})",
                    f"ranges {sp['sum_ms']:.2f} of {sp['total_ms']:.2f} ms ({sp['remainder_pct']:+.1f}% outside)",
                    "confirmed" if sp["ok"] else "refuted", "waterfall.csv")
    if w.get("clock_margins_ms"):
        run.judge(H["stamps_clock"], w["clock_margins_ms"], evidence="the traced repetitions' prefill splits "
                  "(waterfall.csv: the median one)", detail="ms inside the part: " + ", ".join(
                      f"{m:.2f}" for m in w["clock_margins_ms"]))



def write_waterfalls(run, w) -> None:
    """waterfall.csv (the TTFT and ITL waterfalls, untraced beside traced, and the TTFT one per prompt kind) and the
    add-up checks."""
    from common.tables import waterfall
    rows = waterfall.rows(w["ttft"], traced=w["ttft_traced"], waterfall="ttft")
    rows += waterfall.rows(w["itl"], traced=w["itl_traced"], waterfall="itl")
    for kind, m in w["ttft_by_kind"].items():
        rows += waterfall.rows(m, waterfall=f"ttft_{kind}")
    run.table("waterfall", rows)
    judge_waterfalls(run, w)
