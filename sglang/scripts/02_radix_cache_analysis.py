#!/usr/bin/env python3
"""02 · RadixAttention: cold vs warm prefixes, eviction under memory pressure, LPM vs FCFS.

What it measures (SGLang HTTP servers with a deliberately small KV pool, --max-total-tokens, CUDA graphs
for prefill and decode -- --quick caps the KV pool, the story's first line says so --:
every time below is taken under that configuration). A, B and C's FCFS pass run on one server with
SGLang's default scheduling policy (fcfs; in a --quick pipeline the pipeline's shared server, whose flags
are exactly these); C's LPM pass needs a server of its own, --schedule-policy lpm being a launch flag (in
a --quick pipeline the pipeline's 'lpm' server, launched when the pipeline began, its imports overlapped).
    A. cold vs warm: for each prefix length and branching factor, 3 times: after /flush_cache, one cold
       request (prefix + suffix 0), then k requests sharing the prefix, then an exact repeat, one at a
       time, each generating 1 token (so its latency is its prefill). Per request: prompt and cached
       tokens (meta_info), server e2e latency (~TTFT); prefill time saved; the hit rate measured three
       ways that must agree: meta_info (sum cached / sum prompt), the scheduler log (#cached-token /
       (#cached + #new)), and /metrics counter deltas. A half-shared 512-token case mirrors the plan's
       A100 experiment. Apart from the timed requests, three cold/warm pairs are traced in one profiler
       window to see which attention kernels each prefill runs.
    B. eviction: G prefix groups (2048 tokens each) sent once (pass 1), then again in reverse order
       (pass 2) with new suffixes; the working set (G x request size) is swept across the pool size,
       3 times. LRU keeps the most recently used groups: pass 2 hits exactly those and misses the
       oldest. Records pass-2 hit rate, evicted tokens (/metrics), and which groups went. Where the
       working set is >= 1.2x the pool, the cache over time too: a round-robin, pass 2 in pass 1's order
       (LRU's worst case: each prefix is evicted just before its turn comes back), then the most recent
       group once more (a hit), 3 times; per request its cached tokens from meta_info and from the
       scheduler log (they must agree) and its outcome: miss, evicted, hit.
    C. cache-aware scheduling: the same shuffled shared-prefix workload (groups x requests, all sent at
       once, <= 128 so LPM stays active), 3 times, on a server with --schedule-policy lpm and one with
       fcfs (0.5.17's default, so no flag): hit rate, prefill tokens computed, throughput, TTFT; both
       servers have the same pool, so the policy is the only difference.

What the plan expected (hypotheses in H below, each with its range and source; judged on the interval
of the repetitions, common.judge.verdicts)
    * Warm prefill ~1/3 of cold when about half of a 512-token prompt is shared (A100: 38 -> 12 ms);
      restated: prefill time falls roughly with the uncached fraction.
    * A warm request reports cached_tokens = the shared token count; an exact repeat prompt - 1.
    * Cold prefill: ragged attention only; warm: ragged + paged + merge-state (FlashInfer).
    * Under memory pressure an eviction pattern appears; LRU evicts the oldest unlocked leaves, so a
      round-robin over more prefixes than fit evicts each before its reuse.
    * LPM beats FCFS on hit rate and TTFT (while < 128 requests wait).
    * The three hit-rate measurements agree.

Run
    python sglang/scripts/02_radix_cache_analysis.py --quick     # 2 servers (the pipeline's in a --quick pipeline), ~3.5 min warm
    python sglang/scripts/02_radix_cache_analysis.py             # + more prefix lengths, a 2nd pool size
    python sglang/scripts/02_radix_cache_analysis.py --quick --pool-tokens 32768,16384
    python sglang/scripts/02_radix_cache_analysis.py --reanalyse DIR --out OUT   # no GPU, no sglang: the analysis again
    (attention kernels under the counters: 05_ncu_attention.py; the serving timeline: 04_nsys_profile.py)
Writes sglang/results/02_radix_cache_analysis/: cold_warm.csv, hit_rate_3ways.csv, kernel_switch.csv,
eviction.csv, eviction_groups.csv (both with the pass-2 order), round_robin.csv (each request of the round-robins),
policy.csv, hit_rate.png, round_robin.png, server_*.log, profiles/, story.txt, summary.json.
"""
from __future__ import annotations

import dataclasses
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sglang as sg  # noqa: E402
from common.base import story  # noqa: E402
from common.base.checks import run_main  # noqa: E402
from common.tables import trace  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.run import cli, recording  # noqa: E402
from common.run.results import Run  # noqa: E402

QUICK = dict(reps=3, prefix_lens=(1024, 4096), branches=(4,), pools=(sg.QUICK_POOL_TOKENS,), group_len=2048,
             ws_tokens=(16384, 24576, 49152), groups=8, per_group=8, sys_len=2048, q_len=128, out_len=32)
