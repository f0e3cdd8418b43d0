#!/usr/bin/env python3
"""04 · Attention through mini-SGLang's backends: which kernels prefill and decode select, and how fast.

What it measures
    The attention backends mini-SGLang offers on this GPU (attention/__init__.py): "fi" (FlashInfer,
    always), "fa" (sgl_kernel FA3/FA4, only when sgl_kernel.flash_attn imports) and "trtllm" (sm100
    only; listed, not exercised). Each is built the way the engine builds it (global Context, a KV
    pool of page size 1, a page table), for the Llama-3.1-8B attention shape (32 query heads, 8 KV
    heads, head_dim 128, bf16). For "fi" the decode side is measured twice: with tensor cores (the
    rule GQA >= 4 turns them on: decode then runs FlashInfer's *prefill* kernel) and without
    (MINISGL_FLASHINFER_USE_TENSOR_CORES=0: the CUDA-core decode kernel).
    --compare  fixed points (prefill 1 x 2048, prefill 8 x 512, decode 32 x 4096, decode 1 x 4096), each
               variant timed 3 times (common.capture.timing.bench: CUPTI, cold L2): kernel time, the CPU plan() time
               (common.capture.timing.bench_cpu), TFLOP/s (% of the measured bf16 ceiling) and effective TB/s from
               common.tables.flops (prefill_flops / decode_bytes with the int32 page index per key); effective bandwidth
               is a % of the measured DRAM read ceiling (decode reads) only where the working set is >= 4x L2
               (common.capture.timing.rates: decode 32 x 4096 reads 538 MB); one forward per point 3 times under
               torch.profiler (common.tables.trace.capture_calls): kernels in launch order (store_kv_cache, the attention
               kernel(s), a merge kernel when KV is split) and the plan's cudaEventSynchronize; with ncu (caches
               flushed before each pass, as the timing flushed them) also occupancy with registers/thread, shared
               memory/CTA, warps/CTA, CTAs/SM and the limiter, tensor-pipe %, measured DRAM bytes as % of the
               ceiling of their kind, L2 hit and the top warp stalls (3 launches per point).
    --sweep    decode batch x KV length and prefill length: time, effective TB/s / TFLOP/s, % of the ceilings where
               valid.
    Correctness first: every variant's output vs a float32 torch reference (causal, GQA).

What the plan expected (hypotheses: H_* below; A100 figures restated as shares of the measured ceilings,
judged on intervals of 3 repetitions)
    * Prefill attention 50-80 TFLOP/s (16-26% of the A100's dense bf16 peak), mixed compute/memory.
    * Decode attention 1.4-1.7 TB/s (70-85% of peak; judged: effective bandwidth as % of the DRAM read ceiling, its
      538 MB working set >= 4x L2), memory-bound, long-scoreboard stalls first,
      low tensor-core use. Reading fi.py: with tensor cores on, decode runs a prefill kernel; the KV
      bytes are the same either way; plan() runs on the CPU in the first layer of every step, after
      an event synchronize.

Run
    python mini-sglang/scripts/04_profile_attention.py --quick          # ~1 min: 3 compare points, small sweep
    python mini-sglang/scripts/04_profile_attention.py --quick --ncu    # + ncu at the compare points
    python mini-sglang/scripts/04_profile_attention.py --compare        # only the compare part (with ncu)
    python mini-sglang/scripts/04_profile_attention.py --sweep          # only the sweep
    python mini-sglang/scripts/04_profile_attention.py --sweep --decode-batches 1,32 --kv-lens 1024,16384
    python mini-sglang/scripts/04_profile_attention.py                  # both, with ncu
    python mini-sglang/scripts/04_profile_attention.py --reanalyse DIR --out OUT   # no GPU: the analysis again from DIR
    ./mini-sglang/scripts/ncu_profile.sh --kernel attention --set full -- \\
        python mini-sglang/scripts/04_profile_attention.py --ncu-target --quick
Writes mini-sglang/results/04_profile_attention/: backends.csv, compare.csv, kernels.csv, plan_syncs.csv (the
cudaEventSynchronize calls inside each traced call), sweep.csv, ncu_kernels.csv (with ncu), roofline.png,
decode_sweep.png (effective TB/s against the working set, DRAM ceilings and the L2 size drawn), trace.json,
story.txt, summary.json.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _msgl  # noqa: E402
from _msgl import REPEATS  # noqa: E402
from common.base import story  # noqa: E402
from common.base.checks import require_module, run_main, SetupError  # noqa: E402
from common.capture import ceilings, timing  # noqa: E402
from common.capture.ranges import nvtx_range  # noqa: E402
from common.capture.timing import bench, bench_cpu, rates  # noqa: E402
from common.tables import flops, kernels, ncu_pass, trace  # noqa: E402
from common.judge import bounds  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.render import plots  # noqa: E402
from common.run import cli, recording  # noqa: E402
from common.run.results import Run  # noqa: E402

# ------------------------------------------------------------------ the points, as data
HQ, HKV, HD = 32, 8, 128
COMPARE_FULL = [("prefill", [2048], [2048]), ("prefill", [512] * 8, [512] * 8), ("decode", [1] * 32, [4096] * 32),
                ("decode", [1], [4096])]
COMPARE_QUICK = [("prefill", [2048], [2048]), ("decode", [1] * 32, [4096] * 32), ("decode", [1], [4096])]
DECODE_BATCHES_FULL, KV_LENS_FULL = (1, 8, 32, 64, 128), (1024, 4096, 16384)
DECODE_QUICK = [(1, 1024), (32, 1024)]          # with the compare points: bs 1/32 x kv 1024/4096
PREFILL_FULL = [([q], [q]) for q in (128, 512, 2048, 8192)] + [([512], [4096])]   # last: 512 new on a 3584 prefix
PREFILL_QUICK = [([512], [512])]
KERNELS = "BatchPrefill|BatchDecode|MergeState|Prefill|Decode|flash|Flash|fmha"
D32, P2048 = "decode bs=32 kv=4096", "prefill bs=1 q=2048 kv=2048"

# ------------------------------------------------------------------ the hypotheses, as data
PLAN = "PLAN.md session 2 / seed 002 (A100: 'Prefill Attention 50-80 TFLOPs', 'Decode Attention 1.4-1.7 TB/s')"
H = declare(f"""
    tc_kernel = fi-tc-decode-kernel: fi decode with tensor cores (GQA >= 4) runs FlashInfer's prefill kernel
        judged on: every traced call ({REPEATS} each) of fi {D32}: a BatchPrefill kernel; of fi tc=off: none
        source: analysis.md (attention/fi.py:237-242 use_tensor_cores: GQA >= 4)
    decode_bw = decode-attn-bw: decode attention reaches 70-85% of peak bandwidth (bs 32 x kv 4096)
        judged on: fi decode effective bandwidth (common.tables.flops.decode_bytes incl. the page index / CUPTI time, cold L2)
            as % of the measured DRAM read ceiling, {REPEATS} repetitions; a DRAM rate because its working set (538 MB)
            is >= 4x L2 (common.capture.timing.eff_premise)
        confirmed: [70, 85]%
        source: {PLAN}: '1.4-1.7 TB/s (70-85% of peak)'
    tc_diff = fi-tc-on-off: tensor cores on/off: same KV bytes, different kernel and time
        judged on: the attention kernels of fi and fi tc=off at {D32} differ, call by call ({REPEATS} traced calls)
        source: mini-sglang/reports/plan.md 04: 'KV bytes equal either way'
    prefill = prefill-attn-tflops: prefill attention reaches at least 16-26% of the dense bf16 peak (A100: 50-80
            TFLOP/s)
        judged on: fi {P2048} TFLOP/s (common.tables.flops.prefill_flops, causal) as % of the measured bf16 ceiling,
            {REPEATS} repetitions
        confirmed: >= 16%
        source: {PLAN}; mini-sglang/reports/plan.md 04 restated: 'at least that share'
    plan_sync = fi-plan-sync: fi plans lazily inside the first attention call of a step, after one event synchronize
        judged on: exactly one cudaEventSynchronize inside each traced fi forward (plan reset first), {REPEATS} per
            point
        confirmed: [1, 1]
        source: attention/fi.py:123-132 (_initialize_metadata_once)
    ncu_decode = decode-ncu: decode: memory-bound, long-scoreboard stalls first, low tensor use
        judged on: common.judge.bounds.bound() memory-bound and top stall long_scoreboard for the decode attention kernel at
            {D32}, {REPEATS} launches per variant
        source: {PLAN}: 'memory-bound, long-scoreboard stalls first, low tensor-core use'
    ncu_prefill = prefill-ncu-tensor: prefill keeps the tensor pipe busy (> 30% of its peak)
        judged on: ncu tensor-pipe % of the prefill attention kernel at {P2048}, {REPEATS} launches
        confirmed: >= 30%
        source: {PLAN}; mini-sglang/reports/plan.md 04 'tensor pipe busy', read as > 30%
