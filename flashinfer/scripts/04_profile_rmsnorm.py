#!/usr/bin/env python3
"""04 · RMSNorm and fused add+RMSNorm: how close to DRAM peak, and what the fusion saves.

What it measures
    flashinfer.rmsnorm and flashinfer.fused_add_rmsnorm against the same maths in plain torch
    (unfused: several elementwise/reduction kernels), for hidden 4096 (Llama-3.1-8B) and 8192
    (Llama-3.1-70B), tokens 1 -> 16k, bf16. For each point: median kernel time (common.timing,
    cold L2), achieved TB/s from the bytes the op must move, and % of this GPU's measured copy
    bandwidth. With --ncu, Nsight Compute measures the DRAM bytes each variant really moved, so
    the saving of the fusion is a measurement, not arithmetic.

What the plan expected (hypotheses, written for an A100)
    * RMSNorm is memory-bound: high DRAM %, low SM %, "85% of peak bandwidth".
    * The fused residual-add variant "saves 40% memory traffic" (the byte count says 20%:
      add then norm moves 5 tensors of T x H, the fused kernel 4).
    * Small token counts cannot fill the GPU: bandwidth falls far below peak (launch/latency bound).

Run
    python flashinfer/scripts/04_profile_rmsnorm.py --quick          # ~1 min (warm JIT)
    python flashinfer/scripts/04_profile_rmsnorm.py                  # full sweep
    python flashinfer/scripts/04_profile_rmsnorm.py --quick --ncu    # + DRAM bytes, occupancy, stalls
    ./flashinfer/scripts/ncu_profile.sh --kernel RMSNorm --set full -- \\
        python flashinfer/scripts/04_profile_rmsnorm.py --ncu-target --quick
Writes flashinfer/results/04_profile_rmsnorm/: sweep.csv, ncu_kernels.csv (with --ncu),
bandwidth.png, story.txt, summary.json.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from common import gpu, ncu, plots, story  # noqa: E402
from common.checks import require_gpu, require_module, run_main  # noqa: E402
from common.ranges import nvtx_range  # noqa: E402
from common.results import Run  # noqa: E402
from common.timing import bench, rates  # noqa: E402

HIDDEN = (4096, 8192)
TOKENS_FULL = (1, 16, 64, 256, 1024, 4096, 8192, 16384)
TOKENS_QUICK = (1, 64, 1024, 8192)
VARIANTS = ("flashinfer.rmsnorm", "torch rmsnorm (unfused)", "flashinfer.fused_add_rmsnorm",
            "torch add + flashinfer.rmsnorm")
KERNELS = "RMSNorm|vectorized_elementwise|unrolled_elementwise|reduce_kernel"  # + torch baseline kernels (not randn)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="4 token counts instead of 8 (~1 min)")
    p.add_argument("--ncu", action="store_true", help="also profile every point once under ncu")
    p.add_argument("--ncu-target", action="store_true", help=argparse.SUPPRESS)  # run points once, for ncu
    p.add_argument("--out", default=None, help="results folder (default flashinfer/results/04_profile_rmsnorm)")
    p.add_argument("--eps", type=float, default=1e-5)
    return p.parse_args(argv)


def torch_rmsnorm(torch, x, w, eps):
    """The unfused reference: what a framework without a norm kernel runs."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def make_calls(torch, fi, tokens, hidden, eps):
    """One callable per variant, with the bytes it must move (each input read once, output written once)."""
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    e = 2  # bytes per bf16 element
    th = tokens * hidden
    return {
        VARIANTS[0]: (lambda: fi.rmsnorm(x, w, eps=eps, out=out), 2 * th * e + hidden * e),
        VARIANTS[1]: (lambda: torch_rmsnorm(torch, x, w, eps), 2 * th * e + hidden * e),
        VARIANTS[2]: (lambda: fi.fused_add_rmsnorm(x, r, w, eps=eps), 4 * th * e + hidden * e),
        VARIANTS[3]: (lambda: (r.add_(x), fi.rmsnorm(r, w, eps=eps, out=out)), 5 * th * e + hidden * e),
    }, (x, r, w)


