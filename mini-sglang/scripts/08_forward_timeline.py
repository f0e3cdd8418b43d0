#!/usr/bin/env python3
"""08 · One forward of mini-SGLang, joined: steps -> layers -> kernels -> FLOPs/bytes -> hardware counters, eager vs
CUDA graphs, overlap scheduling on and off.

What it measures
    mini-SGLang's offline LLM (llm/llm.py:28-37: the Scheduler itself, in offline mode) on a local Llama-3.1-8B
    config (common.capture.models) with dummy weights (use_dummy_weight, engine/config.py:28), attention_backend "fi"
    (FlashInfer; the lent GPU node's sgl_kernel has no FA3; --backend fa where sgl_kernel.flash_attn imports), in one
    process, the same generate (--batch prompts of --prompt-len tokens, then decode steps, ignore_eos) in up to four
    variants, switched in place between generates:
      eager             no CUDA graphs: graph_runner.max_graph_bs = 0, the value cuda_graph_max_bs=0 leaves
                        (engine/graph.py:64-65, :98); can_use_cuda_graph (engine/graph.py:149-150) is then False for
                        every batch, so Engine.forward_batch runs model.forward() (engine/engine.py:191-197) and
                        pad_batch (engine/graph.py:160-166) pads nothing: the path of an engine started with
                        cuda_graph_max_bs=0
      graph             decode replayed from the CUDA graphs captured at start (engine/graph.py:105-147,
                        engine/engine.py:194-195), captured for the batch sizes this run decodes (cuda_graph_bs,
                        engine/config.py:23; the engine's default captures 1, 2, 4, 8 ... 256: engine/graph.py:49-67)
      *-no-overlap      overlap scheduling off: ENV.DISABLE_OVERLAP_SCHEDULING (env.py:69, the variable
                        MINISGL_DISABLE_OVERLAP_SCHEDULING) is read by Scheduler.run_forever at every generate
                        (scheduler/scheduler.py:121-131, llm/llm.py:90): normal_loop (scheduler/scheduler.py:108-118)
                        instead of overlap_loop (scheduler/scheduler.py:83-106)
    (file:line: minisgl/ at commit 20fcd7f)
    Every engine step runs inside a range step[prefill|decode bs= pad= tokens=] with CUDA events on the engine
    stream (a wrapper around Engine.forward_batch): its GPU time and the GPU idle before it. mini-SGLang's own
    NVTX ranges (Layer_i, MHA, MLP: utils/torch_utils.py:23-37) are routed into torch.profiler (_msgl.mirror_nvtx).
    1. timed: each variant's generate 3 times, the variants interleaved: decode step GPU time, the GPU gap between
       decode steps, wall time per step; and 3 prompts sharing a 1024-token prefix with an earlier one (the radix
       cache in the engine: cached_len, prefill time).
    2. traced: each variant once under torch.profiler (common.tables.trace.capture_calls) -> the kernel table of every step
       (common.tables.trace.step_kernels: kernels joined to their step by correlation id, CUDA-graph replays included;
       layers from the repeating unit of the kernel names, common.tables.trace.assign_layers, checked against
       mini-SGLang's Layer_i ranges in eager steps) -> roles (QKV / O / gate-up / down GEMMs, norms, RoPE, KV store,
       attention, activation; embedding, final norm, logits, sampling) -> FLOPs and bytes of each role
       (common.tables.timeline.add_work with common.tables.flops.layer_work) -> TFLOP/s, TB/s and % of the measured ceilings. The
       traced generate's decode steps against the timed ones give the profiler's own cost (headline observer_pct_*).
    3. counters (--ncu, and the full run): this script again with the model cut to 2 layers of unchanged shapes
       (config num_hidden_layers=2), eager, under Nsight Compute (common.capture.ncu.profile, --profile-from-start off:
       cudaProfilerStart/Stop around its prefill step and one decode step). Every kernel of the two windows is
       aligned kernel by kernel with a traced step of the same kind, and its counters (time, DRAM / SM / tensor %,
       occupancy and its limiter, top warp stalls) go to every layer of every traced step of that kind
       (common.tables.timeline.attach_counters): every kernel class of a layer on the counters.
    --nsys: the eager generate again under Nsight Systems (kernel and NVTX tables).
    Every millisecond of one generate (5 generates of one 512-character text prompt, untraced, the graph variant):
       mini-SGLang records no time stamps of its own, so the script wraps, for these generates only, receive_msg
       (the tokenizer), _schedule_next_batch, attn_backend.prepare_metadata, _forward, FlashInfer's plan(),
       _process_last_data and send_result (perf_counter before and after): the TTFT from generate() to the first
       token handed over, and one decode step as the overlap loop spends it (common.tables.waterfall: the median generate
       with each part's spread; the 5% add-up check on the decode step, whose loop time is not stamped). No HTTP,
       detokenizer process or queue here.

What the plan expected (hypotheses: H_* below, judged on 3 repetitions or on every traced step / layer)
    * Per layer ~10 kernels in a fixed order: norm, QKV GEMM, RoPE, store_kv_cache, attention (+ merge
      when KV is split), O GEMM, fused add-norm, gate/up GEMM, activation, down GEMM.
    * Layer ranges in eager steps, none inside graph replays; one FlashInfer plan sync per step;
      small GPU gaps between steps with overlap scheduling, larger without.
    * CUDA graphs make a decode step cheaper than eager launches (no plan figure: restated as >= 5% less time).
    * A shared prefix shows up as cached_len and a shorter prefill.
    * Per-kernel hardware state through a whole forward (every kernel class of a layer on the counters).

Run (one LLM per process, created before any CUDA call; gloo binds 127.0.0.1:2333, so one at a time)
    python mini-sglang/scripts/08_forward_timeline.py --quick        # ~2 min: eager, graph, graph-no-overlap
    python mini-sglang/scripts/08_forward_timeline.py --quick --ncu  # + the counters of every kernel class (~+2 min)
    python mini-sglang/scripts/08_forward_timeline.py                # all four variants, 32 decode steps, counters
    python mini-sglang/scripts/08_forward_timeline.py --quick --nsys # + Nsight Systems tables of the eager run
    python mini-sglang/scripts/08_forward_timeline.py --quick --batch 8 --variants eager,graph
    ./mini-sglang/scripts/ncu_profile.sh --kernel 'nvjet|Norm|BatchPrefill' --count 40 -- \\
        python mini-sglang/scripts/08_forward_timeline.py --ncu-target --quick     # a 2-layer forward, any ncu set
    python mini-sglang/scripts/08_forward_timeline.py --reanalyse DIR --out OUT  # no GPU: the analysis again from DIR
Writes mini-sglang/results/08_forward_timeline/: steps.csv, prefix.csv, kernels_<variant>.csv, layer_check.csv,
layer_tree.csv, class_shares.csv, waterfall.csv, traced_steps.csv, ncu_windows.csv and ncu/ (with counters), nsys_kernels.csv / nsys_nvtx.csv
(--nsys), story_<variant>.json (Perfetto: open in https://ui.perfetto.dev, <= 5 MB), trace_<variant>.json,
timeline.png, layer_tree.png, variants.png, story.txt, summary.json.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _msgl  # noqa: E402
from _msgl import REPEATS  # noqa: E402
from common.base import story  # noqa: E402
from common.base.checks import require_gpu, require_module, run_main  # noqa: E402
from common.capture import ceilings, models, ncu, nsys  # noqa: E402
from common.capture.ranges import nvtx_range  # noqa: E402
from common.tables import kernels, ncu_pass, timeline, trace  # noqa: E402
from common.tables.trace import TraceError  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.render import plots  # noqa: E402
from common.run import cli, recording  # noqa: E402
from common.run.results import Run  # noqa: E402

# ------------------------------------------------------------------ the run, as data
VARIANTS = ("eager", "graph", "graph-no-overlap", "eager-no-overlap")
QUICK = dict(variants=VARIANTS[:3], decode_steps=16, ncu=False)
FULL = dict(variants=VARIANTS, decode_steps=32, ncu=True)
TRACE_DECODE = 4                     # decode steps in each traced generate
NCU_DECODE = 2                       # the decode step (1-based) the counters window opens on
PREFIX, TAIL = 1024, 64              # the shared-prefix prompts
KV_POOL, MAX_SEQ = 1 << 17, 16384    # KV slots (num_page_override) and max_seq_len_override
STEP = re.compile(r"^step\[(?P<mode>prefill|decode) bs=(?P<bs>\d+) pad=(?P<pad>\d+) tokens=(?P<toks>\d+)\]$")
CHILD_ARGS = ("quick", "model", "prompt_len", "batch", "backend")    # what the --ncu/--nsys-target child rebuilds
LAYER_CLASSES = ("norm", "gemm", "rope", "kv_store", "attention", "activation")
EXPECTED_LAYER = ["norm", "gemm", "rope", "kv_store", "attention", "gemm", "norm", "gemm", "activation", "gemm"]

# ------------------------------------------------------------------ the hypotheses, as data
PLAN = "mini-sglang/reports/plan.md, expected observations 06 (the forward timeline)"
H = declare(f"""
    order = layer-order: each layer runs ~10 kernels in a fixed order: norm, QKV GEMM, RoPE, store, attention
            (+merge), O GEMM, add-norm, gate/up GEMM, act, down GEMM
        judged on: every layer of every traced step: its kernel classes in launch order (split-K reduce and merge
            folded into their GEMM / attention) equal that sequence
        source: {PLAN}: '~10 kernels per layer in a fixed order'
    ranges = layer-ranges-eager: NVTX Layer_i ranges are present in eager steps and agree with the layers found in the
            kernel names
        judged on: every traced eager step: one Layer_i range per model layer, and every kernel inside Layer_i
            assigned to layer i by common.tables.trace.assign_layers
        source: {PLAN}: 'Layer_i / MHA / MLP ranges'; PLAN.md session 2, 06 row
    no_ranges = no-ranges-in-graphs: inside a CUDA-graph replay no Layer_i range is emitted
        judged on: every traced graph decode step: 0 Layer_i ranges (premise: the step launched a CUDA graph)
        source: {PLAN}: 'no Layer_i ranges inside graph replays'
    plan_sync = plan-sync-per-step: one FlashInfer plan sync (cudaEventSynchronize) per step
        judged on: every traced step of every variant: exactly one cudaEventSynchronize inside it
        source: {PLAN}: 'one plan sync per step'; attention/fi.py:123-132
    graph = graph-vs-eager: CUDA-graph replay makes a decode step cheaper than eager launches
        judged on: eager / graph decode step GPU time (median step of each generate), {REPEATS} repetitions
        confirmed: >= 1.05
        source: {PLAN}: 'eager -> graph replay' (no figure; 'cheaper' read as >= 5% less time)
    overlap = overlap-gap: overlap scheduling keeps the GPU gap between decode steps small; without it the gap grows
        judged on: median GPU idle before a decode step, graph without overlap minus graph with overlap (us),
            {REPEATS} repetitions
        confirmed: >= 10 us
        source: {PLAN}: 'small GPU gaps with overlap, larger without'; 'larger' read as >= 10 us more per step (CUDA
            events resolve ~1 us)
    prefix = prefix-hit: a shared prefix becomes cached_len and a shorter prefill
        judged on: prefill GPU time of a prompt sharing {PREFIX} tokens with the previous one / of that previous
            prompt, {REPEATS} prefixes (premise: cached_len >= {PREFIX} every time)
        confirmed: <= 0.9
        source: mini-sglang/reports/plan.md 07 row: 'a shared prefix shows as cached_len and a shorter prefill'
            (measured in the engine here); 'shorter' read as >= 10% less time
    state = counters-every-class: per-kernel hardware state through a whole forward: every kernel class of a layer on
            the counters
        judged on: each kernel class of layer 1 in the eager prefill and decode steps has Nsight Compute counters
        source: PLAN.md session 2 (06 row: 'per-kernel state')
