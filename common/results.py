"""One way to write results: a run's folder replaces the previous one whole, or not at all.

    with Run(__file__, args) as run:          # args: the argparse Namespace (or a dict)
        run.log("decode sweep: 24 points")
        run.table("sweep", rows)              # -> sweep.csv   (list of dicts or a DataFrame)
        run.figure("roofline", fig)           # -> roofline.png
        run.headline(decode_tb_s=2.7)
        run.judge(DECODE_BW, [81.2, 80.4, 82.0], evidence="sweep.csv b32 kv4096")   # common.verdicts
        run.story(text)                        # the ASCII execution story -> story.txt
    # leaving the block: summary.json is written, then the folder replaces results/<stem>/ in one rename

Folder layout (``<system>/results/``; with ``out=DIR`` the same beside DIR, in DIR's parent)::

    <stem>/                                the last successful run, whole ("status": "ok", "schema": 2)
    .partial-<stem>-<stamp>-<pid>/         a run in progress (Run.dir); pruned once its pid is dead
    .previous/<stem>/                      the run it replaced (one copy)
    .failed/<stem>/<stamp>-<pid>-<status>/ failed | interrupted | setup-error runs: summary.json with the
                                           error and traceback, error.txt; the last 5 per stem are kept

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

import csv
import datetime as _dt
import errno
import json
import math
import os
import stat
import re
import shutil
import sys
import time
import traceback
from pathlib import Path

from . import gpu
from .checks import SetupError, in_run_main, missing_package
from .verdicts import VERDICTS, judge as _judge

SCHEMA = 2              # summary.json layout version; common.report reads only this one
SUMMARY = "summary.json"
KEEP_FAILED = 5         # failed / interrupted runs kept per stem
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
_STALE = re.compile(r"^\.(partial|trash)-.+-(\d+)$")   # our temporary folders end in -<pid>
_FAILED = re.compile(r"^\d{8}-\d{6}-\d{6}-\d+-[a-z-]+$")  # .failed/<stem>/<stamp>-<pid>-<status>


class ResultsError(SetupError):
    """The results could not be written (disk full, read-only, quota); earlier results are intact."""


def _jsonable(o):
    if hasattr(o, "item"):  # numpy / torch scalars
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, set):
        return sorted(o)
    return str(o)


def _clean(o):
    """NaN/inf are not JSON: store them as null."""
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o


def write_json_atomic(path: Path, data) -> None:
    """Write JSON to a temp file in the same folder, fsync, then rename over ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(_clean(json.loads(json.dumps(data, default=_jsonable))), f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _stamp() -> str:
    return _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")


def _oserr(e: OSError) -> str:
    return f"[Errno {e.errno}] {e.strerror}" if e.strerror else f"{e.__class__.__name__}: {e}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _rmtree(p: Path) -> None:
    """Remove a folder of ours; a symbolic link goes, never what it points to."""
    if p.is_symlink():
        p.unlink(missing_ok=True)
    else:
        shutil.rmtree(p, ignore_errors=True)


def results_dir(script_file: str | Path) -> Path:
    """``<system>/results/<stem>/`` for a script at ``<system>/scripts/<stem>.py``."""
    script = Path(script_file).resolve()
    return script.parent.parent / "results" / script.stem


def previous_dir(final: Path) -> Path:
    """Where the run a newer one replaced is kept: ``<parent>/.previous/<name>``."""
    return final.parent / ".previous" / final.name


def failed_dir(final: Path) -> Path:
    """Where failed and interrupted runs of ``final`` are kept: ``<parent>/.failed/<name>/``."""
    return final.parent / ".failed" / final.name


def script_of(dir_: Path) -> str | None:
    """The script whose run a folder holds (``"script"`` of its summary.json), or None when it is not a
    results folder (absent, not a folder, no readable summary)."""
    try:
        s = json.loads((Path(dir_) / SUMMARY).read_text())
    except (OSError, ValueError):
        return None
    return s.get("script") if isinstance(s, dict) else None


def foreign(path: Path, script: str) -> str | None:
    """Why a run of ``script`` may not replace (or discard) ``path``: it exists and is not a results folder
    of that script. None when absent or one. Only such folders are ever moved or deleted. A folder that
    another run moves away while it is read is looked at again (two runs of one script at once)."""
    for _ in range(50):
        try:
            before = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISDIR(before.st_mode):        # the stat above, not a second look that a rename can race
            return "is not a folder"
        made = script_of(path)
        try:
            after = os.stat(path)
        except FileNotFoundError:
            continue
        if (after.st_ino, after.st_dev) == (before.st_ino, before.st_dev):
            break
    if made is None:
        return "is not a results folder (no summary.json of a run)"
    return None if made == script else f"holds a run of {made}"


def recover(final: Path) -> bool:
    """Put ``.previous/<name>`` back when a process died between the two renames of a finish."""
    final = Path(final)
    prev = previous_dir(final)
    if os.path.lexists(final) or script_of(prev) is None:    # only a run of ours goes back
        return False
    try:
        os.rename(prev, final)
        return True
    except OSError:  # another process got there first, or the folder is read-only
        return False


def load_summary(dir_: str | Path) -> dict | None:
    """The summary.json of a results folder, or None when absent or unreadable."""
    recover(Path(dir_))
    p = Path(dir_) / SUMMARY
    try:
        s = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return s if isinstance(s, dict) else None


def _prune_stale(base: Path) -> None:
    """Remove ``.partial-*`` / ``.trash-*`` folders whose owner process is gone."""
    try:
        entries = list(base.iterdir())
    except OSError:
        return
    for p in entries:
        m = _STALE.match(p.name)
        if m and int(m.group(2)) != os.getpid() and not _pid_alive(int(m.group(2))):
            _rmtree(p)


def _aside(p: Path) -> Path | None:
    """Rename folder ``p`` out of the way (atomic) to a ``.trash-*`` name; None when there is none."""
    trash = p.parent.parent / f".trash-{p.name}-{_stamp()}-{os.getpid()}"
    try:
        os.rename(p, trash)
    except FileNotFoundError:
        return None
    return trash


def _put_back(trash: Path | None, p: Path) -> None:
    """Undo :func:`_aside` (a newer run's folder already at ``p`` wins: then the trash goes)."""
    if trash is None:
        return
    try:
        os.rename(trash, p)
    except OSError:
        _rmtree(trash)


def _swap_in(src: Path, final: Path, script: str) -> None:
    """Replace folder ``final`` by ``src``; the replaced folder becomes ``.previous/<name>``. Only a results
    folder of ``script`` is ever moved or dropped, and the kept ``.previous`` run goes only once ``src``
    is in place (a rename that fails leaves both as they were)."""
    prev = previous_dir(final)
    prev.parent.mkdir(exist_ok=True)
    for _ in range(20):  # a concurrent run may slip in between two renames: then go round again
        for p in (final, prev):
            why = foreign(p, script)
            if why:
                raise OSError(errno.EEXIST, f"{p} {why}: not replaced")
        old = _aside(prev)
        try:
            _rename_pair(final, prev, src)
        except OSError as e:
            _put_back(old, prev)
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                continue
            raise
        if old:
            _rmtree(old)
        return
    raise OSError(errno.EBUSY, f"{final} kept changing while this run was moved in")


def _rename_pair(final: Path, prev: Path, src: Path) -> None:
    """``final`` -> ``prev`` (when there), then ``src`` -> ``final``; the first is undone if the second fails."""
    try:
        os.rename(final, prev)
        moved = True
    except FileNotFoundError:
        moved = False
    try:
        os.rename(src, final)
    except OSError:
        if moved:
            recover(final)
        raise


def _write_csv(p: Path, rows: list[dict]) -> None:
    """A list of dicts as CSV without pandas (columns in order of first appearance)."""
    cols: dict = {}
    for r in rows:
        cols.update(dict.fromkeys(r))
    with open(p, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(cols))
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if v is None or (isinstance(v, float) and math.isnan(v)) else v
                        for k, v in r.items()})


