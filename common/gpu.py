"""What machine ran this: a provenance snapshot, the datasheet table and this GPU's measured ceilings.

    prov = snapshot()                    # stored in every summary.json
    pk = peaks()                         # the ceilings of GPU 0 every % column divides by (cached per GPU)
    rows = ceilings_table(pk)            # probe · measured · datasheet · % of datasheet · method
    spec = device_spec("NVIDIA H200")    # datasheet row, or None

    python -m common.gpu ceilings [--refresh] [--quick] [--device N]   # measure (once) and print the table
    python -m common.gpu show                                           # the cached set(s), no CUDA

Measured ceilings, one set per GPU (keyed by its UUID), shared by the three systems, so the same GPU
shows the same denominators in every report:

* DRAM bandwidth: the best of several streaming probes on buffers far above L2 (4 GiB; quick 1 GiB): a
  Triton read kernel, a Triton write kernel, a Triton copy kernel (a few block sizes / warp counts) and
  torch ``x.sum()``, ``fill_``, ``zero_``, ``copy_``; copies count bytes read + written. Each probe is timed
  with :func:`common.timing.bench` (CUDA events around back-to-back calls, median of the samples).
* bf16 tensor throughput: the best median over a sweep of GEMM shapes (ml-engineering's mamf-finder
  "maximum achievable matmul FLOPS"): 22 shapes quick, ~70 full, both ``a @ b`` and ``a @ b.T`` layouts.
* NVLink bus bandwidth (≥ 2 GPUs visible): an NCCL all-reduce sweep 1 MiB..1 GiB in spawned processes,
  busbw = algbw x 2(n-1)/n (nccl-tests), NVLink multicast off (common.procs.nccl_env).

Each ceiling carries its method and the datasheet figure beside it (common/datasheet.csv). A datasheet figure is
a denominator only where nothing was measured, and ``source`` then says "datasheet". The set is cached in
``~/.cache/hands-on/ceilings/<uuid>.json`` (HANDS_ON_CACHE overrides the base) with CEILINGS_VERSION, so a
changed probe measures again. Reading the cache (``peaks``, ``cached_peaks``, ``show``) never imports torch
nor creates a CUDA context; ``peaks()`` without a cached set measures it once in a child process.
A kernel above a ceiling means the probe under-measures: improve the probe, never clip the kernel
(common.timing.rates flags it).
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

if __name__ == "__main__" and not __package__:    # run as a file: python3 common/gpu.py --help
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "common"

from . import REPO_ROOT

# Datasheet figures (dense, no sparsity), one row per GPU model in common/datasheet.csv: dram_tb_s
# HBM/GDDR bandwidth in TB/s; bf16_tflops dense BF16 tensor-core TFLOP/s; nvlink_gb_s total NVLink
# bandwidth per GPU, both directions. ``pattern`` is matched against torch.cuda.get_device_name() /
# nvidia-smi names, first match wins (so "H200 NVL" stands before "H200"). Add a row for a new GPU.
DATASHEET = Path(__file__).with_name("datasheet.csv")

PACKAGES = ("torch", "triton", "flashinfer-python", "flashinfer", "sglang", "sglang-kernel", "sgl-kernel",
            "apache-tvm-ffi", "transformers", "nvtx", "nvidia-ml-py", "pandas", "matplotlib", "minisgl")
ENV_PREFIXES = ("CUDA_", "NCCL_", "SGLANG_", "FLASHINFER_", "TORCH_", "NVSHMEM_", "PYTORCH_", "HANDS_ON_")


def device_spec(name: str | None) -> dict | None:
    """Datasheet row for a GPU name, or None when the table has no match."""
    if not name:
        return None
    import csv
    with open(DATASHEET, newline="") as f:
        for row in csv.DictReader(f):
            if re.search(row["pattern"], name, re.IGNORECASE):
                num = {k: float(v) if "." in v else int(v) for k, v in row.items() if k not in ("pattern", "name")}
                return {"model": row["name"], **num, "source": "datasheet"}
    return None


def _run(cmd: list[str], timeout: float = 10) -> str | None:
    if not shutil.which(cmd[0]):
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (subprocess.SubprocessError, OSError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _versions() -> dict:
    v = {}
    for p in PACKAGES:
        try:
            v[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            pass
    # mini-SGLang comes from a git commit: pip records it in direct_url.json (PEP 610); a source
    # tree on PYTHONPATH carries it in a COMMIT file or its git metadata
    try:
        info = json.loads(metadata.distribution("minisgl").read_text("direct_url.json") or "{}")
        commit = info.get("vcs_info", {}).get("commit_id")
        if commit:
            v["minisgl"] = commit
    except (metadata.PackageNotFoundError, ValueError):
        pass
    msg = sys.modules.get("minisgl")
    if msg is not None and "minisgl" not in v:  # a namespace package has no __file__, only __path__
        where = getattr(msg, "__file__", None) or next(iter(getattr(msg, "__path__", [])), None)
        if where:
            pkg_dir = Path(where).resolve()
            pkg_dir = pkg_dir.parent if pkg_dir.is_file() else pkg_dir
            v["minisgl"] = minisgl_commit(pkg_dir.parents[1])
    return v


def minisgl_commit(src_root: Path) -> str:
    """The commit of a mini-SGLang source tree: git if it is a checkout, else its COMMIT file."""
    src_root = Path(src_root)
    for f in (src_root / "COMMIT", src_root.parent / "COMMIT"):
        if f.is_file():
            return f.read_text().strip()
    out = _run(["git", "-C", str(src_root), "rev-parse", "HEAD"])
    return out or "unknown"


def _git() -> dict:
    """The workbook's commit. A copy without .git (e.g. a working tree sent to a GPU node) can name it
    in HANDS_ON_GIT_COMMIT (add '-dirty' when the tree had uncommitted changes)."""
    env = os.environ.get("HANDS_ON_GIT_COMMIT")
    if env:
        return {"commit": env.removesuffix("-dirty"), "dirty": env.endswith("-dirty"), "source": "HANDS_ON_GIT_COMMIT"}
    sha = _run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short=12", "HEAD"])
    dirty = _run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"])
    return {"commit": sha or "unknown", "dirty": bool(dirty)}


def _gpus_nvml() -> list[dict] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        drv = pynvml.nvmlSystemGetDriverVersion()
        drv = drv.decode() if isinstance(drv, bytes) else drv
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            try:
                max_sm = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)
                max_mem = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)
            except Exception:
                max_sm = max_mem = None
            gpus.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                         "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                         "memory_gb": round(mem.total / 1e9, 1), "driver": drv,
                         "max_sm_clock_mhz": max_sm, "max_mem_clock_mhz": max_mem})
        return gpus
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _gpus_smi() -> list[dict] | None:
    out = _run(["nvidia-smi", "--query-gpu=index,name,uuid,memory.total,driver_version,clocks.max.sm,clocks.max.mem",
                "--format=csv,noheader,nounits"])
    if not out:
        return None
    gpus = []
    for line in out.splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) < 7:
            continue
        gpus.append({"index": int(f[0]), "name": f[1], "uuid": f[2], "memory_gb": round(float(f[3]) / 1024 * 1.073741824, 1),
                     "driver": f[4], "max_sm_clock_mhz": _num(f[5]), "max_mem_clock_mhz": _num(f[6])})
    return gpus


def _num(s):
    try:
        return int(float(s))
    except (TypeError, ValueError):
        return None


def gpus() -> list[dict]:
    """Visible NVIDIA GPUs (NVML, else nvidia-smi); [] on a machine without a driver."""
    g = _gpus_nvml()
    if g is None:
        g = _gpus_smi()
    g = g or []
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None and g and "MIG-" not in vis:    # MIG instances: no mapping to GPUs here, list all
        ids = [x.strip() for x in vis.split(",")]
        if "" in ids:                   # CUDA stops at the first empty entry
            ids = ids[:ids.index("")]
        by_index = {x["index"]: x for x in g}
        keep = []
        for i in ids:                   # CUDA order: the order CUDA_VISIBLE_DEVICES names them
            if i.lstrip("-").isdigit():
                m = by_index.get(int(i))
            else:                       # a (prefix of a) UUID, as CUDA accepts
                m = next((x for x in g if x.get("uuid", "").startswith(i if i.startswith("GPU-") else f"GPU-{i}")), None)
            if m is None:               # CUDA ignores the rest after an invalid entry
                break
            keep.append(m)
        g = keep
    return g


def snapshot(argv: list[str] | None = None, extra: dict | None = None) -> dict:
    """Provenance stored with every result: machine, software, code version, command, date."""
    g = gpus()
    torch = sys.modules.get("torch")
    prov = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join(argv if argv is not None else [Path(sys.argv[0]).name if sys.argv else "python"] + sys.argv[1:]),
        "git": _git(),
        "host": {"python": platform.python_version(), "platform": platform.platform(terse=True),
                 "cpus": os.cpu_count()},
        "gpu_count": len(g),
        "gpu": g[0]["name"] if g else None,
        "gpus": g,
        "driver": g[0]["driver"] if g else None,
        "packages": _versions(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }
    if torch is not None:
        prov["cuda_runtime"] = getattr(torch.version, "cuda", None)
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # never create a context here
            p = torch.cuda.get_device_properties(0)
            prov["sm_count"] = p.multi_processor_count
            prov["compute_capability"] = f"{p.major}.{p.minor}"
            prov["l2_mb"] = round(getattr(p, "L2_cache_size", 0) / 2**20, 1)
    nvcc = _run(["nvcc", "--version"])
    if nvcc:
        m = re.search(r"release ([\d.]+)", nvcc)
        prov["nvcc"] = m.group(1) if m else nvcc.splitlines()[-1]
    if "sm_count" not in prov and prov["gpu"]:
        spec = device_spec(prov["gpu"])
        if spec:
            prov["sm_count"] = spec["sms"]
    if extra:
        prov.update(extra)
    return prov


def provenance_line(prov: dict) -> str:
    """One line for the top of a report: GPU, driver, CUDA, packages, date, commit, command."""
    pk = prov.get("packages", {})
    keys = ("torch", "flashinfer-python", "sglang", "sglang-kernel", "minisgl")
    pkgs = ", ".join(f"{k} {pk[k]}" for k in keys if k in pk)
    gpu = prov.get("gpu") or "no GPU"
    n = prov.get("gpu_count") or 0
    git = prov.get("git", {})
    # the runtime torch was built with; a script that never imports torch has only the toolkit's nvcc
    cuda = prov.get("cuda_runtime") or (f"{prov['nvcc']} (nvcc)" if prov.get("nvcc") else "?")
    return (f"{n}x {gpu} · driver {prov.get('driver') or '?'} · CUDA {cuda} · "
            f"{pkgs} · {prov.get('date_utc', '?')} · commit {git.get('commit', '?')}"
            f"{' (dirty)' if git.get('dirty') else ''} · `{prov.get('command', '')}`"
            + (f" · re-analysed (no GPU) {prov['reanalysed'].get('date_utc', '?')}, commit "
               f"{prov['reanalysed'].get('git', {}).get('commit', '?')}, `{prov['reanalysed'].get('command', '')}`"
               if prov.get("reanalysed") else ""))


# ---------------------------------------------------------------- measured ceilings
#
# One set per GPU (keyed by its UUID), shared by the three systems: every % column of every report
# divides by the same numbers for the same GPU. Layout of a cached set (``<cache>/ceilings/<uuid>.json``):
#   {"version", "gpu", "uuid", "mode": "quick"|"full", "date_utc", "driver", "torch", "triton", "datasheet",
#    "dram":   {"tb_s", "best", "method", "probes": [{"name", "kind", "bytes", "tb_s", "ms", ...}], "notes"},
#    "bf16":   {"tflops", "best": {"m", "n", "k", "layout"}, "method", "shapes": [{"m", "n", "k", "layout", "tflops", "ms"}]},
#    "nvlink": {"busbw_gb_s", "gpus", "best_bytes", "method", "sizes": [...]} | {"note": why not} | {"error": ...}}

CEILINGS_VERSION = 4          # bump when a probe changes: a cached set of another version is measured again
GIB = 1 << 30
MIB = 1 << 20

DRAM_METHOD = ("the best of several streaming probes on buffers far larger than L2 ({size}): Triton read, write "
               "and copy kernels (a few block sizes / warp counts) and torch x.sum(), fill_, zero_, copy_; copies "
               "count bytes read + written. Each probe: warm-up, then {reps} single calls timed with CUPTI (the "
               "kernel's own duration, as every kernel of the workbook is timed), each after a spin kernel, median; "
               "the sustained rate (CUDA events around back-to-back calls) is kept beside it")
GEMM_METHOD = ("the best median over {n} bf16 GEMM shapes (the 'maximum achievable matmul FLOPS' method of "
               "ml-engineering's mamf-finder): torch.matmul into a preallocated output, random normal inputs, "
               "layout nn = a @ b and nt = a @ b.T (as nn.Linear); each shape: warm-up, then {reps} single calls "
               "timed with CUPTI (kernel duration, as the workbook times every kernel: a GEMM inside a model runs "
               "in a burst at full clock), median; FLOPs = 2·M·N·K. The sustained rate of the best shape (~"
               "{target_ms:.0f} ms of back-to-back calls, where power limits lower the clock) is kept beside it")
NVLINK_METHOD = ("the best NCCL all-reduce bus bandwidth over {nsizes} sizes ({lo}..{hi}) on {n} GPUs "
                 "(torch.distributed, one spawned process per GPU, bf16 sum, NVLink multicast/NVLS off); "
                 "busbw = algbw x 2(n-1)/n (nccl-tests); per size: CUDA events around back-to-back all-reduces, "
                 "median of {reps} samples, slowest rank")

# GEMM shapes (M, N, K): the quick set holds the shapes that usually win on Hopper plus the model shapes of
# the workbook, each in both layouts; the full set adds a grid of multiples of 4096.
# Version 4 added Llama-3.1-8B's QKV, O and down projections at an 8,192-token prefill: on an H200
# (2026-11-23, SGLang 08) cuBLAS ran O at 849, down at 825 and gate-up at 817 TFLOP/s there, above the
# 812 of the version-3 sweep, so those shapes belong in the sweep. Version 4 itself has not yet run on a GPU.
_GEMM_QUICK = [(8192, 8192, 8192), (4096, 4096, 4096), (6144, 6144, 6144), (16384, 16384, 16384),
               (8192, 8192, 16384), (16384, 16384, 4096), (8192, 28672, 4096), (6144, 17920, 2816),
               (8192, 6144, 4096), (8192, 4096, 4096), (8192, 4096, 14336)]
_GEMM_FULL_EXTRA = sorted({(m, n, k) for m in (4096, 8192, 12288, 16384) for n in (4096, 8192, 12288, 16384)
                           for k in (4096, 8192, 16384)} | {(2048, 2048, 2048), (10240, 10240, 10240),
                                                              (12288, 12288, 12288), (14336, 14336, 14336),
                                                              (4096, 14336, 4096), (8192, 4096, 14336)})


def ceilings_dir() -> Path:
    """Where every system reads and writes the ceilings: ``$HANDS_ON_CACHE/ceilings`` (default ``~/.cache/hands-on``)."""
    from .checks import cache_dir
    return cache_dir() / "ceilings"


def _file_name(uuid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", uuid)


def ceilings_path(uuid: str) -> Path:
    return ceilings_dir() / f"{_file_name(uuid)}.json"


def gpu_uuid(device: int = 0) -> str | None:
    """UUID of visible GPU ``device`` from NVML / nvidia-smi (no CUDA context); None without a driver."""
    g = gpus()
    return g[device]["uuid"] if 0 <= device < len(g) and g[device].get("uuid") else None


def _valid(c) -> bool:
    return (isinstance(c, dict) and c.get("version") == CEILINGS_VERSION and bool((c.get("dram") or {}).get("tb_s"))
            and bool((c.get("bf16") or {}).get("tflops")))


def read_ceilings(path) -> dict | None:
    """A cached ceilings file if it is of this CEILINGS_VERSION and complete, else None."""
    try:
        c = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return c if _valid(c) else None


def load_ceilings(device: int = 0) -> dict | None:
    """The cached ceilings of visible GPU ``device``; never imports torch nor touches CUDA."""
    uuid = gpu_uuid(device)
    return read_ceilings(ceilings_path(uuid)) if uuid else None


def save_ceilings(c: dict, path=None) -> Path:
    """Write a ceilings set atomically (temp file + rename) to ``path`` or its UUID's cache file."""
    path = Path(path) if path else ceilings_path(c["uuid"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(c, indent=1))
    os.replace(tmp, path)
    return path


def busbw_gb_s(nbytes: float, seconds: float, n: int) -> float:
    """All-reduce bus bandwidth in GB/s (nccl-tests): algbw = bytes / time, busbw = algbw x 2(n-1)/n.
    The factor turns the algorithm bandwidth into what each link carries, so busbw is comparable
    across GPU counts and against the per-direction link bandwidth."""
    if seconds <= 0 or n < 1:
        return math.nan
    return nbytes / seconds / 1e9 * (2 * (n - 1) / n)


def _nvlink_wanted(c: dict | None) -> bool:
    """True when ≥ 2 GPUs are visible and the set has no NVLink entry yet (a failed attempt counts)."""
    return len(gpus()) >= 2 and not (c or {}).get("nvlink", {}).get("gpus", 0) >= 2


# ---- DRAM probes: each returns (callable, bytes moved per call); its docstring line is its method

def _dram_probes(torch, quick: bool):
    """(name, kind, make) of every DRAM probe; ``make(bufs)`` -> (fn, bytes per call, method)."""
    probes = []
    kern = _triton_kernels()
    if kern is not None:
        read_cfg = [(16384, 8), (8192, 4)] if quick else [(16384, 8), (8192, 4), (16384, 16), (32768, 16)]
        write_cfg = [(16384, 8)] if quick else [(16384, 8), (8192, 4), (32768, 16)]
        copy_cfg = [(8192, 8)] if quick else [(8192, 8), (16384, 8), (4096, 4)]
        probes += [(f"triton read BLOCK={b} warps={w}", "read", _triton_read(kern, b, w)) for b, w in read_cfg]
        probes += [(f"triton write BLOCK={b} warps={w}", "write", _triton_write(kern, b, w)) for b, w in write_cfg]
        probes += [(f"triton copy BLOCK={b} warps={w}", "copy", _triton_copy(kern, b, w)) for b, w in copy_cfg]
    probes += [("torch x.sum()", "read", _torch_read), ("torch fill_", "write", _torch_fill),
               ("torch zero_", "write", _torch_zero), ("torch copy_", "copy", _torch_copy)]
    return probes


def _doc(fn) -> str:
    return (fn.__doc__ or "").strip().splitlines()[0]


def _torch_read(x, y):
    """torch x.sum() over the buffer viewed as fp32: bytes = buffer size (read once); CUDA events around back-to-back calls, median."""
    import torch
    v = x.view(torch.float32)
    return (lambda: v.sum()), x.numel(), _doc(_torch_read)


def _torch_fill(x, y):
    """torch x.fill_(1) on the buffer as fp32: bytes = buffer size (written once); CUDA events around back-to-back calls, median."""
    import torch
    v = x.view(torch.float32)
    return (lambda: v.fill_(1.0)), x.numel(), _doc(_torch_fill)


def _torch_zero(x, y):
    """torch x.zero_() on the buffer: bytes = buffer size (written once); CUDA events around back-to-back calls, median."""
    return x.zero_, x.numel(), _doc(_torch_zero)


def _torch_copy(x, y):
    """torch y.copy_(x), a device-to-device memcpy: bytes = 2 x buffer (read + write); CUDA events around back-to-back calls, median."""
    return (lambda: y.copy_(x)), 2 * x.numel(), _doc(_torch_copy)


def _triton_read(kern, block, warps):
    def make(x, y):
        """Triton read kernel: each program loads BLOCK contiguous bf16 (16-byte vectors, several loads in flight per thread, evict-first), sums in fp32, stores one value; bytes = buffer size; CUDA events around back-to-back calls, median."""
        import torch
        v = x.view(torch.bfloat16)
        grid = (v.numel() // block,)
        out = torch.empty(grid[0], dtype=torch.float32, device=x.device)
        return (lambda: kern["read"][grid](v, out, BLOCK=block, num_warps=warps)), x.numel(), _doc(make)
    return make


def _triton_write(kern, block, warps):
    def make(x, y):
        """Triton write kernel: each program stores BLOCK contiguous bf16 zeros (16-byte vectors); bytes = buffer size (written once); CUDA events around back-to-back calls, median."""
        import torch
        v = x.view(torch.bfloat16)
        grid = (v.numel() // block,)
        return (lambda: kern["write"][grid](v, BLOCK=block, num_warps=warps)), x.numel(), _doc(make)
    return make


def _triton_copy(kern, block, warps):
    def make(x, y):
        """Triton copy kernel: each program loads BLOCK contiguous bf16 and stores them to a second buffer; bytes = 2 x buffer (read + write); CUDA events around back-to-back calls, median."""
        import torch
        a, b = x.view(torch.bfloat16), y.view(torch.bfloat16)
        grid = (a.numel() // block,)
        return (lambda: kern["copy"][grid](a, b, BLOCK=block, num_warps=warps)), 2 * x.numel(), _doc(make)
    return make


_TRITON: dict = {}


def _triton_kernels() -> dict | None:
    """The three Triton streaming kernels (compiled on first launch), or None when Triton is missing.
    Buffers are whole multiples of BLOCK, so the kernels need no mask; offsets are 64-bit."""
    if "kernels" in _TRITON:
        return _TRITON["kernels"]
    try:
        import triton
        import triton.language as tl
    except Exception:          # ImportError, or a broken install
        _TRITON["kernels"] = None
        return None

    @triton.jit
    def _read(x_ptr, out_ptr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, eviction_policy="evict_first")   # (.cg + evict_first: a PTXAS error in Triton 3.6)
        tl.store(out_ptr + tl.program_id(0), tl.sum(x.to(tl.float32), axis=0))

    @triton.jit
    def _write(y_ptr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.zeros([BLOCK], dtype=y_ptr.dtype.element_ty), eviction_policy="evict_first")

    @triton.jit
    def _copy(x_ptr, y_ptr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, eviction_policy="evict_first")
        tl.store(y_ptr + offs, x, eviction_policy="evict_first")

    _TRITON["kernels"] = {"read": _read, "write": _write, "copy": _copy, "version": triton.__version__}
    return _TRITON["kernels"]


def _measure_dram(torch, device: int, quick: bool, log=print) -> dict:
    """Every DRAM probe on ``device``; the ceiling is the fastest (see DRAM_METHOD)."""
    from .timing import bench
    want = (1 if quick else 4) * GIB
    free, _total = torch.cuda.mem_get_info(device)
    size = want
    while size > GIB and 2 * size > 0.8 * free:     # the copy needs two buffers
        size //= 2
    notes = [] if size == want else [f"buffers shrunk to {size / GIB:.0f} GiB ({free / GIB:.1f} GiB free)"]
    if 2 * size > free:
        raise RuntimeError(f"not enough free GPU memory for the DRAM probes ({free / GIB:.1f} GiB free, "
                           f"{2 * size / GIB:.0f} GiB needed)")
    if _triton_kernels() is None:
        notes.append("Triton is not importable: torch probes only (the read ceiling may be under-measured)")
    reps = 10 if quick else 20
    x = torch.empty(size, dtype=torch.uint8, device=f"cuda:{device}")
    y = torch.empty_like(x)
    x.view(torch.bfloat16).normal_()
    y.zero_()
    rows = []
    try:
        for name, kind, make in _dram_probes(torch, quick):
            try:
                fn, nbytes, method = make(x, y)
                t = bench(fn, method="cupti", cold_l2=False, warmup=3, reps=reps)      # single calls: kernel time
                ms = t.median_ms
                calls = max(4, int(16 * GIB // nbytes))

                def batch(fn=fn, calls=calls):
                    for _ in range(calls):
                        fn()
                sus = bench(batch, method="events", cold_l2=False, warmup=1, reps=3).median_ms / calls
                rows.append({"name": name, "kind": kind, "bytes": nbytes, "buffer_bytes": size,
                             "tb_s": nbytes / (ms / 1e3) / 1e12, "ms": ms, "sustained_tb_s": nbytes / (sus / 1e3) / 1e12,
                             "samples": len(t.samples_ms), "spread_pct": t.spread_pct, "method": method})
                log(f"  DRAM {name:32s} {rows[-1]['tb_s']:6.3f} TB/s single call, {rows[-1]['sustained_tb_s']:6.3f} "
                    f"sustained  ({nbytes / GIB:.0f} GiB per call, {ms:.3f} ms, spread {t.spread_pct:.1f}%)")
            except Exception as e:     # one failed probe (e.g. a Triton compile error) does not stop the rest
                notes.append(f"{name}: {e.__class__.__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
                log(f"  DRAM {name}: [ERROR] {notes[-1]}")
    finally:
        del x, y
        torch.cuda.empty_cache()
    if not rows:
        raise RuntimeError("every DRAM probe failed: " + "; ".join(notes))
    best = max(rows, key=lambda r: r["tb_s"])
    return {"tb_s": best["tb_s"], "best": best["name"], "buffer_bytes": size,
            "method": DRAM_METHOD.format(size=f"{size / GIB:.0f} GiB", reps=reps),
            "probes": rows, "notes": notes}


def gemm_shapes(quick: bool) -> list[tuple[int, int, int, str]]:
    """(M, N, K, layout) of the GEMM sweep: quick 22 shapes, full ~70 (layout nn = a @ b, nt = a @ b.T)."""
    quick_set = [(m, n, k, lay) for (m, n, k) in _GEMM_QUICK for lay in ("nt", "nn")]
    if quick:
        return quick_set
    seen = set(quick_set)
    return quick_set + [(m, n, k, "nt") for (m, n, k) in _GEMM_FULL_EXTRA if (m, n, k, "nt") not in seen]


def _measure_gemm(torch, device: int, quick: bool, log=print) -> dict:
    """The bf16 GEMM sweep on ``device``; the ceiling is the best shape's median (see GEMM_METHOD)."""
    from .timing import bench
    target_ms, reps = (20.0, 10) if quick else (50.0, 20)
    dev = f"cuda:{device}"
    rows, notes = [], []
    for m, n, k, lay in gemm_shapes(quick):
        try:
            a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            b = torch.randn(n, k, device=dev, dtype=torch.bfloat16).t() if lay == "nt" else \
                torch.randn(k, n, device=dev, dtype=torch.bfloat16)
            c = torch.empty(m, n, device=dev, dtype=torch.bfloat16)

            def batch(calls, a=a, b=b, c=c):
                for _ in range(calls):
                    torch.matmul(a, b, out=c)
            t = bench(lambda: batch(1), method="cupti", cold_l2=False, warmup=3, reps=reps)   # single calls
            ms = t.median_ms
            rows.append({"m": m, "n": n, "k": k, "layout": lay, "tflops": 2 * m * n * k / (ms / 1e3) / 1e12,
                         "ms": ms, "samples": len(t.samples_ms), "spread_pct": t.spread_pct})
            log(f"  GEMM {m:5d}x{n:5d}x{k:5d} {lay}  {rows[-1]['tflops']:7.1f} TFLOP/s  ({ms:.3f} ms, "
                f"spread {t.spread_pct:.1f}%)")
        except Exception as e:
            notes.append(f"{m}x{n}x{k} {lay}: {e.__class__.__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
            log(f"  GEMM {m}x{n}x{k} {lay}: [ERROR] {notes[-1]}")
        finally:
            a = b = c = None
    torch.cuda.empty_cache()
    if not rows:
        raise RuntimeError("every GEMM shape failed: " + "; ".join(notes))
    best = max(rows, key=lambda r: r["tflops"])
    try:    # the sustained rate of the best shape: back-to-back calls for ~target_ms (power and clocks settle)
        m, n, k, lay = best["m"], best["n"], best["k"], best["layout"]
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, k, device=dev, dtype=torch.bfloat16).t() if lay == "nt" else \
            torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        c = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        calls = max(1, round(target_ms / best["ms"]))

        def burst(a=a, b=b, c=c):
            for _ in range(calls):
                torch.matmul(a, b, out=c)
        best["sustained_tflops"] = 2 * m * n * k / (bench(burst, method="events", cold_l2=False, warmup=1,
                                                          reps=3).median_ms / calls / 1e3) / 1e12
        log(f"  GEMM best shape sustained over ~{target_ms:.0f} ms: {best['sustained_tflops']:.1f} TFLOP/s")
        del a, b, c
    except Exception as e:  # noqa: BLE001
        notes.append(f"sustained run of the best shape: {e.__class__.__name__}")
    torch.cuda.empty_cache()
    return {"tflops": best["tflops"], "best": {x: best[x] for x in ("m", "n", "k", "layout")},
            "sustained_tflops": best.get("sustained_tflops"),
            "method": GEMM_METHOD.format(n=len(rows), target_ms=target_ms, reps=reps), "shapes": rows,
            "notes": notes}


def nvlink_sizes(quick: bool) -> list[int]:
    """All-reduce sizes in bytes: 1 MiB .. 1 GiB (quick: 4 of them, full: every power of two)."""
    return [1 * MIB, 32 * MIB, 256 * MIB, GIB] if quick else [(1 << i) * MIB for i in range(11)]


def _calls_for(nbytes: int) -> int:
    """Back-to-back all-reduces per timed sample: ~5 ms at 100 GB/s algbw, 2..200 (same on every rank)."""
    return max(2, min(200, int(5e-3 * 100e9 / nbytes)))


def _nvlink_worker(rank: int, world: int, port: int, sizes: list[int], reps: int, q) -> None:
    """One rank of the all-reduce sweep (a spawned process): NCCL env first, then init, sweep, report."""
    from .procs import nccl_env
    env, _notes = nccl_env()
    os.environ.update(env)           # before NCCL is initialised: NVLink multicast stays off
    import torch
    import torch.distributed as dist

    from .timing import bench
    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                device_id=torch.device("cuda", rank))
        rows = []
        for nbytes in sizes:
            x = torch.zeros(nbytes // 2, dtype=torch.bfloat16, device="cuda")   # values do not change NCCL's speed
            calls = _calls_for(nbytes)

            def batch(x=x, calls=calls):
                for _ in range(calls):
                    dist.all_reduce(x)
            t = bench(batch, method="events", cold_l2=False, warmup=2, reps=reps)   # fixed counts on every rank
            worst = torch.tensor([t.median_ms / calls], dtype=torch.float64, device="cuda")
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            ms = float(worst.item())
            rows.append({"bytes": nbytes, "ms": ms, "algbw_gb_s": nbytes / (ms / 1e3) / 1e9,
                         "busbw_gb_s": busbw_gb_s(nbytes, ms / 1e3, world), "calls_per_sample": calls})
            del x
        if rank == 0:
            q.put({"ok": True, "rows": rows})
    except BaseException as e:
        q.put({"ok": False, "rank": rank, "error": f"{e.__class__.__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"})
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _measure_nvlink(n: int, quick: bool, log=print, timeout: float = 600.0) -> dict:
    """All-reduce sweep over ``n`` GPUs in spawned processes; the ceiling is the best busbw (NVLINK_METHOD).
    The children are always joined, then terminated, then killed: none outlives this call."""
    import importlib
    import multiprocessing as mp
    import queue
    import time

    from .procs import free_port
    sizes, reps = nvlink_sizes(quick), (5 if quick else 10)
    worker = importlib.import_module("common.gpu")._nvlink_worker   # pickled by module name for spawn
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs_ = [ctx.Process(target=worker, args=(r, n, port, sizes, reps, q), daemon=True) for r in range(n)]
    msg = None
    try:
        for p in procs_:
            p.start()
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                msg = q.get(timeout=1.0)
                break
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs_) or all(p.exitcode is not None for p in procs_):
                    try:
                        msg = q.get(timeout=2.0)
                    except queue.Empty:
                        pass
                    break
    finally:
        for p in procs_:
            p.join(timeout=30 if msg and msg.get("ok") else 5)
        for p in procs_:
            if p.is_alive():
                p.terminate()
                p.join(10)
        for p in procs_:
            if p.is_alive():
                p.kill()
                p.join(5)
        q.close()
    links = sorted({v for v in topology().get("links", {}).values()})
    base = {"gpus": n, "links": links, "uuids": [g["uuid"] for g in gpus()][:n]}
    if not msg or not msg.get("ok"):
        why = (msg or {}).get("error") or f"no result within {timeout:.0f} s (exit codes {[p.exitcode for p in procs_]})"
        log(f"  NVLink all-reduce sweep failed: {why}")
        return {**base, "busbw_gb_s": None, "error": why}
    rows = msg["rows"]
    for r in rows:
        log(f"  all-reduce {r['bytes'] / MIB:7.0f} MiB on {n} GPUs: busbw {r['busbw_gb_s']:7.1f} GB/s "
            f"(algbw {r['algbw_gb_s']:.1f}, {r['ms'] * 1e3:.0f} us)")
    best = max(rows, key=lambda r: r["busbw_gb_s"])
    return {**base, "busbw_gb_s": best["busbw_gb_s"], "best_bytes": best["bytes"], "sizes": rows,
            "method": NVLINK_METHOD.format(nsizes=len(sizes), lo=_fmt_bytes(sizes[0]), hi=_fmt_bytes(sizes[-1]),
                                           n=n, reps=reps)}


def _fmt_bytes(b: float) -> str:
    return f"{b / GIB:g} GiB" if b >= GIB else f"{b / MIB:g} MiB"


class _Lock:
    """An exclusive file lock (Linux/macOS flock) so two runs never measure the same GPU at once."""

    def __init__(self, path: Path):
        self.path, self.f = path, None

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(self.path, "a")
        try:
            import fcntl
            fcntl.flock(self.f, fcntl.LOCK_EX)
        except ImportError:
            pass
        return self

    def __exit__(self, *exc):
        self.f.close()     # closing releases the lock
        return False


def measure_ceilings(device: int = 0, *, quick: bool = False, refresh: bool = False, nvlink: bool = True,
                     log=print) -> dict:
    """Measure (or read from the cache) the ceilings of visible GPU ``device``; returns the cached set.

    A cached set of this CEILINGS_VERSION is returned as it is, unless ``refresh``, or a full set is asked
    for and a quick one is cached, or ≥ 2 GPUs are visible and the set has no NVLink entry (then only the
    all-reduce sweep runs and is added). Needs the GPU: ~15 s quick, ~1-2 min full (+ ~30 s NVLink).
    """
    from .checks import SetupError, require_module
    torch = require_module("torch", "pip install -r requirements.txt")
    if not torch.cuda.is_available():
        raise SetupError("measuring the ceilings needs a CUDA GPU, and torch sees none (nvidia-smi; a CUDA build of torch)")
    props = torch.cuda.get_device_properties(device)
    t_uuid = getattr(props, "uuid", None)
    uuid = gpu_uuid(device) or (f"GPU-{t_uuid}" if t_uuid else props.name.replace(" ", "_") + f"-{device}")
    path = ceilings_path(uuid)
    with _Lock(path.with_suffix(".lock")):
        c = None if refresh else read_ceilings(path)
        if c is not None and not quick and c.get("mode") == "quick":
            log(f"cached ceilings of {uuid} are a quick set: measuring the full set")
            c = None
        want_nvlink = nvlink and torch.cuda.device_count() >= 2
        if c is not None and not (want_nvlink and not c.get("nvlink", {}).get("gpus", 0) >= 2):
            return c
        t0 = _dt.datetime.now(_dt.timezone.utc)
        if c is None:
            log(f"measuring the ceilings of GPU {device} ({props.name}, {uuid}), {'quick' if quick else 'full'} "
                f"set; cached in {path}")
            kern = _triton_kernels()
            with torch.cuda.device(device):
                dram = _measure_dram(torch, device, quick, log)
                gemm = _measure_gemm(torch, device, quick, log)
            g = gpus()
            me = g[device] if device < len(g) else {}
            c = {"version": CEILINGS_VERSION, "gpu": props.name, "uuid": uuid, "device_index": device,
                 "mode": "quick" if quick else "full", "date_utc": t0.strftime("%Y-%m-%dT%H:%M:%SZ"),
                 "driver": me.get("driver"), "torch": torch.__version__, "cuda_runtime": torch.version.cuda,
                 "triton": (kern or {}).get("version"), "sm_count": props.multi_processor_count,
                 "l2_mb": round(getattr(props, "L2_cache_size", 0) / 2**20, 1),
                 "datasheet": device_spec(props.name), "dram": dram, "bf16": gemm,
                 "nvlink": {"note": "one GPU visible: no all-reduce sweep" if torch.cuda.device_count() < 2
                            else "all-reduce sweep not asked for (--no-nvlink)"}}
        if want_nvlink:
            n = torch.cuda.device_count()
            log(f"NCCL all-reduce sweep over {n} GPUs ({'quick' if quick else 'full'})")
            c["nvlink"] = {**_measure_nvlink(n, quick, log), "mode": "quick" if quick else "full"}
        c["wall_s"] = round((_dt.datetime.now(_dt.timezone.utc) - t0).total_seconds() + c.get("wall_s", 0), 1)
        save_ceilings(c, path)
        return c


# ---- what the scripts divide by

def _nvlink_ds(spec: dict | None) -> float | None:
    """Datasheet NVLink bandwidth per direction (GB/s), the figure an all-reduce busbw compares with."""
    v = (spec or {}).get("nvlink_gb_s")
    return v / 2 if v else None


def _short_methods(c: dict) -> dict:
    dram, gemm, nv = c.get("dram") or {}, c.get("bf16") or {}, c.get("nvlink") or {}
    b = gemm.get("best") or {}
    out = {"dram_tb_s": f"best of {len(dram.get('probes', []))} probes: {dram.get('best')}",
           "bf16_tflops": f"best of {len(gemm.get('shapes', []))} GEMM shapes: "
                          f"{b.get('m')}x{b.get('n')}x{b.get('k')} {b.get('layout')}"}
    if nv.get("busbw_gb_s"):
        out["nvlink_busbw_gb_s"] = (f"best NCCL all-reduce busbw of {len(nv.get('sizes', []))} sizes on "
                                    f"{nv.get('gpus')} GPUs: {_fmt_bytes(nv.get('best_bytes') or 0)}")
    return out


def as_peaks(c: dict | None, name: str | None = None, uuid: str | None = None) -> dict:
    """The dict every script divides by, from a ceilings set (or the datasheet row when ``c`` is None).

    Keys: gpu, uuid, dram_tb_s, bf16_tflops, nvlink_busbw_gb_s, source ("measured" | "datasheet" |
    "unknown"), sources (per key), method (a short text per key), datasheet (the common/datasheet.csv row),
    measured (the measured values, date, version, mode) and ceilings (the whole set, or None).
    """
    name = (c or {}).get("gpu") or name
    spec = device_spec(name)
    out = {"gpu": name, "uuid": (c or {}).get("uuid") or uuid, "datasheet": spec, "ceilings": c}
    if c:
        nv = (c.get("nvlink") or {}).get("busbw_gb_s")
        out.update(dram_tb_s=c["dram"]["tb_s"], bf16_tflops=c["bf16"]["tflops"],
                   nvlink_busbw_gb_s=nv if nv else _nvlink_ds(spec), source="measured",
                   sources={"dram_tb_s": "measured", "bf16_tflops": "measured",
                            "nvlink_busbw_gb_s": "measured" if nv else ("datasheet" if _nvlink_ds(spec) else None)},
                   method=_short_methods(c),
                   measured={"dram_tb_s": c["dram"]["tb_s"], "bf16_tflops": c["bf16"]["tflops"],
                             "nvlink_busbw_gb_s": nv, "date_utc": c.get("date_utc"), "version": c.get("version"),
                             "mode": c.get("mode"), "uuid": c.get("uuid")})
        if not nv and _nvlink_ds(spec):
            out["method"]["nvlink_busbw_gb_s"] = "datasheet, per direction (not measured here)"
    elif spec:
        out.update(dram_tb_s=spec["dram_tb_s"], bf16_tflops=spec["bf16_tflops"], nvlink_busbw_gb_s=_nvlink_ds(spec),
                   source="datasheet", sources={k: "datasheet" for k in ("dram_tb_s", "bf16_tflops", "nvlink_busbw_gb_s")},
                   method={"dram_tb_s": "datasheet", "bf16_tflops": "datasheet",
                           "nvlink_busbw_gb_s": "datasheet, per direction"})
    else:
        out.update(dram_tb_s=None, bf16_tflops=None, nvlink_busbw_gb_s=None, source="unknown", sources={}, method={})
    return out


def ceilings_brief(c: dict | None) -> dict | None:
    """The figures of a ceilings set a run records in its provenance (its denominators), or None."""
    if not c:
        return None
    return {"dram_tb_s": (c.get("dram") or {}).get("tb_s"), "bf16_tflops": (c.get("bf16") or {}).get("tflops"),
            "nvlink_busbw_gb_s": (c.get("nvlink") or {}).get("busbw_gb_s"), "version": c.get("version"),
            "mode": c.get("mode"), "date_utc": c.get("date_utc"), "uuid": c.get("uuid")}


def cached_peaks(device: int = 0) -> dict | None:
    """The measured ceilings of ``device`` as :func:`peaks` returns them, if this machine measured them
    before; else None. Never imports torch nor creates a CUDA context (scripts that start a server or a
    mini-SGLang engine on the GPU afterwards call this)."""
    c = load_ceilings(device)
    return as_peaks(c) if c else None


def measure_peaks(device: int = 0, *, refresh: bool = False, quick: bool = False) -> dict:
    """Measure the ceilings of ``device`` in this process (cached) and return them as :func:`peaks` does."""
    return as_peaks(measure_ceilings(device, quick=quick, refresh=refresh))


_INJECTION_VARS = ("CUDA_INJECTION64_PATH", "CUDA_INJECTION32_PATH")
_INJECTION_LIBS = re.compile(r"nsight|nsys|ncu|injection|treelauncher", re.IGNORECASE)


def measure_env(environ=None) -> tuple[dict, list[str]]:
    """The environment the measuring child runs in: the caller's, with the repository on PYTHONPATH and
    without a profiler's injection (ncu / nsys set CUDA_INJECTION64_PATH and preload their libraries),
    so a script started under a profiler neither profiles the probes nor measures them slowed down.
    Returns (env, notes on what was removed)."""
    env = dict(os.environ if environ is None else environ)
    notes = [f"{k} removed (a profiler's injection)" for k in _INJECTION_VARS if env.pop(k, None)]
    if env.get("LD_PRELOAD"):
        libs = env["LD_PRELOAD"].replace(":", " ").split()
        keep = [x for x in libs if not _INJECTION_LIBS.search(Path(x).name)]
        if len(keep) < len(libs):
            notes.append(f"LD_PRELOAD {' '.join(x for x in libs if x not in keep)} removed (a profiler's injection)")
            if keep:
                env["LD_PRELOAD"] = " ".join(keep)
            else:
                env.pop("LD_PRELOAD")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env, notes


def _measure_in_child(device: int, quick: bool = True, echo=print) -> dict:
    """Run ``python -m common.gpu ceilings`` in a child process group (stopped with its whole tree on
    timeout, error or Ctrl-C), so the caller gets no CUDA context and no GPU memory held by the probes;
    returns the set it measured, or raises RuntimeError with the end of its log."""
    import tempfile

    from .procs import Group
    from .checks import cache_folder
    cache_folder("ceilings")              # a cache that cannot be written: one [setup] line naming it
    with tempfile.TemporaryDirectory(dir=ceilings_dir()) as td:
        out = Path(td) / "ceilings.json"
        cmd = [sys.executable, "-m", "common.gpu", "ceilings", "--device", str(device), "--json-out", str(out)]
        cmd += ["--quick"] if quick else []
        env, notes = measure_env()
        log = ceilings_dir() / f"measure-{_file_name(gpu_uuid(device) or f'device{device}')}.log"
        echo(f"measuring this GPU's ceilings once ({'quick' if quick else 'full'} set, then cached in "
             f"{ceilings_dir()}; log {log})" + "".join(f"; {n}" for n in notes))
        with Group(cmd, log, env=env, name="ceilings", echo=echo, cwd=str(REPO_ROOT)) as g:
            rc = g.wait(1800)
        c = read_ceilings(out)
        if rc != 0 or c is None:
            said = log.read_text(errors="replace").strip().splitlines() if log.is_file() else []
            setup = [ln for ln in said if ln.startswith("[setup] ")]
            if rc == 2 and setup:            # the child's one line: the machine lacks something (no torch...)
                from .checks import SetupError
                raise SetupError(f"{setup[-1][len('[setup] '):]} (while measuring this GPU's ceilings; log {log})")
            raise RuntimeError(f"measuring the ceilings failed (exit {rc}); log {log}: " + " | ".join(said[-3:]))
        return c


def peaks(device: int = 0, *, measure: bool = True, quick: bool = True) -> dict:
    """Ceilings to divide by: measured (cached per GPU UUID) where possible, with the datasheet row beside them.

    Returns ``{"gpu", "dram_tb_s", "bf16_tflops", "nvlink_busbw_gb_s", "source", "sources", "method",
    "datasheet", "measured", "ceilings", "uuid"}`` (see :func:`as_peaks`). A cached set is read without
    importing torch. Without one, ``measure=True`` measures the quick set once in a child process
    (~20-40 s; the caller's process never creates a CUDA context); ``quick=False`` also replaces a cached
    quick set by the full one (~1-2 min); with ≥ 2 GPUs visible a set without the all-reduce sweep gets
    it. ``measure=False`` never measures: the cached set, else the datasheet (``source`` says which).
    """
    c = load_ceilings(device)
    if measure and (c is None or _nvlink_wanted(c) or (not quick and c.get("mode") == "quick")):
        c = _measure_in_child(device, quick=quick)
    g = gpus()
    me = g[device] if 0 <= device < len(g) else {}
    return as_peaks(c, name=me.get("name"), uuid=me.get("uuid"))


def ceiling_text(pk: dict, key: str = "dram_tb_s", short: bool = False) -> str:
    """The denominator of a % column, named: 'the measured DRAM ceiling 4.62 TB/s (best of ...) of NVIDIA H200'
    (``short``: 'the measured DRAM ceiling 4.62 TB/s', for a title that names the GPU already)."""
    unit, what = ("TB/s", "DRAM") if key == "dram_tb_s" else ("TFLOP/s", "bf16 tensor")
    src = (pk.get("sources") or {}).get(key) or pk.get("source") or "?"
    how = (pk.get("method") or {}).get(key)
    val = pk.get(key)
    text = f"the {src} {what} ceiling {val:.3g} {unit}" if val else f"no {what} ceiling"
    if short:
        return text
    return text + (f" ({how})" if how and how != src else "") + f" of {pk.get('gpu') or 'this GPU'}"


def ceilings_table(c: dict | None, top_gemm: int = 3) -> list[dict]:
    """Rows for environment.md: ceiling, probe, measured, unit, datasheet, pct_of_datasheet, is_ceiling, method.

    ``c`` is a ceilings set or a :func:`peaks` dict (its "ceilings" is used; with none, the datasheet rows).
    Every DRAM probe gets a row (the fastest is the ceiling), then the ``top_gemm`` fastest GEMM shapes
    (the first is the ceiling), then the NVLink all-reduce ceiling or why there is none.
    """
    spec = None
    if c and "ceilings" in c and "version" not in c:       # a peaks() dict
        spec, c = c.get("datasheet"), c.get("ceilings")
    spec = (c or {}).get("datasheet") or spec

    def row(ceiling, probe, measured, unit, ds, is_ceiling, method):
        pct = 100.0 * measured / ds if measured and ds else None
        return {"ceiling": ceiling, "probe": probe, "measured": measured, "unit": unit, "datasheet": ds,
                "pct_of_datasheet": pct, "is_ceiling": "yes" if is_ceiling else "", "method": method}

    ds_dram, ds_bf16, ds_nv = (spec or {}).get("dram_tb_s"), (spec or {}).get("bf16_tflops"), _nvlink_ds(spec)
    if not c:
        why = "datasheet only: no measurement on this machine (python -m common.gpu ceilings)"
        return [row("DRAM bandwidth", "-", None, "TB/s", ds_dram, False, why),
                row("bf16 tensor throughput", "-", None, "TFLOP/s", ds_bf16, False, why),
                row("NVLink all-reduce busbw", "-", None, "GB/s", ds_nv, False, why)]
    rows = []
    dram = c["dram"]
    for i, p in enumerate(sorted(dram["probes"], key=lambda p: -p["tb_s"])):
        rows.append(row("DRAM bandwidth", f"{p['name']} ({_fmt_bytes(p['buffer_bytes'] if 'buffer_bytes' in p else p['bytes'])})",
                        p["tb_s"], "TB/s", ds_dram, i == 0, p.get("method", "")))
    shapes = sorted(c["bf16"]["shapes"], key=lambda s: -s["tflops"])
    for i, s in enumerate(shapes[:max(1, top_gemm)]):
        rows.append(row("bf16 tensor throughput", f"GEMM {s['m']}x{s['n']}x{s['k']} {s['layout']}", s["tflops"],
                        "TFLOP/s", ds_bf16, i == 0,
                        c["bf16"]["method"] if i == 0 else f"one shape of the sweep ({len(shapes)} shapes)"))
    nv = c.get("nvlink") or {}
    if nv.get("busbw_gb_s"):
        rows.append(row("NVLink all-reduce busbw", f"NCCL all-reduce {_fmt_bytes(nv['best_bytes'])} on {nv['gpus']} GPUs"
                        + (f" ({', '.join(nv.get('links') or [])})" if nv.get("links") else ""),
                        nv["busbw_gb_s"], "GB/s", ds_nv, True, nv.get("method", "")))
    else:
        rows.append(row("NVLink all-reduce busbw", "-", None, "GB/s", ds_nv, False,
                        nv.get("error") and f"sweep failed: {nv['error']}" or nv.get("note") or "not measured"))
    return rows


def _print_set(c: dict, path=None) -> None:
    from .story import table
    print(f"{c['gpu']} ({c['uuid']}) · {c['mode']} set v{c['version']} · {c['date_utc']} · driver {c.get('driver')} · "
          f"torch {c.get('torch')} · triton {c.get('triton')}" + (f" · {path}" if path else ""))
    rows = ceilings_table(c)
    print(table(rows, ["ceiling", "probe", "measured", "unit", "datasheet", "pct_of_datasheet", "is_ceiling"], max_width=60))
    print("methods:")
    for what, part in (("DRAM bandwidth", c["dram"]), ("bf16 tensor throughput", c["bf16"]),
                       ("NVLink all-reduce busbw", c.get("nvlink") or {})):
        print(f"  {what}: {part.get('method') or part.get('error') or part.get('note') or '-'}")
    for n in (c["dram"].get("notes") or []) + (c["bf16"].get("notes") or []):
        print(f"  note: {n}")


def main(argv=None) -> int:
    """``python -m common.gpu ceilings [--refresh] [--quick] [--device N]`` · ``python -m common.gpu show``."""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m common.gpu",
                                 description="This GPU's measured ceilings (DRAM, bf16 GEMM, NVLink), cached per GPU "
                                             f"UUID in {ceilings_dir()} (HANDS_ON_CACHE overrides the base).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("ceilings", help="measure (or read the cached) ceilings and print the table")
    m.add_argument("--refresh", action="store_true", help="measure again even if a cached set exists")
    m.add_argument("--quick", action="store_true", help="quick set: 1 GiB buffers, 16 GEMM shapes, 4 all-reduce sizes")
    m.add_argument("--device", type=int, default=0, help="visible GPU index (default 0)")
    m.add_argument("--no-nvlink", action="store_true", help="skip the all-reduce sweep even with >= 2 GPUs")
    m.add_argument("--json-out", help="also write the set to this file")
    s = sub.add_parser("show", help="print the cached set(s) without touching CUDA")
    s.add_argument("--device", type=int, help="only this visible GPU (default: every visible one, or every cached set)")
    a = ap.parse_args(argv)
    if a.cmd == "ceilings":
        c = measure_ceilings(a.device, quick=a.quick, refresh=a.refresh, nvlink=not a.no_nvlink)
        if a.json_out:
            save_ceilings(c, a.json_out)
        _print_set(c, ceilings_path(c["uuid"]))
        return 0
    g = gpus()
    idx = [a.device] if a.device is not None else list(range(len(g)))
    paths = [ceilings_path(g[i]["uuid"]) for i in idx if i < len(g)] if g else sorted(ceilings_dir().glob("*.json"))
    shown = 0
    for p in paths:
        c = read_ceilings(p)
        if c is None:
            print(f"{p}: no cached set of version {CEILINGS_VERSION} (python -m common.gpu ceilings)")
            continue
        _print_set(c, p)
        shown += 1
    if not paths:
        print(f"no cached ceilings in {ceilings_dir()} (python -m common.gpu ceilings)")
    return 0 if shown else 1


# ---------------------------------------------------------------- topology

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_topo(text: str) -> dict:
    """Parse `nvidia-smi topo -m`: {"gpus": [...], "links": {"GPU0-GPU1": "NV18"}, "cpu_affinity": {...},
    "numa": {...}}. Link legend: NV# = NVLink (# links), PIX/PXB/PHB = PCIe, NODE/SYS = across a
    host bridge / between NUMA nodes (slowest)."""
    lines = [_ANSI.sub("", l).rstrip() for l in text.splitlines()]
    head_i = next((i for i, l in enumerate(lines) if l.strip().startswith("GPU0")), None)
    if head_i is None:
        return {"gpus": [], "links": {}, "cpu_affinity": {}, "numa": {}}
    header = re.split(r"\t+", lines[head_i].strip())
    gpus = [h for h in header if re.fullmatch(r"GPU\d+", h)]
    out = {"gpus": gpus, "links": {}, "cpu_affinity": {}, "numa": {}}
    for l in lines[head_i + 1:]:
        cells = re.split(r"\t+", l.strip())
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            if cells and cells[0].startswith(("NIC", "Legend")):
                break
            continue
        me = cells[0]
        for j, g in enumerate(gpus):
            if j + 1 < len(cells) and g != me:
                out["links"][f"{me}-{g}"] = cells[j + 1]
        rest = cells[1 + len(gpus):]
        if rest:
            out["cpu_affinity"][me] = rest[0]
        if len(rest) > 1:
            out["numa"][me] = rest[1]
    return out


def topology() -> dict:
    """`nvidia-smi topo -m` as text and parsed (empty on a machine without a driver)."""
    text = _run(["nvidia-smi", "topo", "-m"]) or ""
    return {"text": _ANSI.sub("", text), **parse_topo(text)}


if __name__ == "__main__":
    from .checks import run_main
    run_main(main)
