#!/usr/bin/env python3
"""03 · The store kernel (KV-cache scatter): sequential vs random slots, 1 to 64k tokens, launches per call.

What it measures
    mini-SGLang's store_cache(k_cache, v_cache, slots, k, v), which writes each new token's K and V
    rows into the KV pool at the slots the cache manager handed out, against the plain-torch way
    (index_put_ of K, then of V). Inputs are laid out as the engine passes them: k and v are strided
    views of one fused QKV buffer; K and V caches are the two halves of one pool of 1M slots. KV
    rows of Llama-3.1-8B per rank: 2048 B (TP1), 1024 (TP2), 512 (TP4), 256 B (TP8). Slots are
    sequential (a fresh pool) or random (a pool after churn); the full run adds reversed.
    Per point: median time (common.capture.timing.bench: CUPTI, cold L2), bytes moved (common.tables.flops.store_bytes:
    K+V rows read and written, slot ids read) and the effective bandwidth (those bytes / time); as % of the measured
    DRAM copy ceiling (common.capture.ceilings.peaks) only where the working set is at least 4x the L2 (common.capture.timing.rates).
    The judged points (the largest token count, 2048-B and 256-B rows, sequential and random) are timed 3
    times, interleaved. Calls at 1 and 8192 tokens, 3 each under torch.profiler (common.tables.trace.capture_calls),
    count the kernel launches per call and what each one copies; (--ncu / full run) ncu reads DRAM bytes (as % of
    the ceiling of their kind), L2 hit rate, sectors per request, occupancy with its launch facts and stalls for
    sequential vs random, 3 launches per point, caches flushed before each pass as the timing flushed them.

What the plan expected (hypotheses: H_* below; A100 figures, judged as effective bandwidth in % of the measured DRAM
copy ceiling on 3 repetitions, at 65,536 tokens of 2048-B rows: a 537 MB working set, >= 4x L2)
    * "K copy ... V copy in a separate kernel launch, 2 kernel launches, 2 sync points", "72% per
      copy", fusing both copies would reach ~85%. The code (store.cu:41-49) already copies K and V
      in ONE launch, one warp per token: then "fused would reach 85%" has no unfused kernel to compare
      (a failed premise: inconclusive, whatever the number).
    * Sequential slots 70-75% of peak, random 55-65%. Reading the code: each row is contiguous and
      written by 32 lanes, so the gap should be small for rows >= 512 B and show at 256 B.

Run
    python mini-sglang/scripts/03_profile_store.py --quick              # ~1 min: 2048 and 256-B rows, no ncu
    python mini-sglang/scripts/03_profile_store.py --quick --ncu        # + ncu: sequential vs random
    python mini-sglang/scripts/03_profile_store.py                      # full: 4 row sizes, 3 patterns, ncu
    python mini-sglang/scripts/03_profile_store.py --compare-patterns   # only the pattern sweep (no trace, no ncu)
    python mini-sglang/scripts/03_profile_store.py --reanalyse DIR --out OUT   # no GPU: the analysis again from DIR
    python mini-sglang/scripts/03_profile_store.py --rows 2048,512 --tokens 64,65536
    ./mini-sglang/scripts/ncu_profile.sh --kernel store --set full -- \\
        python mini-sglang/scripts/03_profile_store.py --ncu-target --quick
Writes mini-sglang/results/03_profile_store/: sweep.csv, reference.csv, launches.csv, ncu_kernels.csv (with ncu),
bandwidth.png and patterns.png (effective TB/s against the working set, DRAM ceilings and the L2 size drawn),
trace.json, story.txt, summary.json.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _msgl  # noqa: E402
from _msgl import REPEATS  # noqa: E402
from common.base import story  # noqa: E402
from common.base.checks import run_main  # noqa: E402
from common.capture import ceilings, timing  # noqa: E402
from common.capture.ranges import nvtx_range  # noqa: E402
from common.capture.timing import bench, rates  # noqa: E402
from common.tables import flops, kernels, ncu_pass, trace  # noqa: E402
from common.judge import bounds  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.render import plots  # noqa: E402
from common.run import cli, recording  # noqa: E402
from common.run.results import Run  # noqa: E402

# ------------------------------------------------------------------ the sweep, as data
POOL = 1 << 20                                   # KV slots (4 GiB for 2048-B rows, K and V)
ROWS = {2048: "TP1", 1024: "TP2", 512: "TP4", 256: "TP8"}   # Llama-3.1-8B KV row bytes per rank
TOKENS_FULL = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)
TOKENS_QUICK = (1, 64, 1024, 16384, 65536)
PATTERNS = ("sequential", "random", "reversed")
NCU_TOKENS_FULL, NCU_TOKENS_QUICK = (64, 16384, 65536), (16384,)
TRACE_TOKENS = (1, 8192)
V_MINI, V_TORCH = "minisgl.store_cache", "torch index_put K, V"
KERNELS = "store_kv_cache|index_put|indexing|elementwise|scatter"

# ------------------------------------------------------------------ the hypotheses, as data
PLAN = "PLAN.md session 2 / seed 002 ('Store (seq) 70-75%, Store (rand) 55-65%', A100)"
H = declare(f"""
    launches = store-launches: store makes two kernel launches per call at every row size (K copy, then V copy; 2 sync
            points)
        judged on: exactly two kernel launches per store_cache call, every traced call ({REPEATS} per row size and
            token count {TRACE_TOKENS})
        confirmed: [2, 2]
        source: PLAN.md session 2: 'Store launching separately for K and V (an opportunity for fusion)'
    fused = store-fused-85: the K and V copies reach ~72% of peak each; fused they would reach ~85%
        judged on: effective bandwidth (common.tables.flops bytes / CUPTI time, cold L2) as % of the measured DRAM copy ceiling
            at the largest token count, 2048-B rows, sequential, {REPEATS} repetitions (premises: the store is two
            launches; the working set is >= 4x L2, so the bytes go through DRAM: common.capture.timing.eff_premise)
        confirmed: [80, 90]%
        source: seed 002 / mini-sglang/reports/plan.md 03: '72% per copy; fusing would reach 85%'
    seq = store-seq-bw: sequential slots reach 70-75% of peak
        judged on: effective bandwidth as % of the measured DRAM copy ceiling at the largest token count, 2048-B rows,
            {REPEATS} repetitions (premise: working set >= 4x L2)
        confirmed: [70, 75]%
        source: {PLAN}
    random = store-random-bw: random slots reach only 55-65% of peak
        judged on: effective bandwidth as % of the measured DRAM copy ceiling at the largest token count, 2048-B rows,
            {REPEATS} repetitions (premise: working set >= 4x L2)
        confirmed: [55, 65]%
        source: {PLAN}
    gap_wide = store-gap-wide-rows: random vs sequential slots differ little for rows >= 512 B (code reading)
        judged on: random / sequential time at the largest token count, 2048-B rows, {REPEATS} repetitions
        confirmed: [0.9, 1.1]
        source: mini-sglang/reports/plan.md 03 patterns (restated): 'difference small for rows >= 512 B', read as
            within 10%
    gap_256 = store-gap-256: random vs sequential slots: the difference shows at 256-B rows (TP8 shapes)
        judged on: random / sequential time at the largest token count, 256-B rows, {REPEATS} repetitions
        confirmed: >= 1.1
        source: mini-sglang/reports/plan.md 03 patterns (restated): 'visible for 256-B rows', read as >= 10% slower
    ncu_random = store-ncu-random: random slots cost DRAM efficiency (ncu)
        judged on: ncu time of store_kv_cache, random / sequential slots, first row size at the largest ncu token
            count, {REPEATS} launches each
        confirmed: >= 1.1
        source: {PLAN}: random below sequential; 'cost' read as >= 10%
