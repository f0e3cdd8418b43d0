"""FlashInfer track helpers (flashinfer/scripts/_fi.py and its rooms _fi_timeline, _fi_jit, _fi_bench), on real
fixtures. The scripts themselves (CLI, main() length, verdicts on recorded values) are in
tests/test_flashinfer_scripts.py; the FLOP/byte formulas in tests/test_flops.py (common.tables.flops).

Fixtures added for these tests (tests/fixtures/):
  torch_trace_sglang_extend_step_h200_cut.json
      cut from ../shared/fixtures/torch_profiler_trace_sglang_server_llama8b_dummy_h200_trimmed.json
      (SGLang server, Llama-3.1-8B shape, flashinfer backend, one EXTEND step of 11 tokens): the
      range `step[EXTEND bs=1 toks=11]`, the CUDA runtime/driver calls from 3 ms before to 3.4 ms
      after its start, and the kernels and memcpys those calls launched; python/cpu_op events dropped.
  ninja_log_v5_two_objects_rebuilt.txt
      the .ninja_log ninja 1.11.1 wrote for a 2-object shared library built, then rebuilt after
      touching one source (same v5 format FlashInfer's JIT folders hold).
  fi_cross_check_decode_h200*.csv: see the cross-check tests below.
Also used: ncu_raw_fullset_flashinfer_5kernels_h200.csv, sglang_nsys_cuda_gpu_trace_cut_h200.csv
(tests/fixtures/README.md, tests/test_sglang_scripts.py).
"""
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "flashinfer" / "scripts"
sys.path.insert(0, str(SCRIPTS))
import _fi  # noqa: E402
import _fi_bench  # noqa: E402
import _fi_jit  # noqa: E402
import _fi_timeline  # noqa: E402
from common.base import stats  # noqa: E402
from common.capture import ncu  # noqa: E402
from common.tables import flops, kernels, trace  # noqa: E402
from common.judge import verdicts  # noqa: E402
from common.run.results import Run  # noqa: E402

NCU_FULL = "ncu_raw_fullset_flashinfer_5kernels_h200.csv"
TRACE = "torch_trace_sglang_extend_step_h200_cut.json"
NSYS_TRACE = "sglang_nsys_cuda_gpu_trace_cut_h200.csv"


@pytest.fixture
def ncu_rows(fixture_path):
    s = kernels.summarize(ncu.read_raw(fixture_path(NCU_FULL)))
    return {k: r for k, r in zip(s["kernel"], s.to_dict("records"))}


@pytest.fixture
def run(tmp_path):
    """A real results.Run (run.judge / run.observe as the scripts call them), in a temporary folder."""
    r = Run(SCRIPTS / "03_profile_decode.py", {}, out=tmp_path / "run", quiet=True)
    yield r
    r.finish()


# ------------------------------------------------------------------ RoPE bytes (FlashInfer's API facts + common.tables.flops)

def test_rope_bytes_per_api_against_what_ncu_read(ncu_rows):
    """The cos/sin-cache API reads q, k, an int64 position and an fp32 cos/sin row per token; ncu saw those reads
    (the probe: 8192 tokens, 32 q / 8 k heads, head_dim 128)."""
    extra = _fi.rope_extra_bytes("apply_rope_with_cos_sin_cache_inplace", 128)
    assert extra == 8 + 4 * 128 and _fi.rope_extra_bytes("apply_rope", 128) == 0
    assert _fi.rope_extra_bytes("apply_llama31_rope_pos_ids", 64) == 8
    total = flops.rope_bytes(8192, 32, 8, 128, per_token_extra=extra)
    read = (total - 8192 * extra) / 2 + 8192 * extra                 # q, k read once (half), the extras read
    rope = ncu_rows["BatchQKApplyRotaryPosIdsCosSinCacheHeadParallelismKernel"]
    assert rope["dram_read_mb"] * 1e6 == pytest.approx(read, rel=0.03)


# ------------------------------------------------------------------ plan_info, grids

