"""Nsight Compute: build the command, run it, parse its CSV, summarise each kernel launch.

    res = profile([sys.executable, script, "--ncu-target"], out_dir=run.dir,
                  kernel="BatchDecode|BatchPrefill", launch_count=4)       # metrics="summary"
    kernels = summarize(res.df, peaks=ceilings.peaks())   # one row per launch: the counter columns of the
                                                     # kernel table (common.kernels): ncu time, DRAM bytes,
                                                     # TB/s and % of the matching ceiling, L2 hit, SM,
                                                     # tensor, occupancy and limiter, regs, smem, stalls
    df = read_raw("ncu.csv")                         # `--csv --page raw`: names row + units row

Parsing rules (why they matter):
  * columns are found by header NAME, never by position (one added metric moves every column);
  * the second row of a raw CSV holds the units; it is checked, and each quantity is converted
    to one unit (time -> us, bytes -> bytes), so `usecond` vs `ns` output can't skew a result;
  * numbers carry thousands separators ("1,980,000"), `n/a` becomes NaN;
  * lines that are not CSV (`==PROF==`, the application's own stdout) are dropped first;
  * several kernels and several launches of one kernel each get their own row (`launch` counts
    launches per kernel name);
  * a truncated file or a missing units row raises NcuParseError with the line at fault.
With ``--clock-control none`` ncu leaves the GPU clocks alone, so its times match un-profiled
runs (with the default base clocks a decode kernel read ~25% slower on an H200); ``--cache-control``
follows how the kernel was timed (build_cmd).
"""
from __future__ import annotations

import csv
import functools
import io
import math
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from .checks import SetupError
from .procs import Group, ProcError


class NcuError(RuntimeError):
    """ncu ran but produced nothing usable (no kernel matched, the application failed...)."""


class NcuParseError(ValueError):
    """An ncu CSV that cannot be trusted (truncated, no units row, wrong page)."""


from .kernels import DRAM_SOL_METRICS, STALL_METRIC, STALL_REASONS, TENSOR_METRICS, ncu_metrics  # noqa: E402,F401

# The metric list behind metrics="summary": what the kernel table's counter columns read (common.kernels
# declares each column with its metrics), plus the stall reasons. Each extra metric can cost ncu another
# replay pass, so nothing here is unread. Names checked against `ncu --query-metrics --chip gh100` and a
# real `--set full` CSV (tests/fixtures/).
SUMMARY_METRICS = ncu_metrics()

# unit -> factor to the base unit NVIDIA's report reader uses (ns, byte, Hz); ncu's CSV may scale
# (`ncu --import` printed "us", "Mbyte", "Ghz" for the same report that a live run printed in ns/byte)
_TIME = {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9}
_BYTE = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12, "KB": 1e3, "MB": 1e6, "GB": 1e9,
         "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "Kibyte": 1024, "Mibyte": 1024**2}
BASE_UNITS = {**_TIME, **_BYTE, "hz": 1, "Khz": 1e3, "Mhz": 1e6, "Ghz": 1e9,
              "byte/block": 1, "Kbyte/block": 1e3, "Mbyte/block": 1e6,
              "byte/s": 1, "Kbyte/s": 1e3, "Mbyte/s": 1e6, "Gbyte/s": 1e9, "Tbyte/s": 1e12}
_TIME_US = {u: f / 1e3 for u, f in _TIME.items()}      # summarize() wants microseconds
_BYTE_ANY = {**_BYTE, **{f"{u}/block": f for u, f in _BYTE.items()}}      # launch__shared_mem_per_block: byte/block


def unit_factor(unit: str, to: str) -> float | None:
    """The factor from ncu's printed ``unit`` to ``to``: "time_us" (microseconds) or "byte"; None if unknown."""
    return {"time_us": _TIME_US, "byte": _BYTE_ANY}[to].get(unit)


PERM_HINT = ("ncu cannot read the GPU performance counters (ERR_NVGPUCTRPERM). Run as root (sudo -E), "
             "or let all users profile: `options nvidia NVreg_RestrictProfilingToAdminUsers=0` in "
             "/etc/modprobe.d/ and reboot (https://developer.nvidia.com/ERR_NVGPUCTRPERM). In a container, "
             "start it with --cap-add=SYS_ADMIN.")


