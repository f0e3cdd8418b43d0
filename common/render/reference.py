"""The reference run: the committed pages' run, kept as a small file of judged quantities, and each system's final page
comparing a user's run with it, verdict by verdict, with the reason the machines' measured ratios give.

    python -m common reference --write [--system S]     # the current results/ become the reference (reports/reference.json)
    <!-- auto:reference -->                              # the block on each final-report.md (make reports)

A changed verdict is explained only by what was measured on both machines: the ceilings by kind of traffic (DRAM read,
write, copy; bf16), the SM clock, the SM count, the L2 size, the GPU memory, the host CPU, NVLink, the package versions,
and the run-to-run margin (a point within its margin of a bound is a knife edge). Which of these a quantity depends on is
read from what its hypothesis says it is judged on (``depends``: the DRAM read ceiling for "% of the measured DRAM read
ceiling", the host CPU for CPU-side times...); a change none of its measured ratios explains is shown as unexplained.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from common import REPO_ROOT, SYSTEMS
from common.base.story import fmt
from common.capture.gpu import machine_of
from common.capture.store import read_summary, SUMMARY
from common.judge import noise
from common.render.markdown import md_table, run_line

REFERENCE = "reference.json"
VERSION = 1
DIFFERS = 0.03          # a measured ratio further than this from 1 is a difference between the machines

# what a machine is, as the reference keeps it: (key, label, unit, getter of a run's provenance)
MACHINE = (
    ("gpu", "GPU", "", lambda p: machine_of(p)),
    ("sm_count", "SMs", "", lambda p: p.get("sm_count")),
    ("l2_mb", "L2", "MB", lambda p: p.get("l2_mb")),
    ("memory_gb", "GPU memory", "GB", lambda p: ((p.get("gpus") or [{}])[0] or {}).get("memory_gb")),
    ("max_sm_mhz", "max SM clock", "MHz", lambda p: ((p.get("gpus") or [{}])[0] or {}).get("max_sm_clock_mhz")),
    ("max_mem_mhz", "max memory clock", "MHz", lambda p: ((p.get("gpus") or [{}])[0] or {}).get("max_mem_clock_mhz")),
    ("dram_read_tb_s", "DRAM read ceiling", "TB/s", lambda p: (p.get("ceilings") or {}).get("dram_read_tb_s")),
    ("dram_write_tb_s", "DRAM write ceiling", "TB/s", lambda p: (p.get("ceilings") or {}).get("dram_write_tb_s")),
    ("dram_copy_tb_s", "DRAM copy ceiling", "TB/s", lambda p: (p.get("ceilings") or {}).get("dram_copy_tb_s")),
    ("bf16_tflops", "bf16 ceiling", "TFLOP/s", lambda p: (p.get("ceilings") or {}).get("bf16_tflops")),
    ("bf16_sm_mhz", "SM clock of the bf16 ceiling", "MHz", lambda p: (p.get("ceilings") or {}).get("bf16_sm_mhz")),
    ("nvlink_gb_s", "NVLink all-reduce busbw", "GB/s", lambda p: (p.get("ceilings") or {}).get("nvlink_busbw_gb_s")),
    ("host_cpu", "host CPU", "", lambda p: (p.get("host") or {}).get("cpu_model")),
    ("host_cpus", "host CPUs", "", lambda p: (p.get("host") or {}).get("cpus")),
    ("stack", "packages", "", lambda p: ", ".join(f"{k} {v}" for k, v in sorted((p.get("packages") or {}).items())
                                                  if k in ("torch", "flashinfer-python", "sglang", "sglang-kernel"))),
)
LABEL = {k: (label, unit) for k, label, unit, _ in MACHINE}

# what a judged quantity depends on, read from its hypothesis' words (first match of each rule adds its keys)
DEPENDS = (
    (r"DRAM read ceiling", ("dram_read_tb_s",)),
    (r"DRAM copy ceiling", ("dram_copy_tb_s",)),
    (r"DRAM write ceiling", ("dram_write_tb_s",)),
    (r"DRAM ceiling|DRAM bytes|DRAM %|bandwidth|TB/s|memory-bound|HBM", ("dram_read_tb_s", "dram_copy_tb_s", "dram_write_tb_s")),
    (r"bf16|TFLOP/s|tensor|ridge|compute-bound", ("bf16_tflops", "bf16_sm_mhz")),
    (r"occupancy|grid|SM count|CTA|waves|persistent|split_kv|plan_info|planner|split", ("sm_count",)),
    (r"L2|working set", ("l2_mb",)),
    (r"CPU|plan\(\)|radix|compare_key|fresh process|client|tok/s|TTFT|scheduler|tokeni[sz]", ("host_cpu", "host_cpus")),
    (r"busbw|all-reduce|NVLink|GPU0->GPU1|NCCL", ("nvlink_gb_s",)),
    (r"hit rate|cached|retract|usage|pool|evict", ("memory_gb",)),
    (r"time|latency|ITL|ms\b|us\b|ratio|faster|slower|step", ("sm_count", "max_sm_mhz", "dram_read_tb_s")),
)


def depends(expected: str) -> list[str]:
    """The machine figures a judged quantity depends on, from its hypothesis' words (``expected``: the claim and what
    it is judged on, as an observation records them); the package versions always (the code that ran)."""
    out = []
    for rx, keys in DEPENDS:
        if re.search(rx, expected or "", re.I):
            out += [k for k in keys if k not in out]
    return out + ["stack"]


def machine(prov: dict) -> dict:
    return {k: get(prov) for k, _, _, get in MACHINE}


def _observations(summaries: list[dict]) -> dict:
    """{"<stem>/<hypothesis>": its record as the reference keeps it} over the runs' observations."""
    out = {}
    for s in summaries:
        stem = s.get("stem") or Path(s.get("script", "?")).stem
        for o in s.get("observations") or []:
            if not o.get("hypothesis"):
                continue
            iv = o.get("interval") or {}
            out[f"{stem}/{o['hypothesis']}"] = {
                "verdict": o["verdict"], "point": iv.get("point"), "lo": iv.get("lo"), "hi": iv.get("hi"),
                "range": o.get("range"), "margin": (o.get("margin") or {}).get("spread"),
                "depends": depends(o.get("expected", "")), "observed": o.get("observed", "")}
    return out


