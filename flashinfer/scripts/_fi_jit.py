"""FlashInfer's JIT cache as it lies on disk: the modules of a cached_ops/ folder, their .ninja_log (00, 01, 07)."""
from __future__ import annotations

from pathlib import Path


class NinjaLogError(ValueError):
    """A file that is not a ninja build log."""


def parse_ninja_log(text: str):
    """``.ninja_log`` (v5-v7: '# ninja log vN' then start_ms, end_ms, mtime, output, hash per line)
    -> DataFrame output, start_ms, end_ms, seconds; the last entry wins when an output was rebuilt."""
    import pandas as pd
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# ninja log v"):
        raise NinjaLogError("not a .ninja_log: the first line should read '# ninja log vN'")
    rows = {}
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip() or line.startswith("#"):
            continue
        f = line.split("\t")
        if len(f) != 5 or not (f[0].isdigit() and f[1].isdigit()):
            raise NinjaLogError(f".ninja_log line {n} has {len(f)} fields, expected 5 (start, end, mtime, "
                                f"output, hash): {line[:80]!r}")
        rows[f[3]] = {"output": f[3], "start_ms": int(f[0]), "end_ms": int(f[1]),
                      "seconds": (int(f[1]) - int(f[0])) / 1e3}
    return pd.DataFrame(list(rows.values()), columns=["output", "start_ms", "end_ms", "seconds"])


def jit_modules(jit_dir) -> list[dict]:
    """Compiled modules in a FlashInfer JIT folder (cached_ops/): name, .so size, objects, build span."""
    out = []
    d = Path(jit_dir)
    if not d.is_dir():
        return out
    for m in sorted(p for p in d.iterdir() if p.is_dir() and p.name != "tmp"):
        so = m / f"{m.name}.so"
        row = {"module": m.name, "compiled": so.is_file(), "so_mb": round(so.stat().st_size / 1e6, 2) if so.is_file() else None,
               "objects": len(list(m.glob("*.o"))), "so_mtime": so.stat().st_mtime if so.is_file() else None}
        log = m / ".ninja_log"
        if log.is_file():
            try:
                nl = parse_ninja_log(log.read_text(errors="replace"))
                objs = nl[nl["output"].str.endswith(".o")]
                row.update(nvcc_sum_s=round(objs["seconds"].sum(), 1), nvcc_max_s=round(objs["seconds"].max(), 1)
                           if len(objs) else None, build_span_s=round((nl["end_ms"].max() - nl["start_ms"].min()) / 1e3, 1)
                           if len(nl) else None)
            except NinjaLogError as e:
                row["ninja_log"] = str(e)
        out.append(row)
    return out


def short_module(name: str) -> str:
    """A readable label for a long attention uri (the full name stays in the tables)."""
    kind = ("batch_decode" if name.startswith("batch_decode") else
            "batch_prefill" if name.startswith("batch_prefill") else name)
    if kind == name:
        return name
    return kind + ("_sm90 (fa3)" if name.endswith("_sm90") else "")
