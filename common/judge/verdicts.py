'''Hypotheses as data, verdicts judged on intervals.

A script declares its hypotheses near the top, as text that reads like the report's "expected" column:
each with the quantity it is judged on, the range that confirms it and where that range comes from
(the plan's figure)::

    H = declare(f"""
    decode_bw = decode-bw: decode is memory-bound at ~80% of peak HBM (batch 32, KV 4096)
        judged on: decode attention TB/s as % of the measured DRAM ceiling, {REPEATS} repetitions
        confirmed: [70, 90]%
        source: PLAN.md Session 3, 03_profile_decode: '~80% of peak HBM'
    """)

and judges it on repeated measurements::

    run.judge(H["decode_bw"], [81.2, 80.4, 82.0], evidence="sweep.csv row b32 kv4096")

Rule (the same everywhere): the interval of the measurement (common.base.stats.interval: the range of
3-9 repetitions, a bootstrap 95% interval of more samples) lies inside [low, high] -> confirmed;
entirely outside -> refuted; across a bound -> inconclusive. Fewer than 3 repetitions -> inconclusive
(one sample is never judged). Where two runs measured a quantity's run-to-run noise (common.judge.noise: how far
the second run's point landed from the first's), the point moved by that much must stay on the same side of
each bound as well; a verdict that would flip is inconclusive and says so. A failed premise (the condition the hypothesis depends on did not hold,
e.g. "the split happened") makes the verdict inconclusive, whatever the number says.
'''
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from common.base.stats import Interval, interval

VERDICTS = ("confirmed", "refuted", "inconclusive", "not run")


@dataclass(frozen=True)
class Hypothesis:
    id: str
    claim: str                   # the plan's expectation, in words
    quantity: str                # what is measured to judge it (with its unit)
    low: float | None = None     # confirmed when the whole interval is >= low ...
    high: float | None = None    # ... and <= high (None: no bound on that side)
    source: str = ""             # where the range comes from (plan section, figure, reasoning)
    unit: str = ""

    def range_text(self) -> str:
        u = self.unit
        if self.low is not None and self.high is not None:
            return f"[{self.low:g}, {self.high:g}]{u}"
        if self.low is not None:
            return f">= {self.low:g}{u}"
        if self.high is not None:
            return f"<= {self.high:g}{u}"
        return "(no range)"

    def expected(self) -> str:
        src = f"; source: {self.source}" if self.source else ""
        return f"{self.claim} — judged on {self.quantity}, confirmed in {self.range_text()}{src}"


_FIELDS = {"judged on": "quantity", "confirmed": "range", "source": "source"}
_NUM = r"-?\d+(?:\.\d+)?(?:e-?\d+)?"
_RANGE = re.compile(rf"^(?:(?P<op>>=|<=)\s*(?P<v>{_NUM})|\[(?P<lo>{_NUM}),\s*(?P<hi>{_NUM})\])(?P<unit>.*)$")


def _number(text: str):
    return float(text) if any(c in text for c in ".e") else int(text)


def parse_range(text: str) -> dict:
    """'>= 15%', '<= 0.8', '[70, 90]%', '>= 0 pp' (Hypothesis.range_text's forms) -> low, high, unit."""
    m = _RANGE.match(text.strip())
    if not m:
        raise ValueError(f"a range is '>= x', '<= x' or '[lo, hi]' with an optional unit, not {text!r}")
    if m["op"]:
        v = _number(m["v"])
        return {"low": v, "high": None, "unit": m["unit"]} if m["op"] == ">=" else \
            {"low": None, "high": v, "unit": m["unit"]}
    return {"low": _number(m["lo"]), "high": _number(m["hi"]), "unit": m["unit"]}


def declare(text: str) -> dict[str, Hypothesis]:
    """The hypotheses of a script, from a text block (see the module doc): a line ``key = id: claim`` at
    the block's left margin starts one; indented lines ``judged on:``, ``confirmed:`` (left out: no
    range, a fact judged true/false) and ``source:`` follow; an indented line without a field name
    continues the line above; ``#`` lines are comments. A malformed block raises ValueError naming
    the line, so a script with a typo in its hypotheses fails at import, before any GPU work."""
    lines = [l.rstrip() for l in text.splitlines()]
    body = [l for l in lines if l.strip() and not l.strip().startswith("#")]
    margin = min((len(l) - len(l.lstrip()) for l in body), default=0)
    out: dict[str, Hypothesis] = {}
    cur: dict | None = None
    field = None

    def close():
        if cur is None:
            return
        if "quantity" not in cur:
            raise ValueError(f"hypothesis {cur['key']!r} has no 'judged on:' line")
        rng = parse_range(cur.pop("range")) if "range" in cur else {}
        key = cur.pop("key")
        if key in out:
            raise ValueError(f"hypothesis key {key!r} declared twice")
        out[key] = Hypothesis(**cur, **rng)

    for raw in body:
        indent = len(raw) - len(raw.lstrip()) - margin
        line = raw.strip()
        if indent == 0:
            close()
            m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\s*=\s*([^\s:]+):\s*(.+)$", line)
            if not m:
                raise ValueError(f"expected 'key = id: claim', got {line!r}")
            cur, field = {"key": m[1], "id": m[2], "claim": m[3]}, "claim"
            continue
        if cur is None:
            raise ValueError(f"an indented line before the first 'key = id: claim': {line!r}")
        name, sep, rest = line.partition(":")
        if sep and name in _FIELDS:
            field = _FIELDS[name]
            if field in cur:
                raise ValueError(f"hypothesis {cur['key']!r}: {name!r} given twice")
            cur[field] = rest.strip()
        else:
            cur[field] += " " + line
    close()
    return out


