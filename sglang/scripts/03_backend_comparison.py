#!/usr/bin/env python3
"""03 · Attention backends: FlashInfer vs Triton (vs FA3 where installed) on the same workloads.

What it measures (one SGLang server per backend, same model, same flags, --random-seed 0)
    * greedy agreement: the same prompts (token ids) with temperature 0 on every backend; the
      dummy weights are identical (SGLang seeds each parameter with 1234), so any difference is
      numerics. Reports, per prompt, how many leading tokens agree with the first backend;
    * prefill: one long prompt -> TTFT (client, median of 3) and one traced EXTEND step: which
      attention kernels ran, their GPU time, attention FLOPs -> TFLOP/s and % of measured peak;
    * decode: a batch of long prompts decoding together -> ITL (client) and traced DECODE steps:
      attention kernels per step (launches, time), KV bytes read -> TB/s and % of measured copy
      peak, and the CPU time of each step (plan / metadata work happens on the CPU);
    * throughput at --request-rate inf (full run: sglang.benchmark.serving; --quick: the workbook
      client) and, full run only, FlashInfer with SGLANG_FLASHINFER_USE_TENSOR_CORE=false (the
      CUDA-core decode kernel) as a fourth variant;
    * the offline performance bar (--perf-bar; on by default in the full run): SGLang's own
      `python -m sglang.bench_offline_throughput` (the workbook's prompts, written by this script
      as a local ShareGPT-format file, --sharegpt-output-len fixed) against the workbook's
      sglang.Engine on the same config and workload, and SGLang's throughput_test_once on the workbook's Engine (bar: 97%).

What the plan expected (hypotheses)
    * FlashInfer has lower launch overhead; Triton is more flexible but slower (A100).
      Restated: FlashInfer prefill clearly faster than Triton's extend kernel; decode attention
      of both HBM-bound, so their gap is smaller there; Triton launches two decode kernels per layer.
    * Greedy outputs agree across backends (same weights) — numerics may diverge after some tokens.

Run
    python sglang/scripts/03_backend_comparison.py --quick            # flashinfer + triton, ~2 min
    python sglang/scripts/03_backend_comparison.py                    # + fa3 if present, CUDA-core decode, perf bar
    python sglang/scripts/03_backend_comparison.py --quick --perf-bar # quick + the offline bar (~+1.5 min)
    ./sglang/scripts/05_ncu_attention.sh --backends flashinfer,triton  # the same kernels under ncu
Writes sglang/results/03_backend_comparison/: backends.csv, kernels.csv, greedy.csv, perf_bar_offline.csv,
server_<backend>.log, profiles/, story.txt, summary.json.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from common import gpu, serving, story, trace  # noqa: E402
from common.checks import require_module, run_main  # noqa: E402
from common.results import Run  # noqa: E402
from common.serving import Server, flags  # noqa: E402

QUICK = dict(greedy_n=2, greedy_new=32, prefill_len=4096, decode_bs=16, decode_len=2048, decode_new=64,
             tput_n=64, tput_in=512, tput_out=128, bench=False, bar_n=64, bar_in=512, bar_out=128)
FULL = dict(greedy_n=4, greedy_new=64, prefill_len=8192, decode_bs=32, decode_len=4096, decode_new=128,
            tput_n=256, tput_in=1024, tput_out=256, bench=True, bar_n=256, bar_in=1024, bar_out=256)
ENV = {"SGLANG_LOG_MS": "1", "SGLANG_PROFILE_WITH_STACK": "false", "SGLANG_PROFILE_RECORD_SHAPES": "false"}
VARIANTS = {"flashinfer": ("flashinfer", {}), "triton": ("triton", {}), "fa3": ("fa3", {}),
            "flashinfer-cudacore-decode": ("flashinfer", {"SGLANG_FLASHINFER_USE_TENSOR_CORE": "false"})}
GREEDY = {"temperature": 0, "ignore_eos": True}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="flashinfer + triton, smaller shapes (~2 min)")
    p.add_argument("--out", default=None, help="results folder (default sglang/results/03_backend_comparison)")
    p.add_argument("--variants", default=None, help=f"comma list from {','.join(VARIANTS)} (default: detected)")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--perf-bar", dest="perf_bar", action="store_true", default=None,
                     help="run the offline bar (default: on in the full run, off with --quick)")
    bar.add_argument("--no-perf-bar", dest="perf_bar", action="store_false")
    serving.add_model_args(p, backend_default=None)
    return p.parse_args(argv)


def model_shape(model_dir):
    c = json.loads((Path(model_dir) / "config.json").read_text())
    d = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"], d


def matched_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def traced_steps(srv, prof_dir, num_steps, action, kernel_rows):
    """Start the profiler for ``num_steps`` forwards, run ``action()``, return the traced steps."""
    before = list(prof_dir.glob("*.trace.json*")) if prof_dir.exists() else []
    srv.start_profile(prof_dir, num_steps=num_steps)
    out = action()
    srv.stop_profile()
    steps = serving.steps_from_trace(trace.read_chrome_trace(srv.wait_traces(prof_dir, before)[0]), kernel_rows)
    return steps, out


def measure_backend(srv, name, P, prof_dir, shape, pk, run, kernels) -> tuple[dict, list]:
    layers, hq, hkv, d = shape
    row = {"variant": name, "start_s": srv.startup_s}
    greedy = [srv.generate(input_ids=serving.random_ids(256, 900 + i), sampling_params={**GREEDY, "max_new_tokens":
                                                                                        P["greedy_new"]})["output_ids"]
              for i in range(P["greedy_n"])]
    ok = all(len(g) == P["greedy_new"] for g in greedy)
    run.log(f"{name} sanity: {len(greedy)} greedy prompts returned {[len(g) for g in greedy]} tokens "
            f"{'✅' if ok else '❌'}")
    if not ok:
        raise RuntimeError(f"{name}: greedy requests came back with the wrong number of tokens")
    run.log("All results match. Starting benchmarks.")
    # prefill: TTFT untraced (median of 3), then one traced EXTEND step
    L = P["prefill_len"]
    ttfts = []
    for i in range(3):
        srv.flush_cache()
        ttfts.append(srv.generate(input_ids=serving.random_ids(L, 700 + i), stream=True,
                                  sampling_params={**GREEDY, "max_new_tokens": 2})["client"]["ttft_s"] * 1e3)
    srv.flush_cache()
    krows: list = []
    st, _ = traced_steps(srv, prof_dir / name, 1, lambda: srv.generate(input_ids=serving.random_ids(L, 777),
                                                                        sampling_params={**GREEDY, "max_new_tokens": 1}), krows)
    ext = [s for s in st if s["mode"] == "EXTEND"]
    kernels += [{"variant": name, "stage": "prefill", **k} for k in krows if k["mode"] == "EXTEND"]
    att_ms = sum(s.get("attention_us", 0) for s in ext) / 1e3
    flops = 2.0 * L * L * hq * d * layers            # causal: QK^T and PV, half of the L x L matrix each
    row.update(prefill_len=L, prefill_ttft_ms=statistics.median(ttfts), prefill_step_gpu_ms=sum(s["dur_us"] for s in ext) / 1e3,
               prefill_attention_ms=att_ms, prefill_attention_tflop_s=flops / (att_ms * 1e-3) / 1e12 if att_ms else None)
    row["prefill_attention_pct_peak"] = 100 * row["prefill_attention_tflop_s"] / pk["bf16_tflops"] if att_ms else None
    # decode: a batch decoding together; trace a few steps once all are decoding
    B, Ld = P["decode_bs"], P["decode_len"]
    srv.flush_cache()
    res: dict = {}
    th = threading.Thread(target=lambda: res.update(out=srv.generate_many(
        [{"input_ids": serving.random_ids(Ld, 800 + i), "sampling_params": {**GREEDY, "max_new_tokens": P["decode_new"]}}
         for i in range(B)], stream=True)))
    mark = srv.log_mark()
    th.start()
    try:
        srv.wait_log(rf"Decode batch, #running-req: {B},", mark, timeout=300, while_alive=th)
        krows = []
        st, _ = traced_steps(srv, prof_dir / name, 8, lambda: time.sleep(0.5), krows)
    finally:
        th.join()
    dec = [s for s in st if s["mode"] == "DECODE" and s["bs"] == B]
    kernels += [{"variant": name, "stage": "decode", **k} for k in krows if k["mode"] == "DECODE" and k["bs"] == B]
    ok = [r for r in res.get("out", []) if "error" not in r]
    itl = [x * 1e3 for r in ok for x in r["client"]["itl_s"][2:]]
    att_us = statistics.median(s.get("attention_us", 0) for s in dec) if dec else float("nan")
    kv_bytes = B * (Ld + P["decode_new"] / 2) * layers * 2 * hkv * d * 2
    att_launch = [k for k in krows if k["mode"] == "DECODE" and k["bs"] == B and k["family"] == "attention"]
    row.update(decode_bs=B, decode_kv=Ld, decode_itl_p50_ms=statistics.median(itl) if itl else None,
               decode_step_gpu_ms=statistics.median(s["dur_us"] for s in dec) / 1e3 if dec else None,
               decode_step_cpu_ms=statistics.median(s["cpu_us"] for s in dec if s["cpu_us"]) / 1e3
               if dec and any(s["cpu_us"] for s in dec) else None,
               decode_attention_us=att_us, decode_attention_tb_s=kv_bytes / (att_us * 1e-6) / 1e12 if dec else None,
               decode_attention_launches_per_layer=len(att_launch) / max(len(dec), 1) / layers,
               decode_attention_kernels=";".join(sorted({k["short"] for k in att_launch})))
    row["decode_attention_pct_peak"] = 100 * row["decode_attention_tb_s"] / pk["dram_tb_s"] if dec else None
    # throughput at request rate inf
    srv.flush_cache()
    if P["bench"]:
        rec = serving.run_bench(srv, run.dir / "bench", f"tput_{name}", num_prompts=P["tput_n"], input_len=P["tput_in"],
                                output_len=P["tput_out"], rate="inf", echo=run.log)
        row.update(tput_tool="bench_serving", output_throughput=rec["output_throughput"],
                   ttft_p50_ms=rec["median_ttft_ms"], itl_p50_ms=rec["median_itl_ms"], itl_p99_ms=rec["p99_itl_ms"])
    else:
        s = serving.latency_summary(srv.generate_many([{"input_ids": serving.random_ids(P["tput_in"], 60_000 + i),
                                                        "sampling_params": {**GREEDY, "max_new_tokens": P["tput_out"]}}
                                                       for i in range(P["tput_n"])], stream=True))
        row.update(tput_tool="workbook client", output_throughput=s["output_throughput"], ttft_p50_ms=s.get("p50_ttft_ms"),
                   itl_p50_ms=s.get("p50_itl_ms"), itl_p99_ms=s.get("p99_itl_ms"))
    run.log(f"{name}: prefill {L} TTFT {row['prefill_ttft_ms']:.1f} ms (attention {att_ms:.2f} ms), decode bs {B} ITL "
            f"{row['decode_itl_p50_ms'] or float('nan'):.2f} ms (attention {att_us / 1e3:.3f} ms/step, "
            f"{row['decode_attention_kernels']}), {row['output_throughput']:.0f} out tok/s")
    return row, greedy


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


def cli_flags(base: list[str]) -> list[str]:
    """The server flags bench_offline_throughput gets: the workbook's Engine below runs SGLang's
    defaults (prefill CUDA graphs captured), so --quick's --disable-prefill-cuda-graph is left out
    and both sides run one config. (With the flag, one H200 run on 2026-11-21 stalled ~10 s on
    the CLI's first cache-hitting prefill: 713 vs 4,961 out tok/s; the same command on a fresh
    machine did not stall, 4,945 tok/s. The cause was not isolated; see the SGLang report.)"""
    return [f for f in base if f != "--disable-prefill-cuda-graph"]


def offline_bar(args, P, model_dir, base, run) -> list[dict]:
    """SGLang's bench_offline_throughput (its own Engine) vs the workbook's Engine, same config and shape."""
    rows = []
    prompts = [serving.random_text(P["bar_in"] - 1, 90_000 + i) for i in range(P["bar_n"])]   # + BOS = bar_in tokens
    data = sharegpt_file(run.dir / "sharegpt_local.json", prompts)
    out = run.dir / "offline_ref.jsonl"
    cmd = [sys.executable, "-m", "sglang.bench_offline_throughput", "--model-path", model_dir, *cli_flags(base),
           "--attention-backend", "flashinfer", "--dataset-name", "sharegpt", "--dataset-path", str(data),
           "--sharegpt-output-len", str(P["bar_out"]), "--num-prompts", str(P["bar_n"]), "--seed", "1",
           "--result-filename", str(out)]
    rc = serving.run_tool(cmd, run.path("offline_ref.log"), timeout=900, echo=run.log,
                          env=serving.OFFLINE_ENV if Path(model_dir).is_dir() else None)
    if rc != 0 or not out.exists():
        raise RuntimeError(f"bench_offline_throughput failed (rc={rc}); see offline_ref.log")
    ref = json.loads(out.read_text().splitlines()[-1])
    run.log(f"bench_offline_throughput (own Engine): {ref['output_throughput']:.0f} out tok/s")
    sgl = require_module("sglang", serving.SGLANG_PIP)
    from sglang.benchmark.datasets.common import DatasetRow
    from sglang.benchmark.offline_throughput import throughput_test_once
    kw = dict(model_path=model_dir, mem_fraction_static=args.mem_fraction, attention_backend="flashinfer",
              log_level="info", decode_log_interval=1, enable_metrics=True)
    if not args.model_path:
        kw["load_format"] = "dummy"
    sp = {"temperature": 0, "max_new_tokens": P["bar_out"], "ignore_eos": True}
    with fd2_to(run.path("engine.log")):
        llm = sgl.Engine(**kw)
        try:
            llm.generate([serving.random_text(255, 80_000 + i) for i in range(16)], {**sp, "max_new_tokens": 16})
            for rnd in range(2):
                llm.flush_cache()
                tool = throughput_test_once("engine", llm, [DatasetRow(prompt=p, prompt_len=P["bar_in"],
                                                                       output_len=P["bar_out"]) for p in prompts],
                                            ignore_eos=True, extra_request_body={}, profile=False)
                llm.flush_cache()
                t0 = time.perf_counter()
                outs = llm.generate(prompts, sp)
                wall = time.perf_counter() - t0
                wb = sum(o["meta_info"]["completion_tokens"] for o in outs) / wall
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


def main(argv=None) -> int:
    args = parse_args(argv)
    serving.require_sglang()
    serving.require_gpus(1)
    pd = require_module("pandas")
    require_module("torch", "pip install -r requirements.txt")
    P = QUICK if args.quick else FULL
    perf_bar = (not args.quick) if args.perf_bar is None else args.perf_bar
    try:   # FA3 ships in sglang-kernel's flash_ops library, which trimmed builds leave out
        fa3 = importlib.import_module("sgl_kernel.flash_attn") is not None
    except Exception:
        fa3 = False
    variants = args.variants.split(",") if args.variants else \
        ["flashinfer", "triton"] + (["fa3"] if fa3 else []) + ([] if args.quick else ["flashinfer-cudacore-decode"])
    model_dir, base = serving.model_and_flags(args)
    shape = model_shape(model_dir)
    with Run(__file__, args, out=args.out) as run:
        pk = gpu.peaks()
        run.log(f"variants: {variants} (fa3 {'present' if fa3 else 'absent: sgl_kernel.flash_attn does not import'})")
        prof_dir = run.dir / "profiles"
        rows, kernels, outputs = [], [], {}
        for name in variants:
            if name not in VARIANTS:
                run.point_error({"variant": name}, ValueError(f"unknown variant; choose from {list(VARIANTS)}"))
                continue
            backend, env = VARIANTS[name]
            fl = base + flags(attention_backend=backend, random_seed=0, enable_metrics=True, log_level="info",
                              decode_log_interval=1, cuda_graph_max_bs_decode=64 if args.quick else None)
            try:
                with Server(model_dir, fl, port=args.port, log_path=run.path(f"server_{name}.log"), echo=run.log,
                            start_timeout=args.start_timeout, env={**ENV, **env}, name=f"server[{name}]") as srv:
                    row, outputs[name] = measure_backend(srv, name, P, prof_dir, shape, pk, run, kernels)
                    rows.append(row)
            except Exception as e:
                run.point_error({"variant": name}, e)
        if not rows:
            raise RuntimeError("no backend could be measured; see point_errors and server_*.log")
        # ---- greedy agreement against the first backend that ran
        ref_name = rows[0]["variant"]
        greedy = []
        for name, outs in outputs.items():
            for i, (a, b) in enumerate(zip(outputs[ref_name], outs)):
                greedy.append({"variant": name, "reference": ref_name, "prompt": i, "tokens": len(b),
                               "matched_prefix": matched_prefix(a, b), "identical": a == b})
        for r in rows:
            g = [x for x in greedy if x["variant"] == r["variant"]]
            r["greedy_matched_min"] = min((x["matched_prefix"] for x in g), default=None)
        run.log("greedy check: " + "; ".join(f"{r['variant']} agrees with {ref_name} for >= {r['greedy_matched_min']} "
                                            f"of {P['greedy_new']} tokens" for r in rows))
        serving.table(run, "backends", rows)
        kd = pd.DataFrame(kernels)
        if len(kd):
            steps = kd.groupby(["variant", "stage"])["step"].nunique().rename("steps")
            kt = kd.groupby(["variant", "stage", "short", "family"])["dur_us"].agg(["count", "sum"]).reset_index()
            kt = kt.join(steps, on=["variant", "stage"])
            kt["launches_per_step"] = kt["count"] / kt["steps"]
            kt["us_per_step"] = kt["sum"] / kt["steps"]
            kt = kt.rename(columns={"short": "kernel"}).drop(columns=["count", "sum"])
            kt = kt.sort_values(["stage", "variant", "us_per_step"], ascending=[True, True, False])
            serving.table(run, "kernels", kt[kt["family"] == "attention"])
            serving.table(run, "kernels_all", kt)
        serving.table(run, "greedy", greedy)
        bar = []
        if perf_bar:
            try:
                bar = offline_bar(args, P, model_dir, base, run)
            except Exception as e:
                run.point_error({"part": "offline perf bar"}, e)
        serving.table(run, "perf_bar_offline", bar)

        # ---- verdicts
        by = {r["variant"]: r for r in rows}
        fi, tr = by.get("flashinfer"), by.get("triton")
        if fi and tr:
            rp = tr["prefill_attention_ms"] / fi["prefill_attention_ms"]
            rd = tr["decode_attention_us"] / fi["decode_attention_us"]
            run.headline(triton_over_flashinfer_prefill_attention=rp, triton_over_flashinfer_decode_attention=rd)
            run.observe("FlashInfer's prefill attention is clearly faster than Triton's extend kernel "
                        "(confirmed if FlashInfer <= 0.9x Triton's time, refuted if >= 1x)",
                        f"prefill {fi['prefill_len']} tokens: FlashInfer {fi['prefill_attention_ms']:.2f} ms, Triton "
                        f"{tr['prefill_attention_ms']:.2f} ms (Triton/FlashInfer {rp:.2f})",
                        "confirmed" if rp >= 1 / 0.9 else "refuted" if rp <= 1 else "inconclusive", "backends.csv")
            import math
            run.observe("decode attention is HBM-bound for both, so their gap is smaller than in prefill "
                        "(confirmed if |log ratio| decode < prefill)",
                        f"Triton/FlashInfer: decode {rd:.2f} ({tr['decode_attention_pct_peak']:.0f}% vs "
                        f"{fi['decode_attention_pct_peak']:.0f}% of measured copy), prefill {rp:.2f}",
                        "confirmed" if abs(math.log(rd)) < abs(math.log(rp)) else "refuted", "backends.csv")
            run.observe("Triton's decode launches two attention kernels per layer (split-KV stage 1 + reduce)",
                        f"attention launches per layer and decode step: Triton {tr['decode_attention_launches_per_layer']:.1f} "
                        f"({tr['decode_attention_kernels']}), FlashInfer {fi['decode_attention_launches_per_layer']:.1f}",
                        "confirmed" if round(tr["decode_attention_launches_per_layer"]) >= 2 else "refuted", "kernels.csv")
            if fi["decode_step_cpu_ms"] and tr["decode_step_cpu_ms"]:
                run.observe("FlashInfer has lower launch (CPU) overhead per step than Triton (A100 plan)",
                            f"CPU time of a decode step: FlashInfer {fi['decode_step_cpu_ms']:.2f} ms, Triton "
                            f"{tr['decode_step_cpu_ms']:.2f} ms", "confirmed" if fi["decode_step_cpu_ms"] <
                            tr["decode_step_cpu_ms"] else "refuted", "backends.csv")
        if len(outputs) > 1:
            same = all(g["identical"] for g in greedy)
            run.observe("greedy outputs agree across backends (same dummy weights, seed 0); numerics may diverge",
                        "; ".join(f"{r['variant']}: >= {r['greedy_matched_min']}/{P['greedy_new']} tokens equal" for r in rows),
                        "confirmed" if same else "inconclusive", "greedy.csv")
        if bar:
            worst = min(min(b["ratio_vs_cli"], b["ratio_vs_same_engine"]) for b in bar)
            run.headline(offline_perf_bar_pct=100 * worst)
            run.observe("the workbook's Engine reaches >= 97% of SGLang's bench_offline_throughput on the same config "
                        "and workload (and of throughput_test_once on the same Engine)",
                        f"worst ratio {100 * worst:.1f}% over {len(bar)} rounds", "confirmed" if worst >= 0.97 else "refuted",
                        "perf_bar_offline.csv")

        # ---- story
        items = []
        for r in rows:
            att = kd[(kd["variant"] == r["variant"])] if len(kd) else kd
            pre_k = ", ".join(sorted(set(att[(att["stage"] == "prefill") & (att["family"] == "attention")]["short"]))) if len(att) else "-"
            items.append((f"{r['variant']} (server start {r['start_s']:.0f} s)", [
                (f"prefill {r['prefill_len']} tok: TTFT {r['prefill_ttft_ms']:.1f} ms; attention {r['prefill_attention_ms']:.2f} ms "
                 f"-> {story.fmt(r['prefill_attention_tflop_s'])} TFLOP/s ({story.fmt(r['prefill_attention_pct_peak'])}% of "
                 f"measured bf16) [{pre_k}]", []),
                (f"decode bs {r['decode_bs']} kv {r['decode_kv']}: ITL {story.fmt(r['decode_itl_p50_ms'])} ms, step GPU "
                 f"{story.fmt(r['decode_step_gpu_ms'])} ms / CPU {story.fmt(r['decode_step_cpu_ms'])} ms; attention "
                 f"{r['decode_attention_us']:.0f} us/step -> {story.fmt(r['decode_attention_tb_s'])} TB/s "
                 f"({story.fmt(r['decode_attention_pct_peak'])}% of copy) [{r['decode_attention_kernels']}, "
                 f"{r['decode_attention_launches_per_layer']:.1f}/layer]", []),
                (f"rate inf ({r['tput_tool']}): {r['output_throughput']:.0f} out tok/s, TTFT p50 {story.fmt(r['ttft_p50_ms'])} ms, "
                 f"ITL p50 {story.fmt(r['itl_p50_ms'])} ms; greedy equal to {ref_name} for >= {r['greedy_matched_min']} tokens", [])]))
        if bar:
            items.append(("offline perf bar: " + ", ".join(f"{100 * b['ratio_vs_cli']:.1f}% of the CLI, "
                                                           f"{100 * b['ratio_vs_same_engine']:.1f}% of the tool on the same Engine"
                                                           for b in bar), []))
        run.story(story.tree(f"ATTENTION BACKENDS — {Path(model_dir).name}, {pk['gpu']}", items))
        print(run.summary["story"])
    return 0


if __name__ == "__main__":
    run_main(main)
