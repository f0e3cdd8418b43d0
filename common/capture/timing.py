"""The one GPU timing primitive of the workbook, plus the arithmetic next to it.

    t = bench(lambda: wrapper.run(q, kv))             # kernel time from CUPTI, cold L2 (default)
    t = bench(fn, method="events")                    # CUDA events: kernel time + launch latency
    t = bench(fn, method="graph")                     # events around one CUDA-graph replay
    print(t.median_us, t.spread_pct)
    r = rates(t.median_ms, bytes=..., flops=..., peaks=ceilings.peaks(), mix="copy", working_set=...)
                                                      # effective TB/s, TFLOP/s, % of a ceiling where valid

Method (every sample):
  1. cold L2 (``cold_l2=True``): write a buffer twice the L2 size (which evicts the inputs of the
     call under test), then read a second one (which writes those dirty lines back before the
     timed region), so the call finds its inputs in DRAM and pays for no one else's write-back,
     as inside a model where other layers ran in between;
  2. a short spin kernel (``torch.cuda._sleep``) keeps the GPU busy while the CPU enqueues the
     call, so the CPU launch overhead of the call (Python, plan lookups) is not measured;
  3. the call inside a ``record_function`` range whose kernel durations CUPTI reports
     (``cupti``, the default: the sum of the call's kernels' own durations — what ncu's
     ``gpu__time_duration.sum`` and nsys measure — without gaps between kernels); or bracketed by
     two CUDA events (``events``: adds the GPU-side latency of starting a kernel after an event,
     a few microseconds, which matters for short kernels); or one replay of a CUDA graph captured
     from the call, bracketed by events (``graph``).
What the three instruments read for the same kernels on an H200 (tests/gpu/test_timing_vs_ncu.py,
two runs on 2026-11-21): at ~100 us CUPTI agrees with ncu's gpu__time_duration.sum within ~2% (GEMM and
elementwise alike); below that the instruments differ by a fixed amount, not a ratio: ncu reads
~0.9-1.4 us above CUPTI's kernel timestamps (a y = 2x over 1 KB: 2.34 vs 1.30 us; ~10 us kernels:
+0.9 to +1.4 us), and CUDA events read ~3 us above ncu. So on a 10 us kernel CUPTI is ~9-12% under
ncu; with that floor offset added (measured on the 1 KB kernel in the same test) the two agree
within 3%. The workbook keeps CUPTI (the kernel's own start/end, no launch latency) and says so
wherever short kernels are compared with ncu. Use
``events`` for the time a caller waits for a multi-kernel op including the gaps between its kernels.
Samples are collected first and synchronised once; the result keeps every sample so the
spread can be shown next to the median. Warm-up calls (JIT compiles, autotuning, lazy
allocations) run before any sample and are never timed.

CPU-side costs (radix-tree matching, schedulers) are timed with :func:`bench_cpu`.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field

from common.base.stats import quantile

METHODS = ("events", "graph", "cupti")
_SPIN_CYCLES = 200_000          # ~100 us at 2 GHz: longer than a typical Python launch path
_MARK = "hands_on.bench.sample"


@dataclass
class Timing:
    """Samples of one measurement (milliseconds) and how they were taken."""
    samples_ms: list[float]
    method: str
    cold_l2: bool
    warmup: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def median_us(self) -> float:
        return self.median_ms * 1e3

    @property
    def mean_ms(self) -> float:
        return statistics.fmean(self.samples_ms)

    @property
    def min_ms(self) -> float:
        return min(self.samples_ms)

    def quantile_ms(self, q: float) -> float:
        """The ``q`` quantile of the samples (linear interpolation, as numpy: common.base.stats.quantile)."""
        return quantile(sorted(self.samples_ms), q)

    @property
    def spread_pct(self) -> float:
        """(p90 - p10) / median, in percent: how much one sample can be trusted."""
        med = self.median_ms
        return 100.0 * (self.quantile_ms(0.9) - self.quantile_ms(0.1)) / med if med > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("samples_ms")
        d.update(n=len(self.samples_ms), median_ms=self.median_ms, mean_ms=self.mean_ms,
                 min_ms=self.min_ms, p10_ms=self.quantile_ms(0.1), p90_ms=self.quantile_ms(0.9),
                 spread_pct=self.spread_pct)
        return d

    def __str__(self) -> str:
        return (f"{self.median_us:.2f} us median ({len(self.samples_ms)} samples, {self.method}, "
                f"{'cold' if self.cold_l2 else 'warm'} L2, spread {self.spread_pct:.1f}%)")


def _torch():
    import torch  # imported lazily: --help must work without torch
    return torch


_flush_buffers: dict = {}


def _flush_buffers_for(torch, device):
    """Two buffers of 2x the L2 size of ``device`` (cached per device): one to write, one to read."""
    key = str(device)
    if key not in _flush_buffers:
        props = torch.cuda.get_device_properties(device)
        l2 = getattr(props, "L2_cache_size", 0) or (50 << 20)
        _flush_buffers[key] = tuple(torch.zeros(2 * l2, dtype=torch.int8, device=device) for _ in range(2))
    return _flush_buffers[key]


def bench(fn, *, method: str = "cupti", cold_l2: bool = True, warmup: int | None = None,
          reps: int | None = None, rep_ms: float = 100.0, min_reps: int = 10, max_reps: int = 1000,
          spin: bool = True, device=None, flush: str = "write+read") -> Timing:
    """Time ``fn()`` on the GPU and return every sample (see the module docstring for the method).

    ``reps`` fixes the sample count; otherwise it is chosen so sampling takes about ``rep_ms``.
    ``warmup`` calls run first (default: enough for ~25 ms, at least 3). ``flush`` picks how the
    L2 is cooled: "write+read" (default), "write" (what FlashInfer's bench_gpu_time does: the
    timed kernel then pays for writing back dirty lines) or "read" (may leave inputs resident).
    CUPTI mode takes at most 100 samples unless ``reps``/``max_reps`` say otherwise (each sample is
    a profiler range; more add seconds of host-side processing).
    Several ranks timing a collective must pass the same fixed ``warmup`` and ``reps``.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, not {method!r}")
    if flush not in ("write+read", "write", "read"):
        raise ValueError(f"flush must be 'write+read', 'write' or 'read', not {flush!r}")
    if method == "cupti" and max_reps == 1000:
        max_reps = 100
    torch = _torch()
    device = device if device is not None else torch.cuda.current_device()
    flush_bufs = _flush_buffers_for(torch, device) if cold_l2 else None

    # estimate one call, then warm up (JIT, autotune and allocations happen here, untimed)
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    est_ms = max((time.perf_counter() - t0) * 1e3 / 3, 1e-3)
    warmup = warmup if warmup is not None else max(3, int(25.0 / est_ms))
    for _ in range(warmup):
        fn()
    if reps is None:
        reps = int(min(max_reps, max(min_reps, rep_ms / est_ms)))

    graph = None
    if method == "graph":
        graph = _capture(torch, fn)

    def prologue():
        if flush_bufs is not None:
            if "write" in flush:
                flush_bufs[0].zero_()
            if "read" in flush:
                flush_bufs[1].max()
        if spin:
            torch.cuda._sleep(_SPIN_CYCLES)

    notes = []
    if method in ("events", "graph"):
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        torch.cuda.synchronize()
        for i in range(reps):
            prologue()
            starts[i].record()
            graph.replay() if graph is not None else fn()
            ends[i].record()
        torch.cuda.synchronize()
        samples = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    else:
        samples = _cupti_samples(torch, fn, reps, prologue)
        empty = sum(s == 0 for s in samples)
        if empty > reps // 10:
            raise RuntimeError(f"CUPTI saw no GPU work in {empty} of {reps} timed calls (a memcpy-only or "
                               "CPU-only call, or work on another stream?): time it with method='events'")
        if empty:
            samples = [s for s in samples if s > 0]
            notes.append(f"{empty} sample(s) without a kernel dropped")
    if flush != "write+read" and cold_l2:
        notes.append(f"L2 cooled with flush={flush!r}")
    return Timing(samples_ms=samples, method=method, cold_l2=cold_l2, warmup=warmup, notes=notes)


