#!/usr/bin/env python3
"""07 · The radix prefix cache, on the CPU: fast_compare_key vs Python, and match/insert/evict at real sizes.

What it measures (CPU time, common.capture.timing.bench_cpu; a GPU is optional: values live where the engine
keeps them, on the GPU when there is one). Every series is measured 3 times (fresh trees each time) and
every verdict is judged on the interval of its 3 per-repetition values (common.judge.verdicts):
    compare  fast_compare_key (radix.cpp, std::mismatch behind a tvm-ffi call) against a Python loop
             and a vectorised torch compare, for keys of 8 to 32,768 tokens that differ at the end.
    match    RadixPrefixCache.match_prefix through a multi-turn conversation of 1..64 turns (path
             depth) and through one node of 256..32,768 tokens (key length), including one node holding
             as many tokens as the deepest path (the same tokens, 1 node vs 64).
    insert   one new turn under the deepest node, for each depth.
    lock     lock_handle + unlock along the path.
    evict    evict(one leaf of 64 tokens, 5 calls) on trees of 64..4096 leaves built from shared-prefix traffic
             (groups of requests sharing a 1024-token system prompt), and the full leaf scan it starts with.
    Full run: the match series again with page size 16 (keys become tuples of the first page).

What the plan expected (hypotheses: H_* below; from analysis.md §4.4 and §6.4)
    * match/insert cost follows the number of nodes on the path, hardly the token count (the compare
      is a tight C++ loop); evict cost follows the size of the whole tree (it scans every leaf).
    * Per call, the FFI crossing dominates short keys and std::mismatch only keys of thousands of
      tokens; fast_compare_key is a small part of a match (the Python walk dominates).
    Each is judged on a ratio of two measurements of the same repetition (a share, a slope, a growth
    exponent), not on one sample against a knife-edge threshold: an earlier single-sample "match x2.1 from
    256 to 32768 tokens (threshold <= 2x)" flipped refuted -> confirmed between two runs of the same code.

Run
    python mini-sglang/scripts/07_profile_radix.py --quick      # ~1 min
    python mini-sglang/scripts/07_profile_radix.py              # full sizes + page size 16
    python mini-sglang/scripts/07_profile_radix.py --values-on cpu   # keep slot values on the CPU
    python mini-sglang/scripts/07_profile_radix.py --depths 1,8,64 --leaves 64,4096
    python mini-sglang/scripts/07_profile_radix.py --reanalyse DIR --out OUT   # no minisgl: the analysis again from DIR
    (CPU work: no ncu variant; py-spy or cProfile show where a match spends its time)
Writes mini-sglang/results/07_profile_radix/: compare.csv, ops.csv, evict.csv, compare.png, match.png,
evict.png, story.txt, summary.json.
"""
from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _msgl  # noqa: E402
from _msgl import REPEATS  # noqa: E402
from common.base import story  # noqa: E402
from common.base.checks import run_main  # noqa: E402
from common.capture.timing import bench_cpu  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.render import plots  # noqa: E402
from common.run import cli, recording  # noqa: E402
from common.run.results import Run  # noqa: E402

# ------------------------------------------------------------------ the sweep, as data
KEYS_FULL, KEYS_QUICK = (8, 64, 256, 512, 4096, 32768), (8, 512, 4096, 32768)
DEPTHS_FULL, DEPTHS_QUICK = (1, 4, 16, 64), (1, 16, 64)
TOKENS_FULL, TOKENS_QUICK = (256, 4096, 32768), (256, 32768)
LEAVES_FULL, LEAVES_QUICK = (64, 512, 4096), (64, 1024)
TURN, SHORT_KEY, MID_KEY = 256, 8, 512
CPP, PY, TORCH = "fast_compare_key (C++)", "python loop on lists", "torch ne + nonzero"

