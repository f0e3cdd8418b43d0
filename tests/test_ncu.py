"""common.capture.ncu against real Nsight Compute output captured on an H200 (tests/fixtures/README.md)."""
import math

import pytest

from common.capture import ncu  # noqa: E402
from common.tables import kernels  # noqa: E402
from common.judge import bounds  # noqa: E402


def test_raw_page_kernels_units_and_separators(fixture_path):
    df = ncu.read_raw(fixture_path("ncu_raw_flashinfer_decode-prefill-rmsnorm_h200_clock-none.csv"))
    assert len(df) == 4
    assert df.attrs["units"]["gpu__time_duration.sum"] == "ns"
    assert df.attrs["units"]["dram__bytes_read.sum"] == "byte"
    # "1,980,000" in the file: thousands separators must not break the number
    assert df["device__attribute_clock_rate"].iloc[0] == 1_980_000
    assert [ncu.short_name(k) for k in df["Kernel Name"]] == [
        "BatchDecodeWithPagedKVCacheKernel", "BatchPrefillWithPagedKVCacheKernel",
        "RMSNormKernel", "FusedAddRMSNormKernel"]


def test_summary_time_bytes_and_bandwidth(fixture_path):
    s = kernels.summarize(ncu.read_raw(fixture_path("ncu_raw_flashinfer_decode-prefill-rmsnorm_h200_clock-none.csv")),
                      peaks={"dram_tb_s": 4.0, "dram_read_tb_s": 3.9, "dram_copy_tb_s": 3.6})
    dec = s.iloc[0]
    assert dec["ncu_time_us"] == pytest.approx(200.512)                  # "200,512" ns
    assert dec["dram_read_mb"] == pytest.approx(537.311232)              # "537,311,232" byte
    tb_s = (537_311_232 + 3_209_984) / 200.512e-6 / 1e12
    assert dec["dram_tb_s"] == pytest.approx(tb_s)
    assert dec["dram_kind"] == "read"                                    # 0.6% of its bytes are writes
    assert dec["dram_pct"] == pytest.approx(100 * tb_s / 3.9)           # against the READ ceiling
    assert dec["dram_sol_pct"] == pytest.approx(56.03)                   # ncu's own % of its theoretical peak
    assert dec["limiter"].startswith("registers")


def test_default_clock_control_slows_the_same_kernels(fixture_path):
    """Why the workbook passes --clock-control none: base clocks read slower than real runs."""
    base = kernels.summarize(ncu.read_raw(fixture_path("ncu_raw_flashinfer_decode-prefill-rmsnorm_h200_clock-base.csv")))
    none = kernels.summarize(ncu.read_raw(fixture_path("ncu_raw_flashinfer_decode-prefill-rmsnorm_h200_clock-none.csv")))
    assert list(base["kernel"]) == list(none["kernel"])
    assert (base["ncu_time_us"] > none["ncu_time_us"]).all()
    assert base["ncu_time_us"].iloc[0] > 1.2 * none["ncu_time_us"].iloc[0]      # decode: 254 vs 200.5 us


def test_full_set_summary_has_hardware_story(fixture_path):
    df = ncu.read_raw(fixture_path("ncu_raw_fullset_flashinfer_5kernels_h200.csv"))
    assert df.shape == (5, 2238)
    s = kernels.summarize(df)
    by = {r["kernel"]: r for r in s.to_dict("records")}
    prefill, decode = by["BatchPrefillWithPagedKVCacheKernel"], by["BatchDecodeWithPagedKVCacheKernel"]
    assert prefill["tensor_pct"] > 30 > decode["tensor_pct"]          # FA2 prefill uses the tensor pipe
    assert decode["dram_sol_pct"] == pytest.approx(56.57)               # from gpu__dram_throughput in --set full
    assert prefill["limiter"] == "registers+shared_mem (2 CTAs/SM)" and prefill["ctas_per_sm"] == 2
    assert prefill["warps_per_cta"] == 4 and prefill["regs_per_thread"] > 100 and prefill["smem_kb_per_cta"] > 30
    assert by["RMSNormKernel"]["occupancy_pct"] == pytest.approx(91.10)
    for r in s.to_dict("records"):
        shares = [v for k, v in r.items() if k.startswith("stall_") and not (isinstance(v, float) and math.isnan(v))]
        assert sum(shares) == pytest.approx(100.0)
        assert r["top_stalls"].count("%") == 3
    assert bounds.bound(by["FusedAddRMSNormKernel"]) == "memory-bound"