def test_decode_plan_info_layouts():
    d = _fi.decode_plan_info([128, 0, 64, 128, 256, 384, 512, 77, 0, 1])
    assert d["layout"].startswith("decode") and d["padded_batch_size"] == 128 and d["split_kv"] is True
    p = _fi.decode_plan_info(list(range(14)) + [0])
    assert p["cta_tile_q"] == 3 and p["split_kv"] is False and p["kv_chunk_size_ptr_offset"] == 9
    f = _fi.decode_plan_info([0] * 8 + [1])
    assert f["layout"].startswith("prefill fa3") and "split_kv" not in f


def test_plan_info_of_another_layout_fails_loudly():
    with pytest.raises(_fi.PlanInfoError, match="has 11 entries"):
        _fi.decode_plan_info(list(range(11)))


def test_chunk_size_read_from_the_pinned_buffer():
    buf = bytes(100) + (1024).to_bytes(4, "little") + bytes(8)
    assert _fi.read_i32(buf, 100) == 1024
    d = _fi.decode_plan_info([128, 0, 0, 0, 0, 0, 0, 100, 0, 1], pinned=buf)
    assert d["kv_chunk_tokens"] == 1024
    with pytest.raises(_fi.PlanInfoError, match="outside"):
        _fi.read_i32(buf, len(buf) - 2)


def test_grid_dims_from_ncu(ncu_rows):
    # b32 x kv4096 decode: grid (padded_batch_size, kv heads) = 32 requests x 4 KV chunks, 8 kv heads
    assert _fi.grid_dims(ncu_rows["BatchDecodeWithPagedKVCacheKernel"]["grid"]) == (128, 8, 1)
    assert _fi.grid_dims(ncu_rows["BatchPrefillWithPagedKVCacheKernel"]["grid"]) == (128, 1, 8)
    assert _fi.grid_dims("") is None and _fi.grid_dims(None) is None


def test_page_table():
    indptr, last = _fi.page_table([1, 16, 17, 100], 16)
    assert indptr == [0, 1, 2, 4, 11] and last == [1, 16, 1, 4]
    with pytest.raises(ValueError, match="at least one KV token"):
        _fi.page_table([0], 16)


# ------------------------------------------------------------------ what one call launched, from the common join

def test_calls_and_per_call_on_a_real_sglang_step(fixture_path):
    """The common join (common.tables.trace.kernels_in_ranges) read the FlashInfer way: merge kernels, fill kernel, copies."""
    rows = trace.kernels_in_ranges(trace.read_chrome_trace(fixture_path(TRACE)), r"^step\[")
    kern = rows[rows["gpu_kind"] == "kernel"]
    s = _fi.calls_summary(rows).iloc[0]
    assert s["calls"] == 1 and s["kernels_per_call"] == len(kern) and s["copies_per_call"] == 12
    assert s["merge_kernel"] and s["fill_kernel"] and 0 < s["merge_share_pct"] < 100
    assert s["kernels"].split(" + ")[0] == kern.sort_values("ts_us")["kernel"].iloc[0]
    assert "Memcpy HtoD (Pinned -> Device)" in s["copies"] and "Memcpy" not in s["kernels"]
    c = _fi.per_call(rows).iloc[0]
    assert c["kernels"] == len(kern) and c["copies"] == 12 and c["fill_kernel"]
    merges = kern[kern["kernel"].str.contains(_fi.MERGE_RX)]["dur_us"].sum()
    assert c["merge_us"] == pytest.approx(merges) and c["merge_share_pct"] == pytest.approx(s["merge_share_pct"])


def test_pick():
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame([{"a": 1, "b": 2}, {"a": 1, "b": 3}])
    assert _fi.pick(df, a=1) == {"a": 1, "b": 2} and _fi.pick(df, a=1, b=3)["b"] == 3 and _fi.pick(df, a=2) is None


# ------------------------------------------------------------------ sweeps: repetitions, verdict helpers

