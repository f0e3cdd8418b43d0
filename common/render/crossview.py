"""The same Llama-3.1-8B shapes in the three systems, side by side (CROSS-SYSTEM.md, `make reports`).

Two shapes every system measures:
- ``decode``: one decode step's attention at batch 32 x 4096 tokens of KV cache per request (SGLang 05 as
  served with CUDA graphs, mini-SGLang 04 through its attention backends, FlashInfer 03 alone);
- ``prefill``: the attention of a 512-token prompt at batch 1 (SGLang 08's traced request, mini-SGLang 08's
  forward, FlashInfer 02 alone).

Each row is one kernel of one system, read from that system's recorded tables (results/<stem>/*.csv, the
columns common.tables.kernels declares): its ncu kernel time and counters, and the traced kernel time where the
system recorded one. Rows are medians over the repeated launches. Nothing here measures; a system whose run
is missing gives no rows, and the block keeps what it showed (common.render.report).

    python -m common crossview            # print both tables from the results/ of this checkout
"""
from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

from common import REPO_ROOT
from common.capture.gpu import machine_of
from common.tables import kernels

# one layer's K and V of a decode step at batch 32 x 4096 (Llama-3.1-8B: 8 KV heads x 128, bf16): the bytes a
# decode attention kernel must read; an ncu launch that moved far less is a step with a shorter KV
KV_BYTES_B32_4K = 32 * 4096 * 8 * 128 * 2 * 2
COLUMNS = ["system", "how it runs", "kernel", "launches", "traced_us", "ncu_us", "dram_tb_s", "dram_pct",
           "dram_kind", "l2_hit_pct", "tensor_pct", "occupancy_pct", "limiter"]