def test_csv_parser_agrees_with_nvidias_report_reader(fixture_path):
    """The CSV that `ncu --import` printed and NVIDIA's ncu_report reading the same .ncu-rep agree."""
    import ncu_report  # tests/requirements.txt; runs without a GPU
    rep = ncu_report.load_report(str(fixture_path("ncu_rep_sol_occupancy_flashinfer_rmsnorm_h200.ncu-rep")))
    action = rep.range_by_idx(0).action_by_idx(0)
    df = ncu.read_raw(fixture_path("ncu_raw_from_rep_sol_occupancy_flashinfer_rmsnorm_h200.csv"))
    assert ncu.short_name(df["Kernel Name"].iloc[0]) == action.name() == "RMSNormKernel"
    names = set(action.metric_names())
    units = df.attrs["units"]
    assert units["gpu__time_duration.sum"] == "us"     # `ncu --import` scales units: the units row matters
    compared = 0
    for col in df.columns:
        v, unit = df[col].iloc[0], units[col]
        if col not in names or not isinstance(v, float) or math.isnan(v) or "/" in unit and unit not in ncu.BASE_UNITS:
            continue
        got = v * ncu.BASE_UNITS[unit] if unit in ncu.BASE_UNITS else v
        ref = action.metric_by_name(col).as_double()
        tol = max(0.006, abs(ref) * 1e-4) * (ncu.BASE_UNITS.get(unit, 1))   # the CSV prints 2 decimals
        assert got == pytest.approx(ref, abs=tol), col
        compared += 1
    assert compared >= 50
    assert kernels.summarize(df)["ncu_time_us"].iloc[0] == pytest.approx(
        action.metric_by_name("gpu__time_duration.sum").as_double() / 1e3)


def test_summary_metrics_exist_on_hopper(fixture_path):
    """Every metric the summary list asks for is one this ncu knows (or one --set full printed)."""
    import csv
    known = set(fixture_path("ncu_metric_names_gh100_h200.txt").read_text().split())
    header = set(next(csv.reader(open(fixture_path("ncu_raw_fullset_flashinfer_5kernels_h200.csv")))))
    for m in kernels.SUMMARY_METRICS:
        assert m in header or m.split(".")[0] in known, m


def test_truncated_csv_fails_loudly(fixture_path):
    with pytest.raises(ncu.NcuParseError, match="truncated"):
        ncu.read_raw(fixture_path("bad_ncu_raw_truncated.csv"))


def test_missing_units_row_fails_loudly(fixture_path):
    with pytest.raises(ncu.NcuParseError, match="units row"):
        ncu.read_raw(fixture_path("bad_ncu_raw_no_units_row.csv"))


def test_log_without_kernels_is_not_a_csv(fixture_path):
    text = fixture_path("bad_ncu_log_no_kernels.txt").read_text()
    assert ncu.extract_csv(text) == ""
    with pytest.raises(ncu.NcuParseError):
        ncu.read_raw(ncu.extract_csv(text) + "\n")


def test_extract_csv_drops_prof_lines_and_app_output(fixture_path):
    csv_text = fixture_path("ncu_raw_flashinfer_decode-prefill-rmsnorm_h200_clock-none.csv").read_text()
    mixed = "==PROF== Connected to process 7\nhello from the app\n" + csv_text + "==PROF== Disconnected\n"
    assert len(ncu.read_raw(ncu.extract_csv(mixed))) == 4