""")


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="3 compare points, 3 sweep points, no ncu (~1 min)")
    p.add_argument("--compare", action="store_true", help="only the compare part")
    p.add_argument("--sweep", action="store_true", help="only the sweep part")
    p.add_argument("--ncu", action="store_true", help="run the ncu pass also with --quick")
    p.add_argument("--decode-batches", type=cli.positive_ints, default=None, help="decode batch sizes of the sweep")
    p.add_argument("--kv-lens", type=cli.positive_ints, default=None, help="decode KV lengths of the sweep")
    p.add_argument("--prefill-lens", type=cli.positive_ints, default=None, help="prefill lengths of the sweep (batch 1)")
    p.add_argument("--ncu-target", action="store_true", help=argparse.SUPPRESS)
    recording.add_flag(p)
    return p.parse_args(argv)


def label(phase, q, kv):
    return f"{phase} bs={len(q)} q={q[0]} kv={kv[0]}" if phase == "prefill" else f"decode bs={len(q)} kv={kv[0]}"


def plan(args) -> SimpleNamespace:
    dec = ([(b, k) for b in args.decode_batches or DECODE_BATCHES_FULL for k in args.kv_lens or KV_LENS_FULL]
           if (args.decode_batches or args.kv_lens or not args.quick) else DECODE_QUICK)
    pre = [([q], [q]) for q in args.prefill_lens] if args.prefill_lens else (PREFILL_QUICK if args.quick else PREFILL_FULL)
    cmp_pts = COMPARE_QUICK if args.quick else COMPARE_FULL
    return SimpleNamespace(compare=cmp_pts, sweep=[("decode", [1] * b, [k] * b) for b, k in dec] +
                           [("prefill", q, kv) for q, kv in pre],
                           do_cmp=args.compare or not args.sweep, do_sweep=args.sweep or not args.compare)


class Bench:
    """The engine's attention set-up without the engine: Context, KV pool, page table, backends."""

    def __init__(self, torch, max_bs, max_len, fa_ok):
        from minisgl.attention import create_attention_backend
        from minisgl.core import Context, set_global_ctx
        from minisgl.distributed import set_tp_info
        from minisgl.env import ENV
        from minisgl.kvcache import create_kvcache_pool
        self.torch = torch
        set_tp_info(rank=0, size=1)
        self.ctx = Context(page_size=1)
        set_global_ctx(self.ctx)
        self.cfg = SimpleNamespace(num_qo_heads=HQ, num_kv_heads=HKV, head_dim=HD, num_layers=1)
        self.S = (max_len + 1 + 31) // 32 * 32                     # slots per request row
        dev = torch.device("cuda")
        self.ctx.kv_cache = create_kvcache_pool(model_config=self.cfg, num_pages=max_bs * self.S + 1, page_size=1,
                                                dtype=torch.bfloat16, device=dev)
        self.ctx.kv_cache.k_cache(0).normal_()
        self.ctx.kv_cache.v_cache(0).normal_()
        self.ctx.page_table = torch.zeros((max_bs + 1, self.S), dtype=torch.int32, device=dev)
        self.ctx.page_table[:max_bs] = torch.arange(max_bs * self.S, dtype=torch.int32, device=dev).view(max_bs, self.S)
        ENV.FLASHINFER_USE_TENSOR_CORES.value = None          # "fi" = the engine's own rule (GQA >= 4)
        self.backends = {"fi": create_attention_backend("fi", self.cfg)}
        ENV.FLASHINFER_USE_TENSOR_CORES.value = False
        self.backends["fi tc=off"] = create_attention_backend("fi", self.cfg)
        ENV.FLASHINFER_USE_TENSOR_CORES.value = None
        if fa_ok:
            self.backends["fa"] = create_attention_backend("fa", self.cfg)
        self.ctx.attn_backend = self.backends["fi"]

    def variants(self, phase):
        return [v for v in self.backends if not (phase == "prefill" and v == "fi tc=off")]

    def point(self, variant, phase, q_lens, kv_lens):
        """Run one forward (plan + store + attention) and return the attention-only callable."""
        torch = self.torch
        from minisgl.core import Batch, Req, SamplingParams
        be = self.backends[variant]
        reqs = [Req(input_ids=torch.zeros(kv, dtype=torch.int32), table_idx=i, cached_len=kv - q, output_len=1, uid=i,
                    sampling_params=SamplingParams(), cache_handle=None) for i, (q, kv) in enumerate(zip(q_lens, kv_lens))]
        batch = Batch(reqs=reqs, phase=phase)
        batch.padded_reqs = reqs
        batch.out_loc = torch.cat([self.ctx.page_table[r.table_idx, r.cached_len:r.device_len] for r in reqs])
        be.prepare_metadata(batch)
        n = sum(q_lens)
        q = torch.randn(n, HQ, HD, device="cuda", dtype=torch.bfloat16)
        qkv = torch.randn(n, (HQ + 2 * HKV) * HD, device="cuda", dtype=torch.bfloat16)
        k, v = qkv[:, HQ * HD:(HQ + HKV) * HD], qkv[:, (HQ + HKV) * HD:]
        out = be.forward(q, k, v, 0, batch)
        md, kvp = batch.attn_metadata, self.ctx.kv_cache
        if variant.startswith("fi"):
            kvc = (kvp.k_cache(0).view(-1, 1, HKV, HD), kvp.v_cache(0).view(-1, 1, HKV, HD))
            fn = lambda: md.wrapper.run(q=q, paged_kv_cache=kvc)

            def replan():
                md.initialized = False
                be._initialize_metadata_once(md)
        else:
            from minisgl.attention.fa import _fa_sgl_impl
            fn = lambda: _fa_sgl_impl(q=q, k_cache=kvp.k_cache(0), v_cache=kvp.v_cache(0), page_table=md.page_table,
                                      cache_seqlens=md.cache_seqlens, cu_seqlens_q=md.cu_seqlens_q,
                                      cu_seqlens_k=md.cu_seqlens_k, max_seqlen_q=md.max_seqlen_q,
                                      softmax_scale=be.scale, version=be.version)
            replan = None

        def forward():   # a step's first attention call: the lazy plan (fi) runs inside it
            if replan:
                md.initialized = False
            return be.forward(q, k, v, 0, batch)
        return SimpleNamespace(out=out, q=q, reqs=reqs, fn=fn, replan=replan, forward=forward, md=md)

    def reference(self, p):
        """float32 causal GQA attention read back from the pool (includes the rows forward stored)."""
        torch = self.torch
        outs, off = [], 0
        for r in p.reqs:
            slots = self.ctx.page_table[r.table_idx, :r.device_len].long()
            K = self.ctx.kv_cache.k_cache(0).view(-1, HKV, HD)[slots].float().repeat_interleave(HQ // HKV, 1)
            V = self.ctx.kv_cache.v_cache(0).view(-1, HKV, HD)[slots].float().repeat_interleave(HQ // HKV, 1)
            qq = p.q[off:off + r.extend_len].float()
            s = torch.einsum("qhd,khd->hqk", qq, K) / HD ** 0.5
            pos = torch.arange(r.cached_len, r.device_len, device="cuda")[:, None]
            s = s.masked_fill(torch.arange(r.device_len, device="cuda")[None, :] > pos, float("-inf"))
            outs.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), V))
            off += r.extend_len
        return torch.cat(outs)


