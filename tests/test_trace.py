"""common.tables.trace on real torch-profiler and nsys output (tests/fixtures/README.md)."""
import pytest

from common.tables import trace

TRACE = "torch_profiler_trace_flashinfer_rmsnorm_matmul_h200.json"


def test_chrome_trace_event_table(fixture_path):
    ev = trace.read_chrome_trace(fixture_path(TRACE))
    assert list(ev.columns) == trace.COLUMNS
    k = trace.kernels(ev)
    # the probe ran 3 x (rmsnorm, fused_add_rmsnorm, matmul): 3 launches of each FlashInfer kernel
    counts = trace.kernel_summary(k).set_index("short")["launches"]
    assert counts["RMSNormKernel"] == 3 and counts["FusedAddRMSNormKernel"] == 3
    assert (k["ts_us"].diff().dropna() >= 0).all()                     # time order
    assert trace.kernel_summary(k)["share_pct"].sum() == pytest.approx(100)
    assert 0 < trace.busy_fraction(k) <= 1


def test_gaps_are_idle_time_between_kernels(fixture_path):
    k = trace.kernels(trace.read_chrome_trace(fixture_path(TRACE)))
    g = trace.gaps(k, min_us=0)
    span = k["end_us"].max() - k["ts_us"].min()
    busy = trace.busy_fraction(k) * span
    assert g["gap_us"].sum() == pytest.approx(span - busy, rel=1e-6)


def test_empty_trace_fails_loudly(fixture_path):
    with pytest.raises(trace.TraceError, match="no timed events"):
        trace.read_chrome_trace(fixture_path("bad_torch_trace_empty.json"))


def test_truncated_trace_fails_loudly(fixture_path, tmp_path):
    p = tmp_path / "cut.json"
    p.write_text(fixture_path(TRACE).read_text()[:5000])
    with pytest.raises(trace.TraceError, match="not valid JSON"):
        trace.read_chrome_trace(p)


def test_nsys_kernel_summary(fixture_path):
    s = trace.read_nsys_csv(fixture_path("nsys_stats_cuda_gpu_kern_sum_flashinfer_probe_h200.csv"))
    assert {"total_ns", "instances", "avg_ns", "short"} <= set(s.columns)
    row = s[s["short"] == "BatchDecodeWithPagedKVCacheKernel"].iloc[0]
    assert row["instances"] == 1 and 100_000 < row["avg_ns"] < 1_000_000
    assert s["time_pct"].sum() == pytest.approx(100, abs=0.5)


def test_nsys_nvtx_summary(fixture_path):
    s = trace.read_nsys_csv(fixture_path("nsys_stats_nvtx_sum_matmul_h200.csv"))
    assert s.loc[0, "name"] == "ten matmuls" and s.loc[0, "instances"] == 1