class Run:
    """A results folder for one run of one script (see the module docstring)."""

    def __init__(self, script_file: str | Path, args=None, out: str | Path | None = None,
                 quiet: bool = False, command: str | None = None):
        script = Path(script_file).resolve()
        self.stem = script.stem
        self.system = script.parent.parent.name
        self.script = f"{self.system}/scripts/{script.name}"
        # a results entry that is a link (to another disk) is followed: the run lands where it points
        entry = Path(out or results_dir(script)).absolute()
        self.final_dir = entry.resolve()
        self.previous_dir = previous_dir(self.final_dir)
        self.failed_root = failed_dir(self.final_dir)
        self.kept_dir: Path | None = None      # where the run ended up (final_dir or a .failed folder)
        self.quiet = quiet
        self._t0 = time.time()
        self._done = False
        base = self.final_dir.parent
        try:
            for p in (self.final_dir, self.previous_dir):
                why = foreign(p, self.script)
                if why:
                    raise SetupError(f"{p} {why}: a run replaces only a folder an earlier run of {self.script} "
                                     "wrote; " + ("give --out a new folder" if out else "move it away"))
            base.mkdir(parents=True, exist_ok=True)
            recover(self.final_dir)
            for d in dict.fromkeys((base, entry.parent)):
                _prune_stale(d)
            self.dir = self._new_partial(base)
        except OSError as e:
            raise SetupError(f"results folder {base} is not writable: {_oserr(e)} "
                             f"(fix its permissions or pass --out DIR)") from None
        args_d = vars(args) if hasattr(args, "__dict__") else dict(args or {})
        self.summary: dict = {
            "schema": SCHEMA, "script": self.script, "stem": self.stem,
            "system": self.system, "status": "running", "args": args_d,
            "provenance": gpu.snapshot(None if command is None else [command]),
            "headline": {}, "tables": [], "figures": [], "files": [], "story": "",
            "observations": [], "point_errors": [], "notes": [],
        }

    def _new_partial(self, base: Path) -> Path:
        while True:
            d = base / f".partial-{self.final_dir.name}-{_stamp()}-{os.getpid()}"
            try:
                d.mkdir()
            except FileExistsError:
                continue
            try:
                self._log = open(d / "log.txt", "a")
            except OSError:
                _rmtree(d)
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
            _write_csv(p, list(rows))
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
        write_json_atomic(p, data)
        return p

    def headline(self, **figures) -> None:
        """Headline figures of the run (shown in reports as a bullet list)."""
        self.summary["headline"].update(figures)

    def note(self, text: str) -> None:
        self.summary["notes"].append(text)
        self.log(f"note: {text}")

    def reanalysis_of(self, prev: dict, source) -> None:
        """This run re-analyses files recorded by an earlier one (``prev``: its summary.json): the
        hardware provenance stays that of the recording, with when/where the analysis was redone."""
        from .gpu import provenance_line
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
        """Judge hypothesis ``h`` (common.verdicts.Hypothesis) on repeated measurements ``values``;
        the record (verdict from the interval, see common.verdicts) joins the observations."""
        if "noise" not in kw:        # this quantity's run-to-run noise, where two runs measured it (common.noise)
            from .noise import lookup
            kw["noise"] = lookup(self.system, self.stem, h.id)
        rec = {**_judge(h, values, premise=premise, **kw), "evidence": evidence}
        self.summary["observations"].append(rec)
        return rec

    def fact(self, h, holds, observed: str, evidence: str = "", premise=True) -> str:
        """A hypothesis about a fact (see common.verdicts.judge_fact); returns the verdict."""
        from .verdicts import judge_fact
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
        from .story import fold
        text = fold(text)                      # no line over story.WIDTH: it reads on a code host without scrolling
        self.summary["story"] = text
        self.path("story.txt").write_text(text + "\n")
        if echo:
            print(text, flush=True)

    # ------------------------------------------------------------------ ending
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
                from .ceilings import ceilings_brief, load_ceilings
                prov["ceilings"] = ceilings_brief(load_ceilings(0))
            except Exception:  # noqa: BLE001 - no driver, unreadable cache: the run is saved without them
                prov["ceilings"] = None
        try:
            self._log.close()
            write_json_atomic(self.dir / SUMMARY, self.summary)
            _swap_in(self.dir, self.final_dir, self.script)
        except OSError as e:
            _rmtree(self.dir)
            kept = self._keep_failed("failed", error=f"results not saved: {_oserr(e)}")
            raise ResultsError(f"results of {self.stem} not saved ({_oserr(e)} while finishing); "
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
        kept = self._keep_failed(status, error=f"{exc.__class__.__name__}: {exc}", tb=tb)
        # run_main names these in its one line (a path inside the partial folder is shown where it was kept)
        for attr, value in (("kept_in", kept), ("error_file", kept and kept / "error.txt"), ("ran_in", ran_in)):
            try:
                setattr(exc, attr, value)
            except (AttributeError, TypeError):
                pass
        if kept and not in_run_main():
            print(f"[{status}] {self.stem}: kept in {kept}", file=sys.stderr)
        return kept

    def _keep_failed(self, status: str, error: str | None = None, tb: str = "") -> Path | None:
        """Move the partial folder to .failed/<stem>/<stamp>-<pid>-<status>/ (or, when that cannot be
        written, a small record there); prune to the last KEEP_FAILED. None when nothing could be kept."""
        self._done = True
        self.summary.update(status=status, duration_s=round(time.time() - self._t0, 1))
        if error:
            self.summary.update(error=error[:2000], traceback=tb[-8000:])
        text = f"{' '.join(sys.argv)}\n{tb or error or f'finished with status {status}'}\n"
        # the pid makes the name this run's own: two runs failing in the same microsecond never share one
        dst = self.failed_root / f"{_stamp()}-{os.getpid()}-{status}"
        try:
            self._log.write(tb)
            self._log.close()
        except (OSError, ValueError):
            pass
        try:
            write_json_atomic(self.dir / SUMMARY, self.summary)
            (self.dir / "error.txt").write_text(text)
            self.failed_root.mkdir(parents=True, exist_ok=True)
            os.rename(self.dir, dst)
        except OSError:  # disk full or read-only: free the space first, then try a small record
            _rmtree(self.dir)
            made = False
            try:
                dst.mkdir(parents=True)
                made = True
                write_json_atomic(dst / SUMMARY, self.summary)
                (dst / "error.txt").write_text(text)
            except OSError:
                if made:          # only a folder this run created
                    _rmtree(dst)
                dst = None
        self._prune_failed()
        self.kept_dir = dst
        return dst

    def _prune_failed(self) -> None:
        try:
            kept = sorted(p for p in self.failed_root.iterdir() if _FAILED.match(p.name))
        except OSError:
            return
        for p in kept[:-KEEP_FAILED]:
            _rmtree(p)

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
                raise ResultsError(f"results of {self.stem} not saved ({_oserr(exc)}); "
                                   f"{self.final_dir} left as it was"
                                   + (f"; record in {kept}" if kept else "")) from exc
        return False  # re-raise: run_main turns it into one line and an exit code