# ------------------------------------------------------------------ sweep points under ncu
# A script profiles its own sweep by re-running itself under ncu in a "target" mode that calls
# each point once. Between points it launches one tiny marker kernel (torch.cuda._sleep ->
# `spin_kernel`), which the kernel regex also matches; split_points() then gives every profiled
# launch the index of its point, however many kernels a point launched (split-KV + merge...).
MARKER_KERNEL = "spin_kernel"


def mark(i: int | None = None, n: int | None = None, what: str = "") -> None:
    """Launch the marker kernel (call before each point in ncu target mode). With ``i``/``n`` it first prints
    ``ncu-target: point i+1/n: what`` (flushed): in CSV mode ncu writes no kernel row until the application ends,
    so this line is what a long profile's heartbeat (progress_line) can show of where it is."""
    import torch
    if i is not None:
        print(f"ncu-target: point {i + 1}/{n}: {what}", flush=True)
    torch.cuda._sleep(1)


def with_marker(kernel_regex: str) -> str:
    return f"{kernel_regex}|{MARKER_KERNEL}"


def split_points(df):
    """Add a ``point`` column (0-based, by markers seen so far; common.trace.split_at_marker) and drop the
    marker rows."""
    from .trace import split_at_marker
    point, is_mark = split_at_marker(df["Kernel Name"], MARKER_KERNEL)
    out = df.assign(point=point)[[not m for m in is_mark]].reset_index(drop=True)
    out.attrs = df.attrs
    return out


# ------------------------------------------------------------------ command line

CACHE_CONTROL = ("none", "all")
CACHE_WORDS = {"none": "caches as the kernel before left them (--cache-control none)",
               "all": "caches flushed before each replay pass, as its cold-L2 timing (--cache-control all)"}

def build_cmd(app: list[str], *, log_file: str | Path, kernel: str | None = None, launch_skip: int = 0,
              launch_count: int | None = None, metrics="summary", section_set: str | None = None,
              sections: list[str] | None = None, clock_control: str = "none", cache_control: str = "none",
              nvtx_include: str | None = None, page: str = "raw", report_file: str | Path | None = None,
              extra: list[str] | tuple = ()) -> list[str]:
    """The ncu command line for ``app`` (a list: the command to profile).

    ``kernel`` is a regex on the demangled kernel name; ``metrics`` is "summary"
    (:data:`SUMMARY_METRICS`), a list of names, or None when ``section_set``/``sections`` say
    what to collect (e.g. ``section_set="full"``).

    Clocks and caches follow how the kernel's time was taken, so the counters describe the same run:
    ``clock_control="none"`` always (ncu's default locks the base clock: a decode kernel read ~25% slower
    on an H200); ``cache_control="none"`` for a kernel as it is served, its inputs where the kernel before it
    left them (often in L2); ``"all"`` (ncu flushes the caches before every replay pass) for a microbenchmark
    timed with a cold L2 (common.timing.bench's default). With "none", replay passes after the first see
    the L2 the previous pass left: a kernel whose data fits in L2 reads it from there in each pass.
    """
    if cache_control not in CACHE_CONTROL:
        raise ValueError(f"cache_control must be one of {CACHE_CONTROL}, got {cache_control!r}")
    ncu = os.environ.get("NCU", "ncu")
    if report_file:  # a .ncu-rep for the Nsight Compute GUI (or ncu_report) instead of a CSV
        cmd = [ncu, "-f", "-o", str(report_file)]
    else:
        cmd = [ncu, "--csv", "--page", page, "--log-file", str(log_file)]
    cmd += ["--clock-control", clock_control, "--cache-control", cache_control, "--target-processes", "all"]
    if kernel:
        cmd += ["--kernel-name", f"regex:{kernel}"]
    if launch_skip:
        cmd += ["--launch-skip", str(launch_skip)]
    if launch_count:
        cmd += ["--launch-count", str(launch_count)]
    if nvtx_include:
        cmd += ["--nvtx", "--nvtx-include", nvtx_include]
    if section_set:
        cmd += ["--set", section_set]
    for s in sections or ():
        cmd += ["--section", s]
    if metrics == "summary":
        names = () if (section_set or sections) else SUMMARY_METRICS
    else:
        names = tuple(metrics or ())
    if names:
        cmd += ["--metrics", ",".join(names)]
    return cmd + list(extra) + list(app)


