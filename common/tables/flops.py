"""FLOPs and minimum DRAM bytes of every kernel class the workbook measures: the napkin math.

    prefill_flops([512], [512], hq=32, d=128)        # causal attention, one request
    decode_bytes([4096] * 32, hq=32, hkv=8, d=128)    # KV read once per decode step
    gemm_flops(m=512, n=6144, k=4096)                 # 2*m*n*k
    layer_work(models.config("llama-3.1-8b"), tokens=512, kv_lens=[512])   # every kernel class of a layer
    bus_bandwidth(bytes, seconds, world=2)            # (algbw, busbw) GB/s, NCCL-tests convention
    model_work(cfg, tokens=32, kv_lens=[600] * 32)    # one forward of the whole model: every layer + per-step classes
    step_floor(kernels, period_us, read_tb_s=3.16, bf16_tflops=818)   # a step's floor and where the rest went

Conventions (stated once, used everywhere):
  * a multiply-add is 2 FLOPs; attention is QK^T plus PV, so 4 * head_dim FLOPs per (query, key)
    pair and query head; a causal prefill's mask is aligned bottom-right (FlashInfer, SGLang and
    mini-SGLang all do this): query i of ``q`` new tokens on ``kv`` cached+new keys sees
    ``kv - q + i + 1`` keys;
  * bytes are the MINIMUM a kernel must move through DRAM: every input read once, every output
    written once, nothing re-read (achieved TB/s from these bytes is a lower bound on the traffic;
    ncu's dram__bytes is the measured traffic);
  * ``elem`` is the element size in bytes (bf16/fp16: 2);
  * functions take plain ints and lists and import nothing heavy: they are tested on a CPU.
"""
from __future__ import annotations

import math

# ------------------------------------------------------------------ attention


def causal_pairs(qo_len: int, kv_len: int) -> int:
    """(query, key) pairs of one causal request: q*(kv-q) keys of the prefix plus q*(q+1)/2 of the new part."""
    if qo_len < 0 or kv_len < qo_len:
        raise ValueError(f"causal attention needs 0 <= qo_len <= kv_len, got qo={qo_len} kv={kv_len}")
    return qo_len * (kv_len - qo_len) + qo_len * (qo_len + 1) // 2


def prefill_flops(qo_lens, kv_lens, hq: int, d: int, causal: bool = True) -> int:
    """Attention FLOPs of a batch: 4 * hq * d per (query, key) pair (QK^T and PV, 2 FLOPs per MAC)."""
    qo_lens, kv_lens = list(qo_lens), list(kv_lens)
    if len(qo_lens) != len(kv_lens):
        raise ValueError("qo_lens and kv_lens need one entry per request")
    pairs = sum(causal_pairs(q, k) if causal else q * k for q, k in zip(qo_lens, kv_lens))
    return 4 * hq * d * pairs


def prefill_bytes(qo_lens, kv_lens, hq: int, hkv: int, d: int, elem: int = 2) -> int:
    """Read Q and write O (q heads, new tokens), read K and V once (kv heads, every key)."""
    return 2 * sum(qo_lens) * hq * d * elem + 2 * sum(kv_lens) * hkv * d * elem


def decode_flops(kv_lens, hq: int, d: int) -> int:
    """One new query per request attending to all of its keys."""
    kv_lens = list(kv_lens)
    return prefill_flops([1] * len(kv_lens), kv_lens, hq, d, causal=False)


def decode_bytes(kv_lens, hq: int, hkv: int, d: int, elem: int = 2, index_bytes_per_token: int = 0) -> int:
    """K and V of every cached token read once, q read and o written (one row per request); with
    ``index_bytes_per_token`` the page-table entry each key costs (page size 1: an int32 per token)."""
    kv_lens = list(kv_lens)
    kv = sum(kv_lens)
    return kv * (2 * hkv * d * elem + index_bytes_per_token) + len(kv_lens) * 2 * hq * d * elem


# ------------------------------------------------------------------ dense layers

