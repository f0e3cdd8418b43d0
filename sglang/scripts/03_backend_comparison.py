#!/usr/bin/env python3
"""03 · Attention backends: FlashInfer vs Triton (vs FA3 where installed) on the same workloads.

What it measures (one SGLang server per backend, same model, same flags, --random-seed 0, CUDA graphs for
prefill and decode; --quick caps the KV pool at 32768 tokens, the story's first line says so. In a --quick
pipeline the FlashInfer variant runs on the pipeline's shared server, whose flags are exactly its own, and Triton
on the pipeline's 'triton' server; each other variant needs a server of its own: the attention backend is a launch
flag, the CUDA-core decode a variable read at start)
    * greedy agreement: the same prompts (token ids) with temperature 0 on every backend; the
      dummy weights are identical (SGLang seeds each parameter with 1234), so any difference is
      numerics. Reports, per prompt, how many leading tokens agree with the first backend;
    * prefill: one long prompt -> TTFT (client, median of 3) and 3 traced EXTEND steps (one profiler
      window): which attention kernels ran, their GPU time, attention FLOPs (common.tables.flops) -> TFLOP/s
      and % of the measured bf16 ceiling;
    * decode: a batch of long prompts decoding together -> ITL (client) and 8 traced DECODE steps:
      attention kernels per step (launches, time), KV bytes read (common.tables.flops) -> TB/s and % of the
      measured DRAM ceiling, and the CPU time of each step (plan / metadata work happens on the CPU);
    * throughput at --request-rate inf (full run: sglang.benchmark.serving; --quick: the workbook
      client) and, full run only, FlashInfer with SGLANG_FLASHINFER_USE_TENSOR_CORE=false (the
      CUDA-core decode kernel) as a fourth variant;
    * the offline performance bar (--perf-bar; on by default in the full run): SGLang's own
      `python -m sglang.bench_offline_throughput` (the workbook's prompts, written by this script
      as a local ShareGPT-format file, --sharegpt-output-len fixed) against the workbook's
      sglang.Engine on the same config and workload, and SGLang's throughput_test_once on the
      workbook's Engine, 3 rounds (bar: 97%).

What the plan expected (hypotheses in H below, with ranges and sources; judged on repetitions)
    * FlashInfer has lower launch overhead; Triton is more flexible but slower (A100).
      Restated: FlashInfer prefill clearly faster than Triton's extend kernel; decode attention
      of both HBM-bound, so their gap is smaller there; Triton launches two decode kernels per layer.
    * Greedy outputs agree across backends (same weights) — numerics may diverge after some tokens.

Run
    python sglang/scripts/03_backend_comparison.py --quick            # flashinfer + triton, ~3 min
    python sglang/scripts/03_backend_comparison.py                    # + fa3 if present, CUDA-core decode, perf bar
    python sglang/scripts/03_backend_comparison.py --quick --perf-bar # quick + the offline bar (~+2 min)
    python sglang/scripts/03_backend_comparison.py --quick --variants flashinfer,triton
    python sglang/scripts/05_ncu_attention.py --backends flashinfer,triton   # the same kernels under ncu
    python sglang/scripts/03_backend_comparison.py --reanalyse DIR --out OUT   # no GPU, no sglang: the analysis again
Writes sglang/results/03_backend_comparison/: backends.csv, step_values.csv (the per-step values the verdicts are
judged on), kernels.csv, kernels_all.csv, greedy.csv, perf_bar_offline.csv, server_<backend>.log, profiles/, story.txt, summary.json.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sglang as sg  # noqa: E402
from common.base import story  # noqa: E402
from common.base.checks import require_module, run_main, SetupError  # noqa: E402
from common.capture import ceilings, procs, timing  # noqa: E402
from common.tables import flops, trace  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.run import cli, recording  # noqa: E402
from common.run.results import Run  # noqa: E402

# --quick decodes 16 x (1920 + 64) = 31,744 tokens at once: all 16 fit in the --quick pool of 32,768 tokens
QUICK = dict(reps=3, greedy_n=3, greedy_new=32, prefill_len=4096, decode_bs=16, decode_len=1920, decode_new=64,
             decode_steps=8, tput_n=64, tput_in=512, tput_out=128, bench=False, bar_n=64, bar_in=512, bar_out=128)
FULL = dict(reps=3, greedy_n=4, greedy_new=64, prefill_len=8192, decode_bs=32, decode_len=4096, decode_new=128,
            decode_steps=8, tput_n=256, tput_in=1024, tput_out=256, bench=True, bar_n=256, bar_in=1024, bar_out=256)
VARIANTS = {"flashinfer": ("flashinfer", {}), "triton": ("triton", {}), "fa3": ("fa3", {}),
            "flashinfer-cudacore-decode": ("flashinfer", {"SGLANG_FLASHINFER_USE_TENSOR_CORE": "false"})}
PLAN = "PLAN.md Session 1 and sglang/reports/plan.md, experiment 03"
H = declare(f"""
    prefill = flashinfer-prefill-faster: FlashInfer's prefill attention is clearly faster than Triton's extend kernel
        judged on: Triton / FlashInfer prefill attention time (per traced prefill)
        confirmed: >= 1.111
        source: {PLAN}: 'FlashInfer prefill faster than Triton's extend kernel' (clearly: FlashInfer <= 0.9x)
    gap = decode-gap-smaller: decode attention is HBM-bound for both, so their gap is smaller than in prefill
        judged on: |ln(Triton/FlashInfer) prefill| - |ln(Triton/FlashInfer) decode| (per repetition pair)
        confirmed: >= 0
        source: {PLAN}: 'decode attention of both HBM-bound and closer together'
    two = triton-two-decode-kernels: Triton's decode launches two attention kernels per layer (split-KV stage 1 +
            reduce)
        judged on: Triton attention launches per layer and decode step (per traced step)
        confirmed: [1.5, 2.5]
        source: {PLAN}: 'Triton decode launches two kernels per layer (split-KV + reduce)'
    cpu = flashinfer-lower-cpu: FlashInfer has lower launch (CPU) overhead per step than Triton (A100 plan)
        judged on: Triton / FlashInfer CPU time of a decode step (per traced step pair)
        confirmed: >= 1
        source: {PLAN}: 'FlashInfer has lower launch overhead' checked as per-step CPU time
    greedy = greedy-agree: greedy outputs agree across backends (same dummy weights, seed 0); numerics may diverge
        judged on: fraction of leading greedy tokens equal to the first backend's (per prompt and backend)
        confirmed: [1, 1]
        source: {PLAN}: same weights, temperature 0
    bar = offline-perf-bar: the workbook's Engine reaches SGLang's bench_offline_throughput on the same config and
            workload (and throughput_test_once on the same Engine)
        judged on: workbook Engine output tok/s as % of the lower of the two references (per round)
        confirmed: >= 97%
        source: PLAN.md success criteria: 'instrumentation within 97% of SGLang's own tools'
