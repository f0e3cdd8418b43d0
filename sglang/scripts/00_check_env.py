#!/usr/bin/env python3
"""00 · SGLang environment: GPU, topology, CUDA, packages, usable attention backends, profilers.

What it measures
    Nothing is served here. It records what every later SGLang script depends on: the GPUs
    (name, memory, clocks), `nvidia-smi topo -m` links and NUMA affinity, driver and CUDA
    versions, the versions of torch / sglang / sglang-kernel / flashinfer / triton /
    transformers, how long `import sglang` takes, which attention backends can really be used
    (FlashInfer and Triton import; FA3 only if `sgl_kernel.flash_attn` imports — the trimmed
    sglang-kernel build has no FA3 library, and SGLang 0.5.17 picks FA3 on Hopper without
    checking), the JIT caches that decide whether a server starts in ~30 s or ~2 min, and
    whether ncu (with counter permission), nsys and the torch profiler work. It also measures
    this GPU's ceilings (common.capture.ceilings.peaks: best-of-probe DRAM bandwidth per kind of traffic, read, mixed,
    copy and write, a kernel divided by the kind its traffic matches; bf16 GEMM sweep; the L2 size; cached per GPU)
    that every later "% of ceiling" divides by.

What the plan expected (hypotheses)
    * The A100 box of the plan had NVLink pairs and PCIe across NUMA nodes; here the topology is
      recorded, not assumed (verdict from the link types found).
    * FA3 is SGLang's default on Hopper but may be missing: the backend has to be detected.

Run
    python sglang/scripts/00_check_env.py --quick      # ~20 s (skips the ncu permission probe)
    python sglang/scripts/00_check_env.py              # + ncu counter-permission probe (~10 s more)
    python sglang/scripts/00_check_env.py --reanalyse DIR --out OUT   # no GPU, no sglang: the analysis again
Writes sglang/results/00_check_env/: gpus.csv, packages.csv, backends.csv, profilers.csv,
jit_caches.csv, serving.csv (compute capability, SGLang's default backend there, the sglang import), topology.txt,
story.txt, summary.json.
"""
from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from common.base import story  # noqa: E402
from common.base.checks import require_gpu, require_module, run_main, SetupError  # noqa: E402
from common.capture import ceilings, gpu  # noqa: E402
from common.capture.ncu import profilers  # noqa: E402
from common.run import cli, recording  # noqa: E402
from common.run.results import Run  # noqa: E402

PACKAGES = ("torch", "triton", "sglang", "sglang-kernel", "sgl-kernel", "flashinfer-python", "apache-tvm-ffi",
            "transformers", "tokenizers", "datasets", "prometheus-client", "aiohttp", "nvtx", "nvidia-ml-py",
            "pandas", "matplotlib")
JIT_CACHES = {"flashinfer": "~/.cache/flashinfer", "tvm-ffi (SGLang JIT kernels)": "~/.cache/tvm-ffi",
              "triton": "~/.triton/cache"}


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="skip the ncu counter-permission probe")
    recording.add_flag(p)
    return p.parse_args(argv)


def try_import(name: str) -> tuple[bool, str, float]:
    """(ok, version or first line of the error, seconds)."""
    t = time.time()
    try:
        mod = importlib.import_module(name)
        if getattr(mod, "__file__", None) is None:   # a namespace package (e.g. this repo's sglang/ folder)
            return False, f"ModuleNotFoundError: no installed package '{name}'", time.time() - t
        return True, str(getattr(mod, "__version__", "") or "ok"), time.time() - t
    except Exception as e:  # ImportError, but broken builds raise OSError/RuntimeError too
        return False, f"{e.__class__.__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}", time.time() - t


def dir_size(path: str) -> tuple[int, float]:
    p = Path(os.path.expanduser(path))
    if not p.is_dir():
        return 0, 0.0
    files = [f for f in p.rglob("*") if f.is_file()]
    return len(files), sum(f.stat().st_size for f in files) / 1e6


def numa_text() -> str:
    if shutil.which("numactl"):
        out = subprocess.run(["numactl", "--hardware"], capture_output=True, text=True)
        if out.returncode == 0:
            return out.stdout.strip()
    nodes = sorted(Path("/sys/devices/system/node").glob("node[0-9]*"))
    return "\n".join(f"{n.name}: cpus {(n / 'cpulist').read_text().strip()}" for n in nodes) or "no NUMA info"


