"""Nsight Compute: build the command, run it, read its raw CSV (one row per profiled launch, its units checked).

    res = profile([sys.executable, script, "--ncu-target"], out_dir=run.dir, kernel="BatchDecode|BatchPrefill",
                  launch_count=4, metrics=kernels.SUMMARY_METRICS)    # res.df: the raw table
    df = read_raw("ncu.csv")                         # `--csv --page raw`: names row + units row
    # one row per launch with the kernel table's counter columns: common.tables.kernels.summarize(df, peaks)

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
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from common.base.checks import SetupError
from common.capture.procs import Group, ProcError


class NcuError(RuntimeError):
    """ncu ran but produced nothing usable (no kernel matched, the application failed...)."""


class NcuParseError(ValueError):
    """An ncu CSV that cannot be trusted (truncated, no units row, wrong page)."""


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


# ------------------------------------------------------------------ command line

CACHE_CONTROL = ("none", "all")
CACHE_WORDS = {"none": "caches as the kernel before left them (--cache-control none)",
               "all": "caches flushed before each replay pass, as its cold-L2 timing (--cache-control all)"}


def build_cmd(app: list[str], *, log_file: str | Path, kernel: str | None = None, launch_skip: int = 0,
              launch_count: int | None = None, metrics=None, section_set: str | None = None,
              sections: list[str] | None = None, clock_control: str = "none", cache_control: str = "none",
              nvtx_include: str | None = None, page: str = "raw", report_file: str | Path | None = None,
              extra: list[str] | tuple = ()) -> list[str]:
    """The ncu command line for ``app`` (a list: the command to profile).

    ``kernel`` is a regex on the demangled kernel name; ``metrics`` the metric names to collect (the kernel
    table's: common.tables.kernels.SUMMARY_METRICS), or None when ``section_set``/``sections`` say
    what to collect (e.g. ``section_set="full"``).

    Clocks and caches follow how the kernel's time was taken, so the counters describe the same run:
    ``clock_control="none"`` always (ncu's default locks the base clock: a decode kernel read ~25% slower
    on an H200); ``cache_control="none"`` for a kernel as it is served, its inputs where the kernel before it
    left them (often in L2); ``"all"`` (ncu flushes the caches before every replay pass) for a microbenchmark
    timed with a cold L2 (common.capture.timing.bench's default). With "none", replay passes after the first see
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


# ------------------------------------------------------------------ a closer look at one kernel (--set full)


# ------------------------------------------------------------------ command-line use


def profilers(probe: bool = True) -> dict:
    """Which profilers work here: ncu (and whether it may read the GPU counters), nsys, torch.profiler.

    With ``probe`` ncu profiles one tiny torch kernel (~10 s) to test the counter permission.
    """
    import os
    import subprocess
    out: dict = {}
    ncu = shutil.which(os.environ.get("NCU", "ncu"))
    out["ncu"] = {"path": ncu}
    if ncu:
        v = subprocess.run([ncu, "--version"], capture_output=True, text=True)
        out["ncu"]["version"] = (v.stdout.strip().splitlines() or ["?"])[-1]
        if probe:
            app = [sys.executable, "-c", "import torch; x=torch.ones(1024, device='cuda'); (x*2).sum().item()"]
            try:
                p = subprocess.run([ncu, "--metrics", "gpu__time_duration.sum", "--kernel-name", "regex:elementwise",
                                    "--launch-count", "1", *app], capture_output=True, text=True, timeout=180)
                text = p.stdout + p.stderr
                out["ncu"]["counters"] = ("permission denied (ERR_NVGPUCTRPERM)" if "ERR_NVGPUCTRPERM" in text
                                          else "ok" if "gpu__time_duration.sum" in text else
                                          f"no result (rc={p.returncode})")
            except subprocess.TimeoutExpired:
                out["ncu"]["counters"] = "probe timed out"
    from common.capture import nsys
    exe = nsys.find()
    out["nsys"] = {"path": exe, "version": nsys.version(exe) if exe else None,
                   "fallback": None if exe else "torch.profiler (Chrome trace)"}
    try:
        import torch  # noqa: F401
        out["torch_profiler"] = {"available": True}
    except ImportError:
        out["torch_profiler"] = {"available": False}
    return out
