#!/usr/bin/env python3
"""07 · helper of 07_tp_scaling.sh: tensor parallelism on one node — latency, throughput, all-reduce share.

What it measures (dummy weights; one SGLang server per configuration)
    Llama-3.1-8B at TP = 1, 2, 4 and Llama-3.1-70B at TP = 2, 4 (--quick: 8B at TP 1, 2). For each:
      * batch-1 latency: TTFT and ITL of one streamed request (512 in, 128 out);
      * a traced decode window (batch 16, 1024-token contexts, torch profiler on every rank):
        per decode step the GPU time, the time in all-reduce kernels vs compute, and which
        all-reduce kernels ran (SGLang's custom all-reduce vs NCCL);
      * throughput at --request-rate inf (sglang.benchmark.serving).
    Then the same at the largest TP that fits with --disable-custom-all-reduce (NCCL only), run
    right after the custom all-reduce configuration it is compared with. --quick also turns the
    prefill CUDA graphs off (same for every configuration) to shorten each server start.
    The GPU topology (`nvidia-smi topo -m`) and NUMA layout are saved with the results.
    Configurations needing more GPUs than visible are skipped with a note; if none fits the run
    stops with a one-line error. A rank that dies ends its configuration with the server's last
    log lines; the whole process group is stopped either way (no hung processes).
    NVLink multicast stays off: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
    NVSHMEM_DISABLE_NVLS=1; --enable-nccl-nvls / --enable-symm-mem are never passed.

What the plan expected (hypotheses)
    * The communication/compute ratio is the thing to measure; TP over NVLink all-reduces fast.
      Restated: decode ITL improves sub-linearly with TP; the all-reduce share of a decode step
      grows with TP; decode all-reduces use the custom kernel; --disable-custom-all-reduce slows
      small-batch decode.

Run (through the wrapper; this file takes the same flags)
    ./sglang/scripts/07_tp_scaling.sh --quick        # 8B at TP 1, 2 (needs 2 GPUs), ~4 min
    ./sglang/scripts/07_tp_scaling.sh                # 8B TP 1/2/4 + 70B TP 2/4 (needs 4 GPUs)
    ./sglang/scripts/07_tp_scaling.sh --configs 'llama-3.1-70b:2,4'
    ./sglang/scripts/07_tp_scaling.sh --configs 'llama-3.1-8b:1,4;llama-3.1-70b:4' --time-budget 8
    ./sglang/scripts/07_tp_scaling.sh --configs 'llama-3.1-70b:2' --no-nccl-compare --merge OLD_DIR
Writes sglang/results/07_tp_scaling/: tp_runs.csv, allreduce_kernels.csv, topology.txt, tp_scaling.png,
server_*.log, bench/, profiles/, story.txt, summary.json.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from common import gpu, models, serving, story, trace  # noqa: E402
from common.checks import SetupError, require_module, run_main  # noqa: E402
from common.results import Run  # noqa: E402
from common.serving import SAFE_ENV, Server, flags  # noqa: E402

STEM_FILE = Path(__file__).with_name("07_tp_scaling.sh")
FULL_CONFIGS = "llama-3.1-8b:1,2,4;llama-3.1-70b:2,4"
QUICK_CONFIGS = "llama-3.1-8b:1,2"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="07_tp_scaling.sh", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help=f"configs {QUICK_CONFIGS!r}, fewer requests")
    p.add_argument("--out", default=None, help="results folder (default sglang/results/07_tp_scaling)")
    p.add_argument("--configs", default=None, help=f"'preset:tp,tp;preset:tp' (default {FULL_CONFIGS!r})")
    p.add_argument("--no-nccl-compare", action="store_true", help="skip the --disable-custom-all-reduce run")
    p.add_argument("--backend", default="flashinfer", choices=("flashinfer", "triton", "fa3"))
    p.add_argument("--mem-fraction", type=float, default=0.85, help="--mem-fraction-static (default 0.85)")
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--start-timeout", type=float, default=1800, help="seconds to wait for /health (default 1800)")
    p.add_argument("--reanalyse", metavar="DIR", default=None,
                   help="no GPU, no server: redo tables, verdicts and story from the CSVs an earlier run left in DIR")
    p.add_argument("--merge", metavar="DIR", default=None,
                   help="also report the configurations an earlier run recorded in DIR (its tp_runs.csv), each row "
                        "marked with the date and commit it was measured at; configurations measured now replace them")
    p.add_argument("--time-budget", type=float, default=None, metavar="MIN",
                   help="start no further configuration once it would likely end past MIN minutes (the ones "
                        "left are noted as skipped; the run still finishes with what it measured)")
    return p.parse_args(argv)


def parse_configs(text: str) -> list[tuple[str, int]]:
    """'llama-3.1-8b:1,2;llama-3.1-70b:2' -> [('llama-3.1-8b', 1), ('llama-3.1-8b', 2), ('llama-3.1-70b', 2)]."""
    out = []
    for part in filter(None, (x.strip() for x in text.split(";"))):
        preset, _, tps = part.partition(":")
        if preset not in models.PRESETS or not tps:
            raise SetupError(f"bad --configs entry {part!r}: expected 'preset:tp,tp' with preset in {sorted(models.PRESETS)}")
        out += [(preset, int(t)) for t in tps.split(",")]
    return out


def measure(srv, tp: int, run, prof_dir: Path, quick: bool) -> tuple[dict, list]:
    sp = {"temperature": 0, "ignore_eos": True}
    one = srv.generate(input_ids=serving.random_ids(512, 1), stream=True, sampling_params={**sp, "max_new_tokens": 128})
    if one["meta_info"]["completion_tokens"] != 128:
        raise RuntimeError(f"sanity: {one['meta_info']['completion_tokens']} tokens instead of 128")
    row = {"ttft_b1_ms": one["client"]["ttft_s"] * 1e3, "itl_b1_ms": statistics.median(one["client"]["itl_s"]) * 1e3}
    B = 16
    srv.flush_cache()
    res: dict = {}
    th = threading.Thread(target=lambda: res.update(out=srv.generate_many(
        [{"input_ids": serving.random_ids(1024, 10 + i), "sampling_params": {**sp, "max_new_tokens": 64}} for i in range(B)])))
    mark = srv.log_mark()
    before = list(prof_dir.glob("*.trace.json*")) if prof_dir.exists() else []
    th.start()
    try:
        srv.wait_log(rf"Decode batch, #running-req: {B},", mark, timeout=600, while_alive=th)
        srv.start_profile(prof_dir, num_steps=8)
        time.sleep(0.5)
        srv.stop_profile()
    finally:
        th.join()
    files = srv.wait_traces(prof_dir, before, ranks=tp)
    rank0 = next((f for f in files if "-TP-0" in f.name), files[0])
    krows: list = []
    steps = [s for s in serving.steps_from_trace(trace.read_chrome_trace(rank0), krows) if s["mode"] == "DECODE"]
    ar = [k for k in krows if k["mode"] == "DECODE" and k["family"] == "allreduce"]
    kern_us = statistics.median(s["kernel_us"] for s in steps) if steps else math.nan
    ar_us = statistics.median(s.get("allreduce_us", 0.0) for s in steps) if steps else math.nan
    row.update(decode_bs=B, decode_step_gpu_ms=statistics.median(s["dur_us"] for s in steps) / 1e3 if steps else None,
               kernel_us_per_step=kern_us, allreduce_us_per_step=ar_us,
               allreduce_share_pct=100 * ar_us / kern_us if steps and kern_us else None,
               allreduce_launches_per_step=len(ar) / max(len(steps), 1),
               allreduce_kernels=";".join(sorted({k["short"] for k in ar})) or "-", trace_files=len(files))
    srv.flush_cache()
    rec = serving.run_bench(srv, run.dir / "bench", f"tp{tp}_{int(time.time())}", num_prompts=64 if quick else 256,
                            input_len=1024, output_len=128 if quick else 256, rate="inf", echo=run.log, timeout=1800)
    row.update(output_throughput=rec["output_throughput"], ttft_p50_ms=rec["median_ttft_ms"],
               itl_p50_ms=rec["median_itl_ms"], itl_p99_ms=rec["p99_itl_ms"])
    return row, [{"kernel": k["short"]} for k in ar]


def is_allgather(kernel: str) -> bool:
    """The logits all-gather (vocab-parallel lm_head) shares the collective family with all-reduce."""
    return bool(re.search(r"all_?gather", kernel, re.I))


def report(run, df, akd, links: dict, have: int, gpu_name: str) -> None:
    """Tables, figure, verdicts and story from the per-configuration rows (``df``) and the
    collective kernels seen in the traced decode steps (``akd``: model, tp, custom_allreduce, kernel)."""
    runs = df.to_dict("records")
    serving.table(run, "tp_runs", df)
    if len(akd) and "launches" not in akd.columns:
        akd = akd.groupby(["model", "tp", "custom_allreduce", "kernel"]).size().rename("launches").reset_index()
    serving.table(run, "allreduce_kernels", akd)
    tp_max = df[df["custom_allreduce"]].sort_values("tp").iloc[-1] if df["custom_allreduce"].any() else None
    for r in runs:
        run.headline(**{f"itl_b1_ms_{r['model']}_tp{r['tp']}{'' if r['custom_allreduce'] else '_nccl'}": r["itl_b1_ms"]})
    if tp_max is not None and tp_max["tp"] >= 2:
        run.headline(**{f"allreduce_share_pct_{tp_max['model']}_tp{tp_max['tp']}": tp_max["allreduce_share_pct"]})

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for m, g in df[df["custom_allreduce"]].groupby("model"):
        g = g.sort_values("tp")
        a1.plot(g["tp"], g["itl_b1_ms"], "o-", label=m)
        a2.plot(g["tp"], g["output_throughput"], "o-", label=m)
    a1.set(xlabel="TP size", ylabel="ITL at batch 1 (ms)", title="latency")
    a2.set(xlabel="TP size", ylabel="output tok/s at rate inf", title="throughput")
    for a in (a1, a2):
        a.grid(True, alpha=0.3)
        a.legend(fontsize=8)
    run.figure("tp_scaling", fig)

    # ---- verdicts
    car = df[df["custom_allreduce"]]
    for m, g in car.groupby("model"):
        g = g.sort_values("tp")
        if len(g) >= 2:
            lo, hi = g.iloc[0], g.iloc[-1]
            speed, ideal = lo["itl_b1_ms"] / hi["itl_b1_ms"], hi["tp"] / lo["tp"]
            run.observe(f"{m}: decode ITL improves with TP, but sub-linearly (confirmed if 1 < speed-up < ideal)",
                        f"TP {lo['tp']} -> {hi['tp']}: ITL {lo['itl_b1_ms']:.2f} -> {hi['itl_b1_ms']:.2f} ms "
                        f"(x{speed:.2f}, ideal x{ideal:.0f})", "confirmed" if 1 < speed < ideal else "refuted", "tp_runs.csv")
            sh = [x for x in g["allreduce_share_pct"] if x is not None and not math.isnan(x)]
            if len(sh) >= 2:
                run.observe(f"{m}: the all-reduce share of a decode step grows with TP",
                            " -> ".join(f"TP {t}: {s:.1f}%" for t, s in zip(g["tp"], g["allreduce_share_pct"])),
                            "confirmed" if all(b > a for a, b in zip(sh, sh[1:])) else "refuted", "tp_runs.csv")
    multi = car[car["tp"] >= 2]
    if len(multi):
        seen = set(";".join(multi["allreduce_kernels"]).split(";")) - {"-"}
        ar = sorted(k for k in seen if not is_allgather(k))
        ag = sorted(k for k in seen if is_allgather(k))
        run.observe("decode all-reduces (small messages) use SGLang's custom all-reduce kernel, not NCCL "
                    "(the logits all-gather is a different collective and not judged)",
                    f"all-reduce kernels in decode steps: {', '.join(ar) or '-'}; all-gather: {', '.join(ag) or '-'}",
                    "confirmed" if ar and not any("nccl" in k.lower() for k in ar) else "refuted", "allreduce_kernels.csv")
    nccl = df[~df["custom_allreduce"]]
    if len(nccl):
        n = nccl.iloc[0]
        c = car[(car["model"] == n["model"]) & (car["tp"] == n["tp"])]
        if len(c):
            c = c.iloc[0]
            run.observe("--disable-custom-all-reduce (NCCL only) makes small-batch decode slower",
                        f"{n['model']} TP {n['tp']}: ITL b1 {c['itl_b1_ms']:.2f} ms (custom) vs {n['itl_b1_ms']:.2f} ms "
                        f"(NCCL); all-reduce {story.fmt(c['allreduce_us_per_step'])} vs {story.fmt(n['allreduce_us_per_step'])} "
                        "us/step", "confirmed" if n["itl_b1_ms"] > c["itl_b1_ms"] else "refuted", "tp_runs.csv")
            run.observe("the custom all-reduce spends less GPU time per decode step than NCCL's (batch 16 trace)",
                        f"{n['model']} TP {n['tp']}: collectives {story.fmt(c['allreduce_us_per_step'])} us/step "
                        f"({story.fmt(c['allreduce_share_pct'])}% of the step) custom vs {story.fmt(n['allreduce_us_per_step'])} "
                        f"us/step ({story.fmt(n['allreduce_share_pct'])}%) NCCL only; step {story.fmt(c['decode_step_gpu_ms'])} vs "
                        f"{story.fmt(n['decode_step_gpu_ms'])} ms", "confirmed" if c["allreduce_us_per_step"] < n["allreduce_us_per_step"]
                        else "refuted", "tp_runs.csv")
    pairs = {tuple(sorted(k.split("-"))): v for k, v in links.items()}     # topo -m lists each pair twice
    nv = [v for v in pairs.values() if v.startswith("NV")]
    run.observe("the plan's box mixed NVLink pairs and PCIe across NUMA nodes; here the topology is recorded",
                f"{len(nv)} of {len(pairs)} GPU pairs on NVLink ({', '.join(sorted(set(pairs.values()))) or 'one GPU'})",
                "inconclusive" if not pairs else ("confirmed" if 0 < len(nv) < len(pairs) else "refuted"), "topology.txt")

    def when(r):
        m = r.get("measured")
        return "" if not isinstance(m, str) or m == "this run" else f"; measured {m}"
    items = [(f"{r['model']} TP={r['tp']} {'custom AR' if r['custom_allreduce'] else 'NCCL only'} (start {r['start_s']:.0f} s{when(r)})",
              [(f"batch 1: TTFT {r['ttft_b1_ms']:.1f} ms, ITL {r['itl_b1_ms']:.2f} ms", []),
               (f"decode bs {r['decode_bs']}: step {story.fmt(r['decode_step_gpu_ms'])} ms GPU, all-reduce "
                f"{story.fmt(r['allreduce_us_per_step'])} us/step = {story.fmt(r['allreduce_share_pct'])}% "
                f"({story.fmt(r['allreduce_launches_per_step'])} launches: {r['allreduce_kernels']})", []),
               (f"rate inf: {r['output_throughput']:.0f} out tok/s, TTFT p50 {r['ttft_p50_ms']:.0f} ms, ITL p50 "
                f"{r['itl_p50_ms']:.1f} / p99 {r['itl_p99_ms']:.1f} ms", [])]) for r in runs]
    items.append((f"topology: {', '.join(f'{k}={v}' for k, v in list(links.items())[:8]) or 'single GPU'}", []))
    run.story(story.tree(f"TENSOR PARALLEL SCALING — {have}x {gpu_name}", items))
    print(run.summary["story"])


def load_merge(src: Path, pd) -> tuple:
    """An earlier run's rows (tp_runs.csv, allreduce_kernels.csv) with a ``measured`` column
    (its date and commit) and that run's summary; a missing DIR or CSV is a one-line error."""
    import json
    src = Path(src).resolve()
    if not (src / "tp_runs.csv").exists():
        raise SetupError(f"--merge {src}: no tp_runs.csv there (written by 07_tp_scaling.sh)")
    prev = json.loads((src / "summary.json").read_text()) if (src / "summary.json").exists() else {}
    prov = prev.get("provenance") or {}
    git = prov.get("git") or {}
    tag = f"{str(prov.get('date_utc', '?'))[:16]} @ {git.get('commit', '?')}" if prov else src.name
    df = pd.read_csv(src / "tp_runs.csv")
    akd = pd.read_csv(src / "allreduce_kernels.csv") if (src / "allreduce_kernels.csv").exists() else pd.DataFrame()
    if "measured" not in df.columns:
        df["measured"] = tag
    df["measured"] = [tag if m == "this run" or not isinstance(m, str) else m for m in df["measured"]]  # a merged run's own rows
    return df, akd, prev


