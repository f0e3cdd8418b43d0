#!/usr/bin/env python3
"""05 · All-reduce through mini-SGLang's PyNCCL vs torch.distributed NCCL: latency and bus bandwidth.

What it measures (needs two GPUs of one host; on one GPU it says so and exits 0)
    For TP 2 (and 4, 8 where the GPUs exist), in spawned rank processes, bf16 all-reduce (sum) of
    4 KiB to 256 MiB through
      * PyNCCL with its symmetric buffer (mini-SGLang's engine setting: message <= buffer, so every
        call is copy-in -> ncclAllReduce in place on the registered window -> copy-out),
      * PyNCCL direct (max_size_bytes=0: ncclAllReduce on the tensor itself, no copies),
      * torch.distributed all_reduce on an NCCL process group,
    each eagerly (CUDA events) and replayed from a CUDA graph (how the engine runs decode), all with
    common.capture.timing.bench (fixed sample counts on every rank, so the collectives stay matched; each
    sample is 10 back-to-back calls, so rank skew is amortised). Per sample the slowest rank defines the
    time; the median of those is the point, and the verdicts are judged on bootstrap intervals over the
    samples (common.base.stats). algbw = bytes / time, busbw = algbw x 2(n-1)/n (NCCL's convention,
    common.tables.flops.bus_bandwidth), compared with the MEASURED GPU0->GPU1 copy bandwidth (and the
    datasheet NVLink, and the NVLink all-reduce ceiling of common.capture.ceilings.peaks where it was measured).
    --analyze  the copy path alone: buffered minus direct time per size (the D2D copies' share), a
               torch.profiler trace on rank 0 (common.tables.trace.capture_calls; the other ranks make the same
               calls in the same order) showing what one call of each launches (memcpy DtoD, the NCCL
               kernel, memcpy DtoD), and what the all-reduces of one Llama-3.1-8B TP forward
               (2 per layer + 1 for the embedding) cost at decode and prefill sizes.
    NVLink multicast stays off (common.capture.procs.nccl_env: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
    NVSHMEM_DISABLE_NVLS=1, set before any NCCL init). A rank that fails or hangs is stopped (timeouts on
    every join); --tp larger than the GPU count is refused with one line before any rank starts.

What the plan expected (hypotheses: H_* below; A100 figures)
    * All-reduce reaches 85-95% of NVLink bandwidth.
    * The symmetric buffer costs an extra device-to-device copy ("direct peer access" would remove
      it). Reading pynccl.cu:105-123: two copies (in and out) per call whenever the message fits.

Run
    python mini-sglang/scripts/05_profile_comm.py --quick            # ~1-2 min on 2 GPUs: TP 2, 4 sizes
    python mini-sglang/scripts/05_profile_comm.py                    # TP 2/4/8 as GPUs allow, 9 sizes
    python mini-sglang/scripts/05_profile_comm.py --tp 2 4           # chosen TP sizes
    python mini-sglang/scripts/05_profile_comm.py --analyze          # only the copy-path analysis
    python mini-sglang/scripts/05_profile_comm.py --reanalyse DIR --out OUT   # no GPU: verdicts again from DIR's CSVs
    nsys profile --trace=cuda,nvtx --sample=none --cpuctxsw=none -o /tmp/comm \\
        python mini-sglang/scripts/05_profile_comm.py --quick --analyze   # every rank's timeline
Writes mini-sglang/results/05_profile_comm/: allreduce.csv (with every sample), copy_overhead.csv,
forward_estimate.csv, launches.csv, busbw.png, trace_rank0_tp<N>.json, story.txt, summary.json.
"""
from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _msgl  # noqa: E402
from common.base import stats, story  # noqa: E402
from common.base.checks import require_gpu, require_module, run_main, SetupError  # noqa: E402
from common.base.stats import Interval  # noqa: E402
from common.capture import ceilings, gpu, models, procs  # noqa: E402
from common.capture.store import load_summary  # noqa: E402
from common.capture.timing import bench  # noqa: E402
from common.tables import flops  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.render import plots  # noqa: E402
from common.run import cli  # noqa: E402
from common.run.results import Run  # noqa: E402

