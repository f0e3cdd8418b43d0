"""A sweep under Nsight Compute: the script runs itself again in a hidden --ncu-target mode (FlashInfer 02-05,
mini-SGLang 02-04; their nsys timelines and mini-SGLang 08 use that child too).

    return ncu_pass.run_points(torch, points, make, label)     # the child: each point once, a marker kernel before it
    kern, raw = ncu_pass.profile_points(run, __file__, ncu_pass.own_argv(argv), "BatchDecode", points, peaks)

The marker (common.capture.ncu.mark) lets common.tables.kernels.split_points give every launch its point, however
many kernels a point launched; the parent holds the same points in the child's order and labels each row with them.
What differs between scripts is a parameter: the child's warm-up (mini-SGLang), the metrics, the timeout, the caches.
"""
from __future__ import annotations

import sys
from pathlib import Path

from common.capture import ncu
from common.tables import kernels as kt


def target_cmd(script, argv, flag: str = "--ncu-target") -> list[str]:
    """The child's command line: this Python, ``script`` in its hidden target mode (``flag``), ``argv``."""
    return [sys.executable, str(Path(script).resolve()), flag, *argv]


def own_argv(argv, drop=("--ncu", "--nsys"), drop_value=("--out",)) -> list[str]:
    """This run's own arguments for its child (``argv`` None: sys.argv[1:]), less the flags that would recurse
    (--ncu, --nsys) or move the results (--out DIR, --out=DIR)."""
    out, skip = [], False
    for a in (sys.argv[1:] if argv is None else argv):
        if skip:
            skip = False
        elif a in drop_value:
            skip = True
        elif a not in drop and not any(a.startswith(f"{d}=") for d in drop_value):
            out.append(a)
    return out


def argv_of(args, names) -> list[str]:
    """The flags of ``names`` as parsed (lists joined by commas): what a child needs to rebuild the parent's points."""
    out = []
    for n in names:
        v, flag = getattr(args, n, None), "--" + n.replace("_", "-")
        if v is True:
            out.append(flag)
        elif v not in (None, False):
            out += [flag, ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)]
    return out


def run_points(torch, points, make, label, warm_up: bool = False) -> int:
    """The child's loop: per point the marker kernel (and its 'ncu-target: point i/n' line), ``make(p)`` -> (fn, keep),
    ``fn()`` once in the NVTX range ``label(p)``, then the point's buffers freed and handed back to the driver (memory
    torch keeps cached is still allocated for ncu, which saves and restores it around every replay pass). A failed
    point is one [ERROR] line and still advances the point index. ``warm_up``: every point made and its fn run once
    before the first marker (JIT loads, first touch: point -1, which profile_points leaves out), kept to the end."""
    from common.capture.ranges import nvtx_range
    made = [make(p) for p in points] if warm_up else None
    if warm_up:
        for fn, _keep in made:
            fn()
        torch.cuda.synchronize()
    for i, p in enumerate(points):
        ncu.mark(i, len(points), label(p))  # before the try: a failed point still advances the point index
        try:
            fn, keep = made[i] if warm_up else make(p)
            with nvtx_range(label(p)):
                fn()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - a rejected shape or OOM: said, the other points still run
            print(f"[ERROR] {p} -> {e.__class__.__name__}: {str(e)[:200]}", file=sys.stderr)
        finally:
            fn = keep = None  # noqa: F841 - this point's buffers go (its closure holds them too) before the next
            torch.cuda.empty_cache()
    return 0


def profile_points(run, script, argv, kernels: str, points: list, peaks: dict, metrics=None, timeout: float = 900,
                   cache_control: str = "all"):
    """``script --ncu-target argv`` under ncu (common.capture.ncu.profile; by default the caches flushed before every
    pass, as common.capture.timing.bench flushed them for the timings beside): (rows, raw). ``rows``: one
    kernels.summarize() row per launch with the joined columns (kernels.joined), labelled with the fields of its point
    (``points``: dicts in the child's order); ``raw``: the metric rows (``metrics``, default the kernel table's).
    Launches before the first marker belong to no point and are left out."""
    res = ncu.profile(target_cmd(script, argv), run.dir / "ncu", kernel=ncu.with_marker(kernels),
                      metrics=metrics or kt.SUMMARY_METRICS, echo=run.log, timeout=timeout, cache_control=cache_control)
    raw = kt.split_points(res.df)
    raw = raw[raw["point"] >= 0].reset_index(drop=True)
    rows = kt.joined(kt.summarize(raw, peaks=peaks), peaks)
    for key in dict.fromkeys(k for p in points for k in p):
        rows[key] = [points[i].get(key) if 0 <= i < len(points) else None for i in rows["point"]]
    if rows.attrs.get("missing_metrics"):
        run.note(f"the ncu CSV lacks {', '.join(rows.attrs['missing_metrics'])}: those columns are empty")
    return rows, raw
