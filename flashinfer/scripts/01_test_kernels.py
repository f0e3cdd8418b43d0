#!/usr/bin/env python3
"""01 · Correctness of the studied FlashInfer kernels, and which variant, JIT module and kernel each call ran.

What it measures
    Every API this track profiles, on small uneven shapes, against a plain float32 torch reference:
    paged batch decode (CUDA cores, GQA 4 and 8; tensor cores), paged causal prefill (fa2, fa3 on
    sm90, and backend="auto"), rmsnorm, fused_add_rmsnorm and the RoPE APIs (indptr/offsets,
    pos_ids, Llama-3.1, cos/sin cache incl. the in-place form used by SGLang). Pages are scattered
    (the page-table indirection is exercised) and requests have different lengths (last pages
    partly filled). For each call it records the module FlashInfer built or loaded (the JIT uri,
    whether its .so is in the cache) and the kernels it launched (from a torch-profiler trace),
    and one shape FlashInfer must reject (GQA group 5 on the CUDA-core decode path) to show how a
    rejected shape reads. No timing here: 02-05 time what this script shows to be correct.

What the plan expected (hypotheses)
    * a correctness baseline and the kernel variant each call selects;
    * from the source (analysis.md H-01, H-11, H-14): each API ends in the kernel the source
      reading names; backend="auto" is FA3 on sm90; without nvidia-cutlass-dsl RMSNorm runs the
      CUDA JIT `norm` module.

Run
    python flashinfer/scripts/01_test_kernels.py --quick     # ~20 s (warm JIT): skips the 70B-layout decode
    python flashinfer/scripts/01_test_kernels.py             # all checks
    python flashinfer/scripts/01_test_kernels.py --reanalyse DIR --out OUT   # no GPU: the analysis again from DIR
    (a cold JIT cache compiles decode, prefill fa2/fa3, norm and rope here: 1-3 min once)
Writes flashinfer/results/01_test_kernels/: checks.csv, modules.csv, probes.csv (what the verdicts read besides the
checks: the norm path, the rejected shape, the GPU), trace.json, story.txt, summary.json.
Exit code 1 when any kernel disagrees with its reference (the table is kept in a failed-* folder).
"""
from __future__ import annotations

import argparse
import importlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _fi  # noqa: E402
import _fi_jit  # noqa: E402
from common.base import story  # noqa: E402
from common.base.checks import run_main  # noqa: E402
from common.tables import trace  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.run import cli, recording  # noqa: E402
from common.run.results import Run  # noqa: E402

PAGE = 16
TOL = {"attention": 2e-2, "norm": 1e-2, "rope": 1e-2}     # relative L2 error against float32 torch

H = declare("""
    correct = correctness: every studied FlashInfer API matches a plain torch reference
        judged on: relative L2 error of each check against its tolerance (fixed seeds: deterministic)
        source: PLAN.md session 3, 01: 'a correctness baseline'
    kernels = api-kernels: each API ends in the kernel the source reading names
        judged on: the kernels of each check's traced call (common.tables.trace join)
        source: analysis.md H-01
    auto = auto-is-fa3: backend="auto" runs FA3 on sm90
        judged on: the backend the auto wrapper's plan() chose
        source: analysis.md H-11
    norm_path = norm-path: without nvidia-cutlass-dsl RMSNorm runs the CUDA JIT `norm` module; with it, CuTe-DSL
        judged on: flashinfer.norm._USE_CUDA_NORM against importing cutlass.cute
        source: analysis.md H-14
    reject = rejected-shape: a shape FlashInfer does not support is rejected with a clear error, not a wrong result
        judged on: decode CUDA cores with GQA group 5 (40 q / 8 kv heads)
        source: analysis.md (reading the source)
""")


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="leave out the 70B-layout decode check (~20 s)")
    recording.add_flag(p)
    return p.parse_args(argv)


