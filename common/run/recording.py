"""`--reanalyse DIR`: a numbered script's analysis again, on a CPU, from the files an earlier run recorded.

Every numbered script splits into measure (GPU) and analyse (tables in, verdicts, figures and story out). The
measure phase ends by writing its tables (results/<stem>/*.csv) and summary.json; this module reads them back
into the same record the analysis takes, so a script needs only::

    p = cli.parser(...); recording.add_flag(p)                    # --reanalyse DIR
    ...
    if args.reanalyse:
        rec = recording.open(args.reanalyse, __file__, tables=("sweep", "reference"), optional=("kernels",))
        with recording.run(__file__, args, rec) as run:           # provenance: the recording's machine
            analyse(run, Record(**rec.tables, pk=rec.peaks, p=plan(rec.args_like(args))))
        return 0

The recording's hardware provenance stays (common.run.results.Run.reanalysis_of); its notes carry over; raw files
the story or figures read (``copy``: trace.json, ...) and the tables read are copied in, so the new run can be
re-analysed in its turn. A missing or unreadable recording is one
[setup] line naming the folder and what is missing. Read everything before the Run starts: a run that writes
back into DIR itself (the default results folder) replaces it.
"""
from __future__ import annotations

import argparse
import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from common.base.checks import SetupError, require_module
from common.capture import store


@dataclass
class Recording:
    """What an earlier run left: its folder, its summary (provenance, args, headline, notes) and its tables."""
    src: Path
    summary: dict
    tables: dict = field(default_factory=dict)          # name -> DataFrame (None when optional and absent)
    files: dict = field(default_factory=dict)           # name -> bytes, raw files to copy into the new run

    @property
    def peaks(self) -> dict:
        """The ceilings the recording divided by (its provenance), with the L2 size and SM count of its GPU."""
        from common.capture import ceilings
        prov = self.summary.get("provenance") or {}
        rec = prov.get("ceilings") or {}
        pk = {**rec, "gpu": prov.get("gpu"), "method": rec.get("method") or {}}
        if rec:        # the run measured these on its GPU (common.capture.ceilings); how is recorded since the method key
            pk["source"] = "measured"
            pk["sources"] = {k: "measured" for k, v in rec.items() if k.endswith(("_tb_s", "_tflops")) and v}
        if prov.get("sm_count"):
            pk.setdefault("sm_count", prov["sm_count"])
        return ceilings.complete(pk)

    def args_like(self, args) -> argparse.Namespace:
        """The recording's own arguments (its summary's ``args``) over ``args``: the plan the analysis needs is the
        one that was measured, not the defaults of this call."""
        mine = ("reanalyse", "out")              # where this call reads from and writes to stay this call's
        merged = {**vars(args), **{k: v for k, v in (self.summary.get("args") or {}).items()
                                   if k in vars(args) and k not in mine}}
        return argparse.Namespace(**merged)


def add_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reanalyse", metavar="DIR", default=None,
                   help="no GPU: redo the analysis (verdicts, figures, story) from the files an earlier run of this "
                        "script recorded in DIR (e.g. a copy of its results folder)")