def work(phase, q_lens, kv_lens) -> tuple[int, int, str]:
    """FLOPs and minimum bytes of one attention call (common.tables.flops; decode reads an int32 page index per key), and
    the kind of its traffic (O, one row per query, is the only write: decode "read"); every byte is touched once,
    so the bytes are the working set too."""
    f = flops.prefill_flops(q_lens, kv_lens, HQ, HD)
    b = (flops.decode_bytes(kv_lens, HQ, HKV, HD, index_bytes_per_token=4) if phase == "decode"
         else flops.prefill_bytes(q_lens, kv_lens, HQ, HKV, HD))
    out = sum(q_lens) * HQ * HD * 2
    return f, b, ceilings.dram_kind(b - out, out)


def fa_usable():
    try:
        import sgl_kernel.flash_attn  # noqa: F401
        return True, "sgl_kernel.flash_attn imports"
    except Exception as e:
        return False, f"{e.__class__.__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"


def make_bench(torch, p, fa_ok):
    pts = p.compare + p.sweep
    return Bench(torch, max(len(q) for _, q, _ in pts), max(max(kv) for *_, kv in pts), fa_ok)


def ncu_points(b, p) -> list[dict]:
    return [{"call": f"{var} {label(ph, q, kv)}", "phase": ph, "q": q, "kv": kv, "variant": var, "rep": i}
            for ph, q, kv in p.compare for var in b.variants(ph) for i in range(REPEATS)]


