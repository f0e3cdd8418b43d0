#!/usr/bin/env python3
"""05 · RoPE: which kernel each API runs, how close it gets to the DRAM copy ceiling, and its access pattern.

What it measures
    The RoPE entry points of FlashInfer on Llama-3.1-8B heads (32 q / 8 k heads, bf16, theta and
    Llama-3.1 scaling from the model config): apply_rope (indptr/offsets; requests of --req-tokens,
    and once as a single long request), apply_rope_pos_ids, apply_llama31_rope,
    apply_llama31_rope_pos_ids, apply_rope_with_cos_sin_cache and its in-place form (what SGLang
    calls), over token counts 1 -> 32k (head_dim 64/128/256 in the full run). For each point: the
    kernel the call launched (torch-profiler trace, common.tables.trace join), median time (common.capture.timing.bench,
    CUPTI, cold L2) and the effective bandwidth: the bytes RoPE must move (common.tables.flops.rope_bytes: read + write
    q and k, plus positions / the fp32 cos-sin row) over that time; as % of the measured DRAM copy ceiling only
    where the working set (q and k, once more for an out-of-place output, the cos/sin rows) is at least 4x the L2
    (common.capture.timing.rates). The judged APIs at 32k tokens, head_dim 128 are timed 3 times each, interleaved
    (reference.csv). With --ncu (caches flushed before each pass, as the timing flushed them): measured DRAM bytes
    against that formula and as % of the ceiling of their kind, L2 hit rate, SM %, occupancy with its launch facts,
    grid, top stalls (the reference points 3 launches each).

What the plan expected (hypotheses: H_* below with their ranges and sources; judged on intervals)
    * RoPE is an in-place, memory-bound kernel at ~75% of peak HBM (judged: effective bandwidth 65-85% of the
      measured DRAM copy ceiling at 32k tokens, whose working set is >= 4x L2, 3 repetitions);
    * from the source (analysis.md H-15, H-01): each API ends in its predicted kernel; the cos/sin
      cache API uses a head-parallel kernel while token blocks are fewer than the GPU can hold and
      a token-parallel one above; computing cos/sin on the fly costs issue slots; the indptr API
      gives one CTA per (request, head), so one long request under-fills the GPU.

Run
    python flashinfer/scripts/05_profile_rope.py --quick          # ~1 min (warm JIT): head_dim 128, 4 token counts
    python flashinfer/scripts/05_profile_rope.py                  # full: head_dim 64/128/256, 1 -> 32k tokens
    python flashinfer/scripts/05_profile_rope.py --quick --ncu    # + DRAM bytes vs formula, stalls (kernels.csv)
    ./flashinfer/scripts/ncu_profile.sh --kernel Rotary --set full --count 2 -- \\
        python flashinfer/scripts/05_profile_rope.py --ncu-target --quick
    python flashinfer/scripts/05_profile_rope.py --reanalyse DIR --out OUT   # no GPU: the analysis again from DIR
Writes flashinfer/results/05_profile_rope/: sweep.csv, reference.csv, kernels.csv + kernels_full.csv (--ncu),
bandwidth.png (effective TB/s against the working set, DRAM ceilings and the L2 size drawn), trace.json, story.txt,
summary.json.
"""
from __future__ import annotations

import argparse
import re
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
from common.tables import flops, kernels, ncu_pass, trace  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.render import plots  # noqa: E402
from common.run import cli, recording  # noqa: E402
from common.run.results import Run  # noqa: E402

# ------------------------------------------------------------------ the sweep, as data
TOKENS_FULL = (1, 16, 128, 1024, 4096, 8192, 16384, 32768)
TOKENS_QUICK = (16, 1024, 8192, 32768)
DIMS_FULL, DIMS_QUICK = (64, 128, 256), (128,)
ONE_REQ = "apply_rope (1 request)"
VARIANTS = list(_fi.ROPE_APIS) + [ONE_REQ]
INPLACE, OUT_OF_PLACE = "apply_rope_with_cos_sin_cache_inplace", "apply_rope_with_cos_sin_cache"
REF = {"head_dim": 128, "tokens": 32768}                             # the judged point: each API REPEATS times
REF_VARIANTS = (INPLACE, OUT_OF_PLACE, "apply_rope", ONE_REQ, "apply_rope_pos_ids")
MODEL = "llama-3.1-8b"

