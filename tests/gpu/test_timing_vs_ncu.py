"""GPU test: common.capture.timing.bench agrees with Nsight Compute's gpu__time_duration.sum.

The same elementwise kernels (y = 2x, bf16) are timed two ways: in-process by the workbook's primitive
(cold L2, every method; L2 cooled by reading, and by writing for comparison) and by ncu (--clock-control none; ncu flushes caches before each
launch by default, like cold_l2). Pass: the default method's median is within 3% of ncu's
median for a ~100 us kernel and within 5% for a ~10 us kernel.

    pytest -m gpu tests/gpu/test_timing_vs_ncu.py -s
Writes $HANDS_ON_TEST_OUT/timing_vs_ncu.json when that variable is set.

The ~10 us bar is checked after removing each instrument's own floor: a y = 2x over 1 KB (a kernel
that does almost nothing) is timed by both, and the difference of the two floors (ncu reads a fixed
~1.3 us above CUPTI on every kernel; common/capture/timing.py explains) is added to the workbook's number
before comparing. The raw difference is printed and recorded too, so the offset stays visible.
"""
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

import pytest
from common.tables import kernels

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
# memory-bound: y = 2x over a buffer of this many MB (bytes moved = 2 x size); compute-bound: a bf16
# GEMM of this M=N=K (time insensitive to the L2 state, so it isolates the timer itself)
SIZES_MB = {"~100us": 200.0, "~10us": 20.0, "floor": 0.001}
GEMM_N = {"~100us": 3328, "~10us": 1280}
TOL = {"~100us": 3.0, "~10us": 5.0}
LAUNCHES = 20


def _ncu_medians_us(tmp_path):
    from common.capture import ncu
    res = ncu.profile([sys.executable, str(ROOT / "tests/gpu/timing_workload.py"), "--mb",
                       *map(str, SIZES_MB.values()), "--gemm", *map(str, GEMM_N.values()), "--launches", str(LAUNCHES)],
                      tmp_path, kernel=ncu.with_marker("vectorized_elementwise|nvjet|gemm|splitK|sm90_xmma|cutlass"),
                      metrics=["gpu__time_duration.sum"], timeout=300,
                      cache_control="all")   # cold caches on each replay, like bench(cold_l2=True)
    s = kernels.summarize(kernels.split_points(res.df))
    labels = [("elementwise", k) for k in SIZES_MB] + [("gemm", k) for k in GEMM_N]
    out = {}
    for p, lab in enumerate(labels):  # a point = LAUNCHES calls; a call may be >1 kernel (split-K GEMM)
        g = s[s["point"] == p]
        per_call = g.groupby(g.groupby("kernel").cumcount())["ncu_time_us"].sum()
        assert len(per_call) == LAUNCHES, f"{lab}: {len(g)} kernels for {LAUNCHES} calls"
        out[lab] = statistics.median(per_call)
    return out


def test_bench_matches_ncu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    if not shutil.which(os.environ.get("NCU", "ncu")):
        pytest.skip("ncu not on PATH")
    from common.capture.timing import bench
    ref = _ncu_medians_us(tmp_path)
    rows = []
    calls = {}
    for label, mb in SIZES_MB.items():
        src = torch.randn(int(mb * 1e6) // 2, device="cuda", dtype=torch.bfloat16)
        calls[("elementwise", label)] = (lambda src=src, dst=torch.empty_like(src): torch.mul(src, 2.0, out=dst))
    for label, n in GEMM_N.items():
        a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        calls[("gemm", label)] = (lambda a=a, b=b, c=torch.empty(n, n, device="cuda", dtype=torch.bfloat16):
                                  torch.matmul(a, b, out=c))
    for (kind, label), fn in calls.items():
        for method, flush in (("cupti", "write+read"), ("events", "write+read"), ("graph", "write+read"),
                              ("cupti", "read"), ("cupti", "write")):
            t = bench(fn, method=method, cold_l2=True, reps=100, flush=flush)
            r = ref[(kind, label)]
            rows.append({"kind": kind, "kernel": label, "method": method, "flush": flush, "bench_us": t.median_us,
                         "spread_pct": t.spread_pct, "ncu_us": r, "diff_pct": 100 * (t.median_us - r) / r})
    for r in rows:
        print(f"{r['kind']:11s} {r['kernel']:7s} {r['method']:7s} {r['flush']:10s} bench {r['bench_us']:9.2f} us  ncu {r['ncu_us']:9.2f} us  "
              f"diff {r['diff_pct']:+6.2f}%  spread {r['spread_pct']:.1f}%")
    out = os.environ.get("HANDS_ON_TEST_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "timing_vs_ncu.json").write_text(json.dumps(
            {"gpu": torch.cuda.get_device_name(), "rows": rows, "tolerance_pct": TOL}, indent=1))
    import inspect
    default = inspect.signature(bench).parameters
    promise = [r for r in rows if r["method"] == default["method"].default and r["flush"] == default["flush"].default]
    floor = next(r for r in promise if r["kernel"] == "floor")
    offset = floor["ncu_us"] - floor["bench_us"]        # what ncu adds to any kernel over CUPTI
    print(f"instrument floor (y = 2x over 1 KB): ncu {floor['ncu_us']:.2f} us, workbook {floor['bench_us']:.2f} us "
          f"-> offset {offset:+.2f} us")
    for r in promise:
        r["corrected_diff_pct"] = 100 * (r["bench_us"] + offset - r["ncu_us"]) / r["ncu_us"]
        print(f"{r['kind']:11s} {r['kernel']:7s} raw {r['diff_pct']:+6.2f}%  with the floor offset {r['corrected_diff_pct']:+6.2f}%")
    if out:
        Path(out, "timing_vs_ncu.json").write_text(json.dumps(
            {"gpu": torch.cuda.get_device_name(), "rows": rows, "tolerance_pct": TOL, "floor_offset_us": offset}, indent=1))
    for r in promise:  # the default method and flush carry the promise
        if r["kernel"] == "~100us":
            assert abs(r["diff_pct"]) <= TOL[r["kernel"]], r
        elif r["kernel"] == "~10us":
            assert abs(r["corrected_diff_pct"]) <= TOL[r["kernel"]], r
    assert 0 <= offset < 3.0, f"the ncu-over-CUPTI floor offset should be a small positive constant, got {offset:.2f} us"
