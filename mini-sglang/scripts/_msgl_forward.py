"""08's engine: mini-SGLang's offline LLM with each step a named range timed by CUDA events (Forward), variants
switched in place; phases 1-2 on it (measure) and the --ncu-target / --nsys-target child (target)."""
from __future__ import annotations

import json
import random
import re
import statistics
import time
from pathlib import Path

import _msgl
from _msgl import REPEATS
from _msgl_waterfall import WATERFALL_REPS, waterfall_of
from common.base.checks import require_module
from common.capture import models
from common.capture.ranges import nvtx_range
from common.tables import trace

VARIANTS = ("eager", "graph", "graph-no-overlap", "eager-no-overlap")
TRACE_DECODE = 4                     # decode steps in each traced generate
NCU_DECODE = 2                       # the decode step (1-based) the counters window opens on
PREFIX, TAIL = 1024, 64              # the shared-prefix prompts
KV_POOL, MAX_SEQ = 1 << 17, 16384    # KV slots (num_page_override) and max_seq_len_override
STEP = re.compile(r"^step\[(?P<mode>prefill|decode) bs=(?P<bs>\d+) pad=(?P<pad>\d+) tokens=(?P<toks>\d+)\]$")


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


# ------------------------------------------------------------------ phases 1-2: timed and traced; the child

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
    wf = [fwd.clocked(models.random_text(args.prompt_len, 50 + rep), 9) for rep in range(WATERFALL_REPS)]
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


def target(args, backend: str) -> int:
    """--ncu-target: a 2-layer model, eager; its first prefill step and decode step NCU_DECODE inside
    cudaProfilerStart/Stop (the windows analyse() aligns with the traced steps of the same kind).
    --nsys-target: the eager generate of the full model."""
    torch = require_module("torch", "pip install -r requirements.txt")
    fwd = Forward(torch, model_dir(args.model, 2 if args.ncu_target else None), backend, [])
    fwd.generate(prompts(1, 64, 99), 2)
    if args.ncu_target:
        fwd.window = {"prefill": 1, "decode": NCU_DECODE}
    fwd.generate(prompts(args.batch, args.prompt_len, 7), TRACE_DECODE + 1)
    fwd.llm.shutdown()
    return 0