@dataclass
class NcuResult:
    cmd: list[str]
    csv_path: Path
    log_path: Path
    df: "object"  # pandas.DataFrame
    returncode: int


def profile(app: list[str], out_dir: str | Path, *, name: str = "ncu", timeout: float | None = None,
            env: dict | None = None, echo=print, **kw) -> NcuResult:
    """Run ``app`` under ncu and parse the result. Writes ``<name>.csv`` and ``<name>_log.txt``.

    Raises SetupError when ncu is missing or lacks counter permission, NcuError when no
    kernel was profiled (the message shows the end of ncu's log).
    """
    import shutil
    ncu = os.environ.get("NCU", "ncu")
    if not shutil.which(ncu):
        raise SetupError("Nsight Compute (ncu) is not on PATH. It ships with the CUDA toolkit "
                         "(e.g. /usr/local/cuda/bin or /opt/nvidia/nsight-compute/<ver>/); add it to PATH.")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path, csv_path = out_dir / f"{name}_log.txt", out_dir / f"{name}.csv"
    cmd = build_cmd(app, log_file=log_path, **kw)
    echo(f"ncu: {shlex.join(cmd)[:400]}")
    app_out = out_dir / f"{name}_app_stdout.txt"
    app_out.unlink(missing_ok=True)
    release_gpu_cache(echo)
    # ncu and the application it starts run in their own process group: a timeout, an error or Ctrl-C
    # stops both (killing ncu alone would leave the profiled application running)
    with Group(cmd, app_out, env={**os.environ, **(env or {})}, name="ncu", echo=echo) as g:
        try:
            rc = g.wait(timeout, every=HEARTBEAT_S, heartbeat=lambda s: echo(progress_line(s, log_path, app_out)))
        except ProcError:
            raise NcuError(f"ncu did not finish within {timeout:.0f} s (ncu and the profiled application were "
                           f"stopped); see {app_out}") from None
    df = read_log(log_path, csv_path, extra_log=app_out, what=f"kernel regex {kw.get('kernel')!r}, rc={rc}")
    return NcuResult(cmd, csv_path, log_path, df, rc)


def _text(path) -> str:
    """A log's text, or "" where it is not (yet) written."""
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


HEARTBEAT_S = 60.0     # a profile that runs longer says every minute how far it is


def progress_line(seconds: float, log_path, app_out) -> str:
    """One line on a profile still running: the kernel launches ncu has profiled so far where its log says
    ('==PROF== Profiling' lines; in CSV mode, as every profile here runs, ncu writes none and prints its rows only
    when the application ends, as the real H100 log tests/fixtures/ncu_log_csv_mode_h100_head.txt shows) and the
    profiled application's last line of output (the ncu targets print one per point: mark), so a stall shows where
    it is."""
    n = _text(log_path).count('==PROF== Profiling "')
    last = next((ln.strip() for ln in reversed(_text(app_out).splitlines())
                 if ln.strip() and not ln.startswith(("==PROF==", "==WARNING==", "$ "))), "")
    done = (f"{n} kernel launch(es) profiled so far" if n else
            "no kernel row yet (in CSV mode ncu writes its rows when the application ends)")
    return (f"ncu: still running after {seconds:.0f} s: {done}"
            + (f"; the application's last line: {last[:160]}" if last else "; the application has printed nothing"))


