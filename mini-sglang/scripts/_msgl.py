"""Helpers shared by the mini-SGLang scripts (private to mini-sglang/scripts/).

Only stdlib and common/ at import time, so every script's --help works on a CPU box; torch and
minisgl are imported inside the functions that need them. The pure parts (byte and FLOP
formulas, launch geometry, bus bandwidth, kernel order from a trace, radix workloads) are
tested on CPU in tests/test_minisgl_helpers.py against real fixtures.

    from _msgl import index_launch, index_bytes, launches_by_range, run_ranks, ...

The formulas restate, in our own words, what the pinned source does (cited next to each);
the scripts check them against what the hardware and the profilers report.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import random
import re
import socket
import sys
import time
from pathlib import Path

from common.checks import SetupError, require_module
from common.ncu import short_name
from common.trace import TraceError

COMMIT = "20fcd7f3c6a1898a61139fae1c97cc7a40bd8d66"
PIP_HINT = (f'pip install --no-deps "minisgl @ git+https://github.com/sgl-project/mini-sglang@{COMMIT}" '
            "(--no-deps: its pyproject pins torch<2.10 and transformers<=4.57.3, which clash with the "
            "workbook's tested torch 2.11 / transformers 5.12.1; it runs on those), or put a source "
            "checkout's python/ folder on PYTHONPATH")
# NVLink multicast (NVLS) stays off on the lent multi-GPU machines; set before any NCCL init.
NCCL_SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
JIT_HINT = ("run `python mini-sglang/scripts/00_check_env.py` to see what the tvm-ffi build needs "
            "(nvcc or CUDA_HOME, ninja, a host c++, a writable ~/.cache/tvm-ffi or TVM_FFI_CACHE_DIR)")
_BUILD_WORDS = re.compile(r"ninja|nvcc|compil|build|CUDA_HOME|cannot find -l|No such file|\.so:|Error building",
                          re.IGNORECASE)


# ------------------------------------------------------------------ imports and first calls

def require_minisgl(part: str = "minisgl.kernel"):
    """torch, tvm-ffi and a mini-SGLang module, or one SetupError line saying how to install."""
    require_module("torch", "pip install -r requirements.txt")
    require_module("tvm_ffi", "pip install apache-tvm-ffi==0.1.11")
    return require_module(part, PIP_HINT)


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
    """Call ``fn`` once (it JIT-builds a module on first use); a failed build becomes one SetupError line."""
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as e:  # tvm-ffi raises RuntimeError with the whole ninja log
        text = str(e)
        if _BUILD_WORDS.search(text):
            raise SetupError(f"{label}: the JIT build failed ({short_error(text)}); {JIT_HINT}") from None
        raise
    return out, time.perf_counter() - t0


def apply_nccl_safe_env(log=print) -> dict:
    """Force NVLink multicast off (NCCL NVLS, torch symmetric memory, NVSHMEM) before any NCCL init."""
    changed = {}
    for k, v in NCCL_SAFE_ENV.items():
        if os.environ.get(k) not in (None, v):
            log(f"note: {k}={os.environ[k]} overridden to {v} (NVLink multicast stays off)")
        os.environ[k] = v
        changed[k] = v
    return changed


# ------------------------------------------------------------------ launch geometry and bytes
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


def index_bytes(tokens: int, row_bytes: int, idx_itemsize: int, tokens_in: int | None = None) -> dict:
    """DRAM bytes one lookup must move: ids read, rows in range read, every output row written."""
    rows_in = tokens if tokens_in is None else tokens_in
    read = rows_in * row_bytes + tokens * idx_itemsize
    write = tokens * row_bytes
    return {"read": read, "write": write, "total": read + write}


def store_bytes(tokens: int, row_bytes: int, idx_itemsize: int) -> dict:
    """DRAM bytes of one KV scatter: K and V rows read and written once, slot ids read."""
    read = 2 * tokens * row_bytes + tokens * idx_itemsize
    write = 2 * tokens * row_bytes
    return {"read": read, "write": write, "total": read + write}


def vocab_shard(vocab: int, tp: int, rank: int) -> tuple[int, int]:
    """(start, length) of the embedding rows rank ``rank`` of ``tp`` holds (layers/embedding.py:24-28)."""
    if not 0 <= rank < tp:
        raise ValueError(f"rank {rank} outside TP {tp}")
    per = -(-vocab // tp)
    start = min(rank * per, vocab)
    return start, min(start + per, vocab) - start


def decode_attn_bytes(kv_lens, hq: int, hkv: int, head_dim: int, itemsize: int = 2, idx_itemsize: int = 4) -> int:
    """Bytes a decode step's attention must move: every cached K and V row once, the page indices,
    q read and o written (one token per request)."""
    kv = sum(kv_lens)
    return kv * (2 * hkv * head_dim * itemsize + idx_itemsize) + len(kv_lens) * 2 * hq * head_dim * itemsize


def prefill_attn_flops(q_lens, kv_lens, hq: int, head_dim: int) -> int:
    """Causal attention FLOPs (QK^T and PV, 2 FLOPs per multiply-add): query i of a request whose
    prefix is p = kv - q attends to p + i + 1 keys."""
    total = 0
    for q, kv in zip(q_lens, kv_lens):
        p = kv - q
        if p < 0:
            raise ValueError(f"q_len {q} > kv_len {kv}")
        keys = q * p + q * (q + 1) // 2
        total += 4 * hq * head_dim * keys
    return total


def prefill_attn_bytes(q_lens, kv_lens, hq: int, hkv: int, head_dim: int, itemsize: int = 2) -> int:
    """Minimum bytes of a prefill attention: q read, o written, each K/V row read once."""
    return sum(q * 2 * hq * head_dim * itemsize + kv * 2 * hkv * head_dim * itemsize
               for q, kv in zip(q_lens, kv_lens))


def bus_bandwidth(nbytes: float, seconds: float, world: int, op: str = "all_reduce") -> tuple[float, float]:
    """(algbw, busbw) in GB/s, NCCL-tests convention: all-reduce busbw = algbw * 2(n-1)/n,
    all-gather busbw = algbw * (n-1)/n with ``nbytes`` the gathered (output) size."""
    if world < 1 or seconds <= 0:
        raise ValueError("world >= 1 and seconds > 0 needed")
    alg = nbytes / seconds / 1e9
    factor = {"all_reduce": 2 * (world - 1) / world, "all_gather": (world - 1) / world}[op]
    return alg, alg * factor


# ------------------------------------------------------------------ traces: which kernels, in what order

GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
RANGE_CATS = ("user_annotation", "cpu_op")


def load_events(src) -> list[dict]:
    """The traceEvents of a torch-profiler Chrome trace (path, .gz, or an already loaded list)."""
    if isinstance(src, list):
        return src
    path = Path(src)
    try:
        raw = gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text()
    except OSError as e:
        raise TraceError(f"cannot read trace {path}: {e}") from None
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise TraceError(f"trace {path} is not valid JSON (truncated?): {e}") from None
    ev = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(ev, list) or not ev:
        raise TraceError(f"{path}: no traceEvents: not a torch-profiler Chrome trace")
    return ev


def launches_by_range(src, pattern: str, cats=RANGE_CATS) -> list[dict]:
    """For every CPU range whose name matches ``pattern`` (record_function / NVTX-mirrored ranges,
    or aten ops), the GPU work it launched, in GPU start order.

    A launch belongs to a range when its runtime call (cudaLaunchKernel, cudaLaunchKernelExC,
    cudaMemcpyAsync, ...) starts inside the range on the same thread; the GPU event is found by
    the runtime call's correlation id. Works for kernels launched outside aten (tvm-ffi, FlashInfer)
    which carry no 'External id'. Rows: range, range_index, range_start_us, order, kind, name,
    short, grid, block, stream, gpu_start_us, dur_us.
    """
    ev = load_events(src)
    rx = re.compile(pattern)
    ranges = [e for e in ev if e.get("ph") == "X" and e.get("cat") in cats and rx.search(e.get("name", ""))]
    gpu = {}
    for e in ev:
        kind = GPU_CATS.get(e.get("cat"))
        if kind and e.get("ph") == "X":
            c = (e.get("args") or {}).get("correlation")
            if c is not None:  # a CUDA-graph replay: many GPU events share the launch's correlation
                gpu.setdefault(c, []).append((kind, e))
    if not gpu:
        raise TraceError("the trace has no GPU events (was it recorded with CUDA activities?)")
    runtime = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")]
    runtime.sort(key=lambda e: e["ts"])
    rts = [e["ts"] for e in runtime]
    import bisect
    rows = []
    counts: dict[str, int] = {}
    for r in sorted(ranges, key=lambda e: e["ts"]):
        lo, hi = r["ts"], r["ts"] + r.get("dur", 0.0)
        i = bisect.bisect_left(rts, lo)
        found = []
        while i < len(runtime) and runtime[i]["ts"] <= hi:
            call = runtime[i]
            i += 1
            if call.get("tid") != r.get("tid") or call.get("pid") != r.get("pid"):
                continue
            c = (call.get("args") or {}).get("correlation")
            found.extend(gpu.get(c, ()))
        found.sort(key=lambda ke: ke[1]["ts"])
        idx = counts.get(r["name"], 0)
        counts[r["name"]] = idx + 1
        for n, (kind, g) in enumerate(found):
            a = g.get("args") or {}
            rows.append({"range": r["name"], "range_index": idx, "range_start_us": lo, "order": n, "kind": kind,
                         "name": g.get("name", ""), "short": short_name(g.get("name", "")) if kind == "kernel"
                         else g.get("name", ""), "grid": _dims(a.get("grid")), "block": _dims(a.get("block")),
                         "stream": a.get("stream"), "gpu_start_us": g["ts"], "dur_us": float(g.get("dur", 0.0))})
    return rows


def runtime_calls_in_ranges(src, pattern: str, call: str, cats=RANGE_CATS) -> list[tuple[str, int]]:
    """(range name, number of CUDA runtime/driver calls matching ``call``) for each range matching
    ``pattern``, in time order: e.g. how many cudaEventSynchronize a scheduler step makes."""
    ev = load_events(src)
    rx, cx = re.compile(pattern), re.compile(call)
    ranges = sorted((e for e in ev if e.get("ph") == "X" and e.get("cat") in cats and rx.search(e.get("name", ""))),
                    key=lambda e: e["ts"])
    calls = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
             and cx.search(e.get("name", ""))]
    return [(r["name"], sum(1 for c in calls if c.get("tid") == r.get("tid") and c.get("pid") == r.get("pid")
                            and r["ts"] <= c["ts"] <= r["ts"] + r.get("dur", 0.0))) for r in ranges]


def _dims(v) -> str:
    return "x".join(str(int(x)) for x in v) if isinstance(v, (list, tuple)) else ""


def threads_launched(grid: str, block: str) -> int:
    """Threads of a launch from trace strings like '64x1x1' and '128x1x1'."""
    if not grid or not block:
        return 0
    return math.prod(int(x) for x in grid.split("x")) * math.prod(int(x) for x in block.split("x"))


def kernel_period(names: list[str], min_period: int = 3, max_period: int = 80, min_repeats: int = 3,
                  anchor: str | None = None):
    """The repeating unit of a kernel sequence (e.g. the kernels of one transformer layer).

    Returns (period, block, start) for the period whose repetition covers the longest stretch
    (``names[i] == names[i + period]``), or (None, [], None) when nothing repeats
    ``min_repeats`` times. Shorter periods win ties, so a layer is not reported as two layers.
    ``anchor`` (a regex) rotates the block to begin at its first matching kernel (e.g. 'Norm').
    """
    best = (0, None, None)
    n = len(names)
    for p in range(min_period, min(max_period, n // 2) + 1):
        run = start = 0
        best_run, best_start = 0, 0
        for i in range(n - p):
            if names[i] == names[i + p]:
                if run == 0:
                    start = i
                run += 1
                if run > best_run:
                    best_run, best_start = run, start
            else:
                run = 0
        if best_run + p >= min_repeats * p and best_run > best[0]:
            best = (best_run, p, best_start)
    if best[1] is None:
        return None, [], None
    _, p, s = best
    block = names[s:s + p]
    if anchor:
        hit = next((i for i, n in enumerate(block) if re.search(anchor, n)), None)
        if hit:
            s += hit
            block = names[s:s + p] if s + p <= len(names) else block[hit:] + block[:hit]
    return p, block, s


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

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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

    Never leaves a process behind: if one rank fails or the whole run passes ``timeout_s``, the
    others are terminated (then killed), and a RuntimeError names the rank and its first error line.
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
