#!/usr/bin/env python3
"""05 · Nsight Compute on SGLang's attention kernels, inside a serving process.

What it measures
    The SGLang server itself runs under Nsight Compute (`ncu --target-processes all
    --profile-from-start off --graph-profiling node --clock-control none --kernel-name
    regex:<attention kernels>`), with SGLang's default CUDA graphs for prefill and decode: with
    `--graph-profiling node` ncu profiles every kernel node of a graph replay like a launch (seen
    on an H200: graphs on, /start_profile CUDA_PROFILER windows, 148 kernels profiled). No server
    warm-up and a small KV pool (ncu saves and restores the memory a kernel may write for every
    replay pass). The profiled windows are opened by SGLang itself: /start_profile
    {"activities": ["CUDA_PROFILER"], "num_steps": N} brackets exactly the chosen forward steps with
    cudaProfilerStart/Stop:
      prefill: 3 prompts of --prefill-len tokens one after the other, nothing cached (3 EXTEND steps);
      decode:  --decode-bs requests of --decode-kv tokens decoding together (up to 5 DECODE steps; the
               first can still hold fewer requests: its launches are named and left out of the verdicts).
    By default the model keeps its real layer shapes but only --layers 2 layers
    (--json-model-override-args): attention kernels see exactly the shapes of the full model,
    and each step launches 2 per kernel instead of 32 (--layers 0 profiles the full model).
    Caches as the server left them (--cache-control none: the counters of the kernels as served).
    Per launch (common.tables.kernels.summarize, the counter columns of common.tables.kernels): ncu's kernel time, DRAM bytes
    -> TB/s and % of the measured DRAM ceiling of the same traffic (read for attention), L2 hit rate, SM /
    tensor-pipe %, occupancy with registers, shared memory, warps and CTAs per SM, the top warp stalls with
    what each means (common.judge.bounds.STALL_MEANING); prefill attention FLOPs (common.tables.flops) -> TFLOP/s and
    % of the measured bf16 ceiling. Stage comes from the kernel name (FlashInfer ragged prefill vs
    paged decode; Triton extend vs split-KV decode). Every launch of the measured shape is one repetition of a
    verdict.

What the plan expected (hypotheses in H below, A100 figures as the sources)
    * Decode attention (batch 32, KV 4096) is memory-bound: DRAM ~82% of peak, tensor pipe ~15%,
      long-scoreboard the top stall.
    * Prefill attention sits near the ridge point with much higher tensor-pipe activity; occupancy
      ~47% (A100), limited by shared memory: judged on the achieved occupancy; the limiter is reported.

Run
    python sglang/scripts/05_ncu_attention.py --quick                 # flashinfer, ~2 min (or 05_ncu_attention.sh)
    python sglang/scripts/05_ncu_attention.py                         # flashinfer + triton, longer shapes
    python sglang/scripts/05_ncu_attention.py --quick --set full      # every ncu section (slower)
    NCU=/usr/local/cuda/bin/ncu python sglang/scripts/05_ncu_attention.py --quick --layers 0
    python sglang/scripts/05_ncu_attention.py --reanalyse DIR --out OUT   # no GPU, no ncu, no sglang: the analysis again
Needs ncu on PATH (or NCU=/path/to/ncu) and permission to read GPU counters (root or
NVreg_RestrictProfilingToAdminUsers=0).
Writes sglang/results/05_ncu_attention/: attention_kernels.csv, stalls.csv, ncu_<backend>/ (raw CSV,
ncu log), server_<backend>.log, story.txt, summary.json.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sglang as sg  # noqa: E402
from common.base import story  # noqa: E402
from common.base.checks import require_modules, require_tool, run_main, SetupError  # noqa: E402
from common.capture import ceilings, ncu  # noqa: E402
from common.tables import flops, kernels  # noqa: E402
from common.judge import bounds  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.run import cli, recording  # noqa: E402
from common.run.results import Run  # noqa: E402

# decode steps per request: enough that the profiling window, opened over HTTP once the batch is
# decoding, still finds steps to profile (DECODE_STEPS of them are profiled; the rest only cost ~ms each)
DECODE_NEW = 160
PREFILL_STEPS, DECODE_STEPS = 3, 5     # decode: its first step may hold fewer requests (mark_other_steps)
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
PLAN = "PLAN.md Session 1 and sglang/reports/plan.md, experiment 05"
H = declare(f"""
    dram = decode-attention-memory-bound: decode attention (batch 32, KV 4096) is memory-bound: DRAM above ~70% of
            peak
        judged on: DRAM bytes ncu counted over its kernel time, as % of the measured DRAM read ceiling, of the main
            decode attention kernel (per profiled launch; the KV cache it reads is many times the L2)
        confirmed: [70, 100]%
        source: {PLAN}: 'DRAM above ~70% of peak (A100: 82%)'
    tensor = decode-attention-tensor-low: decode attention leaves the tensor pipe mostly idle
        judged on: tensor-pipe % of the main decode attention kernel (per profiled launch)
        confirmed: [0, 30]%
        source: {PLAN}: 'tensor pipe low (A100: 15%)', judged up to 30%
    stall = decode-long-scoreboard: long-scoreboard (waiting for a global memory load) is the top warp stall of decode
            attention
        judged on: long_scoreboard share / the largest other stall's share (per profiled launch)
        confirmed: >= 1
        source: {PLAN}: 'long-scoreboard the top stall' (A100)
    prefill_tc = prefill-tensor-higher: prefill attention has much higher tensor-pipe activity than decode
        judged on: prefill tensor-pipe % / the decode kernel's median (per profiled prefill launch)
        confirmed: >= 2
        source: {PLAN}: 'much higher tensor-pipe activity' (A100: 35% vs 15%), judged as >= 2x
    occ = prefill-occupancy: prefill attention keeps about half of the SM's warps active (A100: 47%)
        judged on: achieved occupancy % of the prefill attention kernel (per profiled launch)
        confirmed: [30, 65]%
        source: {PLAN}: 'occupancy ~47%, limited by shared memory' (A100); the limiter is reported beside it