def release_gpu_cache(echo=print) -> float:
    """Before a profiled application starts: give the GPU memory this process's torch allocator keeps cached back
    to the driver, so the application (and ncu's save and restore of its buffers between replay passes, which go to
    host memory when the device has no room) has the whole GPU. On an H100 (80 GB) the FlashInfer decode sweep's
    largest KV cache (34 GB) stayed cached in the parent while its ncu child ran; that child then sat ~10 min with
    no output, where the whole step took 55 s on an H200 (141 GB). With this release (and the per-point release in
    the FlashInfer target loop) the same step ran in 73 s on a fresh H100 (7198304, 2026-11-27). Returns the GB
    released."""
    import sys
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return 0.0
        held = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
        torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - a stand-in or broken torch: nothing to release
        return 0.0
    gb = held / 1e9
    if gb >= 1.0:
        echo(f"ncu: released {gb:.1f} GB of GPU memory this process kept cached, for the profiled application")
    return gb


def read_log(log_path, csv_path=None, *, extra_log=None, what: str = ""):
    """The one reader of an ncu ``--log-file``: permission errors become SetupError, a log without a
    kernel row NcuError (with its last lines), otherwise the CSV lines are kept (written to
    ``csv_path`` when given) and parsed with :func:`read_raw`. Used by :func:`profile` and by scripts
    that run ncu around a server (the server exits, then its log is read)."""
    log_path = Path(log_path)
    text = _text(log_path)
    both = text + ("\n" + _text(extra_log) if extra_log and Path(extra_log).exists() else "")
    if "ERR_NVGPUCTRPERM" in both:
        raise SetupError(PERM_HINT)
    csv_text = extract_csv(text)
    if not csv_text.strip():
        tail = "\n".join(both.strip().splitlines()[-6:])
        raise NcuError(f"ncu profiled no kernel ({what or log_path.name}). Last lines of {log_path.name}:\n{tail}")
    if csv_path is not None:
        Path(csv_path).write_text(csv_text)
    df = read_raw(csv_text)
    df.attrs["source"] = str(csv_path) if csv_path is not None else f"the CSV lines of {log_path}"
    return df


def extract_csv(text: str) -> str:
    """Keep the CSV lines of an ncu log (they start with a quote); drop ==PROF== and app output."""
    return "".join(line for line in io.StringIO(text) if line.startswith('"'))


# ------------------------------------------------------------------ parsing

_NUM = re.compile(r"^[-+]?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?([eE][-+]?\d+)?$")


def to_number(s):
    """'1,980,000' -> 1980000.0; '0.97' -> 0.97; 'n/a' -> nan; other text -> None."""
    if s is None:
        return None
    if isinstance(s, (int, float)):
        return float(s)
    t = s.strip()
    if t in ("n/a", "N/A", "nan", ""):
        return math.nan
    if _NUM.match(t):
        return float(t.replace(",", ""))
    return None


def _is_file(src) -> bool:
    return isinstance(src, Path) or (isinstance(src, str) and "\n" not in src and len(src) < 4096 and Path(src).exists())


def _read_rows(src) -> list[list[str]]:
    if _is_file(src):
        text = Path(src).read_text(errors="replace")
    else:
        text = str(src)
    text = extract_csv(text) if not text.lstrip().startswith('"ID"') else text
    return list(csv.reader(io.StringIO(text)))


def read_raw(src):
    """Parse ``ncu --csv --page raw`` into a DataFrame (one row per profiled launch).

    Numeric columns become floats; units are in ``df.attrs["units"]`` (column -> unit).
    """
    import pandas as pd
    rows = _read_rows(src)
    if not rows:
        raise NcuParseError("empty ncu CSV (no header row): did ncu profile any kernel?")
    header = rows[0]
    for need in ("ID", "Kernel Name"):
        if need not in header:
            raise NcuParseError(f"not an ncu raw-page CSV: no '{need}' column in the header "
                                f"(got {header[:5]}...). Use --csv --page raw.")
    if len(rows) < 2:
        raise NcuParseError("ncu CSV has a header but no units row and no data (truncated?)")
    units = rows[1]
    id_col = header.index("ID")
    if len(units) != len(header) or units[id_col].strip() != "":
        raise NcuParseError("ncu CSV has no units row (row 2 should hold units such as 'ns' and 'byte', "
                            f"not data; got {units[:3]}...). Was it written with --print-units? "
                            "Re-run ncu with --csv --page raw.")
    data = rows[2:]
    for i, r in enumerate(data, start=3):
        if len(r) != len(header):
            raise NcuParseError(f"ncu CSV line {i} has {len(r)} fields, the header has {len(header)}: "
                                "the file is truncated or was cut while ncu was writing it")
    if not data:
        raise NcuParseError("ncu CSV has a units row but no kernel rows")
    cols = {}
    for j, name in enumerate(header):
        vals = [r[j] for r in data]
        nums = [to_number(v) for v in vals]
        if name not in ("ID", "Kernel Name", "Process Name", "Host Name") and all(n is not None for n in nums) \
                and any(not (isinstance(n, float) and math.isnan(n)) for n in nums):
            cols[name] = nums
        else:
            cols[name] = vals
    df = pd.DataFrame(cols)
    df["ID"] = df["ID"].astype(int)
    df.attrs["units"] = dict(zip(header, units))
    df.attrs["source"] = str(src) if _is_file(src) else "the ncu CSV"     # named by a value that is not a number
    return df