FULL = dict(reps=3, prefix_lens=(256, 1024, 4096, 8192), branches=(1, 4, 16), pools=(32768, 16384), group_len=2048,
            ws_tokens=(8192, 16384, 24576, 32768, 49152, 65536), groups=16, per_group=8, sys_len=2048, q_len=128,
            out_len=64)
SUFFIX = 32
CYCLIC_MIN = 1.2     # working sets this many times the pool or more get the round-robin (pass 2 in pass 1's order)
ONE = {"max_new_tokens": 1, **sg.GREEDY}
HALF = "half-shared 512"
PLAN = "PLAN.md Session 1 and sglang/reports/plan.md, experiment 02"
H = declare(f"""
    warm_exact = warm-cached-exact: a warm request reports cached_tokens equal to the shared token count
        judged on: fraction of warm requests with cached_tokens == prefix length (per repetition, all cases)
        confirmed: [1, 1]
        source: {PLAN}: 'cached_tokens equals the shared token count'
    repeat_exact = repeat-cached-exact: an exact repeat reports cached_tokens = prompt_tokens - 1 (one token is
            recomputed for the logits)
        judged on: fraction of repeats with cached_tokens == prompt_tokens - 1 (per repetition, all cases)
        confirmed: [1, 1]
        source: {PLAN}: 'exact repeat: cached_tokens = prompt_tokens - 1'
    half = half-shared-warm-over-cold: with half of a 512-token prompt cached, the warm prefill takes ~1/3 of the cold
            one (A100: 38 -> 12 ms)
        judged on: warm / cold server e2e latency with 1 new token (per repetition)
        confirmed: <= 0.45
        source: {PLAN}: '~0.3x of cold when about half of 512 tokens were shared' (A100), confirmed up to 0.45
    uncached = prefill-follows-uncached-fraction: prefill time falls roughly with the uncached fraction (restated
            plan)
        judged on: warm / cold server e2e latency at the longest prefix (per repetition)
        source: {PLAN} (restated): bound = 3 x the uncached token fraction + 0.1 (a fixed per-request cost)
    switch = attention-kernel-switch: a cold prefill runs the ragged attention kernel only; a warm one adds the paged
            kernel (new tokens x cached prefix) and merge-state (FlashInfer)
        judged on: fraction of traced cold/warm pairs that switch that way (per pair)
        confirmed: [1, 1]
        source: {PLAN}: 'kernels switch to ragged + paged + merge-state'; premise: the flashinfer backend
    agree = hit-rate-3-ways: the three hit-rate measurements (meta_info, log lines, /metrics counters) agree
        judged on: largest difference between the three over the cases (per repetition)
        confirmed: [0, 0.01]
        source: sglang/reports/plan.md success criteria: 'the three cache-hit measurements agree'
    pressure = eviction-hit-rate-falls: under memory pressure the hit rate falls
        judged on: pass-2 hit rate with the working set >= 1.2x the pool, the highest of those sets (per repetition)
        confirmed: <= 0.8
        source: {PLAN}: 'under pressure evicted tokens grow'; premise: >= 0.9 while the working set fits in 90%
    lru = eviction-lru-order: LRU evicts the oldest prefixes first
        judged on: fraction of partly kept sweeps whose kept groups are exactly the newest ones (per repetition)
        confirmed: [1, 1]
        source: {PLAN}: 'oldest unlocked leaves go first (LRU)'
    thrash = lru-thrash: a round-robin over more prefixes than fit evicts each before its reuse
        judged on: hit fraction (cached / prefix tokens) of second-pass requests
        confirmed: [0, 0.1]
        source: RadixCache with LRU eviction (sglang radix_cache.py); PLAN.md Experiment 2
    lpm_hit = lpm-beats-fcfs-hit-rate: LPM beats FCFS on hit rate for a shuffled shared-prefix burst (< 128 waiting)
        judged on: LPM hit rate - FCFS hit rate (per repetition pair)
        confirmed: >= 0.02
        source: {PLAN}: 'LPM beats FCFS on hit rate ... while fewer than 128 requests wait'
    lpm_ttft = lpm-beats-fcfs-ttft: LPM beats FCFS on TTFT for a shuffled shared-prefix burst (< 128 waiting)
        judged on: FCFS TTFT p50 / LPM TTFT p50 (per repetition pair)
        confirmed: >= 1
        source: {PLAN}: 'LPM beats FCFS on ... mean TTFT only while fewer than 128 requests wait'
""")


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="fewer prefix lengths, one pool size (~3 min)")
    p.add_argument("--pool-tokens", type=cli.positive_ints, default=None,
                   help="KV pool sizes (--max-total-tokens), e.g. '32768,16384'")
    sg.add_model_args(p)
    recording.add_flag(p)
    return p.parse_args(argv)


# ------------------------------------------------------------------ measure

