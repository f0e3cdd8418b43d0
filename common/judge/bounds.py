"""What limits a kernel, read from its Nsight Compute counters: memory-, latency- or compute-bound, and why.

    bound(row)        # 'memory-bound' | 'memory-latency-bound' | 'compute-bound (tensor cores)' | 'latency-bound' ...
    bound_why(row)    # the same with the figures behind it: DRAM and SM speed of light, tensor pipe, top stall
    look(raw, row)    # a closer look at one --set full launch: waves, issue slots, pipes, instructions per byte

``row`` is a kernel-table row (common.tables.kernels.summarize); STALL_MEANING says what each warp stall means.
"""
from __future__ import annotations

import math


# What each warp-stall reason means (NVIDIA Nsight Compute Kernel Profiling Guide, "Warp Stall
# Reasons"), in the workbook's words. Read a stall with this table, not from its name alone: `wait`
# is a FIXED-latency dependency (e.g. the result of an arithmetic or MMA instruction), not a
# producer/consumer hand-off (that shows as `barrier`, or as `long_scoreboard` on a flag in memory).
STALL_MEANING = {
    "long_scoreboard": "waiting for an L1TEX result: a global/local memory load (DRAM or L2 latency)",
    "short_scoreboard": "waiting for an MIO result: shared memory or a special-function (MUFU) op",
    "wait": "a fixed-latency dependency: the next instruction needs the result of a fixed-latency one "
            "(arithmetic, tensor MMA issue), or an explicit wait/delay",
    "barrier": "waiting at a CTA barrier (__syncthreads / named barrier) for sibling warps",
    "membar": "waiting on a memory barrier (fence)",
    "math_pipe_throttle": "the execution pipe it needs (FMA, tensor, ...) is busy",
    "mio_throttle": "the MIO queue (shared memory, special math, some branches) is full",
    "lg_throttle": "the local/global load-store queue is full (many memory instructions in flight)",
    "tex_throttle": "the texture/L1TEX queue is full",
    "drain": "waiting for memory stores to drain at the end of the warp",
    "dispatch_stall": "the dispatcher could not issue the selected instruction",
    "branch_resolving": "waiting for a branch target to be computed",
    "no_instruction": "no instruction fetched yet (instruction cache miss, or after a branch)",
    "imc_miss": "waiting on an immediate-constant cache miss",
    "sleeping": "the warp is sleeping (nanosleep, yield)",
    "gmma": "waiting on a Hopper warpgroup MMA (wgmma) to be issued or finish",
    "not_selected": "eligible, but another warp was picked (enough parallelism: not a problem)",
    "misc": "other reasons",
}

MEMORY_STALLS = ("long_scoreboard", "lg_throttle", "drain", "tex_throttle", "imc_miss")


def top_stall(row) -> str:
    """Name of the largest stall reason of a summarize() row ('' when none recorded)."""
    t = str(row.get("top_stalls") or "")
    return t.split(",")[0].strip().split(" ")[0] if t else ""


def bound(row) -> str:
    """What limits a kernel, from a summarize() row: memory-bound, memory-latency-bound,
    compute-bound, compute-bound (tensor cores) or latency-bound.

    It compares ncu's two speed-of-light figures, DRAM (``dram_sol_pct``) and SM (``sm_pct``), both as % of
    ncu's theoretical peaks. ncu's SM % is the highest of several SM sub-throughputs, including the issue
    of load/store instructions, so SM % above DRAM % alone does not make a kernel compute-bound: when the
    top warp stall is a memory stall (long_scoreboard, lg_throttle...) the kernel is waiting on memory
    (memory-latency-bound); compute-bound needs the math pipes busy (tensor pipe > 50%, or SM % above
    DRAM % with a non-memory top stall).
    """
    def num(v):
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)
    dram, sm, tc = num(row.get("dram_sol_pct")), num(row.get("sm_pct")), num(row.get("tensor_pct"))
    vals = [v for v in (dram, sm) if v is not None]
    if not vals:
        return "n/a"
    if tc is not None and tc > 50:
        return "compute-bound (tensor cores)"
    if max(vals) < 40:
        return "latency-bound"
    if dram is not None and dram >= (sm or 0):
        return "memory-bound"
    if top_stall(row) in MEMORY_STALLS:
        return "memory-latency-bound"
    return "compute-bound" + (" (tensor cores)" if tc is not None and tc > 30 else "")