def backends_table() -> tuple[dict, list[dict]]:
    """Whether sglang (and its server args) import, and which attention backends can really be used."""
    ok_sgl, sgl_ver, sgl_s = try_import("sglang")
    ok_srv, srv_msg, _ = try_import("sglang.srt.server_args") if ok_sgl else (False, "sglang missing", 0)
    rows = []
    for name, module in (("flashinfer", "flashinfer"), ("triton", "triton"), ("fa3", "sgl_kernel.flash_attn")):
        ok, msg, _ = try_import(module)
        rows.append({"backend": name, "usable": ok, "detail": msg if not ok or name != "fa3" else "sgl_kernel.flash_attn ok",
                     "how": f"--attention-backend {name}"})
    return {"ok": ok_sgl, "version": sgl_ver, "import_s": sgl_s, "server_args": ok_srv, "server_args_msg": srv_msg}, rows


def profiler_rows(torch, quick: bool) -> list[dict]:
    prof = profilers(probe=not quick)
    return [{"profiler": "ncu", "path": prof["ncu"].get("path"), "version": prof["ncu"].get("version"),
             "status": prof["ncu"].get("counters", "not probed (--quick)" if prof["ncu"].get("path") else "missing")},
            {"profiler": "nsys", "path": prof["nsys"].get("path"), "version": prof["nsys"].get("version"),
             "status": "usable" if prof["nsys"].get("path") else "missing -> 04 uses the torch profiler"},
            {"profiler": "torch.profiler", "path": "-", "version": torch.__version__,
             "status": "usable" if prof["torch_profiler"]["available"] else "missing"}]


def sglang_default(major: int) -> str:
    """SGLang 0.5.17's default attention backend on a GPU of compute capability ``major``.x."""
    return "fa3" if major == 9 else ("trtllm_mha" if major == 10 else "flashinfer")


def verdicts(run, props, cc, default, fa3, links) -> None:
    """Facts of this machine (names and link types): observed, not judged on intervals."""
    if props.major == 9:
        run.observe("FA3 is SGLang's default attention backend on Hopper, and 0.5.17 does not check that it is "
                    "installed: the backend must be detected, not assumed",
                    f"compute capability {cc} -> SGLang default '{default}'; sgl_kernel.flash_attn: "
                    f"{'imports' if fa3['usable'] else fa3['detail']}",
                    "refuted" if fa3["usable"] else "confirmed", "backends.csv")
    else:
        run.observe("FA3 is SGLang's default on Hopper (detection needed)", f"not a Hopper GPU (cc {cc}); "
                    f"SGLang's default here: {default}", "inconclusive", "backends.csv")
    nv = [k for k in links.values() if k.startswith("NV")]
    run.observe("the plan's box mixes NVLink pairs and PCIe links across NUMA nodes",
                f"{len(nv)} of {len(links)} GPU pairs on NVLink ({', '.join(sorted(set(links.values())))})" if links
                else "one GPU: no links to classify",
                "inconclusive" if not links else "confirmed" if 0 < len(nv) < len(links) else "refuted", "topology.txt")


@dataclass
class Record:
    """What the analysis reads: the machine's facts as the tables (and topology.txt, provenance) keep them -- the
    same a --reanalyse reads back from a recording."""
    prov: dict
    gpus: list
    major: int
    cc: str
    cuda: str | None
    links: dict
    sgl: dict
    backends: list
    caches: list = field(default_factory=list)
    prow: list = field(default_factory=list)
    pkk: dict = field(default_factory=dict)

    @property
    def default(self) -> str:
        return sglang_default(self.major)

    def serving_row(self) -> dict:
        """serving.csv: compute capability, SGLang's default backend there, the sglang import."""
        return {"compute_capability": self.cc, "sglang_default_backend": self.default, "sglang_ok": self.sgl["ok"],
                "sglang_version": self.sgl["version"], "import_s": self.sgl["import_s"],
                "server_args_ok": self.sgl["server_args"], "server_args_msg": self.sgl["server_args_msg"]}