# ------------------------------------------------------------------ per-kernel summary

@functools.lru_cache(maxsize=8192)      # a trace names the same few hundred kernels tens of thousands of times
def short_name(full: str) -> str:
    """'void flashinfer::BatchDecodeKernel<0, 2>(Params)' -> 'BatchDecodeKernel'."""
    s = full.replace("(anonymous namespace)::", "").replace("<unnamed>::", "").strip()
    if s.startswith("void "):
        s = s[5:]
    depth, cut = 0, len(s)
    for i, ch in enumerate(s):
        if ch == "<":
            if depth == 0:
                cut = min(cut, i)
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = min(cut, i)
            break
    s = s[:cut]
    return s.split("::")[-1] or full[:60]


def number_column(df, name: str):
    """A column of a raw table as floats ('n/a' is NaN); NcuParseError naming the file, column and row of a
    value that is not a number."""
    import pandas as pd
    vals = df[name]
    if not pd.api.types.is_numeric_dtype(vals):
        nums = [to_number(v) for v in vals]
        bad = next((i for i, n in enumerate(nums) if n is None), None)
        if bad is not None:       # (row: the CSV line, after the header and units rows)
            raise NcuParseError(f"{df.attrs.get('source', 'the ncu CSV')}: column {name}, row {bad + 3} "
                                f"({df['Kernel Name'].iloc[bad] if 'Kernel Name' in df else 'kernel ' + str(bad)}): "
                                f"{vals.iloc[bad]!r} is not a number")
        vals = pd.Series(nums, index=vals.index)
    return vals.astype(float).to_numpy()


def summarize(df, peaks: dict | None = None):
    """One row per profiled launch: id, kernel, grid, block, launch (n-th launch of that kernel), then the
    counter columns of the kernel table (common.kernels.COUNTERS: ncu time, DRAM bytes / TB/s / % of the
    ceiling of the same traffic, L2 hit, SM, tensor, occupancy and its limiter, registers, shared memory,
    warps per CTA, stalls) and ``stall_<reason>_pct``. ``peaks`` (common.ceilings.peaks) gives the DRAM
    ceilings; without them ``dram_pct`` is NaN. A ``point`` column (split_points) is kept first."""
    import pandas as pd

    from .kernels import counters
    if "gpu__time_duration.sum" not in df.columns:
        raise NcuParseError("the ncu CSV has no gpu__time_duration.sum column, so no kernel time: collect it "
                            "(--metrics gpu__time_duration.sum, or a section set such as SpeedOfLight/full)")
    out = pd.DataFrame({
        "id": df["ID"].to_numpy(),
        "kernel": [short_name(k) for k in df["Kernel Name"]],
        "grid": df.get("Grid Size", pd.Series([""] * len(df))).to_numpy(),
        "block": df.get("Block Size", pd.Series([""] * len(df))).to_numpy(),
    })
    out["launch"] = out.groupby("kernel").cumcount()
    for name, vals in counters(df, peaks).items():
        out[name] = vals
    if "point" in df.columns:
        out.insert(0, "point", df["point"].to_numpy())
    out.attrs["missing_metrics"] = [m for m in KEY_METRICS if m not in df.columns]
    return out


