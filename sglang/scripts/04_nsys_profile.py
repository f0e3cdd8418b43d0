#!/usr/bin/env python3
"""04 · A system timeline of a serving run, and where the GPU waits (Nsight Systems, else the torch profiler).

What it measures
    One SGLang server (SGLang's default CUDA graphs for prefill and decode) serves a burst of requests
    (prefill, then steady decode). The timeline comes from Nsight Systems when it is usable here
    (common.capture.nsys.find()): the server runs under `nsys profile --trace=cuda,nvtx --sample=none
    --cpuctxsw=none --cuda-graph-trace=node --trace-fork-before-exec=true --capture-range=cudaProfilerApi`,
    SGLang's scheduler NVTX ranges are on (SGLANG_ENABLE_NVTX_SCHEDULER=1), and /start_profile
    {"activities": ["CUDA_PROFILER"]} opens the capture window around the burst. Without nsys (or with
    --torch) the same window is recorded by the torch profiler through /start_profile (CPU + GPU).
    From either timeline: the kernel table (time, launches, share, class), GPU busy fraction over the
    window and over its steady-decode middle, the idle gaps between kernels, and for each gap the
    scheduler phase the CPU was in (recv_requests, get_next_batch_to_run, run_batch,
    process_batch_result): CPU scheduling overhead vs idle time, in the story. Judged quantities are
    measured per slice of the window (5 equal slices; the busy fraction over 5 slices of the steady
    middle). The full run repeats the burst with --disable-overlap-schedule.
    Then, on the first server once its timeline is written, the GPU's own counters over the served timeline: the
    burst (streamed) untraced 3 times, then once more while Nsight Systems samples the GPU's performance monitors
    (common.capture.nsys.GpuMetrics: a separate nsys process, system scope, nothing more injected into the server):
    SMs active, tensor active, DRAM read and write, 10 kHz, kept in 1 ms bins. The sampled burst's TTFT and ITL
    beside the untraced median is what the sampling costs; without a usable nsys (or where it refuses to sample)
    the story says why.

What the plan expected (hypotheses in H below, with ranges and sources)
    * FlashInfer kernels dominate GPU time (A100). Restated: at moderate batch, decode GPU time
      is dominated by GEMMs (weights read once per step), not attention.
    * Prefill and decode kernel selection is clearly separated (a fact of names: observed, not judged).
    * With the overlap scheduler and CUDA graphs the GPU gaps between decode steps are small;
      with --disable-overlap-schedule they grow by the scheduler's CPU time.

Run
    python sglang/scripts/04_nsys_profile.py --quick       # ~1.5 min (or ./sglang/scripts/04_nsys_profile.sh)
    python sglang/scripts/04_nsys_profile.py               # + overlap-off comparison
    python sglang/scripts/04_nsys_profile.py --torch       # torch profiler even where nsys works
    python sglang/scripts/04_nsys_profile.py --reanalyse sglang/results/04_nsys_profile   # no GPU: redo the analysis
Writes sglang/results/04_nsys_profile/: kernels.csv, families.csv, gaps.csv, gaps_by_phase.csv,
windows.csv, slices.csv, timeline_<cfg>.nsys-rep + timeline_<cfg>_*.csv (nsys) or profiles/ (torch),
gpu_metrics_runs.csv (the bursts of the metrics pass), gpu_metrics.csv + gpu_metrics.png (the sampled counters),
server_*.log, story.txt, summary.json.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sglang as sg  # noqa: E402
from common.base import story  # noqa: E402
from common.base.checks import require_modules, run_main, SetupError  # noqa: E402
from common.capture import nsys  # noqa: E402
from common.capture.store import load_summary  # noqa: E402
from common.tables import trace  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.run import cli  # noqa: E402
from common.run.results import Run  # noqa: E402

QUICK = dict(burst=16, prompt=512, new=64)
FULL = dict(burst=64, prompt=1024, new=128)
SLICES = 5       # the window (and its steady middle) cut into this many equal slices: the repetitions
PHASES = ("scheduler.recv_requests", "scheduler.process_input_requests", "scheduler.get_next_batch_to_run",
          "scheduler.run_batch", "scheduler.process_batch_result")
GRAPH_MIN = 50   # kernels sharing one correlation id: one CUDA-graph replay (a whole decode step)
PLAN = "PLAN.md Session 1 and sglang/reports/plan.md, experiment 04"
H = declare(f"""
    attention = attention-dominates: attention (FlashInfer) kernels dominate GPU time (A100 plan; restated: GEMMs
            dominate at moderate batch)
        judged on: attention kernel time / GEMM kernel time (per slice of the window)
        confirmed: >= 1
        source: {PLAN}: 'FlashInfer kernels dominate GPU time' (A100)
    busy = steady-decode-busy: with overlap scheduling and CUDA graphs the GPU is rarely idle in steady decode
        judged on: GPU busy % (per slice of the steady middle of the window)
        confirmed: [90, 100]%
        source: {PLAN}: 'with overlap scheduling the GPU gaps between decode steps are a small fraction of a step'
    overlap = overlap-off-gaps: --disable-overlap-schedule turns the scheduler's CPU time into GPU idle gaps
        judged on: steady busy % with overlap on - with it off (per slice pair)
        confirmed: >= 2 pp
        source: {PLAN}: 'with --disable-overlap-schedule they grow by the scheduler's CPU time'
