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

from .checks import SetupError

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
        raise SetupError("nsys is not usable here; see common.nsys.find()")
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