""")


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="3 variants, 16 decode steps, no counters (~2 min)")
    p.add_argument("--ncu", action="store_true", help="the counters pass (a 2-layer model under Nsight Compute) with --quick")
    p.add_argument("--nsys", action="store_true", help="also run the eager generate under Nsight Systems (if usable)")
    p.add_argument("--model", type=cli.preset, default="llama-3.1-8b", help="architecture preset (dummy weights)")
    p.add_argument("--prompt-len", type=cli.positive_int, default=512, help="tokens per prompt")
    p.add_argument("--batch", type=cli.positive_int, default=1, help="prompts decoded together")
    p.add_argument("--decode-steps", type=_msgl.at_least(REPEATS, "an integer", f"a verdict needs {REPEATS} repetitions"),
                   default=None, help="decode steps of each timed generate")
    p.add_argument("--variants", type=cli.choices_list(*VARIANTS), default=None,
                   help=f"variants to run (default {','.join(QUICK['variants'])} with --quick, all four otherwise)")
    p.add_argument("--backend", type=cli.choices_list("fi", "fa"), default=["fi"], help="attention backend (default fi)")
    p.add_argument("--ncu-target", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--nsys-target", action="store_true", help=argparse.SUPPRESS)
    recording.add_flag(p)
    a = p.parse_args(argv)
    if a.prompt_len + (a.decode_steps or FULL["decode_steps"]) + TAIL > MAX_SEQ:
        p.error(f"argument --prompt-len: {a.prompt_len} tokens plus the decode steps exceed max_seq_len {MAX_SEQ}")
    return a


def settings(args) -> SimpleNamespace:
    mode = QUICK if args.quick else FULL
    return SimpleNamespace(variants=tuple(args.variants or mode["variants"]), decode=args.decode_steps or
                           mode["decode_steps"], ncu=args.ncu or mode["ncu"], backend=args.backend[0])


def prompts(n, length, seed):
    rng = random.Random(seed)
    return [_msgl.random_tokens(rng, length) for _ in range(n)]


def parse_step(name: str) -> dict:
    m = STEP.match(name)
    return {"mode": m["mode"], "bs": int(m["bs"]), "pad": int(m["pad"]), "toks": int(m["toks"])} if m else {}


def model_dir(preset: str, layers: int | None = None) -> Path:
    """The preset's model folder (config + tokenizer); ``layers``: a copy cut to that many layers (shapes unchanged)."""
    if layers is None:
        return models.write_model_dir(preset)
    d = models.write_model_dir(preset, models.default_dir(preset).with_name(f"{preset}-{layers}-layers"))
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] = layers
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    return d


# ------------------------------------------------------------------ the engine, with a step wrapper

