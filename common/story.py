"""ASCII execution stories: trees, timelines and tables, as in PLAN.md.

    print(tree("EXECUTION STORY: one request", [
        ("Tokenize 0.4 ms (CPU) -> 2,057 tokens", []),
        ("Prefill 38.1 ms", [("hotspot: attention 45%", [])]),
    ]))
    print(timeline(events, width=96))      # one lane per row, '#' where the event runs
    print(table(rows, ["kernel", "time_us", "dram_pct"]))
    print(kernel_line(summary_row))        # "Decode 198.7 us <- DRAM 57% SM 74% TC 0% occ 35% (registers) ..."

Everything returns a string; nothing here measures or reads files.
"""
from __future__ import annotations

import math


def tree(title: str, items, indent: str = "") -> str:
    """Render nested (label, children) pairs as a box-drawing tree under ``title``."""
    lines = [title] if title else []

    def walk(nodes, prefix):
        nodes = list(nodes)
        for i, node in enumerate(nodes):
            label, children = (node, []) if isinstance(node, str) else node
            last = i == len(nodes) - 1
            lines.append(f"{indent}{prefix}{'└── ' if last else '├── '}{label}")
            walk(children, prefix + ("    " if last else "│   "))
    walk(items, "")
    return "\n".join(lines)


def fmt(v, digits: int = 3) -> str:
    """Numbers with sensible precision; NaN/None as '-'."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        a = abs(v)
        if a == 0:
            return "0"
        if a >= 1e5 or (a >= 1000 and digits <= 3):
            return f"{v:,.0f}"       # thousands separated, as ints are: 1,965 next to 1,955
        if a >= 100:
            return f"{v:.0f}" if digits <= 3 else f"{v:.1f}"
        if a >= 10:
            return f"{v:.1f}"
        if a >= 0.01:
            return f"{v:.{max(digits - 1, 1)}f}"
        return f"{v:.2e}"
    return str(v)


def table(rows, columns=None, headers=None, max_width: int = 48) -> str:
    """Fixed-width text table from a list of dicts (or a DataFrame)."""
    if hasattr(rows, "to_dict"):
        rows = rows.to_dict("records")
    rows = list(rows)
    if not rows:
        return "(no rows)"
    columns = columns or list(rows[0].keys())
    headers = headers or columns
    cells = [[fmt(r.get(c))[:max_width] for c in columns] for r in rows]
    w = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(headers)]
    num = [all(_numeric(r.get(c)) for r in rows) for c in columns]
    line = lambda vals: "  ".join(v.rjust(w[i]) if num[i] else v.ljust(w[i]) for i, v in enumerate(vals))
    return "\n".join([line(headers), "  ".join("-" * x for x in w)] + [line(r) for r in cells])


def _numeric(v) -> bool:
    return v is None or isinstance(v, (int, float)) and not isinstance(v, bool)


def bar(value: float, vmax: float, width: int = 30, char: str = "█") -> str:
    """A horizontal bar scaled to vmax."""
    if not vmax or value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    n = max(0, min(width, round(width * value / vmax)))
    return char * n


def timeline(events, width: int = 100, label_width: int = 28, lane_key: str = "lane",
             start: float | None = None, end: float | None = None, unit: str = "ms") -> str:
    """ASCII Gantt chart. ``events``: dicts with lane, start, end (same unit), optional mark char.

    Each lane is one row; '#' (or the event's ``mark``) fills the columns where the event ran.
    """
    events = [e for e in events if e.get("end") is not None]
    if not events:
        return "(no events)"
    t0 = min(e["start"] for e in events) if start is None else start
    t1 = max(e["end"] for e in events) if end is None else end
    span = (t1 - t0) or 1.0
    lanes: dict[str, list] = {}
    for e in events:
        lanes.setdefault(str(e[lane_key]), []).append(e)
    out = []
    for lane, evs in lanes.items():
        row = [" "] * width
        for e in evs:
            a = int((e["start"] - t0) / span * (width - 1))
            b = max(a, int((e["end"] - t0) / span * (width - 1)))
            for i in range(max(a, 0), min(b, width - 1) + 1):
                row[i] = e.get("mark", "#")
        out.append(f"{lane[:label_width]:<{label_width}} |{''.join(row)}|")
    axis = f"{'':<{label_width}} {fmt(t0)} {unit}".ljust(label_width + width - 6) + f"{fmt(t1)} {unit}"
    return "\n".join(out + [axis])


def kernel_line(r: dict) -> str:
    """One kernel with its hardware context, from a common.ncu.summarize() row."""
    parts = [f"{r.get('kernel', '?')} {fmt(r.get('time_us'))} us <-"]
    if r.get("dram_pct") is not None:
        parts.append(f"DRAM {fmt(r.get('dram_pct'))}%")
    if r.get("dram_tb_s") is not None and not _nan(r.get("dram_tb_s")):
        parts.append(f"({fmt(r.get('dram_tb_s'))} TB/s)")
    parts.append(f"SM {fmt(r.get('sm_pct'))}%")
    parts.append(f"TC {fmt(r.get('tensor_pct'))}%")
    parts.append(f"occ {fmt(r.get('occupancy_pct'))}% (limit: {r.get('limiter', 'n/a')})")
    if r.get("top_stalls"):
        parts.append(f"stalls: {r['top_stalls']}")
    return " ".join(parts)


def _nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)