def test_unexpected_unit_is_rejected(fixture_path):
    df = ncu.read_raw(fixture_path("ncu_raw_flashinfer_decode-prefill-rmsnorm_h200_clock-none.csv"))
    df.attrs["units"]["gpu__time_duration.sum"] = "furlong"
    with pytest.raises(ncu.NcuParseError, match="unexpected unit"):
        kernels.summarize(df)


def test_usecond_units_are_converted(fixture_path):
    df = ncu.read_raw(fixture_path("ncu_raw_flashinfer_decode-prefill-rmsnorm_h200_clock-none.csv"))
    df["gpu__time_duration.sum"] = df["gpu__time_duration.sum"] / 1e3
    df.attrs["units"]["gpu__time_duration.sum"] = "usecond"
    assert kernels.summarize(df)["ncu_time_us"].iloc[0] == pytest.approx(200.512)


def test_marker_points_split_launches(fixture_path):
    """Sweep points under ncu: rows between marker kernels belong to one point."""
    df = ncu.read_raw(fixture_path("ncu_raw_flashinfer_decode-prefill-rmsnorm_h200_clock-none.csv"))
    import pandas as pd
    mark = df.iloc[[0]].copy()
    mark["Kernel Name"] = "spin_kernel(long)"
    parts = [mark, df.iloc[[0, 1]], mark, df.iloc[[2]], mark, df.iloc[[3]]]
    glued = pd.concat(parts, ignore_index=True)
    glued.attrs = df.attrs
    s = kernels.summarize(kernels.split_points(glued))
    assert list(s["point"]) == [0, 0, 1, 2]
    assert "spin_kernel" not in set(s["kernel"])


def test_build_cmd_flags():
    cmd = ncu.build_cmd(["python", "x.py"], log_file="l.txt", kernel="Decode", launch_skip=2, launch_count=3,
                        metrics=kernels.SUMMARY_METRICS)
    assert cmd[-2:] == ["python", "x.py"]
    assert cmd[cmd.index("--clock-control") + 1] == "none"
    assert cmd[cmd.index("--kernel-name") + 1] == "regex:Decode"
    assert cmd[cmd.index("--launch-skip") + 1] == "2" and cmd[cmd.index("--launch-count") + 1] == "3"
    assert "gpu__time_duration.sum" in cmd[cmd.index("--metrics") + 1].split(",")
    full = ncu.build_cmd(["a"], log_file="l", section_set="full")
    assert "--metrics" not in full and full[full.index("--set") + 1] == "full"


# ------------------------------------------------------------------ the one log reader, named gaps, readings
FULL = "ncu_raw_fullset_flashinfer_5kernels_h200.csv"


def test_read_log_keeps_only_csv_lines(fixture_path, tmp_path):
    log = tmp_path / "ncu_log.txt"
    body = fixture_path("ncu_raw_flashinfer_decode-prefill-rmsnorm_h200_clock-none.csv").read_text()
    log.write_text("==PROF== Connected to process 123\napp says hello\n" + body + "==PROF== Disconnected\n")
    df = ncu.read_log(log, tmp_path / "ncu.csv")
    assert len(df) == len(ncu.read_raw(body)) and (tmp_path / "ncu.csv").read_text() == ncu.extract_csv(body)


def test_read_log_errors_are_one_line_and_named(fixture_path, tmp_path):
    from common.base.checks import SetupError
    with pytest.raises(ncu.NcuError, match="profiled no kernel"):
        ncu.read_log(fixture_path("bad_ncu_log_no_kernels.txt"))
    perm = tmp_path / "perm.txt"
    perm.write_text("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters\n")
    with pytest.raises(SetupError, match="NVreg_RestrictProfilingToAdminUsers"):
        ncu.read_log(perm)