def build(system: str, summaries: list[dict]) -> dict:
    """The reference file of ``system`` from its runs' summaries (one machine's: the newest run's)."""
    summaries = [s for s in summaries if s]
    first = max(summaries, key=lambda s: s["provenance"].get("date_utc") or "")
    return {"version": VERSION, "system": system, "machine": machine(first["provenance"]),
            "runs": {s.get("stem") or Path(s.get("script", "?")).stem: run_line(s["provenance"])[10:-4]
                     for s in sorted(summaries, key=lambda s: s.get("stem") or "") if s.get("observations")},
            "quantities": _observations(summaries)}


def path_of(system: str, root: Path = REPO_ROOT) -> Path:
    return root / system / "reports" / REFERENCE


def load(system: str, root: Path = REPO_ROOT) -> tuple[dict | None, str]:
    """(the reference of ``system``, "") or (None, why there is none or why it cannot be read)."""
    p = path_of(system, root)
    if not p.is_file():
        return None, f"no reference run is committed for {system} ({p.relative_to(root)})"
    try:
        d = json.loads(p.read_text())
        if not isinstance(d, dict) or d.get("version") != VERSION or not isinstance(d.get("quantities"), dict) \
                or not isinstance(d.get("machine"), dict):
            raise ValueError(f"not a version-{VERSION} reference (an object with machine, runs and quantities)")
    except (OSError, ValueError) as e:
        return None, f"{p.relative_to(root)} cannot be read ({str(e).splitlines()[0][:160]}): restore it with git"
    return d, ""


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _ratio(a, b) -> float | None:
    a, b = _num(a), _num(b)
    return a / b if a is not None and b else None


def differences(mine: dict, ref: dict) -> dict:
    """{machine key: its words} for every measured figure that differs between this run's machine and the
    reference's (a ratio beyond DIFFERS, or another text)."""
    out = {}
    for key, label, unit, _ in MACHINE:
        a, b = mine.get(key), ref.get(key)
        if a is None or b is None or key == "gpu":
            continue
        r = _ratio(a, b)
        u = f" {unit}" if unit else ""
        if r is not None and abs(r - 1) > DIFFERS:
            out[key] = f"{label} x{r:.2f} ({fmt(_num(a))} vs {fmt(_num(b))}{u})"
        elif r is None and str(a) != str(b):
            out[key] = f"{label}: {a} vs {b}"
    return out


def _near_bound(q: dict) -> float | None:
    """How far (in the quantity's unit) the point sits inside its nearest bound, or None without numbers."""
    p, rng = _num(q.get("point")), q.get("range") or [None, None]
    lo, hi = (_num(rng[0]) if rng else None), (_num(rng[1]) if len(rng or []) > 1 else None)
    if p is None or (lo is None and hi is None):
        return None
    return min(abs(p - b) for b in (lo, hi) if b is not None)


def reason(q_mine: dict, q_ref: dict, diffs: dict) -> str:
    """Why a verdict changed, in measured words: the differing figures the quantity depends on, and whether either
    point sits within its run-to-run margin of a bound; 'unexplained: ...' when none of these holds."""
    parts = [diffs[k] for k in q_ref.get("depends") or q_mine.get("depends") or [] if k in diffs]
    for side, q in (("this run", q_mine), ("the reference", q_ref)):
        d, m = _near_bound(q), _num(q.get("margin"))
        if d is not None and m is not None and d <= m:
            parts.append(f"{side}'s point is {fmt(d)} from its bound, within its run-to-run margin {fmt(m)}")
    if parts:
        return "; ".join(parts)
    deps = ", ".join(LABEL[k][0] for k in (q_ref.get("depends") or []) if k in LABEL) or "nothing measured"
    return f"**unexplained**: no measured figure it depends on ({deps}) differs, and no point is within its margin"


