"""One way to write results: a run's folder replaces the previous one whole, or not at all.

    with Run(__file__, args) as run:          # args: the argparse Namespace (or a dict)
        run.log("decode sweep: 24 points")
        run.table("sweep", rows)              # -> sweep.csv   (list of dicts or a DataFrame)
        run.figure("roofline", fig)           # -> roofline.png
        run.headline(decode_tb_s=2.7)
        run.judge(DECODE_BW, [81.2, 80.4, 82.0], evidence="sweep.csv b32 kv4096")   # common.judge.verdicts
        run.story(text)                        # the ASCII execution story -> story.txt
    # leaving the block: summary.json is written, then the folder replaces results/<stem>/ in one rename

Folder layout (``<system>/results/``; with ``out=DIR`` the same beside DIR, in DIR's parent)::

    <stem>/                                the last successful run, whole ("status": "ok", "schema": 2)
    .partial-<stem>-<stamp>-<pid>/         a run in progress (Run.dir); pruned once its pid is dead
    .previous/<stem>/                      the run it replaced (one copy)
    .failed/<stem>/<stamp>-<pid>-<status>/ failed | interrupted | setup-error runs: summary.json with the
                                           error and traceback, error.txt; the last 5 per stem are kept, the
                                           newest whole, older ones whole within store.KEEP_FAILED_BYTES
                                           (else only that small record); a full disk keeps only the record

A finished run writes summary.json (atomically) inside its partial folder, then two renames swap it in:
``<stem>`` -> ``.previous/<stem>`` and the partial folder -> ``<stem>``. A process that dies between the
two leaves no ``<stem>``: the next Run (or :func:`load_summary`) puts ``.previous/<stem>`` back. Two runs
of one script at once: the last to finish wins and each folder holds one run only. A failed or
interrupted run never touches ``<stem>``; the kept ``.previous/<stem>`` goes only once the new run is in
place (a rename that fails, e.g. on an immutable folder, leaves both). A run moves or deletes only a
results folder of its own script (its summary.json names the script, :func:`foreign`): ``--out`` at any
other existing path (the reports, a clone, a device file) is a :class:`SetupError` before anything runs.
A ``<stem>`` that is a symbolic link (to another disk) is followed: the run and its ``.previous`` land
beside the link's target, and the link stays. When the disk is full (or any OSError hits the results while
writing or finishing), the partial folder is removed, earlier results stay as they were and
:class:`ResultsError` says so in one line; a read-only results folder is a :class:`SetupError` at start.
Sweep points that fail are recorded with :meth:`Run.point_error` and the sweep goes on.
"""
from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

from common.base.checks import in_run_main, missing_package, SetupError
from common.capture import gpu, store
from common.capture.store import DISK_ERRNOS, ResultsError, SCHEMA, SUMMARY
from common.judge import noise
from common.judge.verdicts import judge as _judge, VERDICTS