""")


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="flashinfer only, shorter prompts (~2 min)")
    p.add_argument("--backends", type=cli.choices_list(*KERNELS), default=None,
                   help="comma list (default: flashinfer; full run: flashinfer,triton)")
    p.add_argument("--layers", type=cli.non_negative_int, default=2, help="layers kept (shapes unchanged); 0 = the full model")
    p.add_argument("--prefill-len", type=cli.positive_int, default=None, help="prefill prompt tokens (quick 4096, full 8192)")
    p.add_argument("--decode-bs", type=cli.positive_int, default=32, help="decode batch size (default 32)")
    p.add_argument("--decode-kv", type=cli.positive_int, default=4096, help="decode context tokens (default 4096: the "
                   "batch 32 x 4k KV decode every system of the workbook measures, so the three sit side by side)")
    p.add_argument("--set", dest="section_set", default=None, help="ncu section set (e.g. full); default: summary metrics")
    p.add_argument("--launch-count", type=cli.positive_int, default=200, help="safety cap on profiled launches (default 200)")
    sg.add_model_args(p, backend_default=None)
    recording.add_flag(p)
    return p.parse_args(argv)


def stage_of(kernel: str, backend: str) -> str:
    return KERNELS.get(backend, ("", {}))[1].get(kernel, "unknown")


def server_flags(args, backend, base) -> list[str]:
    """The launch flags of ``backend``'s server under ncu (``base``: sg.model_and_flags)."""
    pool = args.prefill_len + args.decode_bs * (args.decode_kv + DECODE_NEW + 16) + 4096
    return base + sg.flags(attention_backend=backend, skip_server_warmup=True, max_total_tokens=pool, log_level="info",
                           decode_log_interval=1,
                           json_model_override_args={"num_hidden_layers": args.layers} if args.layers else None)