""")


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="flashinfer + triton, smaller shapes (~3 min)")
    p.add_argument("--variants", type=cli.choices_list(*VARIANTS), default=None,
                   help=f"comma list from {','.join(VARIANTS)} (default: detected)")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--perf-bar", dest="perf_bar", action="store_true", default=None,
                     help="run the offline bar (default: on in the full run, off with --quick)")
    bar.add_argument("--no-perf-bar", dest="perf_bar", action="store_false")
    sg.add_model_args(p, backend_default=None)
    recording.add_flag(p)
    return p.parse_args(argv)


def matched_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# ------------------------------------------------------------------ measure one backend

def greedy_outputs(srv, name, P, run) -> list:
    out = [srv.generate(input_ids=sg.random_ids(256, 900 + i), sampling_params={**sg.GREEDY, "max_new_tokens":
                                                                                P["greedy_new"]})["output_ids"]
           for i in range(P["greedy_n"])]
    ok = all(len(g) == P["greedy_new"] for g in out)
    run.log(f"{name} sanity: {len(out)} greedy prompts returned {[len(g) for g in out]} tokens {'✅' if ok else '❌'}")
    if not ok:
        raise RuntimeError(f"{name}: greedy requests came back with the wrong number of tokens")
    run.log("All results match. Starting benchmarks.")
    return out


def prefill(srv, name, P, prof_dir, sh, pk, kernels) -> dict:
    """TTFT untraced (median of 3), then P["reps"] prefills in one profiler window."""
    L, ttfts = P["prefill_len"], []
    for i in range(3):
        srv.flush_cache()
        ttfts.append(srv.generate(input_ids=sg.random_ids(L, 700 + i), stream=True,
                                  sampling_params={**sg.GREEDY, "max_new_tokens": 2})["client"]["ttft_s"] * 1e3)

    def reps():
        for i in range(P["reps"]):
            srv.flush_cache()
            srv.generate(input_ids=sg.random_ids(L, 777 + i), sampling_params={**sg.GREEDY, "max_new_tokens": 1})
    (tr, *_), _ = srv.traced(prof_dir / name, reps)
    kt, st = sg.steps(trace.read_chrome_trace(tr))
    ext = [s for s in st if s["mode"] == "EXTEND"]
    kernels += [{"variant": name, "stage": "prefill", **k} for k in kernel_rows(kt[kt["mode"] == "EXTEND"])]
    att_ms = [s.get("attention_us", 0) / 1e3 for s in ext]
    fl = flops.prefill_flops([L], [L], sh["hq"], sh["d"]) * sh["layers"]      # causal, every layer
    med = statistics.median(att_ms) if att_ms else float("nan")
    tf = fl / (med * 1e-3) / 1e12 if att_ms and med else None
    return {"prefill_len": L, "prefill_ttft_ms": statistics.median(ttfts),
            "prefill_step_gpu_ms": statistics.median(s["dur_us"] for s in ext) / 1e3 if ext else None,
            "prefill_attention_ms": med, "prefill_attention_tflop_s": tf,
            "prefill_attention_pct_bf16": 100 * tf / pk["bf16_tflops"] if tf else None, "_att_ms": att_ms}


def kernel_rows(kt) -> list[dict]:
    """The kernel table's rows this script keeps per kernel (kernels.csv): step, mode, bs, kernel, cls, dur_us."""
    return kt[["step", "mode", "bs", "kernel", "cls", "dur_us"]].to_dict("records")