def test_a_missing_time_metric_is_named(fixture_path):
    df = ncu.read_raw(fixture_path(FULL)).drop(columns=["gpu__time_duration.sum"])
    with pytest.raises(ncu.NcuParseError, match="gpu__time_duration.sum"):
        kernels.summarize(df)
    df = ncu.read_raw(fixture_path(FULL)).drop(columns=["dram__bytes_write.sum"])
    assert kernels.summarize(df).attrs["missing_metrics"] == ["dram__bytes_write.sum"]


def test_bound_reads_the_stalls_not_only_sm_vs_dram(fixture_path):
    rows = {r["kernel"]: r for r in kernels.summarize(ncu.read_raw(fixture_path(FULL))).to_dict("records")}
    norm = rows["RMSNormKernel"]
    # SM 62% > DRAM 55% (ncu's speed-of-light figures), but the warps wait on memory: not compute-bound
    assert norm["sm_pct"] > norm["dram_sol_pct"] and bounds.top_stall(norm) == "long_scoreboard"
    assert bounds.bound(norm) == "memory-latency-bound"
    assert "long_scoreboard" in bounds.bound_why(norm) and "global/local memory load" in bounds.bound_why(norm)
    assert bounds.bound(rows["BatchPrefillWithPagedKVCacheKernel"]) == "compute-bound (tensor cores)"
    assert bounds.bound(rows["FusedAddRMSNormKernel"]) == "memory-bound"
    assert "FIXED-latency" not in bounds.STALL_MEANING["wait"] and "fixed-latency" in bounds.STALL_MEANING["wait"]
    assert set(bounds.STALL_MEANING) >= set(kernels.STALL_REASONS) - {"selected"}


def test_a_closer_look_at_one_kernel_from_the_full_set(fixture_path):
    """bounds.look on the full-set row of FlashInfer's decode kernel (H200): under one wave (1,024 CTAs, 0.97 waves),
    issue slots 77% busy, the ALU the busiest pipe, long_scoreboard-free stalls named with their meaning."""
    df = ncu.read_raw(fixture_path(FULL))
    s = kernels.summarize(df).iloc[0].to_dict()
    lines = bounds.look(df.iloc[0].to_dict(), s)
    assert lines[0].startswith("launch: 1,024 CTAs for 132 SMs, 0.97 waves") and "less than one wave" in lines[0]
    assert "77% of the active cycles" in lines[1] and "busy" in lines[1]
    assert lines[2].startswith("pipes (% of peak while active): alu 59%, lsu 36%, fma 34%")
    assert lines[3].startswith("instructions: 147,730,016 warp instructions") and "per DRAM byte" in lines[3]
    assert lines[4].startswith("stalls: ") and bounds.top_stall(s) in lines[4]
    assert bounds.look({"launch__grid_size": "n/a"}) == []                  # nothing to say: nothing said