""")


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="a smaller burst, overlap on only (~1.5 min)")
    p.add_argument("--torch", action="store_true", help="use the torch profiler even where nsys works")
    p.add_argument("--overlap-off", action="store_true", help="also run with --disable-overlap-schedule (on in full)")
    p.add_argument("--reanalyse", metavar="DIR", default=None,
                   help="no GPU, no server: redo the analysis from the nsys CSVs an earlier run left in DIR "
                        "(e.g. a copy of sglang/results/04_nsys_profile)")
    sg.add_model_args(p)
    return p.parse_args(argv)


# ------------------------------------------------------------------ analysis of one timeline (no GPU)

def phase_name(n: str) -> str:
    """An NVTX range name as nsys prints it ('domain:name', ':name' or 'name') -> a PHASES name."""
    return next((p for p in PHASES if n.endswith(p)), n)


def cpu_phase_at(ranges, t_us: float) -> str:
    """The innermost scheduler range (CPU) that covers time ``t_us``, or 'none'."""
    inside = ranges[(ranges["ts_us"] <= t_us) & (ranges["end_us"] >= t_us)]
    if inside.empty:
        return "none"
    return inside.sort_values("dur_us").iloc[0]["name"]


def phase_attention(k, t0: float, t1: float, mid0: float) -> tuple[set, set, str]:
    """Attention kernels of prefill vs decode steps.

    Decode steps replay one CUDA graph: all their kernels carry the correlation id of that one
    cudaGraphLaunch (nsys --cuda-graph-trace=node, and the torch profiler alike). Prefill attention
    runs eagerly (SGLang's piecewise prefill graphs leave attention out), one correlation id per
    kernel. So: attention inside a graph replay = decode, attention outside = prefill (and any
    eager decode step). Without graph replays fall back to time: the first 10% of the window vs
    after its first quarter (good only when prefill and decode do not overlap)."""
    att = k[k["class"] == "attention"]
    corr = k["correlation"] if "correlation" in k.columns else None
    if corr is not None and corr.notna().any():
        in_graph = k.groupby("correlation")["short"].transform("size") >= GRAPH_MIN
        if in_graph.any():
            return (set(att[~in_graph.loc[att.index]]["short"]), set(att[in_graph.loc[att.index]]["short"]),
                    f"CUDA-graph replays (>= {GRAPH_MIN} kernels per launch) = decode; eager = prefill")
    early = set(att[att["ts_us"] < t0 + 0.1 * (t1 - t0)]["short"])
    late = set(att[att["ts_us"] > mid0]["short"])
    return early, late, "time: first 10% of the window vs after its first quarter"


def slice_figures(k, a: float, b: float) -> dict:
    """GPU busy % and attention/GEMM kernel time of the kernels starting in [a, b)."""
    inside = k[(k["end_us"] > a) & (k["ts_us"] < b)]
    start = k[(k["ts_us"] >= a) & (k["ts_us"] < b)]
    by = start.groupby("class")["dur_us"].sum()
    g = float(by.get("gemm", 0.0))
    return {"busy_pct": 100 * trace.busy_fraction(inside, a, b) if len(inside) else 0.0,
            "attention_over_gemm": float(by.get("attention", 0.0)) / g if g else float("nan")}


def analyse(k, ranges, label: str) -> dict:
    """Kernel table, classes, gaps and their CPU phase, per-slice figures for one timeline (``k``: kernels)."""
    k = k.sort_values("ts_us").reset_index(drop=True)
    k["class"] = k["short"].map(trace.kernel_class)
    t0, t1 = float(k["ts_us"].min()), float(k["end_us"].max())
    mid0, mid1 = t0 + 0.25 * (t1 - t0), t0 + 0.75 * (t1 - t0)
    g = trace.gaps(k, min_us=0.0)
    g["phase"] = [cpu_phase_at(ranges, s + d / 2) if d >= 20 else "-" for s, d in zip(g["start_us"], g["gap_us"])] \
        if len(ranges) else "n/a"
    g["config"] = label
    summ = trace.kernel_summary(k)
    summ["class"] = summ["short"].map(trace.kernel_class)
    summ["config"] = label
    cls = k.groupby("class")["dur_us"].sum().sort_values(ascending=False)
    pre_att, dec_att, split_by = phase_attention(k, t0, t1, mid0)
    steady = k[(k["ts_us"] >= mid0) & (k["end_us"] <= mid1)]
    big = g[g["gap_us"] >= 20]
    by_phase = big.groupby("phase")["gap_us"].agg(["count", "sum"]).reset_index().rename(
        columns={"count": "gaps", "sum": "idle_us"}) if len(big) else None
    cut = lambda lo, hi: [(lo + i * (hi - lo) / SLICES, lo + (i + 1) * (hi - lo) / SLICES) for i in range(SLICES)]  # noqa: E731
    whole = [slice_figures(k, a, b) for a, b in cut(t0, t1)]
    mid = [slice_figures(k, a, b) for a, b in cut(mid0, mid1)]
    return {"config": label, "window_ms": (t1 - t0) / 1e3, "kernels": len(k), "busy": trace.busy_fraction(k),
            "busy_steady": trace.busy_fraction(steady, mid0, mid1) if len(steady) else float("nan"),
            "idle_ms": float(g["gap_us"].sum()) / 1e3, "gaps_over_20us": int(len(big)),
            "idle_in_gaps_over_20us_ms": float(big["gap_us"].sum()) / 1e3,
            "classes": cls, "summary": summ, "gaps": g, "by_phase": by_phase,
            "prefill_only_attention": sorted(pre_att - dec_att), "decode_attention": sorted(dec_att), "split_by": split_by,
            "att_over_gemm": [s["attention_over_gemm"] for s in whole], "busy_slices": [s["busy_pct"] for s in mid],
            "k": k, "mid": (mid0, mid1), "ranges": ranges}


def load_nsys_csvs(gpu_trace_csv, nvtx_csv=None):
    """Kernel events and scheduler ranges from `nsys stats` CSVs (cuda_gpu_trace, nvtx_pushpop_trace)."""
    k = trace.read_nsys_csv(gpu_trace_csv)
    k = k[~k["name"].astype(str).str.startswith("[CUDA")]          # memcpy / memset rows
    ranges = trace.read_nsys_csv(nvtx_csv) if nvtx_csv and Path(nvtx_csv).exists() else k.iloc[0:0]
    ranges = ranges.assign(name=ranges["name"].astype(str).map(phase_name))
    return k, ranges[ranges["name"].isin(PHASES)]


def reanalyse(folder: Path) -> list[dict]:
    """The analysis again, from the `nsys stats` CSVs an earlier run left in ``folder`` (no GPU)."""
    import pandas as pd
    old = pd.read_csv(folder / "windows.csv") if (folder / "windows.csv").exists() else None
    res = []
    for label in ("overlap_on", "overlap_off"):
        gt = folder / f"timeline_{label}_cuda_gpu_trace.csv"
        if not gt.exists():
            continue
        a = analyse(*load_nsys_csvs(gt, folder / f"timeline_{label}_nvtx_pushpop_trace.csv"), label)
        tp = old[old["config"] == label]["throughput"] if old is not None and "throughput" in old else []
        a.update(tool="nsys", throughput=float(tp.iloc[0]) if len(tp) else float("nan"))
        res.append(a)
    if not res:
        raise SetupError(f"{folder}: no timeline_<config>_cuda_gpu_trace.csv to re-analyse (written by an nsys run of "
                         "04_nsys_profile.py)")
    return res


# ------------------------------------------------------------------ measure

def wait_file(path: Path, timeout: float, still_s: float = 3.0) -> bool:
    """True once ``path`` exists and its size has not changed for ``still_s`` seconds."""
    t0, last, since = time.time(), -1, time.time()
    while time.time() - t0 < timeout:
        size = path.stat().st_size if path.exists() else -1
        if size != last:
            last, since = size, time.time()
        elif size > 0 and time.time() - since >= still_s:
            return True
        time.sleep(0.5)
    return False


def burst(srv, P, stream: bool = False):
    return srv.generate_many([{"input_ids": sg.random_ids(P["prompt"], 5000 + i),
                               "sampling_params": {**sg.GREEDY, "max_new_tokens": P["new"]}} for i in range(P["burst"])],
                             stream=stream)


METRICS_REPS = 3     # untraced bursts the sampled one is compared with


def burst_row(res, run_name: str, rep: int) -> dict:
    """One streamed burst of the metrics pass: client TTFT and ITL medians, its window (epoch s)."""
    s = sg.latency_summary(res)
    ok = [r["client"] for r in res if "error" not in r]
    return {"run": run_name, "rep": rep, "ttft_ms": s.get("p50_ttft_ms"), "itl_ms": s.get("p50_itl_ms"),
            "wall_s": s.get("wall_s"), "t_send": min((c["t_send"] for c in ok), default=None),
            "t_done": max((c["t_done"] for c in ok), default=None), "failed": s.get("failed")}


def metrics_pass(srv, P, run) -> dict:
    """The GPU's own counters over the served timeline: METRICS_REPS untraced streamed bursts, then one more while
    Nsight Systems samples the GPU (common.capture.nsys.GpuMetrics: never raises; ``why`` says what kept it from
    sampling). Returns {"runs": the bursts' rows (the sampled one with the sampling's t0 and why), "rows": the
    samples in 1 ms bins (absent when none)}."""
    runs = [burst_row(burst(srv, P, stream=True), "untraced", i) for i in range(METRICS_REPS)]
    with nsys.GpuMetrics(run.dir / "nsys", echo=run.log, max_s=120) as gm:
        res = burst(srv, P, stream=True)
    runs.append({**burst_row(res, "sampled", 0), "t0": gm.t0, "why": gm.why})
    if gm.rows is None:
        run.note(f"GPU metrics over the served timeline: not sampled ({gm.why or 'no samples'})")
        return {"runs": runs}
    b = gm.rows.assign(t_s=(gm.rows["t_s"] * 1e3).round() / 1e3).groupby("t_s").mean().reset_index()
    run.log(f"GPU metrics: {len(gm.rows):,} samples over {b['t_s'].max():.1f} s; burst TTFT {runs[-1]['ttft_ms']:.1f} ms, "
            f"ITL {runs[-1]['itl_ms']:.2f} ms while sampling")
    return {"runs": runs, "rows": b.to_dict("records")}


def metrics_lines(gm) -> list:
    """The story's lines of the metrics pass: what the sampling cost the burst (TTFT, ITL against the untraced
    median) and what the counters read while the burst's requests ran."""
    f = story.fmt
    runs = gm.get("runs") or []
    sampled = next((r for r in runs if r["run"] == "sampled"), None)
    if sampled is None:
        return []
    if not gm.get("rows"):
        return [(f"GPU metrics over the served timeline: not sampled ({sampled.get('why') or 'no samples'})", [])]
    base = [r for r in runs if r["run"] == "untraced"]
    base_t, base_i = statistics.median(r["ttft_ms"] for r in base), statistics.median(r["itl_ms"] for r in base)
    rows, t0 = gm["rows"], sampled.get("t0")
    inside = [r for r in rows if t0 and sampled.get("t_send") and sampled["t_send"] - t0 <= r["t_s"] <= sampled["t_done"] - t0]
    mean = lambda col: statistics.fmean(r[col] for r in inside if r.get(col) is not None) if inside and col in inside[0] \
        else None  # noqa: E731
    return [(f"burst with nsys GPU-metrics sampling (10 kHz, nothing injected into the server): TTFT "
             f"{f(sampled['ttft_ms'])} ms vs {f(base_t)} untraced ({f(100 * (sampled['ttft_ms'] / base_t - 1))}%), ITL "
             f"{f(sampled['itl_ms'])} vs {f(base_i)} ms ({f(100 * (sampled['itl_ms'] / base_i - 1))}%); while the requests "
             f"ran: SMs active {f(mean('sm_active_pct'))}%, tensor active {f(mean('tensor_active_pct'))}%, DRAM read "
             f"{f(mean('dram_read_pct'))}% and write {f(mean('dram_write_pct'))}% of peak (gpu_metrics.csv, figure "
             "gpu_metrics)", [])]