def analyse(run, x: Record) -> None:
    """Headline, observations and story from the machine's facts (a GPU run and --reanalyse alike)."""
    n_gpu, gpus, cc, sgl, backends, pkk, prov = len(x.gpus), x.gpus, x.cc, x.sgl, x.backends, x.pkk, x.prov
    fa3, default = backends[-1], x.default
    run.headline(gpus=n_gpu, gpu=gpus[0]["name"] if gpus else None, sglang=sgl["version"] if sgl["ok"] else None,
                 import_sglang_s=round(sgl["import_s"], 1), fa3_usable=fa3["usable"],
                 usable_backends=",".join(b["backend"] for b in backends if b["usable"]))
    run.headline(**{f"measured_{key}": pkk.get(key) for key in ceilings.DRAM_KEYS.values()},
                 measured_bf16_tflops=pkk.get("bf16_tflops"), l2_mb=pkk.get("l2_mb"))
    verdicts(run, type("Props", (), {"major": x.major})(), cc, default, fa3, x.links)
    env_keys = {k: v for k, v in prov.get("env", {}).items() if k.startswith(("NCCL_", "TORCH_SYMM", "NVSHMEM"))}
    items = [
        (f"GPU: {n_gpu}x {gpus[0]['name'] if gpus else '?'} (cc {cc}, {gpus[0]['memory_gb'] if gpus else '?'} GB), "
         f"driver {prov.get('driver')}, CUDA {x.cuda}", []),
        (f"topology: {', '.join(f'{k}={v}' for k, v in list(x.links.items())[:6]) or 'single GPU'}", []),
        (f"measured ceilings: {ceilings.kinds_text(pkk)}", [
            (f"bf16 GEMM {story.fmt(pkk.get('bf16_tflops'))} TFLOP/s; L2 {pkk.get('l2_mb')} MB (datasheet "
             f"{(pkk.get('datasheet') or {}).get('dram_tb_s', '?')} TB/s, "
             f"{(pkk.get('datasheet') or {}).get('bf16_tflops', '?')} TFLOP/s)", [])]),
        (f"sglang {sgl['version'] if sgl['ok'] else 'NOT importable: ' + sgl['version']} (import {sgl['import_s']:.1f} s)"
         + ("" if sgl["server_args"] else f"; server_args: {sgl['server_args_msg']}"), []),
        ("attention backends", [(f"{b['backend']}: {'usable' if b['usable'] else 'no'} — {b['detail']}", [])
                                for b in backends] + [(f"SGLang's default on cc {cc}: {default}"
                                                       + ("" if fa3["usable"] or default != "fa3" else
                                                          " -> pass --attention-backend flashinfer|triton"), [])]),
        ("JIT caches", [(f"{c['cache']}: {c['files']} files, {c['size_mb']} MB ({'warm' if c['warm'] else 'cold'})", [])
                        for c in x.caches]),
        ("profilers", [(f"{r['profiler']}: {r['status']}", []) for r in x.prow]),
        (f"NVLink multicast env: {env_keys or 'unset (common.capture.procs.nccl_env turns it off for the servers)'}", []),
    ]
    run.story(story.tree(f"SGLANG ENVIRONMENT — {prov.get('gpu')}", items), echo=True)


def cannot_serve(x: Record) -> int:
    """The exit status: 2 with one [setup] line when SGLang cannot serve on this machine."""
    if not x.sgl["ok"] or not any(b["usable"] for b in x.backends):
        print("[setup] SGLang cannot serve here: " + (x.sgl["version"] if not x.sgl["ok"] else "no usable attention backend"),
              file=sys.stderr)
        return 2
    return 0


# compute capability of the GPUs a recording without serving.csv names (made before 00 wrote it): NVIDIA's table
CC_BY_NAME = {"H100": "9.0", "H200": "9.0", "GH200": "9.0", "H800": "9.0", "H20": "9.0", "A100": "8.0",
              "A800": "8.0", "A10": "8.6", "A40": "8.6", "L4": "8.9", "L40": "8.9", "L40S": "8.9", "B200": "10.0",
              "GB200": "10.0", "B300": "10.3"}


def _cc_of(name: str) -> str | None:
    words = name.replace("NVIDIA", "").replace("-", " ").split()
    return next((CC_BY_NAME[w] for w in words if w in CC_BY_NAME), None)


