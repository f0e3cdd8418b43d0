"""Every millisecond of a request: a waterfall of consecutive parts that must add up to what the client measured.

    chain = [("send", None), ("received", "HTTP receive"), ("first", "the rest")]   # stamps in order, part names
    wf = build(stamps, chain, total_ms=ttft_ms, label="rep 0")     # one request: parts between present stamps
    check(wf)                                                       # WaterfallError unless it adds up within 5%
    med = median([wf0, wf1, ...], total_ms=median_ttft)             # the median repetition, spread per part
    med = with_split(med, "prefill forward", sub)                   # a part split further (e.g. from a traced run)
    lines = render(med, traced=traced_med)                          # text lines <= 120 chars, traced/untraced per part
    spans = spans_of(wf)                                            # (part, start_s, end_s) for the Perfetto export

A waterfall is a dict: label, total_ms (what the client measured), parts (list of dicts: name, ms, start, end,
source, what, split), sum_ms, remainder_ms (total - sum: never hidden), remainder_pct, negative (parts < 0:
two clocks that disagree), ok (adds up within ``tol``), tol. Stamps are seconds on one clock (epoch time.time());
a stamp that is missing merges the two parts around it ("A + B") instead of dropping time. Parts between
consecutive stamps add up by construction; what is judged is the median repetition's parts against the total
the client measured, a split measured on another run against its parent, and parts that go negative (clocks
that disagree).

Nothing here knows a serving system: SGLang's stamp names stay in sglang/scripts/_sglang.py, mini-SGLang's in
its 08 script.
"""
from __future__ import annotations

import math
import statistics

TOL = 0.05                 # the parts must add up to the total within 5%
NEG_TOL_MS = 0.05          # a part below -0.05 ms means two clocks disagree


class WaterfallError(ValueError):
    """A waterfall whose parts do not add up to the total (or with a negative part): not to be printed as fine."""


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def finish(wf: dict, tol: float = TOL) -> dict:
    """sum, remainder, negative parts and the verdict of a waterfall (in place; returns it)."""
    parts = [p for p in wf["parts"] if _num(p.get("ms"))]
    s = sum(p["ms"] for p in parts)
    total = wf.get("total_ms")
    wf["sum_ms"] = s
    wf["remainder_ms"] = (total - s) if _num(total) else math.nan
    wf["remainder_pct"] = 100 * wf["remainder_ms"] / total if _num(total) and total else math.nan
    wf["negative"] = [p["name"] for p in parts if p["ms"] < -NEG_TOL_MS]
    wf["tol"] = tol
    wf["ok"] = bool(_num(total) and total > 0 and abs(wf["remainder_ms"]) <= tol * total and not wf["negative"])
    return wf


def build(stamps: dict, chain: list, total_ms: float | None = None, label: str = "", source: str = "untraced",
          what: dict | None = None, tol: float = TOL) -> dict:
    """One request's waterfall from its stamps (seconds on one clock).

    ``chain``: [(stamp key, name of the part that ENDS at this stamp), ...] in time order; the first entry's
    name is ignored. A part runs from the previous present stamp to its own; a missing stamp merges its part
    into the next one ("A + B"). ``total_ms``: what the client measured (default: last - first stamp).
    ``what``: {part name: what happens there} for the text.
    """
    what = what or {}
    parts, prev, pending = [], None, []
    for key, name in chain:
        t = stamps.get(key)
        if not _num(t):
            if prev is not None and name:
                pending.append(name)
            continue
        if prev is not None:
            names = pending + [name]
            nm = " + ".join(names)
            parts.append({"name": nm, "ms": (t - prev[1]) * 1e3, "start": prev[1], "end": t, "from": prev[0],
                          "to": key, "source": source, "what": "; ".join(what[n] for n in names if what.get(n)),
                          "split": None})
        prev, pending = (key, t), []
    first = next((stamps.get(k) for k, _ in chain if _num(stamps.get(k))), None)
    last = prev[1] if prev else None
    if total_ms is None and first is not None and last is not None:
        total_ms = (last - first) * 1e3
    return finish({"label": label, "total_ms": total_ms, "parts": parts, "source": source}, tol)


