"""Every millisecond of one offline generate (08): the stamps of the scheduler's wrapped calls (Forward.clocked) as
common.tables.waterfall parts, TTFT and one decode step; the story's block and the decode add-up verdict."""
from __future__ import annotations

import math
import statistics

from common.tables import waterfall

WATERFALL_REPS = 5


def _first(ev, name, after=-math.inf, info=None):
    return next((e for e in ev if e[0] == name and e[1] >= after and (info is None or info(e[3]))), None)


def waterfall_of(rec: dict) -> dict:
    """The TTFT of one offline generate (Forward.clocked) as a common.tables.waterfall: generate() called -> tokenized
    (receive_msg) -> batch scheduled -> attention metadata -> the prefill launched (CPU; FlashInfer plan() inside)
    -> the overlap loop's next step scheduled and launched first -> waiting for the GPU and the result -> the first
    token handed over (send_result). Stamps: the script's wrappers (mini-SGLang records none)."""
    ev = sorted(rec["events"], key=lambda e: e[1])
    recv = _first(ev, "receive", info=lambda n: n)
    sched = _first(ev, "schedule", recv[2] if recv else -math.inf, info=bool)
    meta = _first(ev, "attention metadata", sched[1]) if sched else None
    fwd = _first(ev, "forward launch", sched[2]) if sched else None
    res = _first(ev, "result", fwd[2] if fwd else -math.inf, info=bool)
    send = _first(ev, "send", res[1] if res else -math.inf, info=lambda n: n)
    st = {"call": rec["call"], "received": recv and recv[2], "meta_start": meta and meta[1], "meta_end": meta and meta[2],
          "scheduled": sched and sched[2], "fwd_start": fwd and fwd[1], "launched": fwd and fwd[2],
          "result_start": res and res[1], "first_token": send and send[1]}
    plan = sum(e[2] - e[1] for e in ev if e[0] == "FlashInfer plan()" and fwd and fwd[1] <= e[1] <= fwd[2]) * 1e3
    tok = sum(e[2] - e[1] for e in ev if e[0] == "tokenize" and recv and e[2] <= recv[2]) * 1e3
    gpu = next((r["gpu_ms"] for r in rec.get("steps") or [] if r["phase"] == "prefill"), math.nan)
    what = {"tokenize": f"receive_msg: the tokenizer {tok:.2f} ms, the loop's entry",
            "batch scheduling": "PrefillManager.schedule_next_batch, pad, allocate pages, positions",
            "attention metadata": "attn_backend.prepare_metadata", "sampler prepare": "the rest of _prepare_batch",
            "prefill launch (CPU)": f"_forward: model forward launched layer by layer, FlashInfer plan() {plan:.2f} ms",
            "overlap: next step first": "the loop's next iteration schedules and launches decode step 1 first",
            "wait for the GPU + result": f"copy_done.synchronize (the prefill's GPU time {gpu:.2f} ms, CUDA events), "
                                         "tokens to the host"}
    chain = [("call", None), ("received", "tokenize"), ("meta_start", "batch scheduling"),
             ("meta_end", "attention metadata"), ("scheduled", "sampler prepare"), ("launched", "prefill launch (CPU)"),
             ("result_start", "overlap: next step first"), ("first_token", "wait for the GPU + result")]
    wf = waterfall.build({k: v for k, v in st.items() if v is not None}, chain, label="offline generate", what=what)
    wf.update(plan_ms=plan, tokenize_ms=tok, prefill_gpu_ms=gpu)
    return wf