def test_with_repeats_puts_each_reference_point_three_times_after_the_sweep():
    pts = _fi.with_repeats([{"b": 1}, {"b": 2}], [{"b": 32}])
    assert [p["kind"] for p in pts] == ["sweep"] * 2 + ["reference"] * _fi.REPEATS
    assert [p["rep"] for p in pts[2:]] == list(range(_fi.REPEATS)) and _fi.REPEATS >= stats.MIN_REPEATS


def test_fact_needs_every_repetition_and_its_premise(run):
    h = verdicts.Hypothesis("x", "a merge kernel runs when plan_info says split_kv", "per traced call", source="H-05")
    assert run.fact(h, [True, True, True], "3/3") == "confirmed"
    assert run.fact(h, [False, False, False], "0/3") == "refuted"
    assert run.fact(h, [True, False, True], "2/3") == "inconclusive"
    assert run.fact(h, None, "not observed") == "inconclusive"
    assert run.fact(h, True, "split", premise="the shape was not traced") == "inconclusive"
    obs = run.summary["observations"]
    assert "holds in 2 of 3" in obs[2]["observed"] and "premise failed: the shape was not traced" in obs[4]["observed"]
    assert "source: H-05" in obs[0]["expected"]


def test_over_shapes_is_the_full_range():
    iv = stats.over([0.61, 0.64, 0.62, float("nan"), None])
    assert (iv.lo, iv.hi, iv.n) == (0.61, 0.64, 3) and iv.point == pytest.approx(0.62) and "3 shapes" in iv.method
    assert stats.over([]).n == 0
    # ten or more shapes stay a range (every shape inside the bound), never a bootstrap of the median
    assert stats.over([1.0] * 9 + [1.2]).hi == 1.2


# ------------------------------------------------------------------ timeline

def test_point_kernels_split_a_real_nsys_trace_at_a_marker(fixture_path):
    """The marker splitting of --nsys, on SGLang's real cuda_gpu_trace: fused_rope_kernel (once per layer) stands in
    for the scripts' marker kernel, so each 'point' is one layer and keeps its attention + merge kernels."""
    ev = trace.read_nsys_csv(fixture_path(NSYS_TRACE))
    n = int(ev["name"].str.contains("fused_rope_kernel").sum())
    points = [{"kind": "sweep", "layer": i} for i in range(n)]
    tl = _fi_timeline.point_kernels(ev, points, "BatchPrefillWithPagedKVCacheKernel|" + _fi.MERGE_RX,
                           lambda p: f"layer {p['layer']}", marker="fused_rope_kernel")
    assert n == 52 and (tl.groupby("point").size() == 2).all() and tl["label"].nunique() == n
    assert list(tl[tl["point"] == 0]["kernel"]) == ["BatchPrefillWithPagedKVCacheKernel", "MergeStateKernel"]
    third = tl[tl["point"] == 2]
    assert list(third["kernel"]) == ["BatchPrefillWithPagedKVCacheKernel", "PersistentVariableLengthMergeStatesKernel"]
    assert third["start_us"].iloc[0] == 0 and 0 < third["gap_us"].iloc[1] < 5 and (tl["dur_us"] > 0).all()
    ref = _fi_timeline.point_kernels(ev, [{"kind": "reference"}] * n, "BatchPrefill", str, marker="fused_rope_kernel")
    assert ref.empty                                    # reference repetitions are not drawn