def profile_ncu(run, x):
    """The counters of every compare point and variant, REPEATS launches each (this script under ncu)."""
    run.log(f"ncu: every compare point and variant {REPEATS} times (tensor pipe, occupancy, DRAM, stalls)")
    kern = ncu_pass.profile_points(run, __file__, ncu_pass.argv_of(x.args, ("quick",)), KERNELS, ncu_points(x.b, x.p),
                                   x.pk)[0].drop(columns=["q", "kv"])
    run.table("ncu_kernels", kern)
    return kern


def ncu_target(args) -> int:
    """Under ncu: every compare point and variant REPEATS times (re-planned first: the points of one variant share a
    FlashInfer wrapper), a marker kernel before each."""
    import torch
    _msgl.require_minisgl("minisgl.attention")
    p = plan(args)
    b = make_bench(torch, p, fa_usable()[0] and torch.cuda.get_device_properties(0).major >= 9)
    made = {}

    def make(pt):
        if pt["call"] not in made:
            made[pt["call"]] = b.point(pt["variant"], pt["phase"], pt["q"], pt["kv"])
        x = made[pt["call"]]
        return (lambda: (x.replan() if x.replan else None, x.fn())), None
    return ncu_pass.run_points(torch, ncu_points(b, p), make, lambda pt: f"{pt['call']} #{pt['rep']}", warm_up=True)


