"""`make reports`: refresh the machine-written blocks of <system>/reports/*.md from results.

A report is hand-written Markdown with blocks that this module owns:

    <!-- auto:03_profile_decode/story -->
    ...replaced on every refresh...
    <!-- /auto -->

Block keys: ``<stem>/story``, ``/observations``, ``/provenance``, ``/headline``, ``/errors``,
``/table:<name>`` (results/<stem>/<name>.csv; ``table:<name>[col1,col2]`` keeps those columns),
``/figure:<name>`` (results/<stem>/<name>.png,
copied to reports/figures/<stem>-<name>.png), and ``index`` (INDEX.md: every numbered script
with its last run). Only the inside of a block changes. A block whose results are missing
keeps its committed content, and the run lists it, so a fresh clone (no results/) leaves every
report byte for byte as committed. Files are rewritten only when a block really changed.

    python -m common.report                   # all systems
    python -m common.report --system flashinfer
"""
from __future__ import annotations

import math
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from . import REPO_ROOT, SYSTEMS
from .gpu import provenance_line
from .results import load_summary
from .story import fmt

BLOCK = re.compile(r"(<!-- auto:(?P<key>[^\s>]+) -->\n)(?P<body>.*?)(<!-- /auto -->)", re.S)
MAX_ROWS = 40


@dataclass
class Outcome:
    refreshed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)       # (file: key, why)
    files_written: list[str] = field(default_factory=list)


