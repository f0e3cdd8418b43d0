"""common.capture.clocks on a real NVML log: the GEMM sweep of a fresh H100 reaching its power cap.

tests/fixtures/nvml_clock_log_ceilings_h100.csv is NVML sampled every 10 ms while the version-4 ceilings ran
(ceilings_log_h100.txt: each probe's line with its epoch time stamp, written when the probe ended).
"""
import math
import sys
import time
from pathlib import Path

import pytest

from common.capture import clocks

FIX = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def log():
    rows = clocks.read_csv(FIX / "nvml_clock_log_ceilings_h100.csv")
    lines = []
    for line in (FIX / "ceilings_log_h100.txt").read_text().splitlines():
        t, msg = line.split(" ", 1)
        lines.append((float(t), msg.strip()))
    return rows, lines


def _probe(lines, needle):
    """(start, end) of the probe whose line contains ``needle``: from the previous line's time to its own."""
    for (t_prev, _), (t, msg) in zip(lines, lines[1:]):
        if needle in msg:
            return t_prev, t
    raise AssertionError(needle)


def test_reason_bits_are_named():
    assert clocks.reason_names(4) == ["power cap"]
    assert clocks.reason_names(1 | 4 | 0x40) == ["idle", "power cap", "thermal (hardware)"]
    assert clocks.reason_names("n/a") == []


def test_the_sweep_reaches_the_power_cap_and_the_clock_falls(log):
    rows, lines = log
    assert len(rows) > 900 and {"t", "sm_mhz", "power_w", "reasons"} <= set(rows[0])
    first = clocks.window(rows, *_probe(lines, "GEMM  8192x 8192x 8192 nt"))
    assert first["sm_mhz"] == 1980 and first["slowdown"] == []                    # full clock, no cap yet
    big = clocks.window(rows, *_probe(lines, "GEMM 16384x16384x16384 nn"))
    assert big["slowdown"] == ["power cap"] and big["sm_mhz"] < 1500 and big["power_w_max"] > 450
    down = clocks.window(rows, *_probe(lines, "GEMM  8192x 4096x14336 nt"))  # the best shape of that sweep
    assert down["slowdown"] == ["power cap"] and down["sm_mhz"] <= 1600          # measured at a lowered clock
    dram = clocks.window(rows, *_probe(lines, "DRAM torch copy_"))
    assert dram["slowdown"] == [] and dram["mem_mhz"] == 2619


def test_an_empty_window_reads_the_state_before(log):
    rows, _ = log
    w = clocks.window(rows, rows[5]["t"] + 1e-4, rows[5]["t"] + 2e-4)
    assert w["samples"] == 1 and w["sm_mhz"] == rows[5]["sm_mhz"]
    assert clocks.window([], 0, 1) == {"samples": 0}


def test_sampler_without_nvml_records_nothing_and_says_why(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with clocks.Sampler() as s:
        pass
    assert not s.available and s.rows == [] and "NVML" in s.why
    assert clocks.wait_cool(s) == 0.0


def test_write_and_read_back(tmp_path, log):
    rows, _ = log
    clocks.write_csv(tmp_path / "c.csv", rows[:20])
    assert clocks.read_csv(tmp_path / "c.csv") == rows[:20]


class _FakeNvml:
    """pynvml as far as the sampler reads it: an SM clock that climbs 100 MHz a reading, 30 GB in use."""
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 0, 1, 0

    def __init__(self):
        self.sm = 1000

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetClockInfo(self, h, kind):
        if kind == self.NVML_CLOCK_SM:
            self.sm += 100
            return self.sm
        return 2619

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return 1980

    def nvmlDeviceGetPowerManagementLimit(self, h):
        return 700_000

    def nvmlDeviceGetPowerUsage(self, h):
        return 350_000

    def nvmlDeviceGetTemperature(self, h, kind):
        return 40

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0

    def nvmlDeviceGetMemoryInfo(self, h):
        return type("Mem", (), {"used": 30e9})()


def test_one_sampler_gives_clocks_and_memory(monkeypatch):
    """The workbook's one NVML sampler: FlashInfer's cross-check reads its mean SM clock, SGLang's load its memory."""
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml())
    with clocks.Sampler(0, period_s=0.001) as s:
        time.sleep(0.05)
    assert s.available and len(s.rows) >= 3
    assert {r["used_gb"] for r in s.rows} == {30.0}
    sm = [r["sm_mhz"] for r in s.rows]
    assert s.mean("sm_mhz") == sum(sm) / len(sm) and sm == sorted(sm) and sm[0] == 1100
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with clocks.Sampler(None) as off:
        pass
    assert math.isnan(off.mean("sm_mhz")) and not off.available