def attention_checks(torch, fi, ws, quick, on_error):
    """(name, kind, expected kernel regex, module uri, callable, error function, extra) for the attention
    APIs; a variant whose plan() fails (e.g. a failed JIT compile) goes to ``on_error`` and is left out."""
    from flashinfer.jit import get_batch_decode_uri, get_batch_prefill_uri
    from flashinfer.utils import is_sm90a_supported
    bf, i32 = torch.bfloat16, torch.int32
    out = []
    kv_lens, qo_lens = [1, 100, 1037], [1, 77, 300]
    for preset in (["llama-3.1-8b"] if quick else ["llama-3.1-8b", "llama-3.1-70b"]):
        lay = _fi.head_layout(preset)
        cache, ip, ix, last = _fi.make_paged_kv(torch, kv_lens, lay["hkv"], lay["d"], PAGE, shuffle=True)
        q = torch.randn(len(kv_lens), lay["hq"], lay["d"], device="cuda", dtype=bf)
        refs = [_fi.ref_attention(torch, q[b:b + 1], *_fi.gather_kv(cache, ip, ix, last, b), causal=False)
                for b in range(len(kv_lens))]
        for tc in ((False, True) if preset == "llama-3.1-8b" else (False,)):
            name = f"decode {'tensor cores' if tc else 'CUDA cores'} GQA {lay['group']} ({preset})"
            w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc)
            try:
                w.plan(ip, ix, last, lay["hq"], lay["hkv"], lay["d"], PAGE, q_data_type=bf, kv_data_type=bf)
            except Exception as e:
                on_error(name, e)
                continue
            fn = (lambda w=w, q=q, c=cache: w.run(q, c))
            err = (lambda fn=fn, q=q, refs=refs: max(_fi.rel_err(fn()[b:b + 1], r) for b, r in enumerate(refs)))
            uri = (get_batch_prefill_uri("fa2", bf, bf, bf, i32, 128, 128, 0, False, False, False) if tc else
                   get_batch_decode_uri(bf, bf, bf, i32, 128, 128, 0, False, False))
            out.append((name, "attention", "BatchPrefillWithPagedKVCacheKernel" if tc else "BatchDecodeWithPagedKVCacheKernel",
                        uri, fn, err, {"plan": _fi.plan_facts(w), "keep": (w, cache, q)}))
    lay = _fi.head_layout("llama-3.1-8b")
    cache, ip, ix, last = _fi.make_paged_kv(torch, [5, 200, 300], lay["hkv"], lay["d"], PAGE, shuffle=True)
    qo_ip = torch.tensor([0, 1, 78, 378], device="cuda", dtype=i32)
    q = torch.randn(sum(qo_lens), lay["hq"], lay["d"], device="cuda", dtype=bf)
    refs = [_fi.ref_attention(torch, q[int(qo_ip[b]):int(qo_ip[b + 1])], *_fi.gather_kv(cache, ip, ix, last, b), causal=True)
            for b in range(3)]
    backends = ["fa2"] + (["fa3"] if is_sm90a_supported(torch.device("cuda")) else []) + ["auto"]
    for be in backends:
        w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=be)
        try:
            w.plan(qo_ip, ip, ix, last, lay["hq"], lay["hkv"], lay["d"], PAGE, causal=True, q_data_type=bf,
                   kv_data_type=bf)
        except Exception as e:
            on_error(f"prefill causal backend={be}", e)
            continue
        ran = w._backend
        fn = (lambda w=w, q=q, c=cache: w.run(q, c))
        err = (lambda fn=fn, refs=refs: (lambda o: max(_fi.rel_err(o[int(qo_ip[b]):int(qo_ip[b + 1])], r)
                                                       for b, r in enumerate(refs)))(fn()))
        uri = get_batch_prefill_uri(ran, bf, bf, bf, i32, 128, 128, 0, False, False, False)
        expect = "PrefillWithKVCacheKernel" if ran == "fa3" else "BatchPrefillWithPagedKVCacheKernel"
        out.append((f"prefill causal backend={be} (ran {ran})", "attention", expect, uri, fn, err,
                    {"plan": _fi.plan_facts(w), "keep": (w, cache, q)}))
    return out


