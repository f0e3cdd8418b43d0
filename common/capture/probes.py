"""The probes behind this GPU's ceilings: DRAM streams, bf16 GEMMs, NCCL all-reduce (common.capture.ceilings runs them).

    dram = measure_dram(torch, 0, quick=True, sampler=s)    # best read, write and copy stream, each on its own
    gemm = measure_gemm(torch, 0, quick=True, sampler=s)    # bf16 GEMM sweep, the SM clock of every shape
    nv = measure_nvlink(2, quick=True)                       # all-reduce bus bandwidth (>= 2 GPUs)

DRAM: a kernel that only reads streams faster than one that reads and writes (an H100 on 2026-11-25: read
3.16, write 3.30, copy 3.02 TB/s), so there are four ceilings, not one: read, mixed (two reads per write, as
an activation reading gate and up), copy (one read per write) and write; a kernel is divided by the one that
matches its traffic (common.capture.ceilings.dram_for). On that H100 an activation kernel moving 470 MB read and 239
MB written ran at 100.4% of the copy ceiling (tests/fixtures/ncu_raw_l2_resident_vs_dram_h100_cache-none.csv):
its traffic is not a copy's, which is why the mixed kind exists. Each kind is the best of several probes on buffers far
above L2 (Triton kernels with a few block sizes, torch ``x.sum()``, ``fill_``, ``zero_``, ``copy_``).

GEMM: the best median over a sweep of shapes (mamf-finder's "maximum achievable matmul FLOPS"), the model's
own shapes included. A GEMM's rate follows the SM clock, and a sweep of large GEMMs drives a GPU to its power
cap (the H100 above fell from 1,980 to ~1,400-1,600 MHz from the 16,384³ shape on), so every shape starts on a
GPU that is not at its cap (common.capture.clocks.wait_cool) and records the SM clock and power it ran at
(common.capture.clocks.Sampler): the ceiling says at which clock it was reached.
"""
from __future__ import annotations

import datetime as _dt
import math
import os
from pathlib import Path

from common.base.story import fmt_bytes, GIB, MIB
from common.capture import clocks
from common.capture.ceilings import (
    CEILINGS_VERSION,
    DRAM_KINDS,
    as_peaks,
    ceilings_dir,
    ceilings_table,
    gpu_uuid,
    machine_key,
    record_path,
    read_ceilings,
    save_ceilings,
)
from common.capture.gpu import device_spec, gpus

DRAM_METHOD = ("per kind of traffic (read only; mixed = two reads per write; copy = one read per write; write "
               "only), the best of several streaming probes on buffers far larger than L2 ({size}): Triton read, "
               "write, copy and add kernels (a few block sizes / warp counts) and torch x.sum(), fill_, zero_, copy_, "
               "add; bytes count everything read and written. Each probe: "
               "warm-up, then {reps} single calls timed with CUPTI (the kernel's own duration, as every kernel of the "
               "workbook is timed), each after a spin kernel, median; the sustained rate (CUDA events around "
               "back-to-back calls) is kept beside it")
GEMM_METHOD = ("the best median over {n} bf16 GEMM shapes (the 'maximum achievable matmul FLOPS' method of "
               "ml-engineering's mamf-finder): torch.matmul into a preallocated output, random normal inputs, "
               "layout nn = a @ b and nt = a @ b.T (as nn.Linear); each shape: warm-up, then {reps} single calls "
               "timed with CUPTI (kernel duration, as the workbook times every kernel: a GEMM inside a model runs "
               "in a burst at full clock), median; FLOPs = 2·M·N·K. Before each shape the GPU is let off its power cap "
               "(NVML: no slowdown reason, power under half the limit, at most 3 s), and NVML's SM clock and power "
               "are recorded while it runs. The sustained rate of the best shape (~{target_ms:.0f} ms of back-to-back "
               "calls, where power limits lower the clock) is kept beside it")
NVLINK_METHOD = ("the best NCCL all-reduce bus bandwidth over {nsizes} sizes ({lo}..{hi}) on {n} GPUs "
                 "(torch.distributed, one spawned process per GPU, bf16 sum, NVLink multicast/NVLS off); "
                 "busbw = algbw x 2(n-1)/n (nccl-tests); per size: CUDA events around back-to-back all-reduces, "
                 "median of {reps} samples, slowest rank")