# ------------------------------------------------------------------ the hypotheses, as data
SRC = "analysis.md §4.4 / §6.4 (code reading); mini-sglang/reports/plan.md 07"
H = declare(f"""
    match_depth = radix-match-depth: match cost follows path depth (node by node)
        judged on: (t(deepest path) - t(1 node)) / t(deepest path): the share of a deep match spent beyond its first
            node, {REPEATS} repetitions
        confirmed: [0.5, 1]
        source: {SRC}: 'match/insert cost follows path length'; 'follows' read as: the nodes past the first are most
            (>= half) of a deep match
    insert_depth = radix-insert-depth: insert cost follows path depth (node by node)
        judged on: (t(deepest path) - t(1 node)) / t(deepest path) of inserting one turn under the deepest node,
            {REPEATS} repetitions
        confirmed: [0.5, 1]
        source: {SRC}: 'match/insert cost follows path length'
    tokens = radix-tokens: match cost hardly follows the token count
        judged on: t(match one node of N tokens) / t(match a path of N/256 nodes of 256 tokens), the same N tokens as
            the deepest path, {REPEATS} repetitions
        confirmed: <= 0.5
        source: {SRC}: 'hardly the token count (the compare is a tight C++ loop)'; 'hardly' read as: one node costs at
            most half of the path with the same tokens
    evict = radix-evict-tree: evict cost follows the size of the whole tree (full leaf scan per call)
        judged on: growth exponent of evict(64 tokens) time vs node count, log(t_big / t_small) / log(nodes_big /
            nodes_small), {REPEATS} repetitions
        confirmed: [0.5, 1.5]
        source: {SRC}: 'evict cost follows tree size'; 'follows' read as roughly linear (exponent 0.5-1.5)
    ffi = radix-ffi-short: per call the FFI crossing dominates short keys
        judged on: fast_compare_key time at {MID_KEY} tokens / at {SHORT_KEY} tokens, {REPEATS} repetitions
        confirmed: <= 1.5
        source: {SRC}: 'the FFI crossing dominates short keys'; read as: 64x the tokens costs < 1.5x
    long = radix-mismatch-long: std::mismatch dominates only keys of thousands of tokens
        judged on: fast_compare_key time at the longest key / at {SHORT_KEY} tokens, {REPEATS} repetitions
        confirmed: >= 2
        source: {SRC}: 'std::mismatch only keys of thousands of tokens'; read as: >= 2x by 32k tokens
    share = radix-compare-share: fast_compare_key is a small part of a match (the Python walk dominates)
        judged on: % of a match through the middle depth spent in its compares (depth x t(compare of ~{TURN} tokens) /
            t(match)), {REPEATS} repetitions
        confirmed: <= 30%
        source: {SRC}: 'a small part', read as < 30%
""")


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="fewer sizes, page size 1 only (~1 min)")
    p.add_argument("--values-on", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where slot values live (auto: the GPU when there is one, as in the engine)")
    p.add_argument("--depths", type=cli.positive_ints, default=None, help="path depths (turns of 256 tokens)")
    p.add_argument("--keys", type=cli.positive_ints, default=None, help="key lengths of the compare series")
    p.add_argument("--leaves", type=cli.positive_ints, default=None, help="leaves of the evict trees")
    recording.add_flag(p)
    return p.parse_args(argv)


def plan(args) -> SimpleNamespace:
    """The sizes of this run: 1 and the deepest depth are always there, and one node of the deepest path's tokens."""
    depths = sorted(set(args.depths or (DEPTHS_QUICK if args.quick else DEPTHS_FULL)) | {1})
    keys = sorted(set(args.keys or (KEYS_QUICK if args.quick else KEYS_FULL)) | {SHORT_KEY, MID_KEY})
    tokens = sorted(set(TOKENS_QUICK if args.quick else TOKENS_FULL) | {depths[-1] * TURN})
    return SimpleNamespace(depths=depths, keys=keys, tokens=tokens, pages=(1,) if args.quick else (1, 16),
                           leaves=sorted(set(args.leaves or (LEAVES_QUICK if args.quick else LEAVES_FULL))))


class Trees:
    """Builds RadixPrefixCache trees on one global Context (set once per process)."""

    def __init__(self, torch, device):
        from minisgl.core import Context, set_global_ctx
        from minisgl.kvcache.radix_cache import RadixPrefixCache
        self.torch, self.device, self.cls = torch, device, RadixPrefixCache
        self.ctx = Context(page_size=1)
        set_global_ctx(self.ctx)

    def new(self, page_size=1):
        self.ctx.page_size = page_size
        return self.cls(device=self.device)

    def ids(self, tokens):
        return self.torch.tensor(tokens, dtype=self.torch.int32)

    def slots(self, n):
        return self.torch.arange(n, dtype=self.torch.int32, device=self.device)

    def insert(self, cache, tokens):
        return cache.insert_prefix(self.ids(tokens), self.slots(len(tokens)))


def check(run, torch, K, T):
    """Correct before fast: the compare vs Python, and a 3-turn tree round trip."""
    a = torch.arange(5000, dtype=torch.int32)
    b = a.clone()
    b[4321] = -1
    _msgl.first_call(lambda: K.fast_compare_key(a, b), "radix (host c++)")
    ok = int(K.fast_compare_key(a, b)) == _msgl.first_mismatch(a.tolist(), b.tolist()) == 4321
    conv = _msgl.conversation(3, 100, seed=1)
    c = T.new()
    for p in conv:
        T.insert(c, p)
    h = c.match_prefix(T.ids(conv[-1] + [7])).cuda_handle
    ok = ok and h.cached_len == 300 and torch.equal(h.get_matched_indices().cpu(), torch.arange(300, dtype=torch.int32))
    run.log(f"correctness: compare and a 3-turn tree round trip {'✅' if ok else '❌'}")
    if not ok:
        raise RuntimeError(f"the radix compare or tree is wrong (a 300-token shared path matched {h.cached_len})")
    run.log("All results match. Starting benchmarks.")


def compare_series(torch, K, p, rep) -> list[dict]:
    rows = []
    for n in p.keys:
        x = torch.randint(0, 128000, (n,), dtype=torch.int32)
        y = x.clone()
        y[-1] += 1
        xl, yl = x.tolist(), y.tolist()
        for impl, fn in ((CPP, lambda: K.fast_compare_key(x, y)), (PY, lambda: _msgl.first_mismatch(xl, yl)),
                         (TORCH, lambda: int((x != y).nonzero()[0, 0]))):
            t = bench_cpu(fn, rep_ms=100)
            rows.append({"rep": rep, "impl": impl, "key_tokens": n, "us": t.median_us, "ns_per_token": 1e3 * t.median_us / n,
                         "spread_pct": t.spread_pct})
    return rows


def ops_series(T, p, rep) -> list[dict]:
    """match / lock+unlock / insert along conversations of each depth (per page size); match of one node of n tokens."""
    ops = []
    for ps in p.pages:
        for d in p.depths:
            conv = _msgl.conversation(d, TURN, seed=d + 1000 * rep)
            c = T.new(ps)
            for pr in conv:
                T.insert(c, pr)
            query = T.ids(conv[-1] + [1])
            tm = bench_cpu(lambda: c.match_prefix(query), rep_ms=100)
            h = c.match_prefix(query).cuda_handle
            tl = bench_cpu(lambda: (c.lock_handle(h), c.lock_handle(h, unlock=True)), rep_ms=100)
            news = iter([T.ids(conv[-1] + _msgl.random_tokens(random.Random(i), 64)) for i in range(400)])
            slots = T.slots(d * TURN + 64)
            ti = bench_cpu(lambda: c.insert_prefix(next(news), slots), reps=300, warmup=3)
            for op, t in (("match", tm), ("lock+unlock", tl), ("insert", ti)):
                ops.append({"rep": rep, "op": op, "page_size": ps, "series": "depth", "depth": d, "tokens": d * TURN,
                            "us": t.median_us, "us_per_node": t.median_us / d, "spread_pct": t.spread_pct})
    for n in p.tokens:
        c = T.new(1)
        toks = _msgl.random_tokens(random.Random(n + 7 * rep), n)
        T.insert(c, toks)
        query = T.ids(toks + [1])
        t = bench_cpu(lambda: c.match_prefix(query), rep_ms=100)
        ops.append({"rep": rep, "op": "match", "page_size": 1, "series": "tokens", "depth": 1, "tokens": n,
                    "us": t.median_us, "us_per_node": t.median_us, "spread_pct": t.spread_pct})
    return ops


def evict_series(T, p, rep) -> list[dict]:
    rows = []
    for leaves in p.leaves:
        groups = max(1, leaves // 64)
        reqs = _msgl.shared_prefix_requests(groups, leaves // groups, 1024, 64, seed=leaves + 10 * rep)
        c = T.new()
        for r in reqs:
            T.insert(c, r)
        scan = bench_cpu(lambda: c._collect_leave_nodes_for_evict(), rep_ms=50).median_us
        ev = bench_cpu(lambda: c.evict(64), reps=5, warmup=0).median_us        # 5 evictions of one 64-token leaf
        rows.append({"rep": rep, "leaves": leaves, "nodes": groups * (leaves // groups + 1), "evict_one_leaf_us": ev,
                     "leaf_scan_us": scan, "evictable_tokens": c.size_info.evictable_size})
    return rows


def per_rep(df, fn) -> list[float]:
    """One value per repetition: ``fn(rows of that repetition)``."""
    return [fn(g) for _r, g in df.groupby("rep", sort=True)]


def judge(run, x):
    cm, od, ev, p = x.cmp, x.ops, x.evict, x.p
    dmax, mid = p.depths[-1], p.depths[len(p.depths) // 2]
    t = lambda g, op, d: float(g[(g["op"] == op) & (g["series"] == "depth") & (g["depth"] == d)  # noqa: E731
                                 & (g["page_size"] == 1)]["us"].iloc[0])
    one = lambda g, n: float(g[(g["series"] == "tokens") & (g["tokens"] == n)]["us"].iloc[0])  # noqa: E731
    cpp = lambda g, n: float(g[(g["impl"] == CPP) & (g["key_tokens"] == n)]["us"].iloc[0])  # noqa: E731
    for h, op in ((H["match_depth"], "match"), (H["insert_depth"], "insert")):
        run.judge(h, per_rep(od, lambda g: (t(g, op, dmax) - t(g, op, 1)) / t(g, op, dmax)), evidence="ops.csv",
                  detail=f"{op}: " + ", ".join(f"{t(g, op, 1):.1f} -> {t(g, op, dmax):.1f} us" for _r, g in od.groupby("rep"))
                  + f" from depth 1 to {dmax}")
    run.judge(H["tokens"], per_rep(od, lambda g: one(g, dmax * TURN) / t(g, "match", dmax)), evidence="ops.csv",
              detail=f"{dmax * TURN} tokens: one node {statistics.median(per_rep(od, lambda g: one(g, dmax * TURN))):.1f} us vs "
                     f"{dmax} nodes {statistics.median(per_rep(od, lambda g: t(g, 'match', dmax))):.1f} us (medians)")
    lo, hi = min(p.leaves), max(p.leaves)
    at = lambda g, n, col: float(g[g["leaves"] == n][col].iloc[0])  # noqa: E731
    ex = lambda g, col: math.log(at(g, hi, col) / at(g, lo, col)) / math.log(at(g, hi, "nodes") / at(g, lo, "nodes"))  # noqa: E731
    run.judge(H["evict"], per_rep(ev, lambda g: ex(g, "evict_one_leaf_us")) if hi > lo else [], evidence="evict.csv",
              premise=True if hi > lo else "one tree size only (--leaves)",
              detail=f"leaf scan alone: exponent {statistics.median(per_rep(ev, lambda g: ex(g, 'leaf_scan_us'))):.2f}"
              if hi > lo else "")
    run.judge(H["ffi"], per_rep(cm, lambda g: cpp(g, MID_KEY) / cpp(g, SHORT_KEY)), evidence="compare.csv",
              detail=f"{statistics.median(per_rep(cm, lambda g: cpp(g, SHORT_KEY))):.2f} us at {SHORT_KEY} tokens")
    run.judge(H["long"], per_rep(cm, lambda g: cpp(g, max(p.keys)) / cpp(g, SHORT_KEY)), evidence="compare.csv",
              detail=f"{statistics.median(per_rep(cm, lambda g: cpp(g, max(p.keys)))):.2f} us at {max(p.keys)} tokens")
    near = min(p.keys, key=lambda n: abs(n - TURN))
    run.judge(H["share"], [100 * mid * cpp(gc, near) / t(go, "match", mid) for (_a, gc), (_b, go) in
                        zip(cm.groupby("rep", sort=True), od.groupby("rep", sort=True))], evidence="ops.csv + compare.csv",
              detail=f"depth {mid}: {mid} compares of {near} tokens")


def tell(x) -> str:
    cm = x.cmp.groupby(["impl", "key_tokens"])["us"].median()
    od = x.ops.groupby(["op", "series", "depth", "tokens", "page_size"])["us"].median()
    ev = x.evict.groupby(["leaves", "nodes"])[["evict_one_leaf_us", "leaf_scan_us"]].median().reset_index()
    items = [(f"compare (first mismatch at the end; medians of {REPEATS} repetitions)", [
        (f"{n:>6} tokens: C++ {cm[(CPP, n)]:.2f} us · python {cm[(PY, n)]:.1f} us · torch {cm[(TORCH, n)]:.1f} us", [])
        for n in x.p.keys]),
             (f"match through a conversation ({TURN}-token turns, page 1)", [
                 (f"depth {d:>2}: match {od[('match', 'depth', d, d * TURN, 1)]:.1f} us · insert "
                  f"{od[('insert', 'depth', d, d * TURN, 1)]:.1f} us · lock+unlock "
                  f"{od[('lock+unlock', 'depth', d, d * TURN, 1)]:.1f} us", []) for d in x.p.depths]),
             ("match one node of n tokens", [(f"{n:>6}: {od[('match', 'tokens', 1, n, 1)]:.1f} us", []) for n in x.p.tokens]),
             ("evict(64 tokens) on shared-prefix trees", [
                 (f"{int(r['leaves']):>5} leaves / {int(r['nodes'])} nodes: evict {r['evict_one_leaf_us']:.0f} us, "
                  f"leaf scan {r['leaf_scan_us']:.0f} us", []) for r in ev.to_dict("records")])]
    return story.tree(f"RADIX CACHE ON THE CPU (values on {x.dev})", items)


@dataclass
class Record:
    """What the analysis of one run reads: the plan, where the slot values lived, and the three measured tables (the
    same tables a --reanalyse reads back from a recording)."""
    args: argparse.Namespace
    p: SimpleNamespace
    dev: Any = "cpu"           # torch.device (GPU run) or its name (re-analysis): only printed
    cmp: Any = None            # compare.csv
    ops: Any = None            # ops.csv
    evict: Any = None          # evict.csv


def analyse(run, x: Record) -> None:
    """Figures (medians of the repetitions), verdicts, headline and story from the measured tables (a run and
    --reanalyse alike)."""
    cmed = x.cmp.groupby(["impl", "key_tokens"], as_index=False)["us"].median()
    run.figure("compare", plots.sweep(cmed, x="key_tokens", y="us", hue="impl", logx=True, logy=True,
                                      ylabel="us per call (median)", title="first-mismatch compare, CPU"))
    dep = x.ops[x.ops["series"] == "depth"].groupby(["op", "page_size", "depth"], as_index=False)["us"].median()
    run.figure("match", plots.sweep(dep.assign(s=lambda d: d["op"] + " page=" + d["page_size"].astype(str)),
                                    x="depth", y="us", hue="s", logx=True, ylabel="us per call (median)",
                                    title=f"radix operations vs path depth ({TURN}-token turns)"))
    emed = x.evict.groupby("nodes", as_index=False)["evict_one_leaf_us"].median()
    run.figure("evict", plots.sweep(emed, x="nodes", y="evict_one_leaf_us", logx=True, logy=True,
                                    ylabel="us per evict(64 tokens)", title="evict vs tree size"))
    # ---- verdicts
    judge(run, x)
    run.headline(compare_speedup_vs_python=float(cmed[(cmed["impl"] == PY) & (cmed["key_tokens"] == 4096)]["us"].sum()
                                                 / cmed[(cmed["impl"] == CPP) & (cmed["key_tokens"] == 4096)]["us"].sum())
                 if 4096 in x.p.keys else None,
                 compare_us_8_tokens=float(cmed[(cmed["impl"] == CPP) & (cmed["key_tokens"] == SHORT_KEY)]["us"].iloc[0]),
                 match_us_depth_max=float(dep[(dep["op"] == "match") & (dep["depth"] == x.p.depths[-1])
                                              & (dep["page_size"] == 1)]["us"].iloc[0]),
                 evict_us_max_tree=float(emed["evict_one_leaf_us"].iloc[-1]))
    # ---- the story
    run.story(tell(x), echo=True)


def main_reanalyse(args) -> int:
    rec = recording.open(args.reanalyse, __file__, tables=("compare", "ops", "evict"))
    a = rec.args_like(args)
    # where the values lived: --values-on, or with auto the GPU when the recording's machine had one (as main() chose)
    dev = a.values_on if a.values_on != "auto" else "cuda" if (rec.summary.get("provenance") or {}).get("gpu_count") \
        else "cpu"
    x = Record(args=a, p=plan(a), dev=dev, cmp=rec.tables["compare"], ops=rec.tables["ops"], evict=rec.tables["evict"])
    with recording.run(__file__, args, rec) as run:
        analyse(run, x)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    K = _msgl.require_minisgl("minisgl.kernel")
    _msgl.require_minisgl("minisgl.kvcache.radix_cache")
    import pandas as pd
    import torch
    dev = torch.device("cuda" if (args.values_on == "cuda" or (args.values_on == "auto" and torch.cuda.is_available()))
                       else "cpu")
    x = Record(args=args, p=plan(args), dev=dev)
    with Run(__file__, args, out=args.out) as run:
        # ---- check
        run.log(f"values on {dev}; one global Context (page size switched per tree)")
        T = Trees(torch, dev)
        check(run, torch, K, T)
        # ---- measure: every series REPEATS times, fresh trees each time
        cmp_rows, ops, ev = [], [], []
        for rep in range(REPEATS):
            run.log(f"repetition {rep + 1}/{REPEATS}: compare, match/insert/lock, evict")
            cmp_rows += compare_series(torch, K, x.p, rep)
            ops += ops_series(T, x.p, rep)
            ev += evict_series(T, x.p, rep)
        x.cmp, x.ops, x.evict = pd.DataFrame(cmp_rows), pd.DataFrame(ops), pd.DataFrame(ev)
        run.table("compare", x.cmp)
        run.table("ops", x.ops)
        run.table("evict", x.evict)
        # ---- analyse: the curves, verdicts, headline, story
        analyse(run, x)
    return 0


if __name__ == "__main__":
    run_main(main)
