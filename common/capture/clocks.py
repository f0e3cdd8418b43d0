"""What the GPU's clocks and power did while something ran: NVML sampled in a background thread.

    with clocks.Sampler(period_s=0.01) as s:      # SM / memory clock, power, temperature, clock-event reasons
        run_the_gemm_sweep()
    s.rows                                         # [{"t", "sm_mhz", "mem_mhz", "power_w", "temp_c", "reasons", "used_gb"}]
    s.mean("sm_mhz")                               # the mean of one column over the block (NaN without NVML)
    clocks.window(s.rows, t0, t1)                  # median SM clock, max power, the reasons seen in [t0, t1]
    clocks.reason_names(4)                         # ['power cap']

Why: a GEMM's TFLOP/s is proportional to the SM clock, and an H100's clock falls from 1,980 MHz to
~1,400-1,600 MHz once a sweep of large GEMMs reaches the 700 W cap (seen on a fresh H100 on 2026-11-25,
tests/fixtures/nvml_clock_log_ceilings_h100.csv: clock-event reason "SW power cap" from the 16,384³ shape on).
A ceiling measured at a lowered clock under-measures the GPU, and a served GEMM that runs in a short burst
at full clock then "beats" it. So the ceilings record the clock of every probe, and the stories record the
clock of the served steps: a rate above a ceiling is explained by clocks, or the probe is fixed.

Without pynvml or a driver the sampler records nothing and says so (``available`` False, ``why``); it never
raises. Reading needs no CUDA context, so a script sampling a server's GPU stays outside CUDA. It is the workbook's
one NVML sampler: the ceilings' clock log, FlashInfer's timer cross-check (the SM clock of each timer's calls) and
SGLang's memory curve under load (``used_gb``) are its rows.
"""
from __future__ import annotations

import statistics
import threading
import time

# NVML's clock-event (formerly "throttle") reason bits, nvml.h nvmlClocksEventReason*
REASONS = {0x1: "idle", 0x2: "applications clock setting", 0x4: "power cap", 0x8: "hardware slowdown",
           0x10: "sync boost", 0x20: "thermal (software)", 0x40: "thermal (hardware)",
           0x80: "power brake (hardware)", 0x100: "display clock setting"}
SLOWDOWN = 0x4 | 0x8 | 0x20 | 0x40 | 0x80      # reasons that lower the clock under load (not idle/app settings)
COLUMNS = ("t", "sm_mhz", "mem_mhz", "power_w", "temp_c", "reasons", "used_gb")


def reason_names(bits) -> list[str]:
    """Names of the reason bits set in ``bits`` (an int; anything else -> [])."""
    try:
        b = int(bits)
    except (TypeError, ValueError):
        return []
    return [name for bit, name in REASONS.items() if b & bit]