class Forward:
    """One offline LLM, its engine steps wrapped in named ranges with CUDA events, variants switched in place."""

    def __init__(self, torch, path, backend: str, graph_bs: list[int]):
        from minisgl.core import SamplingParams
        from minisgl.llm import LLM
        t0 = time.perf_counter()
        self.llm = LLM(str(path), use_dummy_weight=True, attention_backend=backend, cuda_graph_bs=graph_bs or None,
                       cuda_graph_max_bs=None if graph_bs else 0, num_page_override=KV_POOL, max_seq_len_override=MAX_SEQ)
        self.init_s, self.torch, self.variant = time.perf_counter() - t0, torch, "graph" if graph_bs else "eager"
        self.graph_max = self.llm.engine.graph_runner.max_graph_bs
        self.sp = lambda n: SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        self.steps, self.window = [], {}       # window: {phase: n}, the n-th step of that phase under the profiler
        _msgl.mirror_nvtx(torch)
        orig, eng = self.llm.engine.forward_batch, self.llm.engine

        def stepped(batch, sargs):
            lens = [(r.cached_len, r.extend_len) for r in batch.reqs]   # read before: forward_batch advances them
            name = f"step[{batch.phase} bs={batch.size} pad={batch.padded_size} tokens={sum(e for _, e in lens)}]"
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            profiled = self.window.get(batch.phase) == 1 + sum(st["phase"] == batch.phase for st in self.steps)
            if profiled:                                   # the --ncu-target windows (cudaProfilerStart/Stop)
                torch.cuda.synchronize()
                torch.cuda.profiler.start()
            s.record(eng.stream)
            with nvtx_range(name):
                out = orig(batch, sargs)
            e.record(eng.stream)
            if profiled:
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
            self.steps.append({"name": name, "phase": batch.phase, "bs": batch.size, "pad": batch.padded_size,
                               "lens": lens, "s": s, "e": e})
            return out
        eng.forward_batch = stepped

    def use(self, variant: str) -> None:
        from minisgl.env import ENV
        self.llm.engine.graph_runner.max_graph_bs = self.graph_max if variant.startswith("graph") else 0
        ENV.DISABLE_OVERLAP_SCHEDULING.value = variant.endswith("no-overlap")
        self.variant = variant

    def generate(self, ids, new_tokens: int):
        """One generate; (outputs, one row per engine step: GPU ms and the GPU gap before it, wall s)."""
        self.steps = []
        t0 = time.perf_counter()
        out = self.llm.generate(ids, self.sp(new_tokens))
        wall = time.perf_counter() - t0
        self.torch.cuda.synchronize()
        rows = [{"variant": self.variant, "step": i, "phase": st["phase"], "bs": st["bs"], "pad": st["pad"],
                 "cached_len": st["lens"][0][0], "new_tokens": sum(e for _, e in st["lens"]),
                 "gpu_ms": st["s"].elapsed_time(st["e"]),
                 "gap_before_ms": self.steps[i - 1]["e"].elapsed_time(st["s"]) if i else None}
                for i, st in enumerate(self.steps)]
        return out, rows, wall

    def clocked(self, text: str, new_tokens: int) -> dict:
        """One generate of one text prompt with the scheduler's own calls time-stamped: mini-SGLang records no
        stamps of its own (its code has time calls only for the radix cache's LRU, kvcache/radix_cache.py), so the
        script wraps, for this generate only, the calls WATERFALL_CALLS names (instance attributes that shadow the
        methods; perf_counter before and after, ~1 us each). Returns {"call", "events": [(name, t0, t1, info)],
        "steps": the engine steps (GPU ms from CUDA events)}."""
        llm, ev = self.llm, []

        def wrap(owner, attr, name, info=None):
            orig = getattr(owner, attr)

            def timed(*a, **k):
                t0 = time.perf_counter()
                out = orig(*a, **k)
                ev.append((name, t0, time.perf_counter(), info(a, out) if info else None))
                return out
            setattr(owner, attr, timed)
            return owner, attr
        patched = [wrap(llm, "receive_msg", "receive", lambda a, out: len(out)),
                   wrap(llm, "_tokenize_one", "tokenize"),
                   wrap(llm, "_schedule_next_batch", "schedule", lambda a, out: out is not None),
                   wrap(llm.engine.attn_backend, "prepare_metadata", "attention metadata"),
                   wrap(llm, "_forward", "forward launch"),
                   wrap(llm, "_process_last_data", "result", lambda a, out: a[0] is not None),
                   wrap(llm, "send_result", "send", lambda a, out: len(a[0]))]
        if hasattr(llm.engine.attn_backend, "_initialize_metadata_once"):
            patched.append(wrap(llm.engine.attn_backend, "_initialize_metadata_once", "FlashInfer plan()"))
        try:
            t_call = time.perf_counter()
            _out, rows, _wall = self.generate([text], new_tokens)
        finally:
            for owner, attr in patched:
                try:
                    delattr(owner, attr)            # the class's method again (send/receive: the bound originals)
                except AttributeError:
                    pass
            llm.receive_msg, llm.send_result = llm.offline_receive_msg, llm.offline_send_result
        return {"call": t_call, "events": ev, "steps": rows}

    def close(self) -> None:
        """Free the GPU for the profiler children (the global Context still holds the KV pool)."""
        import gc
        import minisgl.core
        self.llm.shutdown()
        del self.llm
        minisgl.core._GLOBAL_CTX = None
        gc.collect()
        self.torch.cuda.empty_cache()


def step_work(st) -> dict:
    """The batch of one traced step for common.tables.timeline.add_work: new tokens, per-request new and KV lengths."""
    qo = [e for _c, e in st["lens"]]
    return {"tokens": sum(qo), "qo_lens": qo, "kv_lens": [c + e for c, e in st["lens"]]}


# ------------------------------------------------------------------ phases 1-2: timed and traced

def measure(run, fwd, args, s) -> dict:
    out, _, _ = fwd.generate(prompts(1, 64, 99), 2)                     # warm-up: FlashInfer JIT, first plans
    if len(out[0]["token_ids"]) != 2:
        raise RuntimeError(f"sanity: asked for 2 tokens, got {len(out[0]['token_ids'])}")
    run.log("sanity: generate returned the requested token count ✅  Timing.")
    # every generate gets prompts of its own (the radix cache would turn a repeated prompt into a cached prefill)
    seed = lambda v, rep: 1000 * VARIANTS.index(v) + rep  # noqa: E731
    for v in s.variants:                                                # each path once before the clock runs
        fwd.use(v)
        fwd.generate(prompts(args.batch, args.prompt_len, seed(v, 900)), 3)
    rows = []
    for rep in range(REPEATS):
        for v in s.variants:
            fwd.use(v)
            _o, r, wall = fwd.generate(prompts(args.batch, args.prompt_len, seed(v, rep)), s.decode + 1)
            rows += [{**x, "rep": rep, "wall_ms_per_step": 1e3 * wall / len(r)} for x in r]
        now = [x for x in rows if x["rep"] == rep and x["phase"] == "decode"]
        run.log(f"repetition {rep + 1}/{REPEATS}: " + ", ".join(
            f"{v} {statistics.median(x['gpu_ms'] for x in now if x['variant'] == v):.2f} ms" for v in s.variants)
            + " per decode step (GPU)")
    fwd.use("graph" if "graph" in s.variants else s.variants[0])
    wf = [fwd.clocked(random_text(args.prompt_len, 50 + rep), 9) for rep in range(WATERFALL_REPS)]
    run.log("waterfall: " + ", ".join(f"TTFT {waterfall_of(w)['total_ms']:.1f} ms" for w in wf) + " (offline engine)")
    fwd.use(s.variants[0])
    prefix = []
    for rep in range(REPEATS):
        pre, tails = prompts(1, PREFIX, 500 + rep)[0], prompts(2, TAIL, 600 + rep)
        a = fwd.generate([pre + tails[0]], 1)[1][0]
        b = fwd.generate([pre + tails[1]], 1)[1][0]
        prefix.append({"rep": rep, "first_new_tokens": a["new_tokens"], "first_ms": a["gpu_ms"], "cached_len": b["cached_len"],
                       "shared_new_tokens": b["new_tokens"], "shared_ms": b["gpu_ms"]})
    traced = {}
    for v in s.variants:
        fwd.use(v)
        got = {}
        path = trace.capture_calls(fwd.torch, [(f"generate {v}", lambda: got.update(r=fwd.generate(
            prompts(args.batch, args.prompt_len, seed(v, 700)), TRACE_DECODE + 1)))], run.path(f"trace_{v}.json"), reps=1,
            warm=False)
        traced[v] = {"path": path, "work": [step_work(st) for st in fwd.steps], "rows": got["r"][1]}
        run.log(f"traced {v}: {len(fwd.steps)} steps -> {path.name}")
    return {"steps": rows, "prefix": prefix, "traced": traced, "waterfall": wf}