def profile_backend(args, backend, model_dir, base, sh, pk, run):
    """One server under ncu: a prefill window and a decode window; the per-launch summary."""
    Lp, B, Lkv = args.prefill_len, args.decode_bs, args.decode_kv
    out_dir = run.dir / f"ncu_{backend}"
    out_dir.mkdir(parents=True, exist_ok=True)
    log_file = out_dir / "ncu_log.txt"
    wrapper = ncu.build_cmd([], log_file=log_file, kernel=KERNELS[backend][0], launch_count=args.launch_count,
                            metrics=None if args.section_set else kernels.SUMMARY_METRICS, section_set=args.section_set,
                            cache_control="none", extra=["--profile-from-start", "off", "--graph-profiling", "node"])
    fl = server_flags(args, backend, base)
    prof = run.dir / "profiles"
    with sg.Server(model_dir, fl, port=args.port, log_path=run.path(f"server_{backend}.log"), echo=run.log,
                   wrapper=wrapper, start_timeout=max(args.start_timeout, 1800), env={"SGLANG_LOG_MS": "1"},
                   name=f"server[{backend} under ncu]") as srv:
        out = srv.generate(input_ids=sg.random_ids(16, 1), sampling_params={**sg.GREEDY, "max_new_tokens": 2})
        if out["meta_info"]["completion_tokens"] != 2:     # not profiled: the window is closed
            raise RuntimeError("sanity request came back wrong")
        run.log(f"sanity: 2 tokens back ✅  All results match. Profiling prefill, then decode ({sg.graphs_text(fl)}).")
        srv.flush_cache()
        srv.start_profile(prof, activities=["CUDA_PROFILER"], num_steps=PREFILL_STEPS)
        for i in range(PREFILL_STEPS):
            srv.generate(input_ids=sg.random_ids(Lp, 2 + i), sampling_params={**sg.GREEDY, "max_new_tokens": 1})
        srv.stop_profile()
        reqs = [{"input_ids": sg.random_ids(Lkv, 100 + i), "sampling_params": {**sg.GREEDY, "max_new_tokens": DECODE_NEW}}
                for i in range(B)]

        def window():
            srv.start_profile(prof, activities=["CUDA_PROFILER"], num_steps=DECODE_STEPS)
            time.sleep(5.0)          # the window closes itself after DECODE_STEPS steps; 1 s held only 2 under ncu
            srv.stop_profile()
        srv.while_decoding(reqs, window, running=B, timeout=900)
    # the server has exited; ncu printed its CSV into its log file (common.capture.ncu.read_log)
    df = ncu.read_log(log_file, out_dir / "ncu.csv", extra_log=run.dir / f"server_{backend}.log",
                      what=f"{backend} attention kernels")
    s = kernels.joined(kernels.summarize(df, peaks=pk), pk)
    if s.attrs.get("missing_metrics"):
        run.note(f"{backend}: ncu collected no {', '.join(s.attrs['missing_metrics'])}")
    s.insert(0, "backend", backend)
    s.insert(1, "stage", [stage_of(k, backend) for k in s["kernel"]])
    fl_one = flops.prefill_flops([Lp], [Lp], sh["hq"], sh["d"])          # one layer's causal prefill attention
    s["tflop_s"] = [fl_one / (t * 1e-6) / 1e12 if st == "prefill" and t else None
                    for st, t in zip(s["stage"], s["ncu_time_us"])]
    s["pct_bf16_ceiling"] = [100 * x / pk["bf16_tflops"] if x else None for x in s["tflop_s"]]
    s["shape"] = [f"prefill {Lp} tok" if st == "prefill" else f"decode bs {B} kv {Lkv}" for st in s["stage"]]
    s["graphs"] = sg.graphs_text(fl)
    return s


def stall_lead(row) -> float:
    """long_scoreboard's stall share over the largest other reason's (>= 1: it is the top stall)."""
    vals = {c[6:-4]: row[c] for c in row.index if c.startswith("stall_") and c.endswith("_pct") and row[c] == row[c]}
    other = max((v for r, v in vals.items() if r != "long_scoreboard"), default=0.0)
    ls = vals.get("long_scoreboard", 0.0)
    return ls / max(other, 1e-9) if ls or other else float("nan")


def kv_kernel(s):
    """The rows of each backend's decode kernel that reads the KV cache (its decode kernel with the most time)."""
    dec = s[(s["stage"] == "decode") & s["kernel"].str.contains("Paged|_fwd_grouped|Decode")]
    tot = dec.groupby(["backend", "kernel"])["ncu_time_us"].transform("sum")
    return dec[tot == tot.groupby(dec["backend"]).transform("max")]