def _rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _num(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if x != x else x


def _med(rows: list[dict], col: str) -> float | None:
    vals = [x for x in (_num(r.get(col)) for r in rows) if x is not None]
    return statistics.median(vals) if vals else None


def _group(system: str, how: str, rows: list[dict], traced: dict | None = None) -> list[dict]:
    """One row per kernel name (launch order kept): medians of the counters over its launches."""
    out, names = [], list(dict.fromkeys(r["kernel"] for r in rows))
    for k in names:
        g = [r for r in rows if r["kernel"] == k]
        hit = _med(g, "l2_hit_pct")
        out.append({"system": system, "how it runs": how, "kernel": k, "launches": len(g),
                    "traced_us": (traced or {}).get(k), "ncu_us": _med(g, "ncu_time_us"),
                    "dram_tb_s": _med(g, "dram_tb_s"), "dram_pct": _med(g, "dram_pct"),
                    "dram_kind": g[0].get("dram_kind", ""),
                    "l2_hit_pct": hit if hit is not None and hit <= 100.5 else None,
                    "tensor_pct": _med(g, "tensor_pct"), "occupancy_pct": _med(g, "occupancy_pct"),
                    "limiter": g[0].get("limiter", "")})
    return out


def _dram_mb(r: dict) -> float:
    return (_num(r.get("dram_read_mb")) or 0.0) + (_num(r.get("dram_write_mb")) or 0.0)


def _usable(folder: Path, machine: str | None) -> bool:
    """Whether the run in ``folder`` (results/<stem>) is on ``machine`` (any run with provenance when None: the
    tables are read whatever wrote them, as the fixtures' cut summaries)."""
    try:
        prov = json.loads((folder / "summary.json").read_text()).get("provenance")
    except (OSError, ValueError, AttributeError):
        return machine is None
    return machine is None or (isinstance(prov, dict) and machine_of(prov) == machine)


def decode(root: Path = REPO_ROOT, machine: str | None = None) -> tuple[list[dict], list[Path]]:
    """(rows, the summary.json of each run read) for the decode shape, from runs on ``machine``."""
    rows, used = [], []
    sg = root / "sglang/results/05_ncu_attention"
    a = [r for r in _rows(sg / "attention_kernels.csv") if r.get("stage") == "decode"] if _usable(sg, machine) else []
    kv = {r["launch"]: _dram_mb(r) * 1e6 for r in a if "Merge" not in r["kernel"]}
    full = set(kv) - kernels.other_step_launches(kv, expected=KV_BYTES_B32_4K)
    if full:
        rows += _group("SGLang", "served, decode CUDA graph (05; launches that read the whole KV)",
                       [r for r in a if r["launch"] in full])
        used.append(sg / "summary.json")
    ms = root / "mini-sglang/results/04_profile_attention"
    m = [r for r in _rows(ms / "ncu_kernels.csv") if "decode bs=32 kv=4096" in r.get("call", "")] \
        if _usable(ms, machine) else []
    for variant, how in (("fi", "forward's backend, tensor-core decode (04)"),
                         ("fi tc=off", "backend with tensor cores off (04)")):
        g = [r for r in m if r.get("variant") == variant]
        if g:
            rows += _group("mini-SGLang", how, g)
    if m:
        used.append(ms / "summary.json")
    fi = root / "flashinfer/results/03_profile_decode"
    f = [r for r in _rows(fi / "kernels.csv") if r.get("batch") == "32" and r.get("kv_len") == "4096"
         and r.get("model", "llama-3.1-8b") == "llama-3.1-8b"] if _usable(fi, machine) else []
    for variant, how in (("tc", "alone, use_tensor_cores=True (03)"), ("cuda", "alone, CUDA cores (03)")):
        g = [r for r in f if r.get("variant") == variant]
        if any(r.get("kind") == "reference" for r in g):
            g = [r for r in g if r.get("kind") == "reference"]
        if g:
            rows += _group("FlashInfer", how, g)
    if f:
        used.append(fi / "summary.json")
    return rows, used


def prefill(root: Path = REPO_ROOT, machine: str | None = None) -> tuple[list[dict], list[Path]]:
    """(rows, the summary.json of each run read) for the 512-token prefill shape, from runs on ``machine``."""
    rows, used = [], []
    for system, how, folder, keep in (
            ("SGLang", "served, one text request (08; BOS cached: ragged + paged + merge)",
             "sglang/results/08_execution_story", {"story": "one", "mode": "EXTEND"}),
            ("mini-SGLang", "its forward, 512-token prompt (08, graph variant)",
             "mini-sglang/results/08_forward_timeline", {"variant": "graph", "mode": "prefill"})):
        a = [r for r in _rows(root / folder / "layer_tree.csv") if r.get("role") == "attention"
             and all(r.get(k) == v for k, v in keep.items())] \
            if _usable(root / folder, machine) else []            # the traced joined tree: traced times too
        if a:
            rows += _group(system, how, a, {r["kernel"]: _num(r.get("dur_us")) for r in a})
            used.append(root / folder / "summary.json")
    fi = root / "flashinfer/results/02_profile_prefill"
    f = [r for r in _rows(fi / "kernels.csv") if r.get("kind") == "reference" and r.get("batch") == "1"
         and r.get("qo_len") == "512" and r.get("kv_len") == "512"] if _usable(fi, machine) else []
    for backend, how in (("fa2", "alone, FA2 paged prefill (02)"), ("fa3", "alone, FA3 (02)")):
        g = [r for r in f if r.get("backend") == backend]
        if g:
            rows += _group("FlashInfer", how, g)
    if f:
        used.append(fi / "summary.json")
    return rows, used


SHAPES = {"decode": decode, "prefill": prefill}


def render(shape: str, root: Path = REPO_ROOT, machine: str | None = None) -> tuple[str | None, str]:
    """(the block's Markdown: each run's line, then the table; or None and why) for ``cross/<shape>``, from the runs on
    ``machine`` (the refresh's: one machine's figures side by side)."""
    import json

    from common.render.markdown import md_table, run_line
    if shape not in SHAPES:
        return None, f"unknown shape {shape!r} (one of {sorted(SHAPES)})"
    rows, used = SHAPES[shape](root, machine)
    if not rows:
        return None, f"no system has a run of the {shape} shape in its results/"
    lines = []
    for p in used:
        try:
            lines.append(run_line(json.loads(p.read_text())["provenance"]))
        except (OSError, ValueError, KeyError):
            return None, f"{p.relative_to(root)}: no readable provenance"
    return "\n".join(dict.fromkeys(lines)) + "\n" + md_table(rows, COLUMNS, max_rows=100) + "\n", ""


def main() -> int:
    for shape in SHAPES:
        body, why = render(shape)
        print(f"== {shape}\n{body or why}")
    return 0