# ------------------------------------------------------------------ every millisecond of one generate (offline engine)

WATERFALL_REPS = 5


def random_text(n_chars: int, seed: int) -> str:
    """ASCII words of exactly ``n_chars`` characters (= tokens with the presets' byte-level tokenizer, + BOS)."""
    rng = random.Random(seed)
    words = []
    while sum(len(w) + 1 for w in words) < n_chars:
        words.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))))
    return " ".join(words)[:n_chars]


def _first(ev, name, after=-math.inf, info=None):
    return next((e for e in ev if e[0] == name and e[1] >= after and (info is None or info(e[3]))), None)


def waterfall_of(rec: dict) -> dict:
    """The TTFT of one offline generate (Forward.clocked) as a common.tables.waterfall: generate() called -> tokenized
    (receive_msg) -> batch scheduled -> attention metadata -> the prefill launched (CPU; FlashInfer plan() inside)
    -> the overlap loop's next step scheduled and launched first -> waiting for the GPU and the result -> the first
    token handed over (send_result). Stamps: the script's wrappers (mini-SGLang records none)."""
    from common.tables import waterfall
    ev = sorted(rec["events"], key=lambda e: e[1])
    recv = _first(ev, "receive", info=lambda n: n)
    sched = _first(ev, "schedule", recv[2] if recv else -math.inf, info=bool)
    meta = _first(ev, "attention metadata", sched[1]) if sched else None
    fwd = _first(ev, "forward launch", sched[2]) if sched else None
    res = _first(ev, "result", fwd[2] if fwd else -math.inf, info=bool)
    send = _first(ev, "send", res[1] if res else -math.inf, info=lambda n: n)
    st = {"call": rec["call"], "received": recv and recv[2], "meta_start": meta and meta[1], "meta_end": meta and meta[2],
          "scheduled": sched and sched[2], "fwd_start": fwd and fwd[1], "launched": fwd and fwd[2],
          "result_start": res and res[1], "first_token": send and send[1]}
    plan = sum(e[2] - e[1] for e in ev if e[0] == "FlashInfer plan()" and fwd and fwd[1] <= e[1] <= fwd[2]) * 1e3
    tok = sum(e[2] - e[1] for e in ev if e[0] == "tokenize" and recv and e[2] <= recv[2]) * 1e3
    gpu = next((r["gpu_ms"] for r in rec.get("steps") or [] if r["phase"] == "prefill"), math.nan)
    what = {"tokenize": f"receive_msg: the tokenizer {tok:.2f} ms, the loop's entry",
            "batch scheduling": "PrefillManager.schedule_next_batch, pad, allocate pages, positions",
            "attention metadata": "attn_backend.prepare_metadata", "sampler prepare": "the rest of _prepare_batch",
            "prefill launch (CPU)": f"_forward: model forward launched layer by layer, FlashInfer plan() {plan:.2f} ms",
            "overlap: next step first": "the loop's next iteration schedules and launches decode step 1 first",
            "wait for the GPU + result": f"copy_done.synchronize (the prefill's GPU time {gpu:.2f} ms, CUDA events), "
                                         "tokens to the host"}
    chain = [("call", None), ("received", "tokenize"), ("meta_start", "batch scheduling"),
             ("meta_end", "attention metadata"), ("scheduled", "sampler prepare"), ("launched", "prefill launch (CPU)"),
             ("result_start", "overlap: next step first"), ("first_token", "wait for the GPU + result")]
    wf = waterfall.build({k: v for k, v in st.items() if v is not None}, chain, label="offline generate", what=what)
    wf.update(plan_ms=plan, tokenize_ms=tok, prefill_gpu_ms=gpu)
    return wf


def decode_iteration(rec: dict) -> dict:
    """One decode step of the offline engine as its overlap loop spends it: the median period between two handed-over
    tokens (send_result), split into receive_msg, _schedule_next_batch, _forward (launch) and _process_last_data
    (waits for the GPU; send_result inside), the rest unattributed (the loop itself)."""
    from common.tables import waterfall
    ev = sorted(rec["events"], key=lambda e: e[1])
    sends = [e for e in ev if e[0] == "send" and e[3]][1:]             # after the first token
    if len(sends) < 3:
        return {}
    its = list(zip(sends, sends[1:]))
    periods = [b[1] - a[1] for a, b in its]
    a, b = its[waterfall.median_index(periods)]
    parts = []
    for name, label in (("receive", "receive_msg"), ("schedule", "schedule_next_batch"), ("forward launch", "_forward"),
                        ("result", "process_last_data (waits for the GPU)")):
        ms = sum(max(0.0, min(e[2], b[1]) - max(e[1], a[1])) for e in ev if e[0] == name) * 1e3   # clipped to it
        parts.append({"name": label, "ms": ms, "start": None, "end": None, "from": None, "to": None,
                      "source": "untraced", "what": "", "split": None})
    wf = waterfall._finish({"label": f"one decode step (median of {len(its)})", "total_ms": (b[1] - a[1]) * 1e3,
                            "parts": parts, "source": "untraced"})
    gpu = [r["gpu_ms"] for r in rec.get("steps") or [] if r["phase"] == "decode"]
    wf.update(decode_gpu_ms=statistics.median(gpu) if gpu else math.nan)
    return wf


def waterfall_summary(recs: list) -> dict:
    """Medians over the clocked generates: the TTFT waterfall and one decode step."""
    from common.tables import waterfall
    ttft = waterfall.median([waterfall_of(r) for r in recs], label=f"untraced, median of {len(recs)} generates")
    decs = [d for d in (decode_iteration(r) for r in recs) if d]
    dec = waterfall.median(decs, label=f"one decode step, median of {len(decs)} generates") if decs else None
    return {"ttft": ttft, "decode": dec}


