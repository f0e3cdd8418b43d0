"""One way to write results: ``<system>/results/<script-stem>/``, summary.json last and atomic.

    with Run(__file__, args) as run:          # args: the argparse Namespace (or a dict)
        run.log("decode sweep: 24 points")
        run.table("sweep", rows)              # -> sweep.csv   (list of dicts or a DataFrame)
        run.figure("roofline", fig)           # -> roofline.png
        run.headline(decode_tb_s=2.7)
        run.observe(expected="decode is memory-bound", observed="DRAM 82%, tensor 3%",
                    verdict="confirmed", evidence="ncu.csv row 3")
        run.story(text)                        # the ASCII execution story -> story.txt
    # leaving the block: files move into results/<stem>/, summary.json is written last

While a run is going its files live in ``results/<stem>/.partial-<time>-<pid>/``; only a run
that finishes moves them into place, so an interrupted or crashed run never leaves a
half-written set beside the last good one. A failed run is kept as
``results/<stem>/failed-<time>/`` with ``summary.json`` saying ``"status": "failed"``, the
error and the traceback. Sweep points that fail are recorded with :meth:`Run.point_error`
and the sweep goes on.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

from . import gpu

VERDICTS = ("confirmed", "refuted", "inconclusive", "not run")
SUMMARY = "summary.json"


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
    with open(tmp, "w") as f:
        json.dump(_clean(json.loads(json.dumps(data, default=_jsonable))), f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _stamp() -> str:
    return _dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def results_dir(script_file: str | Path) -> Path:
    """``<system>/results/<stem>/`` for a script at ``<system>/scripts/<stem>.py``."""
    script = Path(script_file).resolve()
    return script.parent.parent / "results" / script.stem


def load_summary(dir_: str | Path) -> dict | None:
    """The summary.json of a results folder, or None when absent or unreadable."""
    p = Path(dir_) / SUMMARY
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


class Run:
    """A results folder for one run of one script (see the module docstring)."""

    def __init__(self, script_file: str | Path, args=None, out: str | Path | None = None,
                 quiet: bool = False, command: str | None = None):
        script = Path(script_file).resolve()
        self.stem = script.stem
        self.system = script.parent.parent.name
        self.final_dir = Path(out).resolve() if out else results_dir(script)
        self.final_dir.mkdir(parents=True, exist_ok=True)
        self.dir = self.final_dir / f".partial-{_stamp()}-{os.getpid()}"
        self.dir.mkdir()
        self.quiet = quiet
        self._t0 = time.time()
        self._done = False
        args_d = vars(args) if hasattr(args, "__dict__") else dict(args or {})
        self.summary: dict = {
            "script": f"{self.system}/scripts/{script.name}", "stem": self.stem, "system": self.system,
            "status": "running", "args": args_d, "provenance": gpu.snapshot(None if command is None else [command]),
            "headline": {}, "tables": [], "figures": [], "files": [], "story": "",
            "observations": [], "point_errors": [], "notes": [],
        }
        self._log = open(self.dir / "log.txt", "a")

    # ------------------------------------------------------------------ writing
    def path(self, name: str) -> Path:
        """A file inside this run (it moves into results/<stem>/ when the run finishes)."""
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
        """Write rows (a DataFrame or a list of dicts) as ``<name>.csv``."""
        import pandas as pd
        df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
        p = self.path(f"{name}.csv")
        df.to_csv(p, index=False)
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

    def point_error(self, point: dict, exc: BaseException) -> None:
        """Record a failed sweep point (shape rejected, OOM, JIT failure) and keep going."""
        msg = f"{exc.__class__.__name__}: {str(exc).splitlines()[0][:240] if str(exc) else ''}"
        self.summary["point_errors"].append({**point, "error": msg})
        self.log(f"[ERROR] {point} -> {msg}")

    def story(self, text: str) -> None:
        """The execution story of this run (ASCII); also written to story.txt."""
        self.summary["story"] = text
        self.path("story.txt").write_text(text + "\n")

    # ------------------------------------------------------------------ ending
    def finish(self, status: str = "ok") -> Path:
        """Move this run's files into results/<stem>/ and write summary.json last."""
        if self._done:
            return self.final_dir
        self.summary["status"] = status
        self.summary["duration_s"] = round(time.time() - self._t0, 1)
        self._log.close()
        for f in sorted(self.dir.rglob("*")):
            if f.is_file():
                dst = self.final_dir / f.relative_to(self.dir)
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.replace(f, dst)
        shutil.rmtree(self.dir, ignore_errors=True)
        write_json_atomic(self.final_dir / SUMMARY, self.summary)
        self._done = True
        return self.final_dir

    def fail(self, exc: BaseException, status: str = "failed") -> Path:
        """Keep this run as results/<stem>/failed-<time>/ with the error; leave the last good run alone."""
        if self._done:
            return self.final_dir
        self.summary["status"] = status
        self.summary["duration_s"] = round(time.time() - self._t0, 1)
        self.summary["error"] = f"{exc.__class__.__name__}: {exc}"[:2000]
        self.summary["traceback"] = "".join(traceback.format_exception(exc))[-8000:]
        self._log.write(self.summary["traceback"])
        self._log.close()
        write_json_atomic(self.dir / SUMMARY, self.summary)
        dst = self.final_dir / f"{status}-{_stamp()}"
        os.replace(self.dir, dst)
        self._done = True
        print(f"[{status}] {self.stem}: kept in {dst}", file=sys.stderr)
        return dst

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, et, exc, tb) -> bool:
        if exc is None:
            self.finish()
        elif isinstance(exc, KeyboardInterrupt):
            self.fail(exc, status="interrupted")
        else:
            from .checks import SetupError
            self.fail(exc, status="setup-error" if isinstance(exc, SetupError) else "failed")
        return False  # re-raise: run_main turns it into one line and an exit code
