"""Private helpers of the FlashInfer scripts (01, 02, 03, 05, 07) — not a public module.

Pure Python at import time: torch and flashinfer are passed in by the caller, so the arithmetic
and parsing below are tested on a CPU box (tests/test_flashinfer_fi.py). What is here, and why it
is shared rather than copied into each script:

  shapes       head layouts of the model presets (common.models), paged-KV index arrays
  arithmetic   FLOPs and minimum DRAM bytes of causal prefill, decode and RoPE
  references   plain-torch attention (paged, GQA, causal bottom-right) and RoPE, for correctness
  plan_info    the planner's integer list -> named fields (split_kv, grid size, KV chunk)
  traces       the kernels launched inside each `record_function` range of a torch-profiler trace
  JIT          the modules in a FlashInfer cache folder, per-object compile times from .ninja_log
  bench        FlashInfer's own timer (flashinfer.testing.bench_gpu_time), for the cross-check
"""
from __future__ import annotations

import math
import re
from pathlib import Path

MERGE_RX = "MergeStates"          # split-KV merge kernels (PersistentVariableLength…, MergeState…)
ATTENTION_RX = "BatchDecode|BatchPrefillWithPagedKVCacheKernel|PrefillWithKVCacheKernel"


# ------------------------------------------------------------------ shapes

def head_layout(preset: str) -> dict:
    """Attention heads of a model preset: q heads, kv heads, head_dim, GQA group, RoPE settings."""
    from common import models
    c = models.config(preset)
    hq, hkv = c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or c["hidden_size"] // hq
    return {"model": preset, "hq": hq, "hkv": hkv, "d": d, "group": hq // hkv,
            "rope_theta": c.get("rope_theta", 1e4), "rope_scaling": c.get("rope_scaling")}


def page_table(kv_lens, page_size: int) -> tuple[list[int], list[int]]:
    """(kv_indptr, kv_last_page_len) for requests of ``kv_lens`` tokens in pages of ``page_size``."""
    indptr, last = [0], []
    for n in kv_lens:
        if n < 1:
            raise ValueError(f"a paged request needs at least one KV token, got {n}")
        pages = -(-n // page_size)
        indptr.append(indptr[-1] + pages)
        last.append(n - (pages - 1) * page_size)
    return indptr, last


def make_paged_kv(torch, kv_lens, hkv: int, d: int, page_size: int = 16, dtype=None,
                  shuffle: bool = False, seed: int = 0):
    """A random NHD paged cache [pages, 2, page_size, hkv, d] and its int32 index tensors (on the GPU).

    ``shuffle`` scatters the pages (exercises the page-table indirection; used for correctness).
    """
    dtype = dtype or torch.bfloat16
    indptr, last = page_table(kv_lens, page_size)
    n_pages = indptr[-1]
    g = torch.Generator(device="cuda").manual_seed(seed)
    cache = torch.randn(n_pages, 2, page_size, hkv, d, device="cuda", dtype=dtype, generator=g)
    order = torch.randperm(n_pages, device="cuda", generator=g) if shuffle else torch.arange(n_pages, device="cuda")
    i32 = dict(device="cuda", dtype=torch.int32)
    return cache, torch.tensor(indptr, **i32), order.to(torch.int32), torch.tensor(last, **i32)


def gather_kv(cache, indptr, indices, last, b: int):
    """K and V of request ``b`` from a paged NHD cache: two [kv_len, hkv, d] tensors."""
    pages = indices[int(indptr[b]):int(indptr[b + 1])].long()
    page_size = cache.shape[2]
    n = (len(pages) - 1) * page_size + int(last[b])
    k = cache[pages, 0].reshape(-1, *cache.shape[3:])[:n]
    v = cache[pages, 1].reshape(-1, *cache.shape[3:])[:n]
    return k, v


# ------------------------------------------------------------------ arithmetic (napkin math)

def causal_pairs(qo_len: int, kv_len: int) -> int:
    """(query, key) pairs a causal request computes, mask aligned bottom-right as FlashInfer does:
    query i (0-based) of ``qo_len`` new tokens sees ``kv_len - qo_len + i + 1`` keys."""
    if qo_len < 0 or kv_len < qo_len:
        raise ValueError(f"causal prefill needs 0 <= qo_len <= kv_len, got qo={qo_len} kv={kv_len}")
    return qo_len * (kv_len - qo_len) + qo_len * (qo_len + 1) // 2


def prefill_flops(qo_lens, kv_lens, hq: int, d: int, causal: bool = True) -> int:
    """QK^T and PV: 2 matmuls x 2 FLOP per multiply-add x head_dim, per (query, key) pair and q head."""
    if len(qo_lens) != len(kv_lens):
        raise ValueError("qo_lens and kv_lens must have one entry per request")
    pairs = sum(causal_pairs(q, k) if causal else q * k for q, k in zip(qo_lens, kv_lens))
    return 4 * hq * d * pairs


def prefill_bytes(qo_lens, kv_lens, hq: int, hkv: int, d: int, elem: int = 2) -> int:
    """Minimum DRAM traffic: read Q, write O (q heads), read K and V once (kv heads)."""
    return 2 * sum(qo_lens) * hq * d * elem + 2 * sum(kv_lens) * hkv * d * elem


def decode_flops(kv_lens, hq: int, d: int) -> int:
    """One query token per request attending to all of its keys."""
    return prefill_flops([1] * len(kv_lens), list(kv_lens), hq, d, causal=False)


def decode_bytes(kv_lens, hq: int, hkv: int, d: int, elem: int = 2) -> int:
    """Read each request's K and V once, plus its q row and the output row."""
    return prefill_bytes([1] * len(kv_lens), list(kv_lens), hq, hkv, d, elem)


def rope_bytes(nnz: int, hq: int, hk: int, d: int, elem: int = 2, per_token_extra: int = 0) -> int:
    """RoPE reads q and k once and writes them once (in place or not); ``per_token_extra`` adds the
    position id and/or the fp32 cos/sin cache row each token needs."""
    return 2 * nnz * (hq + hk) * d * elem + nnz * per_token_extra


def intensity(flops: float, nbytes: float) -> float:
    return flops / nbytes if nbytes else math.nan


# ------------------------------------------------------------------ torch references

def ref_attention(torch, q, k, v, causal: bool):
    """softmax(q k^T / sqrt(d)) v in float32 for ONE request. q [qo, hq, d]; k, v [kv, hkv, d].
    GQA: q head h reads kv head h // (hq / hkv). Causal mask aligned bottom-right."""
    qo, hq, d = q.shape
    kv, hkv = k.shape[0], k.shape[1]
    g = hq // hkv
    kf = k.float().repeat_interleave(g, dim=1)
    vf = v.float().repeat_interleave(g, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.float(), kf) / math.sqrt(d)
    if causal:
        i = torch.arange(qo, device=q.device)[:, None]
        j = torch.arange(kv, device=q.device)[None, :]
        s = s.masked_fill(j > kv - qo + i, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), vf)