# ------------------------------------------------------------------ the hypotheses, as data
PLAN = "PLAN.md session 3 / flashinfer/reports/plan.md §05 (A100)"
H = declare(f"""
    bw = rope-bw: RoPE (cos/sin cache, in place) is memory-bound at ~75% of peak HBM
        judged on: {INPLACE} effective bandwidth (common.tables.flops bytes / CUPTI time, cold L2) as % of the measured DRAM
            copy ceiling (each q/k element read and written) at 32k tokens, {REPEATS} repetitions; a DRAM rate because
            its working set (q, k, cos/sin rows: 352 MB) is >= 4x L2 (common.capture.timing.eff_premise)
        confirmed: [65, 85]%
        source: {PLAN}: '≈ 75% of peak HBM', read as 65-85%
    switch = rope-kernel-switch: the cos/sin-cache API switches from the head-parallel kernel (few tokens) to the
            token-parallel one (many tokens)
        judged on: kernel of the in-place API at the fewest and most tokens (a dispatch decision)
        source: analysis.md H-15
    apis = rope-api-kernels: each RoPE API runs the kernel the source reading names
        judged on: kernel of each API's traced call (regex of _fi.ROPE_APIS)
        source: analysis.md H-01
    inplace = rope-inplace-cost: in-place RoPE costs the same as out-of-place (same bytes, outputs elsewhere)
        judged on: time in-place / out-of-place at 32k tokens, {REPEATS} interleaved repetitions
        confirmed: [0.9, 1.1]
        source: analysis.md (reading the source): both read and write q and k once; 10% read as 'the same'
    one_req = rope-one-request: apply_rope with one long request under-fills the GPU (one CTA per request and head)
        judged on: time as 1 request / as requests of --req-tokens at 32k tokens, {REPEATS} repetitions
        confirmed: >= 2
        source: analysis.md H-15; 2x read as 'under-fills'
    onfly = rope-on-the-fly: computing cos/sin on the fly (pos_ids API) costs more issue slots than reading the cache
        judged on: SM % of apply_rope_pos_ids minus SM % of the in-place cache API (ncu), {REPEATS} launches each
        confirmed: >= 2 points
        source: analysis.md H-15; > 2 points: beyond ncu's launch-to-launch noise
    formula = rope-formula-bytes: the in-place kernel moves about the bytes of the formula (each q/k element read and
            written once)
        judged on: ncu DRAM bytes / common.tables.flops.rope_bytes at 32k tokens, {REPEATS} launches
        confirmed: [0.8, 1.3]
        source: flashinfer/reports/plan.md §05: 'bytes vs. formula'
""")


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="head_dim 128, tokens 16/1k/8k/32k (~1 min)")
    p.add_argument("--ncu", action="store_true", help="also profile every point once (the reference 3x) under ncu")
    p.add_argument("--ncu-target", action="store_true", help=argparse.SUPPRESS)  # run points once, for ncu
    p.add_argument("--head-dims", type=cli.choices_list("64", "128", "256"), default=None,
                   help="comma-separated head dims among 64,128,256 (default 128 quick, 64,128,256 full)")
    p.add_argument("--req-tokens", type=cli.positive_int, default=1024, help="tokens per request (indptr/offsets APIs)")
    recording.add_flag(p)
    return p.parse_args(argv)


def plan_points(args) -> list[dict]:
    dims = [int(d) for d in args.head_dims] if args.head_dims else (DIMS_QUICK if args.quick else DIMS_FULL)
    return [{"variant": v, "head_dim": d, "tokens": t} for d in dims for v in VARIANTS
            for t in (TOKENS_QUICK if args.quick else TOKENS_FULL)]


def reference_points() -> list[dict]:
    return [{"variant": v, **REF} for v in REF_VARIANTS]


def label(p) -> str:
    return f"rope {p['variant']} tokens={p['tokens']} d={p['head_dim']}"


def api(variant: str) -> str:
    return "apply_rope" if variant == ONE_REQ else variant


