#!/usr/bin/env python3
"""06 · One forward of mini-SGLang, kernel by kernel: Llama-3.1-8B (dummy weights), prefill and decode.

What it measures
    mini-SGLang's offline LLM (attention_backend="fi", use_dummy_weight=True) on a local Llama-3.1-8B
    config (common.models), decoding eagerly (cuda_graph_max_bs=0) so that its own NVTX ranges
    (Embedding, Layer_i, MHA, MLP, LMHead, Sampler) are emitted. Each engine step is wrapped in a
    named range with CUDA events (engine.forward_batch), and torch.cuda.nvtx.range is mirrored into
    torch.profiler's record_function, so one trace shows: every step (prefill, decode) with its GPU
    time; inside the last decode step, the kernels of one layer in launch order, grouped by MHA/MLP,
    with durations; the share of each kernel in the step; GPU idle gaps; the CPU plan() sync of the
    FlashInfer backend per step; and the CUDA streams in use. A second pair of prompts that share a
    1024-token prefix shows the radix cache at work (cached_len of the second prefill).
    Full run: the same model in two more processes with decode CUDA graphs (overlap scheduling on,
    then MINISGL_DISABLE_OVERLAP_SCHEDULING=1): decode step time, GPU gap between steps, and whether
    any Layer_i range survives a graph replay. --nsys: the eager run again under Nsight Systems
    (kernel and NVTX tables); without a usable nsys the torch-profiler timeline is the fallback.

What the plan expected (hypotheses)
    * Per layer ~10 kernels in a fixed order: norm, QKV GEMM, RoPE, store_kv_cache, attention (+ merge
      when KV is split), O GEMM, fused add-norm, gate/up GEMM, activation, down GEMM.
    * Layer ranges in eager steps, none inside graph replays; one FlashInfer plan sync per step;
      small GPU gaps between steps with overlap scheduling, larger without.
    * A shared prefix shows up as cached_len and a shorter prefill.

Run (one LLM per process, created before any CUDA call; gloo binds 127.0.0.1:2333, so one at a time)
    python mini-sglang/scripts/06_forward_timeline.py --quick        # ~1 min: eager run only
    python mini-sglang/scripts/06_forward_timeline.py                # + graph / no-overlap runs (~2 min)
    python mini-sglang/scripts/06_forward_timeline.py --quick --nsys # + Nsight Systems tables
Writes mini-sglang/results/06_forward_timeline/: steps.csv, layer_kernels.csv, decode_step_kernels.csv,
streams.csv, variants.csv (full), nsys_kernels.csv / nsys_nvtx.csv (--nsys), trace.json, story.txt, summary.json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import gpu, models, nsys, story, trace  # noqa: E402
from common.checks import require_gpu, require_module, run_main  # noqa: E402
from common.ncu import short_name  # noqa: E402
from common.ranges import nvtx_range  # noqa: E402
from common.results import Run  # noqa: E402
import _msgl  # noqa: E402

CATEGORY = [("norm", r"RMSNorm|Norm"), ("store", r"store_kv_cache"), ("attention", r"BatchPrefill|BatchDecode|Merge|flash"),
            ("rope", r"Rotary|Rope|rope"), ("activation", r"act_and_mul|silu|Silu|Activation"),
            ("embedding", r"index_kernel"), ("gemm", r"nvjet|gemm|Gemm|sm90_xmma|cutlass|splitK|Kernel2")]
EXPECTED_LAYER = ["norm", "gemm", "rope", "store", "attention", "gemm", "norm", "gemm", "activation", "gemm"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="the eager run only (~1 min)")
    p.add_argument("--nsys", action="store_true", help="also run the eager case under Nsight Systems (if usable)")
    p.add_argument("--model", default="llama-3.1-8b", choices=sorted(models.PRESETS))
    p.add_argument("--prompt-len", type=int, default=512, help="tokens per prompt")
    p.add_argument("--batch", type=int, default=1, help="prompts decoded together")
    p.add_argument("--decode-steps", type=int, default=16, help="decode steps in the timed generate")
    p.add_argument("--variant", default="eager", choices=("eager", "graph", "graph-no-overlap"), help=argparse.SUPPRESS)
    p.add_argument("--variant-out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--nsys-target", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help="results folder (default mini-sglang/results/06_forward_timeline)")
    return p.parse_args(argv)


def category(name: str) -> str:
    return next((c for c, rx in CATEGORY if re.search(rx, name)), "other")


def prompts(n, length, seed):
    rng = random.Random(seed)
    return [_msgl.random_tokens(rng, length) for _ in range(n)]


def start_llm(args, torch):
    """The LLM first (Engine asserts CUDA is untouched), then the range mirror and the step wrapper."""
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM
    model_dir = models.write_model_dir(args.model)
    t0 = time.perf_counter()
    llm = LLM(str(model_dir), use_dummy_weight=True, attention_backend="fi",
              cuda_graph_max_bs=0 if args.variant == "eager" else 8, num_page_override=1 << 17,
              max_seq_len_override=16384)
    init_s = time.perf_counter() - t0
    torch.cuda.nvtx.range = lambda msg, *a, **k: nvtx_range(msg)     # NVTX ranges also in torch.profiler
    steps = []
    orig = llm.engine.forward_batch

    def traced(batch, sargs):
        lens = [(r.cached_len, r.extend_len) for r in batch.reqs]   # read before: forward_batch advances them
        name = f"step[{batch.phase} bs={batch.size} pad={batch.padded_size} tokens={sum(e for _, e in lens)}]"
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(llm.engine.stream)
        with nvtx_range(name):
            out = orig(batch, sargs)
        e.record(llm.engine.stream)
        steps.append({"name": name, "phase": batch.phase, "bs": batch.size, "lens": lens, "s": s, "e": e})
        return out
    llm.engine.forward_batch = traced
    sp = lambda n: SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    return llm, steps, sp, init_s


def timed(llm, steps, sp, torch, ids, n):
    """One generate; per-step GPU time and the GPU gap before each step (ms)."""
    steps.clear()
    t0 = time.perf_counter()
    llm.generate(ids, sp(n))
    wall = time.perf_counter() - t0
    torch.cuda.synchronize()
    rows = []
    for i, st in enumerate(steps):
        gap = steps[i - 1]["e"].elapsed_time(st["s"]) if i else None
        rows.append({"step": i, "phase": st["phase"], "bs": st["bs"], "cached_len": st["lens"][0][0],
                     "new_tokens": sum(e for _, e in st["lens"]), "gpu_ms": st["s"].elapsed_time(st["e"]),
                     "gap_before_ms": gap})
    return rows, wall


def profiled(llm, sp, torch, ids, path):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        llm.generate(ids, sp(3))             # 1 prefill + 2 decode steps
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))


def analyze(path):
    """Steps, the kernels of one layer of the last decode step, and that step's kernel table."""
    ev = _msgl.load_events(path)
    steps = sorted((e for e in ev if e.get("cat") == "user_annotation" and e.get("name", "").startswith("step[")),
                   key=lambda e: e["ts"])
    dec = [s for s in steps if "decode" in s["name"]]
    if not dec:
        raise RuntimeError("the profiled generate recorded no decode step")
    last = dec[-1]
    lo, hi = last["ts"], last["ts"] + last["dur"]
    step_k = [r for r in _msgl.launches_by_range(ev, re.escape(last["name"]) + "$") if r["range_start_us"] == lo]
    layers = [r for r in _msgl.launches_by_range(ev, r"^Layer_\d+$") if lo <= r["range_start_us"] <= hi]
    names = sorted({r["range"] for r in layers}, key=lambda n: int(n.split("_")[1]))
    mid = names[len(names) // 2] if names else None
    blocks = {}
    if mid:
        layer = [r for r in layers if r["range"] == mid]
        for part in ("MHA", "MLP"):
            for r in _msgl.launches_by_range(ev, rf"^{part}$"):
                if layer and layer[0]["gpu_start_us"] - 1 <= r["gpu_start_us"] <= layer[-1]["gpu_start_us"] + 1:
                    blocks[(r["gpu_start_us"], r["short"])] = part
        t0 = layer[0]["gpu_start_us"] if layer else 0
        lk = [{"order": r["order"], "block": blocks.get((r["gpu_start_us"], r["short"]), "-"), "category": category(r["short"]),
               "kernel": r["short"], "t_us": r["gpu_start_us"] - t0, "dur_us": r["dur_us"], "grid": r["grid"],
               "block_dim": r["block"], "stream": r["stream"]} for r in layer if r["kind"] == "kernel"]
        how = f"NVTX range {mid} (mirrored into torch.profiler)"
    else:   # no Layer_i ranges: find the repeating unit of the step's kernel sequence
        seq = [r["short"] for r in step_k if r["kind"] == "kernel"]
        p, block, s = _msgl.kernel_period(seq, anchor="Norm")
        ks = [r for r in step_k if r["kind"] == "kernel"][s:s + p] if p else []
        lk = [{"order": i, "block": "-", "category": category(r["short"]), "kernel": r["short"],
               "t_us": r["gpu_start_us"] - ks[0]["gpu_start_us"], "dur_us": r["dur_us"], "grid": r["grid"],
               "block_dim": r["block"], "stream": r["stream"]} for i, r in enumerate(ks)]
        how = f"repeating unit of the step's kernel sequence (period {p}); no Layer_i ranges in the trace"
    kern = [r for r in step_k if r["kind"] == "kernel"]
    import pandas as pd
    kd = pd.DataFrame([{"ts_us": r["gpu_start_us"], "end_us": r["gpu_start_us"] + r["dur_us"], "short": r["short"],
                        "dur_us": r["dur_us"]} for r in kern])
    table = trace.kernel_summary(kd) if len(kd) else kd
    syncs = _msgl.runtime_calls_in_ranges(ev, r"^step\[", r"^cudaEventSynchronize$")
    graphs = _msgl.runtime_calls_in_ranges(ev, r"^step\[decode", r"^cudaGraphLaunch$")
    allk = [e for e in ev if e.get("cat") == "kernel"]
    streams = {}
    for e in allk:
        s = (e.get("args") or {}).get("stream")
        streams.setdefault(s, []).append(category(short_name(e["name"])))
    return {"steps": steps, "last": last, "step_kernels": kern, "layer": lk, "layer_name": mid, "how": how,
            "n_layer_ranges": len(names), "table": table, "busy": trace.busy_fraction(kd) if len(kd) else None,
            "gaps": trace.gaps(kd.sort_values("ts_us"), min_us=5) if len(kd) else None, "syncs": syncs, "graphs": graphs,
            "streams": [{"stream": s, "kernels": len(v), "top": ", ".join(f"{c} {v.count(c)}" for c in sorted(set(v),
                         key=v.count, reverse=True)[:4])} for s, v in streams.items()]}


def variant_main(args) -> int:
    """A child process: graph decode (overlap on or off); writes a small JSON for the parent."""
    torch = require_module("torch", "pip install -r requirements.txt")
    llm, steps, sp, init_s = start_llm(args, torch)
    ids = prompts(args.batch, args.prompt_len, 1)
    llm.generate(prompts(1, 64, 99), sp(2))
    rows, wall = timed(llm, steps, sp, torch, ids, args.decode_steps + 1)
    path = Path(args.variant_out).with_suffix(".trace.json")
    profiled(llm, sp, torch, prompts(args.batch, args.prompt_len, 2), path)
    a = analyze(path)
    dec = [r for r in rows if r["phase"] == "decode"]
    out = {"variant": args.variant, "init_s": init_s, "decode_gpu_ms": sum(r["gpu_ms"] for r in dec) / len(dec),
           "decode_gap_ms": sum(r["gap_before_ms"] for r in dec) / len(dec), "wall_per_decode_ms": 1e3 * wall / len(rows),
           "kernels_in_decode_step": len(a["step_kernels"]), "layer_ranges_in_decode": a["n_layer_ranges"],
           "graph_launches_in_decode": max((n for _, n in a["graphs"]), default=0)}
    Path(args.variant_out).write_text(json.dumps(out))
    llm.shutdown()
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    torch = require_module("torch", "pip install -r requirements.txt")
    require_gpu(torch)
    _msgl.require_minisgl("minisgl.llm")
    if args.variant != "eager":
        return variant_main(args)
    if args.nsys_target:
        llm, steps, sp, _ = start_llm(args, torch)
        llm.generate(prompts(1, 64, 99), sp(2))
        llm.generate(prompts(args.batch, args.prompt_len, 2), sp(3))
        llm.shutdown()
        return 0
    print(f"starting mini-SGLang LLM ({args.model}, dummy weights, attention fi, eager decode) ...", flush=True)
    llm, steps, sp, init_s = start_llm(args, torch)      # before Run: its provenance probe touches CUDA
    with Run(__file__, args, out=args.out) as run:
        run.log(f"LLM ready in {init_s:.1f} s; KV pool {llm.engine.num_pages:,} tokens; graphs "
                f"{llm.engine.graph_runner.graph_bs_list or 'off'}")
        out = llm.generate(prompts(1, 64, 99), sp(2))       # warm-up: FlashInfer JIT, first plans
        if len(out[0]["token_ids"]) != 2:
            raise RuntimeError(f"sanity: asked for 2 tokens, got {len(out[0]['token_ids'])}")
        run.log("sanity: generate returned the requested token count. Timing.")
        rows, wall = timed(llm, steps, sp, torch, prompts(args.batch, args.prompt_len, 1), args.decode_steps + 1)
        prefix = prompts(1, 1024, 5)[0]
        tails = prompts(2, 64, 6)
        share, _ = timed(llm, steps, sp, torch, [prefix + tails[0]], 1)
        share2, _ = timed(llm, steps, sp, torch, [prefix + tails[1]], 1)
        for r, tag in ((share[0], "prefix first"), (share2[0], "prefix shared")):
            rows.append({**r, "step": tag})
        run.table("steps", rows)
        path = run.path("trace.json")
        run.log("profiling one generate (1 prefill + 2 decode steps) with torch.profiler")
        profiled(llm, sp, torch, prompts(args.batch, args.prompt_len, 2), path)
        a = analyze(path)
        run.table("layer_kernels", a["layer"])
        run.table("decode_step_kernels", a["table"])
        run.table("streams", a["streams"])
        llm.shutdown()
        del llm
        import gc
        import minisgl.core
        minisgl.core._GLOBAL_CTX = None      # it still holds the KV pool; the variant processes need the memory
        gc.collect()
        torch.cuda.empty_cache()

        variants = []
        if not args.quick:
            for v in ("graph", "graph-no-overlap"):
                run.log(f"variant {v}: a fresh process (LLM with decode CUDA graphs)")
                vout = run.path(f"variant_{v}.json")
                env = {**os.environ, **({"MINISGL_DISABLE_OVERLAP_SCHEDULING": "1"} if v.endswith("no-overlap") else {})}
                cmd = [sys.executable, str(Path(__file__).resolve()), "--variant", v, "--variant-out", str(vout),
                       "--model", args.model, "--prompt-len", str(args.prompt_len), "--batch", str(args.batch)]
                try:
                    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
                except subprocess.TimeoutExpired:
                    run.point_error({"variant": v}, RuntimeError("no result within 400 s (process stopped)"))
                    continue
                if p.returncode == 0 and vout.exists():
                    variants.append(json.loads(vout.read_text()))
                else:
                    run.point_error({"variant": v}, RuntimeError((p.stderr or p.stdout).strip().splitlines()[-1][:240]
                                                                 if (p.stderr or p.stdout).strip() else f"rc={p.returncode}"))
            run.table("variants", variants)
        if args.nsys:
            if nsys.find():
                try:
                    rep = nsys.profile([sys.executable, str(Path(__file__).resolve()), "--nsys-target", "--model", args.model,
                                        "--prompt-len", str(args.prompt_len), "--batch", str(args.batch)], run.dir / "nsys",
                                       echo=run.log, timeout=600)
                    st = nsys.stats(rep, ("cuda_gpu_kern_sum", "nvtx_sum"))
                    for key, name in (("cuda_gpu_kern_sum", "nsys_kernels"), ("nvtx_sum", "nsys_nvtx")):
                        if key in st:
                            run.table(name, trace.read_nsys_csv(st[key]))
                except Exception as e:   # the torch-profiler timeline stands
                    run.point_error({"part": "nsys"}, e)
            else:
                run.note("nsys not usable here: the torch-profiler timeline (trace.json) is the timeline of record")

        # ---- verdicts
        dec = [r for r in rows if r["phase"] == "decode" and isinstance(r["step"], int)]
        pre = [r for r in rows if r["phase"] == "prefill" and isinstance(r["step"], int)]
        cats = [r["category"] for r in a["layer"] if r["category"] != "other"]
        collapsed = [c for i, c in enumerate(cats) if i == 0 or c != cats[i - 1]]   # split-K reduce, merge: one step
        run.headline(init_s=init_s, decode_step_gpu_ms=sum(r["gpu_ms"] for r in dec) / len(dec),
                     prefill_gpu_ms=pre[0]["gpu_ms"] if pre else None, kernels_per_layer=len(a["layer"]),
                     decode_step_kernels=len(a["step_kernels"]), shared_prefix_cached_len=share2[0]["cached_len"])
        run.observe("each layer runs ~10 kernels: norm, GEMM, RoPE, store, attention, GEMM, add-norm, GEMM, act, GEMM",
                    f"{len(a['layer'])} kernels in {a['layer_name'] or 'one layer'} ({a['how']}): {' > '.join(collapsed)}",
                    "confirmed" if collapsed == EXPECTED_LAYER else "refuted", "layer_kernels.csv")
        run.observe("NVTX Layer_i ranges are present in eager decode steps",
                    f"{a['n_layer_ranges']} Layer_i ranges inside the last decode step",
                    "confirmed" if a["n_layer_ranges"] > 0 else "inconclusive", "trace.json")
        ns = sorted({n for name, n in a["syncs"]})
        run.observe("one FlashInfer plan sync (cudaEventSynchronize) per step",
                    f"cudaEventSynchronize per step: {[n for _, n in a['syncs']]}",
                    "confirmed" if ns == [1] else "inconclusive" if ns == [0] else "refuted", "trace.json")
        run.observe("a shared prefix becomes cached_len and a shorter prefill",
                    f"second prompt (1024 shared + 64 new tokens): cached_len {share2[0]['cached_len']}, "
                    f"{share2[0]['new_tokens']} new tokens, prefill {share2[0]['gpu_ms']:.2f} ms vs "
                    f"{share[0]['gpu_ms']:.2f} ms for the first", "confirmed" if share2[0]["cached_len"] >= 1024 else "refuted",
                    "steps.csv")
        vg = {v["variant"]: v for v in variants}
        if "graph" in vg:
            g = vg["graph"]
            run.observe("inside a CUDA-graph replay no Layer_i range is emitted",
                        f"graph decode step: {g['layer_ranges_in_decode']} Layer_i ranges, {g['graph_launches_in_decode']} "
                        f"cudaGraphLaunch; {g['decode_gpu_ms']:.2f} ms GPU vs {sum(r['gpu_ms'] for r in dec) / len(dec):.2f} ms eager",
                        "confirmed" if g["layer_ranges_in_decode"] == 0 and g["graph_launches_in_decode"] >= 1 else "refuted",
                        "variants.csv")
        if {"graph", "graph-no-overlap"} <= set(vg):
            a_, b_ = vg["graph"]["decode_gap_ms"], vg["graph-no-overlap"]["decode_gap_ms"]
            run.observe("overlap scheduling keeps the GPU gap between decode steps small; without it the gap grows",
                        f"mean GPU gap before a decode step: {a_ * 1e3:.0f} us with overlap, {b_ * 1e3:.0f} us without",
                        "confirmed" if b_ > a_ else "refuted", "variants.csv")

        # ---- story
        last = a["last"]
        items = [(f"LLM {args.model} dummy weights, fi, eager decode: init {init_s:.1f} s", []),
                 ("steps (timed generate, engine-stream CUDA events)", [
                     (f"{r['step']}: {r['phase']} bs={r['bs']} new={r['new_tokens']} cached={r['cached_len']} -> "
                      f"{r['gpu_ms']:.2f} ms GPU" + (f", gap before {r['gap_before_ms'] * 1e3:.0f} us" if r["gap_before_ms"] else ""), [])
                     for r in rows[:4] + rows[-2:]]),
                 (f"{last['name']}: {len(a['step_kernels'])} kernels, GPU busy "
                  f"{100 * (a['busy'] or 0):.0f}% of its span", [(f"{r['short']}: {int(r['launches'])} x, {r['share_pct']:.0f}%", [])
                                                                  for r in a["table"].head(6).to_dict("records")]),
                 (f"{a['layer_name'] or 'one layer'} kernel by kernel ({a['how']})", [
                     (f"t+{r['t_us']:7.1f} us  {r['block']:<3} {r['category']:<10} {r['kernel'][:48]} {r['dur_us']:.1f} us", [])
                     for r in a["layer"]])]
        if a["layer"]:
            ev = [{"lane": r["category"], "start": r["t_us"], "end": r["t_us"] + max(r["dur_us"], 0.5)} for r in a["layer"]]
            items.append(("timeline of that layer (GPU)\n" + story.timeline(ev, width=72, label_width=12, unit="us"), []))
        if a["gaps"] is not None and len(a["gaps"]):
            top = a["gaps"].sort_values("gap_us", ascending=False).head(3).to_dict("records")
            items.append(("largest GPU gaps in that step: " + "; ".join(f"{g['gap_us']:.0f} us before {g['before']}"
                                                                       for g in top), []))
        items.append(("streams: " + "; ".join(f"{s['stream']}: {s['kernels']} kernels ({s['top']})" for s in a["streams"]), []))
        for v in variants:
            items.append((f"{v['variant']}: decode {v['decode_gpu_ms']:.2f} ms GPU, gap {v['decode_gap_ms'] * 1e3:.0f} us, "
                          f"{v['graph_launches_in_decode']} graph launch(es), {v['layer_ranges_in_decode']} Layer ranges", []))
        run.story(story.tree(f"ONE FORWARD OF mini-SGLang — {gpu.gpus()[0]['name'] if gpu.gpus() else 'GPU'}", items))
        print(run.summary["story"])
    return 0


if __name__ == "__main__":
    run_main(main)