def test_call_kernels_and_the_story_timeline(fixture_path, tmp_path):
    """The torch-profiler fallback of --nsys: the first call of each label, its attention kernels on a timeline."""
    rows = trace.kernels_in_ranges(trace.read_chrome_trace(fixture_path(TRACE)), r"^step\[")
    tl = _fi_timeline.call_kernels(rows, "BatchPrefillWithPagedKVCacheKernel|MergeStates")
    assert list(tl["kernel"]) == ["BatchPrefillWithPagedKVCacheKernel", "PersistentVariableLengthMergeStatesKernel"] * 2
    assert (tl["start_us"].diff().dropna() > 0).all()
    line = _fi_timeline.timeline_lines(tl)[0]
    assert line.startswith("step[EXTEND bs=1 toks=11]: BatchPrefillWithPagedKVCacheKernel") and "GPU span" in line
    art = _fi_timeline.timeline_ascii(tl, ["step[EXTEND bs=1 toks=11]", "not there"])
    assert "M" in art and art.count("\n") >= 2 and "not there" not in art
    fig = _fi_timeline.timeline_figure(tl, "test")
    assert len(fig.axes[0].patches) == len(tl)
    fig.savefig(tmp_path / "t.png")


# ------------------------------------------------------------------ JIT cache

def test_ninja_log_last_entry_wins(fixture_path):
    nl = _fi_jit.parse_ninja_log(fixture_path("ninja_log_v5_two_objects_rebuilt.txt").read_text())
    assert sorted(nl["output"]) == ["a.o", "b.o", "mod.so"]
    a = nl.set_index("output").loc["a.o"]
    assert a["start_ms"] == 1 and a["seconds"] == pytest.approx(0.034)   # the rebuild, not the first build
    assert (nl["seconds"] >= 0).all()


def test_ninja_log_bad_input_fails_loudly(fixture_path):
    with pytest.raises(_fi_jit.NinjaLogError, match="ninja log"):
        _fi_jit.parse_ninja_log(fixture_path(NCU_FULL).read_text()[:2000])
    text = fixture_path("ninja_log_v5_two_objects_rebuilt.txt").read_text()
    with pytest.raises(_fi_jit.NinjaLogError, match="line 3"):
        _fi_jit.parse_ninja_log(text[:text.index("\n", 20) + 12])              # cut in the middle of a line


def test_jit_modules_lists_a_cache_folder(tmp_path, fixture_path):
    mod = tmp_path / "cached_ops" / "norm"
    mod.mkdir(parents=True)
    (mod / "norm.so").write_bytes(b"\0" * 2_000_000)
    (mod / "a.cuda.o").write_bytes(b"x")
    (mod / "b.o").write_bytes(b"x")
    (mod / ".ninja_log").write_text(fixture_path("ninja_log_v5_two_objects_rebuilt.txt").read_text())
    (tmp_path / "cached_ops" / "tmp").mkdir()                             # lock folder: not a module
    (tmp_path / "cached_ops" / "half_built").mkdir()
    rows = {r["module"]: r for r in _fi_jit.jit_modules(tmp_path / "cached_ops")}
    assert set(rows) == {"norm", "half_built"}
    assert rows["norm"]["compiled"] and rows["norm"]["so_mb"] == 2.0 and rows["norm"]["objects"] == 2
    assert rows["norm"]["nvcc_sum_s"] == pytest.approx(0.9, abs=0.05)      # a.o (rebuilt) + b.o
    assert not rows["half_built"]["compiled"]
    assert _fi_jit.jit_modules(tmp_path / "missing") == []


def test_short_module_names():
    assert _fi_jit.short_module("batch_prefill_with_kv_cache_dtype_q_bf16_f16qk_False_sm90") == "batch_prefill_sm90 (fa3)"
    assert _fi_jit.short_module("batch_decode_with_kv_cache_dtype_q_bf16") == "batch_decode"
    assert _fi_jit.short_module("norm") == "norm"


# ------------------------------------------------------------------ the bench_gpu_time cross-check

def _fake_bgt(calls):
    """A stand-in for bench_gpu_time: CUPTI mode 0.110 ms, spaced graph 0.100 (n per replay) / 0.118
    (1 per replay), back-to-back graph 0.105, events 0.120 (made-up numbers: the control flow is tested;
    the verdicts are tested on the real H200 rows below)."""
    def bgt(fn, input_args=(), **kw):
        calls.append(kw)
        fn(*input_args)
        if kw.get("enable_cupti"):
            return [0.110, 0.111, 0.109]
        if kw.get("sleep_after_run"):
            return [0.118] if kw["num_iters_within_graph"] == 1 else [0.100, 0.101, 0.099]
        return [0.105] if kw.get("use_cuda_graph") else [0.120]
    return bgt