def merge_rows(now, before, key=("model", "tp", "custom_allreduce")):
    """``now`` plus the rows of ``before`` whose configuration was not measured now."""
    import pandas as pd
    if before is None or not len(before):
        return now
    if not len(now):
        return before
    have = set(map(tuple, now[list(key)].astype(str).values))
    keep = before[[tuple(r) not in have for r in before[list(key)].astype(str).values]]
    return pd.concat([now, keep], ignore_index=True)


def main_reanalyse(args) -> int:
    """Tables, verdicts and story again from an earlier run's CSVs (no GPU, no server)."""
    import json
    pd = require_module("pandas")
    src = Path(args.reanalyse).resolve()
    if not (src / "tp_runs.csv").exists():
        raise SetupError(f"{src}: no tp_runs.csv to re-analyse (written by 07_tp_scaling.sh)")
    df = pd.read_csv(src / "tp_runs.csv")
    akd = pd.read_csv(src / "allreduce_kernels.csv") if (src / "allreduce_kernels.csv").exists() else pd.DataFrame()
    topo_text = (src / "topology.txt").read_text() if (src / "topology.txt").exists() else ""
    prev = json.loads((src / "summary.json").read_text()) if (src / "summary.json").exists() else {}
    keep = {f.name: f.read_bytes() for f in src.iterdir() if f.is_file() and f.suffix in (".log", ".txt")
            and f.name not in ("log.txt", "story.txt")}
    with Run(STEM_FILE, args, out=args.out) as run:
        run.reanalysis_of(prev, src)
        for n in prev.get("notes", []):
            if "skipped" in n:
                run.note(n)
        for name, data in keep.items():
            run.path(name).write_bytes(data)
        have = (prev.get("provenance") or {}).get("gpu_count") or int(df["tp"].max())
        report(run, df, akd, gpu.parse_topo(topo_text).get("links", {}) if topo_text else {}, have,
               (prev.get("provenance") or {}).get("gpu") or "GPU")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    serving.require_sglang()
    have = serving.require_gpus(1)
    pd = require_module("pandas")
    wanted = parse_configs(args.configs or (QUICK_CONFIGS if args.quick else FULL_CONFIGS))
    fits = [(p, t) for p, t in wanted if t <= have]
    if not fits:
        raise SetupError(f"no requested configuration fits: TP sizes {sorted({t for _, t in wanted})} need more GPUs "
                         f"than the {have} visible")
    merged = load_merge(args.merge, pd) if args.merge else None
    with Run(STEM_FILE, args, out=args.out) as run:
        if merged is not None:
            run.note(f"rows of configurations not measured in this run come from {Path(args.merge).resolve()} "
                     f"(their 'measured' column: {', '.join(sorted(set(merged[0]['measured'])))})")
        for p, t in wanted:
            if t > have:
                run.note(f"{p} at TP={t} needs {t} GPUs; {have} visible: skipped")
        topo = gpu.topology()
        run.path("topology.txt").write_text(topo.get("text") or "nvidia-smi topo -m unavailable")
        links = topo.get("links", {})
        run.log(f"{have} GPU(s); links {sorted(set(links.values())) or '-'}; env "
                + " ".join(f"{k}={os.environ.get(k, v)}" for k, v in SAFE_ENV.items()))
        prof_dir = run.dir / "profiles"
        runs, ar_rows = [], []
        largest = max(t for _, t in fits)
        plan = [(p, t, False) for p, t in fits]
        if not args.no_nccl_compare and largest >= 2:      # NCCL only, right after the config it is compared with
            at = next(i for i, (p, t, _) in enumerate(plan) if t == largest)
            plan.insert(at + 1, (plan[at][0], largest, True))
        t_start, took = time.time(), []
        for preset, tp, no_car in plan:
            label = f"{preset} TP={tp}{' NCCL only' if no_car else ''}"
            guess = statistics.mean(took) if took else 120.0
            if args.time_budget and time.time() - t_start + guess > 60 * args.time_budget:
                run.note(f"{label}: skipped, the --time-budget of {args.time_budget:g} min would be exceeded "
                         f"(a configuration took {guess:.0f} s so far)")
                continue
            t_cfg = time.time()
            try:
                model_dir = str(models.write_model_dir(preset))
                fl = flags(load_format="dummy", tp_size=tp, attention_backend=args.backend, mem_fraction_static=args.mem_fraction,
                           enable_metrics=True, log_level="info", decode_log_interval=1,
                           cuda_graph_max_bs_decode=64 if args.quick else None,
                           disable_prefill_cuda_graph=True if args.quick else None,   # quick: ~15 s less start-up
                           disable_custom_all_reduce=no_car)
                with Server(model_dir, fl, port=args.port, log_path=run.path(f"server_{preset}_tp{tp}{'_nccl' if no_car else ''}.log"),
                            echo=run.log, start_timeout=args.start_timeout, env={"SGLANG_LOG_MS": "1", **SAFE_ENV,
                            "SGLANG_PROFILE_WITH_STACK": "false", "SGLANG_PROFILE_RECORD_SHAPES": "false"},
                            name=f"server[{label}]") as srv:
                    row, ar = measure(srv, tp, run, prof_dir / f"{preset}_tp{tp}{'_nccl' if no_car else ''}", args.quick)
                    row = {"model": preset, "tp": tp, "custom_allreduce": not no_car, "start_s": srv.startup_s, **row}
                runs.append(row)
                ar_rows += [{"model": preset, "tp": tp, "custom_allreduce": not no_car, **a} for a in ar]
                run.log(f"{label}: ITL b1 {row['itl_b1_ms']:.2f} ms, decode step {story.fmt(row['decode_step_gpu_ms'])} ms, "
                        f"all-reduce {story.fmt(row['allreduce_share_pct'])}% ({row['allreduce_kernels']}), "
                        f"{row['output_throughput']:.0f} out tok/s")
            except Exception as e:
                run.point_error({"model": preset, "tp": tp, "custom_allreduce": not no_car}, e)
            took.append(time.time() - t_cfg)
        if not runs:
            raise RuntimeError("no configuration ran; see point_errors and server_*.log")
        df, akd = pd.DataFrame(runs), pd.DataFrame(ar_rows)
        if len(df):
            df["measured"] = "this run"
        if merged is not None:
            df = merge_rows(df, merged[0])
            old_akd = merged[1]
            if len(old_akd) and "launches" not in old_akd.columns:
                old_akd = old_akd.groupby(["model", "tp", "custom_allreduce", "kernel"]).size().rename("launches").reset_index()
            if len(akd):
                akd = akd.groupby(["model", "tp", "custom_allreduce", "kernel"]).size().rename("launches").reset_index()
            akd = merge_rows(akd, old_akd)
        report(run, df, akd, links, have, gpu.gpus()[0]["name"])
    return 0


if __name__ == "__main__":
    run_main(main)