def check_correctness(torch, fi, eps, run):
    """Correct before fast: both FlashInfer ops against float32 torch on fresh random data."""
    ok = True
    for hidden in HIDDEN:
        x = torch.randn(333, hidden, device="cuda", dtype=torch.bfloat16)
        r = torch.randn_like(x)
        w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
        ref = torch_rmsnorm(torch, x, w, eps).float()
        got = fi.rmsnorm(x, w, eps=eps).float()
        e1 = ((got - ref).norm() / ref.norm()).item()
        ref_r = (x.float() + r.float())
        ref2 = torch_rmsnorm(torch, ref_r.to(torch.bfloat16), w, eps).float()
        x2, r2 = x.clone(), r.clone()
        fi.fused_add_rmsnorm(x2, r2, w, eps=eps)
        e2 = ((x2.float() - ref2).norm() / ref2.norm()).item()
        e3 = ((r2.float() - ref_r).norm() / ref_r.norm()).item()
        good = max(e1, e2, e3) < 1e-2 and all(map(lambda v: v == v, (e1, e2, e3)))
        ok &= good
        run.log(f"correctness hidden={hidden}: rmsnorm rel.err {e1:.1e}, fused out {e2:.1e}, "
                f"residual {e3:.1e} {'✅' if good else '❌'}")
    if not ok:
        raise RuntimeError("FlashInfer RMSNorm disagrees with the torch reference (rel. error >= 1e-2)")
    run.log("All results match. Starting benchmarks.")