def verdict_for(h: Hypothesis, iv: Interval, premise: bool = True, margin: float = 0.0) -> str:
    """confirmed / refuted / inconclusive for interval ``iv`` against the range of ``h``. ``margin``: the
    run-to-run noise of the quantity (common.judge.noise: how far a second run's point landed from the first's, in
    the quantity's unit); the point moved by that much must still sit on the same side of each bound."""
    if not premise or not iv.enough or math.isnan(iv.lo) or math.isnan(iv.hi):
        return "inconclusive"
    lo = -math.inf if h.low is None else h.low
    hi = math.inf if h.high is None else h.high
    p = iv.point
    if iv.lo >= lo and iv.hi <= hi and p - margin >= lo and p + margin <= hi:
        return "confirmed"
    if (iv.hi < lo or iv.lo > hi) and (p + margin < lo or p - margin > hi):
        return "refuted"
    return "inconclusive"


def judge(h: Hypothesis, values, *, premise: bool | str = True, stat: str = "median",
          digits: int = 3, detail: str = "", noise: dict | None = None) -> dict:
    """The observation record for hypothesis ``h`` measured as ``values`` (repetitions or samples,
    or an Interval already computed). ``premise``: True, or a string saying which premise failed.
    ``noise``: this quantity's run-to-run noise (common.judge.noise: {"spread": |a - b| of two runs, "runs": text}); the
    point moved by that spread must then stay on the same side of each bound, and the record says so."""
    iv = values if isinstance(values, Interval) else interval(values, stat=stat)
    ok = premise is True
    m = (noise or {}).get("spread")
    margin = float(m) if isinstance(m, (int, float)) and math.isfinite(m) else 0.0
    v = verdict_for(h, iv, premise=ok, margin=margin)
    src = _margin_source(noise)
    why = ""
    if not ok:
        why = f"; premise failed: {premise if isinstance(premise, str) else 'see evidence'}"
    elif not iv.enough:
        why = f"; {iv.n} sample(s): at least 3 repetitions are needed to judge"
    elif v == "inconclusive" and verdict_for(h, iv, premise=ok) != "inconclusive":
        why = (f"; within the run-to-run noise of {h.range_text()}: a second run's point moved by {margin:.3g} "
               f"({src}), which would cross the bound")
    elif v == "inconclusive":
        why = f"; the interval straddles {h.range_text()}"
    elif margin:
        why = f"; holds with the run-to-run noise too (a second run moved the point by {margin:.3g}; {src})"
    observed = f"{h.quantity}: {iv.fmt(digits, h.unit)}" + (f"; {detail}" if detail else "") + why
    rec = {"hypothesis": h.id, "expected": h.expected(), "observed": observed, "verdict": v,
           "interval": iv.to_dict(), "range": [h.low, h.high], "source": h.source}
    if margin:
        rec["margin"] = {"spread": margin, "model": (noise or {}).get("model"), "borrowed": bool((noise or {}).get("borrowed"))}
    return rec


def _margin_source(noise: dict | None) -> str:
    """Where a margin comes from, in words: its runs, and the GPU model that measured it when that is not the run's."""
    if not noise:
        return ""
    runs = noise.get("runs", "?")
    if noise.get("borrowed"):
        return f"not measured on this GPU model: the largest known, from {noise.get('model')}, runs {runs}"
    return runs


def judge_fact(h: Hypothesis, holds, observed: str, *, premise: bool | str = True) -> dict:
    """The observation record for a hypothesis about a FACT (a kernel name, a planner decision, a
    bound() reading) rather than a number. ``holds``: one bool for a deterministic fact (the same code
    path on every run), or one bool per repetition / traced call: all True -> confirmed, all False ->
    refuted, mixed -> inconclusive; None (not observed) -> inconclusive. A failed ``premise`` (a string
    saying which) makes it inconclusive whatever was seen. Numbers are judged with :func:`judge`."""
    vals = list(holds) if isinstance(holds, (list, tuple)) else [holds]
    if premise is not True:
        verdict = "inconclusive"
        observed = f"{observed}; premise failed: {premise if isinstance(premise, str) else 'see evidence'}"
    elif not vals or any(v is None for v in vals):
        verdict = "inconclusive"
    elif all(vals):
        verdict = "confirmed"
    elif not any(vals):
        verdict = "refuted"
    else:
        verdict, observed = "inconclusive", f"{observed}; holds in {sum(map(bool, vals))} of {len(vals)}"
    src = f"; source: {h.source}" if h.source else ""
    return {"hypothesis": h.id, "expected": f"{h.claim} — {h.quantity}{src}", "observed": observed,
            "verdict": verdict, "source": h.source}
