"""Nsight Systems: find it, profile a command, turn the report into CSV tables.

    exe = find()                                   # None when nsys is not usable here
    rep = profile(["python", "x.py"], out_dir, name="timeline")   # -> timeline.nsys-rep
    tables = stats(rep, ["cuda_gpu_kern_sum", "nvtx_sum", "cuda_gpu_trace"])  # {report: csv path}

``find()`` looks on PATH, then inside Nsight Compute's folder (which ships an ``nsys``), and
checks that the importer that turns the raw ``.qdstrm`` into a report can load its libraries
(it needs libdw; without it nsys leaves only a .qdstrm). Scripts that want a timeline call
``find()`` and fall back to the torch profiler when it returns None, saying so in their output.
Flags: ``--trace=cuda,nvtx --sample=none --cpuctxsw=none`` keep the capture small (CPU sampling
made a 10-matmul script's capture 2 GB); ``--cuda-graph-trace=node`` shows the kernels inside
CUDA graphs instead of one block per graph launch.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

from common.base.checks import SetupError

DEFAULT_FLAGS = ("--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none", "--cuda-graph-trace=node")


def _candidates():
    if os.environ.get("NSYS"):
        yield os.environ["NSYS"]
    p = shutil.which("nsys")
    if p:
        yield p
    for pat in ("/opt/nvidia/nsight-systems/*/bin/nsys", "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
                "/usr/local/cuda/bin/nsys"):
        yield from sorted(glob.glob(pat), reverse=True)


def find() -> str | None:
    """Path of a working nsys, or None (missing, or its report importer cannot load)."""
    for exe in _candidates():
        if not os.access(exe, os.X_OK):
            continue
        try:
            out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode != 0:
            continue
        host = Path(exe).resolve().parent.parent
        importers = glob.glob(str(host / "*" / "QdstrmImporter"))
        if importers:
            ldd = subprocess.run(["ldd", importers[0]], capture_output=True, text=True)
            if "not found" in ldd.stdout:
                continue  # would leave only a .qdstrm; see the module docstring
        return exe
    return None


def version(exe: str) -> str:
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    return out.stdout.strip().splitlines()[-1] if out.stdout else "?"


def profile(app: list[str], out_dir: str | Path, name: str = "timeline", flags=DEFAULT_FLAGS,
            extra: list[str] | tuple = (), timeout: float | None = None, env: dict | None = None,
            echo=print) -> Path:
    """Run ``app`` under nsys; return the .nsys-rep path. The app's output goes to <name>_app.txt."""
    exe = find()
    if exe is None:
        raise SetupError("Nsight Systems (nsys) is not usable here (not on PATH, or its importer misses "
                         "libdw.so.1: apt-get install libdw1). Scripts fall back to the torch profiler.")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = out_dir / name
    cmd = [exe, "profile", "-o", str(base), "-f", "true", *flags, *extra, *app]
    echo(f"nsys: {' '.join(cmd)[:300]}")
    with open(out_dir / f"{name}_app.txt", "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                           env={**os.environ, **(env or {})})
    rep = base.with_suffix(".nsys-rep")
    if not rep.exists():
        tail = (out_dir / f"{name}_app.txt").read_text(errors="replace").strip().splitlines()[-5:]
        raise RuntimeError(f"nsys wrote no report (rc={p.returncode}): " + " | ".join(tail))
    return rep


def stats(rep: str | Path, reports=("cuda_gpu_kern_sum", "nvtx_sum", "cuda_gpu_trace"),
          timeout: float = 300) -> dict:
    """`nsys stats --format csv` for each report name; returns {report: csv path} (missing ones left out)."""
    exe = find()
    if exe is None:
        raise SetupError("nsys is not usable here; see common.capture.nsys.find()")
    rep = Path(rep)
    prefix = rep.with_suffix("")
    subprocess.run([exe, "stats", "--force-export=true", "--format", "csv", "--output", str(prefix),
                    *sum((["--report", r] for r in reports), []), str(rep)],
                   capture_output=True, text=True, timeout=timeout)
    out = {}
    for r in reports:
        hits = sorted(rep.parent.glob(f"{prefix.name}_{r}*.csv"))
        if hits:
            out[r] = hits[0]
    return out


# ------------------------------------------------------------------ GPU metrics: the counters on the timeline

GPU_METRIC_NAMES = {          # nsys's metric name (before " [unit]") -> the column it becomes
    "SMs Active": "sm_active_pct", "SM Issue": "sm_issue_pct", "Tensor Active": "tensor_active_pct",
    "DRAM Read Bandwidth": "dram_read_pct", "DRAM Write Bandwidth": "dram_write_pct", "GR Active": "gr_active_pct",
    "GPC Clock Frequency": "gpc_mhz",
}


class GpuMetrics:
    """Nsight Systems GPU-metrics sampling of one GPU while the ``with`` block runs: a separate nsys process that
    samples the device's performance monitors (``--gpu-metrics-devices``, system scope) around a sleeping
    stand-in application, so nothing is injected into the process being watched (its own profiler, CUPTI, is
    left alone). After the block: ``rows`` (a DataFrame: t_s since sampling began, one column per metric of
    GPU_METRIC_NAMES, % of peak or MHz), ``t0``/``t1`` (epoch seconds of the sampling window), ``why`` (set when
    nothing could be sampled: nsys missing, sampling refused, the report unreadable; never raises)."""

    def __init__(self, out_dir, name: str = "gpu_metrics", device: int = 0, hz: int = 10000, max_s: int = 120,
                 echo=print):
        self.out_dir, self.name, self.device, self.hz, self.max_s, self.echo = Path(out_dir), name, device, hz, max_s, echo
        self.rows, self.why, self.t0, self.t1, self.group = None, "", None, None, None

    def __enter__(self) -> "GpuMetrics":
        import sys
        import time

        from common.capture.procs import Group, ProcError
        exe = find()
        if exe is None:
            self.why = "nsys is not usable here (common.capture.nsys.find found none)"
            return self
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.rep = self.out_dir / f"{self.name}.nsys-rep"
        self.log = self.out_dir / f"{self.name}_nsys.txt"
        cmd = [exe, "profile", "-o", str(self.rep.with_suffix("")), "-f", "true", "--trace=none", "--sample=none",
               "--cpuctxsw=none", f"--gpu-metrics-devices={self.device}", f"--gpu-metrics-frequency={self.hz}",
               sys.executable, "-c", f"import time; time.sleep({int(self.max_s)})"]
        try:
            self.group = Group(cmd, self.log, name="nsys gpu metrics", echo=self.echo).start()
        except ProcError as e:
            self.why = str(e)
            return self
        from common.capture.procs import cmdline, descendants
        t_end = time.time() + 60
        while time.time() < t_end:     # nsys starts the stand-in once it samples; its own "Collecting data..."
            text = self.log.read_text(errors="replace") if self.log.is_file() else ""   # sits in a buffer
            if "Collecting data" in text or any("time.sleep" in " ".join(cmdline(c))   # until it exits
                                                for c in descendants(self.group.pid)):
                self.t0 = time.time()
                return self
            if self.group.poll() is not None:
                break
            time.sleep(0.2)
        self.why = "nsys did not start sampling: " + " | ".join(
            (self.log.read_text(errors="replace") if self.log.is_file() else "").strip().splitlines()[-3:])
        self.group.stop()
        self.group = None
        return self

    def __exit__(self, *exc) -> bool:
        import os
        import signal
        import time

        from common.capture import procs
        if self.group is None:
            return False
        self.t1 = time.time()
        try:
            for pid in procs.descendants(self.group.pid):     # end the stand-in: nsys then writes its report
                if "time.sleep" in " ".join(procs.cmdline(pid)):
                    os.kill(pid, signal.SIGTERM)
            t_end = time.time() + 120
            while self.group.poll() is None and time.time() < t_end:
                time.sleep(0.5)
        finally:
            self.group.stop()
        try:
            self.rows = read_gpu_metrics(export_sqlite(self.rep))
        except Exception as e:  # noqa: BLE001 - no metrics: said, the caller goes on
            self.why = f"the GPU-metrics report could not be read ({e.__class__.__name__}: {str(e)[:160]})"
        return False


def export_sqlite(rep: str | Path, timeout: float = 600) -> Path:
    """`nsys export --type sqlite` of a report; returns the .sqlite path (RuntimeError when none was written)."""
    exe = find()
    if exe is None:
        raise SetupError("nsys is not usable here; see common.capture.nsys.find()")
    out = Path(rep).with_suffix(".sqlite")
    p = subprocess.run([exe, "export", "--type", "sqlite", "-f", "true", "-o", str(out), str(rep)],
                       capture_output=True, text=True, timeout=timeout)
    if not out.is_file():
        raise RuntimeError(f"nsys export wrote no {out.name} (rc={p.returncode}): {p.stderr.strip()[-200:]}")
    return out


def read_gpu_metrics(sqlite_path):
    """The GPU_METRICS table of an nsys sqlite export as one row per sample time: t_s (seconds since the first
    sample) and one column per metric of GPU_METRIC_NAMES that the export has (others are left out)."""
    import sqlite3

    import pandas as pd
    con = sqlite3.connect(str(sqlite_path))
    try:
        names = pd.read_sql_query("SELECT metricId, metricName FROM TARGET_INFO_GPU_METRICS", con)
        raw = pd.read_sql_query("SELECT timestamp, metricId, value FROM GPU_METRICS", con)
    finally:
        con.close()
    if raw.empty:
        raise ValueError(f"{sqlite_path}: GPU_METRICS holds no sample")
    col = {}
    for mid, name in zip(names["metricId"], names["metricName"]):
        base = str(name).split(" [")[0].strip()
        if base in GPU_METRIC_NAMES:
            col[int(mid)] = GPU_METRIC_NAMES[base]
    raw = raw[raw["metricId"].isin(col)]
    raw = raw.assign(metric=raw["metricId"].map(col))
    wide = raw.pivot_table(index="timestamp", columns="metric", values="value", aggfunc="mean").reset_index()
    wide.insert(0, "t_s", (wide["timestamp"] - wide["timestamp"].min()) / 1e9)
    if "gpc_mhz" in wide:
        wide["gpc_mhz"] = wide["gpc_mhz"] / 1e6 if wide["gpc_mhz"].max() > 1e5 else wide["gpc_mhz"]   # Hz in the export
    return wide.drop(columns=["timestamp"]).sort_values("t_s").reset_index(drop=True)