# the metrics a summary row cannot do without (their absence is named, never shown as NaN silently)
KEY_METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
               "sm__throughput.avg.pct_of_peak_sustained_elapsed")


# What each warp-stall reason means (NVIDIA Nsight Compute Kernel Profiling Guide, "Warp Stall
# Reasons"), in the workbook's words. Read a stall with this table, not from its name alone: `wait`
# is a FIXED-latency dependency (e.g. the result of an arithmetic or MMA instruction), not a
# producer/consumer hand-off (that shows as `barrier`, or as `long_scoreboard` on a flag in memory).
STALL_MEANING = {
    "long_scoreboard": "waiting for an L1TEX result: a global/local memory load (DRAM or L2 latency)",
    "short_scoreboard": "waiting for an MIO result: shared memory or a special-function (MUFU) op",
    "wait": "a fixed-latency dependency: the next instruction needs the result of a fixed-latency one "
            "(arithmetic, tensor MMA issue), or an explicit wait/delay",
    "barrier": "waiting at a CTA barrier (__syncthreads / named barrier) for sibling warps",
    "membar": "waiting on a memory barrier (fence)",
    "math_pipe_throttle": "the execution pipe it needs (FMA, tensor, ...) is busy",
    "mio_throttle": "the MIO queue (shared memory, special math, some branches) is full",
    "lg_throttle": "the local/global load-store queue is full (many memory instructions in flight)",
    "tex_throttle": "the texture/L1TEX queue is full",
    "drain": "waiting for memory stores to drain at the end of the warp",
    "dispatch_stall": "the dispatcher could not issue the selected instruction",
    "branch_resolving": "waiting for a branch target to be computed",
    "no_instruction": "no instruction fetched yet (instruction cache miss, or after a branch)",
    "imc_miss": "waiting on an immediate-constant cache miss",
    "sleeping": "the warp is sleeping (nanosleep, yield)",
    "gmma": "waiting on a Hopper warpgroup MMA (wgmma) to be issued or finish",
    "not_selected": "eligible, but another warp was picked (enough parallelism: not a problem)",
    "misc": "other reasons",
}
MEMORY_STALLS = ("long_scoreboard", "lg_throttle", "drain", "tex_throttle", "imc_miss")


OTHER_STEP_SHARE = 0.5   # a KV-reading launch below this share of the batch's bytes belongs to another step


def other_step_launches(bytes_by_launch: dict, expected: float | None = None,
                        share: float = OTHER_STEP_SHARE) -> set:
    """The launches of one KV-reading decode kernel that belong to a step other than the measured batch's.

    A window opened once the batch decodes can still catch a step of fewer requests: in every recorded SGLang
    05 run (H100 and H200) its first step read 16.8 MB per layer, one request's 4k KV, against 539 MB for the
    batch. ``bytes_by_launch``: {launch: bytes the launch moved at DRAM}; a launch under ``share`` of
    ``expected`` (the batch's KV bytes), or without it of the largest launch, is another step's."""
    ref = expected if expected else max(bytes_by_launch.values(), default=0.0)
    return {launch for launch, b in bytes_by_launch.items() if b < share * ref}


def top_stall(row) -> str:
    """Name of the largest stall reason of a summarize() row ('' when none recorded)."""
    t = str(row.get("top_stalls") or "")
    return t.split(",")[0].strip().split(" ")[0] if t else ""


def bound(row) -> str:
    """What limits a kernel, from a summarize() row: memory-bound, memory-latency-bound,
    compute-bound, compute-bound (tensor cores) or latency-bound.

    It compares ncu's two speed-of-light figures, DRAM (``dram_sol_pct``) and SM (``sm_pct``), both as % of
    ncu's theoretical peaks. ncu's SM % is the highest of several SM sub-throughputs, including the issue
    of load/store instructions, so SM % above DRAM % alone does not make a kernel compute-bound: when the
    top warp stall is a memory stall (long_scoreboard, lg_throttle...) the kernel is waiting on memory
    (memory-latency-bound); compute-bound needs the math pipes busy (tensor pipe > 50%, or SM % above
    DRAM % with a non-memory top stall).
    """
    def num(v):
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)
    dram, sm, tc = num(row.get("dram_sol_pct")), num(row.get("sm_pct")), num(row.get("tensor_pct"))
    vals = [v for v in (dram, sm) if v is not None]
    if not vals:
        return "n/a"
    if tc is not None and tc > 50:
        return "compute-bound (tensor cores)"
    if max(vals) < 40:
        return "latency-bound"
    if dram is not None and dram >= (sm or 0):
        return "memory-bound"
    if top_stall(row) in MEMORY_STALLS:
        return "memory-latency-bound"
    return "compute-bound" + (" (tensor cores)" if tc is not None and tc > 30 else "")


