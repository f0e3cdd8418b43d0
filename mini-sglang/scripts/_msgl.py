"""mini-SGLang's own facts, shared by the scripts of this track (private to mini-sglang/scripts/).

    K = require_minisgl("minisgl.kernel")             # torch, tvm-ffi and minisgl, or one SetupError line
    out, secs = first_call(lambda: K.indexing(w, ids), "index")    # a failed JIT build -> one line
    index_launch(64, 8192); store_launch(8192, 2048)   # grid / block / bytes per warp, read from the source
    index_template(full_kernel_name)                   # the template arguments of an index_kernel launch
    vocab_shard(128256, 2, 1)                          # the embedding rows rank 1 of TP 2 holds
    ncu_coalescing(row)                                # sectors per request from an ncu raw row
    conversation(16, 256); shared_prefix_requests(8, 64, 1024, 64)   # radix-cache workloads
    run_ranks(worker, 2, args, outdir)                 # spawned ranks, never left behind
    mirror_nvtx(torch)                                 # its Layer_i / MHA / MLP ranges into torch.profiler
    fact(run, H, [True, True, True], "trace.json")     # a deterministic fact as a verdict
    eff_premise(rows, ceiling_text)                    # a verdict on effective bandwidth: DRAM rates, none above
    ncu_read_back(pd.read_csv(".../ncu_kernels.csv"))  # a recorded ncu table as the analysis saw it (--reanalyse)

Everything generic comes from common/: the range -> kernel join and the captures (common.tables.trace), FLOPs
and bytes (common.tables.flops), the scripts' ncu pass and its --ncu-target child (common.tables.ncu_pass), ports and
the NCCL environment (common.capture.procs), verdicts on intervals (common.judge.verdicts through results.Run.judge).
Only stdlib and common/ at import time, so every script's --help works on a CPU box; torch and minisgl are imported
inside the functions that need them.
"""
from __future__ import annotations

import json
import math
import os
import random
import re
import sys
import time
from pathlib import Path

from common.base.checks import require_gpu, require_module, SetupError
from common.capture import timing
from common.capture.procs import free_port

COMMIT = "20fcd7f3c6a1898a61139fae1c97cc7a40bd8d66"
PIP_HINT = (f'pip install --no-deps "minisgl @ git+https://github.com/sgl-project/mini-sglang@{COMMIT}" '
            "(--no-deps: its pyproject pins torch<2.10 and transformers<=4.57.3, which clash with the "
            "workbook's tested torch 2.11 / transformers 5.12.1; it runs on those), or put a source "
            "checkout's python/ folder on PYTHONPATH")
JIT_HINT = ("run `python mini-sglang/scripts/00_check_env.py` to see what the tvm-ffi build needs "
            "(nvcc or CUDA_HOME, ninja, a host c++, a writable ~/.cache/tvm-ffi or TVM_FFI_CACHE_DIR)")
_BUILD_WORDS = re.compile(r"ninja|nvcc|compil|build|CUDA_HOME|cannot find -l|No such file|\.so:|Error building",
                          re.IGNORECASE)
REPEATS = 3          # repetitions of every judged measurement (common.judge.verdicts judges nothing on fewer)
EMBEDDING_KERNEL = "index_kernel"   # the embedding lookup is mini-SGLang's own gather (layers/embedding.py:32)


# ------------------------------------------------------------------ imports and first calls

def require_minisgl(part: str = "minisgl.kernel"):
    """torch, tvm-ffi and a mini-SGLang module, or one SetupError line saying how to install."""
    require_module("torch", "pip install -r requirements.txt")
    require_module("tvm_ffi", "pip install apache-tvm-ffi==0.1.11")
    return require_module(part, PIP_HINT)


def require_gpu_stack(part: str = "minisgl.kernel"):
    """(the mini-SGLang module ``part``, torch) on a machine with a CUDA GPU, or one SetupError line."""
    mod = require_minisgl(part)
    import torch
    require_gpu(torch)
    return mod, torch


def source_root() -> Path | None:
    """Folder of the importable `minisgl` package (a namespace package: no __init__.py)."""
    import importlib.util
    spec = importlib.util.find_spec("minisgl")
    locs = list(spec.submodule_search_locations or []) if spec else []
    return Path(locs[0]) if locs else None