def _md_escape(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def md_table(rows: list[dict], columns: list[str] | None = None, max_rows: int = MAX_ROWS, more: str = "") -> str:
    if not rows:
        return "_(no rows)_"
    columns = columns or list(rows[0].keys())
    out = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows[:max_rows]:
        out.append("| " + " | ".join(_md_escape(fmt(_num(r.get(c))) if _num(r.get(c)) is not None else "-")
                                     for c in columns) + " |")
    if len(rows) > max_rows:
        out.append(f"\n_{len(rows) - max_rows} more rows{more}_")
    return "\n".join(out)


def _num(v):
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return int(v)
    return v


class Renderer:
    """Renders one block key of one system from its results folder."""

    def __init__(self, system_dir: Path, root: Path = REPO_ROOT):
        self.root = root
        self.sys_dir = system_dir
        self.results = system_dir / "results"
        self.reports = system_dir / "reports"
        self._cache: dict = {}

    def summary(self, stem: str) -> dict | None:
        if stem not in self._cache:
            s = load_summary(self.results / stem)
            self._cache[stem] = s if s and s.get("status") == "ok" else None
        return self._cache[stem]

    def render(self, key: str) -> tuple[str | None, str]:
        """(new body or None, reason when None)."""
        if key == "index":
            return self.index()
        if "/" not in key:
            return None, f"unknown block key {key!r}"
        stem, what = key.split("/", 1)
        s = self.summary(stem)
        if s is None:
            return None, f"no finished run in {self.results.relative_to(self.root) / stem}"
        if what == "story":
            return (f"```text\n{s['story'].rstrip()}\n```\n" if s.get("story") else None), "run has no story"
        if what == "provenance":
            return f"_Run: {provenance_line(s['provenance'])}_\n", ""
        if what == "headline":
            h = s.get("headline") or {}
            if not h:
                return None, "run has no headline figures"
            return "\n".join(f"- **{k}**: {fmt(_num(v))}" for k, v in h.items()) + "\n", ""
        if what == "observations":
            obs = s.get("observations") or []
            if not obs:
                return None, "run recorded no observations"
            rows = [{"expected (hypothesis)": o["expected"], "observed": o["observed"],
                     "verdict": f"**{o['verdict']}**", "evidence": o.get("evidence", "")} for o in obs]
            return md_table(rows, max_rows=100) + "\n", ""
        if what == "errors":
            errs = s.get("point_errors") or []
            return (md_table(errs) + "\n") if errs else "_No sweep point failed in the last run._\n", ""
        if what.startswith("table:"):
            name, cols = what.split(":", 1)[1], None
            if name.endswith("]") and "[" in name:  # table:NAME[col1,col2,...] keeps those columns
                name, cols = name[:-1].split("[", 1)
                cols = [c for c in cols.split(",") if c]
            p = self.results / stem / f"{name}.csv"
            if not p.is_file():
                return None, f"{p.name} missing"
            import pandas as pd
            try:
                df = pd.read_csv(p)
            except pd.errors.EmptyDataError:
                return "_(the run wrote an empty table)_\n", ""
            if cols:
                missing = [c for c in cols if c not in df.columns]
                if missing:
                    return None, f"{p.name} has no column(s) {missing}"
                df = df[cols]
            return md_table(df.to_dict("records"), more=f" in `{p.relative_to(self.root)}`") + "\n", ""
        if what.startswith("figure:"):
            name = what.split(":", 1)[1]
            p = self.results / stem / f"{name}.png"
            if not p.is_file():
                return None, f"{p.name} missing"
            dst = self.reports / "figures" / f"{stem}-{name}.png"
            dst.parent.mkdir(parents=True, exist_ok=True)
            if not dst.exists() or dst.read_bytes() != p.read_bytes():
                shutil.copyfile(p, dst)
            return f"![{stem} {name}](figures/{dst.name})\n", ""
        return None, f"unknown block kind {what!r}"

    def index(self) -> tuple[str | None, str]:
        scripts = sorted(p for p in (self.sys_dir / "scripts").glob("[0-9][0-9]_*") if p.suffix in (".py", ".sh"))
        rows, any_run = [], False
        for sc in scripts:
            d = self.results / sc.stem
            s = load_summary(d)
            failed = sorted(d.glob("failed-*")) if d.is_dir() else []
            if s:
                any_run = True
            head = s.get("headline", {}) if s else {}
            rows.append({
                "script": f"[`{sc.name}`](../scripts/{sc.name})",
                "last run": (s or {}).get("provenance", {}).get("date_utc", "-"),
                "status": (s or {}).get("status", "not run") + (f" ({len(failed)} failed kept)" if failed else ""),
                "GPU": (s or {}).get("provenance", {}).get("gpu", "-"),
                "headline": "; ".join(f"{k}={fmt(_num(v))}" for k, v in list(head.items())[:3]) or "-",
            })
        if not any_run:
            return None, "no results in this clone"
        return md_table(rows, max_rows=100) + "\n", ""


def refresh(systems=SYSTEMS, root: Path = REPO_ROOT, echo=print) -> Outcome:
    out = Outcome()
    for system in systems:
        sd = root / system
        rdir = sd / "reports"
        if not rdir.is_dir():
            continue
        r = Renderer(sd, root)
        for md in sorted(rdir.glob("*.md")):
            text = md.read_text()
            changed = False

            def sub(m):
                nonlocal changed
                key = m.group("key")
                body, why = r.render(key)
                label = f"{system}/reports/{md.name}: {key}"
                if body is None:
                    out.kept.append(f"{label} ({why})")
                    return m.group(0)
                out.refreshed.append(label)
                if body != m.group("body"):
                    changed = True
                return m.group(1) + body + m.group(4)

            new = BLOCK.sub(sub, text)
            if changed and new != text:
                tmp = md.with_suffix(".md.tmp")
                tmp.write_text(new)
                tmp.replace(md)
                out.files_written.append(str(md.relative_to(root)))
    return out


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m common.report",
                                description="Refresh the auto blocks of <system>/reports/*.md from results/.")
    p.add_argument("--system", choices=SYSTEMS, action="append", help="only this system (repeatable)")
    p.add_argument("--quiet", action="store_true", help="print only the totals")
    a = p.parse_args(argv)
    o = refresh(a.system or SYSTEMS)
    if not a.quiet:
        for f in o.files_written:
            print(f"updated {f}")
        if o.kept:
            print(f"\n{len(o.kept)} block(s) kept as committed (nothing newer to put there):")
            for k in o.kept:
                print(f"  - {k}")
    print(f"\nreports: {len(o.refreshed)} block(s) refreshed from results, {len(o.kept)} kept, "
          f"{len(o.files_written)} file(s) changed")
    return 0


if __name__ == "__main__":
    from .checks import run_main
    run_main(main)
