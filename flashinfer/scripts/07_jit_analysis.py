#!/usr/bin/env python3
"""07 · FlashInfer's JIT: what triggers a compile, what a cold compile and a warm load cost, where the cache lives.

What it measures
    Each step of a first use — import, wrapper constructor, plan(), first and second run(), first
    rmsnorm / fused_add_rmsnorm / RoPE call — timed in a fresh Python process, with what it
    compiled (a new .so in the JIT folder) and which JIT specs it registered. Three passes:
      cold        a child process whose FLASHINFER_WORKSPACE_BASE is an empty temporary folder:
                  every module it touches is compiled (nvcc via ninja); your own cache is untouched;
      warm        the same steps again on that folder: ninja finds nothing to do, the .so is loaded;
      your cache  the same steps on the normal cache (~/.cache/flashinfer): the load time a real
                  run pays (modules missing there are skipped, not compiled, in --quick).
    Per module: cold compile time, warm load time, objects, .so size and per-object nvcc times from
    .ninja_log. Finally FlashInfer's own CLI (`python -m flashinfer module-status`) is asked what it
    thinks is compiled — with a timeout, pointed at the temporary cache and with downloads made to
    fail at once; `show-config` is never run because it tries to download cubin checksums.

What the plan expected (hypotheses)
    * to see what triggers compilation, how caching works, and the compile overhead;
    * from the source (analysis.md H-02): attention modules compile inside plan(), norm and RoPE on
      their first call; a cold compile takes seconds, a warm load milliseconds; fused_add_rmsnorm
      reuses the `norm` module; the prefill module is the slowest to build; tensor-core decode
      reuses the fa2 prefill module.

Run
    python flashinfer/scripts/07_jit_analysis.py --quick     # ~1 min: ONE cold compile (the decode module)
    python flashinfer/scripts/07_jit_analysis.py             # all modules cold (3-5 min of nvcc on 16 cores)
    python flashinfer/scripts/07_jit_analysis.py --modules norm,rope --keep-cache   # keep the temp cache to look at
    python flashinfer/scripts/07_jit_analysis.py --reanalyse DIR --out OUT   # no GPU: the analysis again from DIR
Writes flashinfer/results/07_jit_analysis/: steps.csv, modules.csv, cli.csv, passes.csv (each pass's wall time, CPUs,
MAX_JOBS, cache folder), cli_module_status.txt, story.txt, summary.json.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _fi  # noqa: E402
import _fi_jit  # noqa: E402
from common.base import story  # noqa: E402
from common.base.checks import run_main, SetupError  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.run import cli, recording  # noqa: E402
from common.run.results import Run  # noqa: E402

MODULES = ("decode", "prefill_fa2", "prefill_fa3", "tc_decode", "norm", "rope")
PAGE = 16
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

H = declare("""
    cold_warm = jit-cold-warm: a cold cache costs seconds of nvcc per module, a warm one milliseconds to load
        judged on: every module: cold >= 1 s, warm < 0.5 s (one compile each: far from both bounds)
        source: analysis.md H-02
    plan = jit-in-plan: attention modules are compiled inside plan(), not run()
        judged on: the steps of the attention wrappers that built a .so (cold pass)
        source: analysis.md H-02
    norm = jit-norm-shared: rmsnorm compiles `norm` on its first call; fused_add_rmsnorm then compiles nothing
        judged on: what the first rmsnorm and fused_add_rmsnorm calls built (cold pass)
        source: analysis.md H-02
    tc_reuse = jit-tc-reuses-fa2: tensor-core decode reuses the fa2 prefill module
        judged on: what tc decode's plan() built after the fa2 prefill (cold pass)
        source: analysis.md (reading the source)
    slowest = jit-prefill-slowest: the prefill module is the slowest to build (10 translation units)
        judged on: the module with the longest cold compile
        source: flashinfer/reports/plan.md §07
    cli = jit-cli: FlashInfer's own CLI (module-status) lists the module(s) compiled here as compiled
        judged on: `python -m flashinfer module-status --filter compiled` on the temporary cache
        source: flashinfer/reports/plan.md §07: module status
