"""What machine ran this: a provenance snapshot, the GPUs, the datasheet row and the topology.

    prov = snapshot()                    # stored in every summary.json
    g = gpus()                           # visible GPUs (NVML, else nvidia-smi), no CUDA context
    spec = device_spec("NVIDIA H200")    # datasheet row (common/capture/datasheet.csv), or None
    topo = topology()                    # nvidia-smi topo -m, parsed

This GPU's measured ceilings (what every % column divides by) are common.capture.ceilings; their probes common.capture.probes;
the clocks and power while something runs common.capture.clocks.
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

from common import REPO_ROOT

# Datasheet figures (dense, no sparsity), one row per GPU model in common/capture/datasheet.csv: dram_tb_s
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
    dirty = _run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no", "--", ".",
                  *(f":(exclude){g}" for g in GENERATED)])
    return {"commit": sha or "unknown", "dirty": bool(dirty)}


# what the workbook writes itself (make reports, each pipeline that ends ok): a change there is a result, not a change
# of the code that ran. In `make quick` the FlashInfer pipeline refreshes its reports before mini-SGLang and SGLang
# start, which made every later run of a clean checkout read "dirty" (seen on an H100 run of e8f6082).
GENERATED = ("*/reports/*", "CROSS-SYSTEM.md")


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


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The host CPU's model name (Linux /proc/cpuinfo; else platform.processor()): the CPU-side times of a run
    (tokenize, schedule, launch, plan(), compiles) follow it, so two runs on one GPU model can differ by host."""
    try:
        for line in Path(cpuinfo).read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or None


def snapshot(argv: list[str] | None = None, extra: dict | None = None) -> dict:
    """Provenance stored with every result: machine, software, code version, command, date."""
    g = gpus()
    torch = sys.modules.get("torch")
    prov = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join(argv if argv is not None else [Path(sys.argv[0]).name if sys.argv else "python"] + sys.argv[1:]),
        "git": _git(),
        "host": {"python": platform.python_version(), "platform": platform.platform(terse=True),
                 "cpus": os.cpu_count(), "cpu_model": cpu_model()},
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


def machine_of(prov: dict) -> str:
    """The machine a run ran on, as the pages name it: '1x NVIDIA H200' (GPU count and model)."""
    return f"{prov.get('gpu_count') or 0}x {prov.get('gpu') or 'no GPU'}"


def provenance_line(prov: dict) -> str:
    """One line for the top of a report: GPU, driver, CUDA, packages, date, commit, command."""
    pk = prov.get("packages", {})
    keys = ("torch", "flashinfer-python", "sglang", "sglang-kernel", "minisgl")
    pkgs = ", ".join(f"{k} {pk[k]}" for k in keys if k in pk)
    git = prov.get("git", {})
    # the runtime torch was built with; a script that never imports torch has only the toolkit's nvcc
    cuda = prov.get("cuda_runtime") or (f"{prov['nvcc']} (nvcc)" if prov.get("nvcc") else "?")
    return (f"{machine_of(prov)} · driver {prov.get('driver') or '?'} · CUDA {cuda} · "
            f"{pkgs} · {prov.get('date_utc', '?')} · commit {git.get('commit', '?')}"
            f"{' (dirty)' if git.get('dirty') else ''} · `{prov.get('command', '')}`"
            + (f" · re-analysed (no GPU) {prov['reanalysed'].get('date_utc', '?')}, commit "
               f"{prov['reanalysed'].get('git', {}).get('commit', '?')}, `{prov['reanalysed'].get('command', '')}`"
               if prov.get("reanalysed") else ""))


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