def check_correctness(run, b):
    """Every variant against a float32 torch reference on small ragged batches, before anything is timed."""
    for phase, q, kv in (("decode", [1, 1, 1], [100, 300, 257]), ("prefill", [64, 200], [64, 200]),
                         ("prefill", [50], [180])):
        for var in b.variants(phase):
            p, _ = _msgl.first_call(lambda: b.point(var, phase, q, kv), f"{var} {phase} (FlashInfer JIT)")
            ref = b.reference(p)
            err = float((p.out.float().view_as(ref) - ref).norm() / ref.norm())
            run.log(f"correctness {var} {phase} q={q} kv={kv}: rel. error {err:.1e} {'✅' if err < 1e-2 else '❌'}")
            if not err < 1e-2:
                raise RuntimeError(f"{var} {phase} attention disagrees with the torch reference ({err:.2e})")
    run.log("All results match. Starting benchmarks.")


def measure(x, var, phase, q, kv, part, rep=0):
    p = x.b.point(var, phase, q, kv)
    with nvtx_range(f"{var} {label(phase, q, kv)}"):
        t = bench(p.fn)
    f, nbytes, mix = work(phase, q, kv)
    r = rates(t.median_ms, bytes=nbytes, flops=f, peaks=x.pk, mix=mix, working_set=nbytes)
    plan_us = bench_cpu(p.replan, rep_ms=50).median_us if p.replan else None
    return p, {"part": part, "variant": var, "phase": phase, "point": label(phase, q, kv), "rep": rep, "batch": len(q),
               "q_len": q[0], "kv_len": kv[0], "time_us": t.median_us, "spread_pct": t.spread_pct, "plan_cpu_us": plan_us,
               **timing.rate_row(r)}


def compare(run, torch, x):
    """Every compare point and variant REPEATS times, interleaved; then one forward per point REPEATS times under
    torch.profiler: its kernels (kernels.csv) and the cudaEventSynchronize of the lazy plan."""
    import pandas as pd
    rows, traced = [], {}
    for rep in range(REPEATS):
        for phase, q, kv in x.p.compare:
            for var in x.b.variants(phase):
                try:
                    p, row = measure(x, var, phase, q, kv, "compare", rep)
                    rows.append(row)
                    traced.setdefault(f"call: {var} {label(phase, q, kv)}", p)
                except Exception as e:
                    run.point_error({"variant": var, "point": label(phase, q, kv), "rep": rep}, e)
                    torch.cuda.empty_cache()
    path = trace.capture_calls(torch, [(name, p.forward) for name, p in traced.items()], run.path("trace.json"),
                               reps=REPEATS)
    ev = trace.read_chrome_trace(path)
    kern = trace.kernels_in_ranges(ev, r"^call: ", empty_rows=False)
    return pd.DataFrame(rows), kern, plan_syncs(ev)


def plan_syncs(ev) -> list[tuple[str, int]]:
    """(traced call range, cudaEventSynchronize calls inside it) of a trace's event table: the plan's sync."""
    return trace.calls_in_ranges(ev, r"^call: ", r"^cudaEventSynchronize$")


def sweep(run, torch, x):
    import pandas as pd
    rows = []
    for i, (phase, q, kv) in enumerate(x.p.sweep, 1):
        run.log(f"[{i}/{len(x.p.sweep)}] {label(phase, q, kv)}")
        for var in x.b.variants(phase):
            try:
                rows.append(measure(x, var, phase, q, kv, "sweep")[1])
            except Exception as e:
                run.point_error({"variant": var, "point": label(phase, q, kv)}, e)
                torch.cuda.empty_cache()
    return pd.DataFrame(rows)


def attention_calls(kern, name: str) -> list[list[str]]:
    """Per traced call of ``name``: its attention kernels (store_kv_cache left out), in launch order."""
    k = kern[(kern["label"] == f"call: {name}") & (kern["gpu_kind"] == "kernel") & ~kern["kernel"].str.contains("store_kv")]
    return [list(g["kernel"]) for _c, g in k.groupby("call", sort=True)]