def bound_why(row) -> str:
    """One sentence giving the numbers behind :func:`bound`: ncu's DRAM and SM speed-of-light %, the tensor
    pipe, the top stall with its meaning, and whether that stall is a bottleneck (common.kernels.stall_note)."""
    from .kernels import stall_note
    st = top_stall(row)
    parts = [f"DRAM SOL {row.get('dram_sol_pct', math.nan):.0f}%", f"SM SOL {row.get('sm_pct', math.nan):.0f}%"]
    if row.get("tensor_pct") is not None and not math.isnan(row.get("tensor_pct")):
        parts.append(f"tensor {row['tensor_pct']:.0f}%")
    why = f"{bound(row)}: " + ", ".join(parts)
    if st:
        why += f"; top stall {st} ({STALL_MEANING.get(st, '?')})"
        note = stall_note(row)
        if note:
            why += f": {note}"
    return why


# ------------------------------------------------------------------ a closer look at one kernel (--set full)

PIPE = "sm__inst_executed_pipe_{}.avg.pct_of_peak_sustained_active"
PIPES = ("alu", "fma", "fmaheavy", "lsu", "adu", "xu", "cbu", "uniform", "tex", "tma", "tensor_op_hmma", "tensor_op_gmma")
LOOK_METRICS = ("launch__grid_size", "launch__sm_count", "launch__waves_per_multiprocessor", "sm__cycles_active.avg",
                "gpc__cycles_elapsed.max", "smsp__issue_active.avg.pct_of_peak_sustained_active",
                "smsp__inst_executed.sum", "sm__warps_active.avg.per_cycle_active",
                "smsp__warps_eligible.avg.per_cycle_active") + tuple(PIPE.format(p) for p in PIPES)


def look(raw: dict, summary: dict | None = None) -> list[str]:
    """What a kernel spends its time on, from one row of a ``--set full`` raw table (read_raw(...).iloc[i]) and its
    summarize() row: how the launch fills the GPU (CTAs, waves, the share of SMs active), how busy the issue slots
    are and how many warps are ready to issue, which pipes its instructions go to, its instruction count per byte
    moved, and the top stalls with what they mean. Lines of plain text; metrics a row lacks are left out."""
    def v(name):
        x = raw.get(name)
        return None if x is None or (isinstance(x, float) and math.isnan(x)) or isinstance(x, str) else float(x)
    out, s = [], summary or {}
    grid, sms, waves = v("launch__grid_size"), v("launch__sm_count"), v("launch__waves_per_multiprocessor")
    active, elapsed = v("sm__cycles_active.avg"), v("gpc__cycles_elapsed.max")
    if grid and sms:
        line = f"launch: {grid:,.0f} CTAs for {sms:.0f} SMs" + (f", {waves:.2f} waves" if waves is not None else "")
        if active and elapsed:
            line += f"; the average SM was active {100 * active / elapsed:.0f}% of the kernel's cycles"
        if waves is not None and waves < 1:
            line += " (less than one wave: some SMs get no CTA at all)"
        out.append(line)
    issue, eligible, warps = (v("smsp__issue_active.avg.pct_of_peak_sustained_active"),
                              v("smsp__warps_eligible.avg.per_cycle_active"), v("sm__warps_active.avg.per_cycle_active"))
    if issue is not None:
        line = f"issue: an instruction issued in {issue:.0f}% of the active cycles of each scheduler"
        if eligible is not None and warps is not None:
            line += f"; {eligible:.2f} warps ready to issue per cycle, of {warps:.1f} active per SM"
        if eligible is not None and eligible < 1:
            line += " (fewer than one ready warp: the scheduler waits, latency-bound)"
        elif issue >= 60:
            line += " (the issue slots are busy: the kernel is bound by how many instructions it runs)"
        out.append(line)
    pipes = sorted(((p, v(PIPE.format(p))) for p in PIPES), key=lambda kv: -(kv[1] or 0))
    pipes = [(p, x) for p, x in pipes if x]
    if pipes:
        out.append("pipes (% of peak while active): " + ", ".join(f"{p} {x:.0f}%" for p, x in pipes[:4]))
    inst = v("smsp__inst_executed.sum")
    mb = (s.get("dram_read_mb") or 0) + (s.get("dram_write_mb") or 0)
    if inst:
        out.append(f"instructions: {inst:,.0f} warp instructions" + (f", {inst / (mb * 1e6) * 32:.1f} thread instructions "
                                                                     f"per DRAM byte" if mb else ""))
    if s.get("top_stalls"):
        top = top_stall(s)
        out.append(f"stalls: {s['top_stalls']}" + (f"; {top}: {STALL_MEANING.get(top, '?')}" if top else ""))
    return out