def test_nsys_not_a_csv(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("Processing [report.sqlite] with [cuda_gpu_kern_sum.py]...\nSKIPPED: does not contain CUDA kernel data.\n")
    with pytest.raises(trace.TraceError):
        trace.read_nsys_csv(p)


# ------------------------------------------------------------------ the one range -> kernel join
SGL_GRAPH = "torch_trace_sglang_extend_step_h200_cut160.json"   # SGLang step kernels incl. CUDA-graph replays
SGL_STEP = "torch_trace_sglang_extend_step_h200_cut.json"        # one SGLang EXTEND step with its copies
SGL_SERVER = "sglang_server_trace_llama8b_h200_cut.json"


def test_join_on_aten_ops_keeps_copies_and_launch_geometry(fixture_path):
    ev = trace.read_chrome_trace(fixture_path(TRACE))
    j = trace.kernels_in_ranges(ev, r"^aten::mm$", kinds=("cpu_op",))
    assert j["range_index"].tolist() == [0, 0, 1, 1, 2, 2]
    for i in range(3):
        mine = j[j["range_index"] == i]
        assert mine["gpu_kind"].tolist() == ["memset", "kernel"] and mine["order"].tolist() == [0, 1]
        k = mine.iloc[1]
        assert k["kernel"].startswith("nvjet_sm90") and k["grid"] == "2x66x1" and k["block"] == "384x1x1"
    # FlashInfer kernels are launched outside any aten::mm: they join no aten::mm range
    assert not j["full_name"].fillna("").str.contains("RMSNorm").any()


def test_join_follows_cuda_graph_replays_and_finds_the_layers(fixture_path):
    ev = trace.read_chrome_trace(fixture_path(SGL_GRAPH))
    j = trace.kernels_in_ranges(ev, r"^step\[")
    names = j[j["gpu_kind"] == "kernel"]["kernel"].tolist()
    assert len(names) == 165 and names.count("FusedAddRMSNormKernel") >= 10
    period, block, _ = trace.kernel_period(names, anchor="RMSNorm")
    assert period == 18 and block[0] == "FusedAddRMSNormKernel"
    assert block.count("store_kvcache") == 1 and block.count("BatchPrefillWithPagedKVCacheKernel") == 1
    layers = trace.assign_layers(names, anchor="RMSNorm")
    assert max(l for l in layers if l is not None) >= 5 and layers.count(0) == 18
    with pytest.raises(trace.TraceError, match="layers"):
        trace.assign_layers(names, anchor="RMSNorm", layers=32)      # a cut trace is not a whole forward


def test_join_on_a_real_sglang_step_counts_what_the_step_launched(fixture_path):
    ev = trace.read_chrome_trace(fixture_path(SGL_STEP))
    j = trace.kernels_in_ranges(ev, r"^step\[")
    assert set(j["label"]) == {"step[EXTEND bs=1 toks=11]"} and (j["call"] == 0).all()
    kern = j[j["gpu_kind"] == "kernel"]
    assert len(kern) == len(trace.kernels(ev)) - 3          # 3 kernels were launched before the range began
    assert (j["gpu_kind"] == "memcpy").sum() == 12
    (s,) = trace.step_summary(trace.step_kernels(ev, r"^step\["))
    assert s["kernels"] == len(kern) and s["dur_us"] > s["kernel_us"] * 0.5 and s["how"] == "step"
    classes = {trace.kernel_class(n) for n in kern["kernel"]}
    assert {"gemm", "attention", "norm", "rope", "activation", "kv_store"} <= classes


def test_join_without_a_matching_range_fails_loudly(fixture_path):
    ev = trace.read_chrome_trace(fixture_path(TRACE))
    with pytest.raises(trace.TraceError, match="no range"):
        trace.kernels_in_ranges(ev, r"^decode ")


def test_join_needs_the_same_thread(fixture_path):
    ev = trace.read_chrome_trace(fixture_path(TRACE)).copy()
    runtime = ev["kind"] == "runtime"
    ev.loc[runtime, "tid"] = -1                                 # launches on another thread join nothing
    j = trace.kernels_in_ranges(ev, r"^aten::mm$", kinds=("cpu_op",))
    assert j["gpu_kind"].isna().all() and len(j) == 3


def test_split_label():
    assert trace.split_label("decode cuda b=32 kv=4096 #2") == ("decode cuda b=32 kv=4096", 2)
    assert trace.split_label("step[EXTEND bs=1 toks=11]") == ("step[EXTEND bs=1 toks=11]", 0)


def test_kernel_classes_on_real_names(fixture_path):
    ev = trace.read_chrome_trace(fixture_path(SGL_SERVER))
    got = {s: trace.kernel_class(s) for s in set(trace.kernels(ev)["short"])}
    expect = {"nvjet_sm90_tst_128x16_64x11_2x1_v_bz_TNT": "gemm", "splitKreduce_kernel": "gemm",
              "PrefillWithKVCacheKernel": "attention", "BatchPrefillWithPagedKVCacheKernel": "attention",
              "MergeStateKernel": "attention", "PersistentVariableLengthMergeStatesKernel": "attention",
              "FusedAddRMSNormKernel": "norm", "fused_rope_kernel": "rope", "act_and_mul_kernel": "activation",
              "store_kvcache": "kv_store"}
    for k, c in expect.items():
        assert got.get(k) == c, (k, got.get(k))
    assert "other" not in got.values(), got
    assert trace.kernel_class("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "allreduce"
    assert trace.kernel_class("_fwd_grouped_kernel_stage1") == "attention"
    assert trace.kernel_class("somethingUnknown") == "other"


# ------------------------------------------------------------------ the one join: same rows as before

def _close(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return (a is None and b != b) or (b is None and a != a) or a == pytest.approx(b, rel=1e-9, abs=1e-9)
    return a == b


@pytest.mark.parametrize("name", ["sglang_server_trace_llama8b_h200_cut.json", "torch_trace_sglang_extend_step_h200_cut.json",
                                  "torch_trace_sglang_extend_step_h200_cut160.json",
                                  "sglang_story_trace_graphs_llama8b_h200_cut.json.gz",
                                  "sglang_trace_one_text_request_h100.json.gz"])
def test_step_join_gives_the_rows_of_the_helpers_it_replaced(fixture_path, name):
    """trace.step_kernels + step_summary (the one join) against what _sglang.steps_from_trace returned at 41c0fd1,
    before it was removed (tests/fixtures/expected_sglang_steps_41c0fd1.json.gz): the same steps, the same
    kernels in the same order, the same times."""
    import gzip
    import json
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sglang" / "scripts"))
    import _sglang as sg
    want = json.load(gzip.open(fixture_path("expected_sglang_steps_41c0fd1.json.gz")))["traces"][name]
    kt = trace.step_kernels(trace.read_chrome_trace(fixture_path(name)), sg.STEP_RANGE, outer=sg.OUTER_RANGE,
                            parse=sg.parse_step_name)
    got = trace.step_summary(kt)
    assert len(got) == len(want["steps"])
    for g, w in zip(got, want["steps"]):
        w = {**w, "how": {"run_batch": "outer"}.get(w["how"], w["how"])}
        assert set(w) <= set(g), set(w) - set(g)
        for k in w:
            assert _close(g[k], w[k]), (k, g[k], w[k])
    rows = [{"step": r.step, "mode": r.mode, "bs": r.bs, "kernel": r.kernel, "class": r.cls, "dur_us": r.dur_us}
            for r in kt.itertuples()]
    assert len(rows) == len(want["kernels"])
    for g, w in zip(rows, want["kernels"]):
        assert all(_close(g[k], w[k]) for k in w), (g, w)


def test_frames_derived_from_a_step_table_share_its_step_ranges(fixture_path):
    """pandas deep-copies .attrs into every frame it derives (a filter, an assign): the step ranges a step_kernels
    table carries are shared instead (trace.Shared), not copied on every filter of an analysis."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sglang" / "scripts"))
    import _sglang as sg
    kt = trace.step_kernels(trace.read_chrome_trace(fixture_path("sglang_story_trace_graphs_llama8b_h200_cut.json.gz")),
                            sg.STEP_RANGE, outer=sg.OUTER_RANGE, parse=sg.parse_step_name)
    sub = kt[kt["mode"] == "DECODE"].assign(x=1)
    assert len(kt.attrs["steps"]) == 2 and sub.attrs["steps"] is kt.attrs["steps"]
    assert trace.step_summary(sub)[1]["kernels"] == len(sub)