class _T:
    def __init__(self, ms):
        self.median_ms = ms


def _wb(default_ms, write_ms):
    """A stand-in for common.capture.timing.bench: ``default_ms`` with its default flush, ``write_ms`` with flush='write'."""
    return lambda fn, **kw: (fn(), _T(write_ms if kw.get("flush") == "write" else default_ms))[1]


def test_cross_check_compares_cupti_with_cupti_at_the_same_flush_three_times(monkeypatch):
    """With cupti-python the reference is bench_gpu_time's CUPTI mode in a CUDA graph, compared with the workbook's
    number at FlashInfer's write-only flush, REPEATS times (ratio_reps); the defaults and launch costs beside it."""
    monkeypatch.setattr(_fi_bench, "cupti_python", lambda: None)
    calls, seen = [], []
    out = _fi_bench.cross_check(_fake_bgt(calls), lambda a, b: seen.append((a, b)), (1, 2), _wb(0.102, 0.1122))
    assert out["reference"] == "cupti_graph" and out["reference_ms"] == 0.110
    assert out["workbook_compared"] == "workbook_write_flush_ms"
    assert abs(out["ratio"] - 1.02) < 1e-9 and abs(out["ratio_default"] - 0.102 / 0.110) < 1e-9
    cupti = [c for c in calls if c.get("enable_cupti")]
    # every like-for-like repetition runs two CUPTI sessions and keeps the second: the first after torch.profiler reads ~2x
    assert cupti == [dict(enable_cupti=True, use_cuda_graph=True)] * (2 * _fi.REPEATS)
    assert len(out["bgt_cupti_graph_first_reps_ms"].split(";")) == _fi.REPEATS - 1
    assert out["bgt_cupti_graph_first_ms"] == 0.110
    assert _fi_bench.cross_check_ratios([out]) == pytest.approx([1.02] * _fi.REPEATS)      # every repetition is judged
    assert calls[0]["num_iters_within_graph"] == 10 and calls[0]["sleep_after_run"]          # 0.102 ms -> 10 per replay
    assert calls[1]["num_iters_within_graph"] == 1 and calls[1]["sleep_after_run"]           # + one call per replay
    # per replay: spaced_1 = k + L, spaced_10 = k + L/10  ->  L = (0.118 - 0.100) * 10 / 9 ms = 20 us
    assert abs(out["spaced_replay_overhead_us"] - 20.0) < 1e-6
    assert all(s == (1, 2) for s in seen)
    calls.clear()
    long = _fi_bench.cross_check(_fake_bgt(calls), lambda a, b: None, (1, 2), _wb(3.0, 3.0))     # 3 ms: 1 per replay
    assert "bgt_graph_spaced_1_ms" not in long and "spaced_replay_overhead_us" not in long
    assert calls[0]["num_iters_within_graph"] == 1
    line = _fi_bench.cross_check_line([dict(out, label="x")], lambda x: x["label"])
    assert "x 1.020" in line and "clean-L2 default: x 0.927" in line


def test_cross_check_without_cupti_python_falls_back_to_the_spaced_graph(monkeypatch):
    """Without cupti-python bench_gpu_time would silently time with events: the reference is then its spaced graph
    mode, compared with the workbook's default number, no repetitions, and the row says so."""
    monkeypatch.setattr(_fi_bench, "cupti_python", lambda: "cupti-python unavailable")
    calls = []
    out = _fi_bench.cross_check(_fake_bgt(calls), lambda a, b: None, (1, 2), _wb(0.102, 0.1122))
    assert not any(c.get("enable_cupti") for c in calls) and "bgt_cupti_graph_ms" not in out
    assert out["reference"] == "graph_spaced" and out["workbook_compared"] == "workbook_ms" and "ratio_reps" not in out
    assert abs(out["ratio"] - 1.02) < 1e-9
    assert "not like for like" in _fi_bench.cross_check_line([dict(out, label="x")], lambda x: x["label"])