def check(wf: dict, tol: float | None = None, what: str = "waterfall") -> dict:
    """``wf`` when its parts add up to its total within ``tol`` and none is negative; WaterfallError otherwise."""
    wf = finish(dict(wf), wf.get("tol", TOL) if tol is None else tol)
    if not wf["ok"]:
        why = []
        if not _num(wf.get("total_ms")) or not wf["total_ms"] > 0:
            why.append(f"no total to add up to ({wf.get('total_ms')})")
        elif abs(wf["remainder_ms"]) > wf["tol"] * wf["total_ms"]:
            why.append(f"the parts sum to {wf['sum_ms']:.2f} ms, the total is {wf['total_ms']:.2f} ms: "
                       f"{wf['remainder_ms']:+.2f} ms ({wf['remainder_pct']:+.1f}%) unattributed, more than "
                       f"{100 * wf['tol']:.0f}%")
        if wf["negative"]:
            why.append("negative parts (clocks that disagree): " + ", ".join(wf["negative"]))
        raise WaterfallError(f"{what} {wf.get('label') or ''} does not add up: " + "; ".join(why))
    return wf


def median(wfs: list[dict], total_ms: float | None = None, label: str = "median", tol: float = TOL) -> dict:
    """The median repetition (the one whose total is the median; the lower middle for an even count) part by
    part, each part with its spread over the repetitions (``median_ms``, ``min_ms``, ``max_ms``: parts matched by
    name). Its parts are one real request's, so they add up as that request did; per-part medians would not: the
    sum of medians is not the median of sums, and a part with a wide spread (a first launch of 22-40 ms) makes
    them differ by more than the tolerance with nothing unattributed in any repetition. ``total_ms``: the median
    the client measured (default: the median repetition's own total); the remainder says what is left over."""
    wfs = [w for w in wfs if w and w.get("parts")]
    if not wfs:
        return finish({"label": label, "total_ms": total_ms, "parts": [], "n": 0, "median_rep": None}, tol)
    totals = [w["total_ms"] for w in wfs if _num(w.get("total_ms"))]
    order = sorted(range(len(wfs)), key=lambda i: wfs[i]["total_ms"] if _num(wfs[i].get("total_ms")) else math.inf)
    mid = order[(len(totals) - 1) // 2] if totals else 0
    parts = []
    for ref in wfs[mid]["parts"]:
        vals = [p["ms"] for w in wfs for p in w["parts"] if p["name"] == ref["name"] and _num(p.get("ms"))]
        parts.append({**{k: ref.get(k) for k in ("name", "from", "to", "source", "what")}, "ms": ref.get("ms"),
                      "median_ms": statistics.median(vals) if vals else math.nan, "min_ms": min(vals, default=math.nan),
                      "max_ms": max(vals, default=math.nan), "n": len(vals), "start": None, "end": None, "split": None})
    tot = total_ms if total_ms is not None else wfs[mid].get("total_ms", math.nan)
    return finish({"label": label, "total_ms": tot, "parts": parts, "n": len(wfs), "median_rep": mid if totals else None,
                    "median_rep_label": wfs[mid].get("label") if totals else None,
                    "totals_ms": totals, "source": wfs[0].get("source")}, tol)


def median_index(values: list) -> int | None:
    """Index of the median of ``values`` (the lower middle for an even count; None values last)."""
    ok = [i for i, v in enumerate(values) if _num(v)]
    if not ok:
        return None
    order = sorted(ok, key=lambda i: values[i])
    return order[(len(order) - 1) // 2]


def with_split(wf: dict, part: str, sub: dict, tol: float = TOL) -> dict:
    """``wf`` with part ``part`` (a name, or the first part whose name contains it) split into the parts of
    ``sub`` (another waterfall, e.g. measured on a traced run). ``sub`` is checked against its own total
    (ok / remainder); it is not scaled to the part it explains: the text prints both totals."""
    wf = dict(wf)
    wf["parts"] = [dict(p) for p in wf["parts"]]
    hit = next((p for p in wf["parts"] if p["name"] == part), None) or \
        next((p for p in wf["parts"] if part in p["name"]), None)
    if hit is None:
        raise KeyError(f"no part {part!r} in waterfall {wf.get('label')!r}: {[p['name'] for p in wf['parts']]}")
    hit["split"] = finish(dict(sub), tol)
    return wf


def align(a: dict, b: dict) -> tuple[dict, dict]:
    """The two waterfalls with the same parts: where one of them lacks a stamp (its parts "A + B" merged), the
    other's A and B are merged too. Parts are matched by the stamps they end at ("to"); waterfalls whose parts
    carry no stamps come back unchanged."""
    if not all(p.get("to") for p in a.get("parts", []) + b.get("parts", [])):
        return a, b
    common = {p["to"] for p in a["parts"]} & {p["to"] for p in b["parts"]}

    def regroup(wf):
        out, acc = [], []
        for p in wf["parts"]:
            acc.append(p)
            if p["to"] in common:
                if len(acc) == 1:
                    out.append(dict(p))
                else:
                    ms = [q["ms"] for q in acc if _num(q.get("ms"))]
                    out.append({**acc[-1], "name": " + ".join(q["name"] for q in acc), "ms": sum(ms) if ms else math.nan,
                                "start": acc[0].get("start"), "from": acc[0].get("from"),
                                "what": "; ".join(q["what"] for q in acc if q.get("what")), "min_ms": None,
                                "max_ms": None})
                acc = []
        return finish({**wf, "parts": out}, wf.get("tol", TOL))
    return regroup(a), regroup(b)


def ratios(untraced: dict, traced: dict) -> dict:
    """{part name: traced ms / untraced ms} for the parts both waterfalls have (and 'total')."""
    t = {p["name"]: p["ms"] for p in traced.get("parts", []) if _num(p.get("ms"))}
    out = {}
    for p in untraced.get("parts", []):
        if p["name"] in t and _num(p.get("ms")) and p["ms"] > 0:
            out[p["name"]] = t[p["name"]] / p["ms"]
    if _num(untraced.get("total_ms")) and _num(traced.get("total_ms")) and untraced["total_ms"] > 0:
        out["total"] = traced["total_ms"] / untraced["total_ms"]
    return out


def rows(wf: dict, traced: dict | None = None, **extra) -> list[dict]:
    """The waterfall as table rows (part, ms, min/max, traced ms, ratio, source, level), split parts indented."""
    rt = ratios(wf, traced) if traced else {}
    tmap = {p["name"]: p["ms"] for p in (traced or {}).get("parts", [])}
    out = []
    for p in wf["parts"]:
        out.append({**extra, "level": 0, "part": p["name"], "ms": p.get("ms"), "min_ms": p.get("min_ms"),
                    "max_ms": p.get("max_ms"), "traced_ms": tmap.get(p["name"]), "traced_over_untraced": rt.get(p["name"]),
                    "source": p.get("source"), "what": p.get("what")})
        sp = p.get("split")
        if sp:
            for q in sp["parts"]:
                out.append({**extra, "level": 1, "part": q["name"], "ms": q.get("ms"), "min_ms": q.get("min_ms"),
                            "max_ms": q.get("max_ms"), "traced_ms": None, "traced_over_untraced": None,
                            "source": q.get("source"), "what": q.get("what")})
            out.append({**extra, "level": 1, "part": "(unattributed in the split)", "ms": sp["remainder_ms"],
                        "source": sp.get("source"), "what": f"split total {sp['total_ms']:.3f} ms"})
    out.append({**extra, "level": 0, "part": "(unattributed)", "ms": wf["remainder_ms"], "source": "total - sum",
                "what": f"total {wf['total_ms']:.3f} ms, adds up within {100 * wf['tol']:.0f}%: {wf['ok']}"})
    return out


def _ms(v) -> str:
    return f"{v:7.2f}" if _num(v) else "      -"


def render(wf: dict, traced: dict | None = None, title: str = "", total_name: str = "total",
           width: int = 120, judged: bool = True) -> list[str]:
    """Text lines (the table's lines <= ``width`` characters; a split part's free-text source is left whole for
    the story to fold, story.fold): one per part with ms, share of the total, a bar, the traced ms
    and traced/untraced; a split part's sub-parts indented with their own source; the sum, the total and the
    unattributed remainder with the verdict (✓ adds up within 5% / ✗ does not: never shown as fine).
    ``judged=False``: a waterfall whose parts add up by construction (consecutive stamps of one clock and the
    total their span): the remainder is printed, the verdict is replaced by why there is none; its splits too
    (a split of consecutive points is one as well), unless a part went negative (two clocks that disagree)."""
    total = wf.get("total_ms")
    rt = ratios(wf, traced) if traced else {}
    tmap = {p["name"]: p["ms"] for p in (traced or {}).get("parts", [])}
    lines = [title] if title else []
    head = f"{'part':34s} {'ms':>7s} {'share':>6s}  {'':20s}"
    if traced:
        head += f" {'traced':>7s} {'x':>5s}"
    lines.append(head)
    biggest = max([p["ms"] for p in wf["parts"] if _num(p.get("ms"))] + [1e-9])

    def bar(v):
        return ("█" * max(0, min(20, round(20 * v / biggest)))) if _num(v) and v > 0 else ""

    for p in wf["parts"]:
        share = f"{100 * p['ms'] / total:5.1f}%" if _num(p.get("ms")) and _num(total) and total else "     -"
        ln = f"{p['name'][:34]:34s} {_ms(p.get('ms'))} {share}  {bar(p.get('ms')):20s}"
        if traced:
            r = rt.get(p["name"])
            ln += f" {_ms(tmap.get(p['name']))} {f'{r:4.2f}x' if r else '    -'}"
        lines.append(ln[:width])
        sp = p.get("split")
        if sp:
            lines.append(f"  └ split ({sp.get('source') or 'traced'}; {sp.get('label') or ''}): parts of "
                         f"{sp['total_ms']:.2f} ms")          # free text: folded by the story (story.fold), never cut
            for q in sp["parts"]:
                lines.append(f"     {q['name'][:29]:29s} {_ms(q.get('ms'))}  {q.get('what') or ''}")
            mark = ("✓" if sp["ok"] else "✗ does not add up") if judged else (
                "(by construction)" if not sp["negative"] else "✗ negative: " + ", ".join(sp["negative"]))
            lines.append(f"     {'unattributed in the split':29s} {_ms(sp['remainder_ms'])}  {mark}"[:width])
    lines.append(f"{'sum of the parts':34s} {_ms(wf['sum_ms'])}"[:width])
    lines.append(f"{total_name[:34]:34s} {_ms(total)}"
                 + (f"{'':30s} {_ms(traced.get('total_ms'))} {rt['total']:4.2f}x" if traced and rt.get("total") else "")
                 [:width])
    verdict = (("(not judged: adds up by construction)" if wf["ok"] else
                "(not judged: each run adds up; medians differ)") if not judged else
               f"✓ adds up within {100 * wf['tol']:.0f}%" if wf["ok"] else
               f"✗ DOES NOT ADD UP (limit {100 * wf['tol']:.0f}%)" + (f"; negative: {', '.join(wf['negative'])}"
                                                                       if wf["negative"] else ""))
    lines.append(f"{'unattributed (total - sum)':34s} {_ms(wf['remainder_ms'])} "
                 f"{wf['remainder_pct']:+5.1f}%  {verdict}"[:width] if _num(wf.get("remainder_pct")) else
                 f"{'unattributed (total - sum)':34s}       -  {verdict}"[:width])
    return lines


def spans_of(wf: dict, prefix: str = "") -> list[tuple]:
    """(name, start_s, end_s) of every part (and split part) that has both times: the request's track in Perfetto."""
    out = []
    for p in wf.get("parts", []):
        if _num(p.get("start")) and _num(p.get("end")):
            out.append((prefix + p["name"], p["start"], p["end"]))
        for q in (p.get("split") or {}).get("parts", []):
            if _num(q.get("start")) and _num(q.get("end")):
                out.append((prefix + "· " + q["name"], q["start"], q["end"]))
    return out
