"""common.trace on real torch-profiler and nsys output (tests/fixtures/README.md)."""
import pytest

from common import trace

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


def test_annotate_joins_ranges_and_kernels(fixture_path):
    ev = trace.read_chrome_trace(fixture_path(TRACE))
    runs = ev[ev["kind"] == "cpu_op"]
    assert len(runs)                                                    # CPU ops were recorded
    # the fixture has no user ranges: annotate finds none rather than inventing them
    assert trace.annotate(ev, r"step\[").empty


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