def norm_checks(torch, fi):
    import flashinfer.norm as fnorm
    cuda_path = bool(getattr(fnorm, "_USE_CUDA_NORM", True))
    x = torch.randn(333, 4096, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    eps = 1e-5

    def ref(t):
        tf = t.float()
        return tf * torch.rsqrt(tf.pow(2).mean(-1, keepdim=True) + eps) * w.float()

    def fused_err():
        x2, r2 = x.clone(), r.clone()
        fi.fused_add_rmsnorm(x2, r2, w, eps=eps)
        resid = x.float() + r.float()
        return max(_fi.rel_err(r2, resid), _fi.rel_err(x2, ref(resid.to(torch.bfloat16))))
    mod = "norm" if cuda_path else "(CuTe-DSL, compiled in-process: no JIT module)"
    return [("rmsnorm [333 x 4096]", "norm", "RMSNormKernel", mod, lambda: fi.rmsnorm(x, w, eps=eps),
             lambda: _fi.rel_err(fi.rmsnorm(x, w, eps=eps), ref(x)), {"keep": (x, w)}),
            ("fused_add_rmsnorm [333 x 4096]", "norm", "FusedAddRMSNormKernel", mod,
             lambda: fi.fused_add_rmsnorm(x.clone(), r.clone(), w, eps=eps), fused_err, {"keep": (x, r, w)})], cuda_path


def rope_checks(torch, fi):
    lay = _fi.head_layout("llama-3.1-8b")
    s = _fi.rope_setup(torch, 300, lay, req_tokens=100, offsets=[0, 7, 1000])
    return [(f"{name} [300 tokens, 3 requests]", "rope", rx, "rope", _fi.rope_call(fi, name, s),
             (lambda name=name: _fi.rope_check(torch, fi, name, s)), {"keep": s})
            for name, (_pos, _l31, rx) in _fi.ROPE_APIS.items()]


def rejected_shape(torch, fi, ws):
    """GQA group 5 (40 q / 8 kv heads) is not compiled into the CUDA-core decode kernel: expect a clear error."""
    cache, ip, ix, last = _fi.make_paged_kv(torch, [64, 64], 8, 128, PAGE)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    try:
        w.plan(ip, ix, last, 40, 8, 128, PAGE, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
        w.run(torch.randn(2, 40, 128, device="cuda", dtype=torch.bfloat16), cache)
        torch.cuda.synchronize()
    except Exception as e:
        return True, f"{e.__class__.__name__}: {str(e).strip().splitlines()[0][:160]}"
    return False, "accepted (no error raised)"


def build_checks(run, x) -> list:
    """Every check (attention, norm, rope); a group whose set-up fails (e.g. a JIT compile) is recorded and left out."""
    checks = []

    def on_error(name, e):
        run.point_error({"check": name}, e)
        x.failures.append(name)
    for group, build in (("attention", lambda: attention_checks(x.torch, x.fi, x.ws, x.args.quick, on_error)),
                         ("norm", lambda: norm_checks(x.torch, x.fi)[0]), ("rope", lambda: rope_checks(x.torch, x.fi))):
        try:
            checks += build()
        except Exception as e:  # noqa: BLE001 - the other groups still run
            on_error(group, e)
    return checks


def run_checks(run, x) -> list[dict]:
    """Each check's relative error against its tolerance, and the JIT module it loaded (compiled or not)."""
    rows = []
    for name, kind, expect, uri, _fn, err, extra in x.checks:
        try:
            e = err()
        except Exception as ex:  # noqa: BLE001
            run.point_error({"check": name}, ex)
            e = float("nan")
        ok = e < TOL[kind]   # NaN compares False
        if not ok:
            x.failures.append(name)
        so = x.jit_env.FLASHINFER_JIT_DIR / uri / f"{uri}.so"
        rows.append({"check": name, "kind": kind, "rel_err": e, "tolerance": TOL[kind], "ok": ok, "module": uri,
                     "module_compiled": so.is_file(), "expected_kernel": expect,
                     **{f"plan_{k}": v for k, v in (extra.get("plan") or {}).items()}})
        run.log(f"{'✅' if ok else '❌'} {name}: rel.err {e:.1e} (tol {TOL[kind]:.0e}); module {_fi_jit.short_module(uri)}")
    return rows


def trace_kernels(run, x):
    """One traced call per check (common.tables.trace.capture_calls); the kernels it launched (common.tables.trace join)."""
    import pandas as pd
    ev = trace.read_chrome_trace(trace.capture_calls(
        x.torch, [(f"check {r['check']}", c[4]) for r, c in zip(x.rows, x.checks)], run.path("trace.json"), reps=1))
    cs = _fi.calls_summary(trace.kernels_in_ranges(ev, r"^check "))
    seen = dict(zip(cs["label"].str.replace("check ", "", regex=False), cs["kernels"]))
    for r in x.rows:
        r["kernels"] = seen.get(r["check"], "")
        r["kernel_as_predicted"] = bool(re.search(r["expected_kernel"], r["kernels"]))
    df = pd.DataFrame(x.rows)
    run.table("checks", df)
    return df


def judge(run, x):
    df = x.df
    bad = df[~df["ok"].astype(bool)]
    run.fact(H["correct"], bool(df["ok"].all()) and not x.failures,
             f"{int(df['ok'].sum())}/{len(df)} checks within tolerance (attention 2e-2, norm/RoPE 1e-2 relative L2 "
             "error)" + (f"; failed: {', '.join(dict.fromkeys(list(bad['check']) + x.failures))}" if x.failures else ""),
             "checks.csv")
    off = df[~df["kernel_as_predicted"]]
    run.fact(H["kernels"], off.empty, f"{len(df) - len(off)}/{len(df)} as predicted" + ("; not: " + "; ".join(
        f"{r.check} ran {r.kernels or 'nothing'}" for r in off.itertuples()) if len(off) else ""), "checks.csv")
    auto = df[df["check"].str.contains("backend=auto")]
    major = x.major
    ran = str(auto.iloc[0]["check"]).split("ran ")[-1].rstrip(")") if len(auto) else None
    run.fact(H["auto"], ran == "fa3" if ran else None, f"auto ran {ran} on sm{major}x", "checks.csv",
             premise=True if major == 9 else f"sm{major}x is not sm90")
    cute = x.cute
    run.fact(H["norm_path"], x.cuda_norm != cute, f"nvidia-cutlass-dsl importable: {cute}; "
             f"flashinfer.norm._USE_CUDA_NORM = {x.cuda_norm}", "checks.csv")
    run.fact(H["reject"], x.rejected, f"decode CUDA cores, GQA group 5: {x.reject_msg}", "log.txt")


def tell(x) -> str:
    df, items = x.df, []
    for kind in ("attention", "norm", "rope"):
        d = df[df["kind"] == kind]
        items.append((f"{kind}: {int(d['ok'].sum())}/{len(d)} correct", [
            (f"{'✅' if r.ok else '❌'} {r.check}: err {r.rel_err:.1e} -> module {_fi_jit.short_module(r.module)}"
             f"{'' if r.module_compiled else ' (not in cache)'} -> {r.kernels or '?'}", []) for r in d.itertuples()]))
    items.append((f"{'✅' if x.rejected else '❌'} rejected shape (GQA group 5, CUDA cores): {x.reject_msg}", []))
    items.append((f"JIT modules registered in this process: {len(x.mods)} "
                  f"({', '.join(sorted({_fi_jit.short_module(m['module']) for m in x.mods}))})", []))
    return story.tree(f"FLASHINFER KERNELS vs TORCH — {x.gpu_name}, flashinfer {x.fi_version}", items)


def cute_importable() -> bool:
    """What flashinfer.norm itself tries (nvidia-cutlass-dsl): a probe of this machine, so measured, not analysed."""
    try:
        importlib.import_module("cutlass.cute")
        return True
    except Exception:  # noqa: BLE001
        return False


PROBE_COLUMNS = ("gpu_name", "flashinfer", "compute_major", "cuda_norm", "cutlass_dsl_importable", "rejected",
                 "reject_msg", "failures")
NORM_RX = re.compile(r"nvidia-cutlass-dsl importable: (True|False); flashinfer\.norm\._USE_CUDA_NORM = (True|False)")
REJECT_PREFIX = "decode CUDA cores, GQA group 5: "
ACCEPTED = "accepted (no error raised)"


@dataclass
class Record:
    """What the analysis of one run reads: the checks (checks.csv), the JIT modules (modules.csv) and the facts the
    GPU phase probed (probes.csv): the GPU, flashinfer's version, the norm path, the rejected shape, the failures.
    torch, fi, ws, jit_env, checks and rows are the GPU phase's own."""
    args: argparse.Namespace
    df: Any = None
    mods: list = field(default_factory=list)
    gpu_name: str = "?"
    fi_version: str = "?"
    major: int | None = None
    cuda_norm: bool | None = None
    cute: bool | None = None
    rejected: bool | None = None
    reject_msg: str = ""
    failures: list = field(default_factory=list)
    torch: Any = None
    fi: Any = None
    ws: Any = None
    jit_env: Any = None
    checks: list = field(default_factory=list)
    rows: list = field(default_factory=list)

    def probes(self) -> dict:
        return dict(zip(PROBE_COLUMNS, (self.gpu_name, self.fi_version, self.major, self.cuda_norm, self.cute,
                                        self.rejected, self.reject_msg, "; ".join(self.failures))))


def analyse(run, x: Record) -> None:
    """Headline, verdicts and story from the checks, modules and probes (a GPU run and --reanalyse alike)."""
    run.headline(checks=len(x.df), passed=int(x.df["ok"].sum()), modules_registered=len(x.mods))
    # ---- verdicts
    judge(run, x)
    # ---- the story
    run.story(tell(x), echo=True)


def probes_of(rec) -> tuple[dict, str | None]:
    """The probed facts of a recording: its probes.csv; for a recording made before probes.csv existed (a5d3c27),
    read back from what it holds: the GPU, flashinfer and compute capability from its provenance, the norm path and
    the rejected shape's error from the facts its observations state, the failures from checks.csv and its point
    errors. Returns (facts, a note saying where they came from, or None)."""
    t = rec.tables.get("probes")
    if t is not None and len(t):
        r = t.iloc[0].to_dict()
        r["failures"] = r["failures"] if isinstance(r["failures"], str) else ""
        return r, None
    prov, obs = rec.summary.get("provenance") or {}, {o.get("hypothesis"): o for o in rec.summary["observations"]}
    norm = NORM_RX.search((obs.get("norm-path") or {}).get("observed", ""))
    rej = (obs.get("rejected-shape") or {}).get("observed", "")
    msg = rej[len(REJECT_PREFIX):] if rej.startswith(REJECT_PREFIX) else None
    cc = str(prov.get("compute_capability") or "")
    df = rec.tables["checks"]
    failed = list(df.loc[~df["ok"].astype(bool), "check"]) + [e["check"] for e in rec.summary.get("point_errors", [])
                                                               if "check" in e]
    return {"gpu_name": prov.get("gpu") or "?", "flashinfer": (prov.get("packages") or {}).get("flashinfer-python", "?"),
            "compute_major": int(cc.split(".")[0]) if cc[:1].isdigit() else None,
            "cuda_norm": norm.group(2) == "True" if norm else None,
            "cutlass_dsl_importable": norm.group(1) == "True" if norm else None,
            "rejected": None if msg is None else msg != ACCEPTED, "reject_msg": msg or "?",
            "failures": "; ".join(dict.fromkeys(failed))}, \
        ("recorded before probes.csv: the norm path and the rejected shape's error read back from the facts the "
         "recording's observations state, the GPU from its provenance")


def main_reanalyse(args) -> int:
    rec = recording.open(args.reanalyse, __file__, tables=("checks", "modules"), optional=("probes",),
                         copy=("trace.json",))
    pr, how = probes_of(rec)
    x = Record(args=rec.args_like(args), df=rec.tables["checks"], mods=rec.tables["modules"].to_dict("records"),
               gpu_name=pr["gpu_name"], fi_version=pr["flashinfer"], major=pr["compute_major"],
               cuda_norm=pr["cuda_norm"], cute=pr["cutlass_dsl_importable"], rejected=pr["rejected"],
               reject_msg=pr["reject_msg"], failures=[f for f in pr["failures"].split("; ") if f])
    with recording.run(__file__, args, rec) as run:
        if how:
            run.note(f"re-analysis: {how}")
        analyse(run, x)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    torch, fi = _fi.require_stack()
    import pandas as pd
    import flashinfer.norm as fnorm
    from flashinfer.jit import env as jit_env, jit_spec_registry
    with Run(__file__, args, out=args.out) as run:
        # ---- check: build every check (JIT compiles happen here, recorded when they fail)
        run.log(f"flashinfer {fi.__version__} on {torch.cuda.get_device_name()}; JIT cache {jit_env.FLASHINFER_JIT_DIR}")
        x = Record(torch=torch, fi=fi, args=args, jit_env=jit_env, failures=[],
                   ws=torch.zeros(128 << 20, dtype=torch.uint8, device="cuda"),
                   cuda_norm=bool(getattr(fnorm, "_USE_CUDA_NORM", True)),
                   gpu_name=torch.cuda.get_device_name(), fi_version=fi.__version__,
                   major=torch.cuda.get_device_capability()[0])
        x.checks = build_checks(run, x)
        # ---- measure: correctness of each, a shape FlashInfer must reject, the kernels each call launched
        x.rows = run_checks(run, x)
        x.rejected, x.reject_msg = rejected_shape(torch, fi, x.ws)
        run.log(f"{'✅' if x.rejected else '❌'} decode CUDA cores, GQA group 5: "
                f"{'rejected: ' if x.rejected else ''}{x.reject_msg}")
        run.log("All results match." if not x.failures else f"MISMATCH in: {', '.join(x.failures)}")
        x.df = trace_kernels(run, x)
        x.mods = [{"module": s.name, "compiled": s.is_compiled, "sources": len(s.sources),
                   "library": str(s.library_path or "")} for s in jit_spec_registry.get_all_statuses()]
        run.table("modules", pd.DataFrame(x.mods, columns=["module", "compiled", "sources", "library"]))
        x.cute = cute_importable()
        run.table("probes", pd.DataFrame([x.probes()], columns=PROBE_COLUMNS))
        # ---- analyse: headline, verdicts, the story
        analyse(run, x)
        if x.failures:
            raise RuntimeError(f"{len(x.failures)} check(s) failed: {', '.join(x.failures)}")
    return 0


if __name__ == "__main__":
    run_main(main)