def _cell(q: dict | None) -> str:
    if not q:
        return "—"
    p = _num(q.get("point"))
    lo, hi = _num(q.get("lo")), _num(q.get("hi"))
    fig = f" {fmt(p)}" + (f" [{fmt(lo)}, {fmt(hi)}]" if lo is not None and hi is not None else "") if p is not None else ""
    return f"**{q['verdict']}**{fig}"


def render(system: str, root: Path, summaries: list) -> tuple[str | None, str]:
    """The ``reference`` block: this run against the committed reference run; (None, why) when there is no run."""
    summaries = [s for s in summaries if s]
    if not summaries:
        return None, "no run in this clone to compare with the reference"
    ref, why = load(system, root)
    if ref is None:
        return f"_{why[0].upper() + why[1:]}: nothing to compare this run with (`python -m common reference --write` " \
               f"makes a run the reference)._\n", ""
    mine = build(system, summaries)
    lines = list(dict.fromkeys(run_line(s["provenance"]) for s in summaries))
    if mine["runs"] == ref.get("runs"):
        n = len(ref["quantities"])
        return "\n".join(lines + [
            f"This page is the reference run itself ({ref['machine'].get('gpu')}; its {n} judged quantities are "
            f"`{system}/reports/{REFERENCE}`). Run `make quick` (or a pipeline, then `make reports`) on your GPU: this "
            "block then compares your run with the reference, verdict by verdict, with the reason the machines' "
            "measured figures give for each change."]) + "\n", ""
    diffs = differences(mine["machine"], ref["machine"])
    table = []
    for key, label, unit, _ in MACHINE:
        a, b = mine["machine"].get(key), ref["machine"].get(key)
        if a is None and b is None:
            continue
        r = _ratio(a, b)
        table.append({"": label + (f" ({unit})" if unit else ""), "this run": a, "reference": b,
                      "this / reference": r if r is not None else ("same" if str(a) == str(b) else "differs")})
    rows, judged, changed, one_side = [], 0, 0, []
    for key in list(mine["quantities"]) + [k for k in ref["quantities"] if k not in mine["quantities"]]:
        a, b = mine["quantities"].get(key), ref["quantities"].get(key)
        if not (a and b):
            one_side.append(key)
            continue
        judged += 1
        if a["verdict"] != b["verdict"]:
            changed += 1
            stem, hyp = key.split("/", 1)
            rows.append({"experiment": stem, "hypothesis": hyp, "this run": _cell(a), "reference": _cell(b),
                         "why (measured)": reason(a, b, diffs)})
    gpu = summaries[0]["provenance"].get("gpu")
    own = noise.models()
    margins = (f"Run-to-run margins: measured on {gpu}." if gpu in own else
               f"Run-to-run margins: none measured on {gpu}; each verdict used the largest margin known for its quantity "
               f"(measured on {', '.join(own) or 'no GPU'}) and says so.")
    out = lines + [f"Against the reference run on {ref['machine'].get('gpu')} (`{system}/reports/{REFERENCE}`):", "",
                   md_table(table, max_rows=100), "", margins, "",
                   f"{changed} of {judged} hypotheses judged in both runs changed verdict.", ""]
    out.append(md_table(rows, max_rows=200) if rows else "_No verdict changed._")
    if one_side:
        out += ["", f"{len(one_side)} hypotheses were judged in one of the two runs only: {', '.join(one_side[:12])}"
                    + (" ..." if len(one_side) > 12 else "") + "."]
    return "\n".join(out) + "\n", ""


def write(systems=SYSTEMS, root: Path = REPO_ROOT, echo=print) -> list[Path]:
    """Make the runs in results/ the reference of each system (its newest machine's runs); the files written."""
    written = []
    for system in systems:
        runs = []
        for p in sorted((root / system / "results").glob(f"*/{SUMMARY}")):
            if p.parent.name.startswith("."):
                continue
            s, _ = read_summary(p)
            if s is not None:
                runs.append(s)
        if not runs:
            echo(f"{system}: no finished run in {system}/results/: its reference is left as it is")
            continue
        newest = max(runs, key=lambda s: s["provenance"].get("date_utc") or "")
        runs = [s for s in runs if machine_of(s["provenance"]) == machine_of(newest["provenance"])]
        ref = build(system, runs)
        p = path_of(system, root)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(ref, indent=1, sort_keys=True) + "\n")
        tmp.replace(p)
        written.append(p)
        echo(f"{system}: {p.relative_to(root)} ({len(ref['quantities'])} judged quantities of {len(ref['runs'])} runs "
             f"on {ref['machine']['gpu']})")
    return written


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m common reference", description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help="make the runs in results/ each system's reference")
    p.add_argument("--system", choices=SYSTEMS, action="append", help="only this system (repeatable)")
    a = p.parse_args(argv)
    if not a.write:
        for system in a.system or SYSTEMS:
            ref, why = load(system)
            print(f"{system}: " + (why if ref is None else f"{len(ref['quantities'])} judged quantities on "
                                                          f"{ref['machine'].get('gpu')}"))
        return 0
    write(a.system or SYSTEMS)
    return 0