def mark_other_steps(s):
    """Relabel the decode launches of a step other than the batch's (common.tables.kernels.other_step_launches, on the
    KV-reading kernel's DRAM reads): those launches, and every decode kernel of the same launch index, get shape
    "decode, another step (N MB ...)" and are left out of the batch's verdicts. Returns s (changed in place)."""
    if "dram_read_mb" not in s.columns or not len(s):
        return s
    for b, g in kv_kernel(s).groupby("backend"):
        big = g["dram_read_mb"].max()
        reads = dict(zip(g["launch"], g["dram_read_mb"]))
        for launch in sorted(kernels.other_step_launches(reads)):
            rows = (s["backend"] == b) & (s["stage"] == "decode") & (s["launch"] == launch)
            s.loc[rows, "shape"] = f"decode, another step ({story.fmt(reads[launch])} MB of KV read, the batch's " \
                                   f"{story.fmt(big)} MB)"
    return s


def verdicts(run, s, args, pk) -> None:
    """On FlashInfer where present (the default backend here): every profiled launch of the batch's decode step
    (bs x kv, mark_other_steps) is a repetition."""
    main_b = "flashinfer" if "flashinfer" in set(s["backend"]) else s["backend"].iloc[0]
    one = s[s["backend"] == main_b]
    dec = kv_kernel(one)
    batch = f"decode bs {args.decode_bs} kv {args.decode_kv}"
    other = dec[dec["shape"] != batch]
    dec = dec[dec["shape"] == batch]
    if len(other):
        run.note(f"{main_b}: {len(other)} of {len(other) + len(dec)} decode launches belong to another step than the "
                 f"batch's ({other['shape'].iloc[0]}); the decode verdicts use the {len(dec)} of the batch")
    pre = one[one["stage"] == "prefill"]
    if len(dec):
        d = dec.iloc[0]
        run.headline(decode_attention_dram_pct=float(dec["dram_pct"].median()),
                     decode_attention_tb_s=float(dec["dram_tb_s"].median()))
        ev = f"attention_kernels.csv ({d['kernel']}, batch {args.decode_bs}, KV {args.decode_kv})"
        run.judge(H["dram"], list(dec["dram_pct"]), evidence=ev, detail=f"DRAM {story.fmt(dec['dram_tb_s'].median())} TB/s "
                  f"of {ceilings.ceiling_text(pk, 'dram_read_tb_s', short=True)}; L2 hit "
                  f"{story.fmt(dec['l2_hit_pct'].median())}%; {bounds.bound_why(d.to_dict())}")
        run.judge(H["tensor"], list(dec["tensor_pct"]), evidence=ev)
        run.judge(H["stall"], [stall_lead(r) for _, r in dec.iterrows()], evidence="stalls.csv",
                  detail=f"top stalls: {d['top_stalls'] or '-'}")
    if len(pre) and len(dec):
        p = pre.sort_values("ncu_time_us", ascending=False).iloc[0]
        dt = float(dec["tensor_pct"].median())
        run.headline(prefill_attention_tensor_pct=float(pre["tensor_pct"].median()),
                     prefill_attention_tflop_s=float(pre["tflop_s"].median()))
        run.judge(H["prefill_tc"], [x / max(dt, 1e-9) for x in pre["tensor_pct"]], evidence="attention_kernels.csv",
                  detail=f"{p['kernel']}: {story.fmt(p['tflop_s'])} TFLOP/s = {story.fmt(p['pct_bf16_ceiling'])}% of the "
                  f"measured bf16 ceiling; decode tensor {dt:.0f}%")
    if len(pre):
        p = pre.sort_values("ncu_time_us", ascending=False).iloc[0]
        run.judge(H["occ"], list(pre["occupancy_pct"]), evidence="attention_kernels.csv",
                  detail=f"theoretical {story.fmt(p['theoretical_occupancy_pct'])}%, limiter {p['limiter']}, "
                  f"{story.fmt(p['warps_per_cta'])} warps/CTA, {story.fmt(p['regs_per_thread'])} regs/thread, "
                  f"{story.fmt(p['smem_kb_per_cta'])} KB smem/CTA" + ("; one CTA per SM by design" if kernels.flag(p, "one_cta_per_sm")
                                                                      else ""))