# GEMM shapes (M, N, K): the quick set holds the shapes that usually win on Hopper plus the model shapes of
# the workbook, each in both layouts; the full set adds a grid of multiples of 4096.
# Version 4 added Llama-3.1-8B's QKV, O and down projections at an 8,192-token prefill: on an H200
# (2026-11-23, SGLang 08) cuBLAS ran O at 849, down at 825 and gate-up at 817 TFLOP/s there, above the
# 812 of the version-3 sweep. Version 4 ran on an H100 on 2026-11-25 (tests/fixtures/ceilings_log_h100.txt):
# its best shape was the down projection (804 TFLOP/s), measured after the power cap had lowered the clock,
# which version 5 (a cool GPU before each shape, its clock recorded) corrects.
_GEMM_QUICK = [(8192, 8192, 8192), (4096, 4096, 4096), (6144, 6144, 6144), (16384, 16384, 16384),
               (8192, 8192, 16384), (16384, 16384, 4096), (8192, 28672, 4096), (6144, 17920, 2816),
               (8192, 6144, 4096), (8192, 4096, 4096), (8192, 4096, 14336)]
_GEMM_FULL_EXTRA = sorted({(m, n, k) for m in (4096, 8192, 12288, 16384) for n in (4096, 8192, 12288, 16384)
                           for k in (4096, 8192, 16384)} | {(2048, 2048, 2048), (10240, 10240, 10240),
                                                              (12288, 12288, 12288), (14336, 14336, 14336),
                                                              (4096, 14336, 4096), (8192, 4096, 14336)})


def busbw_gb_s(nbytes: float, seconds: float, n: int) -> float:
    """All-reduce bus bandwidth in GB/s (nccl-tests): algbw = bytes / time, busbw = algbw x 2(n-1)/n.
    The factor turns the algorithm bandwidth into what each link carries, so busbw is comparable
    across GPU counts and against the per-direction link bandwidth."""
    if seconds <= 0 or n < 1:
        return math.nan
    return nbytes / seconds / 1e9 * (2 * (n - 1) / n)


# ---- DRAM probes: each returns (callable, bytes moved per call); its docstring line is its method

def _dram_probes(torch, quick: bool):
    """(name, kind, make) of every DRAM probe; ``make(bufs)`` -> (fn, bytes per call, method)."""
    probes = []
    kern = _triton_kernels()
    if kern is not None:
        read_cfg = [(16384, 8), (8192, 4)] if quick else [(16384, 8), (8192, 4), (16384, 16), (32768, 16)]
        write_cfg = [(16384, 8)] if quick else [(16384, 8), (8192, 4), (32768, 16)]
        copy_cfg = [(8192, 8)] if quick else [(8192, 8), (16384, 8), (4096, 4)]
        mix_cfg = [(8192, 8)] if quick else [(8192, 8), (16384, 8)]
        probes += [(f"triton read BLOCK={b} warps={w}", "read", _triton_read(kern, b, w)) for b, w in read_cfg]
        probes += [(f"triton write BLOCK={b} warps={w}", "write", _triton_write(kern, b, w)) for b, w in write_cfg]
        probes += [(f"triton copy BLOCK={b} warps={w}", "copy", _triton_copy(kern, b, w)) for b, w in copy_cfg]
        probes += [(f"triton add BLOCK={b} warps={w}", "mixed", _triton_add(kern, b, w)) for b, w in mix_cfg]
    probes += [("torch x.sum()", "read", _torch_read), ("torch fill_", "write", _torch_fill),
               ("torch zero_", "write", _torch_zero), ("torch copy_", "copy", _torch_copy),
               ("torch add", "mixed", _torch_add)]
    return probes


def _doc(fn) -> str:
    return (fn.__doc__ or "").strip().splitlines()[0]


def _torch_read(x, y):
    """torch x.sum() over the buffer viewed as fp32: bytes = buffer size (read once); CUDA events around back-to-back calls, median."""
    import torch
    v = x.view(torch.float32)
    return (lambda: v.sum()), x.numel(), _doc(_torch_read)


def _torch_fill(x, y):
    """torch x.fill_(1) on the buffer as fp32: bytes = buffer size (written once); CUDA events around back-to-back calls, median."""
    import torch
    v = x.view(torch.float32)
    return (lambda: v.fill_(1.0)), x.numel(), _doc(_torch_fill)