WHAT_IT_CANNOT = ("mini-SGLang's offline engine records no time stamps (its only time calls date the radix cache's "
                  "LRU): every stamp here is the script's wrapper around one of its calls; there is no HTTP, no "
                  "detokenizer process and no queue to time (one prompt, offline), and the GPU forward is timed "
                  "with CUDA events, not placed on the CPU clock.")


# ------------------------------------------------------------------ phase 3: counters (a 2-layer model under ncu)

def target(args) -> int:
    """--ncu-target: a 2-layer model, eager; its first prefill step and decode step NCU_DECODE inside
    cudaProfilerStart/Stop (the windows analyse() aligns with the traced steps of the same kind).
    --nsys-target: the eager generate of the full model."""
    torch = require_module("torch", "pip install -r requirements.txt")
    s = settings(args)
    fwd = Forward(torch, model_dir(args.model, 2 if args.ncu_target else None), s.backend, [])
    fwd.generate(prompts(1, 64, 99), 2)
    if args.ncu_target:
        fwd.window = {"prefill": 1, "decode": NCU_DECODE}
    fwd.generate(prompts(args.batch, args.prompt_len, 7), TRACE_DECODE + 1)
    fwd.llm.shutdown()
    return 0


def counters(run, args, pk):
    run.log("counters: a 2-layer model (shapes unchanged) under Nsight Compute, its prefill step and one decode step")
    res = ncu.profile(ncu_pass.target_cmd(__file__, ncu_pass.argv_of(args, CHILD_ARGS)), run.dir / "ncu",
                      metrics=kernels.SUMMARY_METRICS, extra=["--profile-from-start", "off"], echo=run.log, timeout=1500,
                      cache_control="none")       # the forward's kernels as they run: caches as the one before left them
    return kernels.summarize(res.df, peaks=pk)


def nsys_tables(run, args) -> None:
    if not nsys.find():
        run.note("nsys not usable here: the torch-profiler traces (trace_<variant>.json) are the timeline of record")
        return
    try:
        rep = nsys.profile(ncu_pass.target_cmd(__file__, ncu_pass.argv_of(args, CHILD_ARGS), "--nsys-target"),
                           run.dir / "nsys", echo=run.log, timeout=900)
        st = nsys.stats(rep, ("cuda_gpu_kern_sum", "nvtx_sum"))
        for key, name in (("cuda_gpu_kern_sum", "nsys_kernels"), ("nvtx_sum", "nsys_nvtx")):
            if key in st:
                run.table(name, trace.read_nsys_csv(st[key]))
    except Exception as e:   # the torch-profiler timeline stands
        run.point_error({"part": "nsys"}, e)


# ------------------------------------------------------------------ analysis (no GPU: tested on recorded traces)

def kernel_table(ev, work, cfg, pk, step=r"^step\[", outer=None, parse=parse_step):
    """The joined kernel table of one traced generate: steps -> layers -> roles -> FLOPs/bytes -> rates. mini-SGLang's
    embedding is its own index kernel (_msgl.EMBEDDING_KERNEL), which common.tables.timeline labels 'prepare'."""
    kt = timeline.layered(trace.step_kernels(ev, step, outer=outer, parse=parse), layers=cfg["num_hidden_layers"])
    emb = (kt["segment"] == "pre") & kt["kernel"].str.contains(_msgl.EMBEDDING_KERNEL)
    kt.loc[emb, "role"] = "embedding"
    if work is not None and len(work) == kt["step"].nunique():
        kt = timeline.add_work(kt, cfg, dict(enumerate(work)), pk)
    return kt


def layer_order(kt) -> list[dict]:
    """Per (step, layer): its kernel classes in launch order, split-K reduce / merge folded, other kernels noted."""
    rows = []
    for (s, layer), g in kt[kt["segment"] == "layer"].groupby(["step", "layer"], sort=True):
        cls = [c for c in g["cls"] if c in LAYER_CLASSES]
        seq = [c for i, c in enumerate(cls) if i == 0 or c != cls[i - 1]]
        rows.append({"step": int(s), "mode": g["mode"].iloc[0] if "mode" in g else None, "layer": int(layer),
                     "kernels": len(g), "sequence": " > ".join(seq), "matches": seq == EXPECTED_LAYER,
                     "others": ", ".join(sorted(set(g[~g["cls"].isin(LAYER_CLASSES)]["kernel"])))})
    return rows


def range_check(ev, kt, layers: int) -> list[dict]:
    """Per traced step: Layer_i ranges inside it, cudaEventSynchronize and cudaGraphLaunch calls, and whether every kernel
    inside a Layer_i range carries layer i in the kernel table (the repeating-unit assignment)."""
    try:
        j = trace.kernels_in_ranges(ev, r"^Layer_\d+$", empty_rows=False)
        j = j[j["gpu_kind"] == "kernel"]
        by_ts = dict(zip(j["ts_us"], j["range"].str.slice(6).astype(int)))
    except TraceError:
        by_ts = {}
    ranges = dict(enumerate(n for _name, n in trace.calls_in_ranges(ev, r"^step\[", r"^Layer_\d+$", inner=("user_annotation",))))
    syncs = dict(enumerate(n for _name, n in trace.calls_in_ranges(ev, r"^step\[", r"^cudaEventSynchronize$")))
    graphs = dict(enumerate(n for _name, n in trace.calls_in_ranges(ev, r"^step\[", r"^cudaGraphLaunch$")))
    out = []
    for s, g in kt.groupby("step", sort=True):
        rl = g["ts_us"].map(by_ts)
        inside = rl.notna()
        out.append({"step": int(s), "mode": g["mode"].iloc[0] if "mode" in g else None, "layer_ranges": ranges.get(s, 0),
                    "model_layers": layers, "kernels_in_layer_ranges": int(inside.sum()),
                    "agree": bool(inside.any() and (g.loc[inside, "layer"] == rl[inside]).all()),
                    "event_syncs": syncs.get(s, 0), "graph_launches": graphs.get(s, 0)})
    return out