def open(src, script_file, tables=(), optional=(), copy=()) -> Recording:  # noqa: A001 - the module's verb
    """Read the recording in ``src``: summary.json, the CSV ``tables`` (required) and ``optional`` ones, the raw
    files ``copy``. Raises SetupError (one line) when the folder, its summary or a required table is missing, or when
    a later workbook wrote it (a newer summary schema); the line names the file and the verdicts it stands for. The
    analysis goes on without an absent ``optional`` table; :func:`run` then lists each verdict of the recording that
    it could not judge again as "not run", naming the file (never silently gone)."""
    pd = require_module("pandas")
    src = Path(src).resolve()
    stem = Path(script_file).stem
    if not src.is_dir():
        raise SetupError(f"--reanalyse {src}: not a folder (give a results folder of {stem}.py)")
    try:
        summary = json.loads((src / "summary.json").read_text())
    except (OSError, ValueError) as e:
        raise SetupError(f"--reanalyse {src}: no readable summary.json ({e.__class__.__name__}): is it a results "
                         f"folder of {stem}.py?") from None
    if not isinstance(summary, dict):
        raise SetupError(f"--reanalyse {src}: its summary.json is not a run's summary: is it a results folder of "
                         f"{stem}.py?")
    newer = store.newer_schema(summary, src)
    if newer:
        raise SetupError(newer)
    if summary.get("stem") not in (None, stem):
        raise SetupError(f"--reanalyse {src}: a recording of {summary.get('stem')}.py, not of {stem}.py")
    missing = [t for t in tables if not (src / f"{t}.csv").is_file()]
    if missing:
        had = [o["hypothesis"] for o in summary.get("observations") or [] if isinstance(o, dict) and o.get("hypothesis")]
        raise SetupError(f"--reanalyse {src}: no {', '.join(m + '.csv' for m in missing)} to re-analyse "
                         f"(written by {stem}.py)" + (f"; without it none of the recording's {len(had)} verdicts can "
                                                      f"be judged again ({', '.join(had)})" if had else ""))
    out = {t: pd.read_csv(src / f"{t}.csv") for t in tables}
    out.update({t: (pd.read_csv(src / f"{t}.csv") if (src / f"{t}.csv").is_file() else None) for t in optional})
    files = {f: (src / f).read_bytes() for f in copy if (src / f).is_file()}
    # the tables travel too (the analysis may write its own over them): the new run is a recording in its turn
    files.update({f"{t}.csv": (src / f"{t}.csv").read_bytes() for t in out if out[t] is not None})
    return Recording(src, summary, out, files)


@contextlib.contextmanager
def run(script_file, args, rec: Recording):
    """``with recording.run(__file__, args, rec) as run:`` the Run of a re-analysis: the recording's provenance
    and notes, its raw files copied in; it ends like any run (results/<stem>/ or --out, .failed/ on an error)."""
    from common.run.results import Run
    with Run(script_file, rec.args_like(args), out=getattr(args, "out", None)) as r:   # --quick etc. as recorded
        r.reanalysis_of(rec.summary, rec.src)
        for n in rec.summary.get("notes", []):
            if not n.startswith(("re-analysed", "not judged again")):      # both are said again for this run
                r.note(n)
        for name, data in rec.files.items():
            r.path(name).write_bytes(data)
        yield r
        not_judged(r, rec)


def not_judged(r, rec: Recording) -> None:
    """After the analysis: when the recording lacks optional tables that its run wrote (its summary lists them: a
    partial copy), each verdict the recording had that this analysis could not judge again becomes a "not run"
    observation naming the files (and the recorded verdict), and a note says which; a page lists them instead of losing
    them. A table the recorded run never wrote (it predates it) loses nothing: a verdict the script no longer judges
    is dropped on purpose."""
    def key(o):        # a hypothesis by its id; an expected-vs-observed line (Run.observe) by its expectation
        return o.get("hypothesis") or o.get("expected") if isinstance(o, dict) else None
    wrote = set(rec.summary.get("tables") or []) | {f[:-4] for f in rec.summary.get("files") or []
                                                    if isinstance(f, str) and f.endswith(".csv")}
    absent = [f"{t}.csv" for t, df in rec.tables.items() if df is None and t in wrote]
    judged = {key(o) for o in r.summary["observations"]}
    lost = [o for o in rec.summary.get("observations") or [] if key(o) and key(o) not in judged] if absent else []
    for o in lost:
        r.summary["observations"].append({**o} if o.get("verdict") == "not run" else {   # (a re-analysis's, again)
            **({"hypothesis": o["hypothesis"]} if o.get("hypothesis") else {}), "expected": o.get("expected", ""),
            "verdict": "not run", "evidence": ", ".join(absent), "source": o.get("source", ""),
            "observed": f"not judged: the recording {rec.src} lacks {', '.join(absent)}, which its run wrote (that run "
                        f"found it {o.get('verdict', '?')})"})
    if lost:
        r.note(f"not judged again, the recording lacks {', '.join(absent)}: "
               + "; ".join(o.get("hypothesis") or o["expected"][:80] for o in lost))
