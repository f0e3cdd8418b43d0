#!/usr/bin/env python3
"""04 · RMSNorm and fused add+RMSNorm: how close to the DRAM copy ceiling, and what the fusion saves in bytes and time.

What it measures
    flashinfer.rmsnorm and flashinfer.fused_add_rmsnorm against the same maths in plain torch (unfused:
    several elementwise/reduction kernels) and against the unfused pair (torch add, then flashinfer.rmsnorm),
    for hidden 4096 (Llama-3.1-8B) and 8192 (Llama-3.1-70B), tokens 1 -> 16k, bf16. Per point: median kernel
    time (common.capture.timing.bench: CUPTI, cold L2) and the effective bandwidth: the bytes the op must move (common.tables.flops:
    rmsnorm_bytes, fused_add_rmsnorm_bytes, add_then_rmsnorm_bytes) over that time. It is a DRAM rate, given as % of
    this GPU's measured DRAM ceiling of the op's traffic (copy: one read per write; add-then-norm: mixed), only where
    the working set is at least 4x the L2 (common.capture.timing.rates): the sweep's largest points and the fusion point.

    The fusion saving is measured where writes are counted. ncu's per-kernel dram__bytes_write misses the dirty
    lines still in L2 when a kernel ends (at <= 1,024 tokens the writes read about 0; at 8k x 4096 RMSNormKernel
    "wrote" 46.5 of its 67.1 MB), so a small working set under-counts exactly the traffic the fusion saves. Here
    the fusion point is sized from this GPU's L2: tokens x 4096 x 2 bytes >= 8 x L2 (65,536 tokens on a 50-60 MB
    L2), where at most one L2 of dirty lines (<= 1/8 of one tensor) can escape the count. At that point fused and
    add-then-norm are timed 3 times each (interleaved) and compared in time (time saving, and effective TB/s =
    common.tables.flops bytes / time) and, with --ncu, in measured DRAM bytes (reads + writes of every kernel of the
    variant, 3 launches each; measured writes / formula writes shows how much was counted).

What the plan expected (hypotheses: H_* below with their ranges and sources; judged on intervals)
    * RMSNorm is memory-bound: high DRAM %, low SM %, "85% of peak bandwidth" (judged: effective bandwidth 75-95% of
      the measured DRAM copy ceiling at the fusion point, >= 8x L2, 3 repetitions; the ceiling is named in the
      verdict);
    * the fused residual-add variant "saves 40% memory traffic" (the byte count says 20%: add then norm
      moves 5 tensors of T x H, the fused kernel 4; analysis.md (reading the source)) — both judged, in bytes and in time;
    * a handful of tokens cannot fill the GPU: launch/latency bound (judged on effective bandwidth at 1 token against
      the same kernel's at the fusion point: an 8 KB working set has no DRAM rate).
    Reading ncu: a kernel whose SM % exceeds its DRAM % is not compute-bound when its top stall is a memory
    stall (long_scoreboard): common.judge.bounds.bound() calls that memory-latency-bound, and the verdict says why.

Run
    python flashinfer/scripts/04_profile_rmsnorm.py --quick          # ~1 min (warm JIT)
    python flashinfer/scripts/04_profile_rmsnorm.py                  # full sweep
    python flashinfer/scripts/04_profile_rmsnorm.py --quick --ncu    # + DRAM bytes (fusion), bound(), stalls
    python flashinfer/scripts/04_profile_rmsnorm.py --hidden 4096 --tokens 1,8192
    python flashinfer/scripts/04_profile_rmsnorm.py --reanalyse DIR --out OUT   # no GPU: the analysis again from DIR
    ./flashinfer/scripts/ncu_profile.sh --kernel RMSNorm --set full -- \\
        python flashinfer/scripts/04_profile_rmsnorm.py --ncu-target --quick
Writes flashinfer/results/04_profile_rmsnorm/: sweep.csv, reference.csv, fusion.csv, ncu_kernels.csv (--ncu),
bandwidth.png (effective TB/s against the working set, DRAM ceilings and the L2 size drawn), story.txt, summary.json.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _fi  # noqa: E402
from _fi import REPEATS  # noqa: E402
from common.base import story  # noqa: E402
from common.base.checks import run_main  # noqa: E402
from common.capture import ceilings, timing  # noqa: E402
from common.capture.ranges import nvtx_range  # noqa: E402
from common.capture.timing import bench, eff_premise, rates  # noqa: E402
from common.tables import flops, kernels, ncu_pass  # noqa: E402
from common.judge import bounds  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.render import plots  # noqa: E402
from common.run import cli, recording  # noqa: E402
from common.run.results import Run  # noqa: E402

# ------------------------------------------------------------------ the sweep, as data
HIDDEN = (4096, 8192)
TOKENS_FULL = (1, 16, 64, 256, 1024, 4096, 8192, 16384)
TOKENS_QUICK = (1, 64, 1024, 8192)
RMSNORM, TORCH, FUSED, ADD_NORM = VARIANTS = (
    "flashinfer.rmsnorm", "torch rmsnorm (unfused)", "flashinfer.fused_add_rmsnorm", "torch add + flashinfer.rmsnorm")
BYTES = {RMSNORM: flops.rmsnorm_bytes, TORCH: flops.rmsnorm_bytes, FUSED: flops.fused_add_rmsnorm_bytes,
         ADD_NORM: flops.add_then_rmsnorm_bytes}     # minimum DRAM bytes of each variant (common.tables.flops)
# tokens x hidden tensors each variant reads, writes and touches (its working set): rmsnorm reads x, writes y; the fused
# kernel reads x and the residual and writes both back in place; add then norm reads x, r, writes r, reads r, writes y
TENSORS = {RMSNORM: (1, 1, 2), TORCH: (1, 1, 2), FUSED: (2, 2, 2), ADD_NORM: (3, 2, 3)}
L2_FACTOR = 8              # the fusion point: one tokens x hidden bf16 tensor >= L2_FACTOR x the L2 size
FUSION_HIDDEN = 4096       # Llama-3.1-8B
SMALL_TOKENS = 1           # "a handful of tokens"
KERNELS = "RMSNorm|vectorized_elementwise|unrolled_elementwise|reduce_kernel"  # + torch baseline kernels (not randn)

# ------------------------------------------------------------------ the hypotheses, as data
PLAN = "PLAN.md session 3 / flashinfer/reports/plan.md §04 (A100)"
H = declare(f"""
    bw = rmsnorm-bw: RMSNorm reaches ~85% of peak DRAM bandwidth at large token counts
        judged on: flashinfer.rmsnorm effective bandwidth (common.tables.flops bytes / CUPTI time, cold L2) as % of the
            measured DRAM copy ceiling (one read per write) at the fusion point, {REPEATS} repetitions; a DRAM rate
            because the working set there is >= {L2_FACTOR}x L2 (common.capture.timing.eff_premise)
        confirmed: [75, 95]%
        source: {PLAN}: '85% of peak bandwidth', read as 75-95%
    small = rmsnorm-small: a handful of tokens cannot fill the GPU (far below the ceiling)
        judged on: flashinfer.rmsnorm effective bandwidth at {SMALL_TOKENS} token as % of its own effective bandwidth
            at the fusion point, {REPEATS} interleaved repetitions (an 8 KB working set gives no DRAM rate: the
            kernel's own streaming rate is the ceiling it does not reach)
        confirmed: <= 20%
        source: {PLAN}; flashinfer/reports/plan.md §04: 'launch/latency bound'; 20% read as far below
    bound = rmsnorm-memory-bound: RMSNorm is memory-bound (it waits on DRAM, not on math)
        judged on: common.judge.bounds.bound() of RMSNormKernel at the fusion point, {REPEATS} launches: memory-bound or
            memory-latency-bound (SM % above DRAM % with a memory top stall)
        source: {PLAN}; analysis.md H-13
    fuse_plan = fusion-40: fusing the residual add saves ~40% of memory traffic
        judged on: traffic saved by fused_add_rmsnorm vs torch add + flashinfer.rmsnorm at the fusion point (ncu DRAM
            bytes with --ncu, else time at equal bandwidth)
        confirmed: [30, 50]%
        source: {PLAN}: '40% less memory traffic', read as 30-50%
    fuse_bytes = fusion-20-bytes: fusing the residual add saves ~20% of the DRAM bytes (10H -> 8H per row)
        judged on: measured DRAM bytes (ncu, reads + writes) saved at the fusion point, {REPEATS} launches each
        confirmed: [15, 25]%
        source: flashinfer/reports/plan.md §04 (H100/H200), analysis.md (reading the source)
    fuse_time = fusion-20-time: fusing the residual add saves ~20% of the time (memory-bound: time ~ bytes)
        judged on: kernel time saved at the fusion point, {REPEATS} interleaved repetitions
        confirmed: [15, 25]%
        source: flashinfer/reports/plan.md §04 (H100/H200): the 20% byte count
""")


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="4 token counts instead of 8 (~1 min)")
    p.add_argument("--ncu", action="store_true", help="also profile every point once (the fusion point 3x) under ncu")
    p.add_argument("--ncu-target", action="store_true", help=argparse.SUPPRESS)  # run points once, for ncu
    p.add_argument("--hidden", type=cli.positive_ints, default=list(HIDDEN), help="hidden sizes (default 4096,8192)")
    p.add_argument("--tokens", type=cli.positive_ints, default=None, help="token counts of the sweep")
    p.add_argument("--eps", type=cli.positive_float, default=1e-5)
    recording.add_flag(p)
    return p.parse_args(argv)


def plan_points(args) -> list[dict]:
    toks = args.tokens or (TOKENS_QUICK if args.quick else TOKENS_FULL)
    return [{"variant": v, "hidden": h, "tokens": t} for h in args.hidden for t in toks for v in VARIANTS]


def fusion_tokens(hidden: int, l2_bytes: int, factor: int = L2_FACTOR) -> int:
    """The smallest power of two of tokens whose tokens x hidden bf16 tensor is >= factor x the L2 size."""
    t = 1
    while t * hidden * 2 < factor * l2_bytes:
        t *= 2
    return t


def reference_points(l2_bytes: int) -> list[dict]:
    """The judged points: the three fusion variants at the fusion point, plain rmsnorm at SMALL_TOKENS."""
    big = fusion_tokens(FUSION_HIDDEN, l2_bytes)
    return [{"variant": v, "hidden": FUSION_HIDDEN, "tokens": big} for v in (RMSNORM, FUSED, ADD_NORM)] + \
        [{"variant": RMSNORM, "hidden": FUSION_HIDDEN, "tokens": SMALL_TOKENS}]


def label(p) -> str:
    return f"{p['variant']} tokens={p['tokens']} hidden={p['hidden']}"


def torch_rmsnorm(torch, x, w, eps):
    """The unfused reference: what a framework without a norm kernel runs."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def make_call(x, p):
    """(fn, keep) for one variant at one point (in-place variants update x / residual on every call)."""
    torch, fi, eps = x.torch, x.fi, x.args.eps
    a = torch.randn(p["tokens"], p["hidden"], device="cuda", dtype=torch.bfloat16)
    r, w, out = torch.randn_like(a), torch.randn(p["hidden"], device="cuda", dtype=torch.bfloat16), torch.empty_like(a)
    fn = {RMSNORM: lambda: fi.rmsnorm(a, w, eps=eps, out=out), TORCH: lambda: torch_rmsnorm(torch, a, w, eps),
          FUSED: lambda: fi.fused_add_rmsnorm(a, r, w, eps=eps),
          ADD_NORM: lambda: (r.add_(a), fi.rmsnorm(r, w, eps=eps, out=out))}[p["variant"]]
    return fn, (a, r, w, out)


def work(p) -> dict:
    """Formula bytes of one call (common.tables.flops), the kind of its traffic (TENSORS: reads and writes) and its working
    set (the tensors it touches, an in-place write counted once)."""
    reads, writes, touched = TENSORS[p["variant"]]
    one = p["tokens"] * p["hidden"] * 2
    return {"bytes": BYTES[p["variant"]](p["tokens"], p["hidden"]), "mix": ceilings.dram_kind(reads, writes),
            "working_set": touched * one + p["hidden"] * 2}


def timed(x, p, fn) -> dict:
    with nvtx_range(label(p)):
        t = bench(fn)
    w = work(p)
    r = rates(t.median_ms, bytes=w["bytes"], peaks=x.pk, mix=w["mix"], working_set=w["working_set"])
    return {**p, "time_us": t.median_us, "spread_pct": t.spread_pct, **timing.rate_row(r)}


def check_correctness(run, x):
    """Correct before fast: both FlashInfer ops against float32 torch on fresh random data."""
    torch, fi, eps = x.torch, x.fi, x.args.eps
    for hidden in x.args.hidden:
        a = torch.randn(333, hidden, device="cuda", dtype=torch.bfloat16)
        r, w = torch.randn_like(a), torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
        e1 = _fi.rel_err(fi.rmsnorm(a, w, eps=eps), torch_rmsnorm(torch, a, w, eps))
        resid = a.float() + r.float()
        a2, r2 = a.clone(), r.clone()
        fi.fused_add_rmsnorm(a2, r2, w, eps=eps)
        e2, e3 = _fi.rel_err(a2, torch_rmsnorm(torch, resid.to(torch.bfloat16), w, eps)), _fi.rel_err(r2, resid)
        good = all(e < 1e-2 for e in (e1, e2, e3))   # NaN compares False
        run.log(f"correctness hidden={hidden}: rmsnorm rel.err {e1:.1e}, fused out {e2:.1e}, residual {e3:.1e} "
                f"{'✅' if good else '❌'}")
        if not good:
            raise RuntimeError("FlashInfer RMSNorm disagrees with the torch reference (rel. error >= 1e-2)")
    run.log("All results match. Starting benchmarks.")


def ncu_target(x) -> int:
    """Under ncu: every sweep point once, then each reference point REPEATS times, a marker kernel before each."""
    l2 = x.torch.cuda.get_device_properties(0).L2_cache_size
    return ncu_pass.run_points(x.torch, _fi.with_repeats(plan_points(x.args), reference_points(l2)),
                               lambda p: make_call(x, p), label)


def sweep(run, x):
    def measure(p):
        fn, _keep = make_call(x, p)
        return timed(x, p, fn)
    return _fi.sweep(run, x.torch, x.points, measure,
                     lambda p: f"hidden={p['hidden']} tokens={p['tokens']}" if p["variant"] == VARIANTS[0] else None)


def reference(run, x):
    """Each reference point REPEATS times, the variants interleaved per repetition (a drift hits all alike)."""
    import pandas as pd
    refs = reference_points(x.l2)
    run.log(f"fusion point: {refs[0]['tokens']} tokens x {FUSION_HIDDEN} x 2 B = {refs[0]['tokens'] * FUSION_HIDDEN * 2 / 1e6:.0f}"
            f" MB per tensor = {refs[0]['tokens'] * FUSION_HIDDEN * 2 / x.l2:.1f}x the {x.l2 / 2**20:.0f} MB L2")
    calls = [(p, *make_call(x, p)) for p in refs]
    rows = [{**timed(x, p, fn), "rep": i} for i in range(REPEATS) for p, fn, _keep in calls]
    del calls
    df = pd.DataFrame(rows)
    run.table("reference", df)
    return df


def writes_counted(write_mb: float, tokens: int, hidden: int, tensors: int) -> float:
    """ncu's dram__bytes_write over the bytes the kernel must write (``tensors`` outputs of tokens x hidden bf16):
    below 1 when dirty lines were still in L2 as the kernel ended (uncounted)."""
    return write_mb * 1e6 / (tensors * tokens * hidden * 2)


def memory_bound(row) -> bool:
    """common.judge.bounds.bound() says it waits on memory: memory-bound, or memory-latency-bound (SM % above DRAM % with a
    memory top stall such as long_scoreboard: the load/store issue counts in SM %, the math pipes are idle)."""
    return bounds.bound(row).startswith("memory")


def fusion(x):
    """Fused vs add-then-norm at the fusion point, per repetition: time, formula bytes, effective TB/s and (with
    ncu) measured DRAM bytes of all the variant's kernels, writes measured over writes in the formula."""
    import pandas as pd
    ref, big = x.ref, reference_points(x.l2)[0]["tokens"]
    rows = []
    for i in range(REPEATS):
        f = _fi.pick(ref, variant=FUSED, tokens=big, rep=i)
        u = _fi.pick(ref, variant=ADD_NORM, tokens=big, rep=i)
        row = {"rep": i, "tokens": big, "hidden": FUSION_HIDDEN, "fused_us": f["time_us"], "add_norm_us": u["time_us"],
               "fused_eff_tb_s": f["eff_tb_s"], "add_norm_eff_tb_s": u["eff_tb_s"], "fused_bytes": f["bytes"],
               "add_norm_bytes": u["bytes"],
               "time_saving_pct": 100 * (1 - f["time_us"] / u["time_us"]),
               "formula_saving_pct": 100 * (1 - f["bytes"] / u["bytes"])}
        if x.kern is not None:
            k = x.kern[(x.kern["kind"] == "reference") & (x.kern["rep"] == i) & (x.kern["tokens"] == big)]
            mb = {v: k[k["variant"] == v][["dram_read_mb", "dram_write_mb"]].sum() for v in (FUSED, ADD_NORM)}
            row.update(fused_dram_mb=mb[FUSED].sum(), add_norm_dram_mb=mb[ADD_NORM].sum(),
                       dram_saving_pct=100 * (1 - mb[FUSED].sum() / mb[ADD_NORM].sum()) if mb[ADD_NORM].sum() else None,
                       fused_writes_counted=writes_counted(mb[FUSED]["dram_write_mb"], big, FUSION_HIDDEN, 2))
        rows.append(row)
    return pd.DataFrame(rows)


def profile_ncu(run, x):
    run.log("ncu: every point once, the fusion point 3 times (DRAM bytes, bound(), occupancy, stalls)")
    kern = ncu_pass.profile_points(run, __file__, x.child, KERNELS, _fi.with_repeats(x.points, reference_points(x.l2)),
                                   x.pk)[0]
    run.table("ncu_kernels", kern)
    return kern


def judge(run, x):
    """Bandwidth at the fusion point and at 1 token (REPEATS timings), bound() (REPEATS launches), the fusion saving
    in time (REPEATS) and in measured bytes (REPEATS launches, with --ncu)."""
    ref, fu, big = x.ref, x.fu, reference_points(x.l2)[0]["tokens"]
    norm = ref[(ref["variant"] == RMSNORM) & (ref["tokens"] == big)].sort_values("rep")
    copy = timing.dram_ceiling_text(x.pk, "copy")
    run.headline(rmsnorm_eff_tb_s=float(norm["eff_tb_s"].median()),
                 rmsnorm_eff_pct_of_copy_ceiling=float(norm["eff_pct"].median()),
                 fusion_time_saving_pct=float(fu["time_saving_pct"].median()))
    where = f"{big} tokens x {FUSION_HIDDEN} ({big * FUSION_HIDDEN * 2 / x.l2:.0f}x L2 per tensor)"
    run.judge(H["bw"], list(norm["eff_pct"]), evidence="reference.csv", premise=eff_premise(norm.to_dict("records"), copy),
              detail=f"{where}; median {timing.eff_text(timing.median_row(norm.to_dict('records')), x.pk)}; % of {copy}")
    small = ref[(ref["variant"] == RMSNORM) & (ref["tokens"] == SMALL_TOKENS)].sort_values("rep")
    run.judge(H["small"], own_share(small, norm), evidence="reference.csv", digits=2,
              detail=f"{small['time_us'].median():.1f} us for {SMALL_TOKENS} token: "
                     f"{timing.eff_text(timing.median_row(small.to_dict('records')), x.pk)}; at the fusion point "
                     f"{norm['eff_tb_s'].median():.2f} TB/s effective")
    how = (f"time at {where} (fused {fu['fused_us'].median():.0f} us, {fu['fused_eff_tb_s'].median():.2f} TB/s "
           f"effective; add+norm {fu['add_norm_us'].median():.0f} us, {fu['add_norm_eff_tb_s'].median():.2f} TB/s; "
           f"formula bytes {fu['formula_saving_pct'].iloc[0]:.0f}% fewer)")
    run.judge(H["fuse_time"], list(fu["time_saving_pct"]), evidence="fusion.csv", detail=how)
    if x.kern is None:
        run.judge(H["fuse_plan"], list(fu["time_saving_pct"]), evidence="fusion.csv",
                  detail=f"no --ncu: judged on {how}, at equal bandwidth time ~ bytes")
        return
    bytes_how = (f"ncu DRAM bytes at {where}: fused {fu['fused_dram_mb'].median():.0f} MB vs add+norm "
                 f"{fu['add_norm_dram_mb'].median():.0f} MB; writes counted {fu['fused_writes_counted'].median():.2f}x the "
                 "formula's (>= 8x L2: the dirty lines left in L2 are at most 1/8 of one tensor)")
    run.headline(fusion_dram_saving_pct=float(fu["dram_saving_pct"].median()))
    run.judge(H["fuse_bytes"], list(fu["dram_saving_pct"]), evidence="fusion.csv, ncu_kernels.csv", detail=bytes_how)
    run.judge(H["fuse_plan"], list(fu["dram_saving_pct"]), evidence="fusion.csv, ncu_kernels.csv", detail=bytes_how)
    rows = [r for r in _fi.reference_rows(x.kern, variant=RMSNORM, tokens=big) if r["kernel"] == "RMSNormKernel"]
    run.fact(H["bound"], [memory_bound(r) for r in rows] or None,
             "; ".join(dict.fromkeys(bounds.bound_why(r) for r in rows)) or "RMSNormKernel not profiled",
             f"ncu_kernels.csv ({len(rows)} launches, kind=reference)")


def findings(run, x):
    """The sentence the pages state about this run (Run.finding), from the fusion table: the time fusing the residual
    add saves against the bytes it saves (ncu's DRAM bytes with --ncu, else the formula's), and whether the time
    follows the bytes (within 5 points), as it does for kernels that wait on memory."""
    fu = x.fu
    t = fu["time_saving_pct"].median()
    dram = x.kern is not None and fu["dram_saving_pct"].notna().any()
    b = fu["dram_saving_pct"].median() if dram else fu["formula_saving_pct"].iloc[0]
    run.finding(f"Fusing the residual add into RMSNorm saves {t:.1f}% of the kernel time for {b:.1f}% fewer "
                f"{'DRAM bytes (ncu)' if dram else 'formula bytes'} at the fusion point: the time "
                f"{'follows' if abs(t - b) <= 5 else 'does not follow'} the bytes.")


def own_share(small, big) -> list[float]:
    """Effective bandwidth of each repetition at the small point as % of the same repetition's at the fusion point
    (the repetitions are interleaved, so a drift hits both alike)."""
    return [100 * a / b for a, b in zip(small["eff_tb_s"], big["eff_tb_s"]) if b]


def tell(x) -> str:
    big_t = x.df["tokens"].max()
    big = x.df[x.df["tokens"] == big_t]
    items = [(f"{name}: " + "; ".join(f"h={int(r['hidden'])} {r['time_us']:.1f} us, {timing.eff_text(r, x.pk)}"
                                      for r in big[big["variant"] == name].to_dict("records")), []) for name in VARIANTS
             if (big["variant"] == name).any()]
    fu = x.fu
    kids = [(f"time: fused {fu['fused_us'].median():.0f} us vs add+norm {fu['add_norm_us'].median():.0f} us -> "
             f"{fu['time_saving_pct'].median():.1f}% saved [{fu['time_saving_pct'].min():.1f}, "
             f"{fu['time_saving_pct'].max():.1f}] over {REPEATS} repetitions", []),
            (f"bytes (common.tables.flops): {fu['fused_bytes'].iloc[0] / 1e6:.0f} MB vs {fu['add_norm_bytes'].iloc[0] / 1e6:.0f} "
             f"MB -> {fu['formula_saving_pct'].iloc[0]:.0f}% fewer", [])]
    if x.kern is not None:
        kids.append((f"DRAM bytes (ncu): {fu['fused_dram_mb'].median():.0f} MB vs {fu['add_norm_dram_mb'].median():.0f} MB "
                     f"-> {fu['dram_saving_pct'].median():.1f}% saved; fused writes counted "
                     f"{fu['fused_writes_counted'].median():.2f}x the formula", []))
        last = x.kern[(x.kern["kind"] == "reference") & (x.kern["rep"] == 0) & (x.kern["tokens"] == fu["tokens"].iloc[0])]
        kids += [kernels.node(r, head=f"{r['variant']}: {r['kernel']} (ncu) [{bounds.bound_why(r)}]")
                 for r in last.to_dict("records")]
    items.append((f"fusion point: {fu['tokens'].iloc[0]} tokens x {FUSION_HIDDEN} (one tensor "
                  f"{fu['tokens'].iloc[0] * FUSION_HIDDEN * 2 / 1e6:.0f} MB, L2 {x.l2 / 2**20:.0f} MB)", kids))
    return story.tree(f"RMSNORM at {big_t} tokens, bf16 — {x.pk['gpu']}; effective bandwidth = formula bytes / time, a "
                      f"% of {timing.dram_ceiling_text(x.pk, 'copy', short=True)} only at working sets >= "
                      f"{ceilings.STREAM_FACTOR}x L2 (L2 {x.l2 / 2**20:.0f} MB); DRAM rates from ncu's bytes", items)


@dataclass
class Record:
    """What the analysis of one run reads: the arguments, the L2 size (bytes), the ceilings and the tables the GPU
    phase measured (the same tables a --reanalyse reads back from a recording); torch, fi, points and child are
    the GPU phase's own."""
    args: argparse.Namespace
    l2: int
    pk: dict = None
    df: Any = None                # sweep.csv
    ref: Any = None               # reference.csv
    kern: Any = None              # ncu_kernels.csv (None without --ncu)
    fu: Any = None                # fusion.csv (made by analyse from ref and kern)
    torch: Any = None
    fi: Any = None
    points: list = None
    child: list = None


def analyse(run, x: Record) -> None:
    """The fusion table, the figure, verdicts and story from the measured tables (a GPU run and --reanalyse alike)."""
    x.fu = fusion(x)
    run.table("fusion", x.fu)
    h0 = x.args.hidden[0]
    run.figure("bandwidth", plots.effective(x.df[x.df["hidden"] == h0], x.pk, hue="variant", mix="copy",
                                            title=f"RMSNorm, hidden {h0}, bf16 — {x.pk['gpu']}"))
    # ---- verdicts
    judge(run, x)
    findings(run, x)
    # ---- the story
    run.story(tell(x), echo=True)


def main_reanalyse(args) -> int:
    """No GPU: the recording's tables (sweep, reference, ncu_kernels with --ncu) through analyse(); the L2 size is the
    one the recording's provenance names (it sizes the fusion point)."""
    rec = recording.open(args.reanalyse, __file__, tables=("sweep", "reference"), optional=("ncu_kernels",))
    pk = rec.peaks
    l2 = ceilings.l2_bytes({"l2_mb": (rec.summary.get("provenance") or {}).get("l2_mb")}) or ceilings.l2_bytes(pk)
    x = Record(args=rec.args_like(args), l2=int(l2), pk=pk, df=rec.tables["sweep"], ref=rec.tables["reference"],
               kern=rec.tables["ncu_kernels"])
    with recording.run(__file__, args, rec) as run:
        analyse(run, x)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    torch, fi = _fi.require_stack()
    x = Record(torch=torch, fi=fi, args=args, points=plan_points(args), child=ncu_pass.own_argv(argv), kern=None,
               l2=torch.cuda.get_device_properties(0).L2_cache_size)
    if args.ncu_target:
        return ncu_target(x)
    with Run(__file__, args, out=args.out) as run:
        # ---- check: the ceiling every % divides by, the norm path, correctness before timing
        x.pk = ceilings.peaks()
        run.log(f"{x.pk['gpu']}: {ceilings.kinds_text(x.pk)}; L2 {x.l2 / 2**20:.0f} MB")
        import flashinfer.norm as fnorm
        run.note("FlashInfer norm path: " + ("CUDA JIT `norm` module" if getattr(fnorm, "_USE_CUDA_NORM", True)
                                             else "CuTe-DSL kernels"))
        check_correctness(run, x)
        # ---- measure
        x.df = sweep(run, x)
        x.ref = reference(run, x)
        if args.ncu:
            x.kern = profile_ncu(run, x)
        # ---- analyse: the fusion table, the figure, verdicts, the story
        analyse(run, x)
    return 0


if __name__ == "__main__":
    run_main(main)