""")


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="2048 and 256-B rows, 5 token counts, 2 patterns, no ncu (~1 min)")
    p.add_argument("--compare-patterns", action="store_true", help="only the pattern sweep (skip the launch trace and ncu)")
    p.add_argument("--ncu", action="store_true", help="run the ncu pass also with --quick")
    p.add_argument("--rows", type=cli.choices_list(*map(str, ROWS)), default=None,
                   help="KV row bytes (default 2048,256 with --quick, all four otherwise)")
    p.add_argument("--tokens", type=cli.positive_ints, default=None, help="token counts of the sweep")
    p.add_argument("--patterns", type=cli.choices_list(*PATTERNS), default=None,
                   help="slot patterns (default sequential,random with --quick, all three otherwise)")
    p.add_argument("--ncu-target", action="store_true", help=argparse.SUPPRESS)
    recording.add_flag(p)
    return p.parse_args(argv)


def plan(args) -> SimpleNamespace:
    rows = tuple(int(r) for r in args.rows) if args.rows else ((2048, 256) if args.quick else tuple(ROWS))
    toks = tuple(args.tokens or (TOKENS_QUICK if args.quick else TOKENS_FULL))
    nrows = tuple(r for r in (2048, 256) if r in rows) or rows[:1]
    nt = NCU_TOKENS_QUICK if args.quick else NCU_TOKENS_FULL
    return SimpleNamespace(rows=rows, tokens=toks, big=max(toks),
                           patterns=tuple(args.patterns or (PATTERNS[:2] if args.quick else PATTERNS)),
                           ncu=[{"variant": v, "row_bytes": r, "tokens": t, "pattern": p, "rep": i} for r in nrows
                                for t in nt for p in ("sequential", "random") for i in range(REPEATS)
                                for v in (V_MINI, V_TORCH)])


def make_point(torch, K, pools, row, tokens, pattern):
    """name -> (callable, bytes) for one (row size, tokens, slot pattern) point, engine-like inputs; and the tensors."""
    elems = row // 2
    kv = pools[row]
    qkv = torch.randn(tokens, 4 * elems + 2 * elems, device="cuda", dtype=torch.bfloat16)   # GQA 4: q is 4 KV rows wide
    k, v = qkv[:, 4 * elems:5 * elems], qkv[:, 5 * elems:]
    if pattern == "sequential":
        start = int(torch.randint(0, POOL - tokens + 1, (1,)))
        loc = torch.arange(start, start + tokens, device="cuda", dtype=torch.int32)
    elif pattern == "reversed":
        loc = torch.arange(tokens - 1, -1, -1, device="cuda", dtype=torch.int32)
    else:
        loc = torch.randperm(POOL, device="cuda")[:tokens].to(torch.int32)
    loc64 = loc.long()
    kc, vc = kv[0], kv[1]
    return {V_MINI: (lambda: K.store_cache(kc, vc, loc, k, v), flops.store_bytes(tokens, row, 4)),
            V_TORCH: (lambda: (kc.index_put_((loc64,), k), vc.index_put_((loc64,), v)), flops.store_bytes(tokens, row, 8))}, \
        (kc, vc, loc64, k, v)


def ncu_target(args) -> int:
    """Under ncu: every ncu point (REPEATS launches of each variant, row size, token count and pattern)."""
    import torch
    K = _msgl.require_minisgl("minisgl.kernel")
    pts = plan(args).ncu
    pools = {r: torch.zeros(2, POOL, r // 2, device="cuda", dtype=torch.bfloat16) for r in {p["row_bytes"] for p in pts}}
    made = {}

    def make(p):
        key = (p["row_bytes"], p["tokens"], p["pattern"], p["rep"])
        if key not in made:
            made[key] = make_point(torch, K, pools, *key[:3])[0]
        return made[key][p["variant"]][0], None
    return ncu_pass.run_points(torch, pts, make, lambda p: f"{p['variant']} row={p['row_bytes']} tokens={p['tokens']} "
                                                         f"{p['pattern']} #{p['rep']}", warm_up=True)


def copies(kernel: str, row: int, tokens: int) -> str:
    """What one launch copies, by its name (store: both caches; torch: one tensor per launch)."""
    if "store_kv_cache" in kernel:
        return f"K and V rows of all {tokens} tokens: 2 x {tokens} x {row} B"
    if "index" in kernel.lower() or "scatter" in kernel.lower():
        return f"one cache's rows: {tokens} x {row} B"
    return "a helper (contiguous copy / index conversion)"


def make_pools(run, torch, K, x):
    """A 1M-slot pool per row size, each checked: random slots, strided k/v, store vs indexing the caches."""
    x.pools = {}
    for row in x.p.rows:
        try:   # a failed build or OOM for an extra row size is recorded; the first must work
            x.pools[row] = torch.zeros(2, POOL, row // 2, device="cuda", dtype=torch.bfloat16)
            c, (kc, vc, loc, k, v) = make_point(torch, K, x.pools, row, 777, "random")
            _msgl.first_call(c[V_MINI][0], f"store {row}-B rows")
        except Exception as e:
            if row == x.p.rows[0]:
                raise
            run.point_error({"row_bytes": row}, e)
            x.pools.pop(row, None)
            torch.cuda.empty_cache()
            continue
        ok = torch.equal(kc[loc], k) and torch.equal(vc[loc], v)
        run.log(f"correctness {row}-B rows ({ROWS[row]}), random slots, strided k/v: {'✅' if ok else '❌'}")
        if not ok:
            raise RuntimeError(f"store_cache wrote wrong rows ({row}-B rows)")
        x.pools[row].zero_()
    x.p.rows = tuple(r for r in x.p.rows if r in x.pools)
    run.log("All results match. Starting benchmarks.")


def timed(x, var, row, tokens, pattern, fn, b, rep=0) -> dict:
    """One timing: CUPTI kernel time and rates (common.capture.timing.rates: the formula bytes ``b`` of common.tables.flops.store_bytes,
    their read/write split as the kind of traffic, every byte touched once as the working set)."""
    with nvtx_range(f"{var} row={row} tokens={tokens} {pattern}"):
        t = bench(fn)
    r = rates(t.median_ms, bytes=b["total"], peaks=x.pk, mix=ceilings.dram_kind(b["read"], b["write"]),
              working_set=b["total"])
    return {"variant": var, "row_bytes": row, "tp_shape": ROWS[row], "tokens": tokens, "pattern": pattern, "rep": rep,
            "time_us": t.median_us, "spread_pct": t.spread_pct, **timing.rate_row(r)}


def sweep(run, torch, K, x):
    """Every point once (torch index_put not on reversed slots); the judged points REPEATS times, interleaved."""
    import pandas as pd
    res, pts = [], [(r, t, p) for r in x.p.rows for t in x.p.tokens for p in x.p.patterns]
    for i, (row, tokens, pattern) in enumerate(pts, 1):
        if i % 8 == 1:
            run.log(f"[{i}/{len(pts)}] row={row} B tokens={tokens} {pattern}")
        try:
            calls, _ = make_point(torch, K, x.pools, row, tokens, pattern)
            for var, (fn, b) in calls.items():
                if not (pattern == "reversed" and var == V_TORCH):
                    res.append(timed(x, var, row, tokens, pattern, fn, b))
        except Exception as e:   # OOM or a failed build: record it and go on
            run.point_error({"row_bytes": row, "tokens": tokens, "pattern": pattern}, e)
            torch.cuda.empty_cache()
    ref_pts = [(r, p) for r in dict.fromkeys((x.p.rows[0], 256)) if r in x.p.rows for p in ("sequential", "random")]
    ref = [timed(x, V_MINI, row, x.p.big, pat, *make_point(torch, K, x.pools, row, x.p.big, pat)[0][V_MINI], rep=i)
           for i in range(REPEATS) for row, pat in ref_pts]
    return pd.DataFrame(res), pd.DataFrame(ref)


def trace_launches(run, torch, K, x):
    """Calls at 1 and 8192 tokens (random slots), REPEATS each, under torch.profiler: one row per launch."""
    calls, meta = [], {}
    for row in x.p.rows:
        for tokens in TRACE_TOKENS:
            c, keep = make_point(torch, K, x.pools, row, tokens, "random")
            for name, (fn, _b) in c.items():
                label = f"call: {name} row={row} tokens={tokens}"
                calls.append((label, fn))
                meta[label] = (row, tokens, keep)
    path = trace.capture_calls(torch, calls, run.path("trace.json"), reps=REPEATS)
    j = trace.kernels_in_ranges(trace.read_chrome_trace(path), r"^call: ", empty_rows=False)
    j["row_bytes"] = [meta[lb][0] for lb in j["label"]]
    j["tokens"] = [meta[lb][1] for lb in j["label"]]
    j["copies"] = [copies(k or "", r, t) for k, r, t in zip(j["kernel"], j["row_bytes"], j["tokens"])]
    return j


def profile_ncu(run, x):
    run.log(f"ncu: {len(x.p.ncu)} launches (DRAM bytes, L2 hit, sectors/request, stalls)")
    kern, raw = ncu_pass.profile_points(run, __file__, ncu_pass.argv_of(x.args, ("quick", "rows")), KERNELS, x.p.ncu,
                                        x.pk, metrics=list(kernels.SUMMARY_METRICS) + _msgl.COALESCING_METRICS)
    kern["st_sectors_per_request"] = [_msgl.ncu_coalescing(r)["st_sectors_per_request"] for r in raw.to_dict("records")]
    run.table("ncu_kernels", kern)
    return kern


def launches_per_call(j, variant: str) -> tuple[list[int], str]:
    """Kernel launches of every traced call of ``variant`` (a kernels_in_ranges table), and their names."""
    k = j[(j["gpu_kind"] == "kernel") & j["label"].str.contains(variant, regex=False)]
    return [len(g) for _key, g in k.groupby(["label", "call"])], ", ".join(dict.fromkeys(k["kernel"]))


def judge(run, x):
    ref, big, row0 = x.ref, x.p.big, x.p.rows[0]
    at = lambda row, pat: ref[(ref["row_bytes"] == row) & (ref["pattern"] == pat)].sort_values("rep").to_dict("records")  # noqa: E731
    copy = timing.dram_ceiling_text(x.pk, "copy")
    ok = {pat: _msgl.eff_premise(at(row0, pat), copy) for pat in ("sequential", "random")}
    launches = None
    if x.launches is not None:
        launches, names = launches_per_call(x.launches, V_MINI)
        _msgl.fact(run, H["launches"], [n == 2 for n in launches], "launches.csv",
                   detail=f"{sorted(set(launches))} launch(es) per call: {names}, copying K and V rows together; torch "
                          f"index_put of K and V: {sorted(set(launches_per_call(x.launches, V_TORCH)[0]))} per call")
    premise = ("launches not traced (--compare-patterns)" if launches is None else
               True if launches and all(n == 2 for n in launches) else
               f"store_cache already copies K and V in one launch ({sorted(set(launches))} per call, launches.csv): "
               "there is no unfused store to compare")
    detail = lambda pat: (f"{big} tokens, {row0}-B rows: median "  # noqa: E731
                          f"{timing.eff_text(timing.median_row(at(row0, pat)), x.pk)}; % of {copy}")
    pct = lambda pat: [r["eff_pct"] for r in at(row0, pat)]  # noqa: E731
    run.judge(H["fused"], pct("sequential"), evidence="reference.csv", premise=premise if ok["sequential"] is True
              else ok["sequential"], detail=detail("sequential"))
    run.judge(H["seq"], pct("sequential"), evidence="reference.csv", premise=ok["sequential"], detail=detail("sequential"))
    run.judge(H["random"], pct("random"), evidence="reference.csv", premise=ok["random"], detail=detail("random"))
    ratio = lambda row: [r / s for r, s in zip(*(ref[(ref["row_bytes"] == row) & (ref["pattern"] == p)]  # noqa: E731
                                                  .sort_values("rep")["time_us"] for p in ("random", "sequential")))]
    run.judge(H["gap_wide"], ratio(row0), evidence="reference.csv", premise=True if row0 >= 512 else
              f"the first row size is {row0} B (< 512)")
    run.judge(H["gap_256"], ratio(256), evidence="reference.csv", premise=True if 256 in x.p.rows else
              "no 256-B rows in this run (--rows)")
    if x.kern is not None:
        km = x.kern[(x.kern["variant"] == V_MINI) & x.kern["kernel"].str.contains("store_kv_cache")]
        vals, lines = {}, []
        for (row, tok), g in km.groupby(["row_bytes", "tokens"]):
            s_, r_ = (g[g["pattern"] == p].sort_values("rep") for p in ("sequential", "random"))
            vals[(row, tok)] = [a / b for a, b in zip(r_["ncu_time_us"], s_["ncu_time_us"])]
            lines.append(f"{row} B x {tok}: DRAM (ncu bytes) {s_['dram_pct'].median():.0f}% vs {r_['dram_pct'].median():.0f}% "
                         f"of the {s_['dram_kind'].iloc[0] if len(s_) else '?'} ceiling, L2 hit "
                         f"{s_['l2_hit_pct'].median():.0f}% vs {r_['l2_hit_pct'].median():.0f}%, "
                         f"{s_['st_sectors_per_request'].median():.1f} vs {r_['st_sectors_per_request'].median():.1f} "
                         "sectors/store (sequential vs random)")
        key = max(vals, key=lambda k: (k[0] == row0, k[1]), default=None)     # the first row size, most tokens
        run.judge(H["ncu_random"], vals.get(key, []), evidence="ncu_kernels.csv",
                  detail=(f"judged at {key[0]} B x {key[1]} tokens; " if key else "") + "; ".join(lines))


def tell(x) -> str:
    row0 = x.p.rows[0]
    d = x.df[(x.df["variant"] == V_MINI) & (x.df["row_bytes"] == row0)]
    g = _msgl.store_launch(8192, row0)
    items = [(f"Operation: scatter K and V of new tokens into the KV pool ({row0}-B rows = Llama-3.1-8B "
              f"{ROWS[row0]}; k, v strided views of QKV)", [])]
    if x.launches is not None:
        first = x.launches[(x.launches["call"] == 0) & (x.launches["tokens"] == 8192)]
        items.append(("Execution (torch.profiler, call #0 of each)", [
            (lb[6:], [(f"#{int(r['order'])} {r['kernel']} grid {story.fmt(r['grid'])} block {story.fmt(r['block'])} {r['dur_us']:.1f} us: "
                       f"{r['copies']}", []) for r in gg.to_dict("records")]) for lb, gg in first.groupby("label", sort=False)]))
    items.append((f"Per warp: one token's K row then V row, {g['steps_per_row']} x 512-B steps each "
                  f"({g['lane_bytes']}-B lanes); {g['grid']} blocks of 128 threads at 8192 tokens", []))
    for pattern in x.p.patterns:
        s = d[d["pattern"] == pattern].sort_values("tokens")
        items.append((pattern, [(f"{int(r['tokens'])} tokens: {r['time_us']:.1f} us, {timing.eff_text(r, x.pk)}", [])
                                for r in s.to_dict("records")]))
    if x.kern is not None:
        items.append(("Hardware (ncu)", [kernels.node(r, head=f"{r['pattern']} row={r['row_bytes']} tok={r['tokens']}: "
                                                          f"{r['kernel']} (ncu) [{bounds.bound_why(r)}]")
                                         for r in x.kern[(x.kern["variant"] == V_MINI) & (x.kern["rep"] == 0)]
                                         .to_dict("records")][:6]))
    return story.tree(f"STORE KERNEL — {x.pk['gpu']}; effective bandwidth = formula bytes / time, a % of {x.ceiling} only "
                      f"at working sets >= {ceilings.STREAM_FACTOR}x L2 ({x.pk.get('l2_mb')} MB); DRAM rates from ncu's "
                      "bytes", items)


@dataclass
class Record:
    """What the analysis of one run reads: the plan, the ceilings, and the tables the GPU phase measured (the
    same tables a --reanalyse reads back from a recording)."""
    args: argparse.Namespace
    p: SimpleNamespace
    pk: dict
    df: Any = None                # sweep.csv
    ref: Any = None               # reference.csv
    launches: Any = None          # launches.csv (None with --compare-patterns)
    kern: Any = None              # ncu_kernels.csv (None without the ncu pass)
    pools: dict = field(default_factory=dict)

    @property
    def ceiling(self) -> str:
        return timing.dram_ceiling_text(self.pk, "copy", short=True)


def analyse(run, x: Record) -> None:
    """Figures, verdicts, headline and story from the measured tables (a GPU run and --reanalyse alike)."""
    row0 = x.p.rows[0]
    run.figure("bandwidth", plots.effective(x.df[x.df["row_bytes"] == row0].assign(
        series=lambda d: d["variant"] + " / " + d["pattern"]), x.pk, hue="series", mix="copy",
        title=f"KV store, {row0}-B rows (Llama-3.1-8B {ROWS[row0]}) — {x.pk['gpu']}"))
    dm = x.df[(x.df["variant"] == V_MINI) & (x.df["tokens"] == x.p.big)]
    run.figure("patterns", plots.effective(dm, x.pk, hue="pattern", mix="copy",
                                           title=f"store_cache at {x.p.big} tokens, 256 to 2048-B KV rows (left to "
                                                 f"right) — {x.pk['gpu']}"))
    judge(run, x)
    r0 = x.ref[x.ref["row_bytes"] == row0]
    tor = x.df[(x.df["variant"] == V_TORCH) & (x.df["row_bytes"] == row0) & (x.df["tokens"] == x.p.big)
               & (x.df["pattern"] == "random")]
    run.headline(store_eff_pct_of_copy_ceiling_seq=float(r0[r0["pattern"] == "sequential"]["eff_pct"].median()),
                 store_eff_pct_of_copy_ceiling_random=float(r0[r0["pattern"] == "random"]["eff_pct"].median()),
                 store_eff_tb_s_seq=float(r0[r0["pattern"] == "sequential"]["eff_tb_s"].median()),
                 speedup_vs_index_put=float(tor["time_us"].max() / r0[r0["pattern"] == "random"]["time_us"].median())
                 if len(tor) else None)
    run.story(tell(x), echo=True)


def main_reanalyse(args) -> int:
    rec = recording.open(args.reanalyse, __file__, tables=("sweep", "reference"),
                         optional=("launches", "ncu_kernels"), copy=("trace.json",))
    a = rec.args_like(args)
    x = Record(args=a, p=plan(a), pk=rec.peaks, df=rec.tables["sweep"], ref=rec.tables["reference"],
               launches=rec.tables["launches"], kern=rec.tables["ncu_kernels"])
    with recording.run(__file__, args, rec) as run:
        analyse(run, x)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    K, torch = _msgl.require_gpu_stack("minisgl.kernel")
    if args.ncu_target:
        return ncu_target(args)
    with Run(__file__, args, out=args.out) as run:
        # ---- check: the ceiling every % divides by, correctness before timing
        x = Record(args=args, p=plan(args), pk=ceilings.peaks())
        run.log(f"{x.pk['gpu']}: {ceilings.kinds_text(x.pk)}; L2 {x.pk.get('l2_mb')} MiB; pool {POOL:,} slots per cache")
        make_pools(run, torch, K, x)
        # ---- measure
        x.df, x.ref = sweep(run, torch, K, x)
        run.table("sweep", x.df)
        run.table("reference", x.ref)
        if not args.compare_patterns:
            run.log(f"trace: calls at {TRACE_TOKENS} tokens, {REPEATS} each (kernel launches per call)")
            x.launches = trace_launches(run, torch, K, x)
            run.table("launches", x.launches)
            if not args.quick or args.ncu:
                x.kern = run.optional("ncu pass", profile_ncu, run, x)
        # ---- analyse: curves, verdicts, story
        analyse(run, x)
    return 0


if __name__ == "__main__":
    run_main(main)
