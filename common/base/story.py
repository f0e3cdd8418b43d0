"""ASCII execution stories: trees, timelines and tables, as in PLAN.md.

    print(tree("EXECUTION STORY: one request", [
        ("Tokenize 0.4 ms (CPU) -> 2,057 tokens", []),
        ("Prefill 38.1 ms", [("hotspot: attention 45%", [])]),
    ]))
    print(timeline(events, width=96))      # one lane per row, '#' where the event runs
    print(table(rows, ["kernel", "ncu_time_us", "dram_pct"]))

A kernel's own line (work and counters) is common.tables.kernels.node / line: one format for every report.

Everything returns a string; nothing here measures or reads files.
"""
from __future__ import annotations

import math
import re

GIB, MIB = 1 << 30, 1 << 20
WIDTH = 120     # the widest line a story prints: trees wrap to it (a report read on a code host does not scroll)


def wrap(text: str, first: str, rest: str, width: int = WIDTH) -> list[str]:
    """``text`` after the prefix ``first``, continued on lines that start with ``rest``, none over ``width``
    characters (words are not split; a single word longer than the room is left whole)."""
    import textwrap
    room = max(20, width - max(len(first), len(rest)))
    parts = textwrap.wrap(str(text), room, break_long_words=False, break_on_hyphens=False) or [""]
    return [first + parts[0]] + [rest + p for p in parts[1:]]


_GUIDE = re.compile(r"^[ │├└─]*")


def fold(text: str, width: int = WIDTH) -> str:
    """Every line of ``text`` no longer than ``width``: a longer line continues on lines that keep its tree
    guide (the leading ``│ ├── └──`` run, with the branch turned into ``│`` or blank) and two more spaces.
    Lines of ``width`` or less are left byte for byte, so folding twice changes nothing. A table row whose
    columns are padded with spaces folds at word boundaries like any line (nothing is cut off)."""
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        guide = _GUIDE.match(line).group(0)
        rest = guide.replace("├──", "│  ").replace("└──", "   ").replace("─", " ")
        body = line[len(guide):]
        room = max(20, width - len(rest) - 2)
        parts, cur = [], ""
        for word in re.split(r"(?<= )", body):          # keep the spaces: padded columns stay aligned
            if cur and len(cur) + len(word.rstrip()) > (room if parts else width - len(guide)):
                parts.append(cur.rstrip())
                cur = word.lstrip(" ")
            else:
                cur += word
        parts.append(cur.rstrip())
        out.append(guide + parts[0])
        out.extend(rest + "  " + p for p in parts[1:] if p)
    return "\n".join(out)


def section(text: str, titles: list[str], depth: int | None = None) -> str:
    """The part of a story tree under the top-level branches whose label starts with one of ``titles``
    (case-insensitive), with the tree's title line; ``depth``: keep branches down to that level only
    (1 = the top-level label, 2 = its children...) and say how many lines were left out. Raises KeyError
    naming the branches there are when a title matches none."""
    lines = text.split("\n")
    top = [i for i, ln in enumerate(lines) if ln.startswith(("├── ", "└── "))]
    head = lines[:top[0]] if top else lines
    keep, found = [], set()
    for n, i in enumerate(top):
        end = top[n + 1] if n + 1 < len(top) else len(lines)
        label = lines[i][4:].lower()
        hit = [t for t in titles if label.startswith(t.lower())]
        if not hit:
            continue
        found.update(hit)
        block = lines[i:end]
        if depth is not None:
            kept, keep_it = [], True
            for ln in block:
                m = re.match(r"^[ │]*[├└]", ln)
                if m:                                   # a branch: its level from where its ├/└ sits
                    keep_it = (len(m.group(0)) - 1) // 4 + 1 <= depth
                if keep_it:                             # a continuation line follows its branch
                    kept.append(ln)
            if len(kept) < len(block):
                kept.append(f"{'│' if n + 1 < len(top) else ' '}   … {len(block) - len(kept)} deeper lines in story.txt")
            block = kept
        keep.extend(block)
    missing = [t for t in titles if t not in found]
    if missing:
        raise KeyError(f"no branch starts with {missing}; the branches are: "
                       + "; ".join(lines[i][4:60] for i in top))
    return "\n".join(head + keep)


def tree(title: str, items, indent: str = "", width: int = WIDTH) -> str:
    """Render nested (label, children) pairs as a box-drawing tree under ``title``; a label longer than the
    room left by ``width`` wraps onto continuation lines under itself (the tree's lines stay unbroken)."""
    lines = wrap(title, "", "  ", width) if title else []

    def walk(nodes, prefix):
        nodes = list(nodes)
        for i, node in enumerate(nodes):
            label, children = (node, []) if isinstance(node, str) else node
            last = i == len(nodes) - 1
            below = prefix + ("    " if last else "│   ")
            lines.extend(wrap(label, f"{indent}{prefix}{'└── ' if last else '├── '}",
                              f"{indent}{below}{'│ ' if children else '  '}", width))
            walk(children, below)
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



def fmt_bytes(b: float) -> str:
    return f"{b / GIB:g} GiB" if b >= GIB else f"{b / MIB:g} MiB"
