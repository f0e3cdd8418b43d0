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
    common.timing.bench (fixed sample counts on every rank, so the collectives stay matched; each
    sample is 10 back-to-back calls, so rank skew is amortised). The slowest rank's median defines the time; algbw = bytes / time, busbw = algbw x 2(n-1)/n (NCCL's
    convention), compared with the MEASURED GPU0->GPU1 copy bandwidth (and the datasheet NVLink).
    --analyze  the copy path alone: buffered minus direct time per size (the D2D copies' share), a
               torch.profiler trace on rank 0 showing what one call of each launches (memcpy DtoD,
               the NCCL kernel, memcpy DtoD), and what the all-reduces of one Llama-3.1-8B TP forward
               (2 per layer + 1 for the embedding) cost at decode and prefill sizes.
    NVLink multicast stays off: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
    NVSHMEM_DISABLE_NVLS=1 are set before any NCCL init. A rank that fails or hangs is stopped
    (timeouts on every join); --tp larger than the GPU count is refused with one line.

What the plan expected (hypotheses; A100 figures)
    * All-reduce reaches 85-95% of NVLink bandwidth.
    * The symmetric buffer costs an extra device-to-device copy ("direct peer access" would remove
      it). Reading pynccl.cu:105-123: two copies (in and out) per call whenever the message fits.

Run
    python mini-sglang/scripts/05_profile_comm.py --quick            # ~1-2 min on 2 GPUs: TP 2, 4 sizes
    python mini-sglang/scripts/05_profile_comm.py                    # TP 2/4/8 as GPUs allow, 9 sizes
    python mini-sglang/scripts/05_profile_comm.py --tp 2 4           # chosen TP sizes
    python mini-sglang/scripts/05_profile_comm.py --analyze          # only the copy-path analysis
    python mini-sglang/scripts/05_profile_comm.py --reanalyse DIR --out OUT   # no GPU: verdicts again from DIR's CSVs
    nsys profile --trace=cuda,nvtx --sample=none --cpuctxsw=none -o /tmp/comm \
        python mini-sglang/scripts/05_profile_comm.py --quick --analyze   # every rank's timeline
Writes mini-sglang/results/05_profile_comm/: allreduce.csv, copy_overhead.csv, forward_estimate.csv,
launches.csv, busbw.png, trace_rank0_tp<N>.json, story.txt, summary.json.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import gpu, models, plots, story  # noqa: E402
from common.checks import SetupError, require_gpu, require_module, run_main  # noqa: E402
from common.results import Run  # noqa: E402
from common.timing import bench  # noqa: E402
import _msgl  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
SIZES_FULL = (4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB)
SIZES_QUICK = (8 * KiB, 256 * KiB, 8 * MiB, 64 * MiB)
IMPLS = ("pynccl buffer", "pynccl direct", "torch nccl")
TRACE_SIZES = (64 * KiB, 64 * MiB)   # a decode-sized and a prefill-sized message
CALLS = 10                           # back-to-back calls per timed sample: rank skew and launch gaps amortised


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="TP 2, 4 sizes, fewer samples (~1-2 min)")
    p.add_argument("--analyze", action="store_true", help="only the copy-path analysis (buffered vs direct, trace)")
    p.add_argument("--tp", type=int, nargs="+", default=None, help="TP sizes (default: 2, 4, 8 as GPUs allow)")
    p.add_argument("--timeout", type=float, default=None, help="seconds before hung ranks are stopped")
    p.add_argument("--out", default=None, help="results folder (default mini-sglang/results/05_profile_comm)")
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
        from common.ranges import nvtx_range
        from torch.profiler import ProfilerActivity, profile
        xs = {n: torch.zeros(n // 2, dtype=torch.bfloat16, device="cuda") for n in TRACE_SIZES}
        dist.barrier()
        if rank == 0:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for impl in impls:
                    for n, x in xs.items():
                        with nvtx_range(f"call: {impl} {n} B"):
                            calls[impl](x)
                torch.cuda.synchronize()
            prof.export_chrome_trace(trace_path)
        else:
            for impl in impls:
                for n, x in xs.items():
                    calls[impl](x)
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
                    rows.append({"impl": impl, "mode": mode, "bytes": n, "calls_per_sample": CALLS, **t.to_dict()})
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


def interp_us(df, n):
    """Log-log interpolation of the measured time at message size n."""
    pts = sorted(zip(df["bytes"], df["time_us"]))
    lo = max((p for p in pts if p[0] <= n), default=pts[0])
    hi = min((p for p in pts if p[0] >= n), default=pts[-1])
    if lo[0] == hi[0]:
        return lo[1]
    f = (math.log(n) - math.log(lo[0])) / (math.log(hi[0]) - math.log(lo[0]))
    return math.exp(math.log(lo[1]) + f * (math.log(hi[1]) - math.log(lo[1])))


def analyse(run, df, launches: list, p2p, link_ds, name: str, ngpu: int, tps, analyze: bool, dram_tb_s: float) -> None:
    """Tables, figure, verdicts and story from the all-reduce rows (``df``: allreduce.csv) and the
    launches of the traced calls on rank 0 (launches.csv); shared by a GPU run and --reanalyse."""
    run.table("allreduce", df)
    run.figure("busbw", plots.sweep(df.assign(series=lambda x: "TP" + x["tp"].astype(str) + " " + x["impl"] + " " + x["mode"]),
                                    x="bytes", y="busbw_gb_s", hue="series", logx=True, ylabel="bus bandwidth (GB/s)",
                                    hline=p2p, hline_label="measured GPU0->GPU1 copy",
                                    title=f"all-reduce bf16 — {name}"))

    # ---- copy path: buffered minus direct, per size (eager)
    tp0 = int(df["tp"].min())
    e = df[(df["tp"] == tp0) & (df["mode"] == "eager")].pivot_table(index="bytes", columns="impl", values="time_us")
    ov = []
    if {"pynccl buffer", "pynccl direct"} <= set(e.columns):
        for n, r in e.iterrows():
            ov.append({"tp": tp0, "bytes": int(n), "buffer_us": r["pynccl buffer"], "direct_us": r["pynccl direct"],
                       "copy_overhead_us": r["pynccl buffer"] - r["pynccl direct"],
                       "copy_share_pct": 100 * (r["pynccl buffer"] - r["pynccl direct"]) / r["pynccl buffer"],
                       "two_copies_at_measured_peak_us": 2 * 2 * n / (dram_tb_s * 1e12) * 1e6})
        run.table("copy_overhead", ov)
    if launches:
        run.table("launches", launches)
    # ---- what one Llama-3.1-8B forward's all-reduces cost (2 per layer + embedding)
    cfg = models.config("llama-3.1-8b")
    n_ar = 2 * cfg["num_hidden_layers"] + 1
    est = []
    for impl in ("pynccl buffer", "pynccl direct", "torch nccl"):
        d = df[(df["tp"] == tp0) & (df["impl"] == impl) & (df["mode"] == ("graph" if not analyze else "eager"))]
        if not len(d):
            continue
        for label, tokens in (("decode bs=1", 1), ("decode bs=32", 32), ("decode bs=256", 256), ("prefill 8192", 8192)):
            n = tokens * cfg["hidden_size"] * 2
            t = interp_us(d, n)
            est.append({"impl": impl, "step": label, "message_bytes": n, "allreduces": n_ar, "per_call_us": t,
                        "per_forward_us": n_ar * t})
    run.table("forward_estimate", est)

    # ---- verdicts
    big = df[df["bytes"] == df["bytes"].max()]
    best = big.sort_values("busbw_gb_s").iloc[-1]
    run.headline(tp_sizes=",".join(map(str, sorted(set(df["tp"])))), p2p_gb_s=p2p, best_busbw_gb_s=best["busbw_gb_s"],
                 best_busbw_impl=f"TP{best['tp']} {best['impl']} {best['mode']}")
    ref = p2p or link_ds
    run.observe("all-reduce reaches 85-95% of NVLink bandwidth (large messages)",
                f"best busbw {best['busbw_gb_s']:.0f} GB/s at {int(best['bytes']) // MiB} MiB (TP{best['tp']} {best['impl']} "
                f"{best['mode']}) = {100 * best['busbw_gb_s'] / ref:.0f}% of the measured GPU0->GPU1 copy"
                + (f", {100 * best['busbw_gb_s'] / link_ds:.0f}% of the datasheet link" if link_ds else ""),
                "confirmed" if best["busbw_gb_s"] >= 0.85 * ref else "refuted", "allreduce.csv")
    if launches:
        per = {}
        for r in launches:
            per.setdefault(r["range"], []).append(r)
        d2d = lambda v: sum(1 for r in v if r["kind"] == "memcpy" and "DtoD" in str(r["name"]))  # noqa: E731
        setup = lambda v: sum(1 for r in v if r["kind"] in ("memcpy", "memset") and "DtoD" not in str(r["name"]))  # noqa: E731
        nb = [d2d(v) for k, v in per.items() if "pynccl buffer" in k]
        nd = [d2d(v) for k, v in per.items() if "pynccl direct" in k]
        first = {k: setup(v) for k, v in per.items() if setup(v)}
        run.observe("the symmetric buffer adds device-to-device copies around every all-reduce (code: two)",
                    f"DtoD memcpy per call: buffered {nb}, direct {nd} (rank 0 trace)" + (
                        "; the first traced call of a communicator also ran one-time host-to-device copies/memsets (NCCL "
                        "setup): " + ", ".join(f"{k[6:]} {n}" for k, n in first.items()) if first else ""),
                    "confirmed" if nb and all(x == 2 for x in nb) and all(x == 0 for x in nd) else "refuted", "launches.csv")
    if ov:
        small, large = ov[0], ov[-1]
        run.observe("the copies' share is largest for decode-sized messages",
                    f"copy share {small['copy_share_pct']:.0f}% at {small['bytes'] // KiB} KiB vs "
                    f"{large['copy_share_pct']:.0f}% at {large['bytes'] // MiB} MiB (eager, TP{tp0})",
                    "confirmed" if small["copy_share_pct"] > large["copy_share_pct"] else "refuted", "copy_overhead.csv")
    g = df[(df["tp"] == tp0) & (df["bytes"] == df["bytes"].min())].pivot_table(index="impl", columns="mode", values="time_us")
    if "graph" in g.columns:
        run.observe("CUDA-graph replay lowers small-message latency (the engine replays decode)",
                    "; ".join(f"{i}: {r['eager']:.1f} us eager vs {r['graph']:.1f} us graph" for i, r in g.iterrows()),
                    "confirmed" if (g["graph"] < g["eager"]).all() else "refuted", "allreduce.csv")

    # ---- story
    items = [(f"{len(tps)} TP size(s) on {ngpu} x {name}; measured GPU0->GPU1 copy "
              f"{p2p and round(p2p)} GB/s; NVLink multicast off", [])]
    if launches:
        per = {}
        for r in launches:
            per.setdefault(r["range"][6:], []).append(r)
        items.append(("one call on rank 0 (engine stream, GPU order)", [
            (k, [(f"#{r['order']} {r['kind']} {r['short'][:60]} {r['dur_us']:.1f} us", []) for r in v]) for k, v in per.items()]))
    for tp in sorted(set(df["tp"])):
        d = df[(df["tp"] == tp) & (df["mode"] == "eager")]
        items.append((f"TP{tp} eager", [(f"{impl}: " + ", ".join(
            f"{int(r.bytes) // KiB if r.bytes < MiB else int(r.bytes) // MiB}{'K' if r.bytes < MiB else 'M'} "
            f"{r.time_us:.0f}us/{r.busbw_gb_s:.0f}GB/s" for r in d[d["impl"] == impl].itertuples()), [])
            for impl in sorted(set(d["impl"]))]))
    if est:
        items.append((f"Llama-3.1-8B TP{tp0} forward: {n_ar} all-reduces", [
            (f"{r['impl']} {r['step']}: {r['message_bytes']:,} B each -> {r['per_forward_us']:.0f} us per forward", [])
            for r in est]))
    run.story(story.tree(f"ALL-REDUCE — PyNCCL vs torch NCCL on {name}", items))
    print(run.summary["story"])


def main_reanalyse(args) -> int:
    """Verdicts and story again from an earlier run's CSVs (no GPU, no ranks)."""
    import json
    pd = require_module("pandas")
    src = Path(args.reanalyse).resolve()
    if not (src / "allreduce.csv").exists():
        raise SetupError(f"{src}: no allreduce.csv to re-analyse (written by 05_profile_comm.py)")
    prev = json.loads((src / "summary.json").read_text()) if (src / "summary.json").exists() else {}
    prov, head = prev.get("provenance") or {}, prev.get("headline") or {}
    df = pd.read_csv(src / "allreduce.csv")
    launches = pd.read_csv(src / "launches.csv").to_dict("records") if (src / "launches.csv").exists() else []
    name = prov.get("gpu") or "GPU"
    link_ds = (gpu.device_spec(name) or {}).get("nvlink_gb_s", 0) / 2 or None
    peaks = prov.get("peaks") or {}
    ov = pd.read_csv(src / "copy_overhead.csv") if (src / "copy_overhead.csv").exists() else None
    dram = peaks.get("dram_tb_s") or (
        # the recorded two-copies time gives back the copy bandwidth the run measured
        float((4 * ov["bytes"] / (ov["two_copies_at_measured_peak_us"] * 1e-6) / 1e12).iloc[0]) if ov is not None and len(ov) else math.nan)
    with Run(__file__, args, out=args.out) as run:
        run.reanalysis_of(prev, src)
        for n in prev.get("notes", []):
            if not n.startswith("re-analysed"):
                run.note(n)
        for f in src.glob("trace_rank0_tp*.json"):
            run.path(f.name).write_bytes(f.read_bytes())
        tps = sorted(set(int(t) for t in df["tp"]))
        analyse(run, df, launches, head.get("p2p_gb_s"), link_ds, name, prov.get("gpu_count") or max(tps), tps,
                bool((prev.get("args") or {}).get("analyze")), dram)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    torch = require_module("torch", "pip install -r requirements.txt")
    ngpu = require_gpu(torch)
    if ngpu < 2 and not args.tp:
        print(f"[skip] 05_profile_comm needs at least two GPUs of one host; {ngpu} visible. Nothing was measured "
              "and earlier results were left as they are (run it on a 2-GPU machine).", flush=True)
        return 0
    tps = args.tp or ([2] if args.quick else [n for n in (2, 4, 8) if n <= ngpu])
    too_big = [n for n in tps if n > ngpu or n < 2]
    if too_big:
        raise SetupError(f"--tp {too_big[0]} needs {too_big[0]} GPUs (and at least 2); {ngpu} visible")
    _msgl.require_minisgl("minisgl.kernel")
    _msgl.apply_nccl_safe_env(print)
    sizes = SIZES_QUICK if args.quick else SIZES_FULL
    impls = ("pynccl buffer", "pynccl direct") if args.analyze else IMPLS
    modes = ("eager",) if args.analyze else ("eager", "graph")
    reps = 20 if args.quick else 50
    timeout = args.timeout or (300 if args.quick else 900)
    with Run(__file__, args, out=args.out) as run:
        run.note("NVLink multicast off: " + ", ".join(f"{k}={v}" for k, v in _msgl.NCCL_SAFE_ENV.items()))
        name = torch.cuda.get_device_name(0)
        spec = gpu.device_spec(name) or {}
        link_ds = spec.get("nvlink_gb_s", 0) / 2 or None     # datasheet: per direction
        p2p = p2p_bandwidth(torch, run)
        run.log(f"{ngpu} x {name}; measured GPU0->GPU1 copy {p2p and f'{p2p:.0f} GB/s'}, datasheet NVLink "
                f"{link_ds} GB/s per direction; links: {gpu.topology().get('links', {}).get('GPU0-GPU1', '?')}")
        rows, traces = [], {}
        for tp in tps:
            trace = str(run.path(f"trace_rank0_tp{tp}.json")) if tp == tps[0] else None
            run.log(f"TP {tp}: {len(impls)} impls x {len(modes)} modes x {len(sizes)} sizes, {reps} samples each "
                    f"(timeout {timeout:.0f} s)")
            try:
                res = _msgl.run_ranks(comm_worker, tp, (sizes, impls, modes, reps, trace), run.dir / f"ranks_tp{tp}",
                                      timeout_s=timeout, log=run.log)
            except RuntimeError as e:   # one line, the other TP sizes still run
                run.point_error({"tp": tp}, e)
                continue
            traces[tp] = trace
            for i, r0 in enumerate(res[0]):
                if "error" in r0:
                    run.point_error({"tp": tp, "impl": r0["impl"], "mode": r0["mode"], "bytes": r0["bytes"]},
                                    RuntimeError(r0["error"]))
                    continue
                t_us = max(rr[i].get("median_ms", 0) for rr in res) * 1e3 / CALLS     # the slowest rank, per call
                alg, bus = _msgl.bus_bandwidth(r0["bytes"], t_us / 1e6, tp)
                rows.append({"tp": tp, "impl": r0["impl"], "mode": r0["mode"], "bytes": r0["bytes"], "time_us": t_us,
                             "spread_pct": r0["spread_pct"], "algbw_gb_s": alg, "busbw_gb_s": bus,
                             "pct_p2p_measured": 100 * bus / p2p if p2p else None,
                             "pct_nvlink_datasheet": 100 * bus / link_ds if link_ds else None})
        if not rows:
            raise RuntimeError("no all-reduce was measured (every TP size failed; see point errors in summary.json)")
        import pandas as pd
        df = pd.DataFrame(rows)
        tp0 = int(df["tp"].min())
        launches = _msgl.launches_by_range(traces[tp0], r"^call: ") if traces.get(tp0) else []
        analyse(run, df, launches, p2p, link_ds, name, ngpu, tps, args.analyze, gpu.peaks()["dram_tb_s"])
    return 0


if __name__ == "__main__":
    run_main(main)
