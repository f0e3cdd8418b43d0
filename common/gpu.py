"""What machine ran this: a provenance snapshot, the device peak table and a measured-peak probe.

    prov = snapshot()                    # stored in every summary.json
    pk = peaks()                         # measured peaks of GPU 0 (cached), else datasheet
    spec = device_spec("NVIDIA H200")    # datasheet row, or None

Datasheet peaks are leads; the workbook divides by what this GPU was measured to do
(``measure_peaks``: a large device-to-device copy, counting bytes read + written, and a
large bf16 matrix product, both timed with CUDA events), cached per GPU in ``~/.cache/hands-on/peaks/`` (override the
folder with HANDS_ON_CACHE). Reports show both, so a reader sees the gap between them.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from . import REPO_ROOT

# Datasheet figures (dense, no sparsity). dram_tb_s: HBM/GDDR bandwidth in TB/s; bf16_tflops:
# dense BF16 tensor-core TFLOP/s; nvlink_gb_s: total NVLink bandwidth per GPU, both directions.
# Matched against torch.cuda.get_device_name() / nvidia-smi names, first match wins.
PEAK_TABLE = [
    # pattern,                         name,             dram,  bf16,  sms, l2_mb, nvlink
    (r"H200 NVL",                      "H200 NVL",        4.8,   835, 132,  60,  900),
    (r"H200",                          "H200 SXM",        4.8,   989, 132,  60,  900),
    (r"H100 NVL",                      "H100 NVL",        3.9,   835, 132,  50,  600),
    (r"H100.*PCIe",                    "H100 PCIe",       2.0,   756, 114,  50,  600),
    (r"H100",                          "H100 SXM",        3.35,  989, 132,  50,  900),
    (r"A100.*80GB.*PCIe|A100 80GB PCIe", "A100 80GB PCIe", 1.935, 312, 108, 40,  600),
    (r"A100.*PCIE.*40GB|A100-PCIE",    "A100 40GB PCIe",  1.555, 312, 108,  40,  600),
    (r"A100.*SXM4-80GB|A100.*80GB",    "A100 80GB SXM",   2.039, 312, 108,  40,  600),
    (r"A100",                          "A100 40GB SXM",   1.555, 312, 108,  40,  600),
    (r"L40S",                          "L40S",            0.864, 362, 142,  96,    0),
    (r"B200",                          "B200",            8.0,  2250, 148, 126, 1800),
    (r"L4\b",                          "L4",              0.300, 121,  58,  48,    0),
]

PACKAGES = ("torch", "triton", "flashinfer-python", "flashinfer", "sglang", "sglang-kernel", "sgl-kernel",
            "apache-tvm-ffi", "transformers", "nvtx", "nvidia-ml-py", "pandas", "matplotlib", "minisgl")
ENV_PREFIXES = ("CUDA_", "NCCL_", "SGLANG_", "FLASHINFER_", "TORCH_", "NVSHMEM_", "PYTORCH_", "HANDS_ON_")


def device_spec(name: str | None) -> dict | None:
    """Datasheet row for a GPU name, or None when the table has no match."""
    if not name:
        return None
    for pat, label, dram, bf16, sms, l2, nvl in PEAK_TABLE:
        if re.search(pat, name, re.IGNORECASE):
            return {"model": label, "dram_tb_s": dram, "bf16_tflops": bf16, "sms": sms,
                    "l2_mb": l2, "nvlink_gb_s": nvl, "source": "datasheet"}
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
    if vis and g and all(x.strip().isdigit() for x in vis.split(",")):
        keep = [int(x) for x in vis.split(",") if x.strip()]
        g = [x for x in g if x["index"] in keep]
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


# ---------------------------------------------------------------- measured peaks

def _cache_dir() -> Path:
    return Path(os.environ.get("HANDS_ON_CACHE", Path.home() / ".cache" / "hands-on")) / "peaks"


def _cache_key(torch, device: int) -> str:
    """GPU UUID (from NVML: no CUDA context needed) + driver + torch version."""
    g = gpus()
    me = g[device] if device < len(g) else None   # gpus() lists the visible GPUs in CUDA order
    uuid = me["uuid"] if me else torch.cuda.get_device_name(device).replace(" ", "_")
    drv = me["driver"] if me else "unknown"
    return f"{uuid}-drv{drv}-torch{torch.__version__}".replace("/", "_")


def measure_peaks(device: int = 0, *, refresh: bool = False, quick: bool = False) -> dict:
    """Measure copy bandwidth and bf16 GEMM throughput of ``device`` once; cache the result.

    Copy: a 2 GiB device-to-device copy (bytes read + written). GEMM: bf16 8192^3 on
    random data (zeros run faster and would flatter the peak). Both timed with
    :func:`common.timing.bench` (CUDA events, median).
    """
    import torch

    from .timing import bench
    path = _cache_dir() / f"{_cache_key(torch, device)}.json"
    if path.is_file() and not refresh:
        return json.loads(path.read_text())
    with torch.cuda.device(device):
        n = (512 << 20) if quick else (2 << 30)
        src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
        dst = torch.empty_like(src)
        t_copy = bench(lambda: dst.copy_(src), method="events", cold_l2=False, reps=30)  # a memcpy, not a kernel
        del src, dst
        m = 4096 if quick else 8192
        a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
        t_mm = bench(lambda: a @ b, method="events", cold_l2=False, reps=30)
        del a, b
        torch.cuda.empty_cache()
    res = {
        "gpu": torch.cuda.get_device_name(device),
        "dram_tb_s": 2 * n / (t_copy.median_ms / 1e3) / 1e12,
        "bf16_tflops": 2 * m**3 / (t_mm.median_ms / 1e3) / 1e12,
        "copy": {"bytes": 2 * n, **t_copy.to_dict()},
        "gemm": {"m": m, **t_mm.to_dict()},
        "source": "measured",
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1))
    os.replace(tmp, path)
    return res


def cached_peaks(device: int = 0) -> dict | None:
    """The measured peaks of ``device`` if this machine measured them before; never touches CUDA
    (scripts that start a server or a mini-SGLang engine on the GPU afterwards need that)."""
    import torch
    p = _cache_dir() / f"{_cache_key(torch, device)}.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def peaks(device: int = 0, *, measure: bool = True) -> dict:
    """Peaks to divide by: measured (cached) where possible, with the datasheet row beside them.

    Returns ``{"gpu", "dram_tb_s", "bf16_tflops", "source", "datasheet": {...}, "measured": {...}}``.
    A cached measurement is read without initialising CUDA; measuring needs the GPU for ~10 s.
    """
    g = gpus()
    meas = cached_peaks(device)
    if meas is None and measure:
        meas = measure_peaks(device)
    name = (meas or {}).get("gpu") or (g[device]["name"] if device < len(g) else None)
    if name is None:
        import torch
        name = torch.cuda.get_device_name(device)
    spec = device_spec(name)
    out = {"gpu": name, "datasheet": spec}
    if meas:
        out.update(dram_tb_s=meas["dram_tb_s"], bf16_tflops=meas["bf16_tflops"], source="measured",
                   measured={k: meas[k] for k in ("dram_tb_s", "bf16_tflops", "date_utc")})
    elif spec:
        out.update(dram_tb_s=spec["dram_tb_s"], bf16_tflops=spec["bf16_tflops"], source="datasheet")
    else:
        out.update(dram_tb_s=None, bf16_tflops=None, source="unknown")
    return out


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
