#!/usr/bin/env python3
"""04 · helper of 04_nsys_profile.sh: a system timeline of a serving run, and where the GPU waits.

What it measures
    One SGLang server serves a burst of requests (prefill, then steady decode). The timeline comes
    from Nsight Systems when it is usable here (common.nsys.find()): the server runs under
    `nsys profile --trace=cuda,nvtx --cuda-graph-trace=node --trace-fork-before-exec=true
    --capture-range=cudaProfilerApi`, SGLang's scheduler NVTX ranges are on
    (SGLANG_ENABLE_NVTX_SCHEDULER=1), and /start_profile {"activities": ["CUDA_PROFILER"]} opens
    the capture window around the burst. Without nsys (or with --torch) the same window is
    recorded by the torch profiler through /start_profile (CPU + GPU activities).
    From either timeline: the kernel table (time, launches, share, family), GPU busy fraction
    over the window and over its steady-decode middle, the idle gaps between kernels, and for
    each gap the scheduler phase the CPU was in (recv_requests, get_next_batch_to_run,
    run_batch, process_batch_result): CPU scheduling overhead vs idle time, in the story.
    The full run repeats the burst with --disable-overlap-schedule.

What the plan expected (hypotheses)
    * FlashInfer kernels dominate GPU time (A100). Restated: at moderate batch, decode GPU time
      is dominated by GEMMs (weights read once per step), not attention.
    * Prefill and decode kernel selection is clearly separated.
    * With the overlap scheduler and CUDA graphs the GPU gaps between decode steps are small;
      with --disable-overlap-schedule they grow by the scheduler's CPU time.

Run (through the wrapper; this file takes the same flags)
    ./sglang/scripts/04_nsys_profile.sh --quick       # ~1.5 min
    ./sglang/scripts/04_nsys_profile.sh               # + overlap-off comparison
    ./sglang/scripts/04_nsys_profile.sh --torch       # torch profiler even where nsys exists
Writes sglang/results/04_nsys_profile/: kernels.csv, families.csv, gaps.csv, gaps_by_phase.csv,
windows.csv, timeline_<cfg>.nsys-rep + nsys_*.csv (nsys) or profiles/ (torch), server_*.log,
story.txt, summary.json.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from common import nsys, serving, story, trace  # noqa: E402
from common.checks import SetupError, require_module, run_main  # noqa: E402
from common.results import Run  # noqa: E402
from common.serving import Server, flags  # noqa: E402

STEM_FILE = Path(__file__).with_name("04_nsys_profile.sh")
QUICK = dict(burst=16, prompt=512, new=64)
FULL = dict(burst=64, prompt=1024, new=128)
PHASES = ("scheduler.recv_requests", "scheduler.process_input_requests", "scheduler.get_next_batch_to_run",
          "scheduler.run_batch", "scheduler.process_batch_result")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="04_nsys_profile.sh", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="a smaller burst, overlap on only (~1.5 min)")
    p.add_argument("--out", default=None, help="results folder (default sglang/results/04_nsys_profile)")
    p.add_argument("--torch", action="store_true", help="use the torch profiler even where nsys works")
    p.add_argument("--overlap-off", action="store_true", help="also run with --disable-overlap-schedule (on in full)")
    p.add_argument("--reanalyse", metavar="DIR", default=None,
                   help="no GPU, no server: redo the analysis from the nsys CSVs an earlier run left in DIR "
                        "(e.g. a copy of sglang/results/04_nsys_profile)")
    serving.add_model_args(p)
    return p.parse_args(argv)


def phase_name(n: str) -> str:
    """An NVTX range name as nsys prints it ('domain:name', ':name' or 'name') -> a PHASES name."""
    return next((p for p in PHASES if n.endswith(p)), n)


def cpu_phase_at(ranges, t_us: float) -> str:
    """The innermost scheduler range (CPU) that covers time ``t_us``, or 'none'."""
    inside = ranges[(ranges["ts_us"] <= t_us) & (ranges["end_us"] >= t_us)]
    if inside.empty:
        return "none"
    return inside.sort_values("dur_us").iloc[0]["name"]


GRAPH_MIN = 50   # kernels sharing one correlation id: one CUDA-graph replay (a whole decode step)


def phase_attention(k, t0: float, t1: float, mid0: float) -> tuple[set, set, str]:
    """Attention kernels of prefill vs decode steps.

    Decode steps replay one CUDA graph: all their kernels carry the correlation id of that one
    cudaGraphLaunch (nsys --cuda-graph-trace=node, and the torch profiler alike). Prefill attention
    runs eagerly (SGLang's piecewise prefill graphs leave attention out), one correlation id per
    kernel. So: attention inside a graph replay = decode, attention outside = prefill (and any
    eager decode step). Without graph replays (CUDA graphs off) fall back to time: the first 10%
    of the window vs after its first quarter (good only when prefill and decode do not overlap)."""
    att = k[k["family"] == "attention"]
    corr = k["correlation"] if "correlation" in k.columns else None
    if corr is not None and corr.notna().any():
        size = k.groupby("correlation")["short"].transform("size")
        in_graph = size >= GRAPH_MIN
        if in_graph.any():
            return (set(att[~in_graph.loc[att.index]]["short"]), set(att[in_graph.loc[att.index]]["short"]),
                    f"CUDA-graph replays (>= {GRAPH_MIN} kernels per launch) = decode; eager = prefill")
    early = set(att[att["ts_us"] < t0 + 0.1 * (t1 - t0)]["short"])
    late = set(att[att["ts_us"] > mid0]["short"])
    return early, late, "time: first 10% of the window vs after its first quarter"


def analyse(k, ranges, label: str) -> dict:
    """Kernel table, families, gaps and their CPU phase for one timeline (``k``: kernel events)."""
    k = k.sort_values("ts_us").reset_index(drop=True)
    k["family"] = k["short"].map(serving.kernel_family)
    t0, t1 = float(k["ts_us"].min()), float(k["end_us"].max())
    mid0, mid1 = t0 + 0.25 * (t1 - t0), t0 + 0.75 * (t1 - t0)
    g = trace.gaps(k, min_us=0.0)
    g["phase"] = [cpu_phase_at(ranges, s + d / 2) if d >= 20 else "-" for s, d in zip(g["start_us"], g["gap_us"])] \
        if len(ranges) else "n/a"
    g["config"] = label
    summ = trace.kernel_summary(k)
    summ["family"] = summ["short"].map(serving.kernel_family)
    summ["config"] = label
    fam = k.groupby("family")["dur_us"].sum().sort_values(ascending=False)
    pre_att, dec_att, split_by = phase_attention(k, t0, t1, mid0)
    steady = k[(k["ts_us"] >= mid0) & (k["end_us"] <= mid1)]
    big = g[g["gap_us"] >= 20]
    by_phase = big.groupby("phase")["gap_us"].agg(["count", "sum"]).reset_index().rename(
        columns={"count": "gaps", "sum": "idle_us"}) if len(big) else None
    return {"config": label, "window_ms": (t1 - t0) / 1e3, "kernels": len(k), "busy": trace.busy_fraction(k),
            "busy_steady": trace.busy_fraction(steady, mid0, mid1) if len(steady) else float("nan"),
            "idle_ms": float(g["gap_us"].sum()) / 1e3, "gaps_over_20us": int(len(big)),
            "idle_in_gaps_over_20us_ms": float(big["gap_us"].sum()) / 1e3,
            "families": fam, "summary": summ, "gaps": g, "by_phase": by_phase,
            "prefill_only_attention": sorted(pre_att - dec_att), "decode_attention": sorted(dec_att), "split_by": split_by,
            "k": k, "mid": (mid0, mid1),
            "ranges": ranges}


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


def load_nsys_csvs(gpu_trace_csv, nvtx_csv=None):
    """Kernel events and scheduler ranges from `nsys stats` CSVs (cuda_gpu_trace, nvtx_pushpop_trace)."""
    k = trace.read_nsys_csv(gpu_trace_csv)
    k = k[~k["name"].astype(str).str.startswith("[CUDA")]          # memcpy / memset rows
    ranges = trace.read_nsys_csv(nvtx_csv) if nvtx_csv and Path(nvtx_csv).exists() else k.iloc[0:0]
    ranges = ranges.assign(name=ranges["name"].astype(str).map(phase_name))
    return k, ranges[ranges["name"].isin(PHASES)]


def reanalyse(folder: Path) -> list[dict]:
    """The analysis again, from the `nsys stats` CSVs an earlier run left in ``folder`` (no GPU)."""
    pd = require_module("pandas")
    old = pd.read_csv(folder / "windows.csv") if (folder / "windows.csv").exists() else None
    res = []
    for label in ("overlap_on", "overlap_off"):
        gt = folder / f"timeline_{label}_cuda_gpu_trace.csv"
        if not gt.exists():
            continue
        k, ranges = load_nsys_csvs(gt, folder / f"timeline_{label}_nvtx_pushpop_trace.csv")
        a = analyse(k, ranges, label)
        tp = old[old["config"] == label]["throughput"] if old is not None and "throughput" in old else []
        a.update(tool="nsys", throughput=float(tp.iloc[0]) if len(tp) else float("nan"))
        res.append(a)
    if not res:
        raise SetupError(f"{folder}: no timeline_<config>_cuda_gpu_trace.csv to re-analyse (written by an nsys run of "
                         "04_nsys_profile.sh)")
    return res


def burst(srv, P):
    return srv.generate_many([{"input_ids": serving.random_ids(P["prompt"], 5000 + i),
                               "sampling_params": {"max_new_tokens": P["new"], "temperature": 0, "ignore_eos": True}}
                              for i in range(P["burst"])])


def run_config(args, P, label, extra, model_dir, base, run, use_nsys) -> dict:
    fl = base + flags(attention_backend=args.backend, log_level="info", decode_log_interval=1) + extra
    env = {"SGLANG_LOG_MS": "1", "SGLANG_PROFILE_WITH_STACK": "false", "SGLANG_PROFILE_RECORD_SHAPES": "false"}
    prof_dir = run.dir / "profiles"
    wrapper, rep = [], None
    if use_nsys:
        rep = run.dir / f"timeline_{label}"
        wrapper = [nsys.find(), "profile", "-o", str(rep), "-f", "true", *nsys.DEFAULT_FLAGS,
                   "--trace-fork-before-exec=true", "--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
        env["SGLANG_ENABLE_NVTX_SCHEDULER"] = "1"
    # nsys writes the report when the capture range ends (--capture-range-end=stop), while the server
    # keeps running: the report is awaited below, so stopping the server needs little patience
    with Server(model_dir, fl, port=args.port, log_path=run.path(f"server_{label}.log"), echo=run.log, wrapper=wrapper,
                start_timeout=args.start_timeout, env=env, name=f"server[{label}]", wrapper_stop_timeout=90) as srv:
        run.headline(**{f"server_start_s_{label}": round(srv.startup_s, 1)})
        out = srv.generate(input_ids=serving.random_ids(32, 1), sampling_params={"max_new_tokens": 4, "temperature": 0})
        if out["meta_info"]["completion_tokens"] != 4:
            raise RuntimeError(f"sanity request returned {out['meta_info']['completion_tokens']} tokens, expected 4")
        run.log("sanity: 4 tokens back ✅  All results match. Starting the profiled burst.")
        burst(srv, {**P, "burst": 4})                       # warm the shapes outside the window
        before = list(prof_dir.glob("*.trace.json*")) if prof_dir.exists() else []
        srv.start_profile(prof_dir, activities=["CUDA_PROFILER"] if use_nsys else ["CPU", "GPU"])
        s = serving.latency_summary(burst(srv, P))
        srv.stop_profile()
        run.log(f"{label}: burst of {P['burst']} x ({P['prompt']} in, {P['new']} out) in {s['wall_s']:.2f} s, "
                f"{s['output_throughput']:.0f} out tok/s")
        tr = None if use_nsys else srv.wait_traces(prof_dir, before)[0]
        if use_nsys:
            rep_file = rep.with_suffix(".nsys-rep")
            if not wait_file(rep_file, timeout=300):
                raise RuntimeError(f"nsys wrote no {rep_file.name}; see server_{label}.log (or rerun with --torch)")
            run.log(f"{label}: nsys wrote {rep_file.name} ({rep_file.stat().st_size / 1e6:.1f} MB)")
    if use_nsys:   # the server has exited
        csvs = nsys.stats(rep_file, ["cuda_gpu_kern_sum", "cuda_gpu_trace", "nvtx_sum", "nvtx_pushpop_trace"])
        if "cuda_gpu_trace" not in csvs:
            raise RuntimeError(f"nsys stats produced no cuda_gpu_trace table for {rep_file.name}")
        k, ranges = load_nsys_csvs(csvs["cuda_gpu_trace"], csvs.get("nvtx_pushpop_trace"))
    else:
        ev = trace.read_chrome_trace(tr)
        k = trace.kernels(ev)
        ranges = ev[(ev["kind"] == "user_annotation") & ev["name"].isin(PHASES)]
    a = analyse(k, ranges, label)
    a.update(tool="nsys" if use_nsys else "torch.profiler", throughput=s["output_throughput"])
    run.log(f"{label}: {a['kernels']} kernels in {a['window_ms']:.0f} ms, GPU busy {100 * a['busy']:.1f}% "
            f"(steady middle {100 * a['busy_steady']:.1f}%), {a['gaps_over_20us']} gaps >= 20 us")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    serving.require_sglang()
    serving.require_gpus(1)
    require_module("pandas")
    P = QUICK if args.quick else FULL
    use_nsys = not args.torch and nsys.find() is not None
    configs = [("overlap_on", [])] + ([("overlap_off", ["--disable-overlap-schedule"])]
                                      if (args.overlap_off or not args.quick) else [])
    model_dir, base = serving.model_and_flags(args)
    with Run(STEM_FILE, args, out=args.out) as run:
        run.note(f"timeline tool: {'nsys ' + str(nsys.find()) if use_nsys else 'torch profiler (nsys not usable here or --torch)'}")
        res = []
        for label, extra in configs:
            try:
                res.append(run_config(args, P, label, extra, model_dir, base, run, use_nsys))
            except Exception as e:
                run.point_error({"config": label}, e)
        if not res:
            raise RuntimeError("no timeline could be recorded; see point_errors and server_*.log")
        report(run, res, P, Path(model_dir).name, args.backend)
    return 0


def main_reanalyse(args) -> int:
    src = Path(args.reanalyse).resolve()
    res = reanalyse(src)          # read everything before Run replaces the folder (when DIR is the default one)
    import json
    prev = json.loads((src / "summary.json").read_text()) if (src / "summary.json").exists() else {}
    prev_args = prev.get("args", {})
    P = QUICK if prev_args.get("quick") else FULL
    with Run(STEM_FILE, args, out=args.out) as run:
        run.reanalysis_of(prev, src)
        for f in src.glob("timeline_*"):
            if f.suffix == ".csv" or f.suffix == ".nsys-rep":
                (run.dir / f.name).write_bytes(f.read_bytes())
        for f in src.glob("server_*.log"):
            (run.dir / f.name).write_bytes(f.read_bytes())
        for k_ in ("server_start_s_overlap_on", "server_start_s_overlap_off"):
            if k_ in prev.get("headline", {}):
                run.headline(**{k_: prev["headline"][k_]})
        report(run, res, P, prev_args.get("preset") or "the model", prev_args.get("backend") or "flashinfer")
    return 0


def report(run, res, P, model_name: str, backend: str) -> None:
    """Tables, verdicts and the story of one or two analysed timelines."""
    pd = require_module("pandas")
    first = res[0]
    serving.table(run, "kernels", first["summary"].head(30)[["short", "family", "launches", "total_us", "mean_us", "share_pct"]]
              .rename(columns={"short": "kernel"}))
    serving.table(run, "families", pd.DataFrame([{"config": a["config"], "family": f, "total_us": v,
                                         "share_pct": 100 * v / a["families"].sum()}
                                        for a in res for f, v in a["families"].items()]))
    serving.table(run, "gaps", pd.concat([a["gaps"].sort_values("gap_us", ascending=False).head(20) for a in res]))
    serving.table(run, "gaps_by_phase", pd.concat([a["by_phase"].assign(config=a["config"]) for a in res
                                          if a["by_phase"] is not None] or [pd.DataFrame()]))
    serving.table(run, "windows", [{k: a[k] for k in ("config", "tool", "window_ms", "kernels", "busy", "busy_steady", "idle_ms",
                                             "gaps_over_20us", "idle_in_gaps_over_20us_ms", "throughput")} for a in res])
    run.headline(gpu_busy_pct=100 * first["busy"], gpu_busy_steady_pct=100 * first["busy_steady"])

    # ---- verdicts
    fam = first["families"]
    att, gemm = fam.get("attention", 0.0), fam.get("gemm", 0.0)
    run.observe("attention (FlashInfer) kernels dominate GPU time (A100 plan; restated: GEMMs dominate at moderate "
                "batch). Confirmed if attention time >= GEMM time",
                f"attention {100 * att / fam.sum():.0f}%, GEMM {100 * gemm / fam.sum():.0f}% of kernel time "
                f"(burst of {P['burst']})", "confirmed" if att >= gemm else "refuted", "families.csv")
    run.observe("prefill and decode use clearly separate attention kernels",
                f"prefill only: {', '.join(first['prefill_only_attention']) or '-'}; decode: "
                f"{', '.join(first['decode_attention']) or '-'} (split by {first['split_by']})",
                "confirmed" if first["prefill_only_attention"] and first["decode_attention"] else "refuted", "kernels.csv")
    run.observe("with overlap scheduling and CUDA graphs the GPU is rarely idle in steady decode "
                "(confirmed if busy >= 90% of the steady middle of the window)",
                f"GPU busy {100 * first['busy_steady']:.1f}% in the steady middle, {100 * first['busy']:.1f}% overall",
                "confirmed" if first["busy_steady"] >= 0.9 else "refuted", "windows.csv")
    off = next((a for a in res if a["config"] == "overlap_off"), None)
    if off:
        run.observe("--disable-overlap-schedule turns the scheduler's CPU time into GPU idle gaps",
                    f"steady busy {100 * first['busy_steady']:.1f}% (overlap on) vs {100 * off['busy_steady']:.1f}% "
                    f"(off); throughput {first['throughput']:.0f} vs {off['throughput']:.0f} tok/s",
                    "confirmed" if off["busy_steady"] < first["busy_steady"] - 0.02 else "refuted", "windows.csv")

    # ---- story: a few steady-decode milliseconds as lanes, then the numbers
    items = []
    for a in res:
        k, (m0, _), rg = a["k"], a["mid"], a["ranges"]
        w1 = m0 + 20_000                                      # 20 ms of steady decode, ~0.2 ms per column
        win = k[(k["end_us"] > m0) & (k["ts_us"] < w1)]
        lanes = [{"lane": "GPU all kernels", "start": max(r.ts_us, m0) / 1e3, "end": min(r.end_us, w1) / 1e3}
                 for r in win.itertuples()]
        lanes += [{"lane": "GPU attention", "start": max(r.ts_us, m0) / 1e3, "end": min(r.end_us, w1) / 1e3, "mark": "a"}
                  for r in win[win["family"] == "attention"].itertuples()]
        if len(rg):
            cw = rg[(rg["end_us"] > m0) & (rg["ts_us"] < w1)]
            lanes += [{"lane": "CPU " + r.name.replace("scheduler.", ""), "start": max(r.ts_us, m0) / 1e3,
                       "end": min(r.end_us, w1) / 1e3, "mark": "-"} for r in cw.itertuples()]
        phases = []
        bp = a["by_phase"]
        if bp is not None and len(bp):
            phases = [(f"{r.phase}: {r.gaps} gaps, {r.idle_us / 1e3:.2f} ms idle", []) for r in bp.itertuples()]
        items.append((f"{a['config']} ({a['tool']}): {a['kernels']} kernels in {a['window_ms']:.0f} ms; GPU busy "
                      f"{100 * a['busy']:.1f}% (steady {100 * a['busy_steady']:.1f}%); idle in gaps >= 20 us: "
                      f"{a['idle_in_gaps_over_20us_ms']:.1f} ms", [
                          ("kernel time: " + ", ".join(f"{f} {100 * v / a['families'].sum():.0f}%"
                                                       for f, v in a["families"].head(5).items()), []),
                          ("GPU idle by CPU scheduler phase (gaps >= 20 us)", phases or [("no NVTX/annotation ranges", [])]),
                          ("20 ms of steady decode (# GPU busy, a attention, - CPU in that scheduler phase):\n"
                           + story.timeline(lanes, width=100, unit="ms", start=m0 / 1e3, end=w1 / 1e3), [])]))
    run.story(story.tree(f"SYSTEM TIMELINE — {model_name}, {backend}, burst {P['burst']} x "
                         f"({P['prompt']} in, {P['new']} out)", items))
    print(run.summary["story"])


if __name__ == "__main__":
    run_main(main)
