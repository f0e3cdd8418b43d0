"""The kernel table, declared once: one row per GPU kernel launch, every column with its unit and meaning.

    COLUMNS["dram_pct"].doc                 # what a column means (the glossary is built from these docs)
    names("counters")                       # the columns Nsight Compute fills, in order
    ncu_metrics()                           # the ncu metrics those columns need (common.tables.kernels.SUMMARY_METRICS)
    counters(raw_df, peaks)                 # the counter columns of every profiled launch (common.tables.kernels.summarize)
    joined(kt, peaks)                       # the columns that need two stages: ncu / traced time, L2-resident
    node(row, peaks)                        # a kernel as a story-tree node: its line, its work, its counters

Groups, and the stage that fills each (the table travels through them in this order):

    trace     common.tables.trace / common.tables.timeline.step_kernels   which kernel ran when, in which step
    layers    common.tables.timeline                               layer, position, segment and role in the forward
    work      common.tables.timeline.add_work (common.tables.flops)       FLOPs and bytes of the role; rates from the traced time
    counters  common.tables.kernels.summarize (Nsight Compute)         what the hardware counted while the kernel ran
    joined    joined()                                      what needs both: ncu vs traced time, L2 residency

Two rates, never confused (every line says which it prints):
  * effective bandwidth (``eff_tb_s``): the bytes a formula says the kernel must move, over its traced time.
    It is not a DRAM rate: when the data sits in L2 (a producer kernel just wrote it; 50 MB of L2 on an H100,
    60 MB on an H200) the kernel moves fewer DRAM bytes than the formula, and effective bandwidth can exceed
    what DRAM can deliver. It is compared with a DRAM ceiling only where the working set is several times
    the L2 (``stream_pct``, e.g. a decode step reading all the weights), and the line says so.
  * DRAM bandwidth (``dram_tb_s``, ``dram_pct``): the bytes Nsight Compute counted at DRAM
    (dram__bytes_read + dram__bytes_write) over ncu's kernel time, as % of the measured DRAM ceiling of the
    same kind of traffic (read, write or copy: common.capture.ceilings.dram_for). The L2 hit rate sits beside it.

To add an Nsight Compute metric to every kernel line of every report: one ``Col`` in COUNTERS (the metric
and how its column is derived) and its ``show`` format; the glossary (``python -m common report``) and the
Perfetto args follow from the declaration.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from common.capture.ncu import CACHE_CONTROL, MARKER_KERNEL, NcuParseError, profile, read_raw, short_name

# ------------------------------------------------------------------ ncu metric names (checked against
# `ncu --query-metrics --chip gh100` and a real `--set full` CSV: tests/fixtures/ncu_metric_names_gh100_h200.txt)

STALL_REASONS = ("barrier", "branch_resolving", "dispatch_stall", "drain", "gmma", "imc_miss",
                 "lg_throttle", "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle",
                 "misc", "no_instruction", "not_selected", "selected", "short_scoreboard", "sleeping",
                 "tex_throttle", "wait")
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
TENSOR_METRICS = (  # every one present is read, the highest wins; Hopper wgmma shows under the hgmma/qgmma name
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_type_hmma_hgmma_qgmma_imma_igmma_bmma_bgmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
)
DRAM_SOL_METRICS = ("dram__throughput.avg.pct_of_peak_sustained_elapsed",       # the summary list's name
                    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed")   # --set full's name
OCCUPANCY_LIMITS = ("registers", "shared_mem", "warps", "blocks")


@dataclass(frozen=True)
class Col:
    """One column of the kernel table. ``metrics``: the ncu metrics a counter column reads (the first present
    wins unless its ``derive`` reads several); ``derive(m)``: the column from a metric reader (counters only);
    ``show(row)``: how it reads on a kernel line (None: not on the line)."""
    name: str
    group: str
    unit: str
    doc: str
    metrics: tuple = ()
    derive: Callable | None = field(default=None, compare=False)
    show: Callable | None = field(default=None, compare=False)


L2_HIT_MAX = 100.5      # ncu's hit rate above this (rounding aside) is a mismatch of replay passes, not a rate


def _in_pct_range(vals):
    """ncu's hit rate where it is one (0 to 100%), NaN where ncu read it outside that range."""
    import numpy as np
    v = np.asarray(vals, dtype=float)
    return np.where((v >= 0) & (v <= L2_HIT_MAX), v, np.nan)


