"""GPU tests: the measured-peak probe is plausible against the datasheet; NVTX/record_function ranges
show up in a torch-profiler trace with the kernels inside them.

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
    _torch()
    monkeypatch.setenv("HANDS_ON_CACHE", str(tmp_path))
    from common import gpu
    p = gpu.peaks()
    spec = p["datasheet"]
    print(f"{p['gpu']}: copy {p['dram_tb_s']:.2f} TB/s (datasheet {spec and spec['dram_tb_s']}), "
          f"bf16 GEMM {p['bf16_tflops']:.0f} TFLOP/s (datasheet {spec and spec['bf16_tflops']})")
    assert p["source"] == "measured"
    if spec:  # a real GPU lands below its datasheet, but not far below
        assert 0.6 * spec["dram_tb_s"] < p["dram_tb_s"] < 1.05 * spec["dram_tb_s"]
        assert 0.5 * spec["bf16_tflops"] < p["bf16_tflops"] < 1.05 * spec["bf16_tflops"]
    again = gpu.measure_peaks()                                          # second call: from the cache
    assert again["dram_tb_s"] == p["dram_tb_s"]


def test_ranges_appear_in_torch_profiler_trace(tmp_path):
    torch = _torch()
    from torch.profiler import ProfilerActivity, profile

    from common import trace
    from common.ranges import nvtx_range
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(3):
            with nvtx_range(f"matmul step={i} n=4096"):
                x @ x
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    ev = trace.read_chrome_trace(tmp_path / "t.json")
    steps = trace.annotate(ev, r"matmul step=")
    assert list(steps["name"]) == [f"matmul step={i} n=4096" for i in range(3)]
    assert (steps["kernels"] >= 1).all() and (steps["kernel_us"] > 0).all()