def analyse(run, data, cfg, pk, rows=None) -> dict:
    """Per variant: the kernel table (with counters when ``rows`` holds the ncu summary), the layer checks, the layer tree
    of its prefill and a middle decode step, class shares; then the timed tables. Returns what the verdicts need."""
    import pandas as pd
    out = {"kt": {}, "order": [], "ranges": [], "tree": [], "shares": [], "ncu": []}
    for v, tr in data["traced"].items():
        ev = trace.read_chrome_trace(tr["path"])
        kt = kernel_table(ev, tr["work"], cfg, pk)
        pre, dec = kt[kt["mode"] == "prefill"]["step"], sorted(kt[kt["mode"] == "decode"]["step"].unique())
        steps = {"prefill": int(pre.min())} if len(pre) else {}
        if dec:
            steps["decode"] = int(dec[min(NCU_DECODE - 1, len(dec) - 1)])
        if rows is not None:
            wins = [{"name": m, "step": st, "match": {"mode": m}} for m, st in steps.items()]   # in profiling order
            kt, info = timeline.attach_counters(kt, rows, wins, pk)
            out["ncu"] += [{"variant": v, **i} for i in info]
        out["kt"][v] = kt
        out["order"] += [{"variant": v, **r} for r in layer_order(kt)]
        out["ranges"] += [{"variant": v, **r} for r in range_check(ev, kt, cfg["num_hidden_layers"])]
        out["tree"] += [{"variant": v, "step": st, "mode": m, "bs": int(kt[kt["step"] == st]["bs"].iloc[0]), **r}
                        for m, st in steps.items() for r in timeline.layer_tree(kt, st)]
        out["shares"].append(timeline.class_shares(kt).assign(variant=v))
        run.table(f"kernels_{v}", kt)
        spans = [{"name": g["step_name"].iloc[0], "start_us": float(g["ts_us"].min()), "dur_us": float(g["end_us"].max()
                  - g["ts_us"].min()), "kernels": len(g), "kernel_us": float(g["dur_us"].sum())} for _s, g in kt.groupby("step")]
        events, meta = timeline.perfetto_events(kt, steps=spans)
        timeline.write_perfetto(run.path(f"story_{v}.json"), events, {**meta, "gpu": pk.get("gpu"), "variant": v})
    out["steps"], out["prefix"] = pd.DataFrame(data["steps"]), pd.DataFrame(data["prefix"])
    if data.get("waterfall"):
        from common.tables import waterfall
        out["waterfall"] = w = waterfall_summary(data["waterfall"])
        run.table("waterfall", waterfall.rows(w["ttft"], waterfall="ttft")
                  + (waterfall.rows(w["decode"], waterfall="itl") if w["decode"] else []))
    for name in ("steps", "prefix"):
        run.table(name, out[name])
    traced = [{"variant": v, **r} for v, tr in data["traced"].items() for r in tr.get("rows") or []]
    if traced:            # the traced generates' own steps (CUDA events): the observer headline reads them
        run.table("traced_steps", traced)
    checks = pd.DataFrame(out["ranges"])
    if out["order"]:      # one row per layer, with its step's range / sync / graph counts
        checks = pd.DataFrame(out["order"]).merge(checks, on=["variant", "step", "mode"], how="left")
    run.table("layer_check", checks)
    run.table("layer_tree", out["tree"])
    run.table("class_shares", pd.concat(out["shares"], ignore_index=True))
    if out["ncu"]:
        run.table("ncu_windows", out["ncu"])
    return out


def per_generate(steps, variant, col, phase="decode") -> list[float]:
    """The median of ``col`` over the ``phase`` steps of each timed generate (one value per repetition)."""
    d = steps[(steps["variant"] == variant) & (steps["phase"] == phase)]
    if col == "gap_before_ms":       # the idle between two decode steps, not after the prefill
        d = d[d["step"] > d.groupby("rep")["step"].transform("min")]
    return [float(g[col].median()) for _r, g in d.groupby("rep", sort=True)]


def observer(data, steps) -> dict:
    """The torch profiler's cost on what it watches: traced / untraced decode step GPU time - 1, in %, per variant
    (the traced generate of phase 2 against the median of the timed ones)."""
    out = {}
    for v, tr in data["traced"].items():
        traced = [r["gpu_ms"] for r in tr.get("rows") or [] if r["phase"] == "decode"]
        timed = per_generate(steps, v, "gpu_ms")
        if traced and timed:
            out[f"observer_pct_{v.replace('-', '_')}"] = 100 * (statistics.median(traced) / statistics.median(timed) - 1)
    return out


def judge(run, a, variants):
    """Every verdict: the facts on every traced step / layer, the times on the 3 repetitions."""
    import pandas as pd
    order, rng = pd.DataFrame(a["order"]), pd.DataFrame(a["ranges"])
    _msgl.fact(run, H["order"], list(order["matches"]) if len(order) else [], "layer_check.csv", detail=(
        f"{len(order)} layers of {order.groupby('variant')['step'].nunique().sum()} steps; most common: "
        f"{order['sequence'].mode().iloc[0]}; other kernels: "
        f"{', '.join(sorted(set(', '.join(order['others']).split(', ')) - {''})) or 'none'}") if len(order) else
        "no layers found in the traced steps (common.tables.trace.assign_layers)")
    eager = rng[rng["variant"].str.startswith("eager")]
    _msgl.fact(run, H["ranges"], [bool(r["agree"]) and r["layer_ranges"] == r["model_layers"] for r in eager.to_dict("records")],
               "layer_check.csv", premise=True if len(eager) else "no eager variant in this run (--variants)",
               detail=f"Layer_i ranges per eager step: {sorted(set(eager['layer_ranges']))}" if len(eager) else "")
    gd = rng[rng["variant"].str.startswith("graph") & (rng["mode"] == "decode")]
    _msgl.fact(run, H["no_ranges"], [r["layer_ranges"] == 0 for r in gd.to_dict("records")], "layer_check.csv",
               premise=True if len(gd) and (gd["graph_launches"] > 0).all() else
               "no graph decode step launched a CUDA graph (graphs not captured for this batch size?)",
               detail=f"cudaGraphLaunch per graph decode step: {sorted(set(gd['graph_launches']))}" if len(gd) else "")
    _msgl.fact(run, H["plan_sync"], [n == 1 for n in rng["event_syncs"]], "layer_check.csv",
               detail=f"cudaEventSynchronize per step: {sorted(set(rng['event_syncs']))}")
    st = a["steps"]
    if {"eager", "graph"} <= set(variants):
        e, g = per_generate(st, "eager", "gpu_ms"), per_generate(st, "graph", "gpu_ms")
        run.judge(H["graph"], [x / y for x, y in zip(e, g)], evidence="steps.csv",
                  detail=f"eager {statistics.median(e):.2f} ms vs graph {statistics.median(g):.2f} ms per decode step")
    for base in ("graph", "eager"):
        if {base, f"{base}-no-overlap"} <= set(variants):
            on, off = per_generate(st, base, "gap_before_ms"), per_generate(st, f"{base}-no-overlap", "gap_before_ms")
            run.judge(H["overlap"], [1e3 * (y - x) for x, y in zip(on, off)], evidence="steps.csv",
                      detail=f"{base}: {1e3 * statistics.median(on):.0f} us with overlap, {1e3 * statistics.median(off):.0f} "
                             "us without (median gap before a decode step)")
            break
    px = a["prefix"]
    if len(px):
        run.judge(H["prefix"], list(px["shared_ms"] / px["first_ms"]), evidence="prefix.csv",
                  premise=True if (px["cached_len"] >= PREFIX).all() else f"cached_len {list(px['cached_len'])} < {PREFIX}",
                  detail=f"cached_len {sorted(set(px['cached_len']))}, {px['shared_new_tokens'].iloc[0]} new tokens: "
                         f"{px['shared_ms'].median():.2f} ms vs {px['first_ms'].median():.2f} ms for "
                         f"{px['first_new_tokens'].iloc[0]}")
    if a["ncu"]:
        kt = a["kt"]["eager"] if "eager" in a["kt"] else next(iter(a["kt"].values()))
        windows = {w["window"] for w in a["ncu"]}
        seen = [(m, c, kt[(kt["mode"] == m) & (kt["layer"] == 1) & (kt["cls"] == c)]["ncu_time_us"].notna().any())
                for m in sorted(windows) for c in sorted(set(kt[(kt["mode"] == m) & (kt["layer"] == 1)]["cls"]))]
        _msgl.fact(run, H["state"], [ok for *_k, ok in seen], "ncu_windows.csv, kernels_<variant>.csv",
                   detail="; ".join(f"{m} {c}: {'yes' if ok else 'NO'}" for m, c, ok in seen))


# ------------------------------------------------------------------ figures and the story