def short_error(text: str) -> str:
    """The informative line of a (possibly very long) build error: the first 'error'/'cannot' line."""
    lines = [l.strip() for l in str(text).splitlines() if l.strip()]
    if not lines:
        return ""
    if _BUILD_WORDS.search(text):
        hit = next((l for l in lines if re.search(r"cannot find|fatal error|error:|undefined reference|No such file", l)),
                   next((l for l in lines if re.search(r"error|fatal|cannot", l, re.I)), lines[0]))
        if "lnccl" in text:
            hit += " (PyNCCL links with -lnccl: put a libnccl.so on LIBRARY_PATH; see reports/environment.md)"
        return hit[:300]
    return lines[0][:300]


def first_call(fn, label: str):
    """Call ``fn`` once (it JIT-builds a module on first use); a failed build becomes one SetupError line.
    Returns (result, seconds)."""
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as e:  # tvm-ffi raises RuntimeError with the whole ninja log
        text = str(e)
        if _BUILD_WORDS.search(text):
            raise SetupError(f"{label}: the JIT build failed ({short_error(text)}); {JIT_HINT}") from None
        raise
    return out, time.perf_counter() - t0


def mirror_nvtx(torch) -> None:
    """mini-SGLang names its ranges with torch.cuda.nvtx.range at call time (utils/torch_utils.py:23-37:
    Embedding, Layer_{i}, MHA, MLP, LMHead); route them through common.capture.ranges.nvtx_range so they are NVTX
    ranges AND torch-profiler record_function ranges (the trace then holds them as user annotations)."""
    from common.capture.ranges import nvtx_range
    torch.cuda.nvtx.range = lambda msg, *a, **k: nvtx_range(msg)


# ------------------------------------------------------------------ launch geometry
# index: kernel/index.py:41-47 (num_splits), index.cu:135-137 (grid), warp.cuh:25-33,42-59 (lanes)
# store: store.cu:41-49 (one warp = K row then V row of one token), :110-112 (grid)

def index_splits(row_bytes: int) -> int:
    """Warps per token that mini-SGLang's indexing() picks for a row of ``row_bytes``."""
    return 4 if row_bytes % 2048 == 0 else 2 if row_bytes % 1024 == 0 else 1


def lane_bytes(chunk: int) -> int:
    """Bytes one lane moves per step when a warp copies ``chunk`` bytes (0 = the build rejects it)."""
    for unit in (16, 8, 4):
        if chunk % (unit * 32) == 0:
            return unit
    return 0


