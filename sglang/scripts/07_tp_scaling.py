#!/usr/bin/env python3
"""07 · Tensor parallelism on one node (2-8 GPUs): latency, throughput, all-reduce share.

What it measures (dummy weights; one SGLang server per configuration, SGLang's default CUDA graphs)
    Llama-3.1-8B at TP = 1, 2, 4 and Llama-3.1-70B at TP = 2, 4 (--quick: 8B at TP 1, 2). For each:
      * batch-1 TTFT, part by part (_sgl07_parts): the first request after the start under the torch
        profiler, 5 untraced requests (the steady TTFT, judged on their interval) and one more traced, each a
        new 512-token prompt; each traced prefill forward split on its trace (scheduling, plan, GPU forward,
        sampling...), its kernels per class and its all-reduce launches with their message size;
      * batch-1 ITL of one streamed request (512 in, 128 out), judged on the interval of its 127 samples;
      * a traced decode window (batch 16, 1024-token contexts, 8 steps, torch profiler on every rank):
        per decode step the GPU time, the time per kernel class, every collective launch (SGLang's custom
        all-reduce vs NCCL, its message size), and the step of median span kernel by kernel; each step is one
        sample;
      * throughput at --request-rate inf (sglang.benchmark.serving).
    Then the same at the largest TP that fits with --disable-custom-all-reduce (NCCL only), run
    right after the custom all-reduce configuration it is compared with; the two are judged per call at each
    message size (decode: batch 16 x hidden x bf16; prefill: 512 tokens x hidden x bf16).
    Each configuration's server is launched while the one before measures: it imports (most of a start is
    Python) and waits at a gate (_sgl_gate) before it touches the GPU, released once the one before has
    stopped (--no-overlap: one after the other).
    The GPU topology (`nvidia-smi topo -m`) and NUMA layout are saved with the results.
    --configs given on the command line must fit the visible GPUs (checked before any server starts);
    of the default configurations, those needing more GPUs than visible are skipped with a note. A rank
    that dies ends its configuration with the server's last log lines; the whole process group is
    stopped either way. NVLink multicast stays off (common.capture.procs.nccl_env: NCCL_NVLS_ENABLE=0,
    TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1; --enable-nccl-nvls / --enable-symm-mem refused).

What the plan expected (hypotheses in H below, with ranges and sources)
    * The communication/compute ratio is the thing to measure; TP over NVLink all-reduces fast.
      Restated: decode ITL improves sub-linearly with TP; the all-reduce share of a decode step
      grows with TP; decode all-reduces use the custom kernel (a name: observed, not judged);
      --disable-custom-all-reduce slows small-batch decode.

Run
    python sglang/scripts/07_tp_scaling.py --quick        # 8B at TP 1, 2 (needs 2 GPUs), ~5 min warm
    python sglang/scripts/07_tp_scaling.py                # 8B TP 1/2/4 + 70B TP 2/4 (runs what fits)
    python sglang/scripts/07_tp_scaling.py --configs 'llama-3.1-70b:2,4'
    python sglang/scripts/07_tp_scaling.py --configs 'llama-3.1-8b:1,4;llama-3.1-70b:4' --time-budget 8
    python sglang/scripts/07_tp_scaling.py --configs 'llama-3.1-70b:2' --no-nccl-compare --merge OLD_DIR
    python sglang/scripts/07_tp_scaling.py --reanalyse sglang/results/07_tp_scaling   # no GPU
Writes sglang/results/07_tp_scaling/: tp_runs.csv, allreduce_kernels.csv, ttft_parts.csv, step_classes.csv,
collectives.csv (+ collectives_summary.csv), step_timeline.csv, topology.txt, tp_scaling.png, tp_decode_step.png,
ttft_parts.png, server_*.log, bench/, profiles/, story.txt, summary.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sglang as sg  # noqa: E402
import _sgl07_parts as parts  # noqa: E402
from common.base import stats, story  # noqa: E402
from common.base.checks import require_modules, run_main, SetupError  # noqa: E402
from common.capture import gpu, procs  # noqa: E402
from common.capture.gpu import machine_of  # noqa: E402
from common.capture.store import load_summary  # noqa: E402
from common.tables import trace  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.run import cli  # noqa: E402
from common.run.results import Run  # noqa: E402

FULL_CONFIGS = "llama-3.1-8b:1,2,4;llama-3.1-70b:2,4"
QUICK_CONFIGS = "llama-3.1-8b:1,2"
DECODE_BS, DECODE_STEPS = 16, 8
PLAN = "sglang/reports/plan.md, experiment 07"
H = declare(f"""
    sublinear = tp-itl-sublinear: decode ITL improves with TP, but sub-linearly
        judged on: batch-1 ITL speed-up from the smallest to the largest TP (ratio of bootstrap intervals of the ITL
            samples); confirmed between 1 and the ideal
        confirmed: >= 1
        source: {PLAN}: 'decode ITL improves sub-linearly with TP'
    share = tp-allreduce-share-grows: the all-reduce share of a decode step grows with TP
        judged on: smallest rise of the all-reduce share between consecutive TP sizes (intervals over the traced
            steps)
        confirmed: >= 0 pp
        source: {PLAN}: 'the all-reduce share of a decode step grows with TP'
    nccl_itl = nccl-only-slower: --disable-custom-all-reduce (NCCL only) makes small-batch decode slower
        judged on: batch-1 ITL NCCL only / custom all-reduce (ratio of bootstrap intervals)
        confirmed: >= 1
        source: {PLAN}: '--disable-custom-all-reduce slows small-batch decode'
    nccl_ar = custom-ar-less-time: the custom all-reduce spends less GPU time per decode step than NCCL's (batch 16)
        judged on: all-reduce us per decode step, NCCL only / custom (ratio of intervals over the traced steps)
        confirmed: >= 1
        source: {PLAN}: 'decode all-reduces use the custom kernel'
    ttft = ttft-falls-with-tp: batch-1 TTFT of a steady request (the first request's one-time costs aside) falls as TP
            grows
        judged on: steady TTFT at the smallest TP / at the largest (ratio of the intervals of 6 untraced 512-token
            requests each)
        confirmed: >= 1
        source: {PLAN} (TP splits each layer's GEMMs over the GPUs); a first request's TTFT doubled at TP 2 before
    ar_call = custom-ar-per-call: SGLang's custom all-reduce kernel takes less time per call than NCCL's at this
            message size
        judged on: us per all-reduce launch, NCCL only / custom (ratio of the intervals of the launches' durations)
        confirmed: >= 1
        source: {PLAN}: 'decode all-reduces use the custom kernel'; SGLang keeps it to messages below its buffer
""")


def configs(text: str) -> list[tuple[str, int]]:
    """argparse type: 'llama-3.1-8b:1,2;llama-3.1-70b:2' -> [('llama-3.1-8b', 1), ('llama-3.1-8b', 2), ('llama-3.1-70b', 2)]."""
    out = []
    for part in filter(None, (x.strip() for x in str(text).split(";"))):
        preset, sep, tps = part.partition(":")
        try:
            if not sep:
                raise argparse.ArgumentTypeError("no ':tp,tp' part")
            out += [(cli.preset(preset.strip()), t) for t in cli.positive_ints(tps)]
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"bad entry {part!r} ({e}); expected 'preset:tp,tp;preset:tp'") from None
    if not out:
        raise argparse.ArgumentTypeError(f"no configuration in {text!r}; expected 'preset:tp,tp;preset:tp'")
    return out


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick=f"configs {QUICK_CONFIGS!r}, fewer requests")
    p.add_argument("--configs", type=configs, default=None,
                   help=f"'preset:tp,tp;preset:tp' (default {FULL_CONFIGS!r}); each TP must fit the visible GPUs")
    p.add_argument("--no-nccl-compare", action="store_true", help="skip the --disable-custom-all-reduce run")
    p.add_argument("--no-overlap", action="store_true",
                   help="start each configuration's server only after the one before has stopped (default: launched "
                        "while the one before measures, held at a gate before it touches the GPU)")
    p.add_argument("--reanalyse", metavar="DIR", default=None,
                   help="no GPU, no server: redo tables, verdicts and story from the CSVs an earlier run left in DIR")
    p.add_argument("--merge", metavar="DIR", default=None,
                   help="also report the configurations an earlier run recorded in DIR (its tp_runs.csv), each row "
                        "marked with the date and commit it was measured at; configurations measured now replace them")
    p.add_argument("--time-budget", type=cli.positive_float, default=None, metavar="MIN",
                   help="start no further configuration once it would likely end past MIN minutes (the ones "
                        "left are noted as skipped; the run still finishes with what it measured)")
    sg.add_model_args(p, preset=False, mem_fraction=0.85, start_timeout=1800)
    return p.parse_args(argv)


def fitting(wanted, explicit: bool) -> tuple[int, list, list]:
    """(visible GPUs, configurations that fit, those that do not). Configurations named with --configs must
    all fit (SetupError before any server starts); of the defaults at least one must."""
    sizes = [t for _, t in wanted]
    have = cli.check_gpus_for(max(sizes) if explicit else min(sizes),
                              f"--configs {', '.join(f'{p}:{t}' for p, t in wanted)}" if explicit else "07_tp_scaling")
    return have, [c for c in wanted if c[1] <= have], [c for c in wanted if c[1] > have]


# ------------------------------------------------------------------ intervals kept in the rows

def iv_cols(name: str, values) -> dict:
    """``name`` (the median) and its interval (common.base.stats.interval) as row columns."""
    iv = stats.interval(values)
    return {name: iv.point, f"{name}_lo": iv.lo, f"{name}_hi": iv.hi, f"{name}_n": iv.n}


def iv_of(row, name: str) -> stats.Interval:
    """The interval of ``name`` kept in a row; a row of an older run without one is a single sample."""
    v = row.get(name)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return stats.Interval(math.nan, math.nan, math.nan, 0, "none")
    lo, hi, n = row.get(f"{name}_lo"), row.get(f"{name}_hi"), row.get(f"{name}_n")
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return stats.Interval(float(v), float(v), float(v), 1, "single")
    return stats.Interval(float(v), float(lo), float(hi), int(n), "kept")


def difference(a: stats.Interval, b: stats.Interval) -> stats.Interval:
    """a - b from two independent intervals (worst-case bounds)."""
    return stats.Interval(a.point - b.point, a.lo - b.hi, a.hi - b.lo, min(a.n, b.n), "difference")


# ------------------------------------------------------------------ measure

TABLES = ("tp_runs", "allreduce_kernels", "ttft_parts", "step_classes", "collectives", "step_timeline")


def measure(srv, tp: int, run, prof_dir: Path, quick: bool, key: dict, hidden: int) -> tuple[dict, dict]:
    """One configuration: (its tp_runs row, {table: rows} of its parts)."""
    rec = parts.ttft_phase(srv, prof_dir, tp)
    tt = parts.ttft_rows(rec, key, hidden)
    for n in tt["notes"]:
        run.note(n)
    one = srv.generate(input_ids=sg.random_ids(512, 1), stream=True, sampling_params={**sg.GREEDY, "max_new_tokens": 128})
    if one["meta_info"]["completion_tokens"] != 128:
        raise RuntimeError(f"sanity: {one['meta_info']['completion_tokens']} tokens instead of 128")
    row = {"ttft_first_ms": tt["first_ttft_ms"], "ttft_traced_ms": tt["traced_ttft_ms"],
           **iv_cols("ttft_b1_ms", tt["steady_ttft_ms"] + [one["client"]["ttft_s"] * 1e3]),
           **iv_cols("itl_b1_ms", [x * 1e3 for x in one["client"]["itl_s"]])}
    srv.flush_cache()
    reqs = [{"input_ids": sg.random_ids(1024, 10 + i), "sampling_params": {**sg.GREEDY, "max_new_tokens": 64}}
            for i in range(DECODE_BS)]
    (files, _), _ = srv.while_decoding(reqs, lambda: srv.traced(prof_dir / "decode", lambda: time.sleep(0.5),
                                                                num_steps=DECODE_STEPS, ranks=tp), running=DECODE_BS, timeout=600)
    ev = trace.read_chrome_trace(parts.rank0(files))
    kt, st = sg.steps(ev)
    steps = [s for s in st if s["mode"] == "DECODE"]
    ar = kt[(kt["mode"] == "DECODE") & (kt["cls"] == "allreduce")].to_dict("records")
    classes, colls, tl = parts.decode_rows(ev, key, hidden)
    row.update(decode_bs=DECODE_BS, decode_step_gpu_ms=statistics.median(s["dur_us"] for s in steps) / 1e3 if steps else None,
               kernel_us_per_step=statistics.median(s["kernel_us"] for s in steps) if steps else math.nan,
               **iv_cols("allreduce_us_per_step", [s.get("allreduce_us", 0.0) for s in steps]),
               **iv_cols("allreduce_share_pct", [100 * s.get("allreduce_us", 0.0) / s["kernel_us"] for s in steps
                                                 if s["kernel_us"]]),
               allreduce_launches_per_step=len(ar) / max(len(steps), 1),
               allreduce_kernels=";".join(sorted({k["kernel"] for k in ar})) or "-", trace_files=len(files))
    srv.flush_cache()
    rec_b = sg.run_bench(srv, run.dir / "bench", f"tp{tp}_{int(time.time())}", num_prompts=64 if quick else 128,
                         input_len=1024, output_len=128 if quick else 256, rate="inf", echo=run.log, timeout=1800)
    row.update(output_throughput=rec_b["output_throughput"], ttft_p50_ms=rec_b["median_ttft_ms"],
               itl_p50_ms=rec_b["median_itl_ms"], itl_p99_ms=rec_b["p99_itl_ms"])
    return row, {"allreduce_kernels": [{**key, "kernel": k["kernel"]} for k in ar], "ttft_parts": tt["parts"],
                 "step_classes": tt["classes"] + classes, "collectives": tt["collectives"] + colls, "step_timeline": tl}


def run_plan(fits, no_nccl: bool) -> list[tuple[str, int, bool]]:
    """Every fitting configuration with custom all-reduce; NCCL only right after the largest TP."""
    plan = [(p, t, False) for p, t in fits]
    largest = max(t for _, t in fits)
    if not no_nccl and largest >= 2:
        at = next(i for i, (_p, t, _n) in enumerate(plan) if t == largest)
        plan.insert(at + 1, (plan[at][0], largest, True))
    return plan


def names(preset: str, tp: int, no_car: bool) -> tuple[str, str]:
    return f"{preset} TP={tp}{' NCCL only' if no_car else ''}", f"{preset}_tp{tp}{'_nccl' if no_car else ''}"


def server_for(args, run, preset: str, tp: int, no_car: bool, gate=None):
    """(the configuration's Server, not started; its model folder). ``gate``: launched held at that gate."""
    label, tag = names(preset, tp, no_car)
    model_dir, base = sg.model_and_flags(args, preset=preset)
    fl = base + sg.flags(tp_size=tp, attention_backend=args.backend, enable_metrics=True, log_level="info",
                         decode_log_interval=1, cuda_graph_max_bs_decode=64 if args.quick else None,
                         disable_custom_all_reduce=no_car)
    env = {**sg.TRACE_ENV, **(gate.env() if gate is not None else {})}
    return sg.Server(model_dir, fl, port=args.port, log_path=run.path(f"server_{tag}.log"), echo=run.log,
                     start_timeout=args.start_timeout, env=env, name=f"server[{label}]"), model_dir


class Held:
    """The next configuration's server, launched now and held at its gate: its processes import while this one
    measures; :meth:`ready` releases it once the GPU is free and proves it waited (Gate.verify)."""

    def __init__(self, args, run, cfg):
        self.cfg, self.t0 = cfg, time.time()
        self.gate = sg.Gate(run.dir / f"gate-{names(*cfg)[1]}")
        self.srv, self.model_dir = server_for(args, run, *cfg, gate=self.gate)
        self.srv.launch()

    def ready(self) -> tuple[float, float]:
        """Release, wait until it serves: (seconds held, seconds from the release to ready)."""
        self.gate.release(self.srv)
        t1 = time.time()
        self.srv.start_timeout += t1 - self.t0
        self.srv.wait_ready()
        return self.gate.verify(self.srv), time.time() - t1

    def drop(self) -> None:
        self.srv.stop()
        shutil.rmtree(self.gate.folder, ignore_errors=True)       # its plugin copy: no result


def measure_all(args, plan, run) -> tuple[list, dict]:
    runs, tables, t_start, took = [], {t: [] for t in TABLES[1:]}, time.time(), []
    overlap = not args.no_overlap and args.port is None
    nxt: Held | None = None
    try:
        for i, (preset, tp, no_car) in enumerate(plan):
            label, tag = names(preset, tp, no_car)
            guess = statistics.mean(took) if took else 120.0
            if nxt is not None and nxt.cfg != (preset, tp, no_car):
                nxt.drop()
                nxt = None
            if args.time_budget and time.time() - t_start + guess > 60 * args.time_budget:
                run.note(f"{label}: skipped, the --time-budget of {args.time_budget:g} min would be exceeded "
                         f"(a configuration took {guess:.0f} s so far)")
                continue
            t_cfg, cur, srv = time.time(), None, None
            try:
                if nxt is not None and nxt.cfg == (preset, tp, no_car):
                    cur, nxt = nxt, None
                    srv, model_dir = cur.srv, cur.model_dir
                    held_s, start_s = cur.ready()
                else:
                    srv, model_dir = server_for(args, run, preset, tp, no_car)
                    srv.start()
                    held_s, start_s = 0.0, srv.startup_s
                if overlap and i + 1 < len(plan) and nxt is None:
                    try:
                        nxt = Held(args, run, plan[i + 1])
                    except Exception as e:  # noqa: BLE001 - then it starts after this one, as with --no-overlap
                        run.note(f"{names(*plan[i + 1])[0]}: not launched early ({str(e).splitlines()[0][:160]})")
                key = {"model": preset, "tp": tp, "custom_allreduce": not no_car}
                hidden = int(sg.model_shape(model_dir)["config"]["hidden_size"])
                row, rows = measure(srv, tp, run, run.dir / "profiles" / tag, args.quick, key, hidden)
                row = {**key, "start_s": start_s, "held_s": held_s, **row}
                runs.append(row)
                for t, rr in rows.items():
                    tables[t] += rr
                run.log(f"{label}: TTFT b1 first {row['ttft_first_ms']:.1f} ms, steady {row['ttft_b1_ms']:.1f} ms; ITL b1 "
                        f"{row['itl_b1_ms']:.2f} ms, decode step {story.fmt(row['decode_step_gpu_ms'])} ms, all-reduce "
                        f"{story.fmt(row['allreduce_share_pct'])}% ({row['allreduce_kernels']}), "
                        f"{row['output_throughput']:.0f} out tok/s")
            except Exception as e:  # noqa: BLE001 - a configuration fails (a rank died): the others go on
                run.point_error({"model": preset, "tp": tp, "custom_allreduce": not no_car}, e)
            finally:
                if cur is not None:
                    cur.drop()
                elif srv is not None:
                    srv.stop()
            took.append(time.time() - t_cfg)
    finally:
        if nxt is not None:
            nxt.drop()
    if overlap and len(plan) > 1:
        run.note("each configuration's server after the first was launched while the one before measured: it imported, "
                 "then waited at a gate before touching the GPU until the one before had stopped (--no-overlap: one "
                 "after the other); start_s counts from its release, held_s is the wait")
    return runs, tables


# ------------------------------------------------------------------ tables, figures, verdicts, story

def figure(run, df) -> None:
    """Batch-1 ITL and throughput at rate inf against TP size, one line per model (custom all-reduce)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from common.render import plots
    car = df[df["custom_allreduce"].map(parts.is_true)]
    sty = plots.styles(sorted(set(car["model"])))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for m, g in car.groupby("model"):
        g = g.sort_values("tp")
        col, mk = sty[m]
        a1.plot(g["tp"], g["itl_b1_ms"], marker=mk, color=col, label=m)
        a2.plot(g["tp"], g["output_throughput"], marker=mk, color=col, label=m)
    a1.set(xlabel="TP size", ylabel="ITL at batch 1 (ms)", title="latency")
    a2.set(xlabel="TP size", ylabel="output tok/s at rate inf", title="throughput")
    for a in (a1, a2):
        a.grid(True, alpha=0.3)
        a.legend(fontsize=8)
    run.figure("tp_scaling", fig)


def mine(h, where: str):
    """The hypothesis as judged for one model (or configuration): its claim names it, so each has one verdict."""
    return dataclasses.replace(h, claim=f"{where}: {h.claim}")


def verdicts(run, df, t: dict, links: dict) -> None:
    car = df[df["custom_allreduce"].map(parts.is_true)]
    for m, g in car.groupby("model"):
        rows = g.sort_values("tp").to_dict("records")
        if len(rows) < 2:
            continue
        lo, hi = rows[0], rows[-1]
        ideal = hi["tp"] / lo["tp"]
        run.judge(dataclasses.replace(H["sublinear"], high=ideal, claim=f"{m}: {H['sublinear'].claim}"), stats.ratio_interval(iv_of(lo, "itl_b1_ms"),
                  iv_of(hi, "itl_b1_ms")), evidence="tp_runs.csv", detail=f"{m} TP {lo['tp']} -> {hi['tp']}: ITL "
                  f"{lo['itl_b1_ms']:.2f} -> {hi['itl_b1_ms']:.2f} ms (ideal x{ideal:.0f})")
        diffs = [difference(iv_of(b, "allreduce_share_pct"), iv_of(a, "allreduce_share_pct")) for a, b in zip(rows, rows[1:])]
        run.judge(mine(H["share"], m), min(diffs, key=lambda d: d.lo), evidence="tp_runs.csv", detail=f"{m}: " + " -> ".join(
            f"TP {r['tp']}: {story.fmt(r['allreduce_share_pct'])}%" for r in rows))
    multi = car[car["tp"] >= 2]
    if len(multi):
        seen = set(";".join(multi["allreduce_kernels"]).split(";")) - {"-"}
        ar, ag = sorted(k for k in seen if not parts.is_allgather(k)), sorted(k for k in seen if parts.is_allgather(k))
        run.observe("decode all-reduces (small messages) use SGLang's custom all-reduce kernel, not NCCL "
                    "(kernel names: observed, not judged; the logits all-gather is a different collective)",
                    f"all-reduce kernels in decode steps: {', '.join(ar) or '-'}; all-gather: {', '.join(ag) or '-'}",
                    "confirmed" if ar and not any("nccl" in k.lower() for k in ar) else "refuted", "allreduce_kernels.csv")
    for n in df[~df["custom_allreduce"].map(parts.is_true)].to_dict("records"):
        c = car[(car["model"] == n["model"]) & (car["tp"] == n["tp"])].to_dict("records")
        if not c:
            continue
        c = c[0]
        where = f"{n['model']} TP {n['tp']}"
        run.judge(mine(H["nccl_itl"], where), stats.ratio_interval(iv_of(n, "itl_b1_ms"), iv_of(c, "itl_b1_ms")), evidence="tp_runs.csv",
                  detail=f"{where}: ITL b1 {c['itl_b1_ms']:.2f} ms (custom) vs {n['itl_b1_ms']:.2f} ms (NCCL)")
        run.judge(mine(H["nccl_ar"], where), stats.ratio_interval(iv_of(n, "allreduce_us_per_step"), iv_of(c, "allreduce_us_per_step")),
                  evidence="tp_runs.csv", detail=f"{where}: collectives {story.fmt(c['allreduce_us_per_step'])} us/step "
                  f"({story.fmt(c['allreduce_share_pct'])}%) custom vs {story.fmt(n['allreduce_us_per_step'])} us/step "
                  f"({story.fmt(n['allreduce_share_pct'])}%) NCCL only")
    for m, g in car.groupby("model"):
        rows = g.sort_values("tp").to_dict("records")
        if len(rows) < 2 or "ttft_first_ms" not in g.columns:
            continue
        lo, hi = rows[0], rows[-1]
        run.judge(mine(H["ttft"], m), stats.ratio_interval(iv_of(lo, "ttft_b1_ms"), iv_of(hi, "ttft_b1_ms")),
                  evidence="tp_runs.csv",
                  detail=f"{m} TP {lo['tp']} -> {hi['tp']}: steady TTFT {story.fmt(lo['ttft_b1_ms'])} -> "
                  f"{story.fmt(hi['ttft_b1_ms'])} ms; first request {story.fmt(lo.get('ttft_first_ms'))} -> "
                  f"{story.fmt(hi.get('ttft_first_ms'))} ms (traced)")
    for p in parts.per_call_pairs(t.get("collectives")):
        if p["phase"] == "prefill first":
            continue
        size = parts.size_text(p["msg_bytes"]) if p["msg_bytes"] else "?"
        h = dataclasses.replace(H["ar_call"], id=f"custom-ar-per-call-{p['phase'].replace(' ', '-')}-{p['model']}-tp{p['tp']}",
                                claim=f"{p['model']} TP {p['tp']}, {p['phase']} ({size}): {H['ar_call'].claim}")
        c, n = stats.interval(p["custom"]), stats.interval(p["nccl"])
        run.judge(h, stats.ratio_interval(n, c), evidence="collectives.csv",
                  detail=f"{p['model']} TP {p['tp']}, {p['phase']} all-reduce of {size}: custom "
                  f"{', '.join(p['custom_kernels'])} {story.fmt(c.point)} us ({len(p['custom'])} launches) vs NCCL "
                  f"{', '.join(p['nccl_kernels'])} {story.fmt(n.point)} us ({len(p['nccl'])} launches)")
    pairs = {tuple(sorted(k.split("-"))): v for k, v in links.items()}     # topo -m lists each pair twice
    nv = [v for v in pairs.values() if v.startswith("NV")]
    run.observe("the plan's box mixed NVLink pairs and PCIe across NUMA nodes; here the topology is recorded",
                f"{len(nv)} of {len(pairs)} GPU pairs on NVLink ({', '.join(sorted(set(pairs.values()))) or 'one GPU'})",
                "inconclusive" if not pairs else ("confirmed" if 0 < len(nv) < len(pairs) else "refuted"), "topology.txt")


def report(run, df, t: dict, links: dict, have: int, gpu_name: str) -> None:
    """Tables, figures, verdicts and story from the per-configuration rows (``df``: tp_runs) and the parts' tables
    (``t``: {name: DataFrame} of TABLES[1:]: the collectives seen, TTFT parts, step classes, one decode step)."""
    import pandas as pd
    sg.table(run, "tp_runs", df)
    akd = t.get("allreduce_kernels")
    if akd is not None and len(akd) and "launches" not in akd.columns:
        akd = akd.groupby(["model", "tp", "custom_allreduce", "kernel"]).size().rename("launches").reset_index()
    t = {**t, "allreduce_kernels": akd if akd is not None else pd.DataFrame()}
    for name in TABLES[1:]:
        if t.get(name) is not None and len(t[name]):
            sg.table(run, name, t[name])
    summ = parts.collective_summary(t.get("collectives"))
    if summ:
        sg.table(run, "collectives_summary", summ)
    runs = df.to_dict("records")
    for r in runs:
        run.headline(**{f"itl_b1_ms_{r['model']}_tp{r['tp']}{'' if parts.is_true(r['custom_allreduce']) else '_nccl'}": r["itl_b1_ms"]})
    car = df[df["custom_allreduce"].map(parts.is_true)].sort_values("tp")
    if len(car) and car["tp"].iloc[-1] >= 2:
        top = car.iloc[-1]
        run.headline(**{f"allreduce_share_pct_{top['model']}_tp{top['tp']}": top["allreduce_share_pct"]})
    figure(run, df)
    tl = t.get("step_timeline")
    if tl is not None and len(tl):
        run.figure("tp_decode_step", parts.step_figure(tl, f"One batch-16 decode step per configuration (the step of "
                                                           f"median GPU span, rank 0) — {have}x {gpu_name}"))
    pp = t.get("ttft_parts")
    if pp is not None and len(pp):
        run.figure("ttft_parts", parts.ttft_figure(pp, "Batch-1 TTFT part by part: the first request after the start "
                                                       "(traced), the steady median (untraced), a steady one traced"))
    verdicts(run, df, t, links)
    parts.findings(run, car, t)
    parts.wait_findings(run, t.get("collectives"))

    def when(r):
        m = r.get("measured")
        return "" if not isinstance(m, str) or m == "this run" else f"; measured {m}"

    def start(r):
        held = r.get("held_s")
        return (f"start {r['start_s']:.0f} s" + (f" after its release, held {held:.0f} s while the one before measured"
                                                 if isinstance(held, float) and held > 0 else ""))
    items = [(f"{r['model']} TP={r['tp']} {'custom AR' if parts.is_true(r['custom_allreduce']) else 'NCCL only'} "
              f"({start(r)}{when(r)})",
              [(f"batch 1: TTFT {r['ttft_b1_ms']:.1f} ms, ITL {iv_of(r, 'itl_b1_ms').fmt(3, 'ms')}", []),
               (f"decode bs {r['decode_bs']}: step {story.fmt(r['decode_step_gpu_ms'])} ms GPU, all-reduce "
                f"{story.fmt(r['allreduce_us_per_step'])} us/step = {story.fmt(r['allreduce_share_pct'])}% "
                f"({story.fmt(r['allreduce_launches_per_step'])} launches: {r['allreduce_kernels']})", []),
               (f"rate inf: {r['output_throughput']:.0f} out tok/s, TTFT p50 {r['ttft_p50_ms']:.0f} ms, ITL p50 "
                f"{r['itl_p50_ms']:.1f} / p99 {r['itl_p99_ms']:.1f} ms", [])]) for r in runs]
    if pp is not None and len(pp):
        items.append(("TTFT AT BATCH 1 — the first request after the start beside steady ones (parts in ms; the "
                      "traced prefill forward split on its trace)", parts.ttft_lines(runs, pp)))
    cl = t.get("step_classes")
    if cl is not None and len(cl):
        items.append(("STEPS BY KERNEL CLASS — us per step (share of the step's kernel time)",
                      parts.class_lines(runs, cl, "decode") + parts.class_lines(runs, cl, "prefill")))
    if summ:
        items.append(("COLLECTIVES — per launch, by message size (rank 0)", [
            (f"{parts.label(c)} {c['phase']}: {c['collective']} {c['kernel']}: {story.fmt(c['per_step'])} per step, "
             f"{story.fmt(c['us_median'])} us [{story.fmt(c['us_lo'])}, {story.fmt(c['us_hi'])}], shortest "
             f"{story.fmt(c['us_min'])} us"
             + (f", {parts.size_text(c['msg_bytes'])}" if c["msg_bytes"] else ""), []) for c in summ]))
    items.append((f"topology: {', '.join(f'{k}={v}' for k, v in list(links.items())[:8]) or 'single GPU'}", []))
    run.story(story.tree(f"TENSOR PARALLEL SCALING — {have}x {gpu_name}", items), echo=True)


# ------------------------------------------------------------------ earlier runs: merge, reanalyse

def read_tables(src: Path, pd) -> dict:
    """{name: DataFrame} of the TABLES a run left in ``src`` (an absent one: empty)."""
    return {n: pd.read_csv(src / f"{n}.csv") if (src / f"{n}.csv").exists() else pd.DataFrame() for n in TABLES}


def load_merge(src: Path, pd) -> tuple:
    """An earlier run's tables (TABLES) with a ``measured`` column in tp_runs (its date, machine and commit) and that
    run's summary; a missing DIR or CSV is a one-line error."""
    src = Path(src).resolve()
    if not (src / "tp_runs.csv").exists():
        raise SetupError(f"--merge {src}: no tp_runs.csv there (written by 07_tp_scaling.py)")
    prev = load_summary(src) or {}
    prov = prev.get("provenance") or {}
    git = prov.get("git") or {}
    tag = (f"{str(prov.get('date_utc', '?'))[:16]} on {machine_of(prov)} @ {git.get('commit', '?')}" if prov else src.name)
    t = read_tables(src, pd)
    df = t["tp_runs"]
    if "measured" not in df.columns:
        df["measured"] = tag
    df["measured"] = [tag if m == "this run" or not isinstance(m, str) else m for m in df["measured"]]  # a merged run's own rows
    return t, prev


def merge_rows(now, before, key=("model", "tp", "custom_allreduce")):
    """``now`` plus the rows of ``before`` whose configuration was not measured now."""
    import pandas as pd
    if before is None or not len(before):
        return now
    if now is None or not len(now):
        return before
    have = set(map(tuple, now[list(key)].astype(str).values))
    keep = before[[tuple(r) not in have for r in before[list(key)].astype(str).values]]
    return pd.concat([now, keep], ignore_index=True)


def main_reanalyse(args) -> int:
    """Tables, verdicts and story again from an earlier run's CSVs (no GPU, no server)."""
    pd, _ = require_modules(("pandas", None), ("matplotlib", None))
    src = Path(args.reanalyse).resolve()
    if not (src / "tp_runs.csv").exists():
        raise SetupError(f"{src}: no tp_runs.csv to re-analyse (written by 07_tp_scaling.py)")
    t = read_tables(src, pd)
    topo_text = (src / "topology.txt").read_text() if (src / "topology.txt").exists() else ""
    prev = load_summary(src) or {}
    keep = {f.name: f.read_bytes() for f in src.iterdir() if f.is_file() and f.suffix in (".log", ".txt")
            and f.name not in ("log.txt", "story.txt")}
    with Run(__file__, args, out=args.out) as run:
        run.reanalysis_of(prev, src)
        for n in prev.get("notes", []):
            if "skipped" in n or "launched while" in n or "not split" in n or "come from" in n:
                run.note(n)
        for name, data in keep.items():
            run.path(name).write_bytes(data)
        have = (prev.get("provenance") or {}).get("gpu_count") or int(t["tp_runs"]["tp"].max())
        report(run, t["tp_runs"], {n: t[n] for n in TABLES[1:]}, gpu.parse_topo(topo_text).get("links", {}) if topo_text
               else {}, have, (prev.get("provenance") or {}).get("gpu") or "GPU")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    pd = sg.require_stack(gpus=None)         # the TP sizes that fit are checked below
    wanted = args.configs or configs(QUICK_CONFIGS if args.quick else FULL_CONFIGS)
    have, fits, skipped = fitting(wanted, explicit=args.configs is not None)
    merged = load_merge(args.merge, pd) if args.merge else None
    with Run(__file__, args, out=args.out) as run:
        if merged is not None:
            run.note(f"rows of configurations not measured in this run come from {Path(args.merge).resolve()} "
                     f"(their 'measured' column: {', '.join(sorted(set(merged[0]['tp_runs']['measured'])))})")
        for p, t in skipped:
            run.note(f"{p} at TP={t} needs {t} GPUs; {have} visible: skipped")
        topo = gpu.topology()
        run.path("topology.txt").write_text(topo.get("text") or "nvidia-smi topo -m unavailable")
        env, notes = procs.nccl_env()
        run.log(f"{have} GPU(s); links {sorted(set(topo.get('links', {}).values())) or '-'}; servers get "
                + " ".join(f"{k}={v}" for k, v in env.items()) + "".join(f"; {n}" for n in notes))
        runs, rows = measure_all(args, run_plan(fits, args.no_nccl_compare), run)
        if not runs:
            raise RuntimeError("no configuration ran; see point_errors and server_*.log")
        df = pd.DataFrame(runs)
        df["measured"] = "this run"
        t = {n: pd.DataFrame(rows.get(n) or []) for n in TABLES[1:]}
        if merged is not None:
            df = merge_rows(df, merged[0]["tp_runs"])
            old = merged[0]["allreduce_kernels"]
            if len(old) and "launches" not in old.columns:
                old = old.groupby(["model", "tp", "custom_allreduce", "kernel"]).size().rename("launches").reset_index()
            now = t["allreduce_kernels"]
            if len(now):
                now = now.groupby(["model", "tp", "custom_allreduce", "kernel"]).size().rename("launches").reset_index()
            t = {**{n: merge_rows(t[n], merged[0][n]) for n in TABLES[2:]}, "allreduce_kernels": merge_rows(now, old)}
        report(run, df, t, topo.get("links", {}), have, gpu.gpus()[0]["name"])
    return 0


if __name__ == "__main__":
    run_main(main)