def variants_figure(steps):
    """Per variant: decode step GPU time and the GPU gap before a decode step (median and range of the repetitions)."""
    plt = plots._plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    vs = list(dict.fromkeys(steps["variant"]))
    sty = plots.styles(vs)
    for ax, col, scale, label in ((a1, "gpu_ms", 1.0, "decode step GPU time (ms)"),
                                  (a2, "gap_before_ms", 1e3, "GPU idle before a decode step (us)")):
        for i, v in enumerate(vs):
            vals = [scale * x for x in per_generate(steps, v, col)]
            med = statistics.median(vals) if vals else 0.0
            ax.bar(i, med, color=sty[v][0], yerr=[[med - min(vals, default=med)], [max(vals, default=med) - med]], capsize=4)
        ax.set_xticks(range(len(vs)))
        ax.set_xticklabels(vs, fontsize=8, rotation=15)
        ax.set_ylabel(label)
    fig.suptitle(f"mini-SGLang decode: eager vs CUDA graph, overlap on/off (bars: median, whiskers: range of {REPEATS})",
                 fontsize=9)
    fig.tight_layout()
    return fig


def tell(a, s, pk, init_s, backend) -> str:
    f = story.fmt
    items = [(f"LLM on dummy weights, attention {backend}, init {init_s:.1f} s; variants {', '.join(s.variants)}", [])]
    items += waterfall_items(a.get("waterfall"))
    st = a["steps"]
    items.append((f"timed generates ({REPEATS} per variant, medians)", [
        (f"{v}: decode step {f(statistics.median(per_generate(st, v, 'gpu_ms')))} ms GPU, gap before "
         f"{f(1e3 * statistics.median(per_generate(st, v, 'gap_before_ms')))} us, prefill "
         f"{f(statistics.median(per_generate(st, v, 'gpu_ms', 'prefill')))} ms", []) for v in s.variants]))
    shown = "graph" if "graph" in s.variants else s.variants[0]    # the configuration mini-SGLang serves with
    tr = [r for r in a["tree"] if r["variant"] == shown]
    kt = a["kt"][shown]
    kids = []
    for mode in ("prefill", "decode"):
        rows = [r for r in tr if r["mode"] == mode]
        if not rows:
            continue
        g = kt[kt["step"] == rows[0]["step"]]
        n_layers = int(g["layer"].max() or 0) + 1
        kids.append((f"{mode} step (bs {rows[0]['bs']}): {len(g)} kernels, {f(g['dur_us'].sum() / 1e3)} ms of kernel time",
                     [kernels.node(r, head=f"{r['segment']} {r['role']}: {r['kernel']} {f(r['dur_us'])} us kernel time, "
                                           f"{f(r['share_all_layers_pct'])}% of the step's kernel time"
                                           + (f" (x{n_layers} layers)" if r["segment"] == "layer" else ""))
                      for r in rows if r["segment"] != "pre" or r["role"] == "embedding"]))
    items.append((f"{shown}: one layer and the once-per-step kernels", kids))
    others = [v for v in s.variants if v != shown]
    if others:
        items.append((f"the other variants, the same kernels: their per-role kernel time beside {shown}'s "
                      "(layer_tree.csv lists every kernel of each)", [(line, []) for line in variant_lines(a, shown, others)]))
    return story.tree(f"ONE FORWARD OF mini-SGLang — {pk['gpu']} ({ceilings.ceiling_text(pk, 'dram_read_tb_s', short=True)}, "
                      f"bf16 {f(pk['bf16_tflops'])} TFLOP/s)", items)


def variant_lines(a, shown: str, others: list[str]) -> list[str]:
    """One line per step kind and role: the kernel time of each variant (median per layer), ``shown`` first."""
    f = story.fmt
    out = []
    for mode in ("prefill", "decode"):
        per = {}
        for v in [shown] + others:
            tr = [r for r in a["tree"] if r["variant"] == v and r["mode"] == mode and r["segment"] == "layer"]
            for r in tr:
                per.setdefault(r["role"], {}).setdefault(v, []).append(r["dur_us"])
        for role, by in per.items():
            if shown in by:
                out.append(f"{mode} {role}: " + ", ".join(f"{v} {f(statistics.median(by[v]))} us" for v in [shown] + others
                                                        if v in by))
    return out


def waterfall_items(w) -> list:
    """The story's waterfall block (lines <= 120 characters)."""
    from common.tables import waterfall
    if not w:
        return []
    out = [("TTFT waterfall — one generate of the offline engine, " + w["ttft"]["label"],
            [(ln, []) for ln in waterfall.render(w["ttft"], total_name="first token handed over (median)", width=110,
                                                    judged=False)]
            + [(WHAT_IT_CANNOT[i:i + 110], []) for i in range(0, len(WHAT_IT_CANNOT), 110)])]
    if w.get("decode"):
        out.append(("ITL waterfall — " + w["decode"]["label"],
                    [(ln, []) for ln in waterfall.render(w["decode"], total_name="period between tokens", width=110)]))
    return out


def judge_waterfall(run, w) -> None:
    """The decode step's add-up check as an observation (refuted when it does not add up: never printed as fine).
    The TTFT waterfall is not judged: its parts run between consecutive stamps of one clock and its total is their
    span, so every generate adds up by construction (a check that cannot fail); it is shown, not tested."""
    wf = w.get("decode")
    if wf:
        run.observe(f"the decode waterfall of the offline engine adds up within 5% ({wf['label']})",
                    f"parts {wf['sum_ms']:.2f} ms of {wf['total_ms']:.2f} ms ({wf['remainder_pct']:+.1f}% unattributed)",
                    "confirmed" if wf["ok"] else "refuted", "waterfall.csv")


# ------------------------------------------------------------------ figures, verdicts, headline, story (GPU run and --reanalyse)

@dataclass
class Record:
    """What the report of one run reads: the settings, the ceilings, the LLM's init time, the joined analysis
    (analyse(): kernel tables, layer checks, layer tree, timed steps, prefix, waterfall, ncu windows) and the
    profiler's cost per variant (observer())."""
    s: SimpleNamespace
    pk: dict
    init_s: float
    a: dict
    observer: dict = field(default_factory=dict)


def report(run, x: Record) -> None:
    """Figures, verdicts, headline and story from the joined tables (a GPU run and --reanalyse alike)."""
    s, pk, a, init_s = x.s, x.pk, x.a, x.init_s
    show = "graph" if "graph" in a["kt"] else s.variants[0]
    run.figure("timeline", plots.joined_timeline(a["kt"][show], title=f"mini-SGLang {show} — {pk['gpu']}"))
    run.figure("layer_tree", plots.layer_tree([r for r in a["tree"] if r["variant"] == show], pk))
    run.figure("variants", variants_figure(a["steps"]))
    # ---- verdicts
    judge(run, a, s.variants)
    if a.get("waterfall"):
        judge_waterfall(run, a["waterfall"])
    st = a["steps"]
    run.headline(init_s=init_s, **{f"decode_step_ms_{v.replace('-', '_')}": statistics.median(per_generate(st, v, "gpu_ms"))
                                   for v in s.variants}, **x.observer,
                 kernels_per_decode_step=float(a["kt"][show][a["kt"][show]["mode"] == "decode"].groupby("step").size()
                                               .median()),
                 shared_prefix_cached_len=int(a["prefix"]["cached_len"].min()))
    # ---- the story
    run.story(tell(a, s, pk, init_s, s.backend), echo=True)