def judge(run, x):
    c = x.cmp
    pts = lambda var, pt, col: list(c[(c["variant"] == var) & (c["point"] == pt)][col]) if len(c) else []  # noqa: E731
    recs = lambda var, pt: c[(c["variant"] == var) & (c["point"] == pt)].to_dict("records") if len(c) else []  # noqa: E731
    if x.kern is not None and len(pts("fi", D32, "time_us")):
        on, off = attention_calls(x.kern, f"fi {D32}"), attention_calls(x.kern, f"fi tc=off {D32}")
        _msgl.fact(run, H["tc_kernel"], [any("Prefill" in k for k in ks) for ks in on] +
                   [not any("Prefill" in k for k in ks) for ks in off], "kernels.csv",
                   detail=f"tc on: {', '.join(dict.fromkeys(k for ks in on for k in ks))}; tc off: "
                          f"{', '.join(dict.fromkeys(k for ks in off for k in ks))}")
        _msgl.fact(run, H["tc_diff"], [a != b for a, b in zip(on, off)], "kernels.csv, compare.csv",
                   detail=f"{int(pts('fi', D32, 'bytes')[0]):,} B both (common.tables.flops); {pts('fi', D32, 'time_us')[0]:.1f} us"
                          f" (on) vs {pts('fi tc=off', D32, 'time_us')[0]:.1f} us (off), rep 0")
    read = timing.dram_ceiling_text(x.pk, "read")
    run.judge(H["decode_bw"], pts("fi", D32, "eff_pct"), evidence="compare.csv",
              premise=_msgl.eff_premise(recs("fi", D32) + recs("fi tc=off", D32), read),
              detail=f"median {timing.eff_text(timing.median_row(recs('fi', D32)), x.pk)}; % of {read}; tc off: "
                     f"{', '.join(f'{v:.0f}%' for v in pts('fi tc=off', D32, 'eff_pct'))}")
    pre = pts("fi", P2048, "pct_bf16_ceiling")
    run.judge(H["prefill"], pre, evidence="compare.csv", premise=_msgl.within_ceiling(
              pre, ceilings.ceiling_text(x.pk, "bf16_tflops", short=True)),
              detail=f"{', '.join(f'{v:.0f}' for v in pts('fi', P2048, 'tflop_s'))} TFLOP/s of "
                     f"{x.pk['bf16_tflops']:.0f} ({x.pk.get('source')})")
    if x.syncs:
        fi_calls = [n for name, n in x.syncs if name.startswith("call: fi")]
        one = pts("fi", "decode bs=1 kv=4096", "plan_cpu_us")
        _msgl.fact(run, H["plan_sync"], [n == 1 for n in fi_calls], "trace.json",
                   detail=f"per traced call: {sorted(set(fi_calls))}" + (f"; plan() {one[0]:.0f} us CPU vs "
                          f"{pts('fi', 'decode bs=1 kv=4096', 'time_us')[0]:.1f} us kernel at bs 1" if one else ""))
    if x.ncu is None:
        return
    main_kernel = x.ncu[~x.ncu["kernel"].str.contains("Merge")]
    dec_rows = main_kernel[main_kernel["call"].isin([f"fi {D32}", f"fi tc=off {D32}"])].to_dict("records")
    _msgl.fact(run, H["ncu_decode"], [bounds.bound(r).startswith("memory") and bounds.top_stall(r) == "long_scoreboard"
                                   for r in dec_rows], "ncu_kernels.csv",
               detail="; ".join(dict.fromkeys(f"{r['variant']}: {bounds.bound_why(r)} ({kernels.COLUMNS['dram_tb_s'].show(r)})"
                                              for r in dec_rows)))
    pre_rows = main_kernel[main_kernel["call"] == f"fi {P2048}"]
    run.judge(H["ncu_prefill"], list(pre_rows["tensor_pct"]), evidence="ncu_kernels.csv",
              detail="; ".join(dict.fromkeys(bounds.bound_why(r) for r in pre_rows.to_dict("records"))))


def findings(run, x):
    """The sentence the pages state about this run (Run.finding), from the figures its verdicts read: decode at batch 32
    x KV 4096 with tensor cores on (FlashInfer's prefill kernel) against off (its decode kernel), faster or slower in
    kernel time (the median repetition), and what bounds each kernel in ncu (common.judge.bounds.bound)."""
    c = x.cmp
    rows = {v: c[(c["variant"] == v) & (c["point"] == D32)].to_dict("records") if len(c) else [] for v in ("fi", "fi tc=off")}
    if not all(rows.values()):
        return
    on, off = (timing.median_row(rows[v], "time_us")["time_us"] for v in ("fi", "fi tc=off"))
    text = (f"At decode batch 32 x KV 4096 the tensor-core path takes {story.fmt(on)} us of kernel time against "
            f"{story.fmt(off)} us with tensor cores off ({'faster' if on < off else 'slower'})")
    if x.ncu is not None:
        k = x.ncu[~x.ncu["kernel"].str.contains("Merge") & (x.ncu["rep"] == 0)]
        why = [f"{r['kernel']} {bounds.bound_why(r).split(';')[0]}" for v in ("fi", "fi tc=off")
               for r in k[k["call"] == f"{v} {D32}"].to_dict("records")[:1]]
        text += "; ncu: " + "; ".join(why) if why else ""
    run.finding(text + ".")


