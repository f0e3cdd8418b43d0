"""common.tables.kernels, the declared kernel table, on real Nsight Compute output.

tests/fixtures/ncu_raw_l2_resident_vs_dram_h100_cache-{none,all}.csv: the same probe run twice on a fresh H100
(2026-11-25) under ncu, with the caches as the application left them (none) and flushed before each pass (all):
RMSNorm / fused add+RMSNorm / act_and_mul / decode GEMVs, each input just written by a copy, at a size that fits
in L2 (50 MB) and one far above it (tests/fixtures/README.md).
"""
import math
import re

import pytest

from common.base import story  # noqa: E402
from common.capture import ncu  # noqa: E402
from common.tables import kernels  # noqa: E402
from common.judge import bounds  # noqa: E402

H100 = {"dram_tb_s": 3.30, "dram_read_tb_s": 3.16, "dram_write_tb_s": 3.30, "dram_copy_tb_s": 3.02,
        "dram_mixed_tb_s": 3.08, "l2_mb": 50.0, "bf16_tflops": 804.0}
# read, write and copy as that H100 measured them (tests/fixtures/ceilings_log_h100.txt); "mixed" was not
# measured by that probe version: 3.08 stands for it in these tests only


def _rows(fixture_path, cc):
    s = kernels.summarize(ncu.read_raw(fixture_path(f"ncu_raw_l2_resident_vs_dram_h100_cache-{cc}.csv")), peaks=H100)
    return [r for r in s.to_dict("records") if r["kernel"] != ncu.MARKER_KERNEL]


def test_every_declared_counter_is_a_column_of_the_summary(fixture_path):
    s = kernels.summarize(ncu.read_raw(fixture_path("ncu_raw_l2_resident_vs_dram_h100_cache-none.csv")), peaks=H100)
    assert kernels.names("counters") == [c for c in s.columns if c in kernels.names("counters")]
    assert {"gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_sector_hit_rate.pct",
            "launch__registers_per_thread", "launch__shared_mem_per_block"} <= set(kernels.SUMMARY_METRICS)
    assert len(set(kernels.SUMMARY_METRICS)) == len(kernels.SUMMARY_METRICS)
    for c in kernels.COLUMNS.values():
        assert c.doc and c.group in kernels.GROUPS, c.name


def test_l2_resident_input_moves_no_dram_bytes(fixture_path):
    """FusedAddRMSNorm on 256 x 4096 (2 MB each for x and the residual): with the caches as the copy before it left
    them, ncu counts 0.02 MB from DRAM; flushed, 4.2 MB. The formula says 8.4 MB (read x, r; write x, r)."""
    none = {r["kernel"] + str(round(r["ncu_time_us"] > 100)): r for r in _rows(fixture_path, "none")}
    flushed = {r["kernel"] + str(round(r["ncu_time_us"] > 100)): r for r in _rows(fixture_path, "all")}
    small, small_cold = none["FusedAddRMSNormKernel0"], flushed["FusedAddRMSNormKernel0"]
    formula = 256 * 4096 * 2 * 4
    assert small["dram_read_mb"] < 0.05 and small_cold["dram_read_mb"] == pytest.approx(4.2, abs=0.05)
    assert small["l2_hit_pct"] > 85 > 60 > small_cold["l2_hit_pct"]
    assert kernels.resident({**small, "bytes": formula}) and not kernels.resident({**small_cold, "bytes": formula})
    big = none["FusedAddRMSNormKernel1"]                       # 65,536 tokens: 512 MB each, far above L2
    assert big["dram_kind"] == "copy" and 95 < big["dram_pct"] < 100
    assert not kernels.resident({**big, "bytes": 65536 * 4096 * 2 * 4})


def test_dram_percent_uses_the_ceiling_of_the_traffic(fixture_path):
    rows = _rows(fixture_path, "none")
    gemv = next(r for r in rows if r["kernel"].startswith("nvjet_sm90_tst_128x8"))
    assert gemv["dram_kind"] == "read" and gemv["dram_pct"] == pytest.approx(100 * gemv["dram_tb_s"] / 3.16)
    act = [r for r in rows if r["kernel"] == "act_and_mul_kernel"][-1]      # 470 MB read, 239 MB written
    assert act["dram_kind"] == "mixed" and act["dram_pct"] == pytest.approx(100 * act["dram_tb_s"] / 3.08)
    assert all(r["dram_pct"] <= 100 for r in rows)


def test_hopper_gemm_reads_as_one_cta_per_sm_by_design(fixture_path):
    gemv = next(r for r in _rows(fixture_path, "none") if r["kernel"].startswith("nvjet"))
    assert gemv["ctas_per_sm"] == 1 and gemv["warps_per_cta"] == 12 and gemv["regs_per_thread"] == 168
    assert gemv["smem_kb_per_cta"] > 150 and gemv["limiter"] == "registers+shared_mem (1 CTAs/SM)"
    j = kernels.joined(__import__("pandas").DataFrame([{**gemv, "dur_us": 16.0}]), H100).iloc[0]
    assert j["one_cta_per_sm"] and j["ncu_ratio"] == pytest.approx(gemv["ncu_time_us"] / 16.0)
    label, kids = kernels.node(j.to_dict())
    text = " · ".join(k for k, _ in kids)
    assert "one CTA per SM by design" in text and "168 regs/thread" in text and "12.0 warps/CTA" in text
    assert all(len(line) <= story.WIDTH for line in story.tree("", [(label, kids)]).splitlines())   # wrapped


