"""GPU tests: the measured ceilings (common.capture.ceilings.peaks) are plausible against the datasheet and cached per
GPU; NVTX/record_function ranges show up in a torch-profiler trace with the kernels inside them.
tests/gpu/test_ceilings.py checks that the ceilings really are ceilings.

    pytest -m gpu tests/gpu -s
"""
import pytest

pytestmark = pytest.mark.gpu


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    return torch


def test_measured_peaks_against_datasheet(tmp_path, monkeypatch):
    """peaks() with an empty cache measures the quick ceilings once, in a child process (this process
    gets no CUDA context from it), caches them per GPU UUID, and reads them back afterwards."""
    _torch()
    monkeypatch.setenv("HANDS_ON_CACHE", str(tmp_path))
    from common.capture import ceilings
    children = []
    real = ceilings._measure_in_child
    monkeypatch.setattr(ceilings, "_measure_in_child", lambda *a, **k: children.append(a) or real(*a, **k))
    p = ceilings.peaks()
    assert len(children) == 1                                            # measured once, in a child process
    spec = p["datasheet"]
    print(f"{p['gpu']}: DRAM {p['dram_tb_s']:.2f} TB/s ({p['method']['dram_tb_s']}; datasheet "
          f"{spec and spec['dram_tb_s']}), bf16 {p['bf16_tflops']:.0f} TFLOP/s ({p['method']['bf16_tflops']}; "
          f"datasheet {spec and spec['bf16_tflops']})")
    assert p["source"] == "measured" and p["measured"]["version"] == ceilings.CEILINGS_VERSION
    if spec:  # a real GPU lands below its datasheet, but not far below
        assert 0.6 * spec["dram_tb_s"] < p["dram_tb_s"] < 1.05 * spec["dram_tb_s"]
        assert 0.5 * spec["bf16_tflops"] < p["bf16_tflops"] < 1.05 * spec["bf16_tflops"]
    assert (tmp_path / "ceilings" / f"{p['uuid']}.json").is_file()
    again = ceilings.cached_peaks()                                           # second read: from the cache
    assert again["dram_tb_s"] == p["dram_tb_s"] and again["bf16_tflops"] == p["bf16_tflops"]
    assert ceilings.peaks()["measured"]["date_utc"] == p["measured"]["date_utc"] and len(children) == 1  # not again


def test_ranges_appear_in_torch_profiler_trace(tmp_path):
    torch = _torch()
    from torch.profiler import ProfilerActivity, profile

    from common.tables import trace
    from common.capture.ranges import nvtx_range
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(3):
            with nvtx_range(f"matmul step={i} n=4096"):
                x @ x
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    ev = trace.read_chrome_trace(tmp_path / "t.json")
    kr = trace.kernels_in_ranges(ev, r"^matmul step=")
    steps = kr.groupby("range", sort=False).agg(kernels=("kernel", "count"), kernel_us=("dur_us", "sum")).reset_index()
    assert list(steps["range"]) == [f"matmul step={i} n=4096" for i in range(3)]
    assert (steps["kernels"] >= 1).all() and (steps["kernel_us"] > 0).all()