def test_cross_check_points_times_each_point_and_keeps_the_rows_before_a_failure(monkeypatch, run):
    """02 and 03 hand their points to _fi_bench.cross_check_points: one row per point (its fields + cross_check's), each
    ratio in the log, cross_check.csv; a point that cannot be made ends the loop as one point error, the rows
    timed before it are kept. Each point's tensors are released before the next point is made."""
    pytest.importorskip("pandas")
    monkeypatch.setattr(_fi_bench, "cupti_python", lambda: None)
    calls = []
    monkeypatch.setattr(_fi_bench, "load_bench_gpu_time", lambda log: _fake_bgt(calls))
    made = []

    class W:
        def run(self, q, cache, out=None):
            made.append(("run", q))

    def points():
        for n in (1, 2, 3):
            if n == 3:
                raise RuntimeError("out of memory making point 3")
            made.append(("make", n))
            yield {"variant": "v", "batch": n}, f"v b{n}", W(), (f"cache{n}", f"q{n}", None)
            made.append(("free", n))
    rows = _fi_bench.cross_check_points(run, points, _wb(0.102, 0.1122))
    assert [(r["variant"], r["batch"]) for r in rows] == [("v", 1), ("v", 2)]
    assert all(r["reference"] == "cupti_graph" and abs(r["ratio"] - 1.02) < 1e-9 for r in rows)
    assert made.index(("free", 1)) < made.index(("make", 2))          # point 1 freed before point 2 is made
    assert {("run", "q1"), ("run", "q2")} <= set(made)
    assert [e["error"] for e in run.summary["point_errors"]] == ["RuntimeError: out of memory making point 3"]
    assert "cross-check v b2: workbook / bench_gpu_time (cupti_graph) = 1.020" in (run.dir / "log.txt").read_text()
    assert (run.dir / "cross_check.csv").read_text().count("\n") == 3      # header + the two rows


def _rows(fixture_path, name):
    pd = pytest.importorskip("pandas")
    return pd.read_csv(fixture_path(name)).to_dict("records")


def label(x):
    return f"{x['variant']} b{x['batch']} kv{x['kv_len']}"


# fi_cross_check_decode_h200.csv: cross_check.csv of the real `03_profile_decode.py --quick --ncu` run on
# one H200 at commit 63d8e4f (FlashInfer 0.6.15.post1; cupti-python absent: graph_spaced reference).
def test_cross_check_without_cupti_is_inconclusive_on_the_real_h200_rows(fixture_path, run):
    rows = _rows(fixture_path, "fi_cross_check_decode_h200.csv")
    assert {r["reference"] for r in rows} == {"graph_spaced"} and len(rows) == 3
    rec = _fi_bench.judge_cross_check(run, rows, label)
    assert rec["verdict"] == "inconclusive" and "premise failed: cupti-python (>= 13) is missing" in rec["observed"]
    assert run.summary["headline"]["bench_gpu_time_max_deviation_pct"] < 3
    assert "cuda b256 kv32768" in rec["observed"] and "MHz" in rec["observed"]   # the back-to-back mode and its clock


def test_the_premise_guard_fails_when_broken(fixture_path, run, monkeypatch):
    """Proof that it is the premise that keeps a non-like-for-like comparison from a verdict: with the guard removed
    the same recorded rows (all within 3%) would be 'confirmed'."""
    rows = _rows(fixture_path, "fi_cross_check_decode_h200.csv")
    real = verdicts.verdict_for
    monkeypatch.setattr(verdicts, "verdict_for", lambda h, iv, premise=True, margin=0.0: real(h, iv, premise=True, margin=margin))
    assert _fi_bench.judge_cross_check(run, rows, label)["verdict"] == "confirmed"
    monkeypatch.undo()
    assert _fi_bench.judge_cross_check(run, rows, label)["verdict"] == "inconclusive"