""")


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="cold-compile only the decode module (~1 min)")
    p.add_argument("--modules", type=cli.choices_list(*MODULES), default=None, help=f"comma-separated subset of "
                   f"{','.join(MODULES)} (default: decode with --quick, all otherwise)")
    p.add_argument("--cli-timeout", type=cli.positive_float, default=None,
                   help="seconds for each `python -m flashinfer` call (default 60 with --quick, else 180)")
    p.add_argument("--keep-cache", action="store_true", help="keep the temporary cold cache folder")
    p.add_argument("--child", choices=("run",), help=argparse.SUPPRESS)   # internal: the timed process
    p.add_argument("--report", default=None, help=argparse.SUPPRESS)
    recording.add_flag(p)
    return p.parse_args(argv)


# ------------------------------------------------------------------ the timed child process

def child(args) -> int:
    """Time every step of a first use in THIS process; write the steps as JSON to --report."""
    t0 = time.perf_counter()
    import torch
    t_torch = time.perf_counter() - t0
    torch.zeros(1, device="cuda")
    t_ctx = time.perf_counter() - t0 - t_torch
    t1 = time.perf_counter()
    import flashinfer as fi
    from flashinfer.jit import env as jit_env, jit_spec_registry
    t_fi = time.perf_counter() - t1
    steps = [{"module": "-", "step": "import torch", "seconds": t_torch, "compiled": ""},
             {"module": "-", "step": "CUDA context", "seconds": t_ctx, "compiled": ""},
             {"module": "-", "step": "import flashinfer", "seconds": t_fi, "compiled": ""}]
    jit_dir = jit_env.FLASHINFER_JIT_DIR

    def sos():
        return {m["module"]: m["so_mtime"] for m in _fi_jit.jit_modules(jit_dir)}

    def step(module, what, fn):
        before, specs0 = sos(), {s.name for s in jit_spec_registry.get_all_statuses()}
        torch.cuda.synchronize()
        t = time.perf_counter()
        err = ""
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as e:  # a failed compile is a result: recorded, the next module still runs
            err = f"{e.__class__.__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
        dt = time.perf_counter() - t
        after = sos()
        built = sorted(k for k, v in after.items() if v and before.get(k) != v)
        new = sorted({s.name for s in jit_spec_registry.get_all_statuses()} - specs0)
        steps.append({"module": module, "step": what, "seconds": dt, "compiled": " ".join(built),
                      "registered": " ".join(new), "error": err})

    bf = torch.bfloat16
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    lay = _fi.head_layout("llama-3.1-8b")
    hq, hkv, d = lay["hq"], lay["hkv"], lay["d"]
    cache, ip, ix, last = _fi.make_paged_kv(torch, [1024] * 4, hkv, d, PAGE)
    q = torch.randn(4, hq, d, device="cuda", dtype=bf)
    qp = torch.randn(4 * 256, hq, d, device="cuda", dtype=bf)
    qo_ip = torch.arange(5, device="cuda", dtype=torch.int32) * 256
    todo = list(args.modules)
    from flashinfer.utils import is_sm90a_supported
    if "prefill_fa3" in todo and not is_sm90a_supported(torch.device("cuda")):
        todo.remove("prefill_fa3")
        steps.append({"module": "prefill_fa3", "step": "skipped", "seconds": 0.0, "compiled": "",
                      "error": "not sm90a: FA3 is Hopper-only"})
    w = {}
    for m in todo:
        if m in ("decode", "tc_decode"):
            tc = m == "tc_decode"
            step(m, "constructor", lambda: w.__setitem__(m, fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc)))
            step(m, "plan()", lambda: w[m].plan(ip, ix, last, hq, hkv, d, PAGE, q_data_type=bf, kv_data_type=bf))
            step(m, "run() first", lambda: w[m].run(q, cache))
            step(m, "run() second", lambda: w[m].run(q, cache))
        elif m.startswith("prefill_"):
            be = m.split("_")[1]
            step(m, "constructor", lambda: w.__setitem__(m, fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=be)))
            step(m, "plan()", lambda: w[m].plan(qo_ip, ip, ix, last, hq, hkv, d, PAGE, causal=True,
                                                q_data_type=bf, kv_data_type=bf))
            step(m, "run() first", lambda: w[m].run(qp, cache))
            step(m, "run() second", lambda: w[m].run(qp, cache))
        elif m == "norm":
            x = torch.randn(1024, 4096, device="cuda", dtype=bf)
            r, g = torch.randn_like(x), torch.randn(4096, device="cuda", dtype=bf)
            step(m, "rmsnorm() first", lambda: fi.rmsnorm(x, g))
            step(m, "fused_add_rmsnorm() first", lambda: fi.fused_add_rmsnorm(x, r, g))
            step(m, "rmsnorm() second", lambda: fi.rmsnorm(x, g))
        elif m == "rope":
            s = _fi.rope_setup(torch, 1024, lay)
            step(m, "apply_rope_with_cos_sin_cache_inplace() first",
                 _fi.rope_call(fi, "apply_rope_with_cos_sin_cache_inplace", s))
            step(m, "apply_rope_pos_ids() first", _fi.rope_call(fi, "apply_rope_pos_ids", s))
            step(m, "apply_rope_pos_ids() second", _fi.rope_call(fi, "apply_rope_pos_ids", s))
    out = {"jit_dir": str(jit_dir), "workspace": str(jit_env.FLASHINFER_WORKSPACE_DIR), "steps": steps,
           "modules": _fi_jit.jit_modules(jit_dir), "cpus": os.cpu_count(), "max_jobs": os.environ.get("MAX_JOBS")}
    Path(args.report).write_text(json.dumps(out))
    return 0


def run_child(modules, report: Path, env: dict, timeout: float, log) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "run", "--modules", ",".join(modules),
           "--report", str(report)]
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the timed child process did not finish within {timeout:.0f} s") from None
    if p.returncode != 0 or not report.is_file():
        tail = " | ".join((p.stdout + p.stderr).strip().splitlines()[-4:])
        raise RuntimeError(f"the timed child process failed (rc={p.returncode}): {tail[:400]}")
    res = json.loads(report.read_text())
    res["wall_s"] = time.perf_counter() - t
    for s in res["steps"]:
        log(f"  {s['module']:<12} {s['step']:<46} {s['seconds']:8.3f} s"
            + (f"  compiled {_fi_jit.short_module(s['compiled'])}" if s.get("compiled") else "")
            + (f"  [ERROR] {s['error']}" if s.get("error") else ""))
    return res


def flashinfer_cli(argv: list[str], env: dict, timeout: float) -> dict:
    """`python -m flashinfer ...` with a timeout; downloads are pointed at a closed local port so they fail at once."""
    env = {**os.environ, **env, "FLASHINFER_CUBINS_REPOSITORY": "http://127.0.0.1:9/"}
    t = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-m", "flashinfer", *argv], env=env, capture_output=True, text=True,
                           timeout=timeout)
        text, rc = _ANSI.sub("", p.stdout + p.stderr), p.returncode
    except subprocess.TimeoutExpired as e:  # captured output comes back as bytes here
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        text, rc = _ANSI.sub("", out), "timeout"
    total = re.search(r"Total modules:\s*(\d+)", text)
    comp = re.search(r"Compiled:\s*(\d+)", text)
    return {"command": "python -m flashinfer " + " ".join(argv), "rc": rc, "seconds": time.perf_counter() - t,
            "total_modules": int(total.group(1)) if total else None,
            "compiled": int(comp.group(1)) if comp else None, "text": text}


def passes(run, x):
    """cold (empty temporary cache), warm (the same cache again), your cache (load only), FlashInfer's CLI."""
    real = {m["module"]: m for m in _fi_jit.jit_modules(x.real_dir)}
    tmp = Path(tempfile.mkdtemp(prefix="fi-jit-cold-"))
    env_cold = {"FLASHINFER_WORKSPACE_BASE": str(tmp)}
    try:
        run.log(f"cold: {', '.join(x.cold_mods)} in an empty cache under {tmp} (nvcc runs now)")
        x.cold = run_child(x.cold_mods, tmp / "cold.json", env_cold, 900 if x.args.quick else 1800, run.log)
        run.log("warm: the same steps again on that cache")
        x.warm = run_child(x.cold_mods, tmp / "warm.json", env_cold, 300, run.log)
        # your cache: every group whose module is already there (never compile in --quick)
        probe = [m for m in MODULES if not x.args.quick or real.get(expected_uri(x.torch, m), {}).get("compiled")]
        if len(probe) < len(MODULES):
            run.log(f"your cache lacks {', '.join(m for m in MODULES if m not in probe)}: not timed there "
                    "(run 01_test_kernels.py first)")
        x.mine = run_child(probe, tmp / "mine.json", {}, 600, run.log) if probe else {"steps": [], "modules": []}
        x.n_real = len(real)
        run.log(f"FlashInfer CLI (timeout {x.args.cli_timeout:.0f} s each, downloads disabled)")
        x.cli = [{"cache": "temporary (cold pass)", **flashinfer_cli(["module-status", "--filter", "compiled"],
                                                                   env_cold, x.args.cli_timeout)}]
        if not x.args.quick:  # registers FlashInfer's default module list: renders sources into generated/
            x.cli.append({"cache": "yours", **flashinfer_cli(["module-status", "--filter", "compiled"], {},
                                                             x.args.cli_timeout)})
        for c in x.cli:
            run.log(f"  {c['command']} ({c['cache']} cache): rc={c['rc']} {c['seconds']:.1f} s, "
                    f"total {c['total_modules']}, compiled {c['compiled']}")
        run.path("cli_module_status.txt").write_text("\n\n".join(f"$ {c['command']}\n{c['text']}" for c in x.cli))
    finally:
        if x.args.keep_cache:
            run.note(f"cold cache kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def tables(run, x):
    """steps.csv (every step of every pass), modules.csv (per module: cold, warm, your cache, nvcc), cli.csv."""
    import pandas as pd
    sdf = pd.DataFrame([{"pass": name, **s} for name, res in (("cold", x.cold), ("warm", x.warm), ("your cache", x.mine))
                        for s in res["steps"]])
    run.table("steps", sdf)
    mods = []
    for uri, m in {m["module"]: m for m in x.cold["modules"]}.items():
        cs = sdf[(sdf["pass"] == "cold") & sdf["compiled"].fillna("").str.split().map(lambda l, u=uri: u in l)]
        grp, stp = (cs.iloc[0]["module"], cs.iloc[0]["step"]) if len(cs) else ("?", "?")
        w = sdf[(sdf["pass"] == "warm") & (sdf["module"] == grp) & (sdf["step"] == stp)]
        y = sdf[(sdf["pass"] == "your cache") & (sdf["module"] == grp) & (sdf["step"] == stp)]
        mods.append({"module": uri, "short": _fi_jit.short_module(uri), "compiled_by": f"{grp}: {stp}",
                     "cold_s": float(cs["seconds"].sum()) if len(cs) else None,
                     "warm_s": float(w["seconds"].iloc[0]) if len(w) else None,
                     "your_cache_s": float(y["seconds"].iloc[0]) if len(y) else None,
                     **{k: m.get(k) for k in ("objects", "so_mb", "nvcc_sum_s", "nvcc_max_s", "build_span_s")}})
    mdf = pd.DataFrame(mods)
    run.table("modules", mdf)
    run.table("cli", pd.DataFrame([{k: v for k, v in c.items() if k != "text"} for c in x.cli]))
    pdf = pd.DataFrame([{"pass": name, "wall_s": res.get("wall_s"), "cpus": res.get("cpus"),
                         "max_jobs": res.get("max_jobs"), "jit_dir": res.get("jit_dir"), "module_folders": None}
                        for name, res in (("cold", x.cold), ("warm", x.warm))] +
                       [{"pass": "your cache", "wall_s": x.mine.get("wall_s"), "cpus": x.mine.get("cpus"),
                         "max_jobs": x.mine.get("max_jobs"), "jit_dir": str(x.real_dir), "module_folders": x.n_real}],
                       columns=PASS_COLUMNS)
    run.table("passes", pdf)
    return sdf, mdf, mods, pdf


def judge(run, x):
    """The H-02 facts: what a cold and a warm cache cost, which step compiles what, the CLI's view."""
    sdf, mdf = x.sdf, x.mdf
    if len(mdf):
        ok = mdf.dropna(subset=["cold_s", "warm_s"])
        run.headline(**{f"cold_{r.short.split()[0]}_s": r.cold_s for r in ok.itertuples()},
                     warm_load_max_s=float(ok["warm_s"].max()) if len(ok) else None)
        run.fact(H["cold_warm"], bool(len(ok) and (ok["cold_s"] >= 1).all() and (ok["warm_s"] < 0.5).all()),
                 "; ".join(f"{r.short}: cold {r.cold_s:.1f} s, warm {r.warm_s * 1e3:.0f} ms" for r in ok.itertuples()),
                 "modules.csv")
    cold_steps = sdf[sdf["pass"] == "cold"]
    att = cold_steps[cold_steps["module"].isin(["decode", "prefill_fa2", "prefill_fa3"])]
    if len(att):
        where = sorted(set(att[att["compiled"].fillna("") != ""]["step"]))
        run.fact(H["plan"], where == ["plan()"], f"compiling steps of the attention wrappers: {', '.join(where) or 'none'}",
                 "steps.csv")
    if "norm" in x.cold_mods:
        n = cold_steps[cold_steps["module"] == "norm"].set_index("step")["compiled"].fillna("")
        run.fact(H["norm"], n.get("rmsnorm() first") == "norm" and not n.get("fused_add_rmsnorm() first"),
                 f"rmsnorm first: {n.get('rmsnorm() first') or 'nothing'}; fused_add_rmsnorm first: "
                 f"{n.get('fused_add_rmsnorm() first') or 'nothing'}", "steps.csv")
    if "tc_decode" in x.cold_mods and "prefill_fa2" in x.cold_mods:
        tcp = cold_steps[(cold_steps["module"] == "tc_decode") & (cold_steps["step"] == "plan()")]
        first = x.cold_mods.index("prefill_fa2") < x.cold_mods.index("tc_decode")
        run.fact(H["tc_reuse"], bool(len(tcp)) and not tcp.iloc[0]["compiled"] if len(tcp) else None,
                 f"tc decode plan() after the fa2 prefill: compiled {tcp.iloc[0]['compiled'] or 'nothing'}"
                 if len(tcp) else "not run", "steps.csv",
                 premise=True if first else "tc_decode ran before prefill_fa2 (--modules order)")
    if len(mdf) >= 3:
        slow = mdf.sort_values("cold_s").iloc[-1]
        run.fact(H["slowest"], str(slow["module"]).startswith("batch_prefill"),
                 f"slowest: {slow['short']} {slow['cold_s']:.1f} s, {slow['objects']} objects", "modules.csv")
    c0 = x.cli[0]
    listed = [u for u in mdf["module"] if u in c0["text"]] if len(mdf) else []
    run.fact(H["cli"], len(listed) == len(mdf), f"{len(listed)}/{len(mdf)} listed; CLI total {c0['total_modules']}, "
             f"compiled {c0['compiled']}, {c0['seconds']:.0f} s", "cli.csv",
             premise=True if c0["rc"] == 0 and len(mdf) else f"the CLI ended rc={c0['rc']} after {c0['seconds']:.0f} s")


def tell(x) -> str:
    def lines(name):
        steps = [{**s, **{k: s.get(k) if isinstance(s.get(k), str) else "" for k in ("compiled", "error")}}
                 for s in x.sdf[x.sdf["pass"] == name].to_dict("records")]       # an empty cell is NaN
        return [(f"{s['step']} [{s['module']}]: {s['seconds'] * 1e3:.0f} ms" if s["seconds"] < 1 else
                 f"{s['step']} [{s['module']}]: {s['seconds']:.1f} s",
                 [(f"compiled {_fi_jit.short_module(m)}", []) for m in (s.get("compiled") or "").split()] +
                 ([(f"ERROR {s['error']}", [])] if s.get("error") else [])) for s in steps]
    ps = {r["pass"]: {k: _plain(v) for k, v in r.items()} for r in x.passes.to_dict("records")}
    cold, warm, mine = ps["cold"], ps["warm"], ps["your cache"]
    mine_steps = lines("your cache")
    items = [(f"cold pass (empty cache, {cold['cpus']} CPUs, MAX_JOBS={'unset' if cold['max_jobs'] is None else cold['max_jobs']}): "
              f"{cold['wall_s']:.1f} s wall", lines("cold")),
             (f"warm pass (same cache): {warm['wall_s']:.1f} s wall", lines("warm")),
             (f"your cache ({mine['jit_dir']}): {mine['module_folders']} module folder(s)",
              mine_steps or [("not timed", [])])]
    items += [(f"module {r['short']}: {r['objects']} objects, {r['so_mb']} MB, nvcc sum {r['nvcc_sum_s']} s, "
               f"longest object {r['nvcc_max_s']} s", []) for r in x.mods]
    items += [(f"{c['command']} on the {c['cache']} cache: rc {c['rc']}, {c['seconds']:.0f} s, compiled "
               f"{c['compiled']} of {c['total_modules']} registered", []) for c in x.cli]
    return story.tree(f"FLASHINFER JIT — {x.gpu_name}, cold = empty FLASHINFER_WORKSPACE_BASE", items)


def _plain(v):
    """A passes.csv cell as the GPU phase had it: NaN (an empty cell) is None, a whole float an int."""
    if isinstance(v, float):
        return None if v != v else int(v) if v.is_integer() else v
    return v.item() if hasattr(v, "item") else v


PASS_COLUMNS = ("pass", "wall_s", "cpus", "max_jobs", "jit_dir", "module_folders")


@dataclass
class Record:
    """What the analysis of one run reads: the steps, modules and CLI tables (with the CLI's text, kept in
    cli_module_status.txt), the passes (passes.csv), the modules cold-compiled and the GPU's name; torch, cold,
    warm, mine, real_dir and n_real are the GPU phase's own."""
    args: argparse.Namespace
    cold_mods: list
    gpu_name: str = "?"
    sdf: Any = None               # steps.csv
    mdf: Any = None               # modules.csv
    mods: list = field(default_factory=list)
    cli: list = field(default_factory=list)     # cli.csv rows, each with the text it printed
    passes: Any = None            # passes.csv
    torch: Any = None
    real_dir: Any = None
    n_real: int | None = None
    cold: dict = None
    warm: dict = None
    mine: dict = None


def analyse(run, x: Record) -> None:
    """Headline, verdicts and story from the tables (a GPU run and --reanalyse alike)."""
    # ---- verdicts
    judge(run, x)
    # ---- the story
    run.story(tell(x), echo=True)


def cli_texts(text: str, commands: list) -> list:
    """The output of each CLI call from cli_module_status.txt ('$ <command>' then its output, the calls joined by a
    blank line), in the order of ``commands`` (cli.csv)."""
    starts, at = [], 0
    for c in commands:
        head = f"$ {c}\n"
        i = text.find(head, at) if not starts else text.find("\n\n" + head, at)
        if i < 0:
            return [None] * len(commands)
        i += 0 if not starts else 2
        starts.append((i, i + len(head)))
        at = i + len(head)
    ends = [s for s, _ in starts[1:]] + [len(text) + 2]
    return [text[b:e - 2] for (_, b), e in zip(starts, ends)]


def passes_from_story(story_text: str) -> Any:
    """passes.csv for a recording made before it existed (a5d3c27): the wall times, CPUs, MAX_JOBS and your cache's
    folder as its story.txt (in summary.json) printed them."""
    import pandas as pd
    flat = re.sub(r"\n[│ ]*  ", " ", story_text)                   # story.fold's continuation lines joined back
    c = re.search(r"cold pass \(empty cache, (\S+) CPUs, MAX_JOBS=(\S+)\): ([\d.]+) s wall", flat)
    w = re.search(r"warm pass \(same cache\): ([\d.]+) s wall", flat)
    y = re.search(r"your cache \((.*?)\): (\S+) module folder\(s\)", flat)
    if not (c and w and y):
        raise SetupError("--reanalyse: no passes.csv, and the recording's story does not state the passes' wall times "
                         "(re-run 07_jit_analysis.py on a GPU)")
    rows = [{"pass": "cold", "wall_s": float(c.group(3)), "cpus": int(c.group(1)) if c.group(1).isdigit() else None,
             "max_jobs": None if c.group(2) in ("None", "unset") else c.group(2)},
            {"pass": "warm", "wall_s": float(w.group(1))},
            {"pass": "your cache", "jit_dir": y.group(1), "module_folders": int(y.group(2))}]
    return pd.DataFrame(rows, columns=PASS_COLUMNS)


def main_reanalyse(args) -> int:
    rec = recording.open(args.reanalyse, __file__, tables=("steps", "modules", "cli"), optional=("passes",),
                         copy=("cli_module_status.txt",))
    a = rec.args_like(args)
    cli_rows = rec.tables["cli"].to_dict("records")
    raw = rec.files.get("cli_module_status.txt")
    texts = cli_texts(raw.decode(errors="replace"), [c["command"] for c in cli_rows]) if raw else [None] * len(cli_rows)
    if any(t is None for t in texts):
        raise SetupError(f"--reanalyse {rec.src}: no readable cli_module_status.txt (the CLI's output the jit-cli "
                         "verdict reads)")
    mdf = rec.tables["modules"]
    passes, how = rec.tables["passes"], None
    if passes is None:
        passes = passes_from_story(rec.summary.get("story") or "")
        how = "recorded before passes.csv: the passes' wall times, CPUs, MAX_JOBS and your cache's folder read from its story"
    x = Record(args=a, cold_mods=a.modules or (["decode"] if a.quick else list(MODULES)),
               gpu_name=(rec.summary.get("provenance") or {}).get("gpu") or "?", sdf=rec.tables["steps"], mdf=mdf,
               mods=mdf.to_dict("records"), cli=[{**c, "text": t} for c, t in zip(cli_rows, texts)], passes=passes)
    with recording.run(__file__, args, rec) as run:
        if how:
            run.note(f"re-analysis: {how}")
        analyse(run, x)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return child(args)
    if args.reanalyse:
        return main_reanalyse(args)
    torch, _ = _fi.require_stack()
    from flashinfer.jit import env as jit_env
    args.cli_timeout = args.cli_timeout or (60 if args.quick else 180)
    x = Record(torch=torch, args=args, real_dir=jit_env.FLASHINFER_JIT_DIR, gpu_name=torch.cuda.get_device_name(),
               cold_mods=args.modules or (["decode"] if args.quick else list(MODULES)))
    with Run(__file__, args, out=args.out) as run:
        # ---- check: where the cache lives
        run.log(f"your JIT cache: {jit_env.FLASHINFER_CACHE_DIR} -> modules in {x.real_dir}")
        # ---- measure: three passes in fresh processes, then FlashInfer's own CLI
        passes(run, x)
        # ---- the tables
        x.sdf, x.mdf, x.mods, x.passes = tables(run, x)
        # ---- analyse: verdicts, the story
        analyse(run, x)
    return 0


def expected_uri(torch, group: str) -> str:
    """The JIT module a step group loads (bf16, head_dim 128, no RoPE/SWA/soft-cap), as FlashInfer names it."""
    from flashinfer.jit import get_batch_decode_uri, get_batch_prefill_uri
    bf, i32 = torch.bfloat16, torch.int32
    if group == "decode":
        return get_batch_decode_uri(bf, bf, bf, i32, 128, 128, 0, False, False)
    if group in ("prefill_fa2", "prefill_fa3", "tc_decode"):
        be = "fa3" if group == "prefill_fa3" else "fa2"
        return get_batch_prefill_uri(be, bf, bf, bf, i32, 128, 128, 0, False, False, False)
    return group  # "norm", "rope"


if __name__ == "__main__":
    run_main(main)