def hit3(meta_rows, log_rows, before, after) -> dict:
    """The hit rate three ways: per-request meta_info, scheduler log lines, /metrics counters."""
    pre = [r for r in log_rows if r["kind"] == "prefill" and not sg.is_probe(r)]
    hm = sg.hit_rate(before, after)
    c, p = sum(m["cached_tokens"] for m in meta_rows), sum(m["prompt_tokens"] for m in meta_rows)
    lc, ln = sum(r["cached_token"] for r in pre), sum(r["new_token"] for r in pre)
    return {"meta_info": c / p if p else float("nan"), "log": lc / (lc + ln) if lc + ln else float("nan"),
            "metrics_requests": hm["hit_rate_requests"], "metrics_scheduler": hm["hit_rate_scheduler"],
            "evicted_tokens": hm["evicted_tokens"], "prefill_compute_tokens": hm["prefill_compute_tokens"]}


def send(srv, ids, sp=ONE) -> dict:
    out = srv.generate(input_ids=ids, sampling_params=sp)
    m = out["meta_info"]
    return {"prompt_tokens": m["prompt_tokens"], "cached_tokens": m["cached_tokens"],
            "e2e_ms": 1e3 * m.get("e2e_latency", out["client"]["e2e_s"]), "client_ms": 1e3 * out["client"]["e2e_s"]}


def cold_warm(srv, P, run) -> tuple[list, list]:
    """Each case P["reps"] times: cold, k warm, one exact repeat; the hit rate three ways."""
    rows, agree = [], []
    cases = [(L, k, SUFFIX) for L in P["prefix_lens"] for k in P["branches"]] + [(256, 1, 256)]  # last: half shared
    for L, k, sfx in cases:
        case = HALF if sfx == 256 else f"prefix {L} x{k}"
        for rep in range(P["reps"]):
            try:
                srv.flush_cache()
                m0, mark = srv.metrics(), srv.log_mark()
                prefix = sg.random_ids(L, seed=L * 100 + k + 7 * rep)
                got = [{"kind": "cold", **send(srv, prefix + sg.random_ids(sfx, 1))}]
                got += [{"kind": "warm", **send(srv, prefix + sg.random_ids(sfx, 2 + i))} for i in range(k)]
                got += [{"kind": "repeat", **send(srv, prefix + sg.random_ids(sfx, 1))}]
                rows += [{"case": case, "rep": rep, "prefix_len": L, "branches": k, "suffix_len": sfx, **g} for g in got]
                h = hit3(got, sg.parse_batch_log(srv.log_since(mark)), m0, srv.metrics())
                agree.append({"case": case, "rep": rep, **h})
                run.log(f"{case} rep {rep}: cold {got[0]['e2e_ms']:.1f} ms, warm "
                        f"{statistics.median(g['e2e_ms'] for g in got if g['kind'] == 'warm'):.1f} ms (cached "
                        f"{got[1]['cached_tokens']}), hit rate meta {h['meta_info']:.3f} / log {h['log']:.3f} / "
                        f"metrics {h['metrics_requests']:.3f}")
            except Exception as e:  # noqa: BLE001 - a case fails, the others go on
                run.point_error({"part": "cold_warm", "case": case, "rep": rep}, e)
    return rows, agree


def kernel_switch(srv, prof_dir: Path, P, run) -> list[dict]:
    """Untimed: P["reps"] cold/warm pairs in one profiler window; the attention kernels of each prefill."""
    sent = []

    def pairs():
        for rep in range(P["reps"]):
            srv.flush_cache()
            prefix = sg.random_ids(2048, seed=4242 + rep)
            sent.extend([("cold", rep, send(srv, prefix + sg.random_ids(SUFFIX, 1))),
                         ("warm", rep, send(srv, prefix + sg.random_ids(SUFFIX, 2)))])
    (tr, *_), _ = srv.traced(prof_dir, pairs)
    kt, steps = sg.steps(trace.read_chrome_trace(tr))
    idx = [i for i, s in enumerate(steps) if s["mode"] == "EXTEND"]
    if len(idx) != len(sent):
        raise RuntimeError(f"traced {len(idx)} prefill steps for {len(sent)} requests")
    out = []
    for (kind, rep, r), i in zip(sent, idx):
        att = sorted(set(kt[(kt["step"] == i) & (kt["cls"] == "attention")]["kernel"]))
        out.append({"kind": kind, "rep": rep, "cached_tokens": r["cached_tokens"], "attention_kernels": ";".join(att)})
        run.log(f"{kind} prefill rep {rep} (cached {r['cached_tokens']}): attention kernels {att}")
    return out