def bound_why(row) -> str:
    """One sentence giving the numbers behind :func:`bound`: ncu's DRAM and SM speed-of-light %, the tensor
    pipe, the top stall with its meaning, and whether that stall is a bottleneck (common.tables.kernels.stall_note)."""
    from common.tables.kernels import stall_note
    st = top_stall(row)
    parts = [f"DRAM SOL {row.get('dram_sol_pct', math.nan):.0f}%", f"SM SOL {row.get('sm_pct', math.nan):.0f}%"]
    if row.get("tensor_pct") is not None and not math.isnan(row.get("tensor_pct")):
        parts.append(f"tensor {row['tensor_pct']:.0f}%")
    why = f"{bound(row)}: " + ", ".join(parts)
    if st:
        why += f"; top stall {st} ({STALL_MEANING.get(st, '?')})"
        note = stall_note(row)
        if note:
            why += f": {note}"
    return why


PIPE = "sm__inst_executed_pipe_{}.avg.pct_of_peak_sustained_active"

PIPES = ("alu", "fma", "fmaheavy", "lsu", "adu", "xu", "cbu", "uniform", "tex", "tma", "tensor_op_hmma", "tensor_op_gmma")

LOOK_METRICS = ("launch__grid_size", "launch__sm_count", "launch__waves_per_multiprocessor", "sm__cycles_active.avg",
                "gpc__cycles_elapsed.max", "smsp__issue_active.avg.pct_of_peak_sustained_active",
                "smsp__inst_executed.sum", "sm__warps_active.avg.per_cycle_active",
                "smsp__warps_eligible.avg.per_cycle_active") + tuple(PIPE.format(p) for p in PIPES)


def look(raw: dict, summary: dict | None = None) -> list[str]:
    """What a kernel spends its time on, from one row of a ``--set full`` raw table (read_raw(...).iloc[i]) and its
    summarize() row: how the launch fills the GPU (CTAs, waves, the share of SMs active), how busy the issue slots
    are and how many warps are ready to issue, which pipes its instructions go to, its instruction count per byte
    moved, and the top stalls with what they mean. Lines of plain text; metrics a row lacks are left out."""
    def v(name):
        x = raw.get(name)
        return None if x is None or (isinstance(x, float) and math.isnan(x)) or isinstance(x, str) else float(x)
    out, s = [], summary or {}
    grid, sms, waves = v("launch__grid_size"), v("launch__sm_count"), v("launch__waves_per_multiprocessor")
    active, elapsed = v("sm__cycles_active.avg"), v("gpc__cycles_elapsed.max")
    if grid and sms:
        line = f"launch: {grid:,.0f} CTAs for {sms:.0f} SMs" + (f", {waves:.2f} waves" if waves is not None else "")
        if active and elapsed:
            line += f"; the average SM was active {100 * active / elapsed:.0f}% of the kernel's cycles"
        if waves is not None and waves < 1:
            line += " (less than one wave: some SMs get no CTA at all)"
        out.append(line)
    issue, eligible, warps = (v("smsp__issue_active.avg.pct_of_peak_sustained_active"),
                              v("smsp__warps_eligible.avg.per_cycle_active"), v("sm__warps_active.avg.per_cycle_active"))
    if issue is not None:
        line = f"issue: an instruction issued in {issue:.0f}% of the active cycles of each scheduler"
        if eligible is not None and warps is not None:
            line += f"; {eligible:.2f} warps ready to issue per cycle, of {warps:.1f} active per SM"
        if eligible is not None and eligible < 1:
            line += " (fewer than one ready warp: the scheduler waits, latency-bound)"
        elif issue >= 60:
            line += " (the issue slots are busy: the kernel is bound by how many instructions it runs)"
        out.append(line)
    pipes = sorted(((p, v(PIPE.format(p))) for p in PIPES), key=lambda kv: -(kv[1] or 0))
    pipes = [(p, x) for p, x in pipes if x]
    if pipes:
        out.append("pipes (% of peak while active): " + ", ".join(f"{p} {x:.0f}%" for p, x in pipes[:4]))
    inst = v("smsp__inst_executed.sum")
    mb = (s.get("dram_read_mb") or 0) + (s.get("dram_write_mb") or 0)
    if inst:
        out.append(f"instructions: {inst:,.0f} warp instructions" + (f", {inst / (mb * 1e6) * 32:.1f} thread instructions "
                                                                     f"per DRAM byte" if mb else ""))
    if s.get("top_stalls"):
        top = top_stall(s)
        out.append(f"stalls: {s['top_stalls']}" + (f"; {top}: {STALL_MEANING.get(top, '?')}" if top else ""))
    return out