def metrics_figure(gm, gpu: str):
    """The GPU's own counters over the served burst (nsys GPU metrics, 1 ms bins): SM active, tensor active, DRAM
    read and write, with the requests' window shaded (epoch clock; the sampling began at the sampled run's t0)."""
    from common.render.plots import _plt
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3.4))
    rows = gm["rows"]
    sampled = next(r for r in gm["runs"] if r["run"] == "sampled")
    t = [r["t_s"] for r in rows]
    for col, label, color in (("sm_active_pct", "SMs active", "tab:blue"), ("tensor_active_pct", "tensor active", "tab:red"),
                              ("dram_read_pct", "DRAM read", "tab:green"), ("dram_write_pct", "DRAM write", "tab:olive")):
        if col in rows[0]:
            ax.plot(t, [r.get(col) for r in rows], lw=0.8, label=label, color=color)
    if sampled.get("t_send") and sampled.get("t0"):
        ax.axvspan(sampled["t_send"] - sampled["t0"], sampled["t_done"] - sampled["t0"], color="grey", alpha=0.12,
                   label="the burst's requests")
    ax.set_xlabel("time since the sampling began (s)")
    ax.set_ylabel("% of peak (nsys GPU metrics)")
    ax.set_title(f"{gpu}: the GPU's counters over a served burst of {len(rows):,} 1 ms bins", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    return fig


def run_config(args, P, label, extra, model_dir, base, run, use_nsys, metrics: bool = False) -> dict:
    """One server (under nsys, or with the torch profiler), a warm-up, the profiled burst, its analysis; with
    ``metrics``, then the metrics pass on the same server (metrics_pass: ``gpu_metrics`` of the result)."""
    fl = base + sg.flags(attention_backend=args.backend, log_level="info", decode_log_interval=1) + extra
    env, wrapper, rep = dict(sg.TRACE_ENV), [], None
    prof_dir = run.dir / "profiles"
    if use_nsys:
        rep = run.dir / f"timeline_{label}"
        wrapper = [nsys.find(), "profile", "-o", str(rep), "-f", "true", *nsys.DEFAULT_FLAGS,
                   "--trace-fork-before-exec=true", "--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
        env["SGLANG_ENABLE_NVTX_SCHEDULER"] = "1"
    # nsys writes the report when the capture range ends (--capture-range-end=stop), while the server
    # keeps running: the report is awaited below, so stopping the server needs little patience
    with sg.Server(model_dir, fl, port=args.port, log_path=run.path(f"server_{label}.log"), echo=run.log, wrapper=wrapper,
                   start_timeout=args.start_timeout, env=env, name=f"server[{label}]", wrapper_stop_timeout=90) as srv:
        run.headline(**{f"server_start_s_{label}": round(srv.startup_s, 1)})
        out = srv.generate(input_ids=sg.random_ids(32, 1), sampling_params={"max_new_tokens": 4, "temperature": 0})
        if out["meta_info"]["completion_tokens"] != 4:
            raise RuntimeError(f"sanity request returned {out['meta_info']['completion_tokens']} tokens, expected 4")
        run.log("sanity: 4 tokens back ✅  All results match. Starting the profiled burst.")
        burst(srv, {**P, "burst": 4})                       # warm the shapes outside the window
        if use_nsys:
            srv.start_profile(prof_dir, activities=["CUDA_PROFILER"])
            s = sg.latency_summary(burst(srv, P))
            srv.stop_profile()
        else:
            (tr, *_), res = srv.traced(prof_dir, lambda: burst(srv, P))
            s = sg.latency_summary(res)
        run.log(f"{label}: burst of {P['burst']} x ({P['prompt']} in, {P['new']} out) in {s['wall_s']:.2f} s, "
                f"{s['output_throughput']:.0f} out tok/s")
        if use_nsys:
            rep_file = rep.with_suffix(".nsys-rep")
            if not wait_file(rep_file, timeout=300):
                raise RuntimeError(f"nsys wrote no {rep_file.name}; see server_{label}.log (or rerun with --torch)")
            run.log(f"{label}: nsys wrote {rep_file.name} ({rep_file.stat().st_size / 1e6:.1f} MB)")
        gm = None
        if metrics:        # after the timeline's capture range has ended (its report written): its nsys collects no more
            try:
                gm = metrics_pass(srv, P, run)
            except Exception as e:  # noqa: BLE001 - the timeline stands
                run.point_error({"config": label, "part": "gpu metrics"}, e)
    if use_nsys:   # the server has exited
        csvs = nsys.stats(rep_file, ["cuda_gpu_kern_sum", "cuda_gpu_trace", "nvtx_sum", "nvtx_pushpop_trace"])
        if "cuda_gpu_trace" not in csvs:
            raise RuntimeError(f"nsys stats produced no cuda_gpu_trace table for {rep_file.name}")
        k, ranges = load_nsys_csvs(csvs["cuda_gpu_trace"], csvs.get("nvtx_pushpop_trace"))
    else:
        ev = trace.read_chrome_trace(tr)
        k, ranges = trace.kernels(ev), ev[(ev["kind"] == "user_annotation") & ev["name"].isin(PHASES)]
    a = analyse(k, ranges, label)
    a.update(tool="nsys" if use_nsys else "torch.profiler", throughput=s["output_throughput"], graphs=sg.graphs_text(fl),
             gpu_metrics=gm)
    run.log(f"{label}: {a['kernels']} kernels in {a['window_ms']:.0f} ms, GPU busy {100 * a['busy']:.1f}% "
            f"(steady middle {100 * a['busy_steady']:.1f}%), {a['gaps_over_20us']} gaps >= 20 us")
    return a


# ------------------------------------------------------------------ tables, verdicts, story

def report(run, res, P, model_name: str, backend: str, gm: dict | None = None) -> None:
    """Tables, verdicts and the story of one or two analysed timelines (``gm``: the metrics pass, when it ran)."""
    import pandas as pd
    first = res[0]
    sg.table(run, "kernels", first["summary"].head(30)[["short", "class", "launches", "total_us", "mean_us", "share_pct"]]
             .rename(columns={"short": "kernel"}))
    sg.table(run, "families", pd.DataFrame([{"config": a["config"], "class": c, "total_us": v,
                                             "share_pct": 100 * v / a["classes"].sum()}
                                            for a in res for c, v in a["classes"].items()]))
    sg.table(run, "gaps", pd.concat([a["gaps"].sort_values("gap_us", ascending=False).head(20) for a in res]))
    sg.table(run, "gaps_by_phase", pd.concat([a["by_phase"].assign(config=a["config"]) for a in res
                                              if a["by_phase"] is not None] or [pd.DataFrame()]))
    sg.table(run, "windows", [{k: a.get(k) for k in ("config", "tool", "window_ms", "kernels", "busy", "busy_steady",
                                                     "idle_ms", "gaps_over_20us", "idle_in_gaps_over_20us_ms",
                                                     "throughput")} for a in res])
    sg.table(run, "slices", [{"config": a["config"], "slice": i, "attention_over_gemm": x, "steady_busy_pct": b}
                             for a in res for i, (x, b) in enumerate(zip(a["att_over_gemm"], a["busy_slices"]))])
    run.headline(gpu_busy_pct=100 * first["busy"], gpu_busy_steady_pct=100 * first["busy_steady"])
    verdicts(run, res, P)
    if gm and gm.get("rows"):
        run.figure("gpu_metrics", metrics_figure(gm, run.summary.get("provenance", {}).get("gpu") or "GPU"))
    run.story(tell(res, P, model_name, backend, gm), echo=True)


def verdicts(run, res, P) -> None:
    first = res[0]
    cls = first["classes"]
    run.judge(H["attention"], first["att_over_gemm"], evidence="slices.csv, families.csv",
              detail=f"whole window: attention {100 * cls.get('attention', 0.0) / cls.sum():.0f}%, GEMM "
              f"{100 * cls.get('gemm', 0.0) / cls.sum():.0f}% of kernel time (burst of {P['burst']})")
    run.observe("prefill and decode use clearly separate attention kernels (kernel names: observed, not judged)",
                f"prefill only: {', '.join(first['prefill_only_attention']) or '-'}; decode: "
                f"{', '.join(first['decode_attention']) or '-'} (split by {first['split_by']})",
                "confirmed" if first["prefill_only_attention"] and first["decode_attention"] else "refuted", "kernels.csv")
    run.judge(H["busy"], first["busy_slices"], evidence="slices.csv, windows.csv",
              detail=f"{100 * first['busy_steady']:.1f}% over the whole steady middle, {100 * first['busy']:.1f}% overall")
    off = next((a for a in res if a["config"] == "overlap_off"), None)
    if off:
        run.judge(H["overlap"], [a - b for a, b in zip(first["busy_slices"], off["busy_slices"])], evidence="slices.csv",
                  detail=f"steady busy {100 * first['busy_steady']:.1f}% (on) vs {100 * off['busy_steady']:.1f}% (off); "
                  f"throughput {first['throughput']:.0f} vs {off['throughput']:.0f} tok/s")


def tell(res, P, model_name, backend, gm=None) -> str:
    """A few steady-decode milliseconds as lanes, then the numbers, per configuration."""
    items = []
    for a in res:
        k, (m0, _), rg = a["k"], a["mid"], a["ranges"]
        w1 = m0 + 20_000                                      # 20 ms of steady decode, ~0.2 ms per column
        win = k[(k["end_us"] > m0) & (k["ts_us"] < w1)]
        lanes = [{"lane": "GPU all kernels", "start": max(r.ts_us, m0) / 1e3, "end": min(r.end_us, w1) / 1e3}
                 for r in win.itertuples()]
        lanes += [{"lane": "GPU attention", "start": max(r.ts_us, m0) / 1e3, "end": min(r.end_us, w1) / 1e3, "mark": "a"}
                  for r in win[win["class"] == "attention"].itertuples()]
        if len(rg):
            cw = rg[(rg["end_us"] > m0) & (rg["ts_us"] < w1)]
            lanes += [{"lane": "CPU " + r.name.replace("scheduler.", ""), "start": max(r.ts_us, m0) / 1e3,
                       "end": min(r.end_us, w1) / 1e3, "mark": "-"} for r in cw.itertuples()]
        bp = a["by_phase"]
        phases = [(f"{r.phase}: {r.gaps} gaps, {r.idle_us / 1e3:.2f} ms idle", []) for r in bp.itertuples()] \
            if bp is not None and len(bp) else []
        items.append((f"{a['config']} ({a['tool']}{'; ' + a['graphs'] if a.get('graphs') else ''}): {a['kernels']} kernels "
                      f"in {a['window_ms']:.0f} ms; GPU busy {100 * a['busy']:.1f}% (steady {100 * a['busy_steady']:.1f}%, "
                      f"slices {', '.join(f'{b:.0f}' for b in a['busy_slices'])}%); idle in gaps >= 20 us: "
                      f"{a['idle_in_gaps_over_20us_ms']:.1f} ms", [
                          ("kernel time: " + ", ".join(f"{c} {100 * v / a['classes'].sum():.0f}%"
                                                       for c, v in a["classes"].head(5).items()), []),
                          ("GPU idle by CPU scheduler phase (gaps >= 20 us)", phases or [("no NVTX/annotation ranges", [])]),
                          ("20 ms of steady decode (# GPU busy, a attention, - CPU in that scheduler phase):\n"
                           + story.timeline(lanes, width=100, unit="ms", start=m0 / 1e3, end=w1 / 1e3), [])]))
    if gm:
        items.append(("the GPU's own counters over the served timeline (nsys GPU metrics)", metrics_lines(gm)))
    return story.tree(f"SYSTEM TIMELINE — {model_name}, {backend}, burst {P['burst']} x ({P['prompt']} in, {P['new']} out)",
                      items)


def read_metrics(folder: Path) -> dict | None:
    """The metrics pass of a recording (gpu_metrics_runs.csv, gpu_metrics.csv), or None where it has none."""
    import pandas as pd
    if not (folder / "gpu_metrics_runs.csv").is_file():
        return None
    runs = [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}
            for r in pd.read_csv(folder / "gpu_metrics_runs.csv").to_dict("records")]
    rows = pd.read_csv(folder / "gpu_metrics.csv").to_dict("records") if (folder / "gpu_metrics.csv").is_file() else None
    return {"runs": runs, **({"rows": rows} if rows else {})}


def main_reanalyse(args) -> int:
    src = Path(args.reanalyse).resolve()
    require_modules(("pandas", None))
    res = reanalyse(src)          # read everything before Run replaces the folder (when DIR is the default one)
    prev = load_summary(src) or {}
    prev_args = prev.get("args", {})
    keep = {f.name: f.read_bytes() for pat in ("timeline_*.csv", "timeline_*.nsys-rep", "server_*.log", "gpu_metrics*.csv")
            for f in src.glob(pat)}
    gm = read_metrics(src)
    with Run(__file__, args, out=args.out) as run:
        run.reanalysis_of(prev, src)
        for name, data in keep.items():
            run.path(name).write_bytes(data)
        for k_ in ("server_start_s_overlap_on", "server_start_s_overlap_off"):
            if k_ in prev.get("headline", {}):
                run.headline(**{k_: prev["headline"][k_]})
        report(run, res, QUICK if prev_args.get("quick") else FULL, prev_args.get("preset") or "the model",
               prev_args.get("backend") or "flashinfer", gm)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    sg.require_stack()
    P = QUICK if args.quick else FULL
    use_nsys = not args.torch and nsys.find() is not None
    configs = [("overlap_on", [])] + ([("overlap_off", ["--disable-overlap-schedule"])]
                                      if (args.overlap_off or not args.quick) else [])
    model_dir, base = sg.model_and_flags(args)
    with Run(__file__, args, out=args.out) as run:
        run.note(f"timeline tool: {'nsys ' + str(nsys.find()) if use_nsys else 'torch profiler (nsys not usable here or --torch)'}")
        res = []
        for label, extra in configs:
            try:
                res.append(run_config(args, P, label, extra, model_dir, base, run, use_nsys,
                                      metrics=label == "overlap_on"))
            except Exception as e:  # noqa: BLE001 - one configuration fails, the other goes on
                run.point_error({"config": label}, e)
        if not res:
            raise RuntimeError("no timeline could be recorded; see point_errors and server_*.log")
        gm = res[0].get("gpu_metrics")
        if gm:
            sg.table(run, "gpu_metrics_runs", gm["runs"])
            sg.table(run, "gpu_metrics", gm.get("rows") or [])
        report(run, res, P, Path(model_dir).name, args.backend, gm)
    return 0


if __name__ == "__main__":
    run_main(main)