def tell(s, pk, layers) -> str:
    """Each backend and stage: its kernels on the counters, and what their top stall means."""
    items = []
    for (b, st), g in s.groupby(["backend", "stage"], sort=False):
        rows = g.to_dict("records")
        tops = sorted({bounds.top_stall(r) for r in rows} - {""})
        items.append((f"{b} — {st} ({rows[0]['graphs']})",
                      [kernels.node(r, head=f"{r['kernel']} launch {r['launch']} ({r['shape']})") for r in rows[:6]]
                      + [(f"top stall {t}: {bounds.STALL_MEANING.get(t, '?')}", []) for t in tops]))
    return story.tree(f"ATTENTION ON THE COUNTERS — {pk['gpu']} ({ceilings.ceiling_text(pk, 'dram_read_tb_s', short=True)}, "
                      f"bf16 {story.fmt(pk['bf16_tflops'])} TFLOP/s); ncu with caches as served; layers kept: "
                      f"{layers or 'all'}", items)


@dataclass
class Record:
    """What the analysis of one run reads: its arguments, the ceilings, and every profiled attention launch with its
    counters, stalls and joined columns (attention_kernels.csv + stalls.csv, the same a --reanalyse reads back)."""
    args: Any
    pk: dict
    s: Any = None


def write_tables(run, s) -> None:
    """attention_kernels.csv and stalls.csv (after mark_other_steps, so that their shape column names the launches
    of another step as the story does)."""
    cols = ["backend", "stage", "shape", "kernel", "launch", "tflop_s", "pct_bf16_ceiling", *kernels.names("counters")]
    sg.table(run, "attention_kernels", s[[c for c in cols if c in s.columns]])
    sg.table(run, "stalls", s[["backend", "stage", "kernel", "launch"] + [c for c in s.columns if c.startswith("stall_")]])


def analyse(run, x: Record) -> None:
    """Tables, verdicts, headline and story from the profiled launches (a GPU run and --reanalyse alike)."""
    mark_other_steps(x.s)
    write_tables(run, x.s)
    verdicts(run, x.s, x.args, x.pk)
    run.story(tell(x.s, x.pk, x.args.layers), echo=True)


def main_reanalyse(args) -> int:
    """--reanalyse DIR: attention_kernels.csv with stalls.csv's stall columns, the joined columns
    (common.tables.kernels.joined) and each backend's CUDA-graph text (from its launch flags) again; no server, no ncu."""
    rec = recording.open(args.reanalyse, __file__, tables=("attention_kernels", "stalls"))
    a = rec.args_like(args)
    key = ["backend", "stage", "kernel", "launch"]
    st = rec.tables["stalls"]
    s = rec.tables["attention_kernels"].merge(st[key + [c for c in st.columns if c.startswith("stall_")
                                                        and c != "stall_note"]], on=key, how="left")
    s = kernels.joined(s, rec.peaks)
    _, base = sg.model_and_flags(a, write=False)
    s["graphs"] = [sg.graphs_text(server_flags(a, b, base)) for b in s["backend"]]
    with recording.run(__file__, args, rec) as run:
        analyse(run, Record(a, rec.peaks, s))
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    sg.require_sglang()
    cli.check_gpus_for(1)
    require_tool(os.environ.get("NCU", "ncu"), "Nsight Compute ships with the CUDA toolkit (e.g. /usr/local/cuda/bin); "
                 "add it to PATH or set NCU=/path/to/ncu.")
    pd, = require_modules(("pandas", None))
    args.prefill_len = args.prefill_len or (4096 if args.quick else 8192)
    args.decode_kv = args.decode_kv
    backends = args.backends or (["flashinfer"] if args.quick else ["flashinfer", "triton"])
    model_dir, base = sg.model_and_flags(args)
    sh = sg.model_shape(model_dir)
    with Run(__file__, args, out=args.out) as run:
        x = Record(args, ceilings.peaks())
        frames = []
        for b in backends:
            try:
                frames.append(profile_backend(args, b, model_dir, base, sh, x.pk, run))
                run.log(f"{b}: {len(frames[-1])} attention launches profiled")
            except SetupError:
                raise
            except Exception as e:  # noqa: BLE001 - one backend fails, the other goes on
                run.point_error({"backend": b}, e)
        if not frames:
            raise RuntimeError("no backend was profiled; see point_errors")
        x.s = pd.concat(frames, ignore_index=True)
        analyse(run, x)
    return 0


if __name__ == "__main__":
    run_main(main)
