#!/usr/bin/env python3
"""02 · RadixAttention: cold vs warm prefixes, eviction under memory pressure, LPM vs FCFS.

What it measures (SGLang HTTP servers with a deliberately small KV pool, --max-total-tokens)
    A. cold vs warm: for each prefix length and branching factor, after /flush_cache, one cold
       request (prefix + suffix 0), then k requests sharing the prefix, then an exact repeat,
       one at a time, each generating 1 token (so its latency is its prefill). Per request:
       prompt and cached tokens (meta_info), server e2e latency (~TTFT); prefill time saved;
       the hit rate measured three ways that must agree: meta_info (sum cached / sum prompt),
       the scheduler log (#cached-token / (#cached + #new)), and /metrics counter deltas.
       A half-shared 512-token case mirrors the plan's A100 experiment. Apart from the timed
       requests, one cold and one warm prefill are traced to see which attention kernels each runs.
    B. eviction: G prefix groups (2048 tokens each) sent once (pass 1), then again in reverse
       order (pass 2) with new suffixes; the working set (G x request size) is swept across the
       pool size. LRU keeps the most recently used groups: pass 2 hits exactly those and misses
       the oldest. Records pass-2 hit rate, evicted tokens (/metrics), and which groups went.
    C. cache-aware scheduling: the same shuffled shared-prefix workload (groups x requests, all
       sent at once, <= 128 so LPM stays active) on a server with --schedule-policy lpm and one
       with fcfs (0.5.17's default): hit rate, prefill tokens computed, throughput, TTFT.

What the plan expected (hypotheses)
    * Warm prefill ~1/3 of cold when about half of a 512-token prompt is shared (A100: 38 -> 12 ms);
      restated: prefill time falls roughly with the uncached fraction.
    * A warm request reports cached_tokens = the shared token count; an exact repeat prompt - 1.
    * Cold prefill: ragged attention only; warm: ragged + paged + merge-state (FlashInfer).
    * Under memory pressure an eviction pattern appears; LRU evicts the oldest unlocked leaves.
    * LPM beats FCFS on hit rate and TTFT (while < 128 requests wait).
    * The three hit-rate measurements agree.

Run
    python sglang/scripts/02_radix_cache_analysis.py --quick     # 2 servers, ~2 min warm
    python sglang/scripts/02_radix_cache_analysis.py             # + more prefix lengths, a 2nd pool size
    (attention kernels under the counters: ./sglang/scripts/05_ncu_attention.sh; the serving
     timeline: ./sglang/scripts/04_nsys_profile.sh)
Writes sglang/results/02_radix_cache_analysis/: cold_warm.csv, hit_rate_3ways.csv, kernel_switch.csv,
eviction.csv, eviction_groups.csv, policy.csv, hit_rate.png, server_*.log, profiles/, story.txt, summary.json.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from common import serving, story, trace  # noqa: E402
from common.checks import require_module, run_main  # noqa: E402
from common.results import Run  # noqa: E402
from common.serving import Server, flags, parse_batch_log  # noqa: E402

QUICK = dict(prefix_lens=(1024, 4096), branches=(4,), pools=(32768,), group_len=2048,
             ws_tokens=(16384, 24576, 49152), groups=8, per_group=8, sys_len=2048, q_len=128, out_len=32)
FULL = dict(prefix_lens=(256, 1024, 4096, 8192), branches=(1, 4, 16), pools=(32768, 16384), group_len=2048,
            ws_tokens=(8192, 16384, 24576, 32768, 49152, 65536), groups=16, per_group=8, sys_len=2048, q_len=128, out_len=64)
SUFFIX = 32
ONE = {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="fewer prefix lengths, one pool size (~2 min)")
    p.add_argument("--out", default=None, help="results folder (default sglang/results/02_radix_cache_analysis)")
    p.add_argument("--pool-tokens", default=None, help="KV pool sizes (--max-total-tokens), e.g. '32768,16384'")
    serving.add_model_args(p)
    return p.parse_args(argv)


def hit3(meta_rows, log_rows, before, after) -> dict:
    """The hit rate three ways: per-request meta_info, scheduler log lines, /metrics counters."""
    pre = [r for r in log_rows if r["kind"] == "prefill" and not serving.is_probe(r)]
    hm = serving.hit_rate(before, after)
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
    rows, agree = [], []
    cases = [(L, k, SUFFIX) for L in P["prefix_lens"] for k in P["branches"]] + [(256, 1, 256)]  # last: half shared
    for L, k, sfx in cases:
        try:
            srv.flush_cache()
            m0, mark = srv.metrics(), srv.log_mark()
            prefix = serving.random_ids(L, seed=L * 100 + k)
            got = [{"kind": "cold", **send(srv, prefix + serving.random_ids(sfx, 1))}]
            got += [{"kind": "warm", **send(srv, prefix + serving.random_ids(sfx, 2 + i))} for i in range(k)]
            got += [{"kind": "repeat", **send(srv, prefix + serving.random_ids(sfx, 1))}]
            case = "half-shared 512" if sfx == 256 else f"prefix {L} x{k}"
            rows += [{"case": case, "prefix_len": L, "branches": k, "suffix_len": sfx, **g} for g in got]
            h = hit3(got, parse_batch_log(srv.log_since(mark)), m0, srv.metrics())
            agree.append({"case": case, **h})
            cold, warm = got[0]["e2e_ms"], statistics.median(g["e2e_ms"] for g in got if g["kind"] == "warm")
            run.log(f"{case}: cold {cold:.1f} ms, warm {warm:.1f} ms (cached {got[1]['cached_tokens']}), hit rate "
                    f"meta {h['meta_info']:.3f} / log {h['log']:.3f} / metrics {h['metrics_requests']:.3f}")
        except Exception as e:
            run.point_error({"part": "cold_warm", "prefix_len": L, "branches": k}, e)
    return rows, agree


def attention_kernels(srv, prof_dir: Path, ids) -> tuple[dict, list]:
    """One request traced on its own (num_steps=1): its meta_info and the attention kernels it ran."""
    before = list(prof_dir.glob("*.trace.json*")) if prof_dir.exists() else []
    srv.start_profile(prof_dir, num_steps=1)
    r = send(srv, ids)
    srv.stop_profile()
    ev = trace.read_chrome_trace(srv.wait_traces(prof_dir, before)[0])
    return r, sorted({k for k in trace.kernels(ev)["short"] if serving.kernel_family(k) == "attention"})


def kernel_switch(srv, prof_dir: Path, run) -> list[dict]:
    """Untimed: which attention kernels a cold and a warm prefill run (traced apart from the timed ones)."""
    srv.flush_cache()
    prefix = serving.random_ids(2048, seed=4242)
    out = []
    for kind, sfx in (("cold", 1), ("warm", 2)):
        r, att = attention_kernels(srv, prof_dir, prefix + serving.random_ids(SUFFIX, sfx))
        out.append({"kind": kind, "cached_tokens": r["cached_tokens"], "attention_kernels": ";".join(att)})
        run.log(f"{kind} prefill (cached {r['cached_tokens']}): attention kernels {att}")
    return out


def eviction(srv, pool: int, P, run) -> tuple[list, list]:
    per_req = P["group_len"] + SUFFIX + 1
    summary, groups = [], []
    for ws in P["ws_tokens"]:
        G = max(2, ws // per_req)
        try:
            srv.flush_cache()
            m0 = srv.metrics()
            prefixes = [serving.random_ids(P["group_len"], seed=10_000 + ws + g) for g in range(G)]
            for g in range(G):                       # pass 1: oldest first
                send(srv, prefixes[g] + serving.random_ids(SUFFIX, 20_000 + g))
            hits = {}
            for g in reversed(range(G)):             # pass 2: most recent first
                r = send(srv, prefixes[g] + serving.random_ids(SUFFIX, 30_000 + g))
                hits[g] = r["cached_tokens"]
            hm = serving.hit_rate(m0, srv.metrics())
            kept = [g for g in range(G) if hits[g] >= P["group_len"]]
            lru = kept == list(range(G - len(kept), G))      # the kept groups are the most recent ones
            hr = sum(hits.values()) / (G * (P["group_len"] + SUFFIX))
            summary.append({"pool_tokens": pool, "ws_tokens": G * per_req, "ws_over_pool": G * per_req / pool,
                            "groups": G, "pass2_hit_rate": hr, "groups_kept": len(kept), "lru_order": lru,
                            "evicted_tokens": hm["evicted_tokens"]})
            groups += [{"pool_tokens": pool, "ws_tokens": G * per_req, "group": g, "pass2_cached": hits[g],
                        "kept": hits[g] >= P["group_len"]} for g in range(G)]
            run.log(f"pool {pool}, working set {G * per_req} ({G} groups): pass-2 hit rate {hr:.2f}, kept groups "
                    f"{kept[:3]}..{kept[-3:] if kept else []}, evicted {hm['evicted_tokens']:.0f} tokens")
        except Exception as e:
            run.point_error({"part": "eviction", "pool": pool, "ws_tokens": ws}, e)
    return summary, groups


def policy_run(srv, P, policy: str, run) -> dict:
    rnd = random.Random(7)
    sysp = [serving.random_ids(P["sys_len"], seed=40_000 + g) for g in range(P["groups"])]
    reqs = [{"input_ids": sysp[g] + serving.random_ids(P["q_len"], 50_000 + g * 100 + i),
             "sampling_params": {"max_new_tokens": P["out_len"], "temperature": 0, "ignore_eos": True}}
            for g in range(P["groups"]) for i in range(P["per_group"])]
    rnd.shuffle(reqs)
    srv.flush_cache()
    m0 = srv.metrics()
    res = srv.generate_many(reqs, stream=True)
    s = serving.latency_summary(res)
    hm = serving.hit_rate(m0, srv.metrics())
    row = {"policy": policy, "requests": len(reqs), **{k: s.get(k) for k in (
        "failed", "hit_rate", "wall_s", "output_throughput", "total_throughput", "p50_ttft_ms", "p99_ttft_ms",
        "p50_itl_ms", "p50_e2e_ms")}, "prefill_compute_tokens": hm["prefill_compute_tokens"],
        "metrics_hit_rate": hm["hit_rate_scheduler"], "retracted": hm["retracted_requests"]}
    run.log(f"{policy}: hit rate {row['hit_rate']:.3f}, prefill computed {row['prefill_compute_tokens']:.0f} tokens, "
            f"{row['total_throughput']:.0f} tok/s, TTFT p50 {row['p50_ttft_ms']:.0f} ms")
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    serving.require_sglang()
    serving.require_gpus(1)
    pd = require_module("pandas")
    P = QUICK if args.quick else FULL
    pools = [int(x) for x in args.pool_tokens.split(",")] if args.pool_tokens else list(P["pools"])
    model_dir, base = serving.model_and_flags(args)
    env = {"SGLANG_LOG_MS": "1"}

    def server(policy, pool, run):
        fl = base + flags(attention_backend=args.backend, enable_metrics=True, log_level="info",
                          schedule_policy=policy, max_total_tokens=pool, cuda_graph_max_bs_decode=128)
        return Server(model_dir, fl, port=args.port, log_path=run.path(f"server_{policy}_{pool}.log"), echo=run.log,
                      start_timeout=args.start_timeout, env=env, name=f"server[{policy}, pool {pool}]")

    with Run(__file__, args, out=args.out) as run:
        cw, agree, ev, evg, pol = [], [], [], [], []
        with server("lpm", pools[0], run) as srv:
            info = srv.server_info()
            pool0 = int(info.get("max_total_num_tokens") or pools[0])
            run.log(f"KV pool: {pool0} tokens (asked {pools[0]})")
            r = send(srv, serving.random_ids(64, 3), {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True})
            ok = r["prompt_tokens"] == 64 and r["cached_tokens"] == 0
            run.log(f"sanity: 64-token prompt -> prompt_tokens {r['prompt_tokens']}, cached {r['cached_tokens']} "
                    f"{'✅' if ok else '❌'}")
            if not ok:
                raise RuntimeError(f"unexpected meta_info for a fresh prompt: {r}")
            run.log("All results match. Starting benchmarks.")
            cw, agree = cold_warm(srv, P, run)
            try:
                ks = kernel_switch(srv, run.dir / "profiles", run)
            except Exception as e:
                ks = []
                run.point_error({"part": "kernel switch"}, e)
            ev, evg = eviction(srv, pool0, P, run)
            pol.append(policy_run(srv, P, "lpm", run))
        with server("fcfs", pools[0], run) as srv:
            pol.append(policy_run(srv, P, "fcfs", run))
        for pool in pools[1:]:   # the same working sets on a smaller pool
            try:
                with server("lpm", pool, run) as srv:
                    e2, g2 = eviction(srv, int(srv.server_info().get("max_total_num_tokens") or pool), P, run)
                    ev, evg = ev + e2, evg + g2
            except Exception as e:
                run.point_error({"part": "eviction", "pool": pool}, e)
        serving.table(run, "cold_warm", cw)
        serving.table(run, "hit_rate_3ways", agree)
        serving.table(run, "eviction", ev)
        serving.table(run, "eviction_groups", evg)
        serving.table(run, "policy", pol)
        serving.table(run, "kernel_switch", ks)

        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        evd = pd.DataFrame(ev)
        if len(evd):
            fig, ax = plt.subplots(figsize=(7, 4.2))
            for pool, g in evd.groupby("pool_tokens"):
                ax.plot(g["ws_over_pool"], g["pass2_hit_rate"], "o-", label=f"pool {pool} tokens")
            ax.axvline(1.0, color="grey", ls=":", lw=1)
            ax.set_xlabel("working set / KV pool size")
            ax.set_ylabel("hit rate on the second pass")
            ax.set_title("RadixCache under memory pressure (LRU, reverse-order second pass)")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
            run.figure("hit_rate", fig)

        # ---- verdicts
        cwd = pd.DataFrame(cw)
        if len(cwd):
            warm = cwd[(cwd["kind"] == "warm") & (cwd["suffix_len"] == SUFFIX)]
            exact = bool((warm["cached_tokens"] == warm["prefix_len"]).all())
            run.observe("a warm request reports cached_tokens equal to the shared token count",
                        f"{int((warm['cached_tokens'] == warm['prefix_len']).sum())} of {len(warm)} warm requests exact",
                        "confirmed" if exact and len(warm) else "refuted", "cold_warm.csv")
            rep = cwd[cwd["kind"] == "repeat"]
            ok = bool((rep["cached_tokens"] == rep["prompt_tokens"] - 1).all())
            run.observe("an exact repeat reports cached_tokens = prompt_tokens - 1 (one token is recomputed for logits)",
                        f"{int((rep['cached_tokens'] == rep['prompt_tokens'] - 1).sum())} of {len(rep)} repeats",
                        "confirmed" if ok and len(rep) else "refuted", "cold_warm.csv")
            half = cwd[cwd["case"] == "half-shared 512"]
            if len(half):
                ratio = half[half["kind"] == "warm"]["e2e_ms"].median() / half[half["kind"] == "cold"]["e2e_ms"].iloc[0]
                run.headline(half_shared_warm_over_cold=ratio)
                run.observe("with half of a 512-token prompt cached, the warm prefill takes ~1/3 of the cold one "
                            "(A100: 38 -> 12 ms). Confirmed if warm/cold <= 0.45, refuted if >= 0.7",
                            f"warm/cold = {ratio:.2f} (cold {half[half['kind'] == 'cold']['e2e_ms'].iloc[0]:.1f} ms, "
                            "server e2e with 1 new token)",
                            "confirmed" if ratio <= 0.45 else "refuted" if ratio >= 0.7 else "inconclusive", "cold_warm.csv")
            big = cwd[cwd["prefix_len"] == max(P["prefix_lens"])]
            if len(big):
                r_big = big[big["kind"] == "warm"]["e2e_ms"].median() / big[big["kind"] == "cold"]["e2e_ms"].median()
                frac = SUFFIX / (max(P["prefix_lens"]) + SUFFIX)
                run.headline(**{f"warm_over_cold_prefix_{max(P['prefix_lens'])}": r_big})
                run.observe("prefill time falls roughly with the uncached fraction (restated plan); "
                            "confirmed if warm/cold <= 3 x the uncached token fraction + 0.1",
                            f"prefix {max(P['prefix_lens'])}: warm/cold {r_big:.2f}, uncached fraction {frac:.3f}",
                            "confirmed" if r_big <= 3 * frac + 0.1 else "refuted", "cold_warm.csv")
        if len(ks) == 2:
            cold_k, warm_k = ks[0]["attention_kernels"], ks[1]["attention_kernels"]
            fi = args.backend == "flashinfer"
            switched = "Paged" in warm_k and "Merge" in warm_k and "Paged" not in cold_k
            run.observe("a cold prefill runs the ragged attention kernel only; a warm one adds the paged kernel "
                        "(new tokens x cached prefix) and merge-state (FlashInfer; judged only for that backend)",
                        f"cold: {cold_k or '-'}; warm (cached {ks[1]['cached_tokens']}): {warm_k or '-'}",
                        ("confirmed" if switched else "refuted") if fi else "inconclusive", "kernel_switch.csv")
        if agree:
            spread = max(max(a[k] for k in ("meta_info", "log", "metrics_requests")) -
                         min(a[k] for k in ("meta_info", "log", "metrics_requests")) for a in agree)
            run.observe("the three hit-rate measurements (meta_info, log lines, /metrics counters) agree "
                        "(confirmed within 0.01)", f"largest disagreement {spread:.4f} over {len(agree)} cases",
                        "confirmed" if spread <= 0.01 else "refuted", "hit_rate_3ways.csv")
        if len(evd):
            lo, hi = evd[evd["ws_over_pool"] <= 0.9], evd[evd["ws_over_pool"] >= 1.2]
            lru = bool(evd[(evd["groups_kept"] > 0) & (evd["groups_kept"] < evd["groups"])]["lru_order"].all())
            falls = len(lo) and len(hi) and lo["pass2_hit_rate"].min() >= 0.9 and hi["pass2_hit_rate"].max() <= 0.8
            run.observe("under memory pressure the hit rate falls and LRU evicts the oldest prefixes first "
                        "(confirmed: >= 0.9 when the working set fits in 90% of the pool, <= 0.8 above 1.2x, and the "
                        "kept groups are always the most recent ones)",
                        f"hit rate {lo['pass2_hit_rate'].min() if len(lo) else float('nan'):.2f} (fits) -> "
                        f"{hi['pass2_hit_rate'].max() if len(hi) else float('nan'):.2f} (1.2x+); LRU order kept: {lru}",
                        "confirmed" if falls and lru else "refuted" if len(lo) and len(hi) else "inconclusive", "eviction.csv")
        if len(pol) == 2:
            lpm, fcfs = pol
            better_hit = lpm["hit_rate"] > fcfs["hit_rate"] + 0.02
            better_ttft = lpm["p50_ttft_ms"] < fcfs["p50_ttft_ms"]
            run.headline(lpm_hit_rate=lpm["hit_rate"], fcfs_hit_rate=fcfs["hit_rate"])
            run.observe("LPM beats FCFS on hit rate and TTFT for a shuffled shared-prefix burst (< 128 waiting); "
                        "confirmed if LPM's hit rate is > 0.02 higher and its TTFT p50 lower",
                        f"hit rate {lpm['hit_rate']:.3f} vs {fcfs['hit_rate']:.3f}, TTFT p50 {lpm['p50_ttft_ms']:.0f} vs "
                        f"{fcfs['p50_ttft_ms']:.0f} ms, {lpm['total_throughput']:.0f} vs {fcfs['total_throughput']:.0f} tok/s",
                        "confirmed" if better_hit and better_ttft else "refuted" if not (better_hit or better_ttft)
                        else "inconclusive", "policy.csv")

        # ---- story
        items = []
        for case, g in (cwd.groupby("case", sort=False) if len(cwd) else []):
            c = g[g["kind"] == "cold"].iloc[0]
            w = g[g["kind"] == "warm"]
            rp = g[g["kind"] == "repeat"].iloc[0]
            items.append((f"{case}: cold {c.prompt_tokens} tok, cached 0, {c.e2e_ms:.1f} ms -> warm cached "
                          f"{int(w['cached_tokens'].median())}, {w['e2e_ms'].median():.1f} ms "
                          f"(saved {c.e2e_ms - w['e2e_ms'].median():.1f} ms) -> repeat cached {rp.cached_tokens}", []))
        ev_items = [(f"pool {e['pool_tokens']}: working set {e['ws_over_pool']:.2f}x -> pass-2 hit rate "
                     f"{e['pass2_hit_rate']:.2f}, kept {e['groups_kept']}/{e['groups']} newest groups, evicted "
                     f"{e['evicted_tokens']:.0f} tokens", []) for e in ev]
        pol_items = [(f"{p['policy']}: hit rate {p['hit_rate']:.3f}, prefill computed {p['prefill_compute_tokens']:.0f} tok, "
                      f"{p['total_throughput']:.0f} tok/s, TTFT p50 {p['p50_ttft_ms']:.0f} / p99 {p['p99_ttft_ms']:.0f} ms", [])
                     for p in pol]
        run.story(story.tree(f"RADIX CACHE — {Path(model_dir).name}, {args.backend}, KV pool {pools}",
                             [("cold -> warm -> repeat (1 new token each)", items),
                              ("eviction (pass 1 oldest-first, pass 2 newest-first)", ev_items),
                              (f"scheduling: {P['groups']} groups x {P['per_group']} requests, shuffled, all at once",
                               pol_items)]))
        print(run.summary["story"])
    return 0


if __name__ == "__main__":
    run_main(main)
