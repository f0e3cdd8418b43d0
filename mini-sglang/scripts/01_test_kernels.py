#!/usr/bin/env python3
"""01 · mini-SGLang's own kernels against torch references, and which kernels each call launches.

What it measures
    Correctness, exact (these kernels copy bytes, so results must be bit-identical):
      index   indexing(weights, ids) vs F.embedding: bf16/fp16, int32/int64 ids, 1..1000 tokens;
              the vocab-range mask tensor parallelism uses (vocab_range=(start, length)) for TP 2/4
              shards, with the boundary ids start-1, start, start+length-1, start+length, and the
              identity the TP all-reduce relies on: the shards' masked outputs sum to the full lookup;
              (full run) a row that is not a multiple of 128 B must be rejected by the build.
      store   store_cache(k_cache, v_cache, slots, k, v) vs indexing the caches: KV rows of 2048 B
              (Llama-3.1-8B, TP1) down to 256 B (TP8), sequential and random slots, int32/int64,
              k/v as strided views of one QKV buffer (as the engine passes them); untouched slots stay.
      radix   fast_compare_key vs a Python first-mismatch: int32/int64, equal, prefix, empty; mixed
              dtypes and non-contiguous input must raise.
      pynccl  (two or more GPUs) all-reduce (sum; bf16, fp16) through the symmetric-buffer path and
              the direct path, and all-gather, across 2 spawned ranks, vs the arithmetic answer.
    Then each wrapper (and its plain-torch equivalent) 3 times under torch.profiler (common.tables.trace.capture_calls;
    kernels joined to their call by common.tables.trace.kernels_in_ranges): which kernels launch, in what order,
    with which grid and block (kernels per call, warps per token).

What the plan expected (hypotheses: H_* below, judged on every traced call)
    * Store: "K copy, V copy in a separate kernel launch, 2 sync points". The code (store.cu:41-49)
      copies both in one launch. The trace counts the launches.
    * Index: "1 warp per token", "fixed 256 threads". The code (index.py:41-47, index.cu:135-137)
      uses num_splits warps per token in 128-thread blocks. The trace's grid x block says which.
    * All custom kernels match torch references (success criterion; PyNCCL needs 2 GPUs: on one GPU that
      part is a failed premise and the verdict says so).

Run
    python mini-sglang/scripts/01_test_kernels.py --quick     # ~30 s: fewer shapes, no rejected-row build
    python mini-sglang/scripts/01_test_kernels.py             # every case; PyNCCL when >= 2 GPUs
    python mini-sglang/scripts/01_test_kernels.py --kernels index,store   # a subset
    python mini-sglang/scripts/01_test_kernels.py --reanalyse DIR --out OUT   # no GPU: verdicts again from DIR
    ./mini-sglang/scripts/ncu_profile.sh --kernel index --name checks -- \\
        python mini-sglang/scripts/01_test_kernels.py --quick --kernels index,store   # every checked launch under ncu
Writes mini-sglang/results/01_test_kernels/: checks.csv, launches.csv, trace.json, story.txt, summary.json.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _msgl  # noqa: E402
from _msgl import REPEATS  # noqa: E402
from common.base import story  # noqa: E402
from common.base.checks import run_main  # noqa: E402
from common.capture import procs  # noqa: E402
from common.tables import trace  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.run import cli, recording  # noqa: E402
from common.run.results import Run  # noqa: E402

HIDDEN, VOCAB = 4096, 128256          # Llama-3.1-8B embedding
QKV_Q = 32 * 128                      # query width in the fused QKV buffer (the engine's layout)
KERNELS = ("index", "store", "radix", "pynccl")
CALL_STORE, CALL_INDEX, CALL_MASK = "call: store_cache L=64 row=2048B", "call: indexing L=64 D=4096 bf16 int32", \
    "call: indexing TP2 rank1 vocab_range L=64"

PLAN = "PLAN.md session 2 / mini-sglang/reports/plan.md (01)"
H = declare(f"""
    store_launches = store-two-launches: store: K and V copied by two separate kernel launches (2 sync points)
        judged on: kernel launches per store_cache call (torch.profiler, {REPEATS} traced calls)
        confirmed: [2, 2]
        source: seed 002 / PLAN.md session 2: 'K copy ... V copy in a separate kernel launch, 2 kernel launches'
    warp = index-one-warp: index: 1 warp per token (64 warps for 64 tokens)
        judged on: warps per token of one indexing() call at 64 tokens (trace grid x block / 32 / 64), {REPEATS}
            traced calls
        confirmed: [1, 1]
        source: seed 002 / PLAN.md session 2: '64 warps (1 per token)'
    block = index-256-threads: index: fixed 256 threads per block
        judged on: threads per block of index_kernel (trace), {REPEATS} traced calls
        confirmed: [256, 256]
        source: seed 002: 'Fixed 256 threads'
    mask = index-masked-kernel: TP embedding uses a separate masked kernel that zero-fills foreign ids
        judged on: each traced vocab_range call launched a masked kernel, and every masked case matched
        source: {PLAN}: 'masked vs plain'
    match = kernels-match: index, store and radix match their torch references exactly
        judged on: every case of the families run here bit-identical
        source: {PLAN}: correctness first
    all = all-kernels-match: all custom kernels match torch references (success criterion)
        judged on: every case of index, store, radix and PyNCCL bit-identical
        source: mini-sglang/reports/plan.md success criteria: 'All four custom kernels ... pass correctness'