def main_reanalyse(args) -> int:
    """--reanalyse DIR: the machine's facts back from gpus/packages/backends/jit_caches/profilers.csv, serving.csv,
    topology.txt and the recording's provenance; no GPU, no sglang. A recording made before serving.csv: the
    compute capability from the GPU's name (NVIDIA's table), the sglang import from packages.csv and the headline,
    server_args: not recorded."""
    rec = recording.open(args.reanalyse, __file__, tables=("gpus", "packages", "backends"),
                         optional=("jit_caches", "profilers", "serving"), copy=("topology.txt",))
    t, prov, head = rec.tables, rec.summary.get("provenance") or {}, rec.summary.get("headline") or {}
    rows = lambda name: [] if t[name] is None else t[name].where(t[name].notna(), None).to_dict("records")  # noqa: E731
    gpus, pkgs = rows("gpus"), {r["package"]: r["version"] for r in rows("packages")}
    topo = rec.files.get("topology.txt", b"").decode().split("\n\n# NUMA")[0]
    links = gpu.parse_topo(topo).get("links", {}) if topo else {}
    if t["serving"] is not None:
        sv = rows("serving")[0]
        cc = str(sv["compute_capability"])
        sgl = {"ok": bool(sv["sglang_ok"]), "version": str(sv["sglang_version"]), "import_s": float(sv["import_s"]),
               "server_args": bool(sv["server_args_ok"]), "server_args_msg": sv["server_args_msg"] or ""}
    else:
        name = prov.get("gpu") or (gpus[0]["name"] if gpus else "")
        cc = prov.get("compute_capability") or _cc_of(name)
        if cc is None:
            raise SetupError(f"--reanalyse {rec.src}: no serving.csv and no compute capability for '{name}' (a "
                             "recording made before 00 wrote serving.csv): re-run 00 on the GPU")
        ok = bool(head.get("sglang"))
        sgl = {"ok": ok, "version": head.get("sglang") or pkgs.get("sglang") or "not importable (the recording does "
               "not say why)", "import_s": float(head.get("import_sglang_s") or 0.0), "server_args": False,
               "server_args_msg": "not recorded (a recording made before serving.csv)"}
    x = Record(prov, gpus, int(str(cc).split(".")[0]), cc, pkgs.get("cuda (torch)"), links, sgl, rows("backends"),
               rows("jit_caches"), rows("profilers"), rec.peaks)
    for b in x.backends:
        b["usable"] = bool(b["usable"])
    for c in x.caches:
        c["warm"] = bool(c["warm"])
    with recording.run(__file__, args, rec) as run:
        analyse(run, x)
    return cannot_serve(x)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    torch = require_module("torch", "pip install -r requirements.txt")
    n_gpu = require_gpu(torch)
    with Run(__file__, args, out=args.out) as run:
        prov = run.summary["provenance"]
        gpus = gpu.gpus()
        props = torch.cuda.get_device_properties(0)
        cc = f"{props.major}.{props.minor}"
        run.log(f"{n_gpu} GPU(s): {gpus[0]['name'] if gpus else torch.cuda.get_device_name(0)}, "
                f"compute capability {cc}, driver {prov.get('driver')}, torch CUDA {torch.version.cuda}")
        topo = gpu.topology()
        for g in gpus:
            g["numa_affinity"] = topo.get("numa", {}).get(f"GPU{g['index']}")
            g["cpu_affinity"] = topo.get("cpu_affinity", {}).get(f"GPU{g['index']}")
        run.table("gpus", gpus)
        run.path("topology.txt").write_text((topo.get("text") or "nvidia-smi topo -m: unavailable") +
                                            "\n\n# NUMA\n" + numa_text() + "\n")
        links = topo.get("links", {})
        run.log(f"topology: {len(links)} GPU pairs, link types {sorted(set(links.values())) or '-'}")
        pk = [{"package": p, "version": _version(p)} for p in PACKAGES]
        run.table("packages", [r for r in pk if r["version"]] + [{"package": "cuda (torch)", "version": torch.version.cuda},
                                                                 {"package": "driver", "version": prov.get("driver")},
                                                                 {"package": "nvcc", "version": prov.get("nvcc")}])
        sgl, backends = backends_table()          # the stack must import before anything can be served
        run.log(f"import sglang: {'ok ' + sgl['version'] if sgl['ok'] else sgl['version']} ({sgl['import_s']:.1f} s)")
        x = Record(prov, gpus, props.major, cc, torch.version.cuda, links, sgl, backends)
        run.table("backends", backends)
        for b in backends:
            run.log(f"backend {b['backend']:10s} {'usable' if b['usable'] else 'NOT usable'}: {b['detail']}")
        for name, path in JIT_CACHES.items():   # the JIT caches decide the start-up time of a server (warm ~30 s, cold ~2 min on an H200)
            n, mb = dir_size(path)
            x.caches.append({"cache": name, "path": path, "files": n, "size_mb": round(mb, 1), "warm": n > 0})
        run.table("jit_caches", x.caches)
        x.prow = profiler_rows(torch, args.quick)
        run.table("profilers", x.prow)
        run.table("serving", [x.serving_row()])
        x.pkk = ceilings.peaks()
        analyse(run, x)
    return cannot_serve(x)


def _version(p: str) -> str | None:
    try:
        return metadata.version(p)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    run_main(main)