# fi_cross_check_decode_h200_b2e5.csv: cross_check.csv of the real `06_full_pipeline.sh --quick --ncu --nsys`
# run at commit c631eb8 on another H200 (UUID GPU-b2e50433...), where tensor-core decode b32 x kv 4096 read
# 0.965 of the spaced reference (0.966 and 0.968 in two more runs that day on the same GPU).
def test_a_straddling_interval_is_inconclusive_not_refuted(fixture_path, run):
    """The run the old single-threshold rule called 'refuted' (one shape at 0.965): its ratios [0.965, 1.027]
    straddle the 0.97 bound, so even judged like for like the interval says inconclusive."""
    rows = _rows(fixture_path, "fi_cross_check_decode_h200_b2e5.csv")
    ratios = _fi_bench.cross_check_ratios(rows)
    assert min(ratios) == pytest.approx(0.9652, abs=1e-4) and max(ratios) > 1.02
    rec = verdicts.judge(_fi_bench.H["xcheck"], ratios)
    assert rec["verdict"] == "inconclusive" and "straddles [0.97, 1.03]" in rec["observed"]
    assert _fi_bench.judge_cross_check(run, rows, label)["verdict"] == "inconclusive"   # and its premise failed too


# fi_cross_check_decode_h200_b7d6.csv: cross_check.csv of the real `06_full_pipeline.sh --quick --ncu --nsys` run
# at commit b7d68da on one H200 (GPU-5028283b...), the like-for-like reference (bench_gpu_time CUPTI in a CUDA graph,
# its second session) with cupti-python 13.0.1.
def test_cross_check_like_for_like_on_the_real_h200_rows(fixture_path, run):
    rows = _rows(fixture_path, "fi_cross_check_decode_h200_b7d6.csv")
    assert {r["reference"] for r in rows} == {"cupti_graph"}
    assert {r["workbook_compared"] for r in rows} == {"workbook_write_flush_ms"}
    rec = _fi_bench.judge_cross_check(run, rows, label)
    assert rec["verdict"] == "confirmed" and run.summary["headline"]["bench_gpu_time_max_deviation_pct"] < 3
    assert rec["interval"]["n"] == 3 and 0.99 < rec["interval"]["lo"] and rec["interval"]["hi"] < 1.01
    # each tool's default disagrees on the tensor-core point (the dirty L2 lines FlashInfer's flush leaves)
    tc = next(x for x in rows if x["variant"] == "tc")
    assert tc["ratio_default"] < 0.97 and "tc b32 kv4096: 0.934" in rec["observed"]
    assert "us per replay of 10" in rec["observed"]     # the spaced mode's launch from idle is shown
    # the first CUPTI session's reading is kept, and it exceeds bench_gpu_time's own event bracket
    assert all(x["bgt_cupti_graph_first_ms"] > x["bgt_events_ms"] for x in rows)


def test_no_cross_check_rows_is_inconclusive(run):
    assert _fi_bench.judge_cross_check(run, [], label) == "inconclusive"
    assert math.isnan(stats.over([]).point)


def test_a_cupti_session_after_torch_profiler_reads_twice(fixture_path):
    """Real rows (H200, 2026-11-23, commit 1be49e4): the first like-for-like ratio came from a second CUPTI session
    (1.003-1.016); the two repeats that took the first session after the workbook's torch.profiler timer read
    0.47-0.49 on every shape. That is why each repetition now keeps the second session (see cross_check)."""
    rows = _rows(fixture_path, "fi_cross_check_decode_h200_1be4.csv")
    for r in rows:
        first, *repeats = [float(x) for x in r["ratio_reps"].split(";")]
        assert 0.99 < first < 1.02 and all(0.46 < x < 0.50 for x in repeats)
        assert 2.0 < r["bgt_cupti_graph_first_ms"] / r["bgt_cupti_graph_ms"] < 2.2