def gemm_flops(m: int, n: int, k: int) -> int:
    """C[m, n] = A[m, k] @ B[k, n]: m*n*k multiply-adds, 2 FLOPs each."""
    return 2 * m * n * k


def gemm_bytes(m: int, n: int, k: int, elem: int = 2) -> int:
    """A and B read once, C written once (a weight GEMM at small m is dominated by the k*n weight)."""
    return (m * k + k * n + m * n) * elem


def rmsnorm_bytes(tokens: int, hidden: int, elem: int = 2) -> int:
    """Read x, write y (tokens x hidden), read the weight once."""
    return 2 * tokens * hidden * elem + hidden * elem


def fused_add_rmsnorm_bytes(tokens: int, hidden: int, elem: int = 2) -> int:
    """residual += x; x = norm(residual): read x and residual, write both back, read the weight."""
    return 4 * tokens * hidden * elem + hidden * elem


def add_then_rmsnorm_bytes(tokens: int, hidden: int, elem: int = 2) -> int:
    """The unfused pair: an add kernel (read x and residual, write residual) then rmsnorm
    (read residual, write y, read the weight): one extra read and write of tokens x hidden."""
    return 3 * tokens * hidden * elem + rmsnorm_bytes(tokens, hidden, elem)


def silu_and_mul_bytes(tokens: int, intermediate: int, elem: int = 2) -> int:
    """Read gate and up (2 x intermediate), write one intermediate row per token."""
    return 3 * tokens * intermediate * elem


def silu_and_mul_flops(tokens: int, intermediate: int) -> int:
    """About 4 FLOPs per output element (exp counted as one; a rough figure, far below any roof)."""
    return 4 * tokens * intermediate


def rope_bytes(nnz: int, hq: int, hk: int, d: int, elem: int = 2, per_token_extra: int = 0) -> int:
    """q and k read once and written once (in place or not); ``per_token_extra``: the position id and/or
    the cos/sin cache row each token needs."""
    return 2 * nnz * (hq + hk) * d * elem + nnz * per_token_extra


def embedding_bytes(tokens: int, hidden: int, elem: int = 2, id_bytes: int = 8) -> int:
    """Gather one row per token (read and write tokens x hidden) plus the ids."""
    return 2 * tokens * hidden * elem + tokens * id_bytes


# ------------------------------------------------------------------ KV cache kernels

def store_bytes(tokens: int, row_bytes: int, idx_itemsize: int = 4) -> dict:
    """Scatter K and V of ``tokens`` new tokens into the cache (row_bytes = kv heads * head_dim * elem):
    both rows read and written once, plus the slot ids. {read, write, total}: ncu reports reads and
    writes apart, so both are kept."""
    read = 2 * tokens * row_bytes + tokens * idx_itemsize
    write = 2 * tokens * row_bytes
    return {"read": read, "write": write, "total": read + write}


def index_bytes(tokens: int, row_bytes: int, idx_itemsize: int, tokens_in: int | None = None) -> dict:
    """A gather of ``tokens`` rows: ids read, the rows read (``tokens_in`` when a masked lookup reads
    fewer rows than it writes), every output row written. {read, write, total}."""
    rows_in = tokens if tokens_in is None else tokens_in
    read = rows_in * row_bytes + tokens * idx_itemsize
    write = tokens * row_bytes
    return {"read": read, "write": write, "total": read + write}


# ------------------------------------------------------------------ collectives

def bus_bandwidth(nbytes: float, seconds: float, world: int, op: str = "all_reduce") -> tuple[float, float]:
    """(algbw, busbw) in GB/s, NCCL-tests convention: all-reduce busbw = algbw * 2(n-1)/n;
    all-gather and reduce-scatter busbw = algbw * (n-1)/n with ``nbytes`` the full (gathered) size."""
    if world < 1 or seconds <= 0:
        raise ValueError("world >= 1 and seconds > 0 needed")
    alg = nbytes / seconds / 1e9
    factor = {"all_reduce": 2 * (world - 1) / world, "all_gather": (world - 1) / world,
              "reduce_scatter": (world - 1) / world}[op]
    return alg, alg * factor