class Run:
    """A results folder for one run of one script (see the module docstring)."""

    def __init__(self, script_file: str | Path, args=None, out: str | Path | None = None,
                 quiet: bool = False, command: str | None = None):
        script = Path(script_file).resolve()
        self.stem = script.stem
        self.system = script.parent.parent.name
        self.script = f"{self.system}/scripts/{script.name}"
        # a results entry that is a link (to another disk) is followed: the run lands where it points; a link whose
        # target is not there (its disk not mounted) is refused before anything is created
        entry = Path(out or store.results_dir(script)).absolute()
        why = store.dangling(entry)
        if why:
            raise SetupError(why)
        self.final_dir = entry.resolve()
        self.previous_dir = store.previous_dir(self.final_dir)
        self.failed_root = store.failed_dir(self.final_dir)
        self.kept_dir: Path | None = None      # where the run ended up (final_dir or a .failed folder)
        self.quiet = quiet
        self._t0 = time.time()
        self._done = False
        self._margins = noise.load()           # a damaged margins file: one [setup] line before anything runs
        base = self.final_dir.parent
        try:
            for p in (self.final_dir, self.previous_dir):
                why = store.foreign(p, self.script)
                if why:
                    raise SetupError(f"{p} {why}: a run replaces only a folder an earlier run of {self.script} "
                                     "wrote; " + ("give --out a new folder" if out else "move it away"))
            base.mkdir(parents=True, exist_ok=True)
            store.recover(self.final_dir)
            for d in dict.fromkeys((base, entry.parent)):
                store._prune_stale(d)
            self.dir = self._new_partial(base)
        except OSError as e:
            why = store.unusable(self.final_dir, e)
            if why:
                raise SetupError(f"results folder {self.final_dir} cannot be made: {why} ("
                                 + ("give --out another path)" if out else "move it away or pass --out DIR)")) from None
            raise SetupError(f"results folder {base} is not writable: {store._oserr(e)} "
                             f"(fix its permissions or pass --out DIR)") from None
        args_d = vars(args) if hasattr(args, "__dict__") else dict(args or {})
        self.summary: dict = {
            "schema": SCHEMA, "script": self.script, "stem": self.stem,
            "system": self.system, "status": "running", "args": args_d,
            "provenance": gpu.snapshot(None if command is None else [command]),
            "headline": {}, "tables": [], "figures": [], "files": [], "story": "",
            "observations": [], "point_errors": [], "notes": [], "findings": [],
        }

    @property
    def gpu_model(self) -> str | None:
        """The GPU model the measured figures come from (a re-analysis: the recording's), which picks the margins."""
        return (self.summary.get("provenance") or {}).get("gpu")

    def _new_partial(self, base: Path) -> Path:
        while True:
            d = base / f".partial-{self.final_dir.name}-{store._stamp()}-{os.getpid()}"
            try:
                d.mkdir()
            except FileExistsError:
                continue
            try:
                self._log = open(d / "log.txt", "a")
            except OSError:
                store._rmtree(d)
                raise
            return d

    # ------------------------------------------------------------------ writing
    def path(self, name: str) -> Path:
        """A file inside this run (the folder replaces results/<stem>/ when the run finishes)."""
        p = self.dir / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if name not in self.summary["files"]:
            self.summary["files"].append(name)
        return p

    def log(self, msg: str) -> None:
        """Print progress (flushed) and keep it in log.txt."""
        line = f"[{time.time() - self._t0:7.1f}s] {msg}"
        if not self.quiet:
            print(line, flush=True)
        self._log.write(line + "\n")
        self._log.flush()

    def table(self, name: str, rows) -> Path:
        """Write rows (a DataFrame or a list of dicts) as ``<name>.csv`` (lists of dicts need no pandas)."""
        p = self.path(f"{name}.csv")
        try:
            import pandas as pd
        except ImportError:
            pd = None
        if pd is not None:
            df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
            df.to_csv(p, index=False)
        else:
            store._write_csv(p, list(rows))
        if name not in self.summary["tables"]:
            self.summary["tables"].append(name)
        return p

    def figure(self, name: str, fig) -> Path:
        """Save a matplotlib figure as ``<name>.png`` and close it."""
        p = self.path(f"{name}.png")
        fig.savefig(p, dpi=110, bbox_inches="tight")
        import matplotlib.pyplot as plt
        plt.close(fig)
        if name not in self.summary["figures"]:
            self.summary["figures"].append(name)
        return p

    def json(self, name: str, data) -> Path:
        p = self.path(f"{name}.json")
        store.write_json_atomic(p, data)
        return p

    def headline(self, **figures) -> None:
        """Headline figures of the run (shown in reports as a bullet list)."""
        self.summary["headline"].update(figures)

    def finding(self, text: str) -> None:
        """A sentence that states or interprets this run's figures (a value, a bound such as "DRAM-bound", a comparison
        such as "faster than"), written from them by the script, so that it holds on whatever GPU ran; the pages show
        it beside the run's blocks (``<stem>/findings``). Hand-written page text explains mechanisms and names no
        measured figure (tests/test_committed_reports.py)."""
        self.summary.setdefault("findings", []).append(" ".join(str(text).split()))

    def note(self, text: str) -> None:
        self.summary["notes"].append(text)
        self.log(f"note: {text}")

    def reanalysis_of(self, prev: dict, source) -> None:
        """This run re-analyses files recorded by an earlier one (``prev``: its summary.json): the
        hardware provenance stays that of the recording, with when/where the analysis was redone."""
        from common.capture.gpu import provenance_line
        newer = store.newer_schema(prev, source)      # never rewritten as this workbook's schema
        if newer:
            raise SetupError(newer)
        if prev.get("provenance"):
            now = self.summary["provenance"]
            self.summary["provenance"] = {**prev["provenance"],
                                          "reanalysed": {k: now.get(k) for k in ("date_utc", "git", "command")}}
        self.note("re-analysed without a GPU from the files recorded by: "
                  + (provenance_line(prev["provenance"]) if prev.get("provenance") else str(source)))

    def observe(self, expected: str, observed: str, verdict: str, evidence: str = "") -> None:
        """One expected-vs-observed line: the plan's hypothesis and what the hardware said."""
        if verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, not {verdict!r}")
        self.summary["observations"].append(
            {"expected": expected, "observed": observed, "verdict": verdict, "evidence": evidence})

    def judge(self, h, values, evidence: str = "", premise=True, **kw) -> dict:
        """Judge hypothesis ``h`` (common.judge.verdicts.Hypothesis) on repeated measurements ``values``;
        the record (verdict from the interval, see common.judge.verdicts) joins the observations."""
        if "noise" not in kw:        # this quantity's run-to-run noise on this GPU model (common.judge.noise)
            kw["noise"] = noise.margin_for(self.system, self.stem, h.id, self.gpu_model, self._margins)
        rec = {**_judge(h, values, premise=premise, **kw), "evidence": evidence}
        self.summary["observations"].append(rec)
        return rec

    def fact(self, h, holds, observed: str, evidence: str = "", premise=True) -> str:
        """A hypothesis about a fact (see common.judge.verdicts.judge_fact); returns the verdict."""
        from common.judge.verdicts import judge_fact
        rec = judge_fact(h, holds, observed, premise=premise)
        self.summary["observations"].append({**rec, "evidence": evidence})
        return rec["verdict"]

    def optional(self, what: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` for a pass the run can do without (an ncu pass, a counters phase): its
        result, or None and a note '<what> skipped: <error line>' when it raises (no ncu, no permission, a
        timeout); what was measured before it stands. Ctrl-C and SystemExit still end the run."""
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - said in the run's notes, the run goes on
            first = str(e).splitlines()[0][:200] if str(e) else ""
            self.note(f"{what} skipped: {e.__class__.__name__}: {first}")
            return None

    def point_error(self, point: dict, exc: BaseException) -> None:
        """Record a failed sweep point (shape rejected, OOM, JIT failure) and keep going."""
        msg = f"{exc.__class__.__name__}: {str(exc).splitlines()[0][:240] if str(exc) else ''}"
        self.summary["point_errors"].append({**point, "error": msg})
        self.log(f"[ERROR] {point} -> {msg}")

    def story(self, text: str, echo: bool = False) -> None:
        """The execution story of this run (ASCII); also written to story.txt (and printed with ``echo``)."""
        from common.base.story import fold
        text = fold(text)                      # no line over story.WIDTH: it reads on a code host without scrolling
        self.summary["story"] = text
        self.path("story.txt").write_text(text + "\n")
        if echo:
            print(text, flush=True)

    # ------------------------------------------------------------------ ending
    def restart_clock(self) -> None:
        """Count the run's time (log stamps, duration_s) from now: a pipeline that waited for its turn."""
        self._t0 = time.time()

    def finish(self, status: str = "ok") -> Path:
        """Write summary.json and swap this run's folder in as results/<stem>/ (status "ok"). Any other
        status keeps the run under ``.failed/<stem>/`` like :meth:`fail` and leaves results/<stem>/ alone."""
        if self._done:
            return self.kept_dir
        if status != "ok":
            return self._keep_failed(status)
        self.summary["status"] = status
        self.summary["duration_s"] = round(time.time() - self._t0, 1)
        prov = self.summary.get("provenance") or {}
        if "ceilings" not in prov and "reanalysed" not in prov:   # the denominators this run divided by
            try:
                from common.capture.ceilings import ceilings_brief, load_ceilings
                prov["ceilings"] = ceilings_brief(load_ceilings(0))
            except Exception:  # noqa: BLE001 - no driver, unreadable cache: the run is saved without them
                prov["ceilings"] = None
        try:
            self._log.close()
            store.write_json_atomic(self.dir / SUMMARY, self.summary)
            store._swap_in(self.dir, self.final_dir, self.script)
        except OSError as e:
            store._rmtree(self.dir)
            kept = self._keep_failed("failed", error=f"results not saved: {store._oserr(e)}", small=True)
            raise ResultsError(f"results of {self.stem} not saved ({store._oserr(e)} while finishing); "
                               f"{self.final_dir} left as it was"
                               + (f"; record in {kept}" if kept else "")) from None
        self._done = True
        self.kept_dir = self.final_dir
        return self.final_dir

    def fail(self, exc: BaseException, status: str = "failed") -> Path | None:
        """Keep this run as ``.failed/<stem>/<stamp>-<pid>-<status>/`` with the error; results/<stem>/ stays."""
        if self._done:
            return self.kept_dir
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        ran_in = self.dir
        kept = self._keep_failed(status, error=f"{exc.__class__.__name__}: {exc}", tb=tb, small=store.disk_full(exc))
        # run_main names these in its one line (a path inside the partial folder is shown where it was kept)
        for attr, value in (("kept_in", kept), ("error_file", kept and kept / "error.txt"), ("ran_in", ran_in)):
            try:
                setattr(exc, attr, value)
            except (AttributeError, TypeError):
                pass
        if kept and not in_run_main():
            print(f"[{status}] {self.stem}: kept in {kept}", file=sys.stderr)
        return kept

    def _keep_failed(self, status: str, error: str | None = None, tb: str = "", small: bool = False) -> Path | None:
        """Move the partial folder to .failed/<stem>/<stamp>-<pid>-<status>/ (or, when that cannot be written or
        ``small``: a full disk, only its small record there: summary.json and error.txt); prune (store.prune_failed:
        the last KEEP_FAILED, within KEEP_FAILED_BYTES). None when nothing could be kept."""
        self._done = True
        self.summary.update(status=status, duration_s=round(time.time() - self._t0, 1))
        if error:
            self.summary.update(error=error[:2000], traceback=tb[-8000:])
        text = f"{' '.join(sys.argv)}\n{tb or error or f'finished with status {status}'}\n"
        # the pid makes the name this run's own: two runs failing in the same microsecond never share one
        dst = self.failed_root / f"{store._stamp()}-{os.getpid()}-{status}"
        try:
            self._log.write(tb)
            self._log.close()
        except (OSError, ValueError):
            pass
        whole = not small
        try:
            if whole:
                store.write_json_atomic(self.dir / SUMMARY, self.summary)
                (self.dir / "error.txt").write_text(text)
                self.failed_root.mkdir(parents=True, exist_ok=True)
                os.rename(self.dir, dst)
        except OSError:
            whole = False
        if not whole:  # a full disk or a read-only folder: free the space first, then try a small record
            store._rmtree(self.dir)
            made = False
            try:
                dst.mkdir(parents=True)
                made = True
                store.write_json_atomic(dst / SUMMARY, self.summary)
                (dst / "error.txt").write_text(text)
            except OSError:
                if made:          # only a folder this run created
                    store._rmtree(dst)
                dst = None
        store.prune_failed(self.failed_root)
        self.kept_dir = dst
        return dst

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, et, exc, tb) -> bool:
        if exc is None:
            self.finish()
        elif isinstance(exc, KeyboardInterrupt):
            self.fail(exc, status="interrupted")
        elif isinstance(exc, SetupError) or missing_package(exc):     # also `import pandas` of a missing package
            self.fail(exc, status="setup-error")
        else:
            kept = self.fail(exc, status="failed")
            if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
                raise ResultsError(f"results of {self.stem} not saved ({store._oserr(exc)}); "
                                   f"{self.final_dir} left as it was"
                                   + (f"; record in {kept}" if kept else "")) from exc
        return False  # re-raise: run_main turns it into one line and an exit code
