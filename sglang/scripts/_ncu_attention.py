#!/usr/bin/env python3
"""05 · helper of 05_ncu_attention.sh: SGLang's attention kernels on the hardware counters.

What it measures
    The SGLang server itself runs under Nsight Compute (`ncu --target-processes all
    --profile-from-start off --clock-control none --kernel-name regex:<attention kernels>`),
    with CUDA graphs off for this run (ncu profiles kernel launches, not graph replays), no
    server warm-up, and a small KV pool (ncu saves and restores the memory a kernel may write
    for every replay pass). The profiled window is opened by SGLang itself: /start_profile
    {"activities": ["CUDA_PROFILER"], "num_steps": N} brackets exactly the chosen forward steps
    with cudaProfilerStart/Stop:
      prefill: one prompt of --prefill-len tokens, nothing cached (one EXTEND step);
      decode:  --decode-bs requests of --decode-kv tokens decoding together (two DECODE steps).
    By default the model keeps its real layer shapes but only --layers 2 layers
    (--json-model-override-args): attention kernels see exactly the shapes of the full model,
    and each step launches 2 per kernel instead of 32 (--layers 0 profiles the full model).
    Per launch (common.ncu.summarize): time, DRAM bytes -> TB/s and % of measured copy peak,
    ncu's DRAM / SM / tensor-pipe %, achieved occupancy and its limiter, the top warp stalls;
    prefill attention FLOPs -> TFLOP/s and % of measured bf16 peak. Stage comes from the
    kernel name (FlashInfer ragged prefill vs paged decode; Triton extend vs split-KV decode).

What the plan expected (hypotheses, A100 figures)
    * Decode attention (batch 32, KV 4096) is memory-bound: DRAM ~82% of peak, tensor pipe ~15%,
      long-scoreboard the top stall.
    * Prefill attention sits near the ridge point with much higher tensor-pipe activity; occupancy
      ~47%, limited by shared memory; barrier stalls from warp specialization.

Run (through the wrapper; this file takes the same flags)
    ./sglang/scripts/05_ncu_attention.sh --quick                 # flashinfer, ~2 min
    ./sglang/scripts/05_ncu_attention.sh                         # flashinfer + triton, longer shapes
    ./sglang/scripts/05_ncu_attention.sh --quick --set full      # every ncu section (slower)
Writes sglang/results/05_ncu_attention/: attention_kernels.csv, stalls.csv, ncu_<backend>/ (raw CSV,
ncu log), server_<backend>.log, story.txt, summary.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from common import gpu, ncu, serving, story  # noqa: E402
from common.checks import SetupError, require_module, run_main  # noqa: E402
from common.results import Run  # noqa: E402
from common.serving import Server, flags  # noqa: E402

STEM_FILE = Path(__file__).with_name("05_ncu_attention.sh")
# decode steps per request: enough that the profiling window, opened over HTTP once the batch is
# decoding, still finds steps to profile (2 of them are profiled; the rest only cost ~ms each)
DECODE_NEW = 160
KERNELS = {  # kernel-name regex per backend, and the stage each kernel belongs to
    "flashinfer": ("PrefillWithKVCache|BatchPrefillWithPagedKVCache|BatchDecodeWithPagedKVCache|MergeState",
                   {"PrefillWithKVCacheKernel": "prefill", "BatchPrefillWithPagedKVCacheKernel": "decode",
                    "BatchDecodeWithPagedKVCacheKernel": "decode", "MergeStateKernel": "decode",
                    "PersistentVariableLengthMergeStatesKernel": "decode"}),
    "triton": ("_fwd_kernel|_fwd_grouped_kernel_stage1",
               {"_fwd_kernel": "prefill", "_fwd_kernel_unified": "prefill", "_fwd_grouped_kernel_stage1": "decode",
                "_fwd_kernel_stage1": "decode", "_fwd_kernel_stage2": "decode"}),
    "fa3": ("flash_fwd|FlashAttn", {}),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="05_ncu_attention.sh", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="flashinfer only, shorter prompts (~2 min)")
    p.add_argument("--out", default=None, help="results folder (default sglang/results/05_ncu_attention)")
    p.add_argument("--backends", default=None, help="comma list (default: flashinfer; full run: flashinfer,triton)")
    p.add_argument("--layers", type=int, default=2, help="layers kept (shapes unchanged); 0 = the full model")
    p.add_argument("--prefill-len", type=int, default=None, help="prefill prompt tokens (quick 4096, full 8192)")
    p.add_argument("--decode-bs", type=int, default=32, help="decode batch size (default 32)")
    p.add_argument("--decode-kv", type=int, default=None, help="decode context tokens (quick 2048, full 4096)")
    p.add_argument("--set", dest="section_set", default=None, help="ncu section set (e.g. full); default: summary metrics")
    p.add_argument("--launch-count", type=int, default=200, help="safety cap on profiled launches (default 200)")
    serving.add_model_args(p, backend_default=None)
    return p.parse_args(argv)


def stage_of(kernel: str, backend: str) -> str:
    return KERNELS.get(backend, ("", {}))[1].get(kernel, "unknown")


def profile_backend(args, backend, model_dir, base, shape, run) -> "object":
    layers, hq, hkv, d = shape
    Lp, B, Lkv = args.prefill_len, args.decode_bs, args.decode_kv
    out_dir = run.dir / f"ncu_{backend}"
    out_dir.mkdir(parents=True, exist_ok=True)
    log_file = out_dir / "ncu_log.txt"
    wrapper = ncu.build_cmd([], log_file=log_file, kernel=KERNELS[backend][0], launch_count=args.launch_count,
                            metrics=None if args.section_set else "summary", section_set=args.section_set,
                            extra=["--profile-from-start", "off"])
    pool = Lp + B * (Lkv + DECODE_NEW + 16) + 4096
    fl = base + flags(attention_backend=backend, disable_prefill_cuda_graph=True, disable_decode_cuda_graph=True,
                      skip_server_warmup=True, max_total_tokens=pool, log_level="info", decode_log_interval=1,
                      json_model_override_args={"num_hidden_layers": args.layers} if args.layers else None)
    sp = {"temperature": 0, "ignore_eos": True}
    with Server(model_dir, fl, port=args.port, log_path=run.path(f"server_{backend}.log"), echo=run.log,
                wrapper=wrapper, start_timeout=max(args.start_timeout, 1800), env={"SGLANG_LOG_MS": "1"},
                name=f"server[{backend} under ncu]") as srv:
        out = srv.generate(input_ids=serving.random_ids(16, 1), sampling_params={**sp, "max_new_tokens": 2})
        if out["meta_info"]["completion_tokens"] != 2:     # not profiled: the window is closed
            raise RuntimeError("sanity request came back wrong")
        run.log("sanity: 2 tokens back ✅  All results match. Profiling prefill, then decode.")
        srv.flush_cache()
        srv.start_profile(run.dir / "profiles", activities=["CUDA_PROFILER"], num_steps=1)
        srv.generate(input_ids=serving.random_ids(Lp, 2), sampling_params={**sp, "max_new_tokens": 1})
        srv.stop_profile()
        res: dict = {}
        th = threading.Thread(target=lambda: res.update(out=srv.generate_many(
            [{"input_ids": serving.random_ids(Lkv, 100 + i), "sampling_params": {**sp, "max_new_tokens": DECODE_NEW}}
             for i in range(B)])))
        mark = srv.log_mark()
        th.start()
        try:
            srv.wait_log(rf"Decode batch, #running-req: {B},", mark, timeout=900, while_alive=th)
            srv.start_profile(run.dir / "profiles", activities=["CUDA_PROFILER"], num_steps=2)
            time.sleep(1.0)
            srv.stop_profile()
        finally:
            th.join()
    # the server has exited; ncu printed its CSV into the log file
    text = log_file.read_text(errors="replace") if log_file.exists() else ""
    if "ERR_NVGPUCTRPERM" in text:
        raise SetupError(ncu.PERM_HINT)
    csv_text = ncu.extract_csv(text)
    if not csv_text.strip():
        raise RuntimeError(f"ncu profiled no attention kernel for {backend}; see {log_file} and server_{backend}.log")
    (out_dir / "ncu.csv").write_text(csv_text)
    df = ncu.read_raw(csv_text)
    s = ncu.summarize(df, peaks=gpu.peaks())
    s.insert(0, "backend", backend)
    s.insert(1, "stage", [stage_of(k, backend) for k in s["kernel"]])
    flops = 2.0 * Lp * Lp * hq * d          # one layer's causal prefill attention
    s["tflop_s"] = [flops / (t * 1e-6) / 1e12 if st == "prefill" and t else None for st, t in zip(s["stage"], s["time_us"])]
    s["shape"] = [f"prefill {Lp} tok" if st == "prefill" else f"decode bs {B} kv {Lkv}" for st in s["stage"]]
    return s


def main(argv=None) -> int:
    args = parse_args(argv)
    serving.require_sglang()
    serving.require_gpus(1)
    if not shutil.which(os.environ.get("NCU", "ncu")):
        raise SetupError("Nsight Compute (ncu) is not on PATH (it ships with the CUDA toolkit, e.g. /usr/local/cuda/bin); "
                         "add it to PATH or set NCU=/path/to/ncu.")
    pd = require_module("pandas")
    require_module("torch", "pip install -r requirements.txt")
    args.prefill_len = args.prefill_len or (4096 if args.quick else 8192)
    args.decode_kv = args.decode_kv or (2048 if args.quick else 4096)
    backends = args.backends.split(",") if args.backends else (["flashinfer"] if args.quick else ["flashinfer", "triton"])
    model_dir, base = serving.model_and_flags(args)
    c = json.loads((Path(model_dir) / "config.json").read_text())
    shape = (c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"],
             c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
    with Run(STEM_FILE, args, out=args.out) as run:
        pk = gpu.peaks()
        frames = []
        for b in backends:
            try:
                frames.append(profile_backend(args, b, model_dir, base, shape, run))
                run.log(f"{b}: {len(frames[-1])} attention launches profiled")
            except SetupError:
                raise
            except Exception as e:
                run.point_error({"backend": b}, e)
        if not frames:
            raise RuntimeError("no backend was profiled; see point_errors")
        s = pd.concat(frames, ignore_index=True)
        s["pct_peak_tflops"] = 100 * s["tflop_s"].astype(float) / pk["bf16_tflops"]
        cols = ["backend", "stage", "shape", "kernel", "launch", "time_us", "dram_tb_s", "pct_peak_dram", "dram_pct", "sm_pct",
                "tensor_pct", "tflop_s", "pct_peak_tflops", "occupancy_pct", "theoretical_occupancy_pct", "limiter",
                "regs_per_thread", "top_stalls"]
        table = s[[x for x in cols if x in s.columns]]
        serving.table(run, "attention_kernels", table)
        serving.table(run, "stalls", s[["backend", "stage", "kernel", "launch"] + [x for x in s.columns if x.startswith("stall_")]])

        # ---- verdicts (on FlashInfer where present: the default backend here)
        main_b = "flashinfer" if "flashinfer" in set(s["backend"]) else s["backend"].iloc[0]
        one = s[s["backend"] == main_b]
        dec = one[(one["stage"] == "decode") & one["kernel"].str.contains("Paged|_fwd_grouped|Decode")]
        pre = one[one["stage"] == "prefill"]
        if len(dec):
            d = dec.sort_values("time_us", ascending=False).iloc[0]
            run.headline(decode_attention_dram_pct=d["dram_pct"], decode_attention_tb_s=d["dram_tb_s"])
            run.observe(f"decode attention (batch {args.decode_bs}, KV {args.decode_kv}) is memory-bound: DRAM above "
                        "~70% of peak (A100: 82%), tensor pipe low (A100: 15%). Confirmed if DRAM >= 70% and tensor < 30%",
                        f"{d['kernel']}: DRAM {d['dram_pct']:.0f}% ({d['dram_tb_s']:.2f} TB/s = {d['pct_peak_dram']:.0f}% of "
                        f"measured copy), tensor {d['tensor_pct']:.0f}%, SM {d['sm_pct']:.0f}% ({ncu.bound(d.to_dict())})",
                        "confirmed" if d["dram_pct"] >= 70 and d["tensor_pct"] < 30 else "refuted", "attention_kernels.csv")
            top = str(d["top_stalls"]).split(" ")[0] if d["top_stalls"] else "-"
            run.observe("long-scoreboard (waiting for memory) is the top warp stall of decode attention",
                        f"top stalls: {d['top_stalls'] or '-'}", "confirmed" if top == "long_scoreboard" else "refuted",
                        "stalls.csv")
        if len(pre) and len(dec):
            p = pre.sort_values("time_us", ascending=False).iloc[0]
            run.headline(prefill_attention_tensor_pct=p["tensor_pct"], prefill_attention_tflop_s=p["tflop_s"])
            run.observe("prefill attention has much higher tensor-pipe activity than decode (confirmed if >= 2x)",
                        f"tensor pipe: prefill {p['tensor_pct']:.0f}% ({p['kernel']}, {story.fmt(p['tflop_s'])} TFLOP/s = "
                        f"{story.fmt(p['pct_peak_tflops'])}% of measured bf16) vs decode {d['tensor_pct']:.0f}%",
                        "confirmed" if p["tensor_pct"] >= 2 * max(d["tensor_pct"], 1e-9) else "refuted", "attention_kernels.csv")
            run.observe("prefill attention occupancy is limited by shared memory or registers (A100: 47%, shared memory)",
                        f"achieved occupancy {p['occupancy_pct']:.0f}%, limiter {p['limiter']}",
                        "confirmed" if any(x in str(p["limiter"]) for x in ("shared_mem", "registers")) else "refuted",
                        "attention_kernels.csv")

        items = [(f"{b} — {st}", [(story.kernel_line(r), []) for r in g.to_dict("records")[:6]])
                 for (b, st), g in s.groupby(["backend", "stage"], sort=False)]
        run.story(story.tree(f"ATTENTION ON THE COUNTERS — {pk['gpu']} (measured copy {pk['dram_tb_s']:.2f} TB/s, "
                             f"bf16 {pk['bf16_tflops']:.0f} TFLOP/s); layers kept: {args.layers or 'all'}", items))
        print(run.summary["story"])
    return 0


if __name__ == "__main__":
    run_main(main)