def test_stalls_on_a_saturated_pipe_are_not_called_a_bottleneck():
    assert "not a bottleneck" in kernels.stall_note({"top_stalls": "gmma 40%, wait 20%", "tensor_pct": 88.0})
    assert "saturated DRAM" in kernels.stall_note({"top_stalls": "long_scoreboard 93%", "dram_pct": 89.0})
    assert "latency" in kernels.stall_note({"top_stalls": "long_scoreboard 45%", "dram_pct": 21.0})
    assert kernels.stall_note({"top_stalls": "gmma 40%", "tensor_pct": 20.0}) == ""
    assert bounds.bound_why({"top_stalls": "gmma 40%, wait 20%", "tensor_pct": 88.0, "dram_sol_pct": 10.0,
                          "sm_pct": 80.0}).endswith("not a bottleneck")


LABEL = re.compile(r"(\d[\d.,]*)\s*TB/s[^·\n]*?(\d[\d.]*)% (?:of (?:the )?)?(?:measured )?DRAM")


def test_a_formula_bytes_rate_is_never_labelled_dram(fixture_path):
    """The work line prints effective bandwidth; only the ncu line may say DRAM, with ncu's bytes."""
    r = _rows(fixture_path, "none")[1]                     # the L2-resident FusedAddRMSNorm
    row = {**r, "dur_us": 5.0, "bytes": 8.4e6, "eff_tb_s": 8.4e6 / 5e-6 / 1e12, "flops": math.nan}
    label, kids = kernels.node(kernels.joined(__import__("pandas").DataFrame([row]), H100).iloc[0].to_dict())
    work, counters = kids[0][0], kids[1][0]
    assert work.startswith("work: effective 1.68 TB/s (formula bytes / time)") and "DRAM" not in work
    assert "L2-resident" in work
    assert counters.startswith("ncu ") and "DRAM 4.15 GB/s = 0.13% of the read ceiling (0.02 MB)" in counters
    assert not LABEL.search(work) and LABEL.search("act_and_mul 3.54 TB/s = 107% DRAM")     # the old label


def test_l2_hit_rate_out_of_range_is_no_rate(fixture_path):
    """ncu's lts__t_sector_hit_rate.pct read 146 of the 266 kernels of the H200 08 --ncu pass (224595d, served
    kernels, --cache-control none) above 100% (up to 1,269%): hits and queries from different replay passes of
    small kernels. Such a value is no hit rate: the table leaves it empty and a kernel line does not print it."""
    h200 = {"dram_tb_s": 4.70, "dram_read_tb_s": 4.60, "dram_write_tb_s": 4.70, "dram_copy_tb_s": 4.28,
            "dram_mixed_tb_s": 4.41, "l2_mb": 60.0, "bf16_tflops": 800.0}   # that run's ceilings (its log)
    s = kernels.summarize(ncu.read_raw(fixture_path("ncu_raw_l2_hit_out_of_range_h200_sglang08.csv")), peaks=h200)
    assert len(s) == 4
    assert s["l2_hit_pct"].isna().sum() == 2 and s["l2_hit_pct"].dropna().between(0, 100).all()
    bad = {**s.iloc[0].to_dict(), "l2_hit_pct": 351.71}             # a recorded row from before the check
    assert "L2 hit" not in str(kernels.node(bad, head="x"))
    assert "L2 hit" in str(kernels.node({**bad, "l2_hit_pct": 61.0}, head="x"))


def test_one_new_ncu_metric_reaches_every_kernel_line_from_its_declaration(fixture_path):
    """The L1 hit rate was added as one Col of common/tables/kernels.py (its metric, its derivation, its words on a line):
    ncu collects it (SUMMARY_METRICS), summarize derives it and every kernel line prints it. Real --set full rows of
    five FlashInfer kernels on an H200 (ncu_raw_fullset_flashinfer_5kernels_h200.csv)."""
    h200 = {"dram_tb_s": 4.70, "dram_read_tb_s": 4.60, "dram_write_tb_s": 4.70, "dram_copy_tb_s": 4.28,
            "dram_mixed_tb_s": 4.41, "l2_mb": 60.0, "bf16_tflops": 800.0}
    assert "l1tex__t_sector_hit_rate.pct" in kernels.SUMMARY_METRICS
    s = kernels.summarize(ncu.read_raw(fixture_path("ncu_raw_fullset_flashinfer_5kernels_h200.csv")), peaks=h200)
    rms = s[s["kernel"] == "RMSNormKernel"].iloc[0].to_dict()
    assert rms["l1_hit_pct"] == pytest.approx(47.0)
    first = kernels.node(rms)[1][0][0]
    assert "L2 hit" in first and "L1 hit 47.0%" in first and first.index("L1 hit") < first.index("SM ")


def test_a_table_read_back_from_csv_claims_no_flag(tmp_path):
    """A kernel table written to CSV and read back (the --reanalyse paths) has NaN where no ncu pass set the flags:
    NaN is truthy, and the tree once called every such kernel L2-resident and one-CTA-per-SM (mini-SGLang 08's
    re-analysed H100 page); a flag set True survives the round trip."""
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame([{"kernel": "a", "dur_us": 3.0, "l2_resident": None, "one_cta_per_sm": None},
                       {"kernel": "b", "dur_us": 3.0, "l2_resident": True, "one_cta_per_sm": True}])
    df.to_csv(tmp_path / "t.csv", index=False)
    a, b = pd.read_csv(tmp_path / "t.csv").to_dict("records")
    assert math.isnan(a["l2_resident"]) and kernels.node(a) == ("a 3.00 us", [])
    assert "L2-resident" in str(kernels.node(b)) and "one CTA per SM by design" in str(kernels.node(b))