def tell(x) -> str:
    items = [("backends: fi (FlashInfer fa2, page size 1), fi tc=off" + (", fa (sgl_kernel)" if x.fa_ok else "")
              + f"; not here: {'' if x.fa_ok else 'fa (' + x.fa_why + '), '}trtllm (sm100)", [])]
    if len(x.cmp):
        for (var, pt, phase), g in x.cmp.groupby(["variant", "point", "phase"], sort=False):
            r = timing.median_row(g.to_dict("records"), "time_us")       # the median repetition, with its own rates
            name = f"{var} {pt}"
            ks = x.kern[(x.kern["label"] == f"call: {name}") & (x.kern["call"] == 0)] if x.kern is not None else []
            plan_us = g["plan_cpu_us"].median()
            head = (f"{name}: attention {r['time_us']:.1f} us" + (f", plan {plan_us:.0f} us CPU" if plan_us == plan_us
                                                                    and plan_us else "")
                    + (f" -> {timing.eff_text(r, x.pk)}" if phase == "decode"
                       else f" -> {r['tflop_s']:.0f} TFLOP/s ({r['pct_bf16_ceiling']:.0f}% of the bf16 ceiling)")
                    + f" (median of {REPEATS})")
            items.append((head, [(f"#{int(k['order'])} {k['gpu_kind']} {k['kernel']} grid {story.fmt(k['grid'])} "
                                  f"{k['dur_us']:.1f} us", []) for k in (ks.to_dict("records") if len(ks) else [])]))
    if x.ncu is not None:
        items.append(("hardware (ncu)", [kernels.node(r, head=f"{r['call']}: {r['kernel']} (ncu) [{bounds.bound_why(r)}]")
                                         for r in x.ncu[x.ncu["rep"] == 0].to_dict("records")][:8]))
    if len(x.sw):
        items.append(("sweep", [(f"{r['variant']} {r['point']}: {r['time_us']:.1f} us, " +
                                 (timing.eff_text(r, x.pk) if r["phase"] == "decode" else f"{r['tflop_s']:.0f} TFLOP/s"),
                                 []) for r in x.sw.to_dict("records")][:24]))
    return story.tree(f"ATTENTION THROUGH mini-SGLang — {x.pk['gpu']}; effective bandwidth = formula bytes / time, a % of "
                      f"{x.ceiling} only at working sets >= {ceilings.STREAM_FACTOR}x L2 ({x.pk.get('l2_mb')} MB); bf16 "
                      f"{x.pk['bf16_tflops']:.0f} TFLOP/s", items)


@dataclass
class Record:
    """What the analysis of one run reads: the ceilings, the backends offered, and the tables the GPU phase measured
    (the same tables a --reanalyse reads back from a recording)."""
    args: argparse.Namespace
    p: SimpleNamespace
    pk: dict = field(default_factory=dict)
    fa_ok: bool = False                 # backends.csv, row fa: offered
    fa_why: str = ""                    # backends.csv, row fa: note
    cmp: Any = None                     # compare.csv (empty with --sweep)
    kern: Any = None                    # kernels.csv (None with --sweep)
    syncs: list = field(default_factory=list)   # plan_syncs.csv: (traced call, cudaEventSynchronize calls)
    ncu: Any = None                     # ncu_kernels.csv (None without the ncu pass)
    sw: Any = None                      # sweep.csv (empty with --compare)
    b: Any = None                       # the Bench (GPU only)

    @property
    def ceiling(self) -> str:
        return timing.dram_ceiling_text(self.pk, "read", short=True)


def analyse(run, x: Record) -> None:
    """Figures, verdicts, headline and story from the measured tables (a GPU run and --reanalyse alike)."""
    import pandas as pd
    allr = pd.concat([x.cmp, x.sw], ignore_index=True)
    if len(allr):
        run.figure("roofline", plots.roofline([{"label": f"{r['variant']} {r['point']}", **r} for r in
                                               allr.drop_duplicates(["variant", "point"]).to_dict("records")], x.pk,
                                              title="attention (Llama-3.1-8B heads, bf16)"))
    if len(x.sw) and (x.sw["phase"] == "decode").any():
        d = x.sw[x.sw["phase"] == "decode"].assign(series=lambda s: s["variant"] + " bs=" + s["batch"].astype(str))
        run.figure("decode_sweep", plots.effective(d, x.pk, hue="series", mix="read",
                                                   title=f"decode attention — {x.pk['gpu']}"))
    # ---- verdicts
    judge(run, x)
    findings(run, x)
    if len(x.cmp):
        med = x.cmp.groupby(["variant", "point"])[["eff_tb_s", "eff_pct", "plan_cpu_us", "tflop_s",
                                                   "pct_bf16_ceiling"]].median()
        if ("fi", D32) in med.index:
            run.headline(decode_b32_kv4096_eff_tb_s=med.loc[("fi", D32), "eff_tb_s"],
                         decode_b32_kv4096_eff_pct_of_read_ceiling=med.loc[("fi", D32), "eff_pct"])
        if ("fi", P2048) in med.index:
            run.headline(prefill_2048_tflop_s=med.loc[("fi", P2048), "tflop_s"],
                         prefill_2048_pct_of_bf16_ceiling=med.loc[("fi", P2048), "pct_bf16_ceiling"])
    # ---- the story
    run.story(tell(x), echo=True)


