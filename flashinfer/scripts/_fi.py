"""Private helpers of the FlashInfer scripts (00-05, 07) — FlashInfer's own facts, not a public module.

Pure Python at import time: torch and flashinfer are passed in by the caller, so what is here is
tested on a CPU box (tests/test_flashinfer_fi.py). Everything generic lives in common/ and is
imported from there: FLOP/byte formulas (common.tables.flops), the range->kernel join and the capture of
labelled calls (common.tables.trace), timers (common.capture.timing), intervals and verdicts (common.base.stats,
common.judge.verdicts), ncu and nsys (common.capture.ncu, common.capture.nsys). What stays here, and why:

  shapes       head layouts of the model presets, paged-KV index arrays and caches
  references   plain-torch attention (paged, GQA, causal bottom-right) and RoPE; the RoPE API table
  plan_info    the planner's integer list -> named fields (split_kv, grid size, KV chunk)
  calls        what one FlashInfer call launched (split-KV merge, fill kernel), read from the common join
  sweeps       the points of a sweep (judged points REPEATS times in the ncu pass: common.tables.ncu_pass) and
               the verdict helpers on top of common.judge.verdicts
  --reanalyse  what a recording gives back besides its tables (the trace, a raw ncu row, the GPU)
Beside it (each imports at most this module; the scripts import the rooms they use by name): _fi_timeline (each
point's kernels on a timeline), _fi_jit (a JIT cache folder), _fi_bench (the cross-check with bench_gpu_time).
"""
from __future__ import annotations

import math
import re
from pathlib import Path

MERGE_RX = "MergeState"           # merge kernels: MergeStateKernel, (PersistentVariableLength)MergeStatesKernel
REPEATS = 3                       # repetitions of every judged measurement (common.judge.verdicts needs >= 3)


def require_stack():
    """(torch, flashinfer) with a CUDA GPU visible, or one [setup] line naming what is missing."""
    from common.base.checks import require_gpu, require_module
    torch = require_module("torch", "pip install -r requirements.txt")
    require_gpu(torch)
    return torch, require_module("flashinfer", "pip install flashinfer-python==0.6.15.post1")


# ------------------------------------------------------------------ shapes

def head_layout(preset: str) -> dict:
    """Attention heads of a model preset: q heads, kv heads, head_dim, GQA group, RoPE settings."""
    from common.capture import models
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


def rope_extra_bytes(api: str, d: int) -> int:
    """Bytes per token a RoPE API reads besides q and k (common.tables.flops.rope_bytes' per_token_extra): nothing for
    indptr/offsets (positions are computed), an int64 position id, or the id plus the fp32 cos/sin row (4 x d)."""
    return {"indptr+offsets": 0, "pos_ids": 8, "cos/sin cache": 8 + 4 * d}[ROPE_APIS[api][0]]


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


def kernel_columns() -> tuple[str, ...]:
    """The columns of the report-sized kernel table: the launch (kernel, grid, block), then the counter columns the
    kernel table declares (common.tables.kernels.COUNTERS: ncu time, DRAM bytes / TB/s / kind / % of that kind's ceiling,
    L2 hit, ncu's SOL, SM, tensor, occupancy with its launch facts and limiter, stalls) and one_cta_per_sm."""
    from common.tables import kernels
    return ("kernel", "grid", "block", *kernels.names("counters"), "one_cta_per_sm")


def compact_kernels(kern, point_cols):
    """The report-sized view of a common.tables.kernels.summarize() table: the point's labels, then kernel_columns() (the full
    table, with every stall column, is written beside it)."""
    cols = [c for c in (*point_cols, *kernel_columns()) if c in kern.columns]
    return kern[cols]


def occupancy_text(r: dict) -> str:
    """How a launch occupies the SMs, as every occupancy reading in the track gives it (issue 21.4): achieved of
    theoretical occupancy, CTAs per SM with the limiter, warps per CTA, registers per thread, shared memory per
    CTA (common.tables.kernels' declared shows), and 'one CTA per SM by design' where the launch fits only one."""
    from common.tables import kernels
    parts = [kernels.COLUMNS[c].show(r) for c in ("occupancy_pct", "ctas_per_sm")]
    text = "; ".join(p for p in parts if p) or "occupancy not collected"
    return text + ("; one CTA per SM by design" if kernels.flag(r, "one_cta_per_sm") else "")


# ------------------------------------------------------------------ calls: what one FlashInfer call launched
# (read from common.tables.trace.kernels_in_ranges: the one range -> kernel join)

def per_call(rows):
    """One row per traced call of a kernels_in_ranges() table: label, range_ts_us (the call), kernels, copies
    (memcpy/memset), kernel_us, merge_us and merge_share_pct (the split-KV merge kernel's share of the call's
    kernel time), fill_kernel (a PyTorch FillFunctor ran: torch.zeros of an output)."""
    import pandas as pd
    out = []
    for (label, ts), g in rows.groupby(["label", "range_ts_us"], sort=False):
        k = g[g["gpu_kind"] == "kernel"]
        tot = float(k["dur_us"].sum())
        merge = float(k[k["kernel"].fillna("").str.contains(MERGE_RX)]["dur_us"].sum())
        out.append({"label": label, "range_ts_us": ts, "kernels": len(k),
                    "copies": int(g["gpu_kind"].isin(["memcpy", "memset"]).sum()), "kernel_us": tot,
                    "merge_us": merge, "merge_share_pct": 100 * merge / tot if tot else 0.0,
                    "fill_kernel": bool(k["full_name"].fillna("").str.contains("FillFunctor").any())})
    return pd.DataFrame(out, columns=["label", "range_ts_us", "kernels", "copies", "kernel_us", "merge_us",
                                      "merge_share_pct", "fill_kernel"])