# ------------------------------------------------------------------ the sweep, as data
KiB, MiB = 1 << 10, 1 << 20
SIZES_FULL = (4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB)
SIZES_QUICK = (8 * KiB, 256 * KiB, 8 * MiB, 64 * MiB)
IMPLS = ("pynccl buffer", "pynccl direct", "torch nccl")
TRACE_SIZES = (64 * KiB, 64 * MiB)   # a decode-sized and a prefill-sized message
CALLS = 10                           # back-to-back calls per timed sample: rank skew and launch gaps amortised

# ------------------------------------------------------------------ the hypotheses, as data
PLAN = "PLAN.md session 2 / seed 002 ('NCCL AllReduce NVLink Util 85-95%', A100)"
H = declare(f"""
    busbw = allreduce-busbw: all-reduce reaches 85-95% of NVLink bandwidth (large messages)
        judged on: busbw of the best implementation at the largest message as % of the measured GPU0->GPU1 copy
            (bootstrap 95% interval over its samples)
        confirmed: [85, 95]%
        source: {PLAN}
    copies = pynccl-copies: the symmetric buffer adds device-to-device copies around every all-reduce (code: two)
        judged on: exactly two DtoD copies in every traced buffered call, none in a direct call (rank 0 trace)
        source: seed 002 / PLAN.md session 2: 'symmetric buffer costs an extra device copy'; pynccl.cu:105-123
    share = pynccl-copy-share: the copies' share is largest for decode-sized messages
        judged on: copy share (1 - direct / buffered time) at the smallest message minus at the largest, eager, first
            TP size (percentage points; intervals from the samples)
        confirmed: >= 0 pp
        source: mini-sglang/reports/plan.md 05: 'whose share is largest for decode-sized messages'
    graph = graph-small-latency: CUDA-graph replay lowers small-message latency (the engine replays decode)
        judged on: graph / eager time at the smallest message, every implementation (the claim holds for each: the
            interval spans all of them)
        confirmed: <= 1
        source: mini-sglang/reports/plan.md 05: 'eager vs CUDA graph'; 'lowers' read as < 1
""")


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="TP 2, 4 sizes, fewer samples (~1-2 min)")
    p.add_argument("--analyze", action="store_true", help="only the copy-path analysis (buffered vs direct, trace)")
    p.add_argument("--tp", type=_msgl.at_least(2, "a TP size", "an all-reduce needs two ranks"), nargs="+", default=None,
                   help="TP sizes (default: 2, 4, 8 as GPUs allow)")
    p.add_argument("--timeout", type=cli.positive_float, default=None, help="seconds before hung ranks are stopped")
    p.add_argument("--reanalyse", metavar="DIR", default=None,
                   help="no GPU: redo tables, verdicts and story from the allreduce.csv/launches.csv an earlier run left in DIR")
    return p.parse_args(argv)