def _torch_zero(x, y):
    """torch x.zero_() on the buffer: bytes = buffer size (written once); CUDA events around back-to-back calls, median."""
    return x.zero_, x.numel(), _doc(_torch_zero)


def _torch_copy(x, y):
    """torch y.copy_(x), a device-to-device memcpy: bytes = 2 x buffer (read + write); CUDA events around back-to-back calls, median."""
    return (lambda: y.copy_(x)), 2 * x.numel(), _doc(_torch_copy)


def _torch_add(x, y):
    """torch.add(a, b, out=c) on bf16, a and b the two halves of the buffer, c half of the second: bytes = 1.5 x buffer (two reads per write, as an activation's gate and up); CUDA events around back-to-back calls, median."""
    import torch
    v = x.view(torch.bfloat16)
    half = v.numel() // 2
    a, b, c = v[:half], v[half:2 * half], y.view(torch.bfloat16)[:half]
    return (lambda: torch.add(a, b, out=c)), 3 * half * 2, _doc(_torch_add)


def _triton_read(kern, block, warps):
    def make(x, y):
        """Triton read kernel: each program loads BLOCK contiguous bf16 (16-byte vectors, several loads in flight per thread, evict-first), sums in fp32, stores one value; bytes = buffer size; CUDA events around back-to-back calls, median."""
        import torch
        v = x.view(torch.bfloat16)
        grid = (v.numel() // block,)
        out = torch.empty(grid[0], dtype=torch.float32, device=x.device)
        return (lambda: kern["read"][grid](v, out, BLOCK=block, num_warps=warps)), x.numel(), _doc(make)
    return make


def _triton_write(kern, block, warps):
    def make(x, y):
        """Triton write kernel: each program stores BLOCK contiguous bf16 zeros (16-byte vectors); bytes = buffer size (written once); CUDA events around back-to-back calls, median."""
        import torch
        v = x.view(torch.bfloat16)
        grid = (v.numel() // block,)
        return (lambda: kern["write"][grid](v, BLOCK=block, num_warps=warps)), x.numel(), _doc(make)
    return make


def _triton_copy(kern, block, warps):
    def make(x, y):
        """Triton copy kernel: each program loads BLOCK contiguous bf16 and stores them to a second buffer; bytes = 2 x buffer (read + write); CUDA events around back-to-back calls, median."""
        import torch
        a, b = x.view(torch.bfloat16), y.view(torch.bfloat16)
        grid = (a.numel() // block,)
        return (lambda: kern["copy"][grid](a, b, BLOCK=block, num_warps=warps)), 2 * x.numel(), _doc(make)
    return make


def _triton_add(kern, block, warps):
    def make(x, y):
        """Triton add kernel: each program loads BLOCK bf16 from each half of the buffer and stores their sum to a third; bytes = 1.5 x buffer (two reads per write); CUDA events around back-to-back calls, median."""
        import torch
        v = x.view(torch.bfloat16)
        half = (v.numel() // 2) // block * block
        a, b, c = v[:half], v[half:2 * half], y.view(torch.bfloat16)[:half]
        grid = (half // block,)
        return (lambda: kern["add"][grid](a, b, c, BLOCK=block, num_warps=warps)), 3 * half * 2, _doc(make)
    return make


_TRITON: dict = {}


def _triton_kernels() -> dict | None:
    """The four Triton streaming kernels (compiled on first launch), or None when Triton is missing.
    Buffers are whole multiples of BLOCK, so the kernels need no mask; offsets are 64-bit."""
    if "kernels" in _TRITON:
        return _TRITON["kernels"]
    try:
        import triton
        import triton.language as tl
    except Exception:          # ImportError, or a broken install
        _TRITON["kernels"] = None
        return None

    @triton.jit
    def _read(x_ptr, out_ptr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, eviction_policy="evict_first")   # (.cg + evict_first: a PTXAS error in Triton 3.6)
        tl.store(out_ptr + tl.program_id(0), tl.sum(x.to(tl.float32), axis=0))

    @triton.jit
    def _write(y_ptr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.zeros([BLOCK], dtype=y_ptr.dtype.element_ty), eviction_policy="evict_first")

    @triton.jit
    def _copy(x_ptr, y_ptr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, eviction_policy="evict_first")
        tl.store(y_ptr + offs, x, eviction_policy="evict_first")

    @triton.jit
    def _add(a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        a = tl.load(a_ptr + offs, eviction_policy="evict_first")
        b = tl.load(b_ptr + offs, eviction_policy="evict_first")
        tl.store(c_ptr + offs, a + b, eviction_policy="evict_first")

    _TRITON["kernels"] = {"read": _read, "write": _write, "copy": _copy, "add": _add, "version": triton.__version__}
    return _TRITON["kernels"]


def measure_dram(torch, device: int, quick: bool, log=print, sampler=None) -> dict:
    """Every DRAM probe on ``device``; per kind (read, write, copy) the ceiling is its fastest probe (see
    DRAM_METHOD). ``sampler``: a running common.capture.clocks.Sampler (each probe records its memory clock)."""
    from common.capture.timing import bench
    want = (1 if quick else 4) * GIB
    free, _total = torch.cuda.mem_get_info(device)
    size = want
    while size > GIB and 2 * size > 0.8 * free:     # the copy needs two buffers
        size //= 2
    notes = [] if size == want else [f"buffers shrunk to {size / GIB:.0f} GiB ({free / GIB:.1f} GiB free)"]
    if 2 * size > free:
        raise RuntimeError(f"not enough free GPU memory for the DRAM probes ({free / GIB:.1f} GiB free, "
                           f"{2 * size / GIB:.0f} GiB needed)")
    if _triton_kernels() is None:
        notes.append("Triton is not importable: torch probes only (the read ceiling may be under-measured)")
    reps = 10 if quick else 20
    x = torch.empty(size, dtype=torch.uint8, device=f"cuda:{device}")
    y = torch.empty_like(x)
    x.view(torch.bfloat16).normal_()
    y.zero_()
    rows = []
    try:
        for name, kind, make in _dram_probes(torch, quick):
            try:
                rows.append(_dram_probe(torch, bench, name, kind, make, x, y, size, reps, sampler))
                r = rows[-1]
                log(f"  DRAM {name:32s} {r['tb_s']:6.3f} TB/s single call, {r['sustained_tb_s']:6.3f} sustained  "
                    f"({r['bytes'] / GIB:.0f} GiB per call, {r['ms']:.3f} ms, spread {r['spread_pct']:.1f}%"
                    + (f", mem clock {r['mem_mhz']:.0f} MHz" if r.get("mem_mhz") else "") + ")")
            except Exception as e:     # one failed probe (e.g. a Triton compile error) does not stop the rest
                notes.append(f"{name}: {e.__class__.__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
                log(f"  DRAM {name}: [ERROR] {notes[-1]}")
    finally:
        del x, y
        torch.cuda.empty_cache()
    if not rows:
        raise RuntimeError("every DRAM probe failed: " + "; ".join(notes))
    kinds = {}
    for kind in DRAM_KINDS:
        mine = [r for r in rows if r["kind"] == kind]
        if mine:
            b = max(mine, key=lambda r: r["tb_s"])
            kinds[kind] = {"tb_s": b["tb_s"], "best": b["name"], "spread_pct": b.get("spread_pct")}
    best = max(rows, key=lambda r: r["tb_s"])
    return {"tb_s": best["tb_s"], "best": best["name"], "kinds": kinds, "buffer_bytes": size,
            "method": DRAM_METHOD.format(size=f"{size / GIB:.0f} GiB", reps=reps),
            "probes": rows, "notes": notes}


def _dram_probe(torch, bench, name, kind, make, x, y, size, reps, sampler) -> dict:
    """One DRAM probe: single calls (kernel time) and back-to-back calls (sustained), its clocks."""
    fn, nbytes, method = make(x, y)
    if sampler is not None:
        clocks.wait_cool(sampler)
    import time
    t0 = time.time()
    t = bench(fn, method="cupti", cold_l2=False, warmup=3, reps=reps)      # single calls: kernel time
    ms = t.median_ms
    calls = max(4, int(16 * GIB // nbytes))

    def batch(fn=fn, calls=calls):
        for _ in range(calls):
            fn()
    sus = bench(batch, method="events", cold_l2=False, warmup=1, reps=3).median_ms / calls
    w = clocks.window(sampler.rows, t0, time.time()) if sampler is not None else {}
    return {"name": name, "kind": kind, "bytes": nbytes, "buffer_bytes": size,
            "tb_s": nbytes / (ms / 1e3) / 1e12, "ms": ms, "sustained_tb_s": nbytes / (sus / 1e3) / 1e12,
            "samples": len(t.samples_ms), "spread_pct": t.spread_pct, "method": method,
            "mem_mhz": w.get("mem_mhz"), "sm_mhz": w.get("sm_mhz")}


def gemm_shapes(quick: bool) -> list[tuple[int, int, int, str]]:
    """(M, N, K, layout) of the GEMM sweep: quick 22 shapes, full ~70 (layout nn = a @ b, nt = a @ b.T)."""
    quick_set = [(m, n, k, lay) for (m, n, k) in _GEMM_QUICK for lay in ("nt", "nn")]
    if quick:
        return quick_set
    seen = set(quick_set)
    return quick_set + [(m, n, k, "nt") for (m, n, k) in _GEMM_FULL_EXTRA if (m, n, k, "nt") not in seen]


def _operands(torch, m, n, k, lay, dev):
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, k, device=dev, dtype=torch.bfloat16).t() if lay == "nt" else \
        torch.randn(k, n, device=dev, dtype=torch.bfloat16)
    return a, b, torch.empty(m, n, device=dev, dtype=torch.bfloat16)


def measure_gemm(torch, device: int, quick: bool, log=print, sampler=None) -> dict:
    """The bf16 GEMM sweep on ``device``; the ceiling is the best shape's median (see GEMM_METHOD). With a
    running ``sampler`` (common.capture.clocks.Sampler) every shape starts on a cool GPU and records its SM clock."""
    import time

    from common.capture.timing import bench
    target_ms, reps = (20.0, 10) if quick else (50.0, 20)
    dev = f"cuda:{device}"
    rows, notes = [], []
    for m, n, k, lay in gemm_shapes(quick):
        a = b = c = None
        try:
            a, b, c = _operands(torch, m, n, k, lay, dev)

            def batch(calls, a=a, b=b, c=c):
                for _ in range(calls):
                    torch.matmul(a, b, out=c)
            batch(2)
            torch.cuda.synchronize()
            waited = clocks.wait_cool(sampler) if sampler is not None else 0.0
            t0 = time.time()
            t = bench(lambda: batch(1), method="cupti", cold_l2=False, warmup=3, reps=reps)   # single calls
            w = clocks.window(sampler.rows, t0, time.time()) if sampler is not None else {}
            ms = t.median_ms
            rows.append({"m": m, "n": n, "k": k, "layout": lay, "tflops": 2 * m * n * k / (ms / 1e3) / 1e12,
                         "ms": ms, "samples": len(t.samples_ms), "spread_pct": t.spread_pct,
                         "sm_mhz": w.get("sm_mhz"), "sm_mhz_min": w.get("sm_mhz_min"),
                         "power_w_max": w.get("power_w_max"), "slowdown": ", ".join(w.get("slowdown") or []),
                         "cooled_s": round(waited, 2)})
            r = rows[-1]
            log(f"  GEMM {m:5d}x{n:5d}x{k:5d} {lay}  {r['tflops']:7.1f} TFLOP/s  ({ms:.3f} ms, spread "
                f"{t.spread_pct:.1f}%" + (f", SM {r['sm_mhz']:.0f} MHz, {r['power_w_max']:.0f} W" if r.get("sm_mhz")
                                          else "") + (f", {r['slowdown']}" if r["slowdown"] else "") + ")")
        except Exception as e:
            notes.append(f"{m}x{n}x{k} {lay}: {e.__class__.__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
            log(f"  GEMM {m}x{n}x{k} {lay}: [ERROR] {notes[-1]}")
        finally:
            a = b = c = None
    torch.cuda.empty_cache()
    if not rows:
        raise RuntimeError("every GEMM shape failed: " + "; ".join(notes))
    best = max(rows, key=lambda r: r["tflops"])
    try:    # the sustained rate of the best shape: back-to-back calls for ~target_ms (power and clocks settle)
        a, b, c = _operands(torch, best["m"], best["n"], best["k"], best["layout"], dev)
        calls = max(1, round(target_ms / best["ms"]))

        def burst(a=a, b=b, c=c):
            for _ in range(calls):
                torch.matmul(a, b, out=c)
        if sampler is not None:
            clocks.wait_cool(sampler)
        t0 = time.time()
        m_, n_, k_ = best["m"], best["n"], best["k"]
        best["sustained_tflops"] = 2 * m_ * n_ * k_ / (bench(burst, method="events", cold_l2=False, warmup=1,
                                                             reps=3).median_ms / calls / 1e3) / 1e12
        w = clocks.window(sampler.rows, t0, time.time()) if sampler is not None else {}
        best["sustained_sm_mhz"] = w.get("sm_mhz")
        log(f"  GEMM best shape sustained over ~{target_ms:.0f} ms: {best['sustained_tflops']:.1f} TFLOP/s"
            + (f" at SM {w['sm_mhz']:.0f} MHz" if w.get("sm_mhz") else ""))
        del a, b, c
    except Exception as e:  # noqa: BLE001
        notes.append(f"sustained run of the best shape: {e.__class__.__name__}")
    torch.cuda.empty_cache()
    return {"tflops": best["tflops"], "best": {x: best[x] for x in ("m", "n", "k", "layout")},
            "spread_pct": best.get("spread_pct"),
            "sm_mhz": best.get("sm_mhz"), "sustained_tflops": best.get("sustained_tflops"),
            "method": GEMM_METHOD.format(n=len(rows), target_ms=target_ms, reps=reps), "shapes": rows,
            "notes": notes}


def nvlink_sizes(quick: bool) -> list[int]:
    """All-reduce sizes in bytes: 1 MiB .. 1 GiB (quick: 4 of them, full: every power of two)."""
    return [1 * MIB, 32 * MIB, 256 * MIB, GIB] if quick else [(1 << i) * MIB for i in range(11)]


def _calls_for(nbytes: int) -> int:
    """Back-to-back all-reduces per timed sample: ~5 ms at 100 GB/s algbw, 2..200 (same on every rank)."""
    return max(2, min(200, int(5e-3 * 100e9 / nbytes)))


def _nvlink_worker(rank: int, world: int, port: int, sizes: list[int], reps: int, q) -> None:
    """One rank of the all-reduce sweep (a spawned process): NCCL env first, then init, sweep, report."""
    from common.capture.procs import nccl_env
    env, _notes = nccl_env()
    os.environ.update(env)           # before NCCL is initialised: NVLink multicast stays off
    import torch
    import torch.distributed as dist

    from common.capture.timing import bench
    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                device_id=torch.device("cuda", rank))
        rows = []
        for nbytes in sizes:
            x = torch.zeros(nbytes // 2, dtype=torch.bfloat16, device="cuda")   # values do not change NCCL's speed
            calls = _calls_for(nbytes)

            def batch(x=x, calls=calls):
                for _ in range(calls):
                    dist.all_reduce(x)
            t = bench(batch, method="events", cold_l2=False, warmup=2, reps=reps)   # fixed counts on every rank
            worst = torch.tensor([t.median_ms / calls], dtype=torch.float64, device="cuda")
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            ms = float(worst.item())
            rows.append({"bytes": nbytes, "ms": ms, "algbw_gb_s": nbytes / (ms / 1e3) / 1e9,
                         "busbw_gb_s": busbw_gb_s(nbytes, ms / 1e3, world), "calls_per_sample": calls})
            del x
        if rank == 0:
            q.put({"ok": True, "rows": rows})
    except BaseException as e:
        q.put({"ok": False, "rank": rank, "error": f"{e.__class__.__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"})
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def measure_nvlink(n: int, quick: bool, log=print, timeout: float = 600.0) -> dict:
    """All-reduce sweep over ``n`` GPUs in spawned processes; the ceiling is the best busbw (NVLINK_METHOD).
    The children are always joined, then terminated, then killed: none outlives this call."""
    import importlib
    import multiprocessing as mp
    import queue
    import time

    from common.capture.gpu import gpus, topology
    from common.capture.procs import free_port
    sizes, reps = nvlink_sizes(quick), (5 if quick else 10)
    worker = importlib.import_module("common.capture.probes")._nvlink_worker   # pickled by module name for spawn
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs_ = [ctx.Process(target=worker, args=(r, n, port, sizes, reps, q), daemon=True) for r in range(n)]
    msg = None
    try:
        for p in procs_:
            p.start()
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                msg = q.get(timeout=1.0)
                break
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs_) or all(p.exitcode is not None for p in procs_):
                    try:
                        msg = q.get(timeout=2.0)
                    except queue.Empty:
                        pass
                    break
    finally:
        for p in procs_:
            p.join(timeout=30 if msg and msg.get("ok") else 5)
        for p in procs_:
            if p.is_alive():
                p.terminate()
                p.join(10)
        for p in procs_:
            if p.is_alive():
                p.kill()
                p.join(5)
        q.close()
    links = sorted({v for v in topology().get("links", {}).values()})
    base = {"gpus": n, "links": links, "uuids": [g["uuid"] for g in gpus()][:n]}
    if not msg or not msg.get("ok"):
        why = (msg or {}).get("error") or f"no result within {timeout:.0f} s (exit codes {[p.exitcode for p in procs_]})"
        log(f"  NVLink all-reduce sweep failed: {why}")
        return {**base, "busbw_gb_s": None, "error": why}
    rows = msg["rows"]
    for r in rows:
        log(f"  all-reduce {r['bytes'] / MIB:7.0f} MiB on {n} GPUs: busbw {r['busbw_gb_s']:7.1f} GB/s "
            f"(algbw {r['algbw_gb_s']:.1f}, {r['ms'] * 1e3:.0f} us)")
    best = max(rows, key=lambda r: r["busbw_gb_s"])
    return {**base, "busbw_gb_s": best["busbw_gb_s"], "best_bytes": best["bytes"], "sizes": rows,
            "method": NVLINK_METHOD.format(nsizes=len(sizes), lo=fmt_bytes(sizes[0]), hi=fmt_bytes(sizes[-1]),
                                           n=n, reps=reps)}


class _Lock:
    """An exclusive file lock (Linux/macOS flock) so two runs never measure the same GPU at once."""

    def __init__(self, path: Path):
        self.path, self.f = path, None

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(self.path, "a")
        try:
            import fcntl
            fcntl.flock(self.f, fcntl.LOCK_EX)
        except ImportError:
            pass
        return self

    def __exit__(self, *exc):
        self.f.close()     # closing releases the lock
        return False


def measure_ceilings(device: int = 0, *, quick: bool = False, refresh: bool = False, nvlink: bool = True,
                     log=print) -> dict:
    """Measure (or read) the ceilings record of the machine of visible GPU ``device``; returns it.

    A record of this CEILINGS_VERSION is returned as it is (whichever set, quick or full, measured it: every run on
    the machine divides by the same figures) unless ``refresh``, or ≥ 2 GPUs are visible and the record has no NVLink
    entry (then only the all-reduce sweep runs and is added). Needs the GPU: ~15 s quick, ~1-2 min full (+ ~30 s
    NVLink).
    """
    from common.base.checks import SetupError, require_module
    torch = require_module("torch", "pip install -r requirements.txt")
    if not torch.cuda.is_available():
        raise SetupError("measuring the ceilings needs a CUDA GPU, and torch sees none (nvidia-smi; a CUDA build of torch)")
    props = torch.cuda.get_device_properties(device)
    t_uuid = getattr(props, "uuid", None)
    uuid = gpu_uuid(device) or (f"GPU-{t_uuid}" if t_uuid else props.name.replace(" ", "_") + f"-{device}")
    key = machine_key(device) or f"{props.name}-device{device}"
    path = record_path(key)
    with _Lock(path.with_suffix(".lock")):
        c = None if refresh else read_ceilings(path)
        want_nvlink = nvlink and torch.cuda.device_count() >= 2
        if c is not None and not (want_nvlink and not c.get("nvlink", {}).get("gpus", 0) >= 2):
            return c
        t0 = _dt.datetime.now(_dt.timezone.utc)
        if c is None:
            log(f"measuring the ceilings of GPU {device} ({props.name}, {uuid}), {'quick' if quick else 'full'} "
                f"set; cached in {path}")
            kern = _triton_kernels()
            with torch.cuda.device(device), clocks.Sampler(device) as s:
                dram = measure_dram(torch, device, quick, log, sampler=s)
                gemm = measure_gemm(torch, device, quick, log, sampler=s)
            log_path = path.with_suffix(".clocks.csv")
            if s.available:
                clocks.write_csv(log_path, s.rows)
            g = gpus()
            me = g[device] if device < len(g) else {}
            c = {"version": CEILINGS_VERSION, "gpu": props.name, "machine": key, "uuid": uuid, "device_index": device,
                 "mode": "quick" if quick else "full", "date_utc": t0.strftime("%Y-%m-%dT%H:%M:%SZ"),
                 "driver": me.get("driver"), "torch": torch.__version__, "cuda_runtime": torch.version.cuda,
                 "triton": (kern or {}).get("version"), "sm_count": props.multi_processor_count,
                 "l2_mb": round(getattr(props, "L2_cache_size", 0) / 2**20, 1),
                 "datasheet": device_spec(props.name), "dram": dram, "bf16": gemm,
                 "clocks": {**s.info, "samples": len(s.rows), "log": log_path.name if s.available else None,
                            "why_none": s.why or None},
                 "nvlink": {"note": "one GPU visible: no all-reduce sweep" if torch.cuda.device_count() < 2
                            else "all-reduce sweep not asked for (--no-nvlink)"}}
        if want_nvlink:
            n = torch.cuda.device_count()
            log(f"NCCL all-reduce sweep over {n} GPUs ({'quick' if quick else 'full'})")
            c["nvlink"] = {**measure_nvlink(n, quick, log), "mode": "quick" if quick else "full"}
        c["wall_s"] = round((_dt.datetime.now(_dt.timezone.utc) - t0).total_seconds() + c.get("wall_s", 0), 1)
        save_ceilings(c, path)
        return c


def measure_peaks(device: int = 0, *, refresh: bool = False, quick: bool = False) -> dict:
    """Measure the ceilings of ``device`` in this process (cached) and return them as :func:`peaks` does."""
    return as_peaks(measure_ceilings(device, quick=quick, refresh=refresh))


def _print_set(c: dict, path=None) -> None:
    from common.base.story import table
    print(f"{c['gpu']} ({c['uuid']}) · {c['mode']} set v{c['version']} · {c['date_utc']} · driver {c.get('driver')} · "
          f"torch {c.get('torch')} · triton {c.get('triton')}" + (f" · {path}" if path else ""))
    rows = ceilings_table(c)
    print(table(rows, ["ceiling", "probe", "measured", "unit", "datasheet", "pct_of_datasheet", "is_ceiling"], max_width=60))
    print("methods:")
    for what, part in (("DRAM bandwidth", c["dram"]), ("bf16 tensor throughput", c["bf16"]),
                       ("NVLink all-reduce busbw", c.get("nvlink") or {})):
        print(f"  {what}: {part.get('method') or part.get('error') or part.get('note') or '-'}")
    for n in (c["dram"].get("notes") or []) + (c["bf16"].get("notes") or []):
        print(f"  note: {n}")


def ceilings_main(argv=None) -> int:
    """``python -m common ceilings measure [--refresh] [--quick] [--device N]`` · ``python -m common ceilings show``."""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m common ceilings",
                                 description="This GPU's measured ceilings (DRAM, bf16 GEMM, NVLink), cached per GPU "
                                             f"UUID in {ceilings_dir()} (HANDS_ON_CACHE overrides the base).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="measure (or read the cached) ceilings and print the table")
    m.add_argument("--refresh", action="store_true", help="measure again even if a cached set exists")
    m.add_argument("--quick", action="store_true", help="quick set: 1 GiB buffers, 16 GEMM shapes, 4 all-reduce sizes")
    m.add_argument("--device", type=int, default=0, help="visible GPU index (default 0)")
    m.add_argument("--no-nvlink", action="store_true", help="skip the all-reduce sweep even with >= 2 GPUs")
    m.add_argument("--json-out", help="also write the set to this file")
    s = sub.add_parser("show", help="print the cached set(s) without touching CUDA")
    s.add_argument("--device", type=int, help="only this visible GPU (default: every visible one, or every cached set)")
    a = ap.parse_args(argv)
    if a.cmd == "measure":
        c = measure_ceilings(a.device, quick=a.quick, refresh=a.refresh, nvlink=not a.no_nvlink)
        if a.json_out:
            save_ceilings(c, a.json_out)
        _print_set(c, record_path(c["machine"]))
        return 0
    g = gpus()
    idx = [a.device] if a.device is not None else list(range(len(g)))
    paths = (list(dict.fromkeys(record_path(machine_key(i)) for i in idx if i < len(g))) if g
             else sorted(ceilings_dir().glob("*.json")))
    shown = 0
    for p in paths:
        c = read_ceilings(p)
        if c is None:
            print(f"{p}: no cached set of version {CEILINGS_VERSION} (python -m common ceilings measure)")
            continue
        _print_set(c, p)
        shown += 1
    if not paths:
        print(f"no cached ceilings in {ceilings_dir()} (python -m common ceilings measure)")
    return 0 if shown else 1