def test_a_long_profile_says_every_minute_how_far_it_is(tmp_path, monkeypatch, fixture_path):
    """ncu.profile waits with a heartbeat (common.capture.procs.Group.wait): while ncu runs it prints the application's
    last line (the ncu targets print one per point) and, where ncu's --log-file has them, how many kernel launches
    ncu has profiled. In CSV mode it has none until the application ends (the real H100 log): the line says so
    instead of "0 profiled", which read as a stall before the first kernel on the H100 run where FlashInfer 03's
    child sat ~10 min. Here the tests' stand-in ncu hangs around an application that printed one line; the beat is
    shortened to 0.3 s."""
    import os
    import sys
    from pathlib import Path
    fakes = Path(__file__).parent / "fakes"
    monkeypatch.setenv("PATH", f"{fakes}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NCU", "hang")
    monkeypatch.setenv("FAKE_NCU_PIDS", str(tmp_path / "pids"))
    monkeypatch.setattr(ncu, "HEARTBEAT_S", 0.3)
    monkeypatch.setitem(sys.modules, "torch", _FakeTorch(reserved=40e9, allocated=6e9))
    said = []
    with pytest.raises(ncu.NcuError, match="did not finish within 2 s"):
        ncu.profile([sys.executable, "-c", "print('building the decode module', flush=True); "
                     "import time; time.sleep(60)"], tmp_path / "out", timeout=2, echo=said.append)
    assert said[1] == "ncu: released 34.0 GB of GPU memory this process kept cached, for the profiled application"
    assert sys.modules["torch"].cuda.freed   # before the application started (said[1] comes before any beat)
    beats = [s for s in said if s.startswith("ncu: still running after")]
    assert len(beats) >= 2, said
    assert beats[-1].endswith("no kernel row yet (in CSV mode ncu writes its rows when the application ends); "
                              "the application's last line: building the decode module")
    # the real log of a CSV-mode profile while its application ran (one H100): no 'Profiling' line to count, so the
    # line must not claim "0 kernel launches profiled"; the application's per-point line (ncu.mark) says where it is
    log = fixture_path("ncu_log_csv_mode_h100_head.txt")
    out = tmp_path / "app.txt"
    out.write_text("==WARNING== Note: Running with uncontrolled GPU caches.\n"
                   "ncu-target: point 9/24: decode cuda b=256 kv=32768\n")
    assert ncu.progress_line(61.2, log, out) == (
        "ncu: still running after 61 s: no kernel row yet (in CSV mode ncu writes its rows when the application "
        "ends); the application's last line: ncu-target: point 9/24: decode cuda b=256 kv=32768")
    assert "2 kernel launch(es) profiled so far" in ncu.progress_line(
        5, _lines(tmp_path, '==PROF== Profiling "a" - 0: 0%....100% - 38 passes', '==PROF== Profiling "b" - 1: 0%'), out)


def _lines(tmp_path, *lines):
    p = tmp_path / "log_lines.txt"
    p.write_text("\n".join(lines) + "\n")
    return p


class _FakeTorch:
    """Just the torch.cuda calls ncu.release_gpu_cache makes."""
    def __init__(self, reserved, allocated, initialized=True):
        self.cuda = self
        self.reserved, self.allocated, self.initialized, self.freed = reserved, allocated, initialized, False

    def is_initialized(self):
        return self.initialized

    def memory_reserved(self):
        return self.reserved

    def memory_allocated(self):
        return self.allocated

    def empty_cache(self):
        self.freed = True


def test_release_gpu_cache_says_what_it_gave_back_and_only_when_it_matters(monkeypatch):
    import sys
    said = []
    monkeypatch.setitem(sys.modules, "torch", _FakeTorch(reserved=0.5e9, allocated=0.2e9))
    assert ncu.release_gpu_cache(said.append) == pytest.approx(0.3) and said == []   # under 1 GB: freed, not said
    monkeypatch.setitem(sys.modules, "torch", _FakeTorch(reserved=9e9, allocated=0, initialized=False))
    assert ncu.release_gpu_cache(said.append) == 0.0 and not sys.modules["torch"].freed   # CUDA never started
    monkeypatch.delitem(sys.modules, "torch")
    assert ncu.release_gpu_cache(said.append) == 0.0 and said == []                      # no torch in this process


def test_other_step_launches_against_the_largest_or_the_expected_bytes():
    """The KV reads (MB) of the recorded SGLang 05 decode window (tests/fixtures/recordings_h200/sglang/
    05_ncu_attention/attention_kernels.csv): launches 0-1 are one request's 4k KV, 2-3 the batch's. The rule is
    relative to the largest launch, or to the expected bytes when given (a window of short steps only is all
    'other', never the batch)."""
    reads = {0: 16.846592, 1: 16.846848, 2: 539.1872, 3: 539.187712}
    assert kernels.other_step_launches(reads) == {0, 1}
    assert kernels.other_step_launches({k: v * 1e6 for k, v in reads.items()}, expected=32 * 4096 * 8 * 128 * 2 * 2) == {0, 1}
    assert kernels.other_step_launches({0: 16.8e6, 1: 16.8e6}, expected=537e6) == {0, 1}
    assert kernels.other_step_launches({0: 16.8, 1: 16.8}) == set() and kernels.other_step_launches({}) == set()