class Sampler:
    """NVML readings of one GPU every ``period_s`` seconds while the ``with`` block runs (a daemon thread).

    ``rows``: one dict per reading (COLUMNS; ``t`` is time.time(); ``used_gb``: device memory in use, every
    process's). ``info``: the GPU's maximum SM and memory clocks and its power limit, read once.
    ``available``/``why``: whether NVML could be read. ``index`` None: the device torch has current, where
    torch is loaded (else 0).
    """

    def __init__(self, index: int | None = 0, period_s: float = 0.01):
        self.index, self.period_s = index, period_s
        self.rows: list[dict] = []
        self.info: dict = {}
        self.available, self.why = False, ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = None

    def __enter__(self) -> "Sampler":
        try:
            import pynvml
            pynvml.nvmlInit()
            if self.index is None:
                import sys
                torch = sys.modules.get("torch")
                self.index = torch.cuda.current_device() if torch is not None and torch.cuda.is_initialized() else 0
            h = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            self._nvml, self._h = pynvml, h
            self.info = {"max_sm_mhz": _try(pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_SM),
                         "max_mem_mhz": _try(pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_MEM),
                         "power_limit_w": _watts(_try(pynvml.nvmlDeviceGetPowerManagementLimit, h))}
            self._read()
        except Exception as e:  # noqa: BLE001 - no pynvml, no driver: no clock log, said by ``why``
            self.why = f"NVML not readable ({e.__class__.__name__}: {str(e)[:80]})"
            return self
        self.available = True
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def _reasons(self):
        n = self._nvml
        f = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or n.nvmlDeviceGetCurrentClocksThrottleReasons
        return f(self._h)

    def _read(self) -> None:
        n, h = self._nvml, self._h
        self.rows.append({"t": time.time(), "sm_mhz": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
                          "mem_mhz": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM),
                          "power_w": n.nvmlDeviceGetPowerUsage(h) / 1e3,
                          "temp_c": n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
                          "reasons": int(self._reasons()), "used_gb": n.nvmlDeviceGetMemoryInfo(h).used / 1e9})

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self._read()
            except Exception:  # noqa: BLE001 - a failed reading is skipped, the next one is tried
                pass

    def mean(self, column: str) -> float:
        """The mean of ``column`` over the readings so far; NaN when there is none (no NVML)."""
        vals = [r[column] for r in self.rows if r.get(column) is not None]
        return sum(vals) / len(vals) if vals else float("nan")

    def now(self) -> dict:
        """The latest reading (an empty dict when there is none)."""
        return self.rows[-1] if self.rows else {}

    def __exit__(self, *exc) -> bool:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        return False


def _try(f, *a):
    try:
        return f(*a)
    except Exception:  # noqa: BLE001
        return None


def _watts(mw):
    return mw / 1e3 if isinstance(mw, (int, float)) else None


def window(rows, t0: float, t1: float) -> dict:
    """The readings in [t0, t1]: samples, median / min SM clock, median memory clock, max power, max
    temperature, and the names of the slowdown reasons seen (power cap, thermal...). An empty window gives
    the reading just before t0 (the state the GPU was in), or {"samples": 0}."""
    inside = [r for r in rows if t0 <= r["t"] <= t1]
    if not inside:
        before = [r for r in rows if r["t"] < t0]
        inside = before[-1:]
    if not inside:
        return {"samples": 0}
    bits = 0
    for r in inside:
        bits |= int(r.get("reasons") or 0)
    return {"samples": len(inside), "sm_mhz": statistics.median(r["sm_mhz"] for r in inside),
            "sm_mhz_min": min(r["sm_mhz"] for r in inside),
            "mem_mhz": statistics.median(r["mem_mhz"] for r in inside),
            "power_w_max": max(r["power_w"] for r in inside), "temp_c_max": max(r["temp_c"] for r in inside),
            "slowdown": reason_names(bits & SLOWDOWN)}


def wait_cool(sampler: Sampler, max_s: float = 3.0, power_frac: float = 0.5) -> float:
    """Wait (at most ``max_s`` s) until no slowdown reason is set and the GPU draws under ``power_frac`` of its
    power limit, so the next probe starts where a served kernel would: on a GPU that is not at its power cap. Returns the seconds waited (0 without NVML)."""
    if not sampler.available:
        return 0.0
    t0 = time.time()
    limit = sampler.info.get("power_limit_w")
    while time.time() - t0 < max_s:
        r = sampler.now()
        cool = (not (int(r.get("reasons") or 0) & SLOWDOWN) and (limit is None or r.get("power_w", 0) < power_frac * limit))
        if cool:
            break
        time.sleep(0.05)
    return time.time() - t0


def read_csv(path) -> list[dict]:
    """A clock log written by :func:`write_csv` (or the fixture's columns: ``throttle`` read as ``reasons``)."""
    import csv
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r.get("error"):
                continue
            out.append({"t": float(r["t"]), "sm_mhz": float(r["sm_mhz"]), "mem_mhz": float(r["mem_mhz"]),
                        "power_w": float(r["power_w"]), "temp_c": float(r["temp_c"]),
                        "reasons": int(float(r.get("reasons") or r.get("throttle") or 0))})
    return out


def write_csv(path, rows) -> None:
    import csv
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