def index_launch(tokens: int, row_bytes: int, threads: int = 128, splits: int | None = None) -> dict:
    """Grid, block and per-warp work of one indexing() call."""
    s = splits or index_splits(row_bytes)
    per_warp = row_bytes // s
    lane = lane_bytes(per_warp)
    warps = s * tokens
    wpb = threads // 32
    return {"num_splits": s, "warps_per_token": s, "bytes_per_warp": per_warp, "lane_bytes": lane,
            "steps_per_warp": per_warp // (lane * 32) if lane else 0, "warps": warps,
            "block": threads, "grid": -(-warps // wpb), "tokens_per_block": wpb / s}


def store_launch(tokens: int, row_bytes: int, threads: int = 128) -> dict:
    """Grid, block and per-warp work of one store_cache() call (K and V by the same warp)."""
    lane = lane_bytes(row_bytes)
    wpb = threads // 32
    return {"warps": tokens, "warps_per_token": 1, "block": threads, "grid": -(-tokens // wpb),
            "lane_bytes": lane, "steps_per_row": row_bytes // (lane * 32) if lane else 0, "launches": 1}


_INDEX_TPL = re.compile(r"index_kernel<(\d+)\w*, (\d+)\w*, (\w+), (\d+)\w*, (\d+)\w*, ([\w ]+)>")


def index_template(full_name: str) -> dict | None:
    """The template arguments of an index_kernel launch (index.cu:101-110): threads, min blocks per SM, PDL,
    row bytes, warps per row (num_splits), id type; None for another kernel."""
    m = _INDEX_TPL.search(full_name or "")
    if not m:
        return None
    t, mb, pdl, row, splits, idt = m.groups()
    return {"threads": int(t), "min_blocks": int(mb), "pdl": pdl, "row_bytes": int(row), "splits": int(splits),
            "id_type": idt.strip()}


def threads_launched(grid, block) -> int:
    """Threads of a launch from trace strings like '64x1x1' and '128x1x1' (0 when either is missing)."""
    if not isinstance(grid, str) or not isinstance(block, str) or not grid or not block:
        return 0
    return math.prod(int(x) for x in grid.split("x")) * math.prod(int(x) for x in block.split("x"))


def vocab_shard(vocab: int, tp: int, rank: int) -> tuple[int, int]:
    """(start, length) of the embedding rows rank ``rank`` of ``tp`` holds (layers/embedding.py:24-28)."""
    if not 0 <= rank < tp:
        raise ValueError(f"rank {rank} outside TP {tp}")
    per = -(-vocab // tp)
    start = min(rank * per, vocab)
    return start, min(start + per, vocab) - start


def ncu_coalescing(row: dict) -> dict:
    """Sectors per request of global loads and stores from an ncu raw row (dict of metric -> value).

    A warp whose 32 lanes each move ``u`` contiguous bytes touches 32*u/32 = u sectors of 32 B per
    request; that ideal divided by the measured ratio is the coalescing efficiency.
    """
    out = {}
    for op in ("ld", "st"):
        sec = row.get(f"l1tex__t_sectors_pipe_lsu_mem_global_op_{op}.sum")
        req = row.get(f"l1tex__t_requests_pipe_lsu_mem_global_op_{op}.sum")
        ok = isinstance(sec, (int, float)) and isinstance(req, (int, float)) and req and not math.isnan(req)
        out[f"{op}_sectors_per_request"] = sec / req if ok else math.nan
    return out


COALESCING_METRICS = ["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
                      "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum", "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
                      "smsp__warps_launched.sum"]


# ------------------------------------------------------------------ verdicts: facts, the ceiling premise

def fact(run, h, holds, evidence: str = "", premise=True, detail: str = "") -> str:
    """Record hypothesis ``h`` about a fact read from a deterministic code path (a kernel name, a launch count,
    a module in a cache), one bool per observation: all True -> confirmed, all False -> refuted, mixed or none
    -> inconclusive; a failed ``premise`` (a string saying which) -> inconclusive. Numbers are not facts: they
    go through run.judge (common.judge.verdicts, intervals of >= 3 repetitions)."""
    vals = [bool(v) for v in (holds if isinstance(holds, (list, tuple)) else [holds]) if v is not None]
    seen = f"holds in {sum(vals)} of {len(vals)} observation(s)" + (f"; {detail}" if detail else "")
    if premise is not True:
        verdict, seen = "inconclusive", f"{seen}; premise failed: {premise}"
    else:
        verdict = ("inconclusive" if not vals else "confirmed" if all(vals) else "refuted" if not any(vals)
                   else "inconclusive")
    run.observe(h.expected(), f"{h.quantity}: {seen}", verdict, evidence)
    run.summary["observations"][-1].update(hypothesis=h.id, source=h.source)   # as run.judge records carry them
    return verdict


# The premise of every '% of a ceiling' verdict (no value above 100% of the named ceiling) is common.capture.timing's
# within_ceiling; a verdict on effective bandwidth also needs every value to be a DRAM rate (a working set >= 4x L2):
# common.capture.timing.eff_premise. Both are used through this module's names, so a test can hold them back in one place.
within_ceiling = timing.within_ceiling
eff_premise = timing.eff_premise


# ------------------------------------------------------------------ the scripts' arguments and ncu tables

def at_least(low: int, what: str, reason: str):
    """An argparse type: an integer >= ``low`` (common.run.cli.positive_int first); a bad value is one line,
    'expected <what> >= <low> (<reason>), got ...'."""
    def parse(text: str) -> int:
        import argparse

        from common.run import cli
        v = cli.positive_int(text)
        if v < low:
            raise argparse.ArgumentTypeError(f"expected {what} >= {low} ({reason}), got {text!r}")
        return v
    parse.__name__ = "int"
    return parse


def ncu_read_back(kern):
    """An ncu_kernels table as a recording reads it back (common.run.recording): a stall note the run left empty is an
    empty cell, which pandas reads as NaN; '' again, as the analysis saw it (None stays None)."""
    if kern is not None and "stall_note" in kern:
        kern["stall_note"] = kern["stall_note"].fillna("")
    return kern


# ------------------------------------------------------------------ radix-cache workloads (pure Python)
# Token ids stay below 128000 (Llama-3 special tokens start there), as a real prompt's would.

def random_tokens(rng: random.Random, n: int, vocab: int = 128000) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def shared_prefix_requests(groups: int, per_group: int, prefix_len: int, suffix_len: int,
                           seed: int = 0, vocab: int = 128000) -> list[list[int]]:
    """``groups`` system prompts of ``prefix_len`` tokens, each followed by ``per_group`` distinct
    questions of ``suffix_len`` tokens (a radix tree of groups*(per_group+1) nodes once inserted).
    Suffixes start with distinct tokens so no two questions of a group share more than the prefix."""
    rng = random.Random(seed)
    out = []
    for _ in range(groups):
        prefix = random_tokens(rng, prefix_len, vocab)
        firsts = rng.sample(range(vocab), per_group)
        for j in range(per_group):
            out.append(prefix + [firsts[j]] + random_tokens(rng, suffix_len - 1, vocab))
    return out


def conversation(turns: int, turn_len: int, seed: int = 0, vocab: int = 128000) -> list[list[int]]:
    """A multi-turn chat: prompt k is prompt k-1 plus one more turn; inserted in order it makes a
    path of ``turns`` nodes, and the last prompt matches through all of them."""
    rng = random.Random(seed)
    prompts, cur = [], []
    for _ in range(turns):
        cur = cur + random_tokens(rng, turn_len, vocab)
        prompts.append(list(cur))
    return prompts


def first_mismatch(a, b) -> int:
    """Reference for fast_compare_key: index of the first differing element, or min(len) when
    one is a prefix of the other."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


# ------------------------------------------------------------------ several ranks on one host

# PyNCCL communicators a rank creates. They are never destroyed: on the H200 node (NCCL of torch
# 2.11) freeing one segfaulted in ncclCommWindowDeregister (symWindowDestroy), whichever rank got
# there first, after all its measurements were done. So workers keep() them, and _rank_entry leaves
# the process with os._exit once the result file is written (no destructors run; the driver frees
# the GPU memory at exit).
KEEP_ALIVE: list = []


def keep(obj):
    KEEP_ALIVE.append(obj)
    return obj


def _rank_entry(target, rank, world, port, outdir, args):
    """Child side: run target and leave rank<r>.json (result) or rank<r>.err (the error), then exit
    without running destructors (see KEEP_ALIVE)."""
    out = Path(outdir)
    code = 0
    try:
        res = target(rank, world, port, *args)
        (out / f"rank{rank}.json").write_text(json.dumps(res, default=str))
    except BaseException as e:  # noqa: BLE001 - everything must reach the parent
        import traceback
        (out / f"rank{rank}.err").write_text(f"{e.__class__.__name__}: {short_error(str(e)) or repr(e)}\n"
                                             f"{traceback.format_exc()}")
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_ranks(target, world: int, args: tuple, outdir, timeout_s: float = 300.0, log=print) -> list:
    """Run ``target(rank, world, port, *args)`` in ``world`` spawned processes; return their results.

    The port is chosen by the OS (common.capture.procs.free_port). Never leaves a process behind: if one rank fails
    or the whole run passes ``timeout_s``, the others are terminated (then killed), and a RuntimeError names
    the rank and its first error line.
    """
    import multiprocessing as mp
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    for f in outdir.glob("rank*.*"):
        f.unlink()
    port = free_port()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_entry, args=(target, r, world, port, str(outdir), args), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    t0 = time.time()
    failed = None
    try:
        while True:
            codes = [p.exitcode for p in procs]
            bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                failed = bad[0]
                break
            if all(c == 0 for c in codes):
                break
            if time.time() - t0 > timeout_s:
                raise RuntimeError(f"{world} ranks did not finish within {timeout_s:.0f} s "
                                   f"(still running: {[r for r, c in enumerate(codes) if c is None]}); stopped them")
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    if failed is not None:
        err = outdir / f"rank{failed}.err"
        first = err.read_text().splitlines()[0] if err.exists() else f"exit code {procs[failed].exitcode} (killed?)"
        raise RuntimeError(f"rank {failed} of {world} failed: {first[:300]}")
    return [json.loads((outdir / f"rank{r}.json").read_text()) for r in range(world)]