def decode_iteration(rec: dict) -> dict:
    """One decode step of the offline engine as its overlap loop spends it: the median period between two handed-over
    tokens (send_result), split into receive_msg, _schedule_next_batch, _forward (launch) and _process_last_data
    (waits for the GPU; send_result inside), the rest unattributed (the loop itself)."""
    ev = sorted(rec["events"], key=lambda e: e[1])
    sends = [e for e in ev if e[0] == "send" and e[3]][1:]             # after the first token
    if len(sends) < 3:
        return {}
    its = list(zip(sends, sends[1:]))
    periods = [b[1] - a[1] for a, b in its]
    a, b = its[waterfall.median_index(periods)]
    parts = []
    for name, label in (("receive", "receive_msg"), ("schedule", "schedule_next_batch"), ("forward launch", "_forward"),
                        ("result", "process_last_data (waits for the GPU)")):
        ms = sum(max(0.0, min(e[2], b[1]) - max(e[1], a[1])) for e in ev if e[0] == name) * 1e3   # clipped to it
        parts.append({"name": label, "ms": ms, "start": None, "end": None, "from": None, "to": None,
                      "source": "untraced", "what": "", "split": None})
    wf = waterfall.finish({"label": f"one decode step (median of {len(its)})", "total_ms": (b[1] - a[1]) * 1e3,
                            "parts": parts, "source": "untraced"})
    gpu = [r["gpu_ms"] for r in rec.get("steps") or [] if r["phase"] == "decode"]
    wf.update(decode_gpu_ms=statistics.median(gpu) if gpu else math.nan)
    return wf


def waterfall_summary(recs: list) -> dict:
    """Medians over the clocked generates: the TTFT waterfall and one decode step."""
    ttft = waterfall.median([waterfall_of(r) for r in recs], label=f"untraced, median of {len(recs)} generates")
    decs = [d for d in (decode_iteration(r) for r in recs) if d]
    dec = waterfall.median(decs, label=f"one decode step, median of {len(decs)} generates") if decs else None
    return {"ttft": ttft, "decode": dec}


WHAT_IT_CANNOT = ("mini-SGLang's offline engine records no time stamps (its only time calls date the radix cache's "
                  "LRU): every stamp here is the script's wrapper around one of its calls; there is no HTTP, no "
                  "detokenizer process and no queue to time (one prompt, offline), and the GPU forward is timed "
                  "with CUDA events, not placed on the CPU clock.")


def waterfall_items(w) -> list:
    """The story's waterfall block (lines <= 120 characters)."""
    if not w:
        return []
    out = [("TTFT waterfall — one generate of the offline engine, " + w["ttft"]["label"],
            [(ln, []) for ln in waterfall.render(w["ttft"], total_name="first token handed over (median)", width=110,
                                                    judged=False)]
            + [(WHAT_IT_CANNOT[i:i + 110], []) for i in range(0, len(WHAT_IT_CANNOT), 110)])]
    if w.get("decode"):
        out.append(("ITL waterfall — " + w["decode"]["label"],
                    [(ln, []) for ln in waterfall.render(w["decode"], total_name="period between tokens", width=110)]))
    return out


def judge_waterfall(run, w) -> None:
    """The decode step's add-up check as an observation (refuted when it does not add up: never printed as fine).
    The TTFT waterfall is not judged: its parts run between consecutive stamps of one clock and its total is their
    span, so every generate adds up by construction (a check that cannot fail); it is shown, not tested."""
    wf = w.get("decode")
    if wf:
        run.observe(f"the decode waterfall of the offline engine adds up within 5% ({wf['label']})",
                    f"parts {wf['sum_ms']:.2f} ms of {wf['total_ms']:.2f} ms ({wf['remainder_pct']:+.1f}% unattributed)",
                    "confirmed" if wf["ok"] else "refuted", "waterfall.csv")


def waterfall_from_rows(df, key: str, label: str) -> dict | None:
    """A waterfall of waterfall.csv again (common.tables.waterfall.rows inverted): its parts, its total (the parts plus the
    unattributed remainder) and its add-up verdict (common.tables.waterfall.finish)."""
    d = df[(df["waterfall"] == key) & (df["level"] == 0)]
    if not len(d):
        return None
    parts = [{"name": r["part"], "ms": r["ms"], "min_ms": r["min_ms"], "max_ms": r["max_ms"], "source": r["source"],
              "what": r["what"] if isinstance(r["what"], str) else "", "start": None, "end": None, "from": None,
              "to": None, "split": None} for r in d.to_dict("records") if r["part"] != "(unattributed)"]
    rest = d[d["part"] == "(unattributed)"]["ms"]
    total = sum(p["ms"] for p in parts) + (float(rest.iloc[0]) if len(rest) else 0.0)
    return waterfall.finish({"label": label, "total_ms": total, "parts": parts, "source": "untraced"})