def make_point(x, p):
    """Inputs and a callable for one point: (fn, setup); the setup keeps the tensors alive."""
    lay = {**_fi.head_layout(MODEL), "d": p["head_dim"]}
    s = _fi.rope_setup(x.torch, p["tokens"], lay, req_tokens=p["tokens"] if p["variant"] == ONE_REQ else x.args.req_tokens)
    return _fi.rope_call(x.fi, api(p["variant"]), s), s


def nbytes(p) -> int:
    lay = _fi.head_layout(MODEL)
    return flops.rope_bytes(p["tokens"], lay["hq"], lay["hkv"], p["head_dim"],
                            per_token_extra=_fi.rope_extra_bytes(api(p["variant"]), p["head_dim"]))


def working_set(p) -> int:
    """Bytes one call touches: q and k, once more for an out-of-place output (every API but INPLACE writes new
    tensors), and the per-token extras (position id, cos/sin row: read only)."""
    extra = p["tokens"] * _fi.rope_extra_bytes(api(p["variant"]), p["head_dim"])
    qk = (nbytes(p) - extra) // 2
    return qk + extra if p["variant"] == INPLACE else 2 * qk + extra


def timed(x, p, fn, s) -> dict:
    with nvtx_range(label(p)):
        t = bench(fn)
    r = rates(t.median_ms, bytes=nbytes(p), peaks=x.pk, mix="copy", working_set=working_set(p))
    return {**p, "requests": s["batch"], "time_us": t.median_us, "spread_pct": t.spread_pct, **timing.rate_row(r)}


def check_correctness(run, x):
    """Every API against float32 torch: uneven requests with offsets, per head_dim."""
    for d in sorted({p["head_dim"] for p in x.points}):
        s = _fi.rope_setup(x.torch, 300, {**_fi.head_layout(MODEL), "d": d}, req_tokens=100, offsets=[0, 7, 1000])
        errs = {n: _fi.rope_check(x.torch, x.fi, n, s) for n in _fi.ROPE_APIS}
        bad = {n: e for n, e in errs.items() if not e < 1e-2}
        run.log(f"correctness head_dim={d}: worst rel.err {max(errs.values()):.1e} {'✅' if not bad else '❌'}")
        if bad:
            raise RuntimeError(f"RoPE disagrees with the torch reference (rel. error >= 1e-2): {bad}")
    run.log("All results match. Starting benchmarks.")


def ncu_target(x) -> int:
    """Under ncu: every sweep point once, each reference point REPEATS times, a marker kernel before each."""
    return ncu_pass.run_points(x.torch, _fi.with_repeats(plan_points(x.args), reference_points()),
                               lambda p: make_point(x, p), label)


def sweep(run, x):
    """Every point once, then one traced call per point: the kernel each call launched (common.tables.trace join)."""
    calls, keep = [], []

    def measure(p):
        fn, s = make_point(x, p)
        row = timed(x, p, fn, s)
        calls.append((label(p), fn))
        keep.append(s)
        return row
    df = _fi.sweep(run, x.torch, x.points, measure, lambda p: f"{p['variant']} head_dim={p['head_dim']}"
                   if p["tokens"] == x.points[0]["tokens"] else None, name=None)
    ev = trace.read_chrome_trace(trace.capture_calls(x.torch, calls, run.path("trace.json"), reps=1))
    calls.clear(), keep.clear()
    x.torch.cuda.empty_cache()
    cs = _fi.calls_summary(trace.kernels_in_ranges(ev, r"^rope "))
    kmap = dict(zip(cs["label"], cs["kernels"]))
    df["kernel"] = [kmap.get(label(p), "") for p in df.to_dict("records")]
    run.table("sweep", df)
    return df


def reference(run, x):
    """The judged APIs at 32k tokens, head_dim 128, REPEATS times each, interleaved per repetition."""
    import pandas as pd
    calls = [(p, *make_point(x, p)) for p in reference_points()]
    rows = [{**timed(x, p, fn, s), "rep": i} for i in range(REPEATS) for p, fn, s in calls]
    del calls
    df = pd.DataFrame(rows)
    run.table("reference", df)
    return df