def ncu_target(args) -> int:
    """Under ncu: every point once, a marker kernel before each (see common.ncu.split_points)."""
    import torch
    import flashinfer as fi
    for hidden in HIDDEN:
        for tokens in (TOKENS_QUICK if args.quick else TOKENS_FULL):
            calls, _ = make_calls(torch, fi, tokens, hidden, args.eps)
            for name, (fn, _b) in calls.items():
                ncu.mark()
                with nvtx_range(f"{name} tokens={tokens} hidden={hidden}"):
                    fn()
    torch.cuda.synchronize()
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    torch = require_module("torch", "pip install -r requirements.txt")
    require_gpu(torch)
    fi = require_module("flashinfer", "pip install flashinfer-python==0.6.15.post1")
    if args.ncu_target:
        return ncu_target(args)
    tokens_list = TOKENS_QUICK if args.quick else TOKENS_FULL
    with Run(__file__, args, out=args.out) as run:
        pk = gpu.peaks()
        run.log(f"{pk['gpu']}: measured copy {pk['dram_tb_s']:.2f} TB/s "
                f"(datasheet {pk['datasheet']['dram_tb_s'] if pk['datasheet'] else '?'} TB/s)")
        import flashinfer.norm as fnorm
        path = "CUDA JIT `norm` module" if getattr(fnorm, "_USE_CUDA_NORM", True) else "CuTe-DSL kernels"
        run.note(f"FlashInfer norm path: {path}")
        check_correctness(torch, fi, args.eps, run)

        rows = []
        points = [(h, t) for h in HIDDEN for t in tokens_list]
        for i, (hidden, tokens) in enumerate(points, 1):
            run.log(f"[{i}/{len(points)}] hidden={hidden} tokens={tokens}")
            try:
                calls, _ = make_calls(torch, fi, tokens, hidden, args.eps)
                for name, (fn, nbytes) in calls.items():
                    with nvtx_range(f"{name} tokens={tokens} hidden={hidden}"):
                        t = bench(fn)
                    r = rates(t.median_ms, bytes=nbytes, peaks=pk)
                    rows.append({"variant": name, "hidden": hidden, "tokens": tokens, "time_us": t.median_us,
                                 "spread_pct": t.spread_pct, "bytes": nbytes, "tb_s": r["tb_s"],
                                 "pct_peak_dram": r["pct_peak_dram"]})
            except Exception as e:  # a failed point is recorded and the sweep goes on
                run.point_error({"hidden": hidden, "tokens": tokens}, e)
                torch.cuda.empty_cache()
        import pandas as pd
        df = pd.DataFrame(rows)
        run.table("sweep", df)
        big = df[df["tokens"] == max(tokens_list)]
        fig = plots.sweep(df[df["hidden"] == HIDDEN[0]], x="tokens", y="pct_peak_dram", hue="variant", logx=True,
                          ylabel="% of measured copy bandwidth", hline=100, hline_label="measured copy peak",
                          title=f"RMSNorm, hidden {HIDDEN[0]}, bf16 — {pk['gpu']}")
        run.figure("bandwidth", fig)

        kern = None
        if args.ncu:
            run.log("ncu: profiling every point once (DRAM bytes, occupancy, stalls)")
            res = ncu.profile([sys.executable, str(Path(__file__).resolve()), "--ncu-target"] +
                              (["--quick"] if args.quick else []), run.dir / "ncu",
                              kernel=ncu.with_marker(KERNELS), echo=run.log, timeout=900)
            kern = ncu.summarize(ncu.split_points(res.df), peaks=pk)
            labels = [(v, t, h) for h in HIDDEN for t in tokens_list for v in VARIANTS]
            kern["variant"] = [labels[p][0] for p in kern["point"]]
            kern["tokens"] = [labels[p][1] for p in kern["point"]]
            kern["hidden"] = [labels[p][2] for p in kern["point"]]
            run.table("ncu_kernels", kern)

        # ---- verdicts: the plan's hypotheses against this run
        fi_big = big[big["variant"] == VARIANTS[0]]
        best = fi_big["pct_peak_dram"].max() if len(fi_big) else float("nan")
        run.headline(rmsnorm_tb_s=float(fi_big["tb_s"].max()) if len(fi_big) else None,
                     rmsnorm_pct_of_measured_peak=best)
        run.observe("RMSNorm reaches ~85% of peak DRAM bandwidth at large token counts",
                    f"{best:.0f}% of measured copy bandwidth at {max(tokens_list)} tokens",
                    "confirmed" if best >= 75 else "refuted", "sweep.csv")
        small = df[(df["tokens"] == min(tokens_list)) & (df["variant"] == VARIANTS[0])]["pct_peak_dram"].max()
        run.observe("a handful of tokens cannot fill the GPU (far below peak)",
                    f"{small:.1f}% of peak at {min(tokens_list)} token(s)", "confirmed" if small < 20 else "refuted",
                    "sweep.csv")
        if kern is not None:
            sums = kern.groupby(["variant", "tokens", "hidden"])[["dram_read_mb", "dram_write_mb"]].sum().sum(axis=1)
            key = (max(tokens_list), HIDDEN[0])
            fused, unfused = sums.get((VARIANTS[2], *key)), sums.get((VARIANTS[3], *key))
            if fused and unfused:
                saved = 100 * (1 - fused / unfused)
                run.headline(fusion_dram_saving_pct=saved)
                run.observe("fusing the residual add saves ~40% of memory traffic (byte count: 20%)",
                            f"ncu DRAM bytes: fused {fused:.0f} MB vs add+norm {unfused:.0f} MB -> {saved:.0f}% saved "
                            f"(tokens={key[0]}, hidden={key[1]})",
                            "refuted" if saved < 30 else "confirmed", "ncu_kernels.csv")
            k_fi = kern[(kern["kernel"] == "RMSNormKernel") & (kern["variant"] == VARIANTS[0]) &
                        (kern["hidden"] == HIDDEN[0])]     # the plain kernel, not the norm inside add + norm
            if len(k_fi):
                r = k_fi.sort_values("tokens").iloc[-1].to_dict()
                run.observe("RMSNorm is memory-bound: high DRAM %, low SM %",
                            f"DRAM {r['dram_pct']:.0f}%, SM {r['sm_pct']:.0f}% ({ncu.bound(r)}; {VARIANTS[0]}, "
                            f"{r['tokens']} tokens x hidden {r['hidden']})",
                            "confirmed" if r["dram_pct"] > r["sm_pct"] else "refuted", "ncu_kernels.csv")

        # ---- the story
        items = []
        for name in VARIANTS:
            d = big[big["variant"] == name]
            if len(d):
                items.append((f"{name}: " + ", ".join(
                    f"h={int(r.hidden)} {r.time_us:.1f} us {r.tb_s:.2f} TB/s ({r.pct_peak_dram:.0f}% peak)"
                    for r in d.itertuples()), []))
        if kern is not None:
            last = kern[kern["tokens"] == max(tokens_list)]
            items.append(("hardware (ncu, largest point)", [(story.kernel_line(r), []) for r in
                                                            last.to_dict("records")][:8]))
        run.story(story.tree(f"RMSNORM at {max(tokens_list)} tokens, bf16 — {pk['gpu']} "
                             f"(copy peak {pk['dram_tb_s']:.2f} TB/s)", items))
        print(run.summary["story"])
    return 0


if __name__ == "__main__":
    run_main(main)