def recorded_syncs(rec) -> list[tuple[str, int]]:
    """The plan syncs of a recording: its plan_syncs.csv, or (a recording made before that table was written)
    counted again in its trace.json the way compare() counts them; none when it measured no compare points."""
    t = rec.tables["plan_syncs"]
    if t is not None:
        return [(r["range"], int(r["syncs"])) for r in t.to_dict("records")]
    if rec.tables["compare"] is None or not len(rec.tables["compare"]):
        return []
    tr = next((rec.src / f for f in ("trace.json", "trace.json.gz") if (rec.src / f).is_file()), None)
    if tr is None:
        raise SetupError(f"--reanalyse {rec.src}: no plan_syncs.csv and no trace.json to count the plan's "
                         "cudaEventSynchronize calls in (fi-plan-sync needs one of them)")
    return plan_syncs(trace.read_chrome_trace(tr))


def main_reanalyse(args) -> int:
    import pandas as pd
    rec = recording.open(args.reanalyse, __file__, tables=("backends",),
                         optional=("compare", "kernels", "plan_syncs", "ncu_kernels", "sweep"), copy=("trace.json",))
    a, t = rec.args_like(args), rec.tables
    fa = t["backends"].set_index("backend").loc["fa"]
    x = Record(args=a, p=plan(a), pk=rec.peaks, fa_ok=bool(fa["offered"]), fa_why=str(fa["note"]),
               cmp=t["compare"] if t["compare"] is not None else pd.DataFrame(), kern=t["kernels"],
               syncs=recorded_syncs(rec), ncu=_msgl.ncu_read_back(t["ncu_kernels"]),
               sw=t["sweep"] if t["sweep"] is not None else pd.DataFrame())
    with recording.run(__file__, args, rec) as run:
        analyse(run, x)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    _, torch = _msgl.require_gpu_stack("minisgl.attention")
    fi = require_module("flashinfer", "pip install flashinfer-python==0.6.15.post1")
    if args.ncu_target:
        return ncu_target(args)
    import pandas as pd
    x = Record(args=args, p=plan(args), cmp=pd.DataFrame(), sw=pd.DataFrame())
    with Run(__file__, args, out=args.out) as run:
        # ---- check: ceilings, backends offered here, correctness before timing
        x.pk = ceilings.peaks()
        props = torch.cuda.get_device_properties(0)
        x.fa_ok, x.fa_why = fa_usable()
        x.fa_ok = x.fa_ok and props.major >= 9
        run.table("backends", [{"backend": "fi", "offered": True, "measured": True, "note": f"flashinfer {fi.__version__}"},
                               {"backend": "fa", "offered": x.fa_ok, "measured": x.fa_ok, "note": x.fa_why},
                               {"backend": "trtllm", "offered": props.major == 10, "measured": False,
                                "note": "sm100 only; needs page size 16/32/64 (not exercised here)"}])
        run.log(f"{x.pk['gpu']}: {ceilings.kinds_text(x.pk)}; L2 {x.pk.get('l2_mb')} MB; bf16 {x.pk['bf16_tflops']:.0f} "
                "TFLOP/s; backends: fi, fi tc=off"
                + (", fa" if x.fa_ok else ""))
        x.b = make_bench(torch, x.p, x.fa_ok)
        check_correctness(run, x.b)
        # ---- measure
        if x.p.do_cmp:
            x.cmp, x.kern, x.syncs = compare(run, torch, x)
            run.table("compare", x.cmp)
            run.table("kernels", x.kern)
            run.table("plan_syncs", pd.DataFrame(x.syncs, columns=["range", "syncs"]))
            if not args.quick or args.ncu:
                x.ncu = run.optional("ncu pass", profile_ncu, run, x)
        if x.p.do_sweep:
            x.sw = sweep(run, torch, x)
            run.table("sweep", x.sw)
        # ---- analyse: the roofline and the decode sweep, verdicts, headline, story
        analyse(run, x)
    return 0


if __name__ == "__main__":
    run_main(main)
