"""GPU test: the measured ceilings are plausible and really are ceilings.

Measures the quick set (common.capture.probes.measure_ceilings, into a private cache: the user's cached set is left
alone) and checks:
  (a) every probe (each DRAM probe, each GEMM shape, each all-reduce size) is positive and below 1.3x
      the datasheet figure it sits beside;
  (b) each DRAM ceiling (read, mixed, copy, write) is at least every probe of its kind;
  (c) a plain torch bf16 GEMM of 8192^3 (a @ b and a @ b.T) timed on its own does not beat the bf16
      ceiling by more than 2%;
  (d) a plain torch x.sum() over 2 GiB timed on its own does not beat the DRAM read ceiling by more than 2%;
and that peaks() then reads the same set back from the cache without measuring.

    pytest -m gpu tests/gpu/test_ceilings.py -s
Writes $HANDS_ON_TEST_OUT/ceilings.json when that variable is set.
"""
import json
import os
from pathlib import Path

import pytest
from common.capture import probes

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")]

HEADROOM = 1.3          # no probe may read more than 1.3x its datasheet figure
SLACK = 1.02            # an independent measurement may exceed a ceiling by the timing noise, no more


@pytest.fixture(scope="module")
def cset(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hands-on-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HANDS_ON_CACHE", str(cache))
        c = probes.measure_ceilings(0, quick=True, refresh=True)
        print()
        probes._print_set(c)
        out = os.environ.get("HANDS_ON_TEST_OUT")
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "ceilings.json").write_text(json.dumps(c, indent=1))
        yield c


def _bench_per_call(fn, calls: int, reps: int = 5):
    """Median ms per call of ``calls`` back-to-back calls between CUDA events (common.capture.timing.bench)."""
    from common.capture.timing import bench

    def batch():
        for _ in range(calls):
            fn()
    return bench(batch, method="events", cold_l2=False, warmup=2, reps=reps).median_ms / calls


def test_every_probe_positive_and_below_datasheet_headroom(cset):
    ds = cset["datasheet"]
    checks = [(f"DRAM {p['name']}", p["tb_s"], ds and ds["dram_tb_s"]) for p in cset["dram"]["probes"]]
    checks += [(f"GEMM {s['m']}x{s['n']}x{s['k']} {s['layout']}", s["tflops"], ds and ds["bf16_tflops"])
               for s in cset["bf16"]["shapes"]]
    nv = cset.get("nvlink") or {}
    assert "error" not in nv, f"the all-reduce sweep failed: {nv.get('error')}"
    checks += [(f"all-reduce {r['bytes']} B", r["busbw_gb_s"], ds and ds.get("nvlink_gb_s", 0) / 2 or None)
               for r in nv.get("sizes", [])]
    assert len(cset["dram"]["probes"]) >= 4 and len(cset["bf16"]["shapes"]) >= 12
    for name, value, sheet in checks:
        assert value > 0, f"{name}: {value}"
        if sheet:
            assert value < HEADROOM * sheet, f"{name}: {value:.3g} is {value / sheet:.2f}x the datasheet {sheet}"


def test_dram_ceiling_is_the_best_probe(cset):
    d = cset["dram"]
    assert d["buffer_bytes"] >= 1 << 30                     # far above L2 (50-60 MB on Hopper)
    for p in d["probes"]:
        assert d["tb_s"] >= p["tb_s"], p["name"]
        assert d["kinds"][p["kind"]]["tb_s"] >= p["tb_s"], p["name"]
    assert d["tb_s"] == max(p["tb_s"] for p in d["probes"])
    assert set(d["kinds"]) == {"read", "mixed", "copy", "write"}
    assert cset["bf16"]["tflops"] == max(s["tflops"] for s in cset["bf16"]["shapes"])


@pytest.mark.parametrize("layout", ["nn", "nt"])
def test_plain_gemm_does_not_beat_the_bf16_ceiling(cset, layout):
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = b.t() if layout == "nt" else b
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    ms = _bench_per_call(lambda: torch.matmul(a, b, out=c), calls=40)
    a = b = c = None
    tflops = 2 * n ** 3 / (ms / 1e3) / 1e12
    ceil = cset["bf16"]["tflops"]
    print(f"\ntorch GEMM {n}^3 {layout}: {tflops:.1f} TFLOP/s = {100 * tflops / ceil:.1f}% of the ceiling {ceil:.1f}")
    assert tflops <= SLACK * ceil


def test_plain_sum_does_not_beat_the_dram_read_ceiling(cset):
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda").view(torch.float32)
    x.normal_()
    ms = _bench_per_call(x.sum, calls=8, reps=10)
    tb_s = (2 << 30) / (ms / 1e3) / 1e12
    read = cset["dram"]["kinds"]["read"]
    ceil = read["tb_s"]
    print(f"\ntorch x.sum() over 2 GiB: {tb_s:.3f} TB/s = {100 * tb_s / ceil:.1f}% of the read ceiling {ceil:.3f} "
          f"({read['best']})")
    x = None
    torch.cuda.empty_cache()
    assert tb_s <= SLACK * ceil


def test_peaks_reads_the_measured_set(cset, monkeypatch, tmp_path):
    from common.capture import ceilings
    cache = tmp_path / "cache"
    monkeypatch.setenv("HANDS_ON_CACHE", str(cache))
    ceilings.save_ceilings(cset)                              # as if this machine had measured it
    monkeypatch.setattr(ceilings, "_measure_in_child", lambda *a, **k: pytest.fail("must read the cache, not measure"))
    p = ceilings.peaks(0)
    assert p["source"] == "measured" and p["uuid"] == cset["uuid"]
    assert p["dram_tb_s"] == cset["dram"]["tb_s"] and p["bf16_tflops"] == cset["bf16"]["tflops"]
    rows = ceilings.ceilings_table(p)
    assert sum(r["is_ceiling"] == "yes" for r in rows) >= 2
    for r in rows:
        if r["measured"] and r["datasheet"]:
            assert 0 < r["pct_of_datasheet"] < 100 * HEADROOM