def waterfall_from_rows(df, key: str, label: str) -> dict | None:
    """A waterfall of waterfall.csv again (common.tables.waterfall.rows inverted): its parts, its total (the parts plus the
    unattributed remainder) and its add-up verdict (common.tables.waterfall._finish)."""
    from common.tables import waterfall
    d = df[(df["waterfall"] == key) & (df["level"] == 0)]
    if not len(d):
        return None
    parts = [{"name": r["part"], "ms": r["ms"], "min_ms": r["min_ms"], "max_ms": r["max_ms"], "source": r["source"],
              "what": r["what"] if isinstance(r["what"], str) else "", "start": None, "end": None, "from": None,
              "to": None, "split": None} for r in d.to_dict("records") if r["part"] != "(unattributed)"]
    rest = d[d["part"] == "(unattributed)"]["ms"]
    total = sum(p["ms"] for p in parts) + (float(rest.iloc[0]) if len(rest) else 0.0)
    return waterfall._finish({"label": label, "total_ms": total, "parts": parts, "source": "untraced"})


def read_csv(src: Path, name: str):
    """``name``.csv of a recording, or ``name``.csv.gz (the fixtures gzip the big ones whole); None when neither."""
    import pandas as pd
    for f in (src / f"{name}.csv", src / f"{name}.csv.gz"):
        if f.is_file():
            return pd.read_csv(f)
    return None


def main_reanalyse(args) -> int:
    """--reanalyse DIR: the report again from the joined tables a run recorded (not its traces): the layer checks
    (layer_check.csv holds each traced step's range / sync / graph counts on every layer row), the timed steps, the
    prefix, the waterfall, the ncu windows and the kernel tables of the variants the report reads."""
    from common.base.checks import SetupError
    rec = recording.open(args.reanalyse, __file__, tables=("steps", "prefix"),
                         optional=("waterfall", "ncu_windows", "traced_steps"))
    s = settings(rec.args_like(args))
    t = rec.tables
    for name in ("layer_check", "layer_tree", "class_shares"):      # plain or gzipped whole
        if (t.setdefault(name, read_csv(rec.src, name))) is None:
            raise SetupError(f"--reanalyse {rec.src}: no {name}.csv(.gz) to re-analyse (written by 08_forward_timeline.py)")
    kt = {v: k for v in s.variants if (k := read_csv(rec.src, f"kernels_{v}")) is not None}
    show = "graph" if "graph" in s.variants else s.variants[0]
    if show not in kt:
        raise SetupError(f"--reanalyse {rec.src}: no kernels_{show}.csv(.gz) to re-analyse (the story's and the "
                         "timeline's kernel table; written by 08_forward_timeline.py)")
    lc = t["layer_check"].assign(others=lambda d: d["others"].fillna(""))
    order_cols = ["variant", "step", "mode", "layer", "kernels", "sequence", "matches", "others"]
    range_cols = ["variant", "step", "mode", "layer_ranges", "model_layers", "kernels_in_layer_ranges", "agree",
                  "event_syncs", "graph_launches"]
    a = {"kt": kt, "order": lc[order_cols].to_dict("records"),
         "ranges": lc[range_cols].drop_duplicates(["variant", "step"]).to_dict("records"),
         "tree": t["layer_tree"].to_dict("records"), "shares": [t["class_shares"]],
         "ncu": t["ncu_windows"].to_dict("records") if t["ncu_windows"] is not None else [],
         "steps": t["steps"], "prefix": t["prefix"]}
    if t["waterfall"] is not None:
        a["waterfall"] = {"ttft": waterfall_from_rows(t["waterfall"], "ttft", f"untraced, median of {WATERFALL_REPS} generates"),
                          "decode": waterfall_from_rows(t["waterfall"], "itl",
                                                        f"one decode step, median of {WATERFALL_REPS} generates")}
    head = rec.summary.get("headline") or {}
    if t["traced_steps"] is not None:
        tr = t["traced_steps"]
        obs = observer({"traced": {v: {"rows": g.to_dict("records")} for v, g in tr.groupby("variant", sort=False)}},
                       a["steps"])
    else:                  # recorded before traced_steps.csv: the traced steps' CUDA-event times were in no table
        obs = {k: v for k, v in head.items() if k.startswith("observer_pct_")}
    with recording.run(__file__, args, rec) as run:
        if t["traced_steps"] is None:
            run.note("re-analysis: this recording predates traced_steps.csv; the profiler's cost (observer_pct_*) is "
                     "its own headline's, not recomputed")
        for name in ("steps", "prefix", "layer_check", "layer_tree", "class_shares", "waterfall", "ncu_windows",
                     "traced_steps"):
            if t[name] is not None:
                run.table(name, t[name])
        report(run, Record(s=s, pk=rec.peaks, init_s=float(head.get("init_s", math.nan)), a=a, observer=obs))
    return 0


def installed(name: str, hint: str) -> None:
    """SetupError unless package ``name`` can be found, without importing it."""
    import importlib.util
    if importlib.util.find_spec(name) is None:
        from common.base.checks import SetupError
        raise SetupError(f"Python package '{name}' is not installed. Install it: {hint}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    if args.ncu_target or args.nsys_target:
        return target(args)
    # ---- check: packages, GPU, the model; the LLM first (Engine asserts CUDA is untouched; Run's probe touches it)
    torch = require_module("torch", "pip install -r requirements.txt")
    require_gpu(torch)
    _msgl.require_minisgl("minisgl.llm")
    # installed, not imported: importing flashinfer (or sgl_kernel) initialises CUDA, and mini-SGLang's Engine
    # asserts that CUDA is untouched when it starts (minisgl/engine/engine.py:31; seen on an H200, 2026-11-23)
    installed("flashinfer", "pip install flashinfer-python==0.6.15.post1")
    s = settings(args)
    if s.backend == "fa":
        installed("sgl_kernel", "attention backend 'fa' needs sgl_kernel with FA3; use --backend fi")
    cfg = models.config(args.model)
    print(f"starting mini-SGLang LLM ({args.model}, dummy weights, attention {s.backend}) ...", flush=True)
    fwd = Forward(torch, model_dir(args.model), s.backend, sorted({1, args.batch}))
    with Run(__file__, args, out=args.out) as run:
        pk = ceilings.peaks()
        run.log(f"LLM ready in {fwd.init_s:.1f} s; KV pool {fwd.llm.engine.num_pages:,} tokens; decode graphs for batch "
                f"sizes {fwd.llm.engine.graph_runner.graph_bs_list}; ceilings: "
                f"{ceilings.ceiling_text(pk, 'dram_read_tb_s', short=True)}, bf16 {pk['bf16_tflops']:.0f} TFLOP/s "
                f"({pk.get('source')})")
        # ---- measure: timed (3 repetitions, variants interleaved), the shared prefix, one traced generate per variant
        data = measure(run, fwd, args, s)
        init_s = fwd.init_s
        fwd.close()
        rows = run.optional("counters", counters, run, args, pk) if s.ncu else None
        if args.nsys:
            nsys_tables(run, args)
        # ---- analyse: the joined tables, the Perfetto traces, the figures
        a = analyse(run, data, cfg, pk, rows)
        report(run, Record(s=s, pk=pk, init_s=init_s, a=a, observer=observer(data, a["steps"])))
    return 0


if __name__ == "__main__":
    run_main(main)