def profile_ncu(run, x):
    run.log("ncu: every point once, the reference points 3 times (DRAM bytes vs formula, L2, SM %, stalls)")
    kern = ncu_pass.profile_points(run, __file__, x.child, "Rotary", _fi.with_repeats(x.points, reference_points()),
                                   x.pk)[0]
    kern["formula_mb"] = [nbytes(r) / 1e6 if r["variant"] else float("nan")
                          for r in kern[["variant", "head_dim", "tokens"]].to_dict("records")]
    kern["measured_over_formula"] = (kern["dram_read_mb"] + kern["dram_write_mb"]) / kern["formula_mb"]
    run.table("kernels_full", kern)
    run.table("kernels", _fi.compact_kernels(kern, ("kind", "rep", "variant", "head_dim", "tokens", "measured_over_formula")))
    return kern


def judge(run, x):
    """Bandwidth and time ratios on the reference repetitions; kernel choices (facts); ncu on REPEATS launches."""
    ref = x.ref
    per = {v: list(ref[ref["variant"] == v].sort_values("rep")["time_us"]) for v in REF_VARIANTS}
    inpl = ref[ref["variant"] == INPLACE].sort_values("rep")
    copy = timing.dram_ceiling_text(x.pk, "copy")
    run.headline(rope_inplace_eff_tb_s=float(inpl["eff_tb_s"].median()),
                 rope_inplace_eff_pct_of_copy_ceiling=float(inpl["eff_pct"].median()))
    run.judge(H["bw"], list(inpl["eff_pct"]), evidence="reference.csv", premise=eff_premise(inpl.to_dict("records"), copy),
              detail=f"median {timing.eff_text(timing.median_row(inpl.to_dict('records')), x.pk)}; % of {copy}")
    run.judge(H["inplace"], [a / b for a, b in zip(per[INPLACE], per[OUT_OF_PLACE])], evidence="reference.csv")
    run.judge(H["one_req"], [a / b for a, b in zip(per[ONE_REQ], per["apply_rope"])], evidence="reference.csv",
              detail=f"requests of {x.args.req_tokens} tokens")
    sub = x.df[x.df["head_dim"] == x.d0]
    cache = sub[sub["variant"] == INPLACE].sort_values("tokens")
    k_lo, k_hi = (cache.iloc[0]["kernel"], cache.iloc[-1]["kernel"]) if len(cache) >= 2 else ("", "")
    run.fact(H["switch"], bool("HeadParallelism" in k_lo and k_hi and "HeadParallelism" not in k_hi),
             f"{cache['tokens'].min()} tokens: {k_lo or '?'}; {cache['tokens'].max()} tokens: {k_hi or '?'}", "sweep.csv",
             premise=True if len(cache) >= 2 else "fewer than 2 token counts swept")
    firsts = sub.drop_duplicates("variant")
    run.fact(H["apis"], [bool(re.search(_fi.ROPE_APIS[api(r.variant)][2], r.kernel or "")) for r in firsts.itertuples()],
             "; ".join(f"{r.variant}: {r.kernel or 'nothing'}" for r in firsts.itertuples()), "sweep.csv")
    if x.kern is None:
        return
    rows = {v: _fi.reference_rows(x.kern, variant=v) for v in ("apply_rope_pos_ids", INPLACE)}
    run.judge(H["onfly"], [a["sm_pct"] - c["sm_pct"] for a, c in zip(rows["apply_rope_pos_ids"], rows[INPLACE])],
              evidence="kernels.csv (kind=reference)", detail="top stalls: pos_ids " + "; ".join(dict.fromkeys(
                  r["top_stalls"] for r in rows["apply_rope_pos_ids"])) + " | cache " + "; ".join(dict.fromkeys(
                      r["top_stalls"] for r in rows[INPLACE])))
    run.judge(H["formula"], [r["measured_over_formula"] for r in rows[INPLACE]], evidence="kernels.csv (kind=reference)",
              detail="; ".join(dict.fromkeys(f"{kernels.COLUMNS['dram_tb_s'].show(r)}, {kernels.COLUMNS['l2_hit_pct'].show(r)}"
                                             for r in rows[INPLACE])))