""")


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="fewer shapes, no rejected-row build (~30 s)")
    p.add_argument("--kernels", type=cli.choices_list(*KERNELS), default=list(KERNELS),
                   help="kernel families to check (default index,store,radix,pynccl; pynccl needs 2 GPUs)")
    recording.add_flag(p)
    return p.parse_args(argv)


class Checks:
    def __init__(self, run):
        self.run, self.rows = run, []

    def add(self, kernel, case, ok, detail=""):
        self.rows.append({"kernel": kernel, "case": case, "ok": bool(ok), "detail": detail})
        if not ok:
            self.run.log(f"MISMATCH {kernel}: {case} {detail}")

    def of(self, *kernels) -> list[bool]:
        return [r["ok"] for r in self.rows if r["kernel"] in kernels]

    def summary(self, kernel):
        mine = self.of(kernel)
        return f"{sum(mine)}/{len(mine)} cases"


def check_index(torch, K, chk, quick):
    F = torch.nn.functional
    vocab = 32768 if quick else VOCAB
    for dtype in (torch.bfloat16,) if quick else (torch.bfloat16, torch.float16):
        w = torch.randn(vocab, HIDDEN, device="cuda", dtype=dtype)
        for idt in (torch.int32, torch.int64):
            for n in (1, 64) if quick else (1, 7, 64, 1000):
                ids = torch.randint(0, vocab, (n,), device="cuda", dtype=idt)
                ids[0], ids[-1] = 0, vocab - 1
                out = K.indexing(w, ids)
                chk.add("index", f"{str(dtype)[6:]} {str(idt)[6:]} L={n}", torch.equal(out, F.embedding(ids.long(), w)))
        for tp in (2,) if quick else (2, 4):
            total = None
            ids = torch.randint(0, vocab, (256,), device="cuda", dtype=torch.int64)
            bounds = []
            for r in range(tp):
                s, n = _msgl.vocab_shard(vocab, tp, r)
                bounds += [s - 1, s, s + n - 1, s + n]
            bounds = torch.tensor([b for b in bounds if 0 <= b < vocab] + [0, vocab - 1], device="cuda")
            ids = torch.cat([bounds, ids])
            for r in range(tp):
                s, n = _msgl.vocab_shard(vocab, tp, r)
                local = w[s:s + n]
                out = K.indexing(local, ids, vocab_range=(s, n))
                inside = (ids >= s) & (ids < s + n)
                ref = F.embedding((ids - s).clamp(0, n - 1), local) * inside[:, None].to(dtype)
                chk.add("index (vocab mask)", f"{str(dtype)[6:]} TP{tp} rank{r} [{s},{s + n}) incl. boundary ids",
                        torch.equal(out, ref), f"{int(inside.sum())}/{len(ids)} ids in range")
                total = out.float() if total is None else total + out.float()
            chk.add("index (vocab mask)", f"{str(dtype)[6:]} TP{tp}: shards sum to the full lookup",
                    torch.equal(total.to(dtype), F.embedding(ids, w)))
    if not quick:   # 100 fp16 elements = 200 B: warp.cuh's static_assert must stop the build
        bad = torch.randn(16, 100, device="cuda", dtype=torch.float16)
        try:
            K.indexing(bad, torch.zeros(4, dtype=torch.int32, device="cuda"))
            chk.add("index", "200-B rows are rejected (row must be a multiple of 128 B)", False, "accepted")
        except Exception as e:
            chk.add("index", "200-B rows are rejected (row must be a multiple of 128 B)", True,
                    f"{e.__class__.__name__} at build time")


def check_store(torch, K, chk, quick):
    pool = 8192
    for row_elems in (1024, 128) if quick else (1024, 512, 256, 128):  # 2048 B (TP1) .. 256 B (TP8), bf16
        for pattern in ("sequential", "random"):
            for idt in (torch.int32,) if quick else (torch.int32, torch.int64):
                n = 333
                kv = torch.zeros(2, pool, row_elems, device="cuda", dtype=torch.bfloat16)
                qkv = torch.randn(n, QKV_Q + 2 * row_elems, device="cuda", dtype=torch.bfloat16)
                k, v = qkv[:, QKV_Q:QKV_Q + row_elems], qkv[:, QKV_Q + row_elems:]   # strided views
                loc = (torch.arange(100, 100 + n, device="cuda") if pattern == "sequential"
                       else torch.randperm(pool, device="cuda")[:n]).to(idt)
                K.store_cache(kv[0], kv[1], loc, k, v)
                mask = torch.ones(pool, dtype=torch.bool, device="cuda")
                mask[loc.long()] = False
                ok = (torch.equal(kv[0][loc.long()], k) and torch.equal(kv[1][loc.long()], v)
                      and not kv[:, mask].any())
                chk.add("store", f"{row_elems * 2} B rows, {pattern} slots, {str(idt)[6:]}, strided k/v", ok)


def check_radix(torch, K, chk):
    cases = []
    for dt in (torch.int32, torch.int64):
        a = torch.arange(5000, dtype=dt)
        for pos in (0, 1, 31, 4095, 4999):
            b = a.clone()
            b[pos] = -7
            cases.append((f"{str(dt)[6:]} len 5000, mismatch at {pos}", a, b))
        cases += [(f"{str(dt)[6:]} equal", a, a.clone()), (f"{str(dt)[6:]} prefix", a[:123], a),
                  (f"{str(dt)[6:]} empty", a[:0], a)]
    for name, x, y in cases:
        got = int(K.fast_compare_key(x, y))
        chk.add("radix", name, got == _msgl.first_mismatch(x.tolist(), y.tolist()), f"returned {got}")
    for name, x, y in (("mixed int32/int64", torch.arange(10, dtype=torch.int32), torch.arange(10)),
                       ("non-contiguous", torch.arange(20, dtype=torch.int32)[::2], torch.arange(10, dtype=torch.int32))):
        try:
            K.fast_compare_key(x, y)
            chk.add("radix", f"{name} must raise", False, "no error")
        except Exception as e:
            chk.add("radix", f"{name} must raise", True, e.__class__.__name__)


def nccl_worker(rank, world, port, buffers):
    """One rank: all-reduce and all-gather through PyNCCL, checked against the arithmetic answer."""
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=timedelta(seconds=120))
    from minisgl.kernel import init_pynccl
    rows = []
    for buf in buffers:
        comm = _msgl.keep(init_pynccl(tp_rank=rank, tp_size=world, tp_cpu_group=dist.group.WORLD, max_size_bytes=buf))
        path = "symmetric buffer (copy in/out)" if buf else "direct (no buffer)"
        for dtype in (torch.bfloat16, torch.float16):
            for n in (1024, 1 << 20):
                x = torch.full((n,), float(rank + 1), dtype=dtype, device="cuda")
                x[: n // 2] = 0
                comm.all_reduce(x, "sum")
                torch.cuda.synchronize()
                want = world * (world + 1) / 2
                ok = bool((x[: n // 2] == 0).all() and (x[n // 2:] == want).all())
                rows.append({"case": f"all_reduce sum {str(dtype)[6:]} {n * 2} B, {path}", "ok": ok})
        src = torch.full((512,), float(rank), dtype=torch.bfloat16, device="cuda")
        dst = torch.empty(512 * world, dtype=torch.bfloat16, device="cuda")
        comm.all_gather(dst, src)
        torch.cuda.synchronize()
        want = torch.arange(world, dtype=torch.bfloat16, device="cuda").repeat_interleave(512)
        rows.append({"case": f"all_gather bf16 x{world}, {path}", "ok": bool(torch.equal(dst, want))})
    dist.barrier()
    dist.destroy_process_group()
    return rows


def check_pynccl(run, chk, ngpu) -> str | bool:
    """PyNCCL on 2 ranks when two GPUs are visible; True, or why it did not run (the premise of H["all"])."""
    if ngpu < 2:
        run.note(f"pynccl: not run, {ngpu} GPU visible (needs two GPUs of one host)")
        return f"PyNCCL needs two GPUs of one host; {ngpu} visible here, so its cases were not run"
    run.log("pynccl: 2 ranks, symmetric-buffer and direct paths")
    procs.apply_nccl_env(run.log)
    try:
        res = _msgl.run_ranks(nccl_worker, 2, ((64 << 20, 0),), run.dir / "ranks", timeout_s=240, log=run.log)
        for rank, rows in enumerate(res):
            for r in rows:
                chk.add("pynccl", f"rank{rank} {r['case']}", r["ok"])
    except RuntimeError as e:
        chk.add("pynccl", "2-rank run", False, str(e)[:240])
    return True


def trace_calls(torch, K, run, kernels):
    """Each wrapper of ``kernels`` (index, store) and its plain-torch counterpart REPEATS times under torch.profiler
    (common.tables.trace.capture_calls); one row per launch (common.tables.trace.kernels_in_ranges), or None when none was asked for."""
    w = torch.randn(VOCAB, HIDDEN, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, VOCAB, (64,), device="cuda", dtype=torch.int32)
    s, n = _msgl.vocab_shard(VOCAB, 2, 1)
    local = w[s:s + n]
    kv = torch.zeros(2, 65536, 1024, device="cuda", dtype=torch.bfloat16)
    qkv = torch.randn(64, QKV_Q + 2048, device="cuda", dtype=torch.bfloat16)
    k, v = qkv[:, QKV_Q:QKV_Q + 1024], qkv[:, QKV_Q + 1024:]
    loc = torch.randperm(65536, device="cuda")[:64].to(torch.int32)
    loc64 = loc.long()   # torch indexing wants int64: converted outside the traced call
    kc, vc = kv[0], kv[1]
    calls = {"index": [(CALL_INDEX, lambda: K.indexing(w, ids)),
                       (CALL_MASK, lambda: K.indexing(local, ids, vocab_range=(s, n))),
                       ("call: torch F.embedding L=64", lambda: torch.nn.functional.embedding(ids, w))],
             "store": [(CALL_STORE, lambda: K.store_cache(kc, vc, loc, k, v)),
                       ("call: torch index_put K and V L=64",
                        lambda: (kc.index_put_((loc64,), k), vc.index_put_((loc64,), v)))]}
    calls = [c for fam in ("index", "store") if fam in kernels for c in calls[fam]]
    if not calls:
        return None
    path = trace.capture_calls(torch, calls, run.path("trace.json"), reps=REPEATS)
    j = trace.kernels_in_ranges(trace.read_chrome_trace(path), r"^call: ", empty_rows=False)
    j["threads"] = [_msgl.threads_launched(g, b) for g, b in zip(j["grid"], j["block"])]
    j["warps_per_token"] = j["threads"] / 32 / 64
    return j


def per_call(j, label: str, what: str = "kernel"):
    """The kernels (gpu_kind ``what``) of each traced call of ``label``: a list per call, in launch order."""
    k = j[(j["label"] == label) & (j["gpu_kind"] == what)]
    return [g.to_dict("records") for _c, g in k.groupby("call", sort=True)]


def judge(run, x):
    j, chk = x.launches, x.chk
    if "store" in x.args.kernels and j is not None:      # None: a recording without launches.csv (recording.open)
        st = per_call(j, CALL_STORE)
        run.judge(H["store_launches"], [len(c) for c in st], evidence="launches.csv",
                  detail=f"{', '.join(dict.fromkeys(r['kernel'] for c in st for r in c))}; plain torch index_put of K "
                         f"and V: {[len(c) for c in per_call(j, 'call: torch index_put K and V L=64')]} launches")
    if "index" in x.args.kernels and j is not None:
        ix = per_call(j, CALL_INDEX)
        first = ix[0][0] if ix and ix[0] else {}
        run.judge(H["warp"], [c[0]["warps_per_token"] for c in ix if c], evidence="launches.csv",
                  detail=f"grid {first.get('grid')} x block {first.get('block')}; our reading of index.py: "
                         f"{_msgl.index_launch(64, HIDDEN * 2)['warps_per_token']} warps per token")
        run.judge(H["block"], [int(str(c[0]["block"]).split("x")[0]) for c in ix if c and c[0]["block"]],
                  evidence="launches.csv")
        mk = per_call(j, CALL_MASK)
        _msgl.fact(run, H["mask"], [bool(c) and "masked" in c[0]["kernel"] for c in mk] + chk.of("index (vocab mask)"),
                   "launches.csv, checks.csv", detail=f"vocab_range call launched "
                   f"{', '.join(dict.fromkeys(r['kernel'] for c in mk for r in c)) or 'nothing'}; masked cases "
                   f"{chk.summary('index (vocab mask)')}")
    fams = [k for k in ("index", "index (vocab mask)", "store", "radix") if chk.of(k)]
    _msgl.fact(run, H["match"], chk.of(*fams), "checks.csv", detail="; ".join(f"{k}: {chk.summary(k)}" for k in fams))
    premise = x.pynccl if "pynccl" in x.args.kernels else "pynccl not selected (--kernels)"
    _msgl.fact(run, H["all"], chk.of(*fams, "pynccl"), "checks.csv", premise=premise,
               detail="; ".join(f"{k}: {chk.summary(k)}" for k in fams + ["pynccl"] if chk.of(k)))


def tell(x) -> str:
    items = [(f"{k}: {x.chk.summary(k)} exact", []) for k in ("index", "index (vocab mask)", "store", "radix", "pynccl")
             if x.chk.of(k)]
    if x.launches is None:
        return story.tree("KERNEL CHECKS — mini-SGLang custom kernels vs torch", items)
    first = x.launches[x.launches["call"] == 0]
    calls = [(label[6:], [(f"#{int(r['order'])} {r['gpu_kind']} {r['kernel']} grid {story.fmt(r['grid'])} block "
                           f"{story.fmt(r['block'])} {r['dur_us']:.1f} us", []) for r in g.to_dict("records")])
             for label, g in first.groupby("label", sort=False)]
    items.append((f"launches per call (torch.profiler, GPU order; call #0 of {REPEATS})", calls))
    return story.tree("KERNEL CHECKS — mini-SGLang custom kernels vs torch", items)


@dataclass
class Record:
    """What the analysis of one run reads: the families asked for, the checks (every one passed: a failed check ends
    the run before any analysis), whether PyNCCL ran (True) or why not, and the traced launches (the same tables a
    --reanalyse reads back from a recording)."""
    args: argparse.Namespace
    chk: Any = None                                  # Checks; its rows are checks.csv
    pynccl: Any = "pynccl not selected (--kernels)"  # True, or the reason its cases were not run
    launches: Any = None                             # launches.csv (None when neither index nor store was traced)


def analyse(run, x: Record) -> None:
    """Verdicts, headline and story from the checks and the traced launches (a GPU run and --reanalyse alike)."""
    judge(run, x)
    st = per_call(x.launches, CALL_STORE) if x.launches is not None else []
    ix = per_call(x.launches, CALL_INDEX) if x.launches is not None else []
    run.headline(checks_passed=len(x.chk.rows), store_launches_per_call=len(st[0]) if st else None,
                 index_warps_per_token=ix[0][0]["warps_per_token"] if ix and ix[0] else None,
                 index_block_threads=int(str(ix[0][0]["block"]).split("x")[0]) if ix and ix[0] else None)
    run.story(tell(x), echo=True)


def recorded_pynccl(rec, chk) -> str | bool:
    """check_pynccl's answer again: True when the recording holds PyNCCL cases (it ran, passed or not), else why not,
    with the GPU count of its note ('pynccl: not run, N GPU visible'; the provenance's count when the note is gone)."""
    if chk.of("pynccl"):
        return True
    seen = next((m for n in rec.summary.get("notes", []) if (m := re.match(r"pynccl: not run, (\d+) GPU", n))), None)
    ngpu = int(seen.group(1)) if seen else (rec.summary.get("provenance") or {}).get("gpu_count") or 0
    return f"PyNCCL needs two GPUs of one host; {ngpu} visible here, so its cases were not run"


def main_reanalyse(args) -> int:
    rec = recording.open(args.reanalyse, __file__, tables=("checks",), optional=("launches",), copy=("trace.json",))
    a = rec.args_like(args)
    if isinstance(a.kernels, str):       # a summary written as text, not a list
        a.kernels = a.kernels.split(",")
    chk = Checks(None)
    chk.rows = rec.tables["checks"].to_dict("records")
    x = Record(args=a, chk=chk, launches=rec.tables["launches"],
               pynccl=recorded_pynccl(rec, chk) if "pynccl" in a.kernels else "pynccl not selected (--kernels)")
    with recording.run(__file__, args, rec) as run:
        analyse(run, x)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    K, torch = _msgl.require_gpu_stack("minisgl.kernel")
    ngpu = torch.cuda.device_count()
    x = Record(args=args)
    with Run(__file__, args, out=args.out) as run:
        # ---- correctness first, every family asked for
        x.chk = chk = Checks(run)
        if "index" in args.kernels:
            run.log("index: plain and vocab-masked lookups vs F.embedding (first call may JIT-build)")
            _msgl.first_call(lambda: K.indexing(torch.zeros(8, HIDDEN, device="cuda", dtype=torch.bfloat16),
                                                torch.zeros(1, dtype=torch.int32, device="cuda")), "index")
            check_index(torch, K, chk, args.quick)
        if "store" in args.kernels:
            run.log("store: KV scatter vs indexing the caches")
            check_store(torch, K, chk, args.quick)
        if "radix" in args.kernels:
            run.log("radix: fast_compare_key vs a Python first-mismatch")
            check_radix(torch, K, chk)
        if "pynccl" in args.kernels:
            x.pynccl = check_pynccl(run, chk, ngpu)
        run.table("checks", chk.rows)
        bad = [r for r in chk.rows if not r["ok"]]
        if bad:
            raise RuntimeError(f"{len(bad)} check(s) failed, first: {bad[0]['kernel']} {bad[0]['case']}")
        run.log(f"All results match. Tracing each call {REPEATS} times.")
        # ---- measure: which kernels each call launches
        x.launches = trace_calls(torch, K, run, args.kernels)
        if x.launches is not None:
            run.table("launches", x.launches)
        # ---- verdicts, headline, story
        analyse(run, x)
    return 0


if __name__ == "__main__":
    run_main(main)