def _capture(torch, fn):
    """Capture one call of ``fn`` into a CUDA graph (after a side-stream warm-up, as torch asks)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


def _cupti_samples(torch, fn, reps, prologue) -> list[float]:
    """Per-call sum of kernel durations, from CUPTI through torch.profiler."""
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            prologue()
            with record_function(f"{_MARK}.{i}"):
                fn()
        torch.cuda.synchronize()
    per_call = {}
    for ev in prof.events():
        if ev.name.startswith(_MARK + "."):
            total_us = getattr(ev, "device_time_total", None)
            if total_us is None:  # older torch
                total_us = ev.cuda_time_total
            per_call[int(ev.name.rsplit(".", 1)[1])] = total_us / 1e3
    return [per_call.get(i, 0.0) for i in range(reps)]


def bench_cpu(fn, *, reps: int | None = None, rep_ms: float = 200.0, warmup: int = 3,
              min_reps: int = 5, max_reps: int = 100_000) -> Timing:
    """Time a CPU-only callable with ``time.perf_counter_ns`` (one sample per call)."""
    for _ in range(warmup):
        fn()
    if reps is None:
        t0 = time.perf_counter_ns()
        fn()
        est_ms = max((time.perf_counter_ns() - t0) / 1e6, 1e-4)
        reps = int(min(max_reps, max(min_reps, rep_ms / est_ms)))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1e6)
    return Timing(samples_ms=samples, method="cpu", cold_l2=False, warmup=warmup)


def rates(ms: float, *, bytes: float | None = None, flops: float | None = None, peaks: dict | None = None,
          mix: str = "copy", working_set: float | None = None) -> dict:
    """Turn a time and the work done into rates, named by what they measure (common.tables.kernels):

    * ``eff_tb_s``: effective bandwidth, formula ``bytes`` / time. Not a DRAM rate: bytes a kernel finds
      in L2 (or leaves there, unwritten back) are counted but never reach DRAM.
    * ``eff_pct``: eff_tb_s as % of the DRAM ceiling of traffic kind ``mix`` (read, mixed, copy, write:
      common.capture.ceilings), given only where ``working_set`` (the bytes the call touches; default ``bytes``) is
      at least common.capture.ceilings.STREAM_FACTOR times the L2 (``peaks["l2_mb"]``): then its bytes do go through
      DRAM. Otherwise NaN, and ``eff_pct_why`` says why. ``l2_resident``: the working set fits in L2.
      ``working_set`` is kept in the result (a sweep's figure places each point by it: common.render.plots.effective).
    * ``tflop_s``, ``pct_bf16_ceiling`` (% of the measured bf16 ceiling), ``flop_per_byte``.

    A % above 100 is kept as measured (never clipped) and flagged: ``above_ceiling: True`` and a
    ``note`` naming the ceiling and by how much it was beaten. It means the ceiling probe
    under-measures this GPU (or ran at a lower clock: common.capture.clocks) and must be improved
    (``python -m common ceilings measure --refresh`` after a better probe), not that the kernel beat it.
    """
    from common.capture.ceilings import STREAM_FACTOR, l2_bytes
    out: dict = {"ms": ms}
    s = ms / 1e3
    if bytes is not None and s > 0:
        out["bytes"] = bytes
        out["working_set"] = working_set if working_set is not None else bytes
        out["eff_tb_s"] = bytes / s / 1e12
    if flops is not None and s > 0:
        out["flops"] = flops
        out["tflop_s"] = flops / s / 1e12
    if bytes and flops:
        out["flop_per_byte"] = flops / bytes
    if not peaks:
        return out
    notes = []
    if "eff_tb_s" in out:
        key = dram_key(peaks, mix)
        ceil, l2, l2b = peaks.get(key), peaks.get("l2_mb"), l2_bytes(peaks)
        ws = working_set if working_set is not None else bytes
        out.update(eff_ceiling=mix, l2_resident=bool(l2b and ws < l2b))
        if not ceil:
            out["eff_pct"], out["eff_pct_why"] = math.nan, "no DRAM ceiling"
        elif not l2:
            out["eff_pct"], out["eff_pct_why"] = math.nan, "L2 size unknown: cannot tell DRAM traffic from L2 traffic"
        elif ws < STREAM_FACTOR * l2b:
            out["eff_pct"] = math.nan
            out["eff_pct_why"] = (f"working set {ws / 1e6:.3g} MB < {STREAM_FACTOR} x L2 ({l2:g} MiB): effective "
                                  "bandwidth, not a DRAM rate")
        else:
            out["eff_pct"] = 100.0 * out["eff_tb_s"] / ceil
            if out["eff_pct"] > 100.0:
                notes.append(_above_note(out["eff_tb_s"], out["eff_pct"], peaks, key, f"DRAM {mix}", "TB/s"))
    if "tflop_s" in out and peaks.get("bf16_tflops"):
        out["pct_bf16_ceiling"] = 100.0 * out["tflop_s"] / peaks["bf16_tflops"]
        if out["pct_bf16_ceiling"] > 100.0:
            notes.append(_above_note(out["tflop_s"], out["pct_bf16_ceiling"], peaks, "bf16_tflops", "bf16 tensor",
                                     "TFLOP/s"))
    if notes:
        out["above_ceiling"] = True
        out["note"] = "; ".join(notes)
    return out


def dram_key(peaks: dict, mix: str) -> str:
    """The key of ``peaks`` that effective bandwidth of traffic kind ``mix`` is divided by: its kind's DRAM ceiling
    (common.capture.ceilings.DRAM_KEYS), or ``dram_tb_s`` in a record from before the kinds were measured apart."""
    from common.capture.ceilings import DRAM_KEYS
    key = DRAM_KEYS.get(mix, "dram_copy_tb_s")
    return key if peaks.get(key) else "dram_tb_s"


def dram_ceiling_text(peaks: dict, mix: str, short: bool = False) -> str:
    """The DRAM ceiling :func:`rates` divides traffic of kind ``mix`` by, named (common.capture.ceilings.ceiling_text)."""
    from common.capture.ceilings import ceiling_text
    return ceiling_text(peaks, dram_key(peaks, mix), short=short)


def _above_note(value: float, pct: float, peaks: dict, key: str, what: str, unit: str) -> str:
    """One sentence: which ceiling was beaten, by how much, and what that means."""
    src = (peaks.get("sources") or {}).get(key) or peaks.get("source") or "?"
    how = (peaks.get("method") or {}).get(key)
    return (f"{value:.3g} {unit} is {pct:.1f}% of the {src} {what} ceiling {peaks[key]:.3g} {unit}"
            f"{f' ({how})' if how else ''}: {pct - 100:.1f}% above it, so that ceiling under-measures "
            f"this GPU (improve the probe; the value is not clipped)")


# ------------------------------------------------------------------ what a sweep row keeps, says and is judged on

RATE_COLUMNS = ("bytes", "working_set", "eff_ceiling", "eff_tb_s", "eff_pct", "eff_pct_why", "l2_resident", "flops",
                "tflop_s", "pct_bf16_ceiling", "flop_per_byte")


def rate_row(r: dict) -> dict:
    """The columns of a :func:`rates` result a sweep row keeps (RATE_COLUMNS, in order; absent ones left out)."""
    return {k: r[k] for k in RATE_COLUMNS if k in r}


def _valid(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def median_row(rows, key: str = "eff_tb_s") -> dict:
    """The row whose ``key`` is the median of ``rows`` (the lower middle one for an even count): a line that quotes
    one repetition's rate quotes a real measurement, with its own working set and %."""
    rows = sorted((r for r in rows if _valid(r.get(key))), key=lambda r: r[key])
    return rows[(len(rows) - 1) // 2] if rows else {}


def l2_multiple(working_set: float, peaks: dict | None) -> float:
    """The working set in units of the L2 size (NaN when the L2 size is unknown)."""
    from common.capture.ceilings import l2_bytes
    l2b = l2_bytes(peaks)
    return working_set / l2b if l2b and _valid(working_set) else math.nan


def eff_text(r: dict, peaks: dict | None = None) -> str:
    """A sweep row's effective bandwidth on a story line, named by what it is: 'effective 4.12 TB/s (formula bytes /
    time) = 89.6% of the read ceiling, working set 537 MB = 8.9 x L2' where ``eff_pct`` is valid (the working set is
    at least STREAM_FACTOR x L2), else 'effective 3.10 TB/s (formula bytes / time; working set 134 MB = 2.2 x L2: not
    a DRAM rate)'.
    Never labelled a DRAM rate: only ncu's measured bytes make one (common.tables.kernels)."""
    from common.base.story import fmt
    if not _valid(r.get("eff_tb_s")):
        return "effective bandwidth: -"
    ws = r.get("working_set", r.get("bytes"))
    n = l2_multiple(ws, peaks)
    where = f"working set {fmt(ws / 1e6 if _valid(ws) else math.nan)} MB"
    if _valid(n):
        where += (f" = {n:.0f} x L2" if n >= 10 else f" = {n:.1f} x L2" if n >= 1 else f" = {n:.2f} x L2" if n >= 0.01
                  else " < 0.01 x L2")
    head = f"effective {fmt(r['eff_tb_s'])} TB/s (formula bytes / time"
    if _valid(r.get("eff_pct")):
        return f"{head}) = {fmt(r['eff_pct'])}% of the {r.get('eff_ceiling') or 'copy'} ceiling, {where}"
    return f"{head}; {where}: not a DRAM rate)"


def within_ceiling(pcts, what: str) -> bool | str:
    """The premise of every '% of a ceiling' verdict: no value above 100% of ``what`` (a ceiling, named:
    common.capture.ceilings.ceiling_text). True, or a string saying which value beat it: the ceiling probe under-measures
    this GPU, or ran at another clock (common.capture.clocks); improve the probe, never cap the kernel."""
    over = [p for p in pcts if _valid(p) and p > 100]
    return True if not over else (f"{max(over):.0f}% of {what}: a kernel beat the ceiling, so the ceiling probe "
                                  "under-measures this GPU (python -m common ceilings measure --refresh after a better "
                                  "probe; common.capture.clocks for the clock it ran at)")


def eff_premise(rows, what: str) -> bool | str:
    """The premise of a verdict judged on ``eff_pct`` (rows as :func:`rate_row` writes them): every value is a DRAM
    rate (its working set is at least STREAM_FACTOR x the L2, else its ``eff_pct_why``) and none beats ``what``, the
    DRAM ceiling of its kind (:func:`within_ceiling`). True, or a string saying which premise failed."""
    rows = list(rows)
    bad = [r for r in rows if not _valid(r.get("eff_pct"))]
    if bad:
        why = bad[0].get("eff_pct_why")
        return (f"{len(bad)} of {len(rows)} value(s) are no DRAM rate: "
                f"{why if isinstance(why, str) and why else 'no effective bandwidth'}")
    return within_ceiling([r["eff_pct"] for r in rows], what)
