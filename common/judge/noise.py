"""Run-to-run noise: how much one judged quantity moves between two runs of the same experiments on one GPU model.

The interval a verdict is judged on (common.base.stats) holds the spread *inside* one run. Two runs of the same
pipeline on the same kind of GPU also differ from each other (a new server, other clocks, another warm-up),
and a verdict that holds on one run and not on the next is a knife edge. This module measures that
between-run noise from two result trees and keeps it in ``common/judge/noise.json``, **keyed by GPU model**:
common.judge.verdicts then asks every interval to clear its bound by that margin before it confirms or refutes
(else: inconclusive, "within the run-to-run noise"), and says the noise it used and which GPU model measured it.

    python -m common noise A B            # compare two result trees (each holding <system>/results/) of one GPU model
    python -m common noise A B --write    # ... and record it under that model in noise.json (the larger spread stays)

Per hypothesis: spread = |point_A - point_B| (the quantity's unit; a verdict's point moved by it must stay on the
same side of each bound) and noise = spread / mean of the two (a fraction, to read), with the runs. A quantity whose
noise was not measured on the run's GPU model borrows the LARGEST spread any other model measured, and the verdict
says so and names that model (``margin_for``): another model's margin is never applied without a word. A damaged file is one [setup] line
naming it (NoiseFileError), never an empty set of margins.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from common import REPO_ROOT, SYSTEMS
from common.base.checks import SetupError

NOISE_FILE = Path(__file__).with_name("noise.json")
VERSION = 2
ROW_KEYS = ("system", "stem", "hypothesis", "a", "b", "spread", "noise", "runs")


class NoiseFileError(SetupError):
    """noise.json cannot be trusted (not JSON, not this layout, a value of the wrong type): one line naming it."""


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _model_of(run: str) -> str:
    """'NVIDIA H200 · a5d3c27 · 2026-11-25' -> 'NVIDIA H200' (a run's text, as compare() writes it)."""
    return str(run).split(" · ")[0].strip()


def _points(root: Path) -> dict:
    """{(system, stem, hypothesis): (point, run line, GPU model)} of every judged number in a result tree."""
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
                    out[(system, p.parent.name, o["hypothesis"])] = (float(pt), run, prov.get("gpu") or "?")
    return out


def compare(a: Path, b: Path) -> list[dict]:
    """One row per hypothesis judged with a number in both trees: its two points and their relative difference.
    A pair of runs on two GPU models is no run-to-run noise: ValueError."""
    pa, pb = _points(Path(a)), _points(Path(b))
    models = {v[2] for v in (*pa.values(), *pb.values())}
    if len(models) > 1:
        raise ValueError(f"the two trees hold runs of {len(models)} GPU models ({', '.join(sorted(models))}): "
                         "run-to-run noise compares two runs on one GPU model")
    rows = []
    for key in sorted(set(pa) & set(pb)):
        (x, ra, model), (y, rb, _) = pa[key], pb[key]
        mean = (abs(x) + abs(y)) / 2
        rows.append({"system": key[0], "stem": key[1], "hypothesis": key[2], "a": x, "b": y,
                     "spread": abs(x - y), "noise": abs(x - y) / mean if mean else 0.0, "runs": f"{ra} vs {rb}",
                     "model": model})
    return rows


def _check_row(r, where: str) -> None:
    if not isinstance(r, dict):
        raise ValueError(f"{where} is a {type(r).__name__}, not an object")
    missing = [k for k in ROW_KEYS if k not in r]
    if missing:
        raise ValueError(f"{where} lacks {', '.join(missing)}")
    for k in ("a", "b", "spread", "noise"):
        v = r[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{where}: {k} is {v!r}, not a number")
    if r["spread"] < 0:
        raise ValueError(f"{where}: spread {r['spread']!r} is negative")
    for k in ("system", "stem", "hypothesis", "runs"):
        if not isinstance(r[k], str) or not r[k]:
            raise ValueError(f"{where}: {k} is {r[k]!r}, not a text")


def load(path: Path | None = None) -> dict:
    """{GPU model: {(system, stem, hypothesis): row}} from noise.json; {} when there is no file. A file that is
    there but damaged raises NoiseFileError naming it and what is wrong (never an empty set of margins)."""
    path = Path(path or NOISE_FILE)
    if not path.exists():
        return {}
    fix = f"restore it (git checkout {_rel(path)}) or remeasure it (python -m common noise A B --write)"
    try:
        d = json.loads(path.read_text())
        if not isinstance(d, dict):
            raise ValueError(f"the file is a JSON {type(d).__name__}, not an object")
        if d.get("version") != VERSION or not isinstance(d.get("models"), dict):
            raise ValueError(f"not a version-{VERSION} margins file (an object with \"version\": {VERSION} and "
                             "\"models\": {GPU model: {\"rows\": [...]}})")
        out = {}
        for model, m in d["models"].items():
            rows = m.get("rows") if isinstance(m, dict) else None
            if not isinstance(rows, list):
                raise ValueError(f"models[{model!r}].rows is {type(rows).__name__}, not a list")
            for i, r in enumerate(rows):
                _check_row(r, f"models[{model!r}].rows[{i}]")
            out[model] = {(r["system"], r["stem"], r["hypothesis"]): r for r in rows}
        return out
    except (OSError, UnicodeDecodeError) as e:
        raise NoiseFileError(f"the run-to-run margins file {_rel(path)} cannot be read ({e}); {fix}") from None
    except ValueError as e:     # json.JSONDecodeError is a ValueError
        raise NoiseFileError(f"the run-to-run margins file {_rel(path)} is damaged ({str(e).splitlines()[0][:200]}); "
                             f"{fix}") from None


def margin_for(system: str, stem: str, hypothesis: str, model: str | None, margins: dict | None = None,
               path: Path | None = None) -> dict | None:
    """The run-to-run noise a verdict on a run of GPU ``model`` uses, as a row plus ``"model"`` (the GPU model that
    measured it) and ``"borrowed"``: False when ``model`` itself measured this quantity's noise; True when it did
    not and the largest spread any other model measured stands in (the verdict says so and names that model). None
    when no model measured this quantity (the verdict then says "noise not measured")."""
    m = load(path) if margins is None else margins
    key = (system, stem, hypothesis)
    own = (m.get(model) or {}).get(key)
    if own:
        return {**own, "model": model, "borrowed": False}
    known = [(mod, rows[key]) for mod, rows in m.items() if key in rows]
    if not known:
        return None
    mod, row = max(known, key=lambda kv: kv[1]["spread"])
    return {**row, "model": mod, "borrowed": True}


def lookup(system: str, stem: str, hypothesis: str, path: Path | None = None, model: str | None = None) -> dict | None:
    """margin_for with the file read from ``path`` (kept for callers that name no model: the largest known)."""
    return margin_for(system, stem, hypothesis, model, path=path)


def models(path: Path | None = None) -> list[str]:
    """The GPU models noise.json has margins for."""
    return sorted(load(path))


def write(rows: list[dict], path: Path | None = None, model: str | None = None) -> Path:
    """Merge ``rows`` into the noise file under GPU ``model`` (default: each row's "model" as compare() gives it, else
    the model its runs' text names). Where two
    pairs of runs measured the same quantity on one model, the larger spread is kept with its runs: a margin is only
    as safe as the widest run-to-run move seen, and a quieter pair of runs does not make the earlier move untrue."""
    path = Path(path or NOISE_FILE)
    data = load(path) if path.exists() else {}
    for r in rows:
        mod = model or r.get("model") or _model_of(r["runs"].split(" vs ")[0])
        key = (r["system"], r["stem"], r["hypothesis"])
        cur = data.setdefault(mod, {})
        if key in cur and cur[key].get("spread", -1.0) > r["spread"]:
            continue
        cur[key] = {k: r[k] for k in ROW_KEYS}
    doc = {"about": "run-to-run noise per judged quantity and GPU model: spread = |a - b| of two runs on one GPU model, "
                    "noise = spread / their mean (python -m common noise A B --write); common.judge.verdicts asks a "
                    "verdict to hold with its point moved by the spread of its own GPU model",
           "version": VERSION,
           "models": {mod: {"rows": sorted(rs.values(), key=lambda r: (r["system"], r["stem"], r["hypothesis"]))}
                      for mod, rs in sorted(data.items())}}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)
    return path


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m common noise", description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="a result tree (a folder holding <system>/results/)")
    p.add_argument("b", help="a second run of the same experiments on the same GPU model")
    p.add_argument("--write", action="store_true", help=f"record the noise in {_rel(NOISE_FILE)}")
    a = p.parse_args(argv)
    for d in (a.a, a.b):
        if not Path(d).is_dir():
            print(f"[error] {d}: not a folder")
            return 2
    try:
        rows = compare(Path(a.a), Path(a.b))
    except ValueError as e:
        print(f"[error] {e}")
        return 2
    if not rows:
        print("[error] no hypothesis was judged with a number in both trees")
        return 2
    for r in rows:
        print(f"{r['system']:12s} {r['stem']:26s} {r['hypothesis']:32s} {r['a']:10.4g} {r['b']:10.4g} "
              f"{100 * r['noise']:6.1f}%")
    if a.write:
        print(f"wrote {_rel(write(rows))}")
    return 0
