"""Run-to-run noise: how much one judged quantity moves between two runs of the same experiments on one GPU model.

The interval a verdict is judged on (common.base.stats) holds the spread *inside* one run. Two runs of the same
pipeline on the same kind of GPU also differ from each other (a new server, other clocks, another warm-up),
and a verdict that holds on one run and not on the next is a knife edge. This module measures that
between-run noise from two result trees and keeps it in ``common/judge/noise.json``; common.judge.verdicts then asks
every interval to clear its bound by that margin before it confirms or refutes (else: inconclusive, "within
the run-to-run noise"), and says the noise it used.

    python -m common noise A B            # compare two result trees (each holding <system>/results/)
    python -m common noise A B --write    # ... and record it in common/judge/noise.json (the larger spread stays)

Per hypothesis: spread = |point_A - point_B| (the quantity's unit; a verdict's point moved by it must stay on the
same side of each bound) and noise = spread / mean of the two (a fraction, to read), with the runs. Only
hypotheses judged in both runs get one; the others have no margin and their verdicts say "noise not measured".
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from common import REPO_ROOT, SYSTEMS

NOISE_FILE = REPO_ROOT / "common" / "noise.json"


def _points(root: Path) -> dict:
    """{(system, stem, hypothesis): (point, run line)} of every judged number in a result tree."""
    out = {}
    for system in SYSTEMS:
        for p in sorted((root / system / "results").glob("*/summary.json")):
            try:
                s = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            prov = s.get("provenance") or {}
            run = f"{prov.get('gpu', '?')} · {(prov.get('git') or {}).get('commit', '?')[:7]} · {prov.get('date_utc', '?')[:10]}"
            for o in s.get("observations") or []:
                pt = (o.get("interval") or {}).get("point")
                if o.get("hypothesis") and isinstance(pt, (int, float)) and math.isfinite(pt):
                    out[(system, p.parent.name, o["hypothesis"])] = (float(pt), run)
    return out


def compare(a: Path, b: Path) -> list[dict]:
    """One row per hypothesis judged with a number in both trees: its two points and their relative difference."""
    pa, pb = _points(Path(a)), _points(Path(b))
    rows = []
    for key in sorted(set(pa) & set(pb)):
        (x, ra), (y, rb) = pa[key], pb[key]
        mean = (abs(x) + abs(y)) / 2
        rows.append({"system": key[0], "stem": key[1], "hypothesis": key[2], "a": x, "b": y,
                     "spread": abs(x - y), "noise": abs(x - y) / mean if mean else 0.0, "runs": f"{ra} vs {rb}"})
    return rows


def load(path: Path = NOISE_FILE) -> dict:
    """{(system, stem, hypothesis): {"spread", "noise", "runs", ...}} from common/judge/noise.json ({} if absent)."""
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return {(r["system"], r["stem"], r["hypothesis"]): r for r in d.get("rows", [])}


def lookup(system: str, stem: str, hypothesis: str, path: Path = NOISE_FILE) -> dict | None:
    return load(path).get((system, stem, hypothesis))


def write(rows: list[dict], path: Path = NOISE_FILE) -> Path:
    """Merge ``rows`` into the noise file (a row per system/stem/hypothesis). Where two pairs of runs measured
    the same quantity, the larger spread is kept with its runs: a margin is only as safe as the widest
    run-to-run move seen, and a quieter pair of runs does not make the earlier move untrue."""
    old = load(path)
    for r in rows:
        key = (r["system"], r["stem"], r["hypothesis"])
        if key in old and old[key].get("spread", -1.0) > r["spread"]:
            continue
        old[key] = {k: r[k] for k in ("system", "stem", "hypothesis", "a", "b", "spread", "noise", "runs")}
    doc = {"about": "run-to-run noise per judged quantity: spread = |a - b| of two runs on one GPU model, noise = "
                    "spread / their mean (python -m common noise A B --write); common.judge.verdicts asks a verdict to "
                    "hold with its point moved by the spread",
           "rows": sorted(old.values(), key=lambda r: (r["system"], r["stem"], r["hypothesis"]))}
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)
    return Path(path)


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m common noise", description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="a result tree (a folder holding <system>/results/)")
    p.add_argument("b", help="a second run of the same experiments on the same GPU model")
    p.add_argument("--write", action="store_true", help=f"record the noise in {NOISE_FILE.relative_to(REPO_ROOT)}")
    a = p.parse_args(argv)
    for d in (a.a, a.b):
        if not Path(d).is_dir():
            print(f"[error] {d}: not a folder")
            return 2
    rows = compare(Path(a.a), Path(a.b))
    if not rows:
        print("[error] no hypothesis was judged with a number in both trees")
        return 2
    for r in rows:
        print(f"{r['system']:12s} {r['stem']:26s} {r['hypothesis']:32s} {r['a']:10.4g} {r['b']:10.4g} "
              f"{100 * r['noise']:6.1f}%")
    if a.write:
        print(f"wrote {write(rows).relative_to(REPO_ROOT)}")
    return 0