def intensity(flops: float, nbytes: float) -> float:
    """Arithmetic intensity in FLOP per DRAM byte (NaN when no bytes)."""
    return flops / nbytes if nbytes else math.nan


# ------------------------------------------------------------------ one transformer layer

def layer_work(cfg: dict, tokens: int, kv_lens, qo_lens=None, tp: int = 1, elem: int = 2) -> dict:
    """FLOPs and minimum bytes of every kernel class of one Llama/Qwen-style layer for a forward of
    ``tokens`` new tokens (prefill: qo_lens per request; decode: one token per request), plus the
    once-per-step classes (embedding, logits GEMM). ``cfg`` is a HF config dict (common.capture.models.config).

    Returns {class: {"flops": int, "bytes": int}} with classes qkv_proj, o_proj, gate_up_proj,
    down_proj, input_norm, post_norm, rope, kv_store, attention, act, and per step embedding, lm_head.
    GEMMs are split by tensor parallelism ``tp`` as Megatron does (column for qkv/gate_up, row for o/down).
    """
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hq, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // hq
    kv_lens = list(kv_lens)
    qo_lens = list(qo_lens) if qo_lens is not None else [1] * len(kv_lens)
    if sum(qo_lens) != tokens:
        raise ValueError(f"qo_lens sum to {sum(qo_lens)}, not tokens={tokens}")
    hq_l, hkv_l = hq // tp, max(hkv // tp, 1)
    qkv_n = (hq_l + 2 * hkv_l) * d
    out = {
        "qkv_proj": (gemm_flops(tokens, qkv_n, h), gemm_bytes(tokens, qkv_n, h, elem)),
        "o_proj": (gemm_flops(tokens, h, hq_l * d), gemm_bytes(tokens, h, hq_l * d, elem)),
        "gate_up_proj": (gemm_flops(tokens, 2 * inter // tp, h), gemm_bytes(tokens, 2 * inter // tp, h, elem)),
        "down_proj": (gemm_flops(tokens, h, inter // tp), gemm_bytes(tokens, h, inter // tp, elem)),
        "input_norm": (0, fused_add_rmsnorm_bytes(tokens, h, elem)),
        "post_norm": (0, fused_add_rmsnorm_bytes(tokens, h, elem)),
        "rope": (0, rope_bytes(tokens, hq_l, hkv_l, d, elem)),
        "kv_store": (0, store_bytes(tokens, hkv_l * d * elem)["total"]),
        "attention": (prefill_flops(qo_lens, kv_lens, hq_l, d),
                      prefill_bytes(qo_lens, kv_lens, hq_l, hkv_l, d, elem)),
        "act": (silu_and_mul_flops(tokens, inter // tp), silu_and_mul_bytes(tokens, inter // tp, elem)),
        "embedding": (0, embedding_bytes(tokens, h, elem)),
        "lm_head": (gemm_flops(len(kv_lens), v // tp, h), gemm_bytes(len(kv_lens), v // tp, h, elem)),
    }
    return {k: {"flops": f, "bytes": b} for k, (f, b) in out.items()}


# ------------------------------------------------------------------ a whole step: its floor and the gap above it

def model_work(cfg: dict, tokens: int, kv_lens, qo_lens=None, tp: int = 1, elem: int = 2) -> dict:
    """FLOPs and minimum bytes of one forward of the whole model: :func:`layer_work`'s per-layer classes times the
    layer count, plus the once-per-step classes (embedding, logits GEMM). {"flops", "bytes", "weight_bytes",
    "kv_bytes"}: at decode the bytes are the weights read once and every request's K and V read once (plus the
    activations, a few MB)."""
    w = layer_work(cfg, tokens, kv_lens, qo_lens, tp=tp, elem=elem)
    n = cfg["num_hidden_layers"]
    once = ("embedding", "lm_head")
    flops = sum(v["flops"] * (1 if k in once else n) for k, v in w.items())
    nbytes = sum(v["bytes"] * (1 if k in once else n) for k, v in w.items())
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hq, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // hq
    qkv_n = (hq // tp + 2 * max(hkv // tp, 1)) * d
    weights = (n * (h * qkv_n + hq // tp * d * h + 3 * h * inter // tp + 2 * h) + h + v // tp * h) * elem
    kv = sum(kv_lens) * 2 * n * max(hkv // tp, 1) * d * elem
    return {"flops": flops, "bytes": nbytes, "weight_bytes": weights, "kv_bytes": kv}


def roofline_s(nbytes, flops, read_tb_s: float, bf16_tflops: float) -> tuple[float, str]:
    """The least time a piece of work can take: its bytes over the DRAM read ceiling or its FLOPs over the bf16
    ceiling, whichever is longer, and which one binds ('read' or 'compute'). Unknown work (None, NaN) counts 0."""
    b = float(nbytes) if nbytes is not None and nbytes == nbytes else 0.0
    f = float(flops) if flops is not None and flops == flops else 0.0
    t_read, t_comp = b / (read_tb_s * 1e12), f / (bf16_tflops * 1e12)
    return (t_read, "read") if t_read >= t_comp else (t_comp, "compute")


# the parts of a step's time above its floor, in the order a reader meets them (step_floor)
GAP_PARTS = ("below ceiling", "small kernels", "GPU idle in step", "CPU not hidden")


def step_floor(kernels, period_us: float | None, read_tb_s: float, bf16_tflops: float) -> dict:
    """The floor of one step (the time it cannot beat on this GPU) and where the rest of its time goes.

    ``kernels``: the step's kernels in any order, each a dict with ``ts_us``, ``end_us``, ``dur_us``, ``bytes``,
    ``flops`` (its minimum work; None/NaN: unknown, counted 0) and ``main`` (True for the GEMM, logits and attention
    kernels that carry the step's work). ``period_us``: from this step's first kernel to the next step's first
    kernel (None: the step's own span, and no CPU part). Returns {"floor_us", "read_us" (all bytes over the read
    ceiling), "compute_us" (all FLOPs over the bf16 ceiling), "bound" (which of the two is longer), "bytes",
    "flops", "kernel_us", "span_us", "period_us", and the GAP_PARTS in µs}. The parts are a decomposition: floor +
    parts = period by construction (kernels that overlap make "GPU idle in step" smaller, never hidden)."""
    ks = list(kernels)
    if not ks:
        raise ValueError("a step needs at least one kernel")
    floor = below = small = 0.0
    nbytes = nflops = 0.0
    for k in ks:
        f_s, _ = roofline_s(k.get("bytes"), k.get("flops"), read_tb_s, bf16_tflops)
        floor += f_s * 1e6
        over = float(k["dur_us"]) - f_s * 1e6
        if k.get("main"):
            below += over
        else:
            small += over
        b, f = k.get("bytes"), k.get("flops")
        nbytes += float(b) if b is not None and b == b else 0.0
        nflops += float(f) if f is not None and f == f else 0.0
    kernel_us = sum(float(k["dur_us"]) for k in ks)
    span = max(float(k["end_us"]) for k in ks) - min(float(k["ts_us"]) for k in ks)
    period = span if period_us is None else float(period_us)
    read_us, comp_us = nbytes / (read_tb_s * 1e6), nflops / (bf16_tflops * 1e6)
    return {"floor_us": floor, "read_us": read_us, "compute_us": comp_us,
            "bound": "read" if read_us >= comp_us else "compute", "bytes": nbytes, "flops": nflops,
            "kernel_us": kernel_us, "span_us": span, "period_us": period, "below ceiling": below,
            "small kernels": small, "GPU idle in step": span - kernel_us,
            "CPU not hidden": (period - span) if period_us is not None else math.nan}