def _ok(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and v != ""


def _f(v, digits: int = 3) -> str:
    from common.base.story import fmt
    return fmt(v, digits)


# ------------------------------------------------------------------ the declaration

TRACE = [
    Col("step", "trace", "", "0-based index of the traced step (a scheduler step, a forward, a sweep point)"),
    Col("step_name", "trace", "", "the profiler range of the step, e.g. step[DECODE bs=32]"),
    Col("order", "trace", "", "launch order of the kernel inside its step"),
    Col("kernel", "trace", "", "short kernel name (template arguments and namespaces cut)"),
    Col("cls", "trace", "", "kernel class: gemm, attention, norm, rope, activation, kv_store, sampling, ..."),
    Col("ts_us", "trace", "us", "start on the GPU, profiler clock"),
    Col("dur_us", "trace", "us", "kernel time: the kernel's own duration in the traced run (torch profiler / CUPTI), "
        "no launch gaps; the time every rate of the work group divides by"),
    Col("end_us", "trace", "us", "end on the GPU"),
    Col("stream", "trace", "", "CUDA stream"),
]
LAYERS = [
    Col("layer", "layers", "", "transformer layer of the kernel (none before the first and after the last layer)"),
    Col("pos", "layers", "", "position of the kernel inside its layer"),
    Col("segment", "layers", "", "pre (input preparation, embedding) | layer | post (final norm, logits, sampling)"),
    Col("role", "layers", "", "what the kernel does for the model: qkv_proj, o_proj, gate_up_proj, down_proj, "
        "input_norm, post_norm, rope, kv_store, attention, act, embedding, final_norm, lm_head, sampling, prepare"),
]
WORK = [
    Col("flops", "work", "FLOP", "floating-point operations the role needs (common.tables.flops)"),
    Col("bytes", "work", "byte", "formula bytes: the bytes the role must read and write at least (common.tables.flops)"),
    Col("tflop_s", "work", "TFLOP/s", "flops / kernel time (traced)",
        show=lambda r: f"{_f(r['tflop_s'])} TFLOP/s" + (f" = {_f(r['pct_bf16_ceiling'])}% of the bf16 ceiling"
                                                       if _ok(r.get("pct_bf16_ceiling")) else "")
        if _ok(r.get("tflop_s")) and r["tflop_s"] >= 1 else None),
    Col("pct_bf16_ceiling", "work", "%", "tflop_s as % of this GPU's measured bf16 tensor ceiling"),
    Col("eff_tb_s", "work", "TB/s", "formula bytes / kernel time (traced). Not a DRAM rate: data a producer left in "
        "L2 is counted but never read from DRAM",
        show=lambda r: (f"effective {_f(r['eff_tb_s'])} TB/s (formula bytes / time)"
                        + (f" = {_f(r['stream_pct'])}% of the DRAM read ceiling, weights streamed"
                           if _ok(r.get("stream_pct")) else ""))
        if _ok(r.get("eff_tb_s")) and r["eff_tb_s"] >= 0.05 else None),
    Col("stream_pct", "work", "%", "effective bandwidth of a GEMM as % of the DRAM read ceiling; "
        "given only where the step's weights are many times the L2 (each layer's weights were evicted by the other "
        "layers' since the last step), so the formula bytes do come from DRAM"),
]


def _time_us(m):
    return m.col("gpu__time_duration.sum", scale="time_us")


def _dram_mb(which: str):
    return lambda m: m.col(f"dram__bytes_{which}.sum", scale="byte") / 1e6


def _dram_tb_s(m):
    return (m["dram_read_mb"] + m["dram_write_mb"]) * 1e6 / (m["ncu_time_us"] * 1e-6) / 1e12


def _dram_kind(m):
    from common.capture.ceilings import dram_kind
    return [dram_kind(r, w) for r, w in zip(m["dram_read_mb"], m["dram_write_mb"])]


def _dram_pct(m):
    if not m.peaks:
        return m.nan()
    from common.capture.ceilings import DRAM_KEYS
    return [100 * tb / (m.peaks.get(DRAM_KEYS[k]) or m.peaks.get("dram_tb_s") or math.nan)
            for tb, k in zip(m["dram_tb_s"], m["dram_kind"])]


def _tensor(m):
    best = None
    for name in TENSOR_METRICS:
        if m.has(name):
            v = m.col(name)
            best = v if best is None else [max(a, b) if not (math.isnan(a) or math.isnan(b)) else (a if math.isnan(b) else b)
                                           for a, b in zip(best, v)]
    return best if best is not None else m.nan()


def _limits(m):
    return [{k: r.get(f"launch__occupancy_limit_{k}") for k in OCCUPANCY_LIMITS} for r in m.records]


def _ctas_per_sm(m):
    out = []
    for lim in _limits(m):
        vals = [v for v in lim.values() if _ok(v)]
        out.append(float(min(vals)) if vals else math.nan)
    return out


def _limiter(m):
    out = []
    for lim in _limits(m):
        vals = {k: v for k, v in lim.items() if _ok(v)}
        if not vals:
            out.append("n/a")
            continue
        lo = min(vals.values())
        out.append(f"{'+'.join(k for k, v in vals.items() if v == lo)} ({lo:g} CTAs/SM)")
    return out


def _smem_kb(m):
    return m.col("launch__shared_mem_per_block", scale="byte") / 1e3


def _warps(m):
    return m.col("launch__block_size") / 32


def _stall_shares(m) -> list[dict]:
    names = [r for r in STALL_REASONS if r != "selected" and m.has(STALL_METRIC.format(r))]
    cols = {r: m.col(STALL_METRIC.format(r)) for r in names}
    out = []
    for i in range(m.n):
        vals = {r: cols[r][i] for r in names if not math.isnan(cols[r][i])}
        tot = sum(vals.values())
        out.append({r: 100 * v / tot for r, v in vals.items()} if tot else {})
    return out


def _top_stalls(m, k: int = 3):
    return [", ".join(f"{r} {v:.0f}%" for r, v in sorted(s.items(), key=lambda kv: -kv[1])[:k])
            for s in _stall_shares(m)]


def _show_ncu_time(r):
    if not _ok(r.get("ncu_time_us")):
        return None
    ratio = f" ({_f(r['ncu_ratio'])}x traced)" if _ok(r.get("ncu_ratio")) else ""
    return f"ncu {_f(r['ncu_time_us'])} us{ratio}"


def _show_dram(r):
    if not _ok(r.get("dram_tb_s")):
        return None
    pct = (f" = {_f(r['dram_pct'])}% of the {r.get('dram_kind') or 'copy'} ceiling" if _ok(r.get("dram_pct")) else "")
    mb = f" ({_f((r.get('dram_read_mb') or 0) + (r.get('dram_write_mb') or 0))} MB)"
    rate = f"{_f(r['dram_tb_s'])} TB/s" if r["dram_tb_s"] >= 0.1 else f"{_f(r['dram_tb_s'] * 1e3)} GB/s"
    return f"DRAM {rate}{pct}{mb}"


def _show_occupancy(r):
    if not _ok(r.get("occupancy_pct")):
        return None
    theo = (f" of {_f(r['theoretical_occupancy_pct'])}% theoretical" if _ok(r.get("theoretical_occupancy_pct")) else "")
    return f"occupancy {_f(r['occupancy_pct'])}%{theo}"


def _show_cta(r):
    parts = []
    if _ok(r.get("ctas_per_sm")):
        parts.append(f"{_f(r['ctas_per_sm'])} CTA/SM ({r.get('limiter')})" if r.get("limiter") not in (None, "n/a")
                     else f"{_f(r['ctas_per_sm'])} CTA/SM")
    if _ok(r.get("warps_per_cta")):
        parts.append(f"{_f(r['warps_per_cta'])} warps/CTA")
    if _ok(r.get("regs_per_thread")):
        parts.append(f"{_f(r['regs_per_thread'])} regs/thread")
    if _ok(r.get("smem_kb_per_cta")):
        parts.append(f"{_f(r['smem_kb_per_cta'])} KB smem/CTA")
    return ", ".join(parts) or None


COUNTERS = [
    Col("ncu_time_us", "counters", "us", "ncu's kernel time (gpu__time_duration.sum), clocks and caches as the "
        "page says (served kernels: --clock-control none --cache-control none)",
        ("gpu__time_duration.sum",), _time_us, _show_ncu_time),
    Col("dram_read_mb", "counters", "MB", "bytes read from DRAM (dram__bytes_read.sum)", ("dram__bytes_read.sum",),
        _dram_mb("read")),
    Col("dram_write_mb", "counters", "MB", "bytes written to DRAM (dram__bytes_write.sum)", ("dram__bytes_write.sum",),
        _dram_mb("write")),
    Col("dram_tb_s", "counters", "TB/s", "DRAM bytes read + written (ncu), over ncu's kernel time", (),
        _dram_tb_s, _show_dram),
    Col("dram_kind", "counters", "", "read, mixed, copy or write: the kind of the kernel's DRAM traffic, from the "
        "share of its DRAM bytes that are writes (common.capture.ceilings.dram_kind), which picks its ceiling", (), _dram_kind),
    Col("dram_pct", "counters", "%", "DRAM bandwidth as % of this GPU's measured DRAM ceiling of the same kind of "
        "traffic (read, mixed, copy or write)", (), _dram_pct),
    Col("l2_hit_pct", "counters", "%", "L2 hit rate of the kernel's memory requests (lts__t_sector_hit_rate.pct); "
        "empty where ncu reads it outside 0-100%: hits and queries come from different replay passes, and on a "
        "kernel too small to fill the GPU (a few us) they do not match (NVIDIA: such a value was not collected "
        "accurately)", ("lts__t_sector_hit_rate.pct",), lambda m: _in_pct_range(m.col("lts__t_sector_hit_rate.pct")),
        lambda r: f"L2 hit {_f(r['l2_hit_pct'])}%" if _ok(r.get("l2_hit_pct")) and r["l2_hit_pct"] <= L2_HIT_MAX
        else None),
    Col("l1_hit_pct", "counters", "%", "L1/TEX hit rate of the kernel's global and local memory requests "
        "(l1tex__t_sector_hit_rate.pct): how much reuse the SM's own cache caught before L2",
        ("l1tex__t_sector_hit_rate.pct",), lambda m: _in_pct_range(m.col("l1tex__t_sector_hit_rate.pct")),
        lambda r: f"L1 hit {_f(r['l1_hit_pct'])}%" if _ok(r.get("l1_hit_pct")) else None),
    Col("dram_sol_pct", "counters", "%", "ncu's DRAM throughput as % of its theoretical peak (speed of light); "
        "compared only with SM % to classify the kernel (common.judge.bounds.bound)", DRAM_SOL_METRICS,
        lambda m: m.first(DRAM_SOL_METRICS)),
    Col("sm_pct", "counters", "%", "SM throughput, % of peak (the busiest SM sub-unit, issue included)",
        ("sm__throughput.avg.pct_of_peak_sustained_elapsed",), lambda m: m.col("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
        lambda r: f"SM {_f(r['sm_pct'])}%" if _ok(r.get("sm_pct")) else None),
    Col("tensor_pct", "counters", "%", "tensor pipe busy, % of peak (Hopper's wgmma counts as hgmma/qgmma)",
        TENSOR_METRICS[:2], _tensor, lambda r: f"tensor {_f(r['tensor_pct'])}%" if _ok(r.get("tensor_pct")) else None),
    Col("occupancy_pct", "counters", "%", "achieved occupancy: active warps per SM as % of the maximum (64 on Hopper)",
        ("sm__warps_active.avg.pct_of_peak_sustained_active",),
        lambda m: m.col("sm__warps_active.avg.pct_of_peak_sustained_active"), _show_occupancy),
    Col("theoretical_occupancy_pct", "counters", "%", "theoretical occupancy: the warps per SM the launch allows "
        "(its limiter), as % of the maximum", ("sm__maximum_warps_per_active_cycle_pct",),
        lambda m: m.col("sm__maximum_warps_per_active_cycle_pct")),
    Col("ctas_per_sm", "counters", "", "CTAs (thread blocks) one SM can hold for this launch: the smallest "
        "launch__occupancy_limit_*", tuple(f"launch__occupancy_limit_{k}" for k in OCCUPANCY_LIMITS), _ctas_per_sm,
        _show_cta),
    Col("limiter", "counters", "", "the resource that sets ctas_per_sm: registers, shared_mem, warps or blocks", (),
        _limiter),
    Col("warps_per_cta", "counters", "", "warps per CTA (launch__block_size / 32)", ("launch__block_size",), _warps),
    Col("regs_per_thread", "counters", "", "registers per thread", ("launch__registers_per_thread",),
        lambda m: m.col("launch__registers_per_thread")),
    Col("smem_kb_per_cta", "counters", "KB", "shared memory per CTA, static + dynamic", ("launch__shared_mem_per_block",),
        _smem_kb),
    Col("waves", "counters", "", "waves: CTAs of the grid over the CTAs all SMs hold at once",
        ("launch__waves_per_multiprocessor",), lambda m: m.col("launch__waves_per_multiprocessor")),
    Col("top_stalls", "counters", "", "the three largest warp-stall reasons, each as % of all stall samples "
        "(smsp__average_warps_issue_stalled_*)", tuple(STALL_METRIC.format(r) for r in STALL_REASONS), _top_stalls,
        lambda r: f"stalls {r['top_stalls']}" + (f": {r['stall_note']}" if _ok(r.get("stall_note")) else "")
        if _ok(r.get("top_stalls")) else None),
]
JOINED = [
    Col("ncu_ratio", "joined", "x", "ncu's kernel time over the traced kernel time (the observer effect of ncu: "
        "replay passes, clocks, caches)"),
    Col("l2_resident", "joined", "", "True when the kernel moved far fewer DRAM bytes than its formula bytes "
        "(ncu) or its effective bandwidth exceeds the DRAM ceiling: its data sat in L2"),
    Col("one_cta_per_sm", "joined", "", "True when the launch fits one CTA per SM: the kernel is built that way "
        "(Hopper GEMMs and warp-specialised attention keep a whole SM's registers and shared memory), so its low "
        "occupancy is the design, not a bottleneck"),
    Col("stall_note", "joined", "", "whether the top stall is a bottleneck: a stall on a pipe that is saturated "
        "(tensor pipe busy, DRAM near its ceiling) is the pipe being used, not a limiter"),
]

COLUMNS: dict[str, Col] = {c.name: c for c in TRACE + LAYERS + WORK + COUNTERS + JOINED}
GROUPS = ("trace", "layers", "work", "counters", "joined")


def names(*groups: str) -> list[str]:
    """The columns of these groups, in declaration order (all groups when none is named)."""
    return [c.name for c in COLUMNS.values() if not groups or c.group in groups]


def ncu_metrics() -> tuple[str, ...]:
    """Every ncu metric the counter columns read, in declaration order, without repeats."""
    return tuple(dict.fromkeys(m for c in COUNTERS for m in c.metrics))


# ------------------------------------------------------------------ counters from an ncu raw table

class _Metrics:
    """Reads an ncu raw-page DataFrame (common.capture.ncu.read_raw): numeric columns by name, converted by their unit,
    and the counter columns derived so far (``m["dram_read_mb"]``)."""

    def __init__(self, df, peaks: dict | None):
        self.df, self.peaks, self.n = df, peaks, len(df)
        self.units = df.attrs.get("units", {})
        self.records = df.to_dict("records")
        self.done: dict = {}

    def has(self, name: str) -> bool:
        return name in self.df.columns

    def nan(self) -> list[float]:
        return [math.nan] * self.n

    def col(self, name: str, scale: str | None = None):
        import numpy as np

        from common.capture.ncu import NcuParseError, number_column, unit_factor
        if name not in self.df.columns:
            return np.full(self.n, math.nan)
        vals = np.asarray(number_column(self.df, name), dtype=float)
        if scale:
            u = self.units.get(name, "")
            f = unit_factor(u, scale)
            if f is None:
                raise NcuParseError(f"unexpected unit {u!r} for {name} (expected a {scale.split('_')[0]} unit)")
            vals = vals * f
        return vals

    def first(self, names_):
        for n in names_:
            if self.has(n):
                return self.col(n)
        return self.nan()

    def __getitem__(self, name: str):
        return self.done[name]


def counters(df, peaks: dict | None = None):
    """The counter columns (COUNTERS, in order) of every launch of an ncu raw table, as a dict of lists, plus
    ``stall_<reason>_pct`` for every stall reason collected. ``peaks`` (common.capture.ceilings.peaks) gives the DRAM
    ceilings ``dram_pct`` divides by (NaN without)."""
    import numpy as np
    m = _Metrics(df, peaks)
    for c in COUNTERS:
        v = c.derive(m) if c.derive else m.nan()
        numeric = all(isinstance(x, (int, float, np.floating, np.integer)) and not isinstance(x, bool) for x in v)
        m.done[c.name] = np.asarray(v, dtype=float) if numeric else list(v)
    shares = _stall_shares(m)
    for r in STALL_REASONS:
        if any(r in s for s in shares):
            m.done[f"stall_{r}_pct"] = [s.get(r, math.nan) for s in shares]
    return m.done


# ------------------------------------------------------------------ columns that need two stages

SATURATED = 70.0        # a pipe this busy (% of peak) is saturated: stalls feeding it are it being used


L2_RESIDENT = 0.5       # DRAM bytes below half the formula bytes: the data came from L2


def stall_note(r: dict) -> str:
    """Whether the top stall limits the kernel (see the JOINED column stall_note); '' when nothing to say."""
    top = str(r.get("top_stalls") or "").split(",")[0].strip().split(" ")[0]
    if not top:
        return ""
    tc, dram = r.get("tensor_pct"), r.get("dram_pct")
    if top in ("gmma", "math_pipe_throttle", "wait", "dispatch_stall") and _ok(tc) and tc >= SATURATED:
        return f"the tensor pipe is {_f(tc)}% busy: these stalls are the pipe at work, not a bottleneck"
    if top in ("long_scoreboard", "lg_throttle", "drain") and _ok(dram) and dram >= SATURATED:
        return f"DRAM runs at {_f(dram)}% of its ceiling: waiting on saturated DRAM"
    if top in ("long_scoreboard", "lg_throttle"):
        return "waiting on memory latency with DRAM not saturated: more bytes in flight would help"
    return ""


def joined(kt, peaks: dict | None = None):
    """Add the JOINED columns to a kernel table that has traced time, work and/or counters (any may be missing)."""
    kt = kt.copy()
    rows = kt.to_dict("records")
    kt["ncu_ratio"] = [r["ncu_time_us"] / r["dur_us"] if _ok(r.get("ncu_time_us")) and _ok(r.get("dur_us"))
                       and r["dur_us"] > 0 else math.nan for r in rows]
    kt["l2_resident"] = [resident(r, peaks) for r in rows]
    kt["one_cta_per_sm"] = [_ok(r.get("ctas_per_sm")) and r["ctas_per_sm"] == 1 for r in rows]
    kt["stall_note"] = [stall_note(r) for r in rows]
    return kt


def resident(r: dict, peaks: dict | None = None) -> bool:
    """True when the kernel's data sat in L2 (see the JOINED column l2_resident)."""
    fb = r.get("bytes")
    dram_b = ((r.get("dram_read_mb") or 0) + (r.get("dram_write_mb") or 0)) * 1e6 if _ok(r.get("dram_read_mb")) else None
    if _ok(fb) and fb > 0 and dram_b is not None:
        return dram_b < L2_RESIDENT * fb
    if _ok(r.get("eff_tb_s")) and peaks:
        return r["eff_tb_s"] > max(v for v in (peaks.get("dram_tb_s"), peaks.get("dram_copy_tb_s"), 0) if v)
    return False


# ------------------------------------------------------------------ a kernel as a story node

def flag(r: dict, col: str) -> bool:
    """A yes/no column of a kernel row (l2_resident, one_cta_per_sm): NaN (a table read back from CSV where no ncu
    pass set it; NaN is truthy) and None are no."""
    return _ok(r.get(col)) and bool(r[col])


_FIRST_LINE = next(i for i, c in enumerate(COUNTERS) if c.name == "sm_pct") + 1   # time, bytes, caches, SM


def node(r: dict, head: str | None = None) -> tuple[str, list]:
    """(label, children) for common.base.story.tree: the kernel's line (``head``, or its name and traced time), then
    one child for its work (rates from the traced time) and one or two for its counters (ncu), each built
    from the ``show`` of the declared columns, so every report's kernel line shows the same things."""
    label = head or f"{r.get('kernel', '?')} {_f(r.get('dur_us'))} us"
    kids = []
    work = [s for s in (c.show(r) for c in WORK if c.show) if s]
    if flag(r, "l2_resident"):
        work.append("L2-resident: its data came from L2")
    if work:
        kids.append(("work: " + " · ".join(work), []))
    ncu1 = [s for s in (c.show(r) for c in COUNTERS[:_FIRST_LINE] if c.show) if s]
    if ncu1:
        kids.append((" · ".join(ncu1), []))
    ncu2 = [s for s in (c.show(r) for c in COUNTERS[_FIRST_LINE:] if c.show) if s]
    if flag(r, "one_cta_per_sm"):
        ncu2.append("one CTA per SM by design")
    if ncu2:
        kids.append((" · ".join(ncu2), []))
    return label, kids


def line(r: dict) -> str:
    """The node as one line (for tables and logs): label — work · counters."""
    label, kids = node(r)
    return " — ".join([label] + [k for k, _ in kids])


def glossary_rows() -> list[dict]:
    """Column, unit, group and meaning of every declared column (the glossary page shows them)."""
    return [{"column": c.name, "unit": c.unit, "stage": c.group, "meaning": c.doc} for c in COLUMNS.values()]


# The metric list behind metrics="summary": what the kernel table's counter columns read (common.tables.kernels
# declares each column with its metrics), plus the stall reasons. Each extra metric can cost ncu another
# replay pass, so nothing here is unread. Names checked against `ncu --query-metrics --chip gh100` and a
# real `--set full` CSV (tests/fixtures/).
SUMMARY_METRICS = ncu_metrics()


def split_points(df):
    """Add a ``point`` column (0-based, by markers seen so far; common.tables.trace.split_at_marker) and drop the
    marker rows."""
    from common.tables.trace import split_at_marker
    point, is_mark = split_at_marker(df["Kernel Name"], MARKER_KERNEL)
    out = df.assign(point=point)[[not m for m in is_mark]].reset_index(drop=True)
    out.attrs = df.attrs
    return out


def summarize(df, peaks: dict | None = None):
    """One row per profiled launch: id, kernel, grid, block, launch (n-th launch of that kernel), then the
    counter columns of the kernel table (common.tables.kernels.COUNTERS: ncu time, DRAM bytes / TB/s / % of the
    ceiling of the same traffic, L2 hit, SM, tensor, occupancy and its limiter, registers, shared memory,
    warps per CTA, stalls) and ``stall_<reason>_pct``. ``peaks`` (common.capture.ceilings.peaks) gives the DRAM
    ceilings; without them ``dram_pct`` is NaN. A ``point`` column (split_points) is kept first."""
    import pandas as pd

    from common.tables.kernels import counters
    if "gpu__time_duration.sum" not in df.columns:
        raise NcuParseError("the ncu CSV has no gpu__time_duration.sum column, so no kernel time: collect it "
                            "(--metrics gpu__time_duration.sum, or a section set such as SpeedOfLight/full)")
    out = pd.DataFrame({
        "id": df["ID"].to_numpy(),
        "kernel": [short_name(k) for k in df["Kernel Name"]],
        "grid": df.get("Grid Size", pd.Series([""] * len(df))).to_numpy(),
        "block": df.get("Block Size", pd.Series([""] * len(df))).to_numpy(),
    })
    out["launch"] = out.groupby("kernel").cumcount()
    for name, vals in counters(df, peaks).items():
        out[name] = vals
    if "point" in df.columns:
        out.insert(0, "point", df["point"].to_numpy())
    out.attrs["missing_metrics"] = [m for m in KEY_METRICS if m not in df.columns]
    return out


# the metrics a summary row cannot do without (their absence is named, never shown as NaN silently)
KEY_METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
               "sm__throughput.avg.pct_of_peak_sustained_elapsed")

OTHER_STEP_SHARE = 0.5   # a KV-reading launch below this share of the batch's bytes belongs to another step


def other_step_launches(bytes_by_launch: dict, expected: float | None = None,
                        share: float = OTHER_STEP_SHARE) -> set:
    """The launches of one KV-reading decode kernel that belong to a step other than the measured batch's.

    A window opened once the batch decodes can still catch a step of fewer requests: in every recorded SGLang
    05 run (H100 and H200) its first step read 16.8 MB per layer, one request's 4k KV, against 539 MB for the
    batch. ``bytes_by_launch``: {launch: bytes the launch moved at DRAM}; a launch under ``share`` of
    ``expected`` (the batch's KV bytes), or without it of the largest launch, is another step's."""
    ref = expected if expected else max(bytes_by_launch.values(), default=0.0)
    return {launch for launch, b in bytes_by_launch.items() if b < share * ref}


def ncu_main(argv=None) -> int:
    """python -m common ncu profile --out DIR [--kernel RX] [--skip N] [--count N] [--set full] -- CMD..."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m common ncu",
                                description="Run a command under Nsight Compute and print a per-kernel hardware table.")
    sub = p.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("profile", help="profile a command: ... profile [opts] -- python script.py args")
    pr.add_argument("--out", required=True, help="folder for ncu.csv, the log and kernels.csv")
    pr.add_argument("--kernel", help="regex on the kernel name (e.g. 'BatchDecode|Prefill')")
    pr.add_argument("--skip", type=int, default=0, help="launches of matching kernels to skip first")
    pr.add_argument("--count", type=int, default=None, help="launches to profile (default: all)")
    pr.add_argument("--set", dest="section_set", default=None,
                    help="ncu section set (e.g. full, detailed); default: the workbook's summary metrics")
    pr.add_argument("--clock-control", default="none", choices=("none", "base"))
    pr.add_argument("--cache-control", default="none", choices=CACHE_CONTROL,
                    help="none: caches as the application left them (a served kernel); all: flushed before each "
                         "pass (a kernel timed with a cold L2). Default none")
    pr.add_argument("--nvtx-include", default=None, help="only kernels inside this NVTX range")
    pr.add_argument("--timeout", type=float, default=None)
    pr.add_argument("app", nargs=argparse.REMAINDER, help="-- then the command to profile")
    sm = sub.add_parser("summarize", help="summarise an existing raw-page CSV")
    sm.add_argument("csv")
    a = p.parse_args(argv)
    import pandas as pd
    pd.set_option("display.width", 200)
    cols = ["kernel", "launch", "ncu_time_us", "dram_tb_s", "dram_pct", "l2_hit_pct", "sm_pct", "tensor_pct",
            "occupancy_pct", "limiter", "top_stalls"]
    if a.cmd == "summarize":
        s = summarize(read_raw(Path(a.csv)))
        print(s[[c for c in cols if c in s.columns]].to_string(index=False, float_format="%.1f"))
        return 0
    app = a.app[1:] if a.app[:1] == ["--"] else a.app
    if not app:
        p.error("give the command to profile after --")
    res = profile(app, a.out, kernel=a.kernel, launch_skip=a.skip, launch_count=a.count,
                  section_set=a.section_set, metrics=None if a.section_set else SUMMARY_METRICS,
                  clock_control=a.clock_control, cache_control=a.cache_control, nvtx_include=a.nvtx_include,
                  timeout=a.timeout)
    s = summarize(res.df)
    s.to_csv(Path(a.out) / "kernels.csv", index=False)
    print(s[[c for c in cols if c in s.columns]].to_string(index=False, float_format="%.1f"))
    print(f"\nraw CSV: {res.csv_path}\nper-kernel table: {Path(a.out) / 'kernels.csv'}")
    return 0