def tell(x) -> str:
    sub = x.df[x.df["head_dim"] == x.d0]
    tmin, tmax, items = int(sub["tokens"].min()), int(sub["tokens"].max()), []
    for v in VARIANTS:
        d = sub[sub["variant"] == v].sort_values("tokens")
        if not len(d):
            continue
        kids = [(f"{int(r['tokens'])} tokens: {r['kernel'] or '?'} {r['time_us']:.1f} us, {timing.eff_text(r, x.pk)}", [])
                for r in d.to_dict("records") if r["tokens"] in (tmin, tmax)]
        if x.kern is not None:
            kk = x.kern[(x.kern["kind"] == "sweep") & (x.kern["variant"] == v) & (x.kern["tokens"] == tmax)
                        & (x.kern["head_dim"] == x.d0)]
            kids += [kernels.node(r, head=f"{r['kernel']} (ncu): DRAM bytes / formula {r['measured_over_formula']:.2f}")
                     for r in kk.to_dict("records")]
        items.append((f"{v} ({_fi.ROPE_APIS[api(v)][0]}, {int(d.iloc[-1]['requests'])} request(s) at {tmax} tokens)", kids))
    items.append((f"reference ({REF['tokens']} tokens, d {REF['head_dim']}, {REPEATS} repetitions): " + "; ".join(
        f"{v} {g['time_us'].median():.1f} us" for v, g in x.ref.groupby("variant", sort=False)), []))
    return story.tree(f"ROPE — {x.pk['gpu']}, {MODEL} heads (32 q / 8 k), head_dim {x.d0}, bf16; effective bandwidth = "
                      f"formula bytes / time, a % of {timing.dram_ceiling_text(x.pk, 'copy', short=True)} only at "
                      f"working sets >= {ceilings.STREAM_FACTOR}x L2 ({x.pk.get('l2_mb')} MB); DRAM rates from ncu's bytes",
                      items)


@dataclass
class Record:
    """What the analysis of one run reads: the arguments, the sweep's points, the ceilings and the tables the GPU
    phase measured (the same tables a --reanalyse reads back from a recording); torch, fi and child are the GPU
    phase's own."""
    args: argparse.Namespace
    points: list
    pk: dict = None
    df: Any = None                # sweep.csv (with the kernel each call launched)
    ref: Any = None               # reference.csv
    kern: Any = None              # kernels_full.csv (None without --ncu)
    torch: Any = None
    fi: Any = None
    child: list = None

    @property
    def d0(self) -> int:
        """The head_dim the story, the figure and the kernel verdicts read: 128 when swept."""
        dims = sorted({p["head_dim"] for p in self.points})
        return 128 if 128 in dims else dims[0]


def analyse(run, x: Record) -> None:
    """The figure, verdicts and story from the measured tables (a GPU run and --reanalyse alike)."""
    run.figure("bandwidth", plots.effective(x.df[x.df["head_dim"] == x.d0], x.pk, hue="variant", mix="copy",
                                            title=f"RoPE, {MODEL} heads, head_dim {x.d0}, bf16 — {x.pk['gpu']}"))
    # ---- verdicts
    judge(run, x)
    # ---- the story
    run.story(tell(x), echo=True)


def main_reanalyse(args) -> int:
    """No GPU: the recording's tables (sweep, reference, kernels_full with --ncu) through analyse(), with the plan of
    the recording's own arguments."""
    rec = recording.open(args.reanalyse, __file__, tables=("sweep", "reference"), optional=("kernels_full",),
                         copy=("trace.json",))
    a = rec.args_like(args)
    x = Record(args=a, points=plan_points(a), pk=rec.peaks, df=rec.tables["sweep"], ref=rec.tables["reference"],
               kern=rec.tables["kernels_full"])
    with recording.run(__file__, args, rec) as run:
        analyse(run, x)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    torch, fi = _fi.require_stack()
    x = Record(torch=torch, fi=fi, args=args, points=plan_points(args), child=ncu_pass.own_argv(argv), kern=None)
    if args.ncu_target:
        return ncu_target(x)
    with Run(__file__, args, out=args.out) as run:
        # ---- check: the ceiling every % divides by; correctness before timing
        x.pk = ceilings.peaks()
        run.log(f"{x.pk['gpu']}: {ceilings.kinds_text(x.pk)}; L2 {x.pk.get('l2_mb')} MB")
        check_correctness(run, x)
        # ---- measure
        x.df = sweep(run, x)
        x.ref = reference(run, x)
        if args.ncu:
            x.kern = profile_ncu(run, x)
        # ---- analyse: the figure, verdicts, the story
        analyse(run, x)
    return 0


if __name__ == "__main__":
    run_main(main)