def decode(srv, name, P, prof_dir, sh, pk, kernels) -> dict:
    """A batch decoding together; P["decode_steps"] steps traced once all of it decodes."""
    B, Ld = P["decode_bs"], P["decode_len"]
    srv.flush_cache()
    reqs = [{"input_ids": sg.random_ids(Ld, 800 + i), "sampling_params": {**sg.GREEDY, "max_new_tokens": P["decode_new"]}}
            for i in range(B)]
    (files, _), res = srv.while_decoding(reqs, lambda: srv.traced(prof_dir / name, lambda: time.sleep(0.5),
                                                                  num_steps=P["decode_steps"]), running=B, stream=True)
    kt, st = sg.steps(trace.read_chrome_trace(files[0]))
    dec = [s for s in st if s["mode"] == "DECODE" and s["bs"] == B]
    mine = kernel_rows(kt[(kt["mode"] == "DECODE") & (kt["bs"] == B)])
    kernels += [{"variant": name, "stage": "decode", **k} for k in mine]
    att = [k for k in mine if k["cls"] == "attention"]
    steps = sorted({k["step"] for k in mine})
    per_step = [sum(1 for k in att if k["step"] == s) / sh["layers"] for s in steps]
    itl = [x * 1e3 for r in res if "error" not in r for x in r["client"]["itl_s"][2:]]
    att_us = [s.get("attention_us", 0) for s in dec]
    kv = flops.decode_bytes([Ld + P["decode_new"] // 2] * B, sh["hq"], sh["hkv"], sh["d"]) * sh["layers"]
    med = statistics.median(att_us) if att_us else float("nan")
    r = timing.rates(med * 1e-3, bytes=kv, peaks=ceilings.complete(pk), mix="read") if att_us and med else {}
    tb = r.get("eff_tb_s")        # the KV cache read (many times the L2: it streams from DRAM) over attention's time
    return {"decode_bs": B, "decode_kv": Ld, "decode_itl_p50_ms": statistics.median(itl) if itl else None,
            "decode_step_gpu_ms": statistics.median(s["dur_us"] for s in dec) / 1e3 if dec else None,
            "decode_step_cpu_ms": statistics.median(s["cpu_us"] for s in dec) / 1e3 if dec else None,
            "decode_attention_us": med, "decode_attention_tb_s": tb,
            "decode_attention_eff_pct": r.get("eff_pct"),
            "decode_attention_launches_per_layer": statistics.median(per_step) if per_step else None,
            "decode_attention_kernels": ";".join(sorted({k["kernel"] for k in att})),
            "_att_us": att_us, "_cpu_ms": [s["cpu_us"] / 1e3 for s in dec], "_launches": per_step}


def throughput(srv, name, P, run) -> dict:
    srv.flush_cache()
    if P["bench"]:
        rec = sg.run_bench(srv, run.dir / "bench", f"tput_{name}", num_prompts=P["tput_n"], input_len=P["tput_in"],
                           output_len=P["tput_out"], rate="inf", echo=run.log)
        return {"tput_tool": "bench_serving", "output_throughput": rec["output_throughput"],
                "ttft_p50_ms": rec["median_ttft_ms"], "itl_p50_ms": rec["median_itl_ms"], "itl_p99_ms": rec["p99_itl_ms"]}
    s = sg.latency_summary(srv.generate_many([{"input_ids": sg.random_ids(P["tput_in"], 60_000 + i), "sampling_params":
                                               {**sg.GREEDY, "max_new_tokens": P["tput_out"]}} for i in range(P["tput_n"])],
                                             stream=True))
    return {"tput_tool": "workbook client", "output_throughput": s["output_throughput"], "ttft_p50_ms": s.get("p50_ttft_ms"),
            "itl_p50_ms": s.get("p50_itl_ms"), "itl_p99_ms": s.get("p99_itl_ms")}


OWN_WHY = {"triton": "the attention backend is a launch flag", "fa3": "the attention backend is a launch flag",
           "flashinfer-cudacore-decode": "SGLANG_FLASHINFER_USE_TENSOR_CORE is read when the server starts"}


def server_flags(args, name: str, write: bool = True) -> tuple[str, list[str], dict]:
    """(model dir, flags, environment) of variant ``name``'s server (the FlashInfer one, with the default
    options and --quick: the pipeline's shared server)."""
    backend, env = VARIANTS[name]
    model_dir, fl = sg.serving_flags(args, quick=args.quick, backend=backend, write=write)
    return model_dir, fl, {**sg.SERVING_ENV, **env}


def measure_backend(args, name, P, model_dir, sh, pk, run, kernels) -> tuple[dict, list]:
    _, fl, env = server_flags(args, name)
    prof = run.dir / "profiles"
    with sg.server(run, model_dir, fl, quick=args.quick, env=env, port=args.port,
                   start_timeout=args.start_timeout, name=f"server[{name}]", log_name=f"server_{name}.log",
                   own_why=OWN_WHY.get(name, "")) as srv:
        greedy = greedy_outputs(srv, name, P, run)
        row = {"variant": name, "start_s": srv.startup_s, "server": "shared" if srv.shared else "own",
               "graphs": sg.graphs_text(fl),
               **prefill(srv, name, P, prof, sh, pk, kernels), **decode(srv, name, P, prof, sh, pk, kernels),
               **throughput(srv, name, P, run)}
    run.log(f"{name}: prefill {row['prefill_len']} TTFT {row['prefill_ttft_ms']:.1f} ms (attention "
            f"{row['prefill_attention_ms']:.2f} ms), decode bs {row['decode_bs']} ITL {story.fmt(row['decode_itl_p50_ms'])} "
            f"ms (attention {row['decode_attention_us'] / 1e3:.3f} ms/step, {row['decode_attention_kernels']}), "
            f"{row['output_throughput']:.0f} out tok/s")
    return row, greedy


# ------------------------------------------------------------------ the offline bar

@contextlib.contextmanager
def fd2_to(path):
    """Send this process's fd 2 (and so the Engine's scheduler children's logs) to a file."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as f:
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def sharegpt_file(path, prompts) -> Path:
    """The workbook's own prompts as a local ShareGPT-format file, so that bench_offline_throughput
    (--dataset-name sharegpt) runs exactly the workload the workbook's Engine runs."""
    conv = [{"id": f"hands-on-{i}", "conversations": [{"from": "human", "value": p},
                                                       {"from": "gpt", "value": "ok"}]} for i, p in enumerate(prompts)]
    Path(path).write_text(json.dumps(conv))
    return Path(path)


def offline_bar(args, P, model_dir, base, run) -> list[dict]:
    """SGLang's bench_offline_throughput (its own Engine) vs the workbook's Engine, same config and
    shape (both with SGLang's default CUDA graphs), P["reps"] rounds."""
    rows = []
    prompts = [sg.random_text(P["bar_in"] - 1, 90_000 + i) for i in range(P["bar_n"])]   # + BOS = bar_in tokens
    data = sharegpt_file(run.dir / "sharegpt_local.json", prompts)
    out = run.dir / "offline_ref.jsonl"
    cmd = [sys.executable, "-m", "sglang.bench_offline_throughput", "--model-path", model_dir, *base,
           "--attention-backend", "flashinfer", "--dataset-name", "sharegpt", "--dataset-path", str(data),
           "--sharegpt-output-len", str(P["bar_out"]), "--num-prompts", str(P["bar_n"]), "--seed", "1",
           "--result-filename", str(out)]
    rc = procs.run_tool(cmd, run.path("offline_ref.log"), timeout=900, echo=run.log, env=sg.tool_env(model_dir))
    if rc != 0 or not out.exists():
        raise RuntimeError(f"bench_offline_throughput failed (rc={rc}); see offline_ref.log")
    ref = json.loads(out.read_text().splitlines()[-1])
    run.log(f"bench_offline_throughput (own Engine): {ref['output_throughput']:.0f} out tok/s")
    sgl = require_module("sglang", sg.SGLANG_PIP)
    from sglang.benchmark.datasets.common import DatasetRow
    from sglang.benchmark.offline_throughput import throughput_test_once
    kw = dict(model_path=model_dir, mem_fraction_static=args.mem_fraction, attention_backend="flashinfer",
              log_level="info", decode_log_interval=1, enable_metrics=True)
    if not args.model_path:
        kw["load_format"] = "dummy"
    sp = {**sg.GREEDY, "max_new_tokens": P["bar_out"]}
    with fd2_to(run.path("engine.log")):
        llm = sgl.Engine(**kw)
        try:
            llm.generate([sg.random_text(255, 80_000 + i) for i in range(16)], {**sp, "max_new_tokens": 16})
            for rnd in range(P["reps"]):
                llm.flush_cache()
                tool = throughput_test_once("engine", llm, [DatasetRow(prompt=p, prompt_len=P["bar_in"],
                                                                       output_len=P["bar_out"]) for p in prompts],
                                            ignore_eos=True, extra_request_body={}, profile=False)
                llm.flush_cache()
                t0 = time.perf_counter()
                outs = llm.generate(prompts, sp)
                wb = sum(o["meta_info"]["completion_tokens"] for o in outs) / (time.perf_counter() - t0)
                rows.append({"round": rnd, "bench_offline_throughput_cli": ref["output_throughput"],
                             "throughput_test_once_same_engine": tool["output_throughput"], "workbook_engine": wb,
                             "ratio_vs_cli": wb / ref["output_throughput"],
                             "ratio_vs_same_engine": wb / tool["output_throughput"]})
        finally:
            llm.shutdown()
    for r in rows:
        run.log(f"offline bar round {r['round']}: workbook {r['workbook_engine']:.0f} vs CLI "
                f"{r['bench_offline_throughput_cli']:.0f} ({100 * r['ratio_vs_cli']:.1f}%), vs tool on the same "
                f"Engine {r['throughput_test_once_same_engine']:.0f} ({100 * r['ratio_vs_same_engine']:.1f}%)")
    return rows


# ------------------------------------------------------------------ check, analyse, judge, tell

def check(args):
    pd = sg.require_stack()
    P = QUICK if args.quick else FULL
    try:   # FA3 ships in sglang-kernel's flash_ops library, which trimmed builds leave out
        fa3 = importlib.import_module("sgl_kernel.flash_attn") is not None
    except Exception:  # noqa: BLE001 - ImportError, or a broken build's OSError
        fa3 = False
    variants = args.variants or (["flashinfer", "triton"] + (["fa3"] if fa3 else [])
                                 + ([] if args.quick else ["flashinfer-cudacore-decode"]))
    model_dir, base = sg.model_and_flags(args)
    return pd, P, fa3, variants, model_dir, base


def greedy_rows(outputs) -> list[dict]:
    """Each backend's greedy tokens against the first backend's, prompt by prompt."""
    ref = next(iter(outputs))
    return [{"variant": name, "reference": ref, "prompt": i, "tokens": len(b), "matched_prefix": matched_prefix(a, b),
             "identical": a == b} for name, outs in outputs.items() for i, (a, b) in enumerate(zip(outputs[ref], outs))]


def kernel_tables(run, kernels, pd) -> None:
    kd = pd.DataFrame(kernels)
    if not len(kd):
        return
    steps = kd.groupby(["variant", "stage"])["step"].nunique().rename("steps")
    kt = kd.groupby(["variant", "stage", "kernel", "cls"])["dur_us"].agg(["count", "sum"]).reset_index()
    kt = kt.join(steps, on=["variant", "stage"])
    kt["launches_per_step"] = kt["count"] / kt["steps"]
    kt["us_per_step"] = kt["sum"] / kt["steps"]
    kt = kt.drop(columns=["count", "sum"]).sort_values(["stage", "variant", "us_per_step"], ascending=[True, True, False])
    sg.table(run, "kernels", kt[kt["cls"] == "attention"])
    sg.table(run, "kernels_all", kt)


def verdicts(run, rows, greedy, bar, P) -> None:
    by = {r["variant"]: r for r in rows}
    fi, tr = by.get("flashinfer"), by.get("triton")
    if fi and tr:
        rp = [t / f for t, f in zip(tr["_att_ms"], fi["_att_ms"]) if f]
        rd = [t / f for t, f in zip(tr["_att_us"], fi["_att_us"]) if f]
        run.headline(triton_over_flashinfer_prefill_attention=statistics.median(rp) if rp else None,
                     triton_over_flashinfer_decode_attention=statistics.median(rd) if rd else None)
        run.judge(H["prefill"], rp, evidence="backends.csv", detail=f"prefill {fi['prefill_len']} tokens: FlashInfer "
                  f"{fi['prefill_attention_ms']:.2f} ms, Triton {tr['prefill_attention_ms']:.2f} ms (medians)")
        run.judge(H["gap"], [abs(math.log(p)) - abs(math.log(d)) for p, d in zip(rp, rd) if p > 0 and d > 0],
                  evidence="backends.csv", detail=f"decode Triton/FlashInfer {story.fmt(statistics.median(rd) if rd else None)}"
                  f" (KV read at {story.fmt(tr['decode_attention_eff_pct'])}% vs {story.fmt(fi['decode_attention_eff_pct'])}% "
                  "of the DRAM read ceiling, effective bandwidth)")
        run.judge(H["two"], tr["_launches"], evidence="kernels.csv", detail=f"Triton: {tr['decode_attention_kernels']}; "
                  f"FlashInfer {story.fmt(fi['decode_attention_launches_per_layer'])}/layer")
        run.judge(H["cpu"], [t / f for t, f in zip(tr["_cpu_ms"], fi["_cpu_ms"]) if f], evidence="backends.csv",
                  detail=f"CPU per decode step: FlashInfer {story.fmt(fi['decode_step_cpu_ms'])} ms, Triton "
                  f"{story.fmt(tr['decode_step_cpu_ms'])} ms (medians)")
    others = [g for g in greedy if g["variant"] != g["reference"]]
    if others:
        run.judge(H["greedy"], [g["matched_prefix"] / max(g["tokens"], 1) for g in others], evidence="greedy.csv",
                  detail="; ".join(f"{r['variant']}: >= {r['greedy_matched_min']}/{P['greedy_new']} tokens equal" for r in rows))
    if bar:
        pct = [100 * min(b["ratio_vs_cli"], b["ratio_vs_same_engine"]) for b in bar]
        run.headline(offline_perf_bar_pct=min(pct))
        run.judge(H["bar"], pct, evidence="perf_bar_offline.csv")


def tell(rows, kernels, bar, model_dir, pk) -> str:
    ref = rows[0]["variant"]
    items = []
    for r in rows:
        pre_k = ", ".join(sorted({k["kernel"] for k in kernels if k["variant"] == r["variant"] and k["stage"] == "prefill"
                                  and k["cls"] == "attention"})) or "-"
        start = "the pipeline's shared server" if r.get("server") == "shared" else f"server start {r['start_s']:.0f} s"
        items.append((f"{r['variant']} ({start}; {r['graphs']})", [
            (f"prefill {r['prefill_len']} tok: TTFT {r['prefill_ttft_ms']:.1f} ms; attention {r['prefill_attention_ms']:.2f} "
             f"ms -> {story.fmt(r['prefill_attention_tflop_s'])} TFLOP/s ({story.fmt(r['prefill_attention_pct_bf16'])}% of "
             f"the bf16 ceiling) [{pre_k}]", []),
            (f"decode bs {r['decode_bs']} kv {r['decode_kv']}: ITL {story.fmt(r['decode_itl_p50_ms'])} ms, step GPU "
             f"{story.fmt(r['decode_step_gpu_ms'])} ms / CPU {story.fmt(r['decode_step_cpu_ms'])} ms; attention "
             f"{r['decode_attention_us']:.0f} us/step -> {story.fmt(r['decode_attention_tb_s'])} TB/s "
             f"(effective, the KV read: {story.fmt(r['decode_attention_eff_pct'])}% of the DRAM read ceiling) [{r['decode_attention_kernels']}, "
             f"{story.fmt(r['decode_attention_launches_per_layer'])}/layer]", []),
            (f"rate inf ({r['tput_tool']}): {r['output_throughput']:.0f} out tok/s, TTFT p50 {story.fmt(r['ttft_p50_ms'])} "
             f"ms, ITL p50 {story.fmt(r['itl_p50_ms'])} ms; greedy equal to {ref} for >= {r['greedy_matched_min']} tokens", [])]))
    if bar:
        items.append(("offline perf bar: " + ", ".join(f"{100 * b['ratio_vs_cli']:.1f}% of the CLI, "
                                                       f"{100 * b['ratio_vs_same_engine']:.1f}% of the tool on the same Engine"
                                                       for b in bar), []))
    return story.tree(f"ATTENTION BACKENDS — {Path(model_dir).name}, {pk['gpu']}", items)


# the per-step values each backend's row carries for the verdicts (not in backends.csv): step_values.csv
STEP_VALUES = {"_att_ms": "prefill_attention_ms", "_att_us": "decode_attention_us", "_cpu_ms": "decode_step_cpu_ms",
               "_launches": "decode_attention_launches_per_layer"}


def step_value_rows(rows) -> list[dict]:
    """Each backend's per-step lists (STEP_VALUES) as rows: variant, series, i, value."""
    return [{"variant": r["variant"], "series": name, "i": i, "value": v}
            for r in rows for key, name in STEP_VALUES.items() for i, v in enumerate(r.get(key) or [])]


def rows_from(backends, step_values) -> list[dict]:
    """backends.csv + step_values.csv -> the rows the analysis reads (the per-step lists back under their keys)."""
    rows = []
    for r in backends.to_dict("records"):
        r = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
        sv = step_values[step_values["variant"] == r["variant"]]
        for key, name in STEP_VALUES.items():
            r[key] = [float(v) for v in sv[sv["series"] == name].sort_values("i")["value"]]
        rows.append(r)
    return rows


@dataclass
class Record:
    """What the analysis of one run reads: the plan, the ceilings, each backend's row (with its per-step lists),
    the traced kernel rows, the greedy comparison and the offline bar (the same a --reanalyse reads back)."""
    args: object
    P: dict
    model_dir: str
    pk: dict
    rows: list = field(default_factory=list)
    kernels: list = field(default_factory=list)
    greedy: list = field(default_factory=list)
    bar: list = field(default_factory=list)


def analyse(run, x: Record) -> None:
    """Verdicts, headline and story from the measured rows (a GPU run and --reanalyse alike)."""
    verdicts(run, x.rows, x.greedy, x.bar, x.P)
    _, fl, _env = server_flags(x.args, x.rows[0]["variant"], write=False)
    run.story(sg.config_line(fl, sg.SERVING_ENV, x.args.quick) + " -- per variant: its own --attention-backend\n"
              + tell(x.rows, x.kernels, x.bar, x.model_dir, x.pk), echo=True)


def main_reanalyse(args) -> int:
    """--reanalyse DIR: backends.csv and step_values.csv back into each backend's row, kernels.csv (the attention
    kernels) for the story, greedy.csv and perf_bar_offline.csv; no server, no sglang. A recording without
    step_values.csv (made before it was written) is one [setup] line: the per-step values four verdicts are judged
    on were only in the profiler traces, which a run does not keep."""
    rec = recording.open(args.reanalyse, __file__, tables=("backends",),
                         optional=("step_values", "kernels", "greedy", "perf_bar_offline"))
    if rec.tables["step_values"] is None:
        raise SetupError(f"--reanalyse {rec.src}: no step_values.csv (a recording of "
                         f"{(rec.summary.get('provenance') or {}).get('git', {}).get('commit', '?')}, before 03 wrote "
                         "it): the per-step attention times, CPU times and launches the prefill, gap, two-kernel and "
                         "CPU verdicts are judged on were only in the profiler traces, which a run does not keep; "
                         "backends.csv holds their medians only. Re-run 03 on a GPU to record them")
    a = rec.args_like(args)
    t = rec.tables
    model_dir, _ = sg.model_and_flags(a, write=False)
    records = (lambda d: [] if d is None else d.to_dict("records"))
    x = Record(a, QUICK if a.quick else FULL, model_dir, rec.peaks, rows=rows_from(t["backends"], t["step_values"]),
               kernels=records(t["kernels"]), greedy=records(t["greedy"]), bar=records(t["perf_bar_offline"]))
    with recording.run(__file__, args, rec) as run:
        for k in ("servers", "server_config"):
            if k in rec.summary:
                run.summary[k] = rec.summary[k]
        analyse(run, x)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    pd, P, fa3, variants, model_dir, base = check(args)
    perf_bar = (not args.quick) if args.perf_bar is None else args.perf_bar
    sh = sg.model_shape(model_dir)
    with Run(__file__, args, out=args.out) as run:
        x = Record(args, P, model_dir, ceilings.peaks())
        run.log(f"variants: {variants} (fa3 {'present' if fa3 else 'absent: sgl_kernel.flash_attn does not import'})")
        outputs = {}
        for name in variants:
            try:
                row, outputs[name] = measure_backend(args, name, P, model_dir, sh, x.pk, run, x.kernels)
                x.rows.append(row)
            except Exception as e:  # noqa: BLE001 - a backend fails, the others go on
                run.point_error({"variant": name}, e)
        if not x.rows:
            raise RuntimeError("no backend could be measured; see point_errors and server_*.log")
        x.greedy = greedy_rows(outputs)
        for r in x.rows:
            r["greedy_matched_min"] = min((g["matched_prefix"] for g in x.greedy if g["variant"] == r["variant"]),
                                          default=None)
        sg.table(run, "backends", [{k: v for k, v in r.items() if not k.startswith("_")} for r in x.rows])
        sg.table(run, "step_values", step_value_rows(x.rows))
        kernel_tables(run, x.kernels, pd)
        sg.table(run, "greedy", x.greedy)
        if perf_bar:
            try:
                x.bar = offline_bar(args, P, model_dir, base, run)
            except Exception as e:  # noqa: BLE001
                run.point_error({"part": "offline perf bar"}, e)
        sg.table(run, "perf_bar_offline", x.bar)
        analyse(run, x)
    return 0


if __name__ == "__main__":
    run_main(main)