def eviction(srv, pool: int, P, run) -> dict:
    """Each working set P["reps"] times: pass 1 oldest first, pass 2 newest first; what pass 2 hits. From CYCLIC_MIN x
    the pool up, the round-robin too (round_robin). Returns {"ev": summary rows, "evg": group rows, "rr": the
    round-robins' requests, "agree": their hit rate three ways (a case of hit_rate_3ways.csv each)}."""
    per_req = P["group_len"] + SUFFIX + 1
    out = {"ev": [], "evg": [], "rr": [], "agree": []}
    for ws in P["ws_tokens"]:
        G = max(2, ws // per_req)
        for rep in range(P["reps"]):
            try:
                srv.flush_cache()
                m0 = srv.metrics()
                prefixes = [sg.random_ids(P["group_len"], seed=10_000 + ws + g + 997 * rep) for g in range(G)]
                for g in range(G):                       # pass 1: oldest first
                    send(srv, prefixes[g] + sg.random_ids(SUFFIX, 20_000 + g))
                hits = {g: send(srv, prefixes[g] + sg.random_ids(SUFFIX, 30_000 + g))["cached_tokens"]
                        for g in reversed(range(G))}     # pass 2: most recent first
                hm = sg.hit_rate(m0, srv.metrics())
                _sweep_rows(out, pool, rep, G, per_req, hits, hm, "reverse", P)
                run.log(f"pool {pool}, working set {G * per_req} ({G} groups) rep {rep}: pass-2 hit rate "
                        f"{out['ev'][-1]['pass2_hit_rate']:.2f}, kept {out['ev'][-1]['groups_kept']} groups, evicted "
                        f"{hm['evicted_tokens']:.0f} tokens")
                if G * per_req >= CYCLIC_MIN * pool:
                    round_robin(srv, pool, G, P, rep, run, out)
            except Exception as e:  # noqa: BLE001
                run.point_error({"part": "eviction", "pool": pool, "ws_tokens": ws, "rep": rep}, e)
    return out


def _sweep_rows(out, pool, rep, G, per_req, hits, hm, order, P) -> None:
    """One sweep's row of eviction.csv and its groups' rows of eviction_groups.csv (``hits``: pass-2 cached tokens
    by group; ``order``: pass 2's, reverse or cyclic)."""
    kept = [g for g in range(G) if hits[g] >= P["group_len"]]
    hr = sum(hits.values()) / (G * (P["group_len"] + SUFFIX))
    out["ev"].append({"pool_tokens": pool, "rep": rep, "ws_tokens": G * per_req, "ws_over_pool": G * per_req / pool,
                      "groups": G, "order": order, "pass2_hit_rate": hr, "groups_kept": len(kept),
                      "lru_order": kept == list(range(G - len(kept), G)), "evicted_tokens": hm["evicted_tokens"]})
    out["evg"] += [{"pool_tokens": pool, "rep": rep, "ws_tokens": G * per_req, "order": order, "group": g,
                    "pass2_cached": hits[g], "kept": hits[g] >= P["group_len"]} for g in range(G)]


def round_robin(srv, pool: int, G: int, P, rep: int, run, out) -> None:
    """The cache over time: G prefixes (more than the pool holds) in pass 1's order twice, then the most recent one
    again, one request at a time; each request's cached tokens from meta_info and from its scheduler log lines, its
    outcome (miss: first use, evicted: used before but gone, hit), and the run's hit rate three ways."""
    srv.flush_cache()
    per_req = P["group_len"] + SUFFIX + 1
    prefixes = [sg.random_ids(P["group_len"], seed=60_000 + G + g + 997 * rep) for g in range(G)]
    order = [(p, g) for p in (0, 1) for g in range(G)] + [(2, G - 1)]
    m0, mark0 = srv.metrics(), srv.log_mark()
    got, rows = [], []
    for n, (pas, g) in enumerate(order):
        mark = srv.log_mark()
        r = send(srv, prefixes[g] + sg.random_ids(SUFFIX, 70_000 + 100 * n))
        log_cached = sum(x["cached_token"] for x in sg.parse_batch_log(srv.log_since(mark)) if x["kind"] == "prefill")
        seen = any(gg == g for _p, gg in order[:n])
        got.append(r)
        rows.append({"pool_tokens": pool, "ws_tokens": G * per_req, "rep": rep, "request": n, "pass": pas, "group": g,
                     "prefix_len": P["group_len"], "prompt": r["prompt_tokens"], "api_cached": r["cached_tokens"],
                     "log_cached": log_cached, "agree": r["cached_tokens"] == log_cached,
                     "hit_fraction": r["cached_tokens"] / P["group_len"], "prefix_inserted_before": seen,
                     "outcome": "hit" if r["cached_tokens"] >= P["group_len"] * 0.9 else ("evicted" if seen else "miss")})
    m1 = srv.metrics()
    out["rr"] += rows
    out["agree"].append({"case": f"round-robin {G} x {P['group_len']}, pool {pool}", "rep": rep,
                         **hit3(got, sg.parse_batch_log(srv.log_since(mark0)), m0, m1)})
    _sweep_rows(out, pool, rep, G, per_req, {x["group"]: x["api_cached"] for x in rows if x["pass"] == 1},
                sg.hit_rate(m0, m1), "cyclic", P)
    run.log(f"round-robin pool {pool}, {G} groups rep {rep}: " + " ".join(f"{x['group']}{x['outcome'][0]}" for x in rows))


def policy_run(srv, P, policy: str, rep: int, run) -> dict:
    """The shuffled shared-prefix burst once (the same workload in every repetition)."""
    sysp = [sg.random_ids(P["sys_len"], seed=40_000 + g) for g in range(P["groups"])]
    reqs = [{"input_ids": sysp[g] + sg.random_ids(P["q_len"], 50_000 + g * 100 + i),
             "sampling_params": {**sg.GREEDY, "max_new_tokens": P["out_len"]}}
            for g in range(P["groups"]) for i in range(P["per_group"])]
    random.Random(7).shuffle(reqs)
    srv.flush_cache()
    m0 = srv.metrics()
    s = sg.latency_summary(srv.generate_many(reqs, stream=True))
    hm = sg.hit_rate(m0, srv.metrics())
    row = {"policy": policy, "rep": rep, "requests": len(reqs), **{k: s.get(k) for k in (
        "failed", "hit_rate", "wall_s", "output_throughput", "total_throughput", "p50_ttft_ms", "p99_ttft_ms",
        "p50_itl_ms", "p50_e2e_ms")}, "prefill_compute_tokens": hm["prefill_compute_tokens"],
        "metrics_hit_rate": hm["hit_rate_scheduler"], "retracted": hm["retracted_requests"]}
    run.log(f"{policy} rep {rep}: hit rate {row['hit_rate']:.3f}, prefill computed {row['prefill_compute_tokens']:.0f} "
            f"tokens, {row['total_throughput']:.0f} tok/s, TTFT p50 {row['p50_ttft_ms']:.0f} ms")
    return row


def check(args):
    pd = sg.require_stack()
    P = QUICK if args.quick else FULL
    pools = list(args.pool_tokens or P["pools"])
    return pd, P, pools, server_flags(args, "fcfs", pools[0])[0]


def server_flags(args, policy: str, pool: int, write: bool = True) -> tuple[str, list[str]]:
    """(model dir, flags) of a server of 02: the serving configuration with pool ``pool``; fcfs is SGLang's
    default policy (no flag: with the default options and --quick, the pipeline's shared server)."""
    return sg.serving_flags(args, quick=args.quick, backend=args.backend, pool=pool, write=write,
                            schedule_policy=None if policy == "fcfs" else policy)


LPM_WHY = ("C compares LPM with FCFS, and the scheduling policy is a launch flag: the LPM pass gets a server of its "
           "own, with the same pool as the FCFS one")


def measure(args, P, pools, model_dir, run) -> dict:
    """A, B and C's FCFS pass on one server (SGLang's default policy), C's LPM pass on a server of its own,
    B again on each further pool size."""
    def server(policy, pool, why=""):
        _, fl = server_flags(args, policy, pool)
        return sg.server(run, model_dir, fl, quick=args.quick, port=args.port, start_timeout=args.start_timeout,
                         name=f"server[{policy}, pool {pool}]", log_name=f"server_{policy}_{pool}.log", own_why=why)
    d = {"ks": [], "pol": [], "rr": []}
    with server("fcfs", pools[0]) as srv:
        d["flags"] = srv.args
        d["pool0"] = int(srv.server_info().get("max_total_num_tokens") or pools[0])
        run.log(f"KV pool: {d['pool0']} tokens (asked {pools[0]}); {sg.graphs_text(srv.args)}")
        r = send(srv, sg.random_ids(64, 3), {"max_new_tokens": 4, **sg.GREEDY})
        if not (r["prompt_tokens"] == 64 and r["cached_tokens"] == 0):
            raise RuntimeError(f"unexpected meta_info for a fresh prompt: {r}")
        run.log("sanity: 64-token prompt -> prompt_tokens 64, cached 0 ✅  All results match. Starting benchmarks.")
        d["cw"], d["agree"] = cold_warm(srv, P, run)
        try:
            d["ks"] = kernel_switch(srv, run.dir / "profiles", P, run)
        except Exception as e:  # noqa: BLE001
            run.point_error({"part": "kernel switch"}, e)
        ev = eviction(srv, d["pool0"], P, run)
        d["ev"], d["evg"], d["rr"], d["agree"] = ev["ev"], ev["evg"], ev["rr"], d["agree"] + ev["agree"]
        fcfs = [policy_run(srv, P, "fcfs", rep, run) for rep in range(P["reps"])]
    d["pol"] = fcfs
    try:
        with server("lpm", pools[0], LPM_WHY) as srv:
            d["pol"] = [policy_run(srv, P, "lpm", rep, run) for rep in range(P["reps"])] + fcfs
    except Exception as e:  # noqa: BLE001 - A, B and the FCFS pass stand
        run.point_error({"part": "scheduling", "policy": "lpm"}, e)
    for pool in pools[1:]:   # the same working sets on a smaller pool
        try:
            with server("fcfs", pool) as srv:
                ev = eviction(srv, int(srv.server_info().get("max_total_num_tokens") or pool), P, run)
                for k in ("ev", "evg", "rr", "agree"):
                    d[k] = d[k] + ev[k]
        except Exception as e:  # noqa: BLE001
            run.point_error({"part": "eviction", "pool": pool}, e)
    return d


# ------------------------------------------------------------------ analyse, judge, tell

def per_rep(cwd, case: str) -> list[float]:
    """warm / cold server e2e latency of ``case``, one value per repetition (median of its warm requests)."""
    out = []
    for _, g in cwd[cwd["case"] == case].groupby("rep"):
        cold, warm = g[g["kind"] == "cold"]["e2e_ms"], g[g["kind"] == "warm"]["e2e_ms"]
        if len(cold) and len(warm):
            out.append(float(warm.median() / cold.iloc[0]))
    return out


def verdicts(run, d, pd, P, backend) -> None:
    """Every hypothesis of H judged on its repetitions (or cases) of this run."""
    cwd = pd.DataFrame(d["cw"])
    if len(cwd):
        warm = cwd[(cwd["kind"] == "warm") & (cwd["suffix_len"] == SUFFIX)]
        run.judge(H["warm_exact"], [float((g["cached_tokens"] == g["prefix_len"]).mean()) for _, g in warm.groupby("rep")],
                  evidence="cold_warm.csv", detail=f"{int((warm['cached_tokens'] == warm['prefix_len']).sum())} of "
                  f"{len(warm)} warm requests exact")
        rep = cwd[cwd["kind"] == "repeat"]
        run.judge(H["repeat_exact"], [float((g["cached_tokens"] == g["prompt_tokens"] - 1).mean())
                                      for _, g in rep.groupby("rep")], evidence="cold_warm.csv")
        half = per_rep(cwd, HALF)
        if half:
            run.headline(half_shared_warm_over_cold=statistics.median(half))
            run.judge(H["half"], half, evidence="cold_warm.csv", detail=f"{sg.graphs_text(d['flags'])}; cold "
                      f"{cwd[(cwd['case'] == HALF) & (cwd['kind'] == 'cold')]['e2e_ms'].median():.1f} ms")
        Lmax = max(P["prefix_lens"])
        big = per_rep(cwd, f"prefix {Lmax} x{max(P['branches'])}")
        if big:
            frac = SUFFIX / (Lmax + SUFFIX)
            run.headline(**{f"warm_over_cold_prefix_{Lmax}": statistics.median(big)})
            run.judge(dataclasses.replace(H["uncached"], high=round(3 * frac + 0.1, 3)), big, evidence="cold_warm.csv",
                      detail=f"prefix {Lmax}: uncached fraction {frac:.3f}")
    if d["ks"]:
        pairs = {}
        for k in d["ks"]:
            pairs.setdefault(k["rep"], {})[k["kind"]] = k["attention_kernels"]
        ok = [float("Paged" in p.get("warm", "") and "Merge" in p.get("warm", "") and "Paged" not in p.get("cold", ""))
              for p in pairs.values()]
        run.judge(H["switch"], ok, evidence="kernel_switch.csv",
                  premise=True if backend == "flashinfer" else f"backend {backend}: the kernel names are FlashInfer's",
                  detail=f"cold: {d['ks'][0]['attention_kernels'] or '-'}; warm: {d['ks'][1]['attention_kernels'] or '-'}")
    if d["agree"]:
        keys = ("meta_info", "log", "metrics_requests")
        spread = {}
        for a in d["agree"]:
            spread[a["rep"]] = max(spread.get(a["rep"], 0.0), max(a[k] for k in keys) - min(a[k] for k in keys))
        run.judge(H["agree"], list(spread.values()), evidence="hit_rate_3ways.csv", digits=2,
                  detail=f"{len(d['agree'])} cases")
    judge_eviction(run, pd.DataFrame(d["ev"]))
    judge_thrash(run, d.get("rr") or [])
    judge_policy(run, d["pol"])


def reverse_sweeps(evd):
    """The sweeps whose pass 2 ran newest first (every sweep of a recording made before the round-robin: no order
    column)."""
    return evd[evd["order"] == "reverse"] if "order" in evd else evd


def judge_eviction(run, evd) -> None:
    evd = reverse_sweeps(evd)
    if not len(evd):
        return
    fits, over = evd[evd["ws_over_pool"] <= 0.9], evd[evd["ws_over_pool"] >= 1.2]
    premise = True if len(fits) and fits["pass2_hit_rate"].min() >= 0.9 else \
        "the working sets that fit in 90% of the pool did not all hit >= 0.9 (or none was measured)"
    run.judge(H["pressure"], [float(g["pass2_hit_rate"].max()) for _, g in over.groupby("rep")], evidence="eviction.csv",
              premise=premise,
              detail=f"fitting sets: {fits['pass2_hit_rate'].min() if len(fits) else float('nan'):.2f} at the least")
    partial = evd[(evd["groups_kept"] > 0) & (evd["groups_kept"] < evd["groups"])]
    run.judge(H["lru"], [float(g["lru_order"].all()) for _, g in partial.groupby("rep")], evidence="eviction_groups.csv",
              detail=f"{int(partial['lru_order'].sum())} of {len(partial)} partly kept sweeps in LRU order")


def judge_thrash(run, rr) -> None:
    """lru-thrash on the round-robins' second pass; the scheduler log and meta_info agreeing on each request is told
    (the story), its agreement judged with the other cases by hit-rate-3-ways."""
    second = [r for r in rr if r["pass"] == 1]
    if not second:
        return
    fit = [r for r in rr if r["ws_tokens"] <= r["pool_tokens"] * 0.9]
    run.judge(H["thrash"], [r["hit_fraction"] for r in second], evidence="round_robin.csv",
              premise=True if not fit else "the pool held every prefix (no eviction pressure)",
              detail=f"{len({(r['pool_tokens'], r['ws_tokens'], r['rep']) for r in second})} round-robin(s), "
              f"{sum(r['outcome'] == 'hit' for r in second)} of {len(second)} second-pass requests hit")


def judge_policy(run, pol) -> None:
    lpm = {p["rep"]: p for p in pol if p["policy"] == "lpm"}
    fcfs = {p["rep"]: p for p in pol if p["policy"] == "fcfs"}
    both = sorted(set(lpm) & set(fcfs))
    if not both:
        return
    run.headline(lpm_hit_rate=statistics.median(lpm[r]["hit_rate"] for r in both),
                 fcfs_hit_rate=statistics.median(fcfs[r]["hit_rate"] for r in both))
    run.judge(H["lpm_hit"], [lpm[r]["hit_rate"] - fcfs[r]["hit_rate"] for r in both], evidence="policy.csv", digits=2,
              detail="hit rate LPM " + ", ".join(f"{lpm[r]['hit_rate']:.3f}" for r in both) + " vs FCFS "
              + ", ".join(f"{fcfs[r]['hit_rate']:.3f}" for r in both))
    run.judge(H["lpm_ttft"], [fcfs[r]["p50_ttft_ms"] / lpm[r]["p50_ttft_ms"] for r in both], evidence="policy.csv",
              detail="TTFT p50 LPM " + ", ".join(f"{lpm[r]['p50_ttft_ms']:.0f}" for r in both) + " vs FCFS "
              + ", ".join(f"{fcfs[r]['p50_ttft_ms']:.0f}" for r in both) + " ms")


def figure(run, evd) -> None:
    evd = reverse_sweeps(evd)
    if not len(evd):
        return
    from common.render import plots
    med = evd.groupby(["pool_tokens", "ws_over_pool"], as_index=False)["pass2_hit_rate"].median()
    fig = plots.sweep(med, "ws_over_pool", "pass2_hit_rate", hue="pool_tokens", ylabel="hit rate on the second pass "
                      "(median of reps)", title="RadixCache under memory pressure (LRU, reverse-order second pass)",
                      hline=1.0, hline_label="")
    fig.axes[0].axvline(1.0, color="grey", ls=":", lw=1)
    run.figure("hit_rate", fig)


def round_robin_figure(rr):
    """The first round-robin, per request: cached vs new prompt tokens, coloured by hit / miss / evicted."""
    from common.render.plots import _plt
    plt = _plt()
    first = (rr[0]["pool_tokens"], rr[0]["ws_tokens"], rr[0]["rep"])
    rows = [r for r in rr if (r["pool_tokens"], r["ws_tokens"], r["rep"]) == first]
    fig, ax = plt.subplots(figsize=(8, 3.2))
    col = {"hit": "tab:green", "miss": "tab:grey", "evicted": "tab:red"}
    for c in rows:
        ax.bar(c["request"], c["prompt"], color=col[c["outcome"]], alpha=0.35)          # the whole prompt
        ax.bar(c["request"], c["api_cached"], color=col[c["outcome"]])                 # the cached part
        ax.text(c["request"], c["prompt"] * 1.01, str(c["group"]), ha="center", fontsize=6)
    ax.set_xlabel("request (in order; the number on top is its prefix group)")
    ax.set_ylabel("prompt tokens (solid: cached)")
    ax.set_title(f"{1 + max(r['group'] for r in rows)} prefixes of {rows[0]['prefix_len']} tokens, pool {first[0]} tokens: "
                 "green hit, red evicted, grey first use", fontsize=8)
    return fig


def tell(d, pd, P, pools, model_dir, backend) -> str:
    cwd, items = pd.DataFrame(d["cw"]), []
    for case, g in (cwd.groupby("case", sort=False) if len(cwd) else []):
        c, w, rp = g[g["kind"] == "cold"], g[g["kind"] == "warm"], g[g["kind"] == "repeat"]
        items.append((f"{case}: cold {int(c['prompt_tokens'].iloc[0])} tok, cached 0, {c['e2e_ms'].median():.1f} ms -> "
                      f"warm cached {int(w['cached_tokens'].median())}, {w['e2e_ms'].median():.1f} ms (saved "
                      f"{c['e2e_ms'].median() - w['e2e_ms'].median():.1f} ms) -> repeat cached "
                      f"{int(rp['cached_tokens'].median())} (medians of {g['rep'].nunique()} reps)", []))
    ks = [(f"{k['kind']} rep {k['rep']} (cached {k['cached_tokens']}): {k['attention_kernels'] or '-'}", []) for k in d["ks"]]
    ev = [(f"pool {e['pool_tokens']} rep {e['rep']}: working set {e['ws_over_pool']:.2f}x -> pass-2 hit rate "
           f"{e['pass2_hit_rate']:.2f}, kept {e['groups_kept']}/{e['groups']} newest groups, evicted "
           f"{e['evicted_tokens']:.0f} tokens", []) for e in d["ev"] if e.get("order", "reverse") == "reverse"]
    runs = {}
    for r in d.get("rr") or []:
        runs.setdefault((r["pool_tokens"], r["ws_tokens"], r["rep"]), []).append(r)
    rr = [(f"pool {pool} rep {rep}, {len({r['group'] for r in rs})} groups ({ws / pool:.2f}x): "
           + " ".join(f"{r['group']}{r['outcome'][0]}" for r in rs)
           + f"; log = meta_info on {sum(bool(r['agree']) for r in rs)}/{len(rs)} requests", [])
          for (pool, ws, rep), rs in runs.items()]
    pol = [(f"{p['policy']} rep {p['rep']}: hit rate {p['hit_rate']:.3f}, prefill computed "
            f"{p['prefill_compute_tokens']:.0f} tok, {p['total_throughput']:.0f} tok/s, TTFT p50 {p['p50_ttft_ms']:.0f} / "
            f"p99 {p['p99_ttft_ms']:.0f} ms", []) for p in d["pol"]]
    return story.tree(f"RADIX CACHE — {Path(model_dir).name}, {backend}, KV pool {pools}", [
        (f"configuration: {sg.graphs_text(d['flags'])}; every latency below was taken with these graphs", []),
        ("cold -> warm -> repeat (1 new token each)", items), ("attention kernels of traced prefills", ks),
        ("eviction (pass 1 oldest-first, pass 2 newest-first)", ev),
        *([("the cache over time: round-robin, pass 2 in pass 1's order, then the newest again (per request: "
            "m miss, e evicted, h hit; the number is its group)", rr)] if rr else []),
        (f"scheduling: {P['groups']} groups x {P['per_group']} requests, shuffled, all at once", pol)])


TABLES = (("cold_warm", "cw"), ("hit_rate_3ways", "agree"), ("eviction", "ev"), ("eviction_groups", "evg"),
          ("policy", "pol"), ("kernel_switch", "ks"), ("round_robin", "rr"))   # (table, key of Record.d), as written


@dataclass
class Record:
    """What the analysis of one run reads: its plan (P, pools, backend, model folder) and ``d``, the measured rows
    of each table (TABLES) and the first server's flags (the same a --reanalyse reads back from a recording)."""
    args: object
    P: dict
    pools: list
    model_dir: str
    d: dict = field(default_factory=dict)

    @property
    def backend(self) -> str:
        return self.args.backend


def analyse(run, x: Record) -> None:
    """Figure, verdicts and story from the measured rows (a GPU run and --reanalyse alike)."""
    import pandas as pd
    figure(run, pd.DataFrame(x.d["ev"]))
    if x.d.get("rr"):
        run.figure("round_robin", round_robin_figure(x.d["rr"]))
    verdicts(run, x.d, pd, x.P, x.backend)
    run.story(sg.config_line(x.d["flags"], sg.SERVING_ENV, x.args.quick) + " -- C's LPM pass: + --schedule-policy lpm\n"
              + tell(x.d, pd, x.P, x.pools, x.model_dir, x.backend), echo=True)


def main_reanalyse(args) -> int:
    """--reanalyse DIR: the recording's tables back into the rows the analysis reads; the first server's flags from
    its summary (``servers``), else rebuilt from its arguments; no server, no sglang."""
    rec = recording.open(args.reanalyse, __file__, tables=("cold_warm",), optional=tuple(t for t, _ in TABLES[1:]))
    a = rec.args_like(args)
    P = QUICK if a.quick else FULL
    pools = list(a.pool_tokens or P["pools"])
    model_dir, fl = server_flags(a, "fcfs", pools[0], write=False)
    servers = rec.summary.get("servers") or []
    d = {"flags": servers[0]["flags"] if servers else fl}
    for name, key in TABLES:
        t = rec.tables[name]
        if name == "kernel_switch" and t is not None:
            t = t.fillna({"attention_kernels": ""})
        d[key] = [] if t is None else t.to_dict("records")
    with recording.run(__file__, args, rec) as run:
        for k in ("servers", "server_config"):
            if k in rec.summary:
                run.summary[k] = rec.summary[k]
        analyse(run, Record(a, P, pools, model_dir, d))
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    pd, P, pools, model_dir = check(args)
    with Run(__file__, args, out=args.out) as run:
        x = Record(args, P, pools, model_dir)
        x.d = measure(args, P, pools, model_dir, run)
        for name, key in TABLES:
            sg.table(run, name, x.d[key])
        analyse(run, x)
    return 0


if __name__ == "__main__":
    run_main(main)