# ------------------------------------------------------------------ command-line use

def main(argv=None) -> int:
    """python -m common.ncu profile --out DIR [--kernel RX] [--skip N] [--count N] [--set full] -- CMD..."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m common.ncu",
                                description="Run a command under Nsight Compute and print a per-kernel hardware table.")
    sub = p.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("profile", help="profile a command: ... profile [opts] -- python script.py args")
    pr.add_argument("--out", required=True, help="folder for ncu.csv, the log and kernels.csv")
    pr.add_argument("--kernel", help="regex on the kernel name (e.g. 'BatchDecode|Prefill')")
    pr.add_argument("--skip", type=int, default=0, help="launches of matching kernels to skip first")
    pr.add_argument("--count", type=int, default=None, help="launches to profile (default: all)")
    pr.add_argument("--set", dest="section_set", default=None,
                    help="ncu section set (e.g. full, detailed); default: the workbook's summary metrics")
    pr.add_argument("--clock-control", default="none", choices=("none", "base"))
    pr.add_argument("--cache-control", default="none", choices=CACHE_CONTROL,
                    help="none: caches as the application left them (a served kernel); all: flushed before each "
                         "pass (a kernel timed with a cold L2). Default none")
    pr.add_argument("--nvtx-include", default=None, help="only kernels inside this NVTX range")
    pr.add_argument("--timeout", type=float, default=None)
    pr.add_argument("app", nargs=argparse.REMAINDER, help="-- then the command to profile")
    sm = sub.add_parser("summarize", help="summarise an existing raw-page CSV")
    sm.add_argument("csv")
    a = p.parse_args(argv)
    import pandas as pd
    pd.set_option("display.width", 200)
    cols = ["kernel", "launch", "ncu_time_us", "dram_tb_s", "dram_pct", "l2_hit_pct", "sm_pct", "tensor_pct",
            "occupancy_pct", "limiter", "top_stalls"]
    if a.cmd == "summarize":
        s = summarize(read_raw(Path(a.csv)))
        print(s[[c for c in cols if c in s.columns]].to_string(index=False, float_format="%.1f"))
        return 0
    app = a.app[1:] if a.app[:1] == ["--"] else a.app
    if not app:
        p.error("give the command to profile after --")
    res = profile(app, a.out, kernel=a.kernel, launch_skip=a.skip, launch_count=a.count,
                  section_set=a.section_set, metrics=None if a.section_set else "summary",
                  clock_control=a.clock_control, cache_control=a.cache_control, nvtx_include=a.nvtx_include,
                  timeout=a.timeout)
    s = summarize(res.df)
    s.to_csv(Path(a.out) / "kernels.csv", index=False)
    print(s[[c for c in cols if c in s.columns]].to_string(index=False, float_format="%.1f"))
    print(f"\nraw CSV: {res.csv_path}\nper-kernel table: {Path(a.out) / 'kernels.csv'}")
    return 0


if __name__ == "__main__":
    from .checks import run_main
    run_main(main)
