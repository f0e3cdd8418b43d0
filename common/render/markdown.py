"""Markdown pieces every rendered page shares: tables (typed cells read from a run's CSV) and a block's run line.

    md_table(rows, columns)      # a Markdown table, at most MAX_ROWS rows
    read_table(path)             # (columns, rows) of a results CSV, cells typed as pandas would
    run_line(provenance)         # '<!-- run: 1x NVIDIA H200 · torch ... · commit ... · 2026-11-27 -->'
"""
from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path

from common.base.story import fmt
from common.capture.gpu import machine_of

MAX_ROWS = 40

STACK = ("torch", "flashinfer-python", "sglang")

# what pandas.read_csv reads as missing by default: tables render the same with or without pandas
NA = {"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
      "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"}

BOOLS = {"True": True, "TRUE": True, "true": True, "False": False, "FALSE": False, "false": False}


class Skip(Exception):
    """A results file that cannot be used (the message says what is wrong); its block is kept."""


def _md_escape(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _num(v):
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return int(v)
    return v


def _cell(v) -> str:
    v = _num(v)
    return _md_escape(fmt(v) if v is not None else "-")


def _md_row(r: dict, columns) -> str:
    return "| " + " | ".join(_cell(r.get(c)) for c in columns) + " |"


def md_table(rows: list[dict], columns: list[str] | None = None, max_rows: int = MAX_ROWS, more: str = "") -> str:
    if not rows:
        return "_(no rows)_"
    columns = columns or list(rows[0].keys())
    out = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    out += [_md_row(r, columns) for r in rows[:max_rows]]
    if len(rows) > max_rows:
        out.append(f"\n_{len(rows) - max_rows} more rows{more}_")
    return "\n".join(out)


def _typed(values: list) -> list:
    """One CSV column as pandas would type it: all ints, else all floats, else all bools, else text."""
    present = [v for v in values if v not in NA]
    for conv in (_int, _float, BOOLS.__getitem__):
        try:
            [conv(v) for v in present]
        except (ValueError, KeyError):
            continue
        return [None if v in NA else conv(v) for v in values]
    return [None if v in NA else v for v in values]


def _int(s: str) -> int:
    if not re.fullmatch(r"[+-]?\d+", s):
        raise ValueError(s)
    return int(s)


def _float(s: str) -> float:
    if "_" in s or s != s.strip():
        raise ValueError(s)
    return float(s)


def read_table(p: Path) -> tuple[list[str], list[dict]] | None:
    """(columns, rows) of a CSV with typed cells; None for an empty file; Skip when unusable."""
    try:
        text = p.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise Skip(f"not text (undecodable byte 0x{e.object[e.start]:02x} at offset {e.start})") from None
    except OSError as e:
        raise Skip(f"unreadable ({e.strerror or e})") from None
    try:
        lines = [r for r in csv.reader(io.StringIO(text, newline="")) if r]
    except csv.Error as e:
        raise Skip(f"not a readable CSV ({e})") from None
    if not lines:
        return None
    cols, data = lines[0], lines[1:]
    for i, r in enumerate(data, 2):
        if len(r) > len(cols):
            raise Skip(f"line {i} has {len(r)} fields, the header {len(cols)}")
    data = [r + [""] * (len(cols) - len(r)) for r in data]
    typed = [_typed([r[j] for r in data]) for j in range(len(cols))]
    return cols, [{c: typed[j][i] for j, c in enumerate(cols)} for i in range(len(data))]


def _hidden(s) -> str:
    return str(s).replace("-->", "->").replace(" · ", ", ").replace("\n", " ")


def run_line(prov: dict) -> str:
    """The hidden first line of a block rendered from a run: GPU · stack · commit · date."""
    pk = prov.get("packages") or {}
    stack = ", ".join(f"{k} {pk[k]}" for k in STACK if k in pk) or "no stack recorded"
    git = prov.get("git") or {}
    commit = f"{git.get('commit', '?')}{' (dirty)' if git.get('dirty') else ''}"
    fields = (machine_of(prov), stack, f"commit {commit}",
              str(prov.get("date_utc", "?"))[:10])
    return f"<!-- run: {' · '.join(_hidden(f) for f in fields)} -->"