def comm_worker(rank, world, port, sizes, impls, modes, reps, trace_path):
    """One rank: every (impl, mode, size) with the same call counts as the other ranks."""
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=timedelta(seconds=120))
    from minisgl.kernel import init_pynccl
    comms = {}
    if "pynccl buffer" in impls:
        comms["pynccl buffer"] = _msgl.keep(init_pynccl(tp_rank=rank, tp_size=world, tp_cpu_group=dist.group.WORLD,
                                                        max_size_bytes=max(sizes)))
    if "pynccl direct" in impls:
        comms["pynccl direct"] = _msgl.keep(init_pynccl(tp_rank=rank, tp_size=world, tp_cpu_group=dist.group.WORLD,
                                                        max_size_bytes=0))
    nccl_pg = dist.new_group(backend="nccl") if "torch nccl" in impls else None
    calls = {"pynccl buffer": lambda x: comms["pynccl buffer"].all_reduce(x, "sum"),
             "pynccl direct": lambda x: comms["pynccl direct"].all_reduce(x, "sum"),
             "torch nccl": lambda x: dist.all_reduce(x, group=nccl_pg)}
    if trace_path:
        from common.tables.trace import capture_calls
        xs = {n: torch.zeros(n // 2, dtype=torch.bfloat16, device="cuda") for n in TRACE_SIZES}
        traced = [(f"call: {impl} {n} B", lambda impl=impl, x=x: calls[impl](x)) for impl in impls for n, x in xs.items()]
        dist.barrier()
        if rank == 0:       # capture_calls: every call once (warm), then each once more under the profiler
            capture_calls(torch, traced, trace_path, reps=1)
        else:               # the same collectives in the same order, unprofiled
            for _label, fn in traced + traced:
                fn()
            torch.cuda.synchronize()
    rows = []
    for mode in modes:
        for impl in impls:
            for n in sizes:
                x = torch.zeros(n // 2, dtype=torch.bfloat16, device="cuda")
                dist.barrier()
                try:
                    t = bench(lambda: [calls[impl](x) for _ in range(CALLS)], method="events" if mode == "eager" else "graph",
                              cold_l2=False, warmup=3, reps=reps)
                    rows.append({"impl": impl, "mode": mode, "bytes": n, "calls_per_sample": CALLS, **t.to_dict(),
                                 "samples_ms": t.samples_ms})
                except Exception as e:   # recorded; the barrier keeps the ranks in step
                    rows.append({"impl": impl, "mode": mode, "bytes": n, "error": f"{e.__class__.__name__}: {str(e)[:160]}"})
                    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()
    return rows


def p2p_bandwidth(torch, run):
    """Measured one-way GPU0 -> GPU1 copy bandwidth (GB/s): the link peak busbw is compared with."""
    try:
        buf = [torch.empty(1 << 30, dtype=torch.uint8, device=f"cuda:{i}") for i in (0, 1)]
        t = bench(lambda: buf[1].copy_(buf[0]), cold_l2=False, reps=10)
        bw = (1 << 30) / (t.median_ms / 1e3) / 1e9
        buf.clear()
        torch.cuda.empty_cache()
        return bw
    except Exception as e:
        run.note(f"P2P copy bandwidth not measured: {e.__class__.__name__}: {str(e)[:120]}")
        return None


def point_rows(tp, res, p2p, link_ds, run) -> list[dict]:
    """One row per (impl, mode, size) of one TP size: per sample the slowest rank, per call (us); the median is the
    point, the samples are kept (';'-joined) for the intervals."""
    rows = []
    for i, r0 in enumerate(res[0]):
        err = next((rr[i]["error"] for rr in res if "error" in rr[i]), None)
        if err:
            run.point_error({"tp": tp, "impl": r0["impl"], "mode": r0["mode"], "bytes": r0["bytes"]}, RuntimeError(err))
            continue
        per = [max(rr[i]["samples_ms"][k] for rr in res) * 1e3 / CALLS for k in range(len(r0["samples_ms"]))]
        t_us = statistics.median(per)
        alg, bus = flops.bus_bandwidth(r0["bytes"], t_us / 1e6, tp)
        rows.append({"tp": tp, "impl": r0["impl"], "mode": r0["mode"], "bytes": r0["bytes"], "time_us": t_us,
                     "spread_pct": r0["spread_pct"], "algbw_gb_s": alg, "busbw_gb_s": bus,
                     "pct_p2p_measured": 100 * bus / p2p if p2p else None,
                     "pct_nvlink_datasheet": 100 * bus / link_ds if link_ds else None,
                     "samples_us": ";".join(f"{v:.4f}" for v in per)})
    return rows


def interp_us(df, n):
    """Log-log interpolation of the measured time at message size n."""
    pts = sorted(zip(df["bytes"], df["time_us"]))
    lo = max((p for p in pts if p[0] <= n), default=pts[0])
    hi = min((p for p in pts if p[0] >= n), default=pts[-1])
    if lo[0] == hi[0]:
        return lo[1]
    f = (math.log(n) - math.log(lo[0])) / (math.log(hi[0]) - math.log(lo[0]))
    return math.exp(math.log(lo[1]) + f * (math.log(hi[1]) - math.log(lo[1])))


# ------------------------------------------------------------------ intervals from the recorded samples

def time_iv(row) -> Interval:
    """The interval of one point's time (us): a bootstrap over its samples, or its one median when the run (an older
    one) recorded no samples."""
    s = row.get("samples_us")
    vals = [float(v) for v in s.split(";")] if isinstance(s, str) and s else [row["time_us"]]
    return stats.interval(vals)


def inverse(iv: Interval, k: float) -> Interval:
    """k / x of an interval of positive x (a time turned into a rate)."""
    return Interval(k / iv.point, k / iv.hi, k / iv.lo, iv.n, iv.method)


def share_iv(direct: Interval, buffered: Interval) -> Interval:
    """Copy share in % = 100 * (1 - direct / buffered), from the two time intervals (worst-case bounds)."""
    r = stats.ratio_interval(direct, buffered)
    return Interval(100 * (1 - r.point), 100 * (1 - r.hi), 100 * (1 - r.lo), r.n, r.method)


def launch_table(df):
    """The rank-0 launches as a common.tables.trace.kernels_in_ranges table; launches.csv of runs before the common join
    (columns range, kind, name, short) is renamed to it."""
    if "gpu_kind" in df.columns:
        return df
    return df.rename(columns={"range": "label", "kind": "gpu_kind", "short": "kernel", "name": "full_name",
                              "gpu_start_us": "ts_us"}).assign(call=0)


def copy_counts(launches) -> tuple[list[int], list[int], dict]:
    """DtoD memcpy per traced call (buffered, direct) and the one-time set-up copies of a communicator's first call."""
    d2d = lambda g: int((g["gpu_kind"].eq("memcpy") & g["full_name"].astype(str).str.contains("DtoD")).sum())  # noqa: E731
    setup = lambda g: int((g["gpu_kind"].isin(["memcpy", "memset"])  # noqa: E731
                           & ~g["full_name"].astype(str).str.contains("DtoD")).sum())
    per = list(launches.groupby(["label", "call"], sort=False))
    return ([d2d(g) for (lb, _c), g in per if "pynccl buffer" in lb], [d2d(g) for (lb, _c), g in per if "pynccl direct" in lb],
            {lb: setup(g) for (lb, _c), g in per if setup(g)})


def estimate(df, tp0, analyze) -> list[dict]:
    """What the all-reduces of one Llama-3.1-8B TP forward cost (2 per layer + the embedding), per implementation."""
    cfg = models.config("llama-3.1-8b")
    n_ar, est = 2 * cfg["num_hidden_layers"] + 1, []
    for impl in IMPLS:
        d = df[(df["tp"] == tp0) & (df["impl"] == impl) & (df["mode"] == ("eager" if analyze else "graph"))]
        for label, tokens in (("decode bs=1", 1), ("decode bs=32", 32), ("decode bs=256", 256), ("prefill 8192", 8192)):
            if len(d):
                n = tokens * cfg["hidden_size"] * 2
                t = interp_us(d, n)
                est.append({"impl": impl, "step": label, "message_bytes": n, "allreduces": n_ar, "per_call_us": t,
                            "per_forward_us": n_ar * t})
    return est


def judge(run, x):
    df, tp0 = x.df, x.tp0
    big = df[df["bytes"] == df["bytes"].max()]
    best = big.sort_values("busbw_gb_s").iloc[-1].to_dict()
    nan = Interval(math.nan, math.nan, math.nan, 0, "none")
    iv = inverse(time_iv(best), best["busbw_gb_s"] * best["time_us"] * 100 / x.p2p) if x.p2p else nan
    run.judge(H["busbw"], iv, evidence="allreduce.csv", premise=True if x.p2p else "the GPU0->GPU1 copy was not measured",
              detail=f"best busbw {best['busbw_gb_s']:.0f} GB/s at {int(best['bytes']) // MiB} MiB (TP{best['tp']} "
                     f"{best['impl']} {best['mode']})"
                     + (f" = {100 * best['busbw_gb_s'] / x.p2p:.0f}% of the measured GPU0->GPU1 copy ({x.p2p:.0f} GB/s)"
                        if x.p2p else "")
                     + (f", {100 * best['busbw_gb_s'] / x.link_ds:.0f}% of the datasheet link" if x.link_ds else "")
                     + (f"; NVLink all-reduce ceiling (common.capture.ceilings) {x.nvlink:.0f} GB/s" if x.nvlink else ""))
    if x.launches is not None:
        nb, nd, first = copy_counts(x.launches)
        _msgl.fact(run, H["copies"], [n == 2 for n in nb] + [n == 0 for n in nd], "launches.csv",
                   detail=f"DtoD memcpy per call: buffered {nb}, direct {nd} (rank 0 trace)" + (
                       "; the first traced call of a communicator also ran one-time host-to-device copies/memsets (NCCL "
                       "setup): " + ", ".join(f"{k[6:]} {n}" for k, n in first.items()) if first else ""))
    e = df[(df["tp"] == tp0) & (df["mode"] == "eager")]
    rows = {(r["impl"], r["bytes"]): r for r in e.to_dict("records")}
    lo_n, hi_n = e["bytes"].min(), e["bytes"].max()
    if all((i, n) in rows for i in ("pynccl buffer", "pynccl direct") for n in (lo_n, hi_n)):
        small = share_iv(time_iv(rows[("pynccl direct", lo_n)]), time_iv(rows[("pynccl buffer", lo_n)]))
        large = share_iv(time_iv(rows[("pynccl direct", hi_n)]), time_iv(rows[("pynccl buffer", hi_n)]))
        diff = Interval(small.point - large.point, small.lo - large.hi, small.hi - large.lo, min(small.n, large.n),
                        "difference of " + small.method)
        run.judge(H["share"], diff, evidence="copy_overhead.csv, allreduce.csv",
                  detail=f"copy share {small.point:.0f}% at {lo_n // KiB} KiB vs {large.point:.0f}% at {hi_n // MiB} MiB "
                         f"(eager, TP{tp0})")
    g = df[(df["tp"] == tp0) & (df["bytes"] == df["bytes"].min())]
    pairs = {i: {r["mode"]: r for r in g[g["impl"] == i].to_dict("records")} for i in sorted(set(g["impl"]))}
    pairs = {i: m for i, m in pairs.items() if {"eager", "graph"} <= set(m)}
    if pairs:
        ivs = {i: stats.ratio_interval(time_iv(m["graph"]), time_iv(m["eager"])) for i, m in pairs.items()}
        one = all(v.n <= 1 for v in ivs.values())   # an older run: one median per point, judged over the implementations
        iv = (stats.interval([v.point for v in ivs.values()]) if one else
              Interval(statistics.median(v.point for v in ivs.values()), min(v.lo for v in ivs.values()),
                       max(v.hi for v in ivs.values()), min(v.n for v in ivs.values()), "span of the implementations' intervals"))
        run.judge(H["graph"], iv, evidence="allreduce.csv", detail="; ".join(
            f"{i}: {m['eager']['time_us']:.1f} us eager vs {m['graph']['time_us']:.1f} us graph" for i, m in pairs.items())
            + ("; one median per point recorded: the interval spans the implementations" if one else ""))


def analyse(run, x) -> None:
    """Tables, figure, verdicts and story from the all-reduce rows (x.df: allreduce.csv) and the rank-0 launches
    (x.launches: launches.csv); shared by a GPU run and --reanalyse."""
    df = x.df
    x.tp0 = int(df["tp"].min())
    run.table("allreduce", df)
    run.figure("busbw", plots.sweep(df.assign(series=lambda d: "TP" + d["tp"].astype(str) + " " + d["impl"] + " " + d["mode"]),
                                    x="bytes", y="busbw_gb_s", hue="series", logx=True, ylabel="bus bandwidth (GB/s)",
                                    hline=x.p2p, hline_label="measured GPU0->GPU1 copy", title=f"all-reduce bf16 — {x.name}"))
    e = df[(df["tp"] == x.tp0) & (df["mode"] == "eager")].pivot_table(index="bytes", columns="impl", values="time_us")
    if {"pynccl buffer", "pynccl direct"} <= set(e.columns):
        run.table("copy_overhead", [{"tp": x.tp0, "bytes": int(n), "buffer_us": r["pynccl buffer"],
                                     "direct_us": r["pynccl direct"], "copy_overhead_us": r["pynccl buffer"] - r["pynccl direct"],
                                     "copy_share_pct": 100 * (r["pynccl buffer"] - r["pynccl direct"]) / r["pynccl buffer"],
                                     "two_copies_at_dram_ceiling_us": 2 * 2 * n / (x.dram_tb_s * 1e12) * 1e6}
                                    for n, r in e.iterrows()])
    if x.launches is not None:
        run.table("launches", x.launches)
    x.est = estimate(df, x.tp0, x.analyze)
    run.table("forward_estimate", x.est)
    best = df[df["bytes"] == df["bytes"].max()].sort_values("busbw_gb_s").iloc[-1]
    run.headline(tp_sizes=",".join(map(str, sorted(set(df["tp"])))), p2p_gb_s=x.p2p, best_busbw_gb_s=best["busbw_gb_s"],
                 best_busbw_impl=f"TP{best['tp']} {best['impl']} {best['mode']}")
    judge(run, x)
    run.story(tell(x), echo=True)


def tell(x) -> str:
    df = x.df
    links = {k: v for k, v in (getattr(x, "links", None) or {}).items()}
    pairs = {tuple(sorted(k.split("-"))): v for k, v in links.items()}          # topo -m lists each pair twice
    link = "; ".join(f"{a}-{b} {v}" for (a, b), v in sorted(pairs.items())) or "not recorded"
    items = [(f"{len(x.tps)} TP size(s) on {x.ngpu} x {x.name}; measured GPU0->GPU1 copy "
              f"{x.p2p and round(x.p2p)} GB/s; NVLink multicast off", []),
             (f"topology (nvidia-smi topo -m, the GPUs this run saw): {link}", [])]
    if x.launches is not None:
        first = x.launches[x.launches["call"] == 0]
        items.append(("one call on rank 0 (engine stream, GPU order)", [
            (lb[6:], [(f"#{int(r['order'])} {r['gpu_kind']} {str(r['kernel'])[:60]} {r['dur_us']:.1f} us", [])
                      for r in g.to_dict("records")]) for lb, g in first.groupby("label", sort=False)]))
    for tp in sorted(set(df["tp"])):
        d = df[(df["tp"] == tp) & (df["mode"] == "eager")]
        items.append((f"TP{tp} eager", [(f"{impl}: " + ", ".join(
            f"{int(r.bytes) // KiB if r.bytes < MiB else int(r.bytes) // MiB}{'K' if r.bytes < MiB else 'M'} "
            f"{r.time_us:.0f}us/{r.busbw_gb_s:.0f}GB/s" for r in d[d["impl"] == impl].itertuples()), [])
            for impl in sorted(set(d["impl"]))]))
    if x.est:
        items.append((f"Llama-3.1-8B TP{x.tp0} forward: {x.est[0]['allreduces']} all-reduces", [
            (f"{r['impl']} {r['step']}: {r['message_bytes']:,} B each -> {r['per_forward_us']:.0f} us per forward", [])
            for r in x.est]))
    return story.tree(f"ALL-REDUCE — PyNCCL vs torch NCCL on {x.name}", items)


def seen_links(path: Path, tps, visible: list) -> dict:
    """{"GPU0-GPU1": "NV18", ...} between the GPUs the largest TP size used: the first of ``visible`` (the run's GPUs
    as provenance lists them, each with its host index: `nvidia-smi topo -m` numbers the host's GPUs, which
    CUDA_VISIBLE_DEVICES may pick a few of)."""
    if not path.is_file():
        return {}
    used = {f"GPU{g['index']}" for g in (visible or [])[:max(tps, default=0)] if "index" in g}
    return {k: v for k, v in gpu.parse_topo(path.read_text()).get("links", {}).items() if set(k.split("-")) <= used}


def main_reanalyse(args) -> int:
    """Verdicts and story again from an earlier run's CSVs (no GPU, no ranks)."""
    pd = require_module("pandas")
    src = Path(args.reanalyse).resolve()
    if not (src / "allreduce.csv").exists():
        raise SetupError(f"{src}: no allreduce.csv to re-analyse (written by 05_profile_comm.py)")
    prev = load_summary(src) or {}
    prov, head = prev.get("provenance") or {}, prev.get("headline") or {}
    df = pd.read_csv(src / "allreduce.csv")
    ov = pd.read_csv(src / "copy_overhead.csv") if (src / "copy_overhead.csv").exists() else None
    old = "two_copies_at_measured_peak_us" if ov is not None and "two_copies_at_measured_peak_us" in ov else \
        "two_copies_at_dram_ceiling_us"
    dram = (prov.get("peaks") or {}).get("dram_tb_s") or (   # the recorded two-copies time gives back the ceiling used
        float((4 * ov["bytes"] / (ov[old] * 1e-6) / 1e12).iloc[0]) if ov is not None and len(ov) else math.nan)
    name = prov.get("gpu") or "GPU"
    tps = sorted(set(int(t) for t in df["tp"]))
    x = SimpleNamespace(df=df, p2p=head.get("p2p_gb_s"), link_ds=(gpu.device_spec(name) or {}).get("nvlink_gb_s", 0) / 2
                        or None, nvlink=None, name=name, ngpu=prov.get("gpu_count") or max(tps), tps=tps,
                        analyze=bool((prev.get("args") or {}).get("analyze")), dram_tb_s=dram,
                        launches=launch_table(pd.read_csv(src / "launches.csv")) if (src / "launches.csv").exists() else None,
                        links=seen_links(src / "topology.txt", tps, prov.get("gpus") or []))
    with Run(__file__, args, out=args.out) as run:
        run.reanalysis_of(prev, src)
        for n in prev.get("notes", []):
            if not n.startswith("re-analysed"):
                run.note(n)
        for f in [*src.glob("trace_rank0_tp*.json"), src / "topology.txt"]:
            if f.is_file():
                run.path(f.name).write_bytes(f.read_bytes())
        analyse(run, x)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    # ---- check: GPUs before any rank starts (NVML, no torch), packages, the NCCL environment
    if args.tp:
        cli.check_gpus_for(max(args.tp), f"--tp {max(args.tp)}")
    torch = require_module("torch", "pip install -r requirements.txt")
    ngpu = require_gpu(torch)
    if ngpu < 2 and not args.tp:
        print(f"[skip] 05_profile_comm needs at least two GPUs of one host; {ngpu} visible. Nothing was measured "
              "and earlier results were left as they are (run it on a 2-GPU machine).", flush=True)
        return 0
    tps = args.tp or ([2] if args.quick else [n for n in (2, 4, 8) if n <= ngpu])
    _msgl.require_minisgl("minisgl.kernel")
    env = procs.apply_nccl_env(print)
    sizes = SIZES_QUICK if args.quick else SIZES_FULL
    impls = ("pynccl buffer", "pynccl direct") if args.analyze else IMPLS
    modes = ("eager",) if args.analyze else ("eager", "graph")
    reps, timeout = (20 if args.quick else 50), args.timeout or (300 if args.quick else 900)
    name = torch.cuda.get_device_name(0)
    x = SimpleNamespace(name=name, ngpu=ngpu, tps=tps, analyze=args.analyze, launches=None,
                        link_ds=(gpu.device_spec(name) or {}).get("nvlink_gb_s", 0) / 2 or None)   # per direction
    with Run(__file__, args, out=args.out) as run:
        run.note("NVLink multicast off: " + ", ".join(f"{k}={v}" for k, v in env.items()))
        topo = gpu.topology()
        run.path("topology.txt").write_text(topo.get("text") or "nvidia-smi topo -m unavailable")
        x.links = seen_links(run.path("topology.txt"), tps, gpu.gpus())
        pk = ceilings.peaks()
        x.dram_tb_s, x.nvlink = pk["dram_tb_s"], pk.get("nvlink_busbw_gb_s")
        x.p2p = p2p_bandwidth(torch, run)
        run.log(f"{ngpu} x {name}; measured GPU0->GPU1 copy {x.p2p and f'{x.p2p:.0f} GB/s'}, datasheet NVLink "
                f"{x.link_ds} GB/s per direction; links: {gpu.topology().get('links', {}).get('GPU0-GPU1', '?')}")
        # ---- measure: every TP size in its own ranks
        rows, traces = [], {}
        for tp in tps:
            tpath = str(run.path(f"trace_rank0_tp{tp}.json")) if tp == tps[0] else None
            run.log(f"TP {tp}: {len(impls)} impls x {len(modes)} modes x {len(sizes)} sizes, {reps} samples each "
                    f"(timeout {timeout:.0f} s)")
            try:
                res = _msgl.run_ranks(comm_worker, tp, (sizes, impls, modes, reps, tpath), run.dir / f"ranks_tp{tp}",
                                      timeout_s=timeout, log=run.log)
            except RuntimeError as e:   # one line, the other TP sizes still run
                run.point_error({"tp": tp}, e)
                continue
            traces[tp] = tpath
            rows += point_rows(tp, res, x.p2p, x.link_ds, run)
        if not rows:
            raise RuntimeError("no all-reduce was measured (every TP size failed; see point errors in summary.json)")
        # ---- analyse, verdicts, story
        import pandas as pd
        from common.tables.trace import kernels_in_ranges, read_chrome_trace
        x.df = pd.DataFrame(rows)
        t0 = traces.get(int(x.df["tp"].min()))
        x.launches = kernels_in_ranges(read_chrome_trace(t0), r"^call: ", empty_rows=False) if t0 else None
        analyse(run, x)
    return 0


if __name__ == "__main__":
    run_main(main)