def rel_err(got, ref) -> float:
    """||got - ref|| / ||ref|| in float32 (NaN if anything is not finite)."""
    g, r = got.float(), ref.float()
    e = ((g - r).norm() / r.norm().clamp_min(1e-30)).item()
    return e if math.isfinite(e) else math.nan


def rope_freqs(torch, rotary_dim: int, theta: float, scale: float = 1.0, llama31: dict | None = None):
    """Inverse frequencies as FlashInfer computes them (pos_enc.cuh); ``llama31`` = {low_freq_factor,
    high_freq_factor, old_context_len} blends scaled and unscaled frequencies (Llama-3.1 RoPE)."""
    i = torch.arange(rotary_dim // 2, device="cuda", dtype=torch.float64)
    f = theta ** (-2 * i / rotary_dim)
    if llama31 is None:
        return (f / scale).float()
    lo, hi, old = llama31["low_freq_factor"], llama31["high_freq_factor"], llama31["old_context_len"]
    smooth = (f * old / (2 * math.pi * (hi - lo)) - 1.0 / (hi / lo - 1.0)).clamp(0, 1)
    return ((1 - smooth) * f / scale + smooth * f).float()


def ref_rope(torch, x, pos, freqs):
    """NeoX-style RoPE (non-interleaved halves) of x [nnz, heads, d] at positions pos [nnz], in float32;
    dims past 2 * len(freqs) pass through unchanged."""
    r = 2 * freqs.shape[0]
    ang = pos.double()[:, None] * freqs.double()[None, :]
    cos, sin = ang.cos().float()[:, None, :], ang.sin().float()[:, None, :]
    xf = x.float()
    x1, x2 = xf[..., : r // 2], xf[..., r // 2: r]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, xf[..., r:]], dim=-1)


# RoPE entry points: name -> (how positions are given, Llama-3.1 scaling, kernel the source reading
# predicts; analysis.md section 11). The *_inplace twins of the first four run the same kernels.
ROPE_APIS = {
    "apply_rope": ("indptr+offsets", False, "BatchQKApplyRotaryKernel"),
    "apply_rope_pos_ids": ("pos_ids", False, "BatchQKApplyRotaryPosIds(HeadParallelism)?Kernel"),
    "apply_llama31_rope": ("indptr+offsets", True, "BatchQKApplyRotaryKernel"),
    "apply_llama31_rope_pos_ids": ("pos_ids", True, "BatchQKApplyRotaryPosIdsKernel"),
    "apply_rope_with_cos_sin_cache": ("cos/sin cache", True, "BatchQKApplyRotaryPosIdsCosSinCache(HeadParallelism)?Kernel"),
    "apply_rope_with_cos_sin_cache_inplace": ("cos/sin cache", True,
                                              "BatchQKApplyRotaryPosIdsCosSinCache(HeadParallelism)?Kernel"),
}


def llama31_params(lay: dict) -> dict:
    """Llama-3.1 RoPE scaling of a preset, in FlashInfer's argument names."""
    rs = lay.get("rope_scaling") or {}
    return {"rope_scale": rs.get("factor", 8.0), "low_freq_factor": rs.get("low_freq_factor", 1.0),
            "high_freq_factor": rs.get("high_freq_factor", 4.0),
            "old_context_len": rs.get("original_max_position_embeddings", 8192)}


def rope_setup(torch, nnz: int, lay: dict, req_tokens: int = 1024, offsets=None, seed: int = 0) -> dict:
    """Inputs for every RoPE API: q [nnz, hq, d], k [nnz, hkv, d] (bf16), requests of ``req_tokens``
    (indptr/offsets, int32), the positions they imply (int64), and an fp32 cos/sin cache built with
    the preset's Llama-3.1 frequencies (what a server precomputes)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(nnz, lay["hq"], lay["d"], device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(nnz, lay["hkv"], lay["d"], device="cuda", dtype=torch.bfloat16, generator=g)
    lens = [min(req_tokens, nnz - s) for s in range(0, nnz, req_tokens)]
    offs = list(offsets) if offsets is not None else [0] * len(lens)
    indptr = [0]
    for n in lens:
        indptr.append(indptr[-1] + n)
    pos = torch.cat([torch.arange(n, device="cuda") + o for n, o in zip(lens, offs)]).to(torch.int64)
    l31 = llama31_params(lay)
    f31 = rope_freqs(torch, lay["d"], lay["rope_theta"], l31["rope_scale"], l31)
    max_pos = int(pos.max()) + 1
    ang = torch.arange(max_pos, device="cuda", dtype=torch.float64)[:, None] * f31.double()[None, :]
    i32 = dict(device="cuda", dtype=torch.int32)
    return {"q": q, "k": k, "indptr": torch.tensor(indptr, **i32), "offsets": torch.tensor(offs, **i32),
            "pos": pos, "cos_sin": torch.cat([ang.cos(), ang.sin()], dim=-1).float(), "l31": l31, "lay": lay,
            "freqs": rope_freqs(torch, lay["d"], lay["rope_theta"]), "freqs31": f31, "batch": len(lens)}


def rope_call(fi, name: str, s: dict):
    """A no-argument callable for RoPE API ``name`` on inputs ``s`` (rope_setup); returns (q_out, k_out)
    as [nnz, heads, d] views (the inputs themselves for the in-place API)."""
    q, k, th, l31, d = s["q"], s["k"], s["lay"]["rope_theta"], s["l31"], s["lay"]["d"]
    nnz = q.shape[0]
    if name == "apply_rope":
        return lambda: fi.apply_rope(q, k, s["indptr"], s["offsets"], rope_theta=th)
    if name == "apply_rope_pos_ids":
        return lambda: fi.apply_rope_pos_ids(q, k, s["pos"], rope_theta=th)
    if name == "apply_llama31_rope":
        return lambda: fi.apply_llama31_rope(q, k, s["indptr"], s["offsets"], rope_theta=th, **l31)
    if name == "apply_llama31_rope_pos_ids":
        return lambda: fi.apply_llama31_rope_pos_ids(q, k, s["pos"], rope_theta=th, **l31)
    q2, k2 = q.view(nnz, -1), k.view(nnz, -1)
    if name == "apply_rope_with_cos_sin_cache":
        def out_of_place():
            qo, ko = fi.apply_rope_with_cos_sin_cache(s["pos"], q2, k2, d, s["cos_sin"], True)
            return qo.view_as(q), ko.view_as(k)
        return out_of_place
    if name == "apply_rope_with_cos_sin_cache_inplace":
        def in_place():
            fi.apply_rope_with_cos_sin_cache_inplace(s["pos"], q2, k2, d, s["cos_sin"], True)
            return q, k
        return in_place
    raise KeyError(f"unknown RoPE API {name!r}; choose from {', '.join(ROPE_APIS)}")


def rope_check(torch, fi, name: str, s: dict) -> float:
    """Worst relative error of RoPE API ``name`` against ref_rope (inputs cloned: in-place APIs mutate)."""
    q0, k0 = s["q"].clone(), s["k"].clone()
    qo, ko = rope_call(fi, name, {**s, "q": s["q"].clone(), "k": s["k"].clone()})()
    freqs = s["freqs31"] if ROPE_APIS[name][1] else s["freqs"]
    return max(rel_err(qo, ref_rope(torch, q0, s["pos"], freqs)), rel_err(ko, ref_rope(torch, k0, s["pos"], freqs)))


# ------------------------------------------------------------------ plan_info

class PlanInfoError(ValueError):
    """A plan_info list that does not have the layout of this FlashInfer version."""


DECODE_PLAN_FIELDS = ("padded_batch_size", "v_offset", "s_offset", "request_indices_offset",
                      "kv_tile_indices_offset", "o_indptr_offset", "block_valid_mask_offset",
                      "kv_chunk_size_ptr_offset", "enable_cuda_graph", "split_kv")
PREFILL_PLAN_FIELDS = ("padded_batch_size", "total_num_rows", "total_num_rows_offset", "cta_tile_q",
                       "request_indices_offset", "qo_tile_indices_offset", "kv_tile_indices_offset",
                       "merge_indptr_offset", "o_indptr_offset", "kv_chunk_size_ptr_offset", "v_offset",
                       "s_offset", "block_valid_mask_offset", "enable_cuda_graph", "split_kv")
SM90_PLAN_FIELDS = ("qo_tile_indices_offset", "qo_indptr_offset", "kv_indptr_offset", "qo_len_offset",
                    "kv_len_offset", "head_indices_offset", "work_indptr_offset", "batch_indices_offset",
                    "same_schedule_for_all_heads")
_LAYOUTS = {10: ("decode (CUDA cores)", DECODE_PLAN_FIELDS), 15: ("prefill fa2", PREFILL_PLAN_FIELDS),
            9: ("prefill fa3 (sm90)", SM90_PLAN_FIELDS)}


def decode_plan_info(values, pinned: bytes | None = None) -> dict:
    """Name the integers of ``wrapper._plan_info`` (scheduler.cuh: DecodePlanInfo / PrefillPlanInfo /
    PrefillPlanSM90Info, told apart by their length). With the wrapper's pinned host int buffer
    (``bytes``) the KV chunk size in tokens is read too (no GPU sync: the planner wrote it there)."""
    vals = [int(v) for v in values]
    if len(vals) not in _LAYOUTS:
        raise PlanInfoError(f"plan_info has {len(vals)} entries; this FlashInfer version writes 10 (decode), "
                            f"15 (fa2 prefill / tensor-core decode) or 9 (fa3)")
    kind, fields = _LAYOUTS[len(vals)]
    out = {"layout": kind, **dict(zip(fields, vals))}
    if "split_kv" in out:
        out["split_kv"] = bool(out["split_kv"])
        if pinned is not None:
            out["kv_chunk_tokens"] = read_i32(pinned, out["kv_chunk_size_ptr_offset"])
    return out


def read_i32(buf: bytes, offset: int) -> int:
    """A little-endian int32 at byte ``offset`` of ``buf`` (the planner's host-side int workspace)."""
    if offset < 0 or offset + 4 > len(buf):
        raise PlanInfoError(f"offset {offset} is outside the {len(buf)}-byte buffer")
    return int.from_bytes(bytes(buf[offset:offset + 4]), "little", signed=True)


def plan_facts(wrapper) -> dict:
    """What plan() decided, read from a wrapper after plan(): layout, grid size, split, chunk, backend."""
    try:
        vals = [int(v) for v in wrapper._plan_info]
    except Exception as e:  # private attribute: keep the run going if a version changes it
        return {"plan_info": f"unreadable ({e.__class__.__name__})"}
    info = decode_plan_info(vals)
    off = info.get("kv_chunk_size_ptr_offset")
    if off is not None:  # the planner wrote the chunk size into the pinned host buffer: no GPU sync
        raw = bytes(wrapper._pin_memory_int_workspace_buffer[off:off + 4].tolist())
        info["kv_chunk_tokens"] = read_i32(raw, 0)
    keep = ("layout", "padded_batch_size", "cta_tile_q", "split_kv", "kv_chunk_tokens", "same_schedule_for_all_heads")
    out = {k: info[k] for k in keep if k in info}
    out["backend"] = getattr(wrapper, "_backend", None)
    return out


def grid_dims(text) -> tuple[int, ...] | None:
    """ncu's 'Grid Size' / 'Block Size' cell '(128, 8, 1)' -> (128, 8, 1); None when absent."""
    nums = re.findall(r"\d+", str(text or "").replace(",", " ") if "(" in str(text) else "")
    return tuple(int(n) for n in nums) if nums else None


KERNEL_COLUMNS = ("kernel", "grid", "block", "time_us", "dram_tb_s", "pct_peak_dram", "dram_pct", "sm_pct",
                  "tensor_pct", "occupancy_pct", "theoretical_occupancy_pct", "limiter", "l2_hit_pct", "top_stalls")


def compact_kernels(kern, point_cols):
    """The report-sized view of a common.ncu.summarize() table: the point's labels, then the columns
    a reader compares (the full table, with every stall column, is written beside it)."""
    cols = [c for c in (*point_cols, *KERNEL_COLUMNS) if c in kern.columns]
    return kern[cols]


# ------------------------------------------------------------------ traces: kernels per call

_CALL = re.compile(r"^(?P<label>.*?)\s*#(?P<call>\d+)$")


def split_label(name: str) -> tuple[str, int]:
    """'decode cuda b=32 kv=4096 #2' -> ('decode cuda b=32 kv=4096', 2); no '#n' suffix -> (name, 0)."""
    m = _CALL.match(name)
    return (m.group("label"), int(m.group("call"))) if m else (name, 0)


def kernels_in_ranges(ev, pattern: str):
    """Every kernel launched inside each CPU range (record_function / NVTX via common.ranges) whose
    name matches ``pattern``, from a common.trace event table.

    A kernel belongs to a range when the runtime call that launched it (same correlation id; a CUDA
    graph replay lends its id to all its kernels) started inside the range on the range's thread.
    Copies and memsets launched there are rows too (gpu_kind memcpy / memset; kernel = their name).
    Returns one row per (range, GPU event): range, label, call, range_ts_us, gpu_kind, kernel (short
    name), full_name, dur_us, ts_us.
    Ranges that launched nothing get one row with kernel None. Raises TraceError when no range matches.
    """
    import pandas as pd

    from common.trace import TraceError
    rx = re.compile(pattern)
    rng = ev[(ev["kind"] == "user_annotation") & ev["name"].str.contains(rx)]
    if rng.empty:
        raise TraceError(f"no user range in the trace matches {pattern!r}: were the calls wrapped "
                         "in record_function / common.ranges.nvtx_range while the profiler ran?")
    rt = ev[(ev["kind"] == "runtime") & ev["correlation"].notna()][["ts_us", "tid", "correlation"]]
    k = ev[ev["kind"].isin(["kernel", "memcpy", "memset"]) & ev["correlation"].notna()][
        ["kind", "short", "name", "ts_us", "dur_us", "correlation"]]
    k = k.merge(rt.rename(columns={"ts_us": "launch_us", "tid": "launch_tid"}), on="correlation", how="inner")
    rows = []
    for r in rng.itertuples():
        label, call = split_label(r.name)
        inside = k[(k["launch_us"] >= r.ts_us) & (k["launch_us"] < r.end_us) & (k["launch_tid"] == r.tid)]
        base = {"range": r.name, "label": label, "call": call, "range_ts_us": r.ts_us}
        if inside.empty:
            rows.append({**base, "gpu_kind": None, "kernel": None, "full_name": None, "dur_us": 0.0, "ts_us": math.nan})
        for kk in inside.sort_values("ts_us").itertuples():
            rows.append({**base, "gpu_kind": kk.kind, "kernel": kk.short, "full_name": kk.name, "dur_us": kk.dur_us,
                         "ts_us": kk.ts_us})
    return pd.DataFrame(rows, columns=["range", "label", "call", "range_ts_us", "gpu_kind", "kernel", "full_name",
                                       "dur_us", "ts_us"])


def calls_summary(rows):
    """Per label: calls seen, kernels per call (median), kernel names in launch order, copies/memsets
    per call and their names, whether a split-KV merge kernel ran and its share of the call's kernel
    time, kernel time per call, and whether a PyTorch fill kernel ran (FillFunctor: torch.zeros)."""
    import pandas as pd
    out = []
    for label, all_ in rows.groupby("label", sort=False):
        calls = all_["range_ts_us"].nunique()
        g = all_[all_["gpu_kind"].isin(["kernel"]) | all_["gpu_kind"].isna()]
        cp = all_[all_["gpu_kind"].isin(["memcpy", "memset"])]
        counts = g.groupby("range_ts_us")["kernel"].count().reindex(all_["range_ts_us"].unique(), fill_value=0)
        names = list(dict.fromkeys(n for n in g.sort_values(["range_ts_us", "ts_us"])["kernel"] if n))
        merge = g[g["kernel"].fillna("").str.contains(MERGE_RX)]
        tot = g["dur_us"].sum()
        out.append({"label": label, "calls": calls, "kernels_per_call": float(counts.median()),
                    "kernels": " + ".join(names), "copies_per_call": len(cp) / calls if calls else 0.0,
                    "copies": " + ".join(dict.fromkeys(cp["kernel"])), "merge_kernel": bool(len(merge)),
                    "merge_share_pct": 100 * merge["dur_us"].sum() / tot if tot else 0.0,
                    "fill_kernel": bool(g["full_name"].fillna("").str.contains("FillFunctor").any()),
                    "kernel_us_per_call": tot / calls if calls else math.nan})
    return pd.DataFrame(out)


def capture_calls(torch, calls, path, reps: int = 3) -> Path:
    """Run each (label, fn) ``reps`` times under torch.profiler, each call in a range "label #i",
    and write the Chrome trace to ``path`` (read it back with common.trace.read_chrome_trace)."""
    from torch.profiler import ProfilerActivity, profile

    from common.ranges import nvtx_range
    for _label, fn in calls:  # warm: lazy buffers (ALiBi slopes, outputs) are built outside the trace
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for label, fn in calls:
            for i in range(reps):
                with nvtx_range(f"{label} #{i}"):
                    fn()
            torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))
    return Path(path)


# ------------------------------------------------------------------ JIT cache

class NinjaLogError(ValueError):
    """A file that is not a ninja build log."""


def parse_ninja_log(text: str):
    """``.ninja_log`` (v5-v7: '# ninja log vN' then start_ms, end_ms, mtime, output, hash per line)
    -> DataFrame output, start_ms, end_ms, seconds; the last entry wins when an output was rebuilt."""
    import pandas as pd
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# ninja log v"):
        raise NinjaLogError("not a .ninja_log: the first line should read '# ninja log vN'")
    rows = {}
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip() or line.startswith("#"):
            continue
        f = line.split("\t")
        if len(f) != 5 or not (f[0].isdigit() and f[1].isdigit()):
            raise NinjaLogError(f".ninja_log line {n} has {len(f)} fields, expected 5 (start, end, mtime, "
                                f"output, hash): {line[:80]!r}")
        rows[f[3]] = {"output": f[3], "start_ms": int(f[0]), "end_ms": int(f[1]),
                      "seconds": (int(f[1]) - int(f[0])) / 1e3}
    return pd.DataFrame(list(rows.values()), columns=["output", "start_ms", "end_ms", "seconds"])


def jit_modules(jit_dir) -> list[dict]:
    """Compiled modules in a FlashInfer JIT folder (cached_ops/): name, .so size, objects, build span."""
    out = []
    d = Path(jit_dir)
    if not d.is_dir():
        return out
    for m in sorted(p for p in d.iterdir() if p.is_dir() and p.name != "tmp"):
        so = m / f"{m.name}.so"
        row = {"module": m.name, "compiled": so.is_file(), "so_mb": round(so.stat().st_size / 1e6, 2) if so.is_file() else None,
               "objects": len(list(m.glob("*.o"))), "so_mtime": so.stat().st_mtime if so.is_file() else None}
        log = m / ".ninja_log"
        if log.is_file():
            try:
                nl = parse_ninja_log(log.read_text(errors="replace"))
                objs = nl[nl["output"].str.endswith(".o")]
                row.update(nvcc_sum_s=round(objs["seconds"].sum(), 1), nvcc_max_s=round(objs["seconds"].max(), 1)
                           if len(objs) else None, build_span_s=round((nl["end_ms"].max() - nl["start_ms"].min()) / 1e3, 1)
                           if len(nl) else None)
            except NinjaLogError as e:
                row["ninja_log"] = str(e)
        out.append(row)
    return out


def short_module(name: str) -> str:
    """A readable label for a long attention uri (the full name stays in the tables)."""
    kind = ("batch_decode" if name.startswith("batch_decode") else
            "batch_prefill" if name.startswith("batch_prefill") else name)
    if kind == name:
        return name
    return kind + ("_sm90 (fa3)" if name.endswith("_sm90") else "")


# ------------------------------------------------------------------ FlashInfer's own timer

def load_bench_gpu_time(log):
    """flashinfer.testing.bench_gpu_time. flashinfer.testing imports einops at module level although
    the timer does not use it; where einops is missing a stub module stands in (said in the log)."""
    import importlib
    import sys
    import types
    try:
        return importlib.import_module("flashinfer.testing").bench_gpu_time
    except ModuleNotFoundError as e:
        if e.name != "einops":
            raise
        stub = types.ModuleType("einops")

        def _missing(*_a, **_k):
            raise NotImplementedError("einops is a stub here (not installed)")
        for n in ("rearrange", "reduce", "repeat"):
            setattr(stub, n, _missing)
        sys.modules["einops"] = stub
        log("note: einops is not installed; a stub stands in so that flashinfer.testing imports "
            "(bench_gpu_time does not use einops)")
        return importlib.import_module("flashinfer.testing").bench_gpu_time


def cupti_python() -> str | None:
    """Why FlashInfer's CUPTI timer cannot run here (None when cupti-python >= 13 imports)."""
    try:
        from importlib.metadata import version
        from cupti import cupti  # noqa: F401
        v = version("cupti-python")
    except Exception as e:  # noqa: BLE001  (ModuleNotFoundError, or a broken install)
        return f"cupti-python unavailable ({e.__class__.__name__}: {str(e)[:80]}); pip install cupti-python"
    return None if int(v.split(".")[0]) >= 13 else f"cupti-python {v} < 13"


class SmClock:
    """Mean SM clock (MHz, NVML, sampled every 2 ms) while the block runs; nan without NVML."""

    def __enter__(self):
        import threading
        self.samples, self._stop = [], threading.Event()
        try:
            import pynvml
            pynvml.nvmlInit()
            import torch
            h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            read = lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)  # noqa: E731
            read()
        except Exception:  # noqa: BLE001
            self._t = None
            return self

        def loop():
            while not self._stop.wait(0.002):
                self.samples.append(read())
        self._t = threading.Thread(target=loop, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._t is not None:
            self._t.join()

    @property
    def mhz(self) -> float:
        return sum(self.samples) / len(self.samples) if self.samples else math.nan


def cross_check(bench_gpu_time, run_fn, args: tuple, bench) -> dict:
    """Time ``run_fn(*args)`` with FlashInfer's bench_gpu_time and with the workbook's timer.

    The verdict compares like with like: the same instrument (CUPTI kernel timestamps) and the same
    L2 preparation. Reference: bench_gpu_time's CUPTI mode (``cupti_graph``: first kernel start to
    last kernel end of one call; replayed from a CUDA graph, so no host gap between a call's
    launches can enter the span), which cools the L2 by writing a buffer before each call (dirty
    lines left behind); against it the workbook's timer with the same
    write-only flush (``workbook_write_flush_ms``). ``ratio`` = workbook_write_flush_ms / reference.
    Also recorded, so that each tool's default can be read against the other:
      ratio_default - the workbook's default number (L2 written then read: clean) / reference; the
               difference is the write-back of the dirty lines, which a kernel that already reads
               DRAM near its peak pays for (tensor-core decode b32 x kv4096: 5-7% on an H200 and an H100);
      graph_spaced / graph_spaced_1 - CUDA graph with ``sleep_after_run`` (idle after each replay),
               n calls per replay (as many as fit ~2 ms, 1 to 10) and 1 call per replay: events
               around a replay that starts from idle include the host's launch of the graph, so
               ``spaced_replay_overhead_us`` = (graph_spaced_1 - graph_spaced) * n / (n - 1) is that
               cost per replay (graph_spaced carries 1/n of it per call);
      graph  - its defaults (10 calls per replay, back to back): the sustained-load number;
      events - CUDA events around each Python call (adds the launch path).
    Its CUPTI mode runs twice and the second reading is the reference: the first cupti-python
    session of each shape read 2.08-2.19x the kernel (2026-11-21, three H200s and one H100: 21 of 21
    shapes, with or without a graph), longer than bench_gpu_time's own events around the same call,
    which the kernel itself cannot be; the sessions after it agreed with the workbook's CUPTI at the
    same flush within 1.9% on every shape. The cause was not isolated (torch.profiler, also CUPTI,
    had run in those processes before); ``bgt_cupti_graph_first_ms`` keeps the first reading.
    Without cupti-python (>= 13) the reference falls back to graph_spaced, compared with the
    workbook's default number (``reference`` names which). NVML's mean SM clock is kept per mode.
    """
    import statistics
    fn = lambda: run_fn(*args)  # noqa: E731
    out: dict = {}
    with SmClock() as c:
        out["workbook_ms"] = bench(fn).median_ms
    out["workbook_sm_mhz"] = c.mhz
    out["workbook_write_flush_ms"] = bench(fn, flush="write").median_ms
    n = max(1, min(10, int(2.0 / max(out["workbook_ms"], 1e-3))))     # calls per replay: up to ~2 ms, at least 1
    spaced = lambda k: dict(use_cuda_graph=True, num_iters_within_graph=k, sleep_after_run=True,  # noqa: E731
                            dry_run_iters=3, repeat_iters=30)
    modes = [("graph_spaced", spaced(n))] + ([("graph_spaced_1", spaced(1))] if n > 1 else []) + \
            [("graph", dict(use_cuda_graph=True)), ("events", {})]
    cupti = cupti_python() is None
    if cupti:   # twice: the first CUPTI session after torch.profiler reads ~2x (see the docstring)
        modes += [(m, dict(enable_cupti=True, use_cuda_graph=True)) for m in ("cupti_graph_first", "cupti_graph")]
    for name, kw in modes:
        with SmClock() as c:
            out[f"bgt_{name}_ms"] = statistics.median(bench_gpu_time(run_fn, input_args=args, **kw))
        out[f"bgt_{name}_sm_mhz"] = c.mhz
    out["graph_spaced_calls_per_replay"] = n
    if n > 1:
        out["spaced_replay_overhead_us"] = 1e3 * (out["bgt_graph_spaced_1_ms"] - out["bgt_graph_spaced_ms"]) * n / (n - 1)
    out["reference"] = "cupti_graph" if cupti else "graph_spaced"
    out["reference_ms"] = out[f"bgt_{out['reference']}_ms"]
    out["workbook_compared"] = "workbook_write_flush_ms" if cupti else "workbook_ms"
    ref = out["reference_ms"]
    out["ratio"] = out[out["workbook_compared"]] / ref if ref else math.nan
    out["ratio_default"] = out["workbook_ms"] / ref if ref else math.nan
    return out


def observe_cross_check(run, xrows: list, label) -> None:
    """Headline + verdict of the bench_gpu_time cross-check (``label(row)`` names a shape)."""
    expected = "the workbook's timer agrees with FlashInfer's own bench_gpu_time on the same shapes within 3%"
    if not xrows:
        run.observe(expected, "bench_gpu_time could not run (see errors)", "inconclusive", "cross_check.csv")
        return
    worst = max(abs(x["ratio"] - 1) for x in xrows)
    run.headline(bench_gpu_time_max_deviation_pct=100 * worst)
    like = ", ".join(f"{label(x)}: {x['ratio']:.3f}" for x in xrows)
    if all(x["reference"] == "cupti_graph" for x in xrows):
        how = f"same instrument and L2 flush (workbook CUPTI, write-only flush / bench_gpu_time CUPTI + CUDA graph): {like}"
        rest = ("; each tool's default L2 preparation (workbook: clean L2): " +
                ", ".join(f"{label(x)}: {x['ratio_default']:.3f}" for x in xrows))
    else:
        refs = "/".join(sorted({x["reference"] for x in xrows}))
        how, rest = f"workbook / bench_gpu_time {refs} (events around spaced CUDA-graph replays): {like}", ""
    spaced = [x for x in xrows if not math.isnan(x.get("spaced_replay_overhead_us", math.nan))]
    if spaced:
        rest += ("; workbook default / spaced-graph events: " +
                 ", ".join(f"{label(x)}: {x['workbook_ms'] / x['bgt_graph_spaced_ms']:.3f} (launch from idle "
                           f"{x['spaced_replay_overhead_us']:.0f} us per replay of {x['graph_spaced_calls_per_replay']})"
                           for x in spaced))
    rest += ("; workbook default / back-to-back graph (mean SM clock there vs the workbook's): " +
             ", ".join(f"{label(x)}: {x['workbook_ms'] / x['bgt_graph_ms']:.3f} ({x['bgt_graph_sm_mhz']:.0f} vs "
                       f"{x['workbook_sm_mhz']:.0f} MHz)" for x in xrows))
    run.observe(expected, how + rest, "confirmed" if worst <= 0.03 else "refuted", "cross_check.csv")


def cross_check_line(xrows: list, label) -> str:
    """One story line: the like-for-like ratios and, beside them, each tool's default."""
    like = ", ".join(f"{label(x)} {x['ratio']:.3f}" for x in xrows)
    if any(x["reference"] != "cupti_graph" for x in xrows):
        return f"bench_gpu_time cross-check (workbook / FlashInfer {xrows[0]['reference']} mode, medians): {like}"
    return ("bench_gpu_time cross-check (CUPTI both sides, same write-only L2 flush; workbook / FlashInfer, "
            f"medians): {like}; with the workbook's clean-L2 default: " +
            ", ".join(f"{label(x)} {x['ratio_default']:.3f}" for x in xrows))


def pick(df, **kw):
    """The first row of ``df`` matching all column=value pairs, as a dict (None if none)."""
    m = df
    for k, v in kw.items():
        m = m[m[k] == v]
    return m.iloc[0].to_dict() if len(m) else None