def calls_summary(rows):
    """Per label of a kernels_in_ranges() table: calls seen, kernels per call (median), kernel names in launch
    order, copies/memsets per call and their names, whether a split-KV merge kernel ran and its share of the
    kernel time, kernel time per call, and whether a PyTorch fill kernel ran (FillFunctor: torch.zeros)."""
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


def pick(df, **kw):
    """The first row of ``df`` matching all column=value pairs, as a dict (None if none)."""
    m = df
    for k, v in kw.items():
        m = m[m[k] == v]
    return m.iloc[0].to_dict() if len(m) else None


# ------------------------------------------------------------------ sweeps: points, repetitions, verdicts
# A script profiles its own sweep with common.tables.ncu_pass (itself again, in a hidden --ncu-target mode that runs
# each point once). The points a verdict is judged on ("reference" points) run REPEATS times there, so their
# counters are judged on an interval too (common.judge.verdicts), never on one launch.

def sweep(run, torch, points, measure, say=None, name: str | None = "sweep"):
    """Every point measured once: ``measure(p)`` -> its row (a dict). A point that fails (a rejected shape, OOM, a
    failed JIT compile) is recorded with run.point_error and the sweep goes on; none left is an error. ``say(p)``:
    the progress line of a point (None: no line). Writes <name>.csv (unless name is None); returns the DataFrame."""
    import pandas as pd
    rows = []
    for i, p in enumerate(points, 1):
        line = say(p) if say else None
        if line:
            run.log(f"[{i}/{len(points)}] {line}")
        try:
            rows.append(measure(p))
        except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
            run.point_error(p, e)
            torch.cuda.empty_cache()
    if not rows:
        raise RuntimeError("every sweep point failed; see the [ERROR] lines above")
    df = pd.DataFrame(rows)
    if name:
        run.table(name, df)
    return df


def with_repeats(points, reference) -> list[dict]:
    """What --ncu-target runs, in order: each sweep point once (kind "sweep"), then each reference point
    REPEATS times (kind "reference", rep 0..REPEATS-1)."""
    return ([{**p, "kind": "sweep", "rep": 0} for p in points] +
            [{**r, "kind": "reference", "rep": i} for r in reference for i in range(REPEATS)])


def reference_rows(kern, **kw):
    """The ncu rows of one reference point (its REPEATS launches), as a list of dicts."""
    m = kern[kern["kind"] == "reference"]
    for k, v in kw.items():
        m = m[m[k] == v]
    return m.to_dict("records")


# ------------------------------------------------------------------ --reanalyse: what a recording gives back
# (common.run.recording reads summary.json and the tables; what the attention scripts' analysis reads besides them)

CALLS_COLUMNS = ("label", "calls", "kernels_per_call", "kernels", "copies_per_call", "copies", "merge_kernel",
                 "merge_share_pct", "fill_kernel", "kernel_us_per_call")   # calls_summary(); calls.csv adds plan facts


def device_of(summary: dict) -> tuple[tuple[int, int], int | None]:
    """(compute capability, SM count) of the GPU a recording ran on, from its provenance."""
    prov = summary.get("provenance") or {}
    cc = tuple(int(v) for v in str(prov.get("compute_capability") or "0.0").split(".")[:2])
    return cc, prov.get("sm_count")


def _recorded(src: Path, name: str) -> Path | None:
    """``name`` in a recording, or its gzipped copy (``name``.gz, as the test fixtures keep large raw files)."""
    return next((p for p in (src / name, src / f"{name}.gz") if p.is_file()), None)


def recorded_trace(src: Path, why: str):
    """The torch-profiler trace a run wrote (trace.json or trace.json.gz), as common.tables.trace's event table; one [setup]
    line when the recording has none (``why``: what the analysis reads from it)."""
    from common.tables import trace
    from common.base.checks import SetupError
    path = _recorded(Path(src), "trace.json")
    if path is None:
        raise SetupError(f"--reanalyse {src}: no trace.json to re-analyse ({why})")
    return trace.read_chrome_trace(path)


def as_recorded(df):
    """A table read back from its CSV with the empty cells of its text and flag columns as the GPU run held them
    (None, not NaN: a NaN stall note or split_kv reads as true); numeric columns stay as read. None stays None."""
    if df is None:
        return None
    df = df.copy()
    for c in df.select_dtypes(exclude="number").columns:
        if df[c].isna().any():
            df[c] = df[c].astype(object).where(df[c].notna(), None)
    return df


def per_call_from(ev, pattern: str, cs):
    """per_call() of the traced calls whose range matches ``pattern``, joined by label with the plan facts the calls
    table holds (calls.csv: calls_summary() columns, then what plan() decided): the per-call table of the GPU run."""
    from common.tables import trace
    facts = [c for c in cs.columns if c not in CALLS_COLUMNS]
    return per_call(trace.kernels_in_ranges(ev, pattern)).join(cs.set_index("label")[facts], on="label")


def recorded_ncu_row(src: Path, name: str) -> dict:
    """The first launch of a raw ncu CSV a run kept under ncu/ (``name``, or ``name``.gz), as a dict; {} when absent."""
    import gzip

    from common.capture import ncu
    path = _recorded(Path(src) / "ncu", name)
    if path is None:
        return {}
    text = gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text(errors="replace")
    return ncu.read_raw(text).iloc[0].to_dict()
