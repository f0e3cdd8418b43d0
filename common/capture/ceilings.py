"""This GPU's measured ceilings: what every "% of a ceiling" in the workbook divides by.

    pk = peaks()                           # the ceilings of GPU 0 (measured once, cached per GPU UUID)
    tb_s, kind = dram_for(pk, read_bytes, write_bytes)   # the DRAM ceiling that matches a kernel's traffic
    rows = ceilings_table(pk)              # probe · measured · datasheet · % of datasheet · method
    ceiling_text(pk, "dram_read_tb_s")     # 'the measured DRAM read ceiling 3.16 TB/s (...) of NVIDIA H100 ...'
    kinds_text(pk)                         # 'DRAM read 3.16 · mixed ... · copy 3.02 · write 3.30 TB/s (measured; ...)'

    python -m common ceilings measure [--refresh] [--quick] [--device N]   # measure (once) and print the table
    python -m common ceilings show                                          # the cached set(s), no CUDA

One record per machine (the GPU model, the driver and the maximum clocks: ``machine_key``), shared by the three
systems and by every run on the machine, so every page of a run states the same denominators (the probes are
common.capture.probes). It is measured once, kept with the spread of the probe that set each ceiling, and measured
again on request (``python -m common ceilings measure --refresh``) or when stale (another CEILINGS_VERSION, driver
or clocks: another record):

* DRAM: four ceilings by kind of traffic, read, mixed (two reads per write), copy (one read per write) and
  write, each the best of several streaming probes on buffers far above L2. A kernel's DRAM rate is divided
  by the one that matches its traffic (``dram_for``: by the share of its bytes that are writes) and the line
  names it. ``dram_tb_s`` (the fastest of them) is only the roofline's memory roof.
* bf16 tensor throughput: the best median over a sweep of GEMM shapes, the model's own shapes included, each
  started on a GPU off its power cap, with the SM clock it ran at (``bf16_sm_mhz``).
* NVLink bus bandwidth (≥ 2 GPUs visible): an NCCL all-reduce sweep, NVLink multicast off.

Each ceiling carries its method and the datasheet figure beside it (common/capture/datasheet.csv). A datasheet figure is
a denominator only where nothing was measured, and ``source`` then says "datasheet". The set is cached in
``~/.cache/hands-on/ceilings/<machine>.json`` (HANDS_ON_CACHE overrides the base) with CEILINGS_VERSION, so a
changed probe measures again; the NVML clock log of the measurement lies beside it (``<machine>.clocks.csv``).
Reading the cache (``peaks``, ``cached_peaks``, ``show``) never imports torch nor creates a CUDA context;
``peaks()`` without a cached set measures it once in a child process.
A kernel above a ceiling means the probe under-measures (or ran at a lower clock): improve the probe, never
clip the kernel.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from common import REPO_ROOT
from common.base.story import fmt_bytes
from common.capture.gpu import device_spec, gpus

# One set per GPU (keyed by its UUID), shared by the three systems: every % column of every report
# divides by the same numbers for the same machine. Layout of a record (``<cache>/ceilings/<machine>.json``):
#   {"version", "gpu", "machine", "uuid", "mode": "quick"|"full", "date_utc", "driver", "torch", "triton", "datasheet",
#    "dram":   {"tb_s", "best", "kinds": {"read"|"write"|"copy": {"tb_s", "best", "spread_pct"}}, "method",
#               "probes": [{"name", "kind", "bytes", "tb_s", "ms", "mem_mhz", ...}], "notes"},
#    "bf16":   {"tflops", "best": {"m", "n", "k", "layout"}, "spread_pct", "sm_mhz", "method",
#               "shapes": [{"m", "n", "k", "layout", "tflops", "ms", "sm_mhz", "power_w_max", "slowdown"}]},
#    "clocks": {"max_sm_mhz", "max_mem_mhz", "power_limit_w", "samples", "log"} (NVML while it measured),
#    "nvlink": {"busbw_gb_s", "gpus", "best_bytes", "method", "sizes": [...]} | {"note": why not} | {"error": ...}}

CEILINGS_VERSION = 6          # bump when a probe changes: a cached set of another version is measured again
# 5: DRAM read / write / copy kept apart; GEMM shapes start off the power cap, their SM clock recorded
# 6: one record per machine (GPU model, driver, clocks), each ceiling with the spread of the probe that set it


def ceilings_dir() -> Path:
    """Where every system reads and writes the ceilings: ``$HANDS_ON_CACHE/ceilings`` (default ``~/.cache/hands-on``)."""
    from common.base.checks import cache_dir
    return cache_dir() / "ceilings"


def _file_name(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", key)


def machine_key(device: int = 0) -> str | None:
    """The machine a ceilings record belongs to: the GPU model, the driver and the maximum SM and memory clocks of
    visible GPU ``device`` (NVML / nvidia-smi, no CUDA context); None without a driver. Every GPU of one model on a
    machine shares the record; a new driver or other clocks is another machine (the record is measured again)."""
    g = gpus()
    if not (0 <= device < len(g)):
        return None
    me = g[device]
    return (f"{me.get('name') or 'GPU'}-driver{me.get('driver') or '?'}-sm{me.get('max_sm_clock_mhz') or '?'}"
            f"-mem{me.get('max_mem_clock_mhz') or '?'}")


def record_path(key: str) -> Path:
    """The ceilings record of machine ``key`` (:func:`machine_key`)."""
    return ceilings_dir() / f"{_file_name(key)}.json"


def gpu_uuid(device: int = 0) -> str | None:
    """UUID of visible GPU ``device`` from NVML / nvidia-smi (no CUDA context); None without a driver."""
    g = gpus()
    return g[device]["uuid"] if 0 <= device < len(g) and g[device].get("uuid") else None


def _valid(c) -> bool:
    return (isinstance(c, dict) and c.get("version") == CEILINGS_VERSION and bool((c.get("dram") or {}).get("tb_s"))
            and bool((c.get("dram") or {}).get("kinds")) and bool((c.get("bf16") or {}).get("tflops")))


def read_ceilings(path) -> dict | None:
    """A cached ceilings file if it is of this CEILINGS_VERSION and complete, else None."""
    try:
        c = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return c if _valid(c) else None


def load_ceilings(device: int = 0) -> dict | None:
    """The ceilings record of the machine of visible GPU ``device``; never imports torch nor touches CUDA."""
    key = machine_key(device)
    return read_ceilings(record_path(key)) if key else None


def save_ceilings(c: dict, path=None) -> Path:
    """Write a ceilings set atomically (temp file + rename) to ``path`` or its machine's record."""
    path = Path(path) if path else record_path(c["machine"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(c, indent=1))
    os.replace(tmp, path)
    return path


def _nvlink_wanted(c: dict | None) -> bool:
    """True when ≥ 2 GPUs are visible and the set has no NVLink entry yet (a failed attempt counts)."""
    return len(gpus()) >= 2 and not (c or {}).get("nvlink", {}).get("gpus", 0) >= 2


# ---- what the scripts divide by

def _nvlink_ds(spec: dict | None) -> float | None:
    """Datasheet NVLink bandwidth per direction (GB/s), the figure an all-reduce busbw compares with."""
    v = (spec or {}).get("nvlink_gb_s")
    return v / 2 if v else None


DRAM_KEYS = {"read": "dram_read_tb_s", "mixed": "dram_mixed_tb_s", "copy": "dram_copy_tb_s",
             "write": "dram_write_tb_s"}
# a kernel's share of written bytes -> its kind: < 10% read; < 42% mixed (2 reads per write = 33%);
# <= 90% copy (1 read per write = 50%); above, write
KIND_BY_WRITE_SHARE = ((0.10, "read"), (0.42, "mixed"), (0.90, "copy"), (1.01, "write"))


def _short_methods(c: dict) -> dict:
    dram, gemm, nv = c.get("dram") or {}, c.get("bf16") or {}, c.get("nvlink") or {}
    b = gemm.get("best") or {}
    n = len(dram.get("probes", []))
    out = {"dram_tb_s": f"fastest of {n} probes: {dram.get('best')}",
           "bf16_tflops": f"best of {len(gemm.get('shapes', []))} GEMM shapes: "
                          f"{b.get('m')}x{b.get('n')}x{b.get('k')} {b.get('layout')}"
                          + (f" at SM {gemm['sm_mhz']:.0f} MHz" if gemm.get("sm_mhz") else "")}
    for kind, key in DRAM_KEYS.items():
        k = (dram.get("kinds") or {}).get(kind)
        if k:
            out[key] = f"fastest {kind} probe: {k['best']}"
    if nv.get("busbw_gb_s"):
        out["nvlink_busbw_gb_s"] = (f"best NCCL all-reduce busbw of {len(nv.get('sizes', []))} sizes on "
                                    f"{nv.get('gpus')} GPUs: {fmt_bytes(nv.get('best_bytes') or 0)}")
    return out


def as_peaks(c: dict | None, name: str | None = None, uuid: str | None = None) -> dict:
    """The dict every script divides by, from a ceilings set (or the datasheet row when ``c`` is None).

    Keys: gpu, uuid, dram_read_tb_s / dram_mixed_tb_s / dram_copy_tb_s / dram_write_tb_s (one per kind of
    traffic, see dram_for), dram_tb_s (the fastest of them: the roofline's memory roof), bf16_tflops and bf16_sm_mhz
    (the SM clock it was reached at), max_sm_mhz, nvlink_busbw_gb_s, l2_mb, sm_count, source ("measured" |
    "datasheet" | "unknown"), sources (per key), method (a short text per key), datasheet (the
    common/capture/datasheet.csv row), measured (the measured values, date, version, mode) and ceilings (the set).
    The datasheet gives one DRAM figure: each kind then falls back to it (``sources`` says so).
    """
    name = (c or {}).get("gpu") or name
    spec = device_spec(name)
    out = {"gpu": name, "uuid": (c or {}).get("uuid") or uuid, "datasheet": spec, "ceilings": c,
           "l2_mb": (c or {}).get("l2_mb") or (spec or {}).get("l2_mb"), "sm_count": (c or {}).get("sm_count") or
           (spec or {}).get("sms")}
    if c:
        nv = (c.get("nvlink") or {}).get("busbw_gb_s")
        kinds = c["dram"].get("kinds") or {}
        per_kind = {key: (kinds.get(kind) or {}).get("tb_s") or c["dram"]["tb_s"] for kind, key in DRAM_KEYS.items()}
        out.update(dram_tb_s=c["dram"]["tb_s"], bf16_tflops=c["bf16"]["tflops"], **per_kind,
                   bf16_sm_mhz=c["bf16"].get("sm_mhz"), max_sm_mhz=(c.get("clocks") or {}).get("max_sm_mhz"),
                   nvlink_busbw_gb_s=nv if nv else _nvlink_ds(spec), source="measured",
                   sources={"dram_tb_s": "measured", "bf16_tflops": "measured",
                            **{key: "measured" if kinds.get(kind) else "measured (fastest probe)"
                               for kind, key in DRAM_KEYS.items()},
                            "nvlink_busbw_gb_s": "measured" if nv else ("datasheet" if _nvlink_ds(spec) else None)},
                   method=_short_methods(c), spread_pct=_spreads(c),
                   measured={"dram_tb_s": c["dram"]["tb_s"], "bf16_tflops": c["bf16"]["tflops"], **per_kind,
                             "nvlink_busbw_gb_s": nv, "date_utc": c.get("date_utc"), "version": c.get("version"),
                             "mode": c.get("mode"), "uuid": c.get("uuid")})
        if not nv and _nvlink_ds(spec):
            out["method"]["nvlink_busbw_gb_s"] = "datasheet, per direction (not measured here)"
    elif spec:
        ds = {key: spec["dram_tb_s"] for key in DRAM_KEYS.values()}
        out.update(dram_tb_s=spec["dram_tb_s"], bf16_tflops=spec["bf16_tflops"], nvlink_busbw_gb_s=_nvlink_ds(spec),
                   **ds, source="datasheet",
                   sources={k: "datasheet" for k in ("dram_tb_s", "bf16_tflops", "nvlink_busbw_gb_s", *ds)},
                   method={"dram_tb_s": "datasheet", "bf16_tflops": "datasheet", **{k: "datasheet" for k in ds},
                           "nvlink_busbw_gb_s": "datasheet, per direction"})
    else:
        out.update(dram_tb_s=None, bf16_tflops=None, nvlink_busbw_gb_s=None, source="unknown", sources={}, method={},
                   **{key: None for key in DRAM_KEYS.values()})
    return out


def _spreads(c: dict) -> dict:
    """{peaks key: the timing spread (%, p10-p90 over its samples) of the probe that set that ceiling}."""
    dram, gemm = c.get("dram") or {}, c.get("bf16") or {}
    out = {"bf16_tflops": gemm.get("spread_pct")}
    for kind, key in DRAM_KEYS.items():
        out[key] = ((dram.get("kinds") or {}).get(kind) or {}).get("spread_pct")
    best = next((p for p in dram.get("probes") or [] if p.get("name") == dram.get("best")), {})
    out["dram_tb_s"] = best.get("spread_pct")
    return {k: v for k, v in out.items() if isinstance(v, (int, float))}


def complete(pk: dict) -> dict:
    """A recorded ceilings dict (a run keeps only some keys) with what the datasheet row of its GPU adds: the L2
    size and the SM count (hardware facts, not ceilings). The recorded values are kept."""
    spec = device_spec(pk.get("gpu")) or {}
    return {**pk, "l2_mb": pk.get("l2_mb") or spec.get("l2_mb"), "sm_count": pk.get("sm_count") or spec.get("sms")}


def dram_kind(read_bytes, write_bytes) -> str:
    """'read', 'mixed', 'copy' or 'write': the kind of DRAM traffic a kernel makes, from the share of its bytes
    that are writes (KIND_BY_WRITE_SHARE), which picks its ceiling. Unknown bytes -> 'copy'."""
    try:
        rd, wr = float(read_bytes or 0), float(write_bytes or 0)
    except (TypeError, ValueError):
        return "copy"
    tot = rd + wr
    if not tot or tot != tot:
        return "copy"
    return next(kind for limit, kind in KIND_BY_WRITE_SHARE if wr / tot < limit)


def kind_ceiling(pk: dict, kind: str = "read") -> float | None:
    """The DRAM ceiling in TB/s of traffic ``kind`` (DRAM_KEYS) from a :func:`peaks` dict; ``dram_tb_s`` for a
    record made before the kinds were measured apart."""
    return pk.get(DRAM_KEYS[kind]) or pk.get("dram_tb_s")


def dram_for(pk: dict, read_bytes, write_bytes) -> tuple[float | None, str]:
    """(the DRAM ceiling in TB/s that matches this traffic, its kind) from a :func:`peaks` dict (:func:`kind_ceiling`)."""
    kind = dram_kind(read_bytes, write_bytes)
    return kind_ceiling(pk, kind), kind


def ceilings_brief(c: dict | None) -> dict | None:
    """The figures of a ceilings set a run records in its provenance (its denominators), or None."""
    if not c:
        return None
    kinds = (c.get("dram") or {}).get("kinds") or {}
    return {"dram_tb_s": (c.get("dram") or {}).get("tb_s"), "bf16_tflops": (c.get("bf16") or {}).get("tflops"),
            **{key: (kinds.get(kind) or {}).get("tb_s") for kind, key in DRAM_KEYS.items()},
            "bf16_sm_mhz": (c.get("bf16") or {}).get("sm_mhz"),
            "nvlink_busbw_gb_s": (c.get("nvlink") or {}).get("busbw_gb_s"), "version": c.get("version"),
            "mode": c.get("mode"), "date_utc": c.get("date_utc"), "uuid": c.get("uuid"), "machine": c.get("machine"),
            "spread_pct": _spreads(c), "method": _methods(c)}


def _methods(c: dict) -> dict:
    """How each recorded ceiling was measured (as_peaks' ``method``), so a re-analysis can say it too."""
    try:
        return {k: v for k, v in (as_peaks(c).get("method") or {}).items() if isinstance(v, str)}
    except Exception:  # noqa: BLE001 - an older or partial ceilings set: the figures alone are recorded
        return {}


def cached_peaks(device: int = 0) -> dict | None:
    """The measured ceilings of ``device`` as :func:`peaks` returns them, if this machine measured them
    before; else None. Never imports torch nor creates a CUDA context (scripts that start a server or a
    mini-SGLang engine on the GPU afterwards call this)."""
    c = load_ceilings(device)
    return as_peaks(c) if c else None


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
    """Run ``python -m common ceilings measure`` in a child process group (stopped with its whole tree on
    timeout, error or Ctrl-C), so the caller gets no CUDA context and no GPU memory held by the probes;
    returns the set it measured, or raises RuntimeError with the end of its log."""
    import tempfile

    from common.base.checks import cache_folder
    from common.capture.procs import Group
    cache_folder("ceilings")              # a cache that cannot be written: one [setup] line naming it
    with tempfile.TemporaryDirectory(dir=ceilings_dir()) as td:
        out = Path(td) / "ceilings.json"
        cmd = [sys.executable, "-m", "common", "ceilings", "measure", "--device", str(device), "--json-out", str(out)]
        cmd += ["--quick"] if quick else []
        env, notes = measure_env()
        log = ceilings_dir() / f"measure-{_file_name(machine_key(device) or f'device{device}')}.log"
        echo(f"measuring this GPU's ceilings once ({'quick' if quick else 'full'} set, then cached in "
             f"{ceilings_dir()}; log {log})" + "".join(f"; {n}" for n in notes))
        with Group(cmd, log, env=env, name="ceilings", echo=echo, cwd=str(REPO_ROOT)) as g:
            rc = g.wait(1800)
        c = read_ceilings(out)
        if rc != 0 or c is None:
            said = log.read_text(errors="replace").strip().splitlines() if log.is_file() else []
            setup = [ln for ln in said if ln.startswith("[setup] ")]
            if rc == 2 and setup:            # the child's one line: the machine lacks something (no torch...)
                from common.base.checks import SetupError
                raise SetupError(f"{setup[-1][len('[setup] '):]} (while measuring this GPU's ceilings; log {log})")
            raise RuntimeError(f"measuring the ceilings failed (exit {rc}); log {log}: " + " | ".join(said[-3:]))
        return c


def peaks(device: int = 0, *, measure: bool = True, quick: bool = True) -> dict:
    """Ceilings to divide by: measured (cached per GPU UUID) where possible, with the datasheet row beside them.

    Returns ``{"gpu", "dram_tb_s", "bf16_tflops", "nvlink_busbw_gb_s", "source", "sources", "method",
    "datasheet", "measured", "ceilings", "uuid"}`` (see :func:`as_peaks`). A cached set is read without
    importing torch. Without one, ``measure=True`` measures it once in a child process (the quick set, ~20-40 s,
    or with ``quick=False`` the full one, ~1-2 min; the caller's process never creates a CUDA context); with ≥ 2
    GPUs visible a set without the all-reduce sweep gets it. A record is never replaced here (a quick one by a full
    one, say): every run on the machine divides by the same figures until ``python -m common ceilings measure
    --refresh`` measures them again. ``measure=False`` never measures: the record, else the datasheet (``source``).
    """
    c = load_ceilings(device)
    if measure and (c is None or _nvlink_wanted(c)):
        c = _measure_in_child(device, quick=quick)
    g = gpus()
    me = g[device] if 0 <= device < len(g) else {}
    return as_peaks(c, name=me.get("name"), uuid=me.get("uuid"))


_WHAT = {"dram_tb_s": ("TB/s", "DRAM (fastest stream)"), "dram_read_tb_s": ("TB/s", "DRAM read"),
         "dram_write_tb_s": ("TB/s", "DRAM write"), "dram_copy_tb_s": ("TB/s", "DRAM copy"),
         "dram_mixed_tb_s": ("TB/s", "DRAM mixed (2 reads : 1 write)"),
         "bf16_tflops": ("TFLOP/s", "bf16 tensor"), "nvlink_busbw_gb_s": ("GB/s", "NVLink all-reduce")}


def ceiling_text(pk: dict, key: str = "dram_tb_s", short: bool = False) -> str:
    """The denominator of a % column, named: 'the measured DRAM read ceiling 4.62 TB/s (fastest read probe: ...)
    of NVIDIA H200' (``short``: without the method and the GPU, for a title that names the GPU already)."""
    unit, what = _WHAT.get(key, ("", key))
    if key in DRAM_KEYS.values() and not pk.get(key) and pk.get("dram_tb_s"):
        key, what = "dram_tb_s", "DRAM (one ceiling: measured before read, write and copy were kept apart)"
    src = (pk.get("sources") or {}).get(key) or pk.get("source") or "?"
    how = (pk.get("method") or {}).get(key)
    val = pk.get(key)
    spread = (pk.get("spread_pct") or {}).get(key)
    text = (f"the {src} {what} ceiling {val:.3g} {unit}" + (f" (±{spread / 2:.1f}%)" if spread is not None else "")
            if val else f"no {what} ceiling")
    if short:
        return text
    return text + (f" ({how})" if how and how != src else "") + f" of {pk.get('gpu') or 'this GPU'}"


def kinds_text(pk: dict) -> str:
    """The DRAM ceilings of a :func:`peaks` dict, one per kind of traffic, on one line: 'DRAM read 4.60 · mixed 4.71
    (fastest probe) · copy 4.27 · write 4.71 TB/s (measured)'; a kind with no probe of its own says what stands in."""
    from common.base.story import fmt
    src = pk.get("sources") or {}
    parts = []
    for kind, key in DRAM_KEYS.items():
        how = src.get(key) or pk.get("source") or "?"
        stand_in = f" ({how.split('(')[-1].rstrip(')')})" if "(" in how else ""
        parts.append(f"{kind} {fmt(pk.get(key))}{stand_in}")
    return f"DRAM {' · '.join(parts)} TB/s ({pk.get('source') or '?'}; each kernel is divided by the kind its traffic matches)"


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
        why = "datasheet only: no measurement on this machine (python -m common ceilings measure)"
        return [row("DRAM", "-", None, "TB/s", ds_dram, False, why),
                row("bf16 tensor throughput", "-", None, "TFLOP/s", ds_bf16, False, why),
                row("NVLink all-reduce busbw", "-", None, "GB/s", ds_nv, False, why)]
    rows = []
    dram = c["dram"]
    for kind in DRAM_KINDS:
        mine = sorted((p for p in dram["probes"] if p.get("kind") == kind), key=lambda p: -p["tb_s"])
        for i, p in enumerate(mine):
            rows.append(row(f"DRAM {kind}", f"{p['name']} ({fmt_bytes(p['buffer_bytes'] if 'buffer_bytes' in p else p['bytes'])})",
                            p["tb_s"], "TB/s", ds_dram, i == 0, p.get("method", "")))
    shapes = sorted(c["bf16"]["shapes"], key=lambda s: -s["tflops"])
    for i, s in enumerate(shapes[:max(1, top_gemm)]):
        clock = f" at SM {s['sm_mhz']:.0f} MHz" if s.get("sm_mhz") else ""
        rows.append(row("bf16 tensor throughput", f"GEMM {s['m']}x{s['n']}x{s['k']} {s['layout']}{clock}", s["tflops"],
                        "TFLOP/s", ds_bf16, i == 0,
                        c["bf16"]["method"] if i == 0 else f"one shape of the sweep ({len(shapes)} shapes)"))
    nv = c.get("nvlink") or {}
    if nv.get("busbw_gb_s"):
        rows.append(row("NVLink all-reduce busbw", f"NCCL all-reduce {fmt_bytes(nv['best_bytes'])} on {nv['gpus']} GPUs"
                        + (f" ({', '.join(nv.get('links') or [])})" if nv.get("links") else ""),
                        nv["busbw_gb_s"], "GB/s", ds_nv, True, nv.get("method", "")))
    else:
        rows.append(row("NVLink all-reduce busbw", "-", None, "GB/s", ds_nv, False,
                        nv.get("error") and f"sweep failed: {nv['error']}" or nv.get("note") or "not measured"))
    return rows


STREAM_FACTOR = 4       # a working set >= 4 x the L2 goes through DRAM: only then is effective bandwidth a DRAM rate


def l2_bytes(peaks: dict | None) -> float | None:
    """The L2 size in bytes: ``l2_mb`` holds the L2 as CUDA reports it, in MiB (2**20 bytes), like every size
    of that field (60 on an H200, 50 on an H100); None when unknown."""
    mib = (peaks or {}).get("l2_mb")
    return mib * 2**20 if mib else None


DRAM_KINDS = ("read", "mixed", "copy", "write")     # by share of writes: 0, 1/3 (two reads per write), 1/2, 1
