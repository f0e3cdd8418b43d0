"""Fault injection: what a user sees when something goes wrong, and that nothing they had is lost.

Each case injects one fault on this CPU machine and runs a real entry point -- a numbered script, a
06_full_pipeline.sh, ncu_profile.sh, ``python -m common report``, ``make reports`` -- or the script
stand-in tests/fakes/experiment.py (run_main + results.Run + a fake SGLang server, the skeleton every
experiment has) in a subprocess with a timeout. The tools are fakes (tests/fakes/: nvidia-smi, ncu, a
CPU-only torch; tests/sglang_fake_server.py on 127.0.0.1 with a port the OS chose); missing packages
are stubs on PYTHONPATH that raise ModuleNotFoundError; disk full / EIO / a kill between two renames
are injected around the real code. Each case asserts
  * the line the user sees (exact, or exact up to time stamps and paths) and no "Traceback";
  * the exit code: 0 ok, 1 failed, 2 setup or usage, 130 interrupted, 143 SIGTERM, 137 SIGKILL;
  * committed reports byte-identical: copies of the real report pages in tmp_path (a World), the only
    reports any case can reach; a case that refreshes on purpose checks that only its blocks changed;
  * earlier results intact (every file's bytes) and no ``.partial-*`` folder or temp file left;
  * no process it started alive afterwards, by pid (the ``pids`` fixture also checks every
    descendant of this test process).
FAULTS is the matrix (fault id -> cluster -> what the user sees); test_the_matrix_is_covered checks
that every fault has its test. Nothing here binds a fixed port or leaves 127.0.0.1.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from common.capture import procs, store  # noqa: E402
from common.render import report  # noqa: E402
from common.run import results  # noqa: E402
from kit import write_fake_system

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
FAKES = TESTS / "fakes"
FIXTURES = TESTS / "fixtures"
EXPERIMENT = FAKES / "experiment.py"
PY = sys.executable
TB = "Traceback"
SEEDED_AT = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())     # the date of every seeded run

# ------------------------------------------------------------------ the matrix

FAULTS = {
    # (a) pipelines
    "pipeline-no-gpu": ("pipelines", "every system: one [setup] line (torch missing) '... -- every step of this "
                                     "pipeline needs it: no step was run', said once before any step; exit 2; nothing "
                                     "recorded; reports untouched; the last good pipeline run kept"),
    "pipeline-cpu-only-torch": ("pipelines", "one line '[setup] torch 2.11.0+cpu is a CPU-only build ... -- every step "
                                             "...: no step was run'; exit 2; reports untouched"),
    "make-quick-no-gpu": ("pipelines", "make quick / make all (also SKIP_SETUP=1) without nvidia-smi or with one that "
                                       "fails: one line '... *** [setup] make quick needs an NVIDIA GPU: ...'; exit 2; "
                                       "nothing installed, no pipeline run; make test / check / reports unaffected"),
    "pipeline-ctrl-c": ("pipelines", "step 'interrupted', no further step; 'reports not refreshed'; exit 130; "
                                     "the step's process tree gone"),
    "pipeline-sigterm": ("pipelines", "as Ctrl-C: exit 130, reports untouched, processes gone"),
    "pipeline-step-fails": ("pipelines", "the step's [failed] line, 'partial — 1/2 steps ok'; exit 1; "
                                         "reports untouched"),
    "pipeline-step-missing": ("pipelines", "'missing: <script> does not exist'; partial; exit 1; reports untouched"),
    "pipeline-results-unwritable": ("pipelines", "one [setup] line naming the results folder; exit 2; no step runs"),
    "pipeline-disk-full-recording": ("pipelines", "one line 'could not record the run: ResultsError ...'; exit 1; "
                                                  "reports not refreshed; no .partial"),
    "pipeline-missing-package": ("pipelines", "the step's one [setup] line with 'pip install pandas' / 'matplotlib'; "
                                              "the runner itself needs neither; exit 1"),
    # (b) reports
    "report-mixed-machines": ("reports", "a run on another GPU model makes the pages its machine's: its blocks, each other "
                                         "block one 'Not measured in this run' line with its command; no mix"),
    "report-older-or-other-gpu-run": ("reports", "runs of two machines: the newest one's pages; 'skipped <summary>: its run "
                                                 "on <machine> is not this refresh's machine ...', nothing of it shown"),
    "report-old-schema": ("reports", "'skipped <summary>: no \"schema\" key ...'; exit 0; reports byte-identical"),
    "report-no-provenance": ("reports", "'skipped <summary>: no provenance ...'; exit 0; byte-identical"),
    "report-malformed-json": ("reports", "'skipped <summary>: not valid JSON (...)'; exit 0; byte-identical"),
    "report-unfinished-run": ("reports", "'skipped <summary>: status 'failed': only finished, successful runs ...'"),
    "report-binary-table": ("reports", "'skipped <table>.csv: not text ...'; its block says this run's table could "
                                       "not be read (never another run's figures); the run's other blocks refresh"),
    "report-pandas-missing": ("reports", "make reports renders the same without pandas; exit 0"),
    "report-matplotlib-missing": ("reports", "make reports renders the same without matplotlib; exit 0"),
    "report-render-error-last-file": ("reports", "'[failed] reports not refreshed, no file written: ...'; exit 1; "
                                                 "no file written although earlier pages rendered"),
    "report-clean-clone": ("reports", "make reports / python -m common report: 0 files changed, byte-identical, "
                                      "exit 0"),
    "report-unbalanced-markers": ("reports", "'[failed] reports not refreshed, no file written: <page> line N: "
                                             "<!-- auto:KEY --> has no closing <!-- /auto --> ...' (or a stray "
                                             "closing marker); exit 1; every report byte-identical"),
    "report-ctrl-c-during-imports": ("reports", "Ctrl-C while `python -m common report` still imports: '[interrupted] "
                                                "stopped by Ctrl-C; earlier results were left as they were.'; exit 130; "
                                                "no traceback; byte-identical"),
    "report-make-ctrl-c": ("reports", "Ctrl-C in `make reports` (to make's process group, as a terminal sends it) "
                                      "during Python's start-up, common's imports or the report itself: the one "
                                      "'[interrupted] stopped by Ctrl-C; earlier results were left as they were.' "
                                      "line, nothing from Python's start-up (was a KeyboardInterrupt traceback) or "
                                      "from make (was '*** [Makefile:NN: reports] Error 130' / 'wait: No child "
                                      "processes'); make killed by SIGINT (exit 130 in a shell); byte-identical"),
    "report-disk-full": ("reports", "'[failed] reports not refreshed, no file written: cannot write ...: [Errno 28]'; "
                                    "exit 1; no temp file left"),
    # (c) results folders
    "results-whole-run": ("results", "a new run's folder holds no file of the run before; that one is .previous/"),
    "results-crash-between-renames": ("results", "exit 137; the next run puts the last good run back, byte for byte"),
    "results-final-replace-fails": ("results", "one [setup] line '... not saved ([Errno 5] ...) left as it was; "
                                               "record in ...'; exit 2"),
    "results-failed-runs-pruned": ("results", "5 failed + 2 interrupted runs: the last 5 kept under .failed/<stem>/; "
                                              "the good run intact"),
    "results-failed-runs-bounded": ("results", "a full disk: '[setup] results of experiment not saved ([Errno 28] No "
                                               "space left on device); <out> left as it was; record in <rec>'; exit 2; "
                                               "the record holds summary.json and error.txt only, never the run's "
                                               "large files (before: each failed run's files kept until no record "
                                               "fit); other failed runs: the newest whole, the older ones shrunk to "
                                               "that record beyond store.KEEP_FAILED_BYTES"),
    "results-concurrent-failures": ("results", "two failing runs at once: each line names its own error.txt"),
    "results-disk-full-writing": ("results", "'[setup] results of ... not saved ([Errno 28] ...)'; exit 2; "
                                             "no .partial"),
    "results-disk-full-finishing": ("results", "'... ([Errno 28] ... while finishing) ...'; exit 2; no .partial"),
    "results-out-not-ours": ("results", "'[setup] <path> is not a results folder (no summary.json of a run) | is not a "
                                        "folder: a run replaces only a folder an earlier run of <script> wrote; give "
                                        "--out a new folder'; exit 2, twice; the reports, a clone, a special file "
                                        "byte-identical, nothing moved"),
    "results-previous-kept": ("results", "the old run cannot be moved (immutable) or the new one cannot move in: "
                                         "one [setup] line; exit 2; <stem> and .previous/<stem> byte-identical"),
    "results-symlinked-entry": ("results", "results/<stem> a link to another disk: the run lands there, the link stays, "
                                           "the run it replaced in that disk's .previous/, no .trash-* left; exit 0"),
    "results-tests-own-cache": ("results", "the test suite's own cache (conftest): a failure's traceback file from any "
                                          "test process goes to a temporary HANDS_ON_CACHE, never ~/.cache/hands-on"),
    "results-read-only": ("results", "'[setup] results folder ... is not writable: [Errno 13] ... (fix its "
                                     "permissions or pass --out DIR)'; exit 2"),
    "results-out-unusable": ("results", "--out under a file, or a name too long: its own line, never 'not writable "
                                        "... fix its permissions': '[setup] results folder <out> cannot be made: <f> "
                                        "is a file, not a folder (give --out another path)' / '... its name is 300 "
                                        "characters; beside it a run writes .partial-<name>-<time>-<pid>, so this file "
                                        "system (255 a name) takes names of at most N (give --out another path)'; "
                                        "exit 2; nothing created"),
    "results-link-to-unmounted-disk": ("results", "results/<stem> a link whose target is missing (its disk not "
                                                  "mounted; a dangling link, or its parent gone too): '[setup] <link> "
                                                  "is a link to <target>, which does not exist (is its disk mounted?); "
                                                  "nothing was written: mount the disk, create <target>, or remove the "
                                                  "link'; exit 2; nothing created on the bare mount point"),
    # (d) processes
    "proc-sigkill-leaves-server": ("processes", "the next run: 'found a process group left behind by a killed run'; "
                                                "the old server and its child stopped"),
    "proc-sigkill-other-script": ("processes", "a server a SIGKILLed run of one script left: the next run of another "
                                               "script (or a pipeline) says 'found a process group left behind ...' "
                                               "and stops it and its child before anything starts; exit 0"),
    "proc-ncu-timeout": ("processes", "'[failed] NcuError: ncu did not finish within 2 s ...'; exit 1; ncu and the "
                                      "application (own session) gone"),
    "proc-three-runs-three-ports": ("processes", "three runs at once serve on three different OS-chosen ports"),
    "proc-sigterm-stops-server": ("processes", "'[interrupted] stopped by SIGTERM ...'; exit 143; server tree gone"),
    "proc-no-fixed-port": ("processes", "no test or script binds a fixed port (30000 or any literal)"),
    "proc-server-dies-at-startup": ("processes", "'[failed] ServerError: server exited with code 3 during start-up "
                                                 "... Last log lines (<kept log>): <line> | <line>'; exit 1; no pidfile, "
                                                 "no process"),
    "proc-server-ignores-sigterm": ("processes", "a server process that ignores SIGTERM (the launcher itself gets "
                                                 "SIGKILL first): the run's log: 'server: still running 3 s after "
                                                 "SIGTERM; sending SIGKILL' then 'server: stopped (..., killed with "
                                                 "SIGKILL after 3 s of SIGTERM)'; exit 0; no process"),
    "proc-second-ctrl-c-at-start": ("processes", "Ctrl-C twice while the server starts (the second at once or while it "
                                                 "is stopped): the one '[interrupted] stopped by Ctrl-C; ...' line, no "
                                                 "'Exception ignored in atexit callback'; exit 130; no process"),
    "proc-http-proxy-set": ("processes", "an http_proxy in the environment: the local server is still reached "
                                         "directly (it was 'not healthy after 900 s'); exit 0"),
    "proc-port-in-use": ("processes", "'[setup] port N on 127.0.0.1 is already in use ...'; exit 2; nothing started"),
    "proc-gate-holder-killed": ("processes", "08's gated counters server, its run SIGKILLed while it is held: the "
                                             "scheduler exits at once, then the server ('hands-on gate: closed: its "
                                             "holder (pid N) is gone, so the scheduler exits after N s, before it "
                                             "touches the GPU'); nothing left running, no next run needed"),
    "proc-gate-timeout": ("processes", "the gate not released within HANDS_ON_GATE_TIMEOUT while its run lives: the "
                                       "server exits; '[failed] GateError: server[gated] exited while held by its "
                                       "gate, which closed: not released within 1 s (HANDS_ON_GATE_TIMEOUT), so the "
                                       "scheduler exits after 1.0 s, before it touches the GPU; log <kept log>'; exit 1"),
    "proc-gate-not-held": ("processes", "a gated start that was not held (the plugin not loaded): '[failed] GateError: "
                                        "server[gated] started without being held by its gate (no passed-<pid>.json "
                                        "in <gate folder>: ...); its measurements are not trusted'; exit 1"),
    # (e) bad values and missing packages
    "value-configs-negative": ("values", "argparse's line for --configs; exit 2; no server, no results"),
    "value-model-path-missing": ("values", "'... --model-path: '/nonexistent' is not a folder ...'; exit 2"),
    "value-mem-fraction": ("values", "'... --mem-fraction: expected a fraction in (0, 1], got '5''; exit 2"),
    "value-batches-abc": ("values", "'... --batches: expected positive integers ...'; exit 2"),
    "value-unknown-preset": ("values", "'... unknown model preset 'gpt-9'; choose from ...'; exit 2"),
    "value-tp-over-visible-gpus": ("values", "'[setup] --configs llama-3.1-8b:2 needs 2 GPUs; 1 visible ...'; exit 2"),
    "value-gpu-without-torch": ("values", "sglang 01/03 where nvidia-smi sees an H200 but torch is missing: '[setup] "
                                          "Python package 'torch' is not importable ... (while measuring this GPU's "
                                          "ceilings; log <log>)'; exit 2; earlier results intact"),
    "value-reanalyse-newer-schema": ("values", "--reanalyse of a recording of summary schema 3 or 99: '[setup] "
                                               "--reanalyse <dir>: a recording of summary schema 99, newer than this "
                                               "workbook's (2): re-analyse it with the workbook that recorded it (commit "
                                               "<c>), or update this one (git pull); it is not rewritten as schema 2'; "
                                               "exit 2; no results folder (before: exit 0, stamped schema 2)"),
    "value-reanalyse-partial-recording": ("values", "--reanalyse of a recording that lacks a table its run wrote (SGLang "
                                                    "02 without policy.csv, mini-SGLang 01 without launches.csv): exit "
                                                    "0; each verdict the recording had and this analysis could not judge "
                                                    "again reads 'not run' ('not judged: the recording <dir> lacks "
                                                    "policy.csv, which its run wrote (that run found it <verdict>)'), a "
                                                    "note names them, the page's verdict table lists them (before: "
                                                    "silently gone / '[failed] TypeError'); a lacking required table: "
                                                    "one [setup] line naming it and the verdicts it stands for"),
    "value-ncu-csv-without-time": ("values", "'[failed] NcuParseError: the ncu CSV has no gpu__time_duration.sum "
                                             "column ...'; exit 1"),
    "cache-not-writable": ("values", "a cache folder or HOME that cannot be written: '[setup] cache folder <dir> is not "
                                     "writable ([Errno 20|13] ...); set HANDS_ON_CACHE to a writable folder'; exit 2; "
                                     "nothing started"),
    "home-read-only-matplotlib": ("values", "a HOME where matplotlib cannot write (read-only, or not a folder): the "
                                            "run's one line only, no matplotlib warning before it (MPLCONFIGDIR set "
                                            "to <cache>/matplotlib or <tmp>/hands-on-matplotlib-<uid> by run_main)"),
    "value-ncu-text-in-a-number-column": ("values", "'[failed] NcuParseError: <dir>/ncu.csv: column "
                                                    "gpu__time_duration.sum, row 4 (RMSNormKernel): 'fast' is not a "
                                                    "number'; exit 1 (was ValueError: could not convert string ...)"),
    "value-nsys-csv-without-name": ("values", "'[failed] TraceError: <csv>: no Name column (columns: ...)'; exit 1 (was "
                                              "KeyError: 'name'); the earlier run intact"),
    "value-nsys-csv-cut-mid-row": ("values", "'[failed] TraceError: <csv>: column Name, line N: empty (the file cut "
                                             "mid-row?)'; exit 1 (was AttributeError: 'float' ... 'replace')"),
    "value-nsys-csv-cut-mid-quote": ("values", "'[failed] TraceError: <csv>: column Name, line N: a quote never closed "
                                               "...'; exit 1 (was pandas' ParserError)"),
    "value-trace-gz-cut": ("values", "'[failed] TraceError: trace <file> is cut short or damaged (EOFError: ...)'; "
                                     "exit 1 (was EOFError, the file not named)"),
    "package-pandas-script": ("values", "'[setup] Python package(s) not importable: 'pandas' (pip install "
                                        "pandas)'; exit 2"),
    "package-matplotlib-script": ("values", "'[setup] ... 'matplotlib' (pip install matplotlib)'; exit 2"),
    "package-import-anywhere": ("values", "an `import pandas` deep in main: one [setup] line with 'pip install "
                                          "pandas'; the run kept as setup-error; exit 2"),
    "package-cupti-python": ("values", "no [setup] stop: the cross-check's premise names 'pip install cupti-python'"),
    "package-make-test-downloads": ("values", "the README's set-up text says what the first `make test` downloads "
                                              "(tests/requirements.txt: ncu-report, import-linter, ...) and how much "
                                              "(MB), before a user runs it"),
    "package-nvtx": ("values", "no [setup] stop: NVTX ranges become no-ops (torch annotations where torch runs)"),
}
COVERED: set[str] = set()


def covers(*ids: str):
    """Record which faults of FAULTS a test exercises."""
    unknown = set(ids) - set(FAULTS)
    assert not unknown, f"not in FAULTS: {unknown}"
    COVERED.update(ids)
    return lambda f: f


# ------------------------------------------------------------------ helpers

def snapshot(d: Path) -> dict:
    """Every file under ``d`` (hidden ones too) with the hash of its bytes."""
    d = Path(d)
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


OTHER_GPU = "NVIDIA A100-SXM4-80GB"      # a GPU model that no committed page shows
PAGE_GPU = "NVIDIA H100 80GB HBM3"       # the GPU model of the committed pages' runs (a seeded run beside them)



def lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def usage_then(err: str) -> str:
    """argparse's stderr: the usage block, then the one error line; returns that line."""
    ls = lines(err)
    assert ls and ls[0].startswith("usage: "), err
    assert all(ln.startswith(" ") for ln in ls[1:-1]), err
    return ls[-1]


def fake_bin(tmp_path: Path) -> Path:
    """tmp_path/bin with the fake nvidia-smi and ncu (first on PATH: a real one on a GPU box is masked)."""
    b = tmp_path / "bin"
    if not b.exists():
        b.mkdir()
        for name in ("nvidia-smi", "ncu"):
            (b / name).write_text(f'#!/bin/sh\nexec "{PY}" "{FAKES / name}" "$@"\n')
            (b / name).chmod(0o755)
    return b


def blocked(tmp_path: Path, *names: str) -> Path:
    """A folder of stubs that make ``import <name>`` fail as for a package that is not installed."""
    d = tmp_path / ("block-" + "-".join(names))
    for n in names:
        (d / n).mkdir(parents=True, exist_ok=True)
        (d / n / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{n}'\", name={n!r})\n")
    return d


def env_for(tmp_path: Path, smi: str = "fail", path_first=(), **extra) -> dict:
    """The environment of a case: this test's own cache (pidfiles, error files), the fake tools first on
    PATH (FAKE_SMI=fail: no GPU, as on this machine; h200: one H200), nothing inherited that steers the code."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "HANDS_ON_DEBUG", "HANDS_ON_PIPELINE_ROOT", "NCU", "CUDA_VISIBLE_DEVICES",
                        "PIPELINE_COMMAND", "FAKE_NCU", "FAKE_NCU_PIDS")}
    env.update(HANDS_ON_CACHE=str(tmp_path / "cache"), FAKE_SMI=smi, PYTHONUNBUFFERED="1",
               PATH=os.pathsep.join([*map(str, path_first), str(fake_bin(tmp_path)), env.get("PATH", "/usr/bin:/bin")]))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(cmd, env, cwd=REPO, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def experiment(out: Path, *args, env, timeout=60) -> subprocess.CompletedProcess:
    return run([PY, EXPERIMENT, "--out", out, *args], env, timeout=timeout)


def no_partials(root: Path) -> None:
    left = [str(p) for p in Path(root).rglob("*") if p.name.startswith((".partial-", ".trash-")) or
            p.name.endswith(".tmp")]
    assert not left, left


class World:
    """A stand-in repository root in tmp_path: copies of the real committed report pages of ``systems``
    (optionally their scripts, and common/ + the Makefile for the refresh cases), earlier good runs
    seeded under results/. ``check()`` asserts the reports are byte-identical and the seeded runs intact."""

    def __init__(self, tmp_path: Path, systems=("sglang",), scripts=False, code=False, page: str | None = None):
        self.root = tmp_path / "repo"
        ignore = shutil.ignore_patterns("__pycache__")
        for s in systems:
            shutil.copytree(REPO / s / "reports", self.root / s / "reports", ignore=ignore)
            if scripts:
                shutil.copytree(REPO / s / "scripts", self.root / s / "scripts", ignore=ignore)
        if page is not None:                      # a stand-in page of a system of its own
            (self.root / "demo" / "reports").mkdir(parents=True)
            (self.root / "demo" / "reports" / "analysis.md").write_text(page)
        if code:
            shutil.copytree(REPO / "common", self.root / "common", ignore=ignore)
            shutil.copy(REPO / "Makefile", self.root / "Makefile")
        self.reports0 = self.reports()
        self.kept: dict[Path, dict] = {}

    def reports(self) -> dict:
        return {str(p.relative_to(self.root)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(self.root.glob("*/reports/**/*")) if p.is_file()}

    def seed(self, system: str, stem: str, out: Path | None = None, gpu=PAGE_GPU, torch="2.11.0+cu130",
             commit="6ca9eea", files=("table.csv",), keep=True, script: Path | None = None,
             date: str | None = None, story: str | None = None) -> Path:
        """An earlier good run (fixed provenance) in <system>/results/<stem>, or in ``out``, made by
        ``script`` (default <system>/scripts/<stem>.py): a later run replaces only a folder of its script.
        Dated when this module was loaded (``date``: an ISO time), so newer than the committed blocks it may
        replace, and the same in every World of one session (two Worlds' pages compare byte for byte)."""
        script = script or self.root / system / "scripts" / f"{stem}.py"
        with results.Run(script, {"seeded": True}, out=out, quiet=True) as r:
            r.summary["provenance"].update(gpu=gpu, gpu_count=1, packages={"torch": torch},
                                           git={"commit": commit, "dirty": False},
                                           date_utc=date or SEEDED_AT)
            for f in files:
                if f.endswith(".csv"):
                    r.table(f[:-4], [{"batch": 1, "tb_s": 2.5}])
                else:
                    r.path(f).write_text("seeded\n")
            r.story(story or self._story(system, stem, gpu))
            r.headline(tb_s=2.5)
        if keep:
            self.kept[r.final_dir] = snapshot(r.final_dir)
        return r.final_dir

    def _story(self, system: str, stem: str, gpu: str) -> str:
        """A seeded story with a branch for every part of it the pages show (story:TITLE|TITLE~N blocks), so a
        seeded run refreshes its story blocks as a real one would."""
        titles = [t for p in sorted((self.root / system / "reports").glob("*.md"))
                  for m in re.finditer(rf"<!-- auto:{re.escape(stem)}/story:([^~\s>]+)", p.read_text())
                  for t in m.group(1).split("|")]
        titles = list(dict.fromkeys(titles))
        return "\n".join([f"STORY of {stem} on {gpu}"] + [f"{'└' if i == len(titles) - 1 else '├'}── {t} (seeded)"
                                                         for i, t in enumerate(titles)])

    def check(self, reports=True, partials=True) -> None:
        if reports:
            assert self.reports() == self.reports0, "committed reports changed"
        for d, snap in self.kept.items():
            assert snapshot(d) == snap, f"earlier results changed: {d}"
        if partials:
            no_partials(self.root)


@pytest.fixture
def pids():
    """Pids a case registers (servers whose parent was killed are no longer our descendants); after
    the case, none of them and no new descendant of this process may be alive."""
    before = set(procs.descendants(os.getpid()))
    tracked: list[int] = []
    yield tracked
    new = [p for p in procs.descendants(os.getpid()) if p not in before]
    left = [p for p in dict.fromkeys(new + tracked) if procs.alive(p)]
    if left:
        procs.wait_gone(left, 5)
    still = [p for p in left if procs.alive(p)]
    for p in still:                    # leave nothing behind even when failing
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    assert not still, f"processes left behind: {[(p, procs.cmdline(p)) for p in still]}"


def test_the_matrix_is_covered():
    """Every fault of FAULTS has its test (``covers`` runs when this module is imported, before any test)."""
    assert set(FAULTS) == COVERED, sorted(set(FAULTS) ^ COVERED)
    assert len(FAULTS) >= 30 and {c for c, _ in FAULTS.values()} == {"pipelines", "reports", "results",
                                                                      "processes", "values"}


# ------------------------------------------------------------------ (a) pipelines

FAKESYS = "fakesys"
def fake_system(tmp_path: Path, steps: list[str]) -> World:
    """A World whose system ``fakesys`` has a _steps.py of ``steps`` (Step(...) sources) and the step scripts."""
    w = World(tmp_path, systems=())
    write_fake_system(w.root, FAKESYS, steps)
    w.reports0 = w.reports()
    return w


def pipeline(w: World, *args, env, system=FAKESYS, timeout=120) -> subprocess.CompletedProcess:
    return run([PY, "-m", "common", "pipeline", "--root", w.root, "--system", system, *args], env, timeout=timeout)


def good_pipeline_run(w: World, env, only="a") -> Path:
    """An earlier pipeline run that ended ok (it refreshes the stand-in page): the state to keep."""
    out = pipeline(w, "--only", only, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    d = w.root / FAKESYS / "results" / "06_full_pipeline"
    w.kept[d] = snapshot(d)
    w.reports0 = w.reports()
    return d


def final_line(stdout: str, title: str) -> str:
    """The pipeline's closing status line (its first line starts with the same title)."""
    return [ln for ln in stdout.splitlines() if ln.startswith(title + ": ")][-1]


@covers("pipeline-no-gpu", "pipeline-cpu-only-torch")
@pytest.mark.parametrize("system, fault", [("flashinfer", "pipeline-no-gpu"), ("mini-sglang", "pipeline-no-gpu"),
                                           ("sglang", "pipeline-no-gpu"), ("flashinfer", "pipeline-cpu-only-torch"),
                                           ("sglang", "pipeline-cpu-only-torch")])
def test_the_real_pipeline_on_a_machine_without_a_gpu(tmp_path, pids, system, fault):
    """A pipeline as a new user runs it after `make test`: its real 06_full_pipeline.sh, _steps.py and step scripts
    (copied into the World with the real report pages), no torch / a CPU-only torch. What every step needs is
    checked once (_steps.py NEEDS, the steps' own check): its one [setup] line, and no step runs (issue #38: the
    FlashInfer pipeline printed the torch line 8 times, once per step, and ended 'failed')."""
    w = World(tmp_path, systems=(system,), scripts=True)
    w.seed(system, "06_full_pipeline", files=("steps.csv",), script=w.root / system / "scripts" / "06_full_pipeline.sh")
    results = snapshot(w.root / system / "results")
    if fault == "pipeline-no-gpu":
        env = env_for(tmp_path, smi="fail", PYTHONPATH=blocked(tmp_path, "torch"))
        setup = ("[setup] Python package 'torch' is not importable (ModuleNotFoundError: No module named 'torch'). "
                 "Install it: pip install -r requirements.txt")
    else:
        env = env_for(tmp_path, smi="h200", PYTHONPATH=FAKES / "cpu_torch")
        setup = ("[setup] torch 2.11.0+cpu is a CPU-only build (no CUDA). Install the CUDA build: "
                 "pip install -r requirements.txt")
    env.update(HANDS_ON_PIPELINE_ROOT=str(w.root), PYTHON=PY)
    out = run(["bash", REPO / system / "scripts" / "06_full_pipeline.sh", "--quick"], env)
    assert out.returncode == 2 and out.stdout == "", out.stdout + out.stderr
    assert lines(out.stderr) == [f"{setup} -- every step of this pipeline needs it: no step was run"]
    assert snapshot(w.root / system / "results") == results              # nothing recorded, nothing moved
    assert not (tmp_path / "cache" / "servers").exists()             # no server launched
    w.check()


@covers("make-quick-no-gpu")
@pytest.mark.parametrize("goal, smi, extra", [("quick", "missing", ()), ("quick", "fail", ()),
                                              ("all", "fail", ("SKIP_SETUP=1",)), ("quick", "missing", ("SKIP_SETUP=1",))])
def test_make_quick_without_a_gpu_stops_in_one_line_before_installing(tmp_path, pids, goal, smi, extra):
    """Issue #38: on a machine without a usable GPU, `make quick` installed the 9.2 GB GPU stack, then failed over
    many lines. Now one line and exit 2 before anything runs (`make -n` shows what would run: nothing); with a GPU
    the same command goes on, and make test / check / reports never ask for one."""
    if not shutil.which("make"):
        pytest.skip("make is not installed")
    root = tmp_path / "repo"
    (root / "tests").mkdir(parents=True)
    for f in ("Makefile", "requirements.txt", "tests/requirements.txt"):
        shutil.copy(REPO / f, root / f)
    env = env_for(tmp_path, smi="fail")
    if smi == "missing":                      # a PATH with what the check uses, and no nvidia-smi
        b = tmp_path / "bin-no-smi"
        b.mkdir()
        for tool in ("timeout", "head"):
            (b / tool).symlink_to(shutil.which(tool))
        env["PATH"] = str(b)
    make = shutil.which("make")
    out = run([make, "--no-print-directory", "-n", "-C", root, goal, *extra], env)
    why = (r"there is no nvidia-smi on PATH here" if smi == "missing" else
           r"nvidia-smi -L found none here \(NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
           r"driver\. Make sure that the latest NVIDIA driver is installed and running\.\)")
    assert out.returncode == 2 and out.stdout == "", out.stdout + out.stderr
    (line,) = lines(out.stderr)
    assert re.fullmatch(rf"Makefile:\d+: \*\*\* \[setup\] make {goal} needs an NVIDIA GPU: {why}; nothing was installed "
                        r"or run \(without a GPU: make test, make check, make reports\)\.  Stop\.", line), line
    assert not (root / ".venv").exists()
    gpu = env_for(tmp_path, smi="h200")                    # with a GPU it goes on (-n: prints, runs nothing)
    ok = run([make, "--no-print-directory", "-n", "-C", root, goal, *extra], gpu)
    assert ok.returncode == 0 and f"-m common pipelines --{goal} flashinfer mini-sglang sglang" in ok.stdout, \
        ok.stdout + ok.stderr
    assert ("python3 -m venv .venv" in ok.stdout) == (not extra)
    for other in ("test", "check", "reports"):             # need no GPU: not even asked
        assert run([make, "--no-print-directory", "-n", "-C", root, other], env).returncode == 0


@covers("pipeline-ctrl-c", "pipeline-sigterm")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["pipeline-ctrl-c", "pipeline-sigterm"])
def test_an_interrupted_pipeline_keeps_reports_and_the_last_good_run(tmp_path, pids, sig):
    w = fake_system(tmp_path, ['Step("a", "ok.py")', 'Step("long", "sleep.py")', 'Step("never", "marker.py")'])
    env = env_for(tmp_path)
    good_pipeline_run(w, env)
    pids_file = w.root / FAKESYS / "scripts" / "pids.txt"
    p = subprocess.Popen([PY, "-m", "common", "pipeline", "--root", str(w.root), "--system", FAKESYS], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids.append(p.pid)
    t0 = time.time()
    while not pids_file.exists() and time.time() - t0 < 60 and p.poll() is None:
        time.sleep(0.05)
    assert pids_file.exists(), "the sleeping step never started"
    pids.extend(int(x) for x in pids_file.read_text().split())
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err == "" and TB not in out, out + err
    assert re.search(r"^\[2/3\] long\s+interrupted  in \d+s$", out, re.M) and "[3/3]" not in out
    assert re.fullmatch(r"fakesys pipeline --quick: interrupted — 1/2 steps ok in \d+s; results and logs: "
                        r"fakesys/results/\.failed/06_full_pipeline/[\d-]+-interrupted",
                        final_line(out, "fakesys pipeline --quick"))
    assert out.rstrip().endswith("interrupted: the running step's process group was stopped, no further step ran; "
                                 "reports not refreshed.")
    assert not (w.root / FAKESYS / "scripts" / "marker.txt").exists()
    assert procs.wait_gone(pids, 15), [q for q in pids if procs.alive(q)]
    w.check()


@covers("pipeline-step-fails", "pipeline-step-missing")
@pytest.mark.parametrize("step, line", [
    ('Step("check", "fail.py")', r"\[2/2\] check\s+failed \(exit 1\)  in \d+s"),
    ('Step("renamed", "gone.py")', r"\[2/2\] renamed\s+missing: fakesys/scripts/gone\.py does not exist"),
], ids=["pipeline-step-fails", "pipeline-step-missing"])
def test_a_pipeline_with_a_bad_step_is_partial(tmp_path, pids, step, line):
    w = fake_system(tmp_path, ['Step("a", "ok.py")', step])
    env = env_for(tmp_path)
    good_pipeline_run(w, env)
    out = pipeline(w, env=env)
    assert out.returncode == 1 and out.stderr == "" and TB not in out.stdout, out.stdout + out.stderr
    assert re.search(rf"^{line}$", out.stdout, re.M), out.stdout
    if "fail.py" in step:      # the step's own one line, its traceback in a file of its own
        (tb,) = (tmp_path / "cache" / "errors").iterdir()
        assert f"[failed] RuntimeError: the kernel check failed (traceback: {tb})" in out.stdout.splitlines()
    assert re.fullmatch(r"fakesys pipeline --quick: partial — 1/2 steps ok in \d+s; results and logs: "
                        r"fakesys/results/\.failed/06_full_pipeline/[\d-]+-partial",
                        final_line(out.stdout, "fakesys pipeline --quick"))
    assert out.stdout.rstrip().endswith("reports not refreshed: the pipeline ended partial (only a run whose every "
                                        "step is ok refreshes them).")
    w.check()


@covers("pipeline-results-unwritable")
def test_a_pipeline_whose_results_folder_cannot_be_written(tmp_path, pids):
    w = fake_system(tmp_path, ['Step("m", "marker.py")'])
    (w.root / FAKESYS / "results").write_text("a file where the results folder should be\n")
    out = pipeline(w, env=env_for(tmp_path))
    assert out.returncode == 2 and TB not in out.stdout + out.stderr
    res = w.root / FAKESYS / "results"
    assert lines(out.stderr) == [f"[setup] results folder {res / '06_full_pipeline'} cannot be made: {res} is a file, "
                                 "not a folder (move it away); no step was run"]
    assert not (w.root / FAKESYS / "scripts" / "marker.txt").exists()
    w.check()


PIPELINE_DISK_FULL = """
import errno, sys
sys.path.insert(0, {repo!r})
from common.capture import store
real = store.write_json_atomic
def full(p, data):
    if ".partial-06_full_pipeline" in str(p):
        raise OSError(errno.ENOSPC, "No space left on device")
    return real(p, data)
store.write_json_atomic = full
from common.base.checks import run_main
from common.run.pipeline import main
sys.argv = ["python -m common pipeline", *sys.argv[1:]]
run_main(main)
"""


@covers("pipeline-disk-full-recording")
def test_a_pipeline_that_cannot_record_its_run_refreshes_nothing(tmp_path, pids):
    w = fake_system(tmp_path, ['Step("a", "ok.py")'])
    env = env_for(tmp_path)
    good_pipeline_run(w, env)
    out = run([PY, "-c", PIPELINE_DISK_FULL.format(repo=str(REPO)), "--root", w.root, "--system", FAKESYS], env)
    assert out.returncode == 1 and TB not in out.stdout + out.stderr, out.stdout + out.stderr
    final = w.root / FAKESYS / "results" / "06_full_pipeline"
    (err,) = lines(out.stderr)
    assert re.fullmatch(re.escape("python -m common pipeline: could not record the run: ResultsError: results of "
                                  f"06_full_pipeline not saved ([Errno 28] No space left on device while finishing); "
                                  f"{final} left as it was; record in {final.parent / '.failed' / '06_full_pipeline'}/")
                        + r"[\d-]+-failed", err), err
    assert re.search(r"^fakesys pipeline --quick: ok — 1/1 steps ok in \d+s; the run could not be recorded$",
                     out.stdout, re.M)
    assert out.stdout.rstrip().endswith("reports not refreshed: the pipeline's own record could not be written "
                                        "(the line above says why).")
    w.check()


@covers("pipeline-missing-package")
def test_a_pipeline_without_pandas_and_matplotlib(tmp_path, pids):
    """The runner needs neither; a step that imports one says which, with the install command."""
    w = fake_system(tmp_path, ['Step("a", "ok.py")', 'Step("table", "needs.py", quick=("pandas",))',
                               'Step("plot", "needs.py", quick=("matplotlib",))'])
    env = env_for(tmp_path, PYTHONPATH=blocked(tmp_path, "pandas", "matplotlib"))
    good_pipeline_run(w, env)
    out = pipeline(w, env=env)
    assert out.returncode == 1 and out.stderr == "" and TB not in out.stdout, out.stdout
    assert [ln for ln in out.stdout.splitlines() if ln.startswith("[setup]")] == [
        f"[setup] Python package '{m}' is not importable (ModuleNotFoundError: No module named '{m}'). "
        f"Install it: pip install {m}" for m in ("pandas", "matplotlib")]
    assert re.search(r"^\[2/3\] table\s+setup-error \(exit 2\)", out.stdout, re.M)
    assert "partial — 1/3 steps ok" in out.stdout
    assert list((w.root / FAKESYS / "results" / ".failed" / "06_full_pipeline").glob("*/steps.csv"))  # no pandas
    w.check()


# ------------------------------------------------------------------ (b) reports

def report_cmd(w: World, env, *args, timeout=120) -> subprocess.CompletedProcess:
    """`python -m common report` of the World's own copy of common/ (its REPO_ROOT is the World)."""
    return run([PY, "-m", "common", "report", *args], env, cwd=w.root, timeout=timeout)


def make_reports(w: World, env, *args) -> subprocess.CompletedProcess:
    if not shutil.which("make"):
        pytest.skip("make is not installed")
    return run(["make", "--no-print-directory", "-C", w.root, "reports", f"PYTHON={PY}", *args], env)


def totals(stdout: str) -> str:
    return lines(stdout)[-1]



@covers("report-mixed-machines")
def test_a_run_from_another_gpu_makes_the_pages_its_own(tmp_path, pids):
    """A run on a GPU model no committed page shows: the pages it appears on become that machine's, whole. Its blocks
    carry its run; every other block of those pages says this run did not measure it and names the command; the
    hand-written text stays byte for byte; no page mixes machines (before: refused, or a page mixing 3 machines)."""
    w = World(tmp_path, systems=("flashinfer",), code=True)
    pages0 = {p.name: p.read_text() for p in (w.root / "flashinfer" / "reports").glob("*.md")}
    w.seed("flashinfer", "03_profile_decode", gpu=OTHER_GPU, torch="2.10.0", commit="abc1234", keep=False,
           story="STORY of 03 on the A100\n└── CUDA cores, batch 32\n    └── a kernel")   # the branch the page shows
    out = make_reports(w, env_for(tmp_path))
    assert out.returncode == 0 and out.stderr == "" and TB not in out.stdout, out.stdout + out.stderr
    assert not [ln for ln in lines(out.stdout) if "mixes runs" in ln or ln.startswith("skipped ")], out.stdout
    own = [n for n, t0 in pages0.items() if "<!-- auto:03_profile_decode/" in t0]
    assert own
    for name, before in pages0.items():
        after = (w.root / "flashinfer" / "reports" / name).read_text()
        assert report.BLOCK.sub("", after) == report.BLOCK.sub("", before), name      # hand-written text, byte for byte
        for m in report.BLOCK.finditer(after):
            key, body = m.group("key"), m.group("body")
            if key.startswith("03_profile_decode/"):
                assert body.startswith(f"<!-- run: 1x {OTHER_GPU} · ") or body.startswith(
                    f"_Not measured in this run on 1x {OTHER_GPU}: 03_profile_decode's run has no "), (name, key, body)
            elif report._stem_of(key):
                stem = key.split("/", 1)[0]
                assert body.startswith(f"_Not measured in this run on 1x {OTHER_GPU}: no run of {stem}; `") and \
                    f"{stem}" in body.split("; `", 1)[1] and body.endswith("` measures it._\n"), (name, key, body)
        header = after[after.index("<!-- auto:runs -->"):].split("<!-- /auto -->")[0] if "auto:runs" in after else ""
        assert "mixes" not in header and "H100" not in header and "H200" not in header, (name, header)
    w.check(reports=False)


@covers("report-older-or-other-gpu-run")
def test_runs_of_two_machines_give_the_newest_ones_pages(tmp_path, pids):
    """Runs of two machines in results/ (copied in, or left from another GPU): the pages are the machine of the newest
    run; the other's run is one line and none of its figures is shown (ACCEPT_MIXED=1: both, and the page says it
    mixes them)."""
    w = World(tmp_path, systems=("flashinfer",), code=True)
    w.seed("flashinfer", "03_profile_decode", gpu=OTHER_GPU, torch="2.10.0", commit="abc1234", keep=False,
           date="2026-12-01T10:00:00Z")
    w.seed("flashinfer", "02_profile_prefill", gpu=PAGE_GPU, keep=False, date="2026-11-30T10:00:00Z")
    out = make_reports(w, env_for(tmp_path))
    assert out.returncode == 0 and out.stderr == "" and TB not in out.stdout, out.stdout + out.stderr
    (line,) = [ln for ln in lines(out.stdout) if ln.startswith("skipped ")]
    assert line == ("skipped flashinfer/results/02_profile_prefill/summary.json: its run on 1x NVIDIA H100 80GB HBM3 is "
                    f"not this refresh's machine (1x {OTHER_GPU}, that of the newest run): a page shows one machine's "
                    "runs (`make reports ACCEPT_MIXED=1` puts them beside)")
    pages = "".join(p.read_text() for p in (w.root / "flashinfer" / "reports").glob("*.md"))
    assert "<!-- run: 1x NVIDIA H100 80GB HBM3 · torch" not in pages and "STORY of 02_profile_prefill" not in pages
    mixed = make_reports(w, env_for(tmp_path), "ACCEPT_MIXED=1")
    assert any("This page mixes runs from 2 machines" in ln for ln in lines(mixed.stdout)), mixed.stdout
    w.check(reports=False)


BAD_SUMMARIES = {
    "report-old-schema": (lambda s: {k: v for k, v in s.items() if k != "schema"},
                          'no "schema" key (an older summary; reports read schema 2): re-run the script'),
    "report-no-provenance": (lambda s: {k: v for k, v in s.items() if k != "provenance"},
                             "no provenance (GPU, stack, commit, date)"),
    "report-malformed-json": (None, "not valid JSON (Expecting ',' delimiter: line 1 column 14 (char 13))"),
    "report-unfinished-run": (lambda s: {**s, "status": "failed"},
                              "status 'failed': only finished, successful runs refresh reports"),
}


@covers(*BAD_SUMMARIES)
@pytest.mark.parametrize("fault", list(BAD_SUMMARIES))
def test_a_bad_summary_is_one_line_and_changes_nothing(tmp_path, pids, fault):
    w = World(tmp_path, systems=("flashinfer",), code=True)
    d = w.seed("flashinfer", "03_profile_decode", keep=False)
    edit, why = BAD_SUMMARIES[fault]
    s = json.loads((d / "summary.json").read_text())
    (d / "summary.json").write_text(json.dumps(edit(s)) if edit else '{"schema": 2 "status": "ok"}')
    w.kept[d] = snapshot(d)
    out = report_cmd(w, env_for(tmp_path), "--quiet")
    assert out.returncode == 0 and out.stderr == "" and TB not in out.stdout, out.stdout + out.stderr
    assert lines(out.stdout)[0] == f"skipped flashinfer/results/03_profile_decode/summary.json: {why}"
    assert re.fullmatch(r"reports: \d+ block\(s\) refreshed from results, \d+ kept, 1 results file\(s\) skipped, "
                        r"0 file\(s\) changed", totals(out.stdout))
    w.check()


@covers("report-binary-table")
def test_a_table_that_is_not_text_is_said_in_its_block(tmp_path, pids):
    w = World(tmp_path, systems=("flashinfer",), code=True)
    md, m = next((p, m) for p in sorted((w.root / "flashinfer" / "reports").glob("*.md"))
                 for m in [re.search(r"<!-- auto:(\d\d_\w+)/table:(\w+)[^>]*-->", p.read_text())] if m)
    key, stem, name = m.group(0), m.group(1), m.group(2)
    d = w.seed("flashinfer", stem, files=(f"{name}.csv",), keep=False)
    (d / f"{name}.csv").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    out = report_cmd(w, env_for(tmp_path), "--quiet")
    assert out.returncode == 0 and TB not in out.stdout + out.stderr
    assert (f"skipped flashinfer/results/{stem}/{name}.csv: not text (undecodable byte 0x89 at "
            "offset 0)") in lines(out.stdout)
    body = md.read_text().split(key)[1].split("<!-- /auto -->")[0]
    assert body.startswith(f"\n_Not measured in this run on 1x {PAGE_GPU}: {stem}'s run has no {name}") and \
        "(skipped: not text (undecodable byte 0x89 at offset 0))" in body       # never another run's table
    pages = "".join(p.read_text() for p in (w.root / "flashinfer" / "reports").glob("*.md"))
    assert f"STORY of {stem}" in pages                             # the rest of that run refreshed
    w.check(reports=False)


@covers("report-pandas-missing", "report-matplotlib-missing")
@pytest.mark.parametrize("package", ["pandas", "matplotlib"],
                         ids=["report-pandas-missing", "report-matplotlib-missing"])
def test_make_reports_without_an_optional_package_renders_the_same(tmp_path, pids, package):
    pages = {}
    for label, block in (("with", None), ("without", package)):
        w = World(tmp_path / label, systems=("flashinfer",), code=True)
        d = w.seed("flashinfer", "03_profile_decode", files=("cross_check.csv", "kernels.csv"), keep=False)
        (d / "roofline.png").write_bytes(b"\x89PNG fake figure")
        env = env_for(tmp_path, **({"PYTHONPATH": blocked(tmp_path, block)} if block else {}))
        out = make_reports(w, env)
        assert out.returncode == 0 and out.stderr == "" and TB not in out.stdout, out.stdout + out.stderr
        assert re.search(r"reports: \d+ block\(s\) refreshed from results", totals(out.stdout))
        pages[label] = w.reports()
        no_partials(w.root)
    assert pages["with"] == pages["without"] and pages["with"] != World(tmp_path / "fresh", ("flashinfer",)).reports()


RENDER_ERROR = """
import sys
sys.path.insert(0, ".")
from common.base.checks import run_main
from common.render import report
real = report.Renderer._body
def body(self, stem, what, s):
    if stem == "99_last":
        raise KeyError("boom")
    return real(self, stem, what, s)
report.Renderer._body = body
run_main(report.main)
"""


@covers("report-render-error-last-file")
def test_an_error_rendering_the_last_file_writes_no_file(tmp_path, pids):
    w = World(tmp_path, systems=("flashinfer", "sglang"), code=True)
    last = w.root / "sglang" / "reports" / "zz-last.md"            # the page rendered last
    last.write_text("# last\n\n<!-- auto:99_last/story -->\nold\n<!-- /auto -->\n")
    w.reports0 = w.reports()
    w.seed("flashinfer", "03_profile_decode", files=("roofline.png",))          # refreshes earlier pages + a figure
    w.seed("sglang", "99_last")
    out = run([PY, "-c", RENDER_ERROR], env_for(tmp_path), cwd=w.root)
    assert out.returncode == 1 and out.stderr == "" and TB not in out.stdout, out.stdout + out.stderr
    assert lines(out.stdout) == ["[failed] reports not refreshed, no file written: sglang/reports/zz-last.md: "
                                 "block 99_last/story: KeyError: 'boom'"]
    w.check()                                   # the figure of the earlier page too: byte for byte


@covers("report-clean-clone")
def test_a_clone_without_results_keeps_every_report_byte_for_byte(tmp_path, pids):
    w = World(tmp_path, systems=("flashinfer", "mini-sglang", "sglang"), code=True)
    env = env_for(tmp_path)
    for out in (make_reports(w, env), report_cmd(w, env)):
        assert out.returncode == 0 and out.stderr == "" and TB not in out.stdout, out.stdout + out.stderr
        # (the runs headers render from the blocks' hidden run lines, so they count as refreshed; nothing changes)
        assert re.fullmatch(r"reports: \d+ block\(s\) refreshed from results, \d+ kept, 0 results file\(s\) skipped, "
                            r"0 file\(s\) changed", totals(out.stdout))
        assert not [ln for ln in out.stdout.splitlines() if ln.startswith(("updated ", "skipped ", "[failed]"))]
        w.check()


@covers("report-ctrl-c-during-imports")
def test_ctrl_c_while_the_report_module_imports(tmp_path, pids):
    """The first 0.2 s of `make reports` are imports; the World's copy of common/base/story.py (imported by the report
    module) sleeps at import so that the Ctrl-C lands there. Before: a KeyboardInterrupt traceback."""
    w = World(tmp_path, systems=("flashinfer",), code=True)
    w.seed("flashinfer", "03_profile_decode")                   # a refresh would change the pages
    story = w.root / "common" / "base" / "story.py"
    story.write_text(story.read_text() + "\nimport pathlib as _p, time as _t\n"
                     "_p.Path(__file__).with_name('importing').touch()\n_t.sleep(30)\n")
    p = subprocess.Popen([PY, "-m", "common", "report"], cwd=w.root, env=env_for(tmp_path), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    pids.append(p.pid)
    t0 = time.time()
    while not (w.root / "common" / "base" / "importing").exists() and time.time() - t0 < 30:
        time.sleep(0.02)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130 and out == "" and TB not in err, err
    assert lines(err) == ["[interrupted] stopped by Ctrl-C; earlier results were left as they were."]
    w.check()
    story.write_text(story.read_text().split("\nimport pathlib as _p")[0])     # once main runs: Ctrl-C raises again
    rep = w.root / "common" / "render" / "report.py"                                       # (run_main's cleanup and line)
    rep.write_text(rep.read_text().replace("    a = p.parse_args(argv)\n", "    a = p.parse_args(argv)\n    sig = "
                   "__import__('signal')\n    print('SIGINT raises:', sig.getsignal(2) is sig.default_int_handler)\n"))
    out = report_cmd(w, env_for(tmp_path), "--quiet")
    assert out.returncode == 0 and lines(out.stdout)[0] == "SIGINT raises: True", out.stdout + out.stderr


SLOW_START = "import pathlib, time\npathlib.Path({mark!r}).touch()\ntime.sleep(1.5)\n"   # sitecustomize: Python's start-up


@covers("report-make-ctrl-c")
@pytest.mark.parametrize("when", ["python-start-up", "common-imports", "report-main"])
def test_ctrl_c_in_make_reports_is_one_line(tmp_path, pids, when):
    """`make reports` and Ctrl-C: SIGINT to make's process group (what a terminal does) while Python starts (a
    sitecustomize that sleeps: before common/__init__.py can take SIGINT over), while common/ imports (the World's
    story.py sleeps), or while the report runs (its main sleeps). Before: a KeyboardInterrupt traceback from Python's
    start-up, and 'make: *** [Makefile:NN: reports] Error 130' (or 'Interrupt') after the line."""
    if not shutil.which("make"):
        pytest.skip("make is not installed")
    w = World(tmp_path, systems=("flashinfer",), code=True)
    w.seed("flashinfer", "03_profile_decode")                   # a refresh would change the pages
    mark = tmp_path / "reached"
    env = env_for(tmp_path)
    if when == "python-start-up":
        (tmp_path / "site").mkdir()
        (tmp_path / "site" / "sitecustomize.py").write_text(SLOW_START.format(mark=str(mark)))
        env["PYTHONPATH"] = str(tmp_path / "site")
    elif when == "common-imports":
        story = w.root / "common" / "base" / "story.py"
        story.write_text(story.read_text() + f"\nimport pathlib as _p, time as _t\n_p.Path({str(mark)!r}).touch()\n"
                         "_t.sleep(30)\n")
    else:
        rep = w.root / "common" / "render" / "report.py"
        rep.write_text(rep.read_text().replace("    a = p.parse_args(argv)\n", "    a = p.parse_args(argv)\n    "
                       f"__import__('pathlib').Path({str(mark)!r}).touch(); __import__('time').sleep(30)\n", 1))
    claims = set(Path(tempfile.gettempdir()).glob("hands-on-sigint-*"))
    p = subprocess.Popen(["make", "--no-print-directory", "-C", str(w.root), "reports", f"PYTHON={PY}"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    pids.append(p.pid)
    t0 = time.time()
    while not mark.exists() and time.time() - t0 < 30 and p.poll() is None:
        time.sleep(0.01)
    assert mark.exists(), p.communicate(timeout=30)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == -signal.SIGINT, (p.returncode, out, err)       # make died of SIGINT: 130 in a shell
    assert out == "" and lines(err) == ["[interrupted] stopped by Ctrl-C; earlier results were left as they were."], err
    assert set(Path(tempfile.gettempdir()).glob("hands-on-sigint-*")) <= claims          # its claim file removed
    w.check()


REPORT_DISK_FULL = """
import errno, sys
from pathlib import Path
sys.path.insert(0, ".")
from common.base.checks import run_main
from common.render import report
real, n = Path.write_bytes, [0]
def write_bytes(self, data):
    if self.name.endswith(".tmp"):
        n[0] += 1
        if n[0] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
    return real(self, data)
Path.write_bytes = write_bytes
run_main(report.main)
"""


@covers("report-disk-full")
def test_a_full_disk_while_writing_the_reports_writes_no_file(tmp_path, pids):
    w = World(tmp_path, systems=("flashinfer",), code=True)
    w.seed("flashinfer", "02_profile_prefill", files=("roofline.png",))   # a page and a figure to write
    out = run([PY, "-c", REPORT_DISK_FULL], env_for(tmp_path), cwd=w.root)
    assert out.returncode == 1 and out.stderr == "" and TB not in out.stdout, out.stdout + out.stderr
    (line,) = lines(out.stdout)
    assert re.fullmatch(r"\[failed\] reports not refreshed, no file written: cannot write flashinfer/reports/\S+: "
                        r"\[Errno 28\] No space left on device", line), line
    w.check()


def _damage(text: str, how: str) -> tuple[str, str]:
    """A real report page with its markers unbalanced ``how``; (the page, what the one line says after its name)."""
    ls = text.split("\n")
    opens = [i for i, ln in enumerate(ls) if ln.startswith("<!-- auto:")]
    closes = [i for i, ln in enumerate(ls) if ln == "<!-- /auto -->"]
    if how == "missing-close":           # the second block loses its closing marker: the third opens inside it
        del ls[closes[1]]
        return "\n".join(ls), (f"line {opens[1] + 1}: {ls[opens[1]]} has no closing <!-- /auto --> before the next "
                                f"block opens (line {opens[2]})")
    if how == "stray-close":             # a closing marker in the prose after the first block
        ls.insert(closes[0] + 1, "<!-- /auto -->")
        return "\n".join(ls), f"line {closes[0] + 2}: <!-- /auto --> closes no block"
    del ls[closes[-1]]                   # the last block is never closed
    return "\n".join(ls), f"line {opens[-1] + 1}: {ls[opens[-1]]} has no closing <!-- /auto -->"


@covers("report-unbalanced-markers")
@pytest.mark.parametrize("how", ["missing-close", "stray-close", "never-closed"])
def test_a_page_with_unbalanced_markers_is_refused_whole(tmp_path, pids, how):
    """`python -m common report` over a real page whose markers do not pair up: before, the block swallowed the prose and the
    next block's opening marker; now nothing is written and the line names the file and the line."""
    w = World(tmp_path, systems=("sglang",), code=True)
    page = w.root / "sglang" / "reports" / "analysis.md"
    text, said = _damage(page.read_text(), how)
    page.write_text(text)                                     # an uncommitted edit: kept byte for byte too
    w.reports0 = w.reports()
    w.seed("sglang", "08_execution_story", files=("table.csv", "timeline.png"))   # would refresh that page
    out = report_cmd(w, env_for(tmp_path))
    assert out.returncode == 1 and out.stderr == "" and TB not in out.stdout, out.stdout + out.stderr
    assert lines(out.stdout) == [f"[failed] reports not refreshed, no file written: sglang/reports/analysis.md {said}"]
    w.check()


# ------------------------------------------------------------------ (c) results folders

DEMO_PAGE = "# Demo\n\n<!-- auto:01_demo/story -->\ncommitted story\n<!-- /auto -->\n"


def demo_world(tmp_path) -> tuple[World, Path]:
    """A World with a stand-in page and an earlier good run at demo/results/01_demo (the --out of the cases)."""
    w = World(tmp_path, systems=(), page=DEMO_PAGE)
    out = w.root / "demo" / "results" / "01_demo"
    w.seed("demo", "01_demo", out=out, files=("table.csv", "old_only.txt"), script=EXPERIMENT)
    return w, out


@covers("results-whole-run")
def test_a_new_run_replaces_the_folder_whole(tmp_path, pids):
    w, out = demo_world(tmp_path)
    old = w.kept.pop(out)
    r = experiment(out, "--files", "table.csv", "--tag", "new", env=env_for(tmp_path))
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert sorted(p.name for p in out.iterdir()) == ["log.txt", "summary.json", "table.csv"]   # no old_only.txt
    assert "new" in (out / "table.csv").read_text()
    assert snapshot(out.parent / ".previous" / "01_demo") == old                                # the run it replaced
    w.check()


@covers("results-crash-between-renames")
def test_a_kill_between_the_two_renames_is_repaired_by_the_next_run(tmp_path, pids):
    w, out = demo_world(tmp_path)
    env = env_for(tmp_path)
    r = experiment(out, "--tag", "killed", "--inject", "die-between-renames", env=env)
    assert r.returncode == 137 and not out.exists()                     # as after SIGKILL: only .previous/ holds it
    assert (out.parent / ".previous" / "01_demo" / "summary.json").exists()
    assert list(out.parent.glob(".partial-*"))                          # the dead run's folder, pid gone
    nxt = experiment(out, "--fail", "the next run failed", env=env)
    (kept,) = (out.parent / ".failed" / "01_demo").iterdir()
    assert nxt.returncode == 1 and lines(nxt.stderr) == [f"[failed] RuntimeError: the next run failed (traceback: "
                                                         f"{kept / 'error.txt'})"]
    w.check()                                                           # put back byte for byte, no .partial left


@covers("results-final-replace-fails", "results-disk-full-writing", "results-disk-full-finishing")
@pytest.mark.parametrize("inject, what", [
    ("eio-replace", "[Errno 5] Input/output error while finishing"),
    ("enospc-table", "[Errno 28] No space left on device"),
    ("enospc-finish", "[Errno 28] No space left on device while finishing"),
], ids=["results-final-replace-fails", "results-disk-full-writing", "results-disk-full-finishing"])
def test_a_run_that_cannot_be_saved_leaves_the_last_one(tmp_path, pids, inject, what):
    w, out = demo_world(tmp_path)
    r = experiment(out, "--tag", "new", "--inject", inject, env=env_for(tmp_path))
    (rec,) = (out.parent / ".failed" / "01_demo").iterdir()
    assert r.returncode == 2 and r.stdout == "" and TB not in r.stderr
    assert lines(r.stderr) == [f"[setup] results of experiment not saved ({what}); {out} left as it was; "
                               f"record in {rec}"]
    assert json.loads((rec / "summary.json").read_text())["status"] in ("failed", "setup-error")
    assert what.split(" while")[0] in (rec / "error.txt").read_text()
    w.check()


@covers("results-failed-runs-pruned")
def test_failed_runs_are_pruned_to_the_last_five(tmp_path, pids):
    w, out = demo_world(tmp_path)
    env = env_for(tmp_path)
    for i in range(5):
        r = experiment(out, "--tag", f"t{i}", "--fail", f"attempt {i}", env=env)
        assert r.returncode == 1 and len(lines(r.stderr)) == 1 and f"attempt {i}" in r.stderr
    for i in (5, 6):                                      # and two runs stopped with Ctrl-C
        p = subprocess.Popen([PY, str(EXPERIMENT), "--out", str(out), "--tag", f"t{i}", "--ready", "--hold", "30"],
                             env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        pids.append(p.pid)
        assert p.stdout.readline().startswith("READY")
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 130 and lines(err)[0].startswith("[interrupted] stopped by Ctrl-C; earlier results")
    kept = sorted((out.parent / ".failed" / "01_demo").iterdir())
    assert len(kept) == store.KEEP_FAILED == 5
    summaries = [json.loads((k / "summary.json").read_text()) for k in kept]
    assert [(s["args"]["tag"], s["status"]) for s in summaries] == [
        ("t2", "failed"), ("t3", "failed"), ("t4", "failed"), ("t5", "interrupted"), ("t6", "interrupted")]
    w.check()


@covers("results-failed-runs-bounded")
def test_failed_runs_on_a_full_disk_keep_only_their_small_record(tmp_path, pids):
    """Seven runs that each wrote 2 MB, then met a full disk: each line as before, each record small, at most
    KEEP_FAILED of them. Before, each record kept the run's big.bin: the failed records themselves filled the disk."""
    w, out = demo_world(tmp_path)
    env = env_for(tmp_path)
    for i in range(7):
        r = experiment(out, "--tag", f"t{i}", "--big", "2", "--inject", "enospc-table", env=env)
        rec = sorted((out.parent / ".failed" / "01_demo").iterdir())[-1]
        assert r.returncode == 2 and r.stdout == "" and TB not in r.stderr, r.stderr
        assert lines(r.stderr) == [f"[setup] results of experiment not saved ([Errno 28] No space left on device); "
                                   f"{out} left as it was; record in {rec}"]
        assert sorted(p.name for p in rec.iterdir()) == ["error.txt", "summary.json"], list(rec.iterdir())
        assert json.loads((rec / "summary.json").read_text())["args"]["tag"] == f"t{i}"
    kept = list((out.parent / ".failed" / "01_demo").iterdir())
    assert len(kept) == store.KEEP_FAILED and sum(f.stat().st_size for f in (out.parent / ".failed").rglob("*")
                                                   if f.is_file()) < 200_000
    w.check()


REANALYSE_DISK_FULL = """
import errno, runpy, sys
sys.path.insert(0, {repo!r})
from common.run import results
def table(self, name, rows):
    raise OSError(errno.ENOSPC, "No space left on device")
results.Run.table = table
sys.argv = [{script!r}, *sys.argv[1:]]
runpy.run_path({script!r}, run_name="__main__")
"""


@covers("results-failed-runs-bounded")
def test_a_reanalysis_on_a_full_disk_keeps_a_small_record(tmp_path, pids):
    """04_nsys_profile.py --reanalyse copies the recording's nsys tables into its run, then its first table meets a full
    disk: the record keeps summary.json and error.txt, not the copies (before: the whole run folder, copies included)."""
    w = World(tmp_path)
    out = w.root / "results" / "04_nsys_profile"
    w.seed("sglang", "04_nsys_profile", out=out)
    script = str(REPO / "sglang" / "scripts" / "04_nsys_profile.py")
    r = run([PY, "-c", REANALYSE_DISK_FULL.format(repo=str(REPO), script=script), "--reanalyse",
             reanalysis_source(tmp_path), "--out", out], env_for(tmp_path))
    (rec,) = (out.parent / ".failed" / "04_nsys_profile").iterdir()
    assert r.returncode == 2 and TB not in r.stdout + r.stderr, r.stdout + r.stderr
    assert lines(r.stderr) == [f"[setup] results of 04_nsys_profile not saved ([Errno 28] No space left on device); "
                               f"{out} left as it was; record in {rec}"]
    assert sorted(p.name for p in rec.iterdir()) == ["error.txt", "summary.json"]
    w.check()


@covers("results-failed-runs-bounded")
def test_failed_runs_stay_within_their_byte_bound(tmp_path, pids):
    """Four failed runs of 2 MB each with a 3 MiB bound (store.KEEP_FAILED_BYTES, set small by --inject): the newest
    keeps its files, each older one only as long as they fit together; the rest keep summary.json and error.txt."""
    w, out = demo_world(tmp_path)
    env = env_for(tmp_path)
    for i in range(4):
        r = experiment(out, "--tag", f"t{i}", "--big", "2", "--fail", f"attempt {i}", "--inject", "failed-budget-3mb",
                       env=env)
        assert r.returncode == 1 and len(lines(r.stderr)) == 1 and f"attempt {i}" in r.stderr
    kept = sorted((out.parent / ".failed" / "01_demo").iterdir())
    whole, small = ["big.bin", "error.txt", "log.txt", "summary.json", "table.csv"], ["error.txt", "summary.json"]
    assert [sorted(p.name for p in k.iterdir()) for k in kept] == [small, small, whole, whole]
    assert [json.loads((k / "summary.json").read_text())["args"]["tag"] for k in kept] == ["t0", "t1", "t2", "t3"]
    w.check()


@covers("results-concurrent-failures")
def test_two_failing_runs_at_once_keep_their_own_error_files(tmp_path, pids):
    w, out = demo_world(tmp_path)
    env = env_for(tmp_path)
    # at the same moment, with the same time stamp (as two runs failing in one microsecond would have)
    cmd = [PY, str(EXPERIMENT), "--out", str(out), "--inject", "fixed-stamp"]
    ps = [subprocess.Popen(cmd + ["--tag", t, "--fail", f"boom {t}"], env=env, cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True) for t in "AB"]
    pids.extend(p.pid for p in ps)
    res = [p.communicate(timeout=60) for p in ps]
    files = []
    for p, (o, e), t in zip(ps, res, "AB"):
        (line,) = lines(e)
        m = re.fullmatch(rf"\[failed\] RuntimeError: boom {t} \(traceback: (\S+/error\.txt)\)", line)
        assert p.returncode == 1 and m, line
        files.append(Path(m.group(1)))
        text = files[-1].read_text()
        assert f"RuntimeError: boom {t}" in text and f"boom {'AB'.replace(t, '')}" not in text
    assert files[0] != files[1] and len(list((out.parent / ".failed" / "01_demo").iterdir())) == 2
    w.check()


@covers("results-tests-own-cache")
def test_the_suite_writes_nothing_into_the_users_cache(tmp_path, pids):
    """A process a test starts with the inherited environment (not env_for) fails through run_main: its
    traceback file lands in the session's temporary cache. Before, such files went to ~/.cache/hands-on/errors."""
    from common.base.checks import cache_dir
    real = Path.home() / ".cache" / "hands-on"
    assert os.environ.get("HANDS_ON_CACHE") and not cache_dir().resolve().is_relative_to(real.resolve())
    code = ("import sys\nsys.path.insert(0, %r)\nfrom common.base.checks import run_main\n"
            "def main(argv=None):\n    raise RuntimeError('boom')\nrun_main(main)\n" % str(REPO))
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60)
    m = re.fullmatch(r"\[failed\] RuntimeError: boom \(traceback: (\S+)\)", r.stderr.strip())
    assert r.returncode == 1 and m, r.stderr
    assert Path(m.group(1)).parent == cache_dir() / "errors" and Path(m.group(1)).is_file()


@covers("results-read-only")
def test_a_results_folder_that_cannot_be_written(tmp_path, pids):
    """The real 04_nsys_profile.py --reanalyse (no GPU needed) with --out in a folder nothing can be written to."""
    w = World(tmp_path)
    base = tmp_path / "ro"
    base.mkdir()
    w.seed("sglang", "04_nsys_profile", out=base / "04")
    base.chmod(0o500)
    if os.access(base, os.W_OK):
        base.chmod(0o700)
        pytest.skip("running as root: chmod does not make a folder read-only")
    try:
        r = run([PY, REPO / "sglang" / "scripts" / "04_nsys_profile.py", "--reanalyse", reanalysis_source(tmp_path),
                 "--out", base / "04"], env_for(tmp_path))
    finally:
        base.chmod(0o700)
    assert r.returncode == 2 and TB not in r.stdout + r.stderr, r.stderr
    assert lines(r.stderr) == [f"[setup] results folder {base} is not writable: [Errno 13] Permission denied "
                               "(fix its permissions or pass --out DIR)"]
    w.check()


ROOM = 255 - len(f".partial--{store._stamp()}-{os.getpid()}")     # what a name may hold beside a run's partial folder
OUT_UNUSABLE = {
    "under-a-file": (lambda t: t / "afile" / "04", lambda t, o: f"{t / 'afile'} is a file, not a folder"),
    "deeper-under-a-file": (lambda t: t / "afile" / "sub" / "04", lambda t, o: f"{t / 'afile'} is a file, not a folder"),
    "name-300": (lambda t: t / ("n" * 300), None),
    "name-just-too-long": (lambda t: t / ("n" * (ROOM + 8)), None),          # < 255, too long beside .partial-*
    "folder-300": (lambda t: t / ("d" * 300) / "04", lambda t, o: "a folder name in its path is 300 characters; this "
                                                                  "file system takes at most 255"),
}


@covers("results-out-unusable")
@pytest.mark.parametrize("how", list(OUT_UNUSABLE))
def test_an_out_that_cannot_be_a_folder_says_why(tmp_path, pids, how):
    """--out under a regular file, or with a name longer than the file system takes (with the .partial-<name>-<time>-
    <pid> beside it): before, both read '... is not writable: [Errno 20|17|36] ... (fix its permissions ...)'."""
    w = World(tmp_path)
    (tmp_path / "afile").write_text("a file\n")
    path, why = OUT_UNUSABLE[how]
    out, src, env = path(tmp_path), reanalysis_source(tmp_path), env_for(tmp_path)
    before = snapshot(tmp_path)
    r = run([PY, REPO / "sglang" / "scripts" / "04_nsys_profile.py", "--reanalyse", src, "--out", out], env)
    assert r.returncode == 2 and r.stdout == "" and TB not in r.stderr, r.stderr
    (line,) = lines(r.stderr)
    if why is None:        # the room beside .partial-<name>-<time>-<pid> depends on the digits of the run's pid
        m = re.fullmatch(re.escape(f"[setup] results folder {out} cannot be made: its name is {len(out.name)} "
                                   "characters; beside it a run writes .partial-<name>-<time>-<pid>, so this file "
                                   "system (255 a name) takes names of at most ") + r"(\d+) \(give --out another path\)",
                         line)
        assert m and 215 <= int(m.group(1)) < len(out.name), line
    else:
        assert line == f"[setup] results folder {out} cannot be made: {why(tmp_path, out)} (give --out another path)"
    assert snapshot(tmp_path) == before and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    w.check()


@covers("results-link-to-unmounted-disk")
@pytest.mark.parametrize("how", ["dangling", "parent-missing", "killed-between-renames"])
def test_a_results_link_to_an_unmounted_disk_creates_nothing(tmp_path, pids, how):
    """sglang/results/04_nsys_profile -> /mnt/disk2/... while that disk is not mounted (its mount point bare). Before,
    the run created the target's folders on the bare mount point and wrote the run there, without a word. A target
    missing because a run was killed between its two renames (its .previous there) is put back, as without a link."""
    w = World(tmp_path, scripts=True, code=True)
    mount = tmp_path / "mnt" / "disk2"
    mount.mkdir(parents=True)
    target = mount / "results" / "04_nsys_profile" if how == "parent-missing" else mount / "04_nsys_profile"
    link = w.root / "sglang" / "results" / "04_nsys_profile"
    link.parent.mkdir(parents=True)
    link.symlink_to(target, target_is_directory=True)
    script = w.root / "sglang" / "scripts" / "04_nsys_profile.py"
    if how == "killed-between-renames":      # the target is missing, but the disk is there: recover() puts it back
        seeded = w.seed("sglang", "04_nsys_profile", out=mount / ".previous" / "04_nsys_profile", script=script,
                        keep=False)
        w.kept[target] = snapshot(seeded)
    r = run([PY, script, "--reanalyse", reanalysis_source(tmp_path)], env_for(tmp_path))
    if how == "killed-between-renames":
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert json.loads((target / "summary.json").read_text())["args"]["reanalyse"] and link.is_symlink()
        w.kept[mount / ".previous" / "04_nsys_profile"] = w.kept.pop(target)      # the run it replaced, byte for byte
        return w.check()
    assert r.returncode == 2 and TB not in r.stdout + r.stderr, r.stdout + r.stderr
    assert lines(r.stderr) == [f"[setup] {link} is a link to {target}, which does not exist (is its disk mounted?); "
                               f"nothing was written: mount the disk, create {target}, or remove the link"]
    assert list(mount.iterdir()) == [] and sorted(p.name for p in link.parent.iterdir()) == ["04_nsys_profile"]
    assert link.is_symlink()
    w.check()


def reanalysis_source(tmp_path: Path) -> Path:
    """A recording 04_nsys_profile.py --reanalyse reads (no GPU needed): two nsys tables of a real H200 run."""
    src = tmp_path / "recorded"
    if not src.exists():
        src.mkdir()
        shutil.copy(FIXTURES / "sglang_nsys_cuda_gpu_trace_cut_h200.csv", src / "timeline_overlap_on_cuda_gpu_trace.csv")
        shutil.copy(FIXTURES / "sglang_nsys_nvtx_pushpop_cut_h200.csv", src / "timeline_overlap_on_nvtx_pushpop_trace.csv")
    return src


@covers("results-out-not-ours")
@pytest.mark.parametrize("target", ["reports", "clone", "special-file"])
def test_out_at_a_folder_no_run_made_is_refused(tmp_path, pids, target):
    """`04_nsys_profile.py --reanalyse DIR --out X`, twice: X the committed reports (with an uncommitted edit), a
    clone's root (.git inside), a special file (a FIFO stands for /dev/full: nothing here may move a device node).
    Before, X became .previous/ and the second run deleted it."""
    w = World(tmp_path)
    (w.root / "sglang" / "reports" / "analysis.md").write_text("# an edit not yet committed\n")
    w.reports0 = w.reports()
    if target == "reports":
        out, why = w.root / "sglang" / "reports", "is not a results folder (no summary.json of a run)"
    elif target == "clone":
        (w.root / ".git").mkdir()
        (w.root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
        out, why = w.root, "is not a results folder (no summary.json of a run)"
    else:
        out, why = tmp_path / "full", "is not a folder"
        os.mkfifo(out)
    src, env = reanalysis_source(tmp_path), env_for(tmp_path)
    before = snapshot(tmp_path)
    for _ in range(2):
        r = run([PY, REPO / "sglang" / "scripts" / "04_nsys_profile.py", "--reanalyse", src, "--out", out], env)
        assert r.returncode == 2 and r.stdout == "" and TB not in r.stderr, r.stderr
        assert lines(r.stderr) == [f"[setup] {out} {why}: a run replaces only a folder an earlier run of "
                                   "sglang/scripts/04_nsys_profile.py wrote; give --out a new folder"]
    assert snapshot(tmp_path) == before and not list(tmp_path.rglob(".previous"))
    assert target != "special-file" or out.is_fifo()
    w.check()


@covers("results-previous-kept")
@pytest.mark.parametrize("inject, what", [("eperm-previous", "[Errno 1] Operation not permitted"),
                                          ("eio-replace", "[Errno 5] Input/output error")])
def test_a_finish_that_fails_keeps_the_previous_run(tmp_path, pids, inject, what):
    """Two earlier runs (one in <stem>, one in .previous/<stem>); the old run cannot be moved aside (an immutable
    folder), or the new one cannot move in. Before, .previous/<stem> was deleted although nothing replaced it."""
    w, out = demo_world(tmp_path)
    older = w.kept.pop(out)
    w.seed("demo", "01_demo", out=out, script=EXPERIMENT, files=("table.csv", "second.txt"))
    w.kept[out.parent / ".previous" / "01_demo"] = older
    r = experiment(out, "--tag", "new", "--inject", inject, env=env_for(tmp_path))
    (rec,) = (out.parent / ".failed" / "01_demo").iterdir()
    assert r.returncode == 2 and r.stdout == "" and TB not in r.stderr, r.stderr
    assert lines(r.stderr) == [f"[setup] results of experiment not saved ({what} while finishing); {out} left as it "
                               f"was; record in {rec}"]
    w.check()


@covers("results-symlinked-entry")
def test_a_results_entry_that_links_to_another_disk_is_followed(tmp_path, pids):
    """sglang/results/04_nsys_profile -> another disk. Before, the link was moved to .previous/, a local folder took
    its place and the next run left the link as a .trash-* entry that nothing removed."""
    w = World(tmp_path, scripts=True, code=True)
    script = w.root / "sglang" / "scripts" / "04_nsys_profile.py"
    disk = tmp_path / "disk2"
    target = w.seed("sglang", "04_nsys_profile", out=disk / "04_nsys_profile", script=script, keep=False)
    seeded = snapshot(target)
    link = w.root / "sglang" / "results" / "04_nsys_profile"
    link.parent.mkdir(parents=True)
    link.symlink_to(target, target_is_directory=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (disk / "keep").mkdir()
    (disk / "keep" / "data.txt").write_text("the user's data\n")
    stale = link.parent / f".trash-04_nsys_profile-20260101-000000-000000-{dead.pid}"   # left by an older version
    stale.symlink_to(disk / "keep", target_is_directory=True)
    for _ in range(2):
        r = run([PY, script, "--reanalyse", reanalysis_source(tmp_path)], env_for(tmp_path))
        assert r.returncode == 0 and r.stderr == "", r.stderr
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert json.loads((target / "summary.json").read_text())["args"]["reanalyse"]
    prev = disk / ".previous" / "04_nsys_profile"
    assert json.loads((prev / "summary.json").read_text())["args"]["reanalyse"] and snapshot(prev) != seeded
    assert sorted(p.name for p in link.parent.iterdir()) == ["04_nsys_profile"]     # no .trash-*, no local copy
    assert (disk / "keep" / "data.txt").read_text() == "the user's data\n"
    no_partials(disk)
    w.check()


# ------------------------------------------------------------------ (d) processes

def start(out: Path, *args, env) -> tuple[subprocess.Popen, int, int]:
    """An experiment run holding a fake server: (process, server pid, port) once it said READY."""
    p = subprocess.Popen([PY, str(EXPERIMENT), "--out", str(out), "--server", "--ready", *args], env=env, cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while time.time() - t0 < 60:
        line = p.stdout.readline()
        if line.startswith("READY "):
            _, server, port = line.split()
            return p, int(server), int(port)
        if not line and p.poll() is not None:
            break
    p.kill()
    raise AssertionError(f"no READY line: {p.communicate(timeout=10)}")


def health(port: int) -> int:
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))     # never through a proxy
    with direct.open(f"http://127.0.0.1:{port}/health", timeout=5) as r:
        return r.status


@covers("proc-sigkill-leaves-server")
def test_a_server_left_by_a_sigkilled_run_is_stopped_by_the_next_run(tmp_path, pids):
    w, out = demo_world(tmp_path)
    env = env_for(tmp_path)
    a, server, port = start(out, "--server-arg=--spawn-child", "--hold", "60", env=env)
    pids.append(a.pid)
    time.sleep(0.3)
    family = [server, *procs.descendants(server)]
    pids.extend(family)
    assert len(family) == 2 and health(port) == 200
    a.kill()                                                 # SIGKILL: no handler runs, the server stays
    a.communicate(timeout=10)
    assert a.returncode == -signal.SIGKILL and all(procs.alive(p) for p in family)
    pidfiles = list((tmp_path / "cache" / "servers" / "experiment").glob("*.pid"))
    assert len(pidfiles) == 1 and json.loads(pidfiles[0].read_text())["pgid"] == server
    w.check(partials=False)                                  # the killed run changed no earlier result
    b = experiment(out, "--server", "--tag", "next", env=env)
    assert (b.returncode, b.stdout, b.stderr) == (0, "", "")
    assert procs.wait_gone(family, 5), [p for p in family if procs.alive(p)]
    log = (out / "log.txt").read_text()
    assert re.search(rf"found a process group left behind by a killed run \({pidfiles[0].name}: pid {server}, ", log)
    assert not list((tmp_path / "cache" / "servers" / "experiment").glob("*.pid"))
    no_partials(w.root)


@covers("proc-sigkill-other-script")
@pytest.mark.parametrize("next_run", ["other-script", "pipeline"])
def test_a_server_left_by_one_script_is_stopped_by_any_other(tmp_path, pids, next_run):
    """The registry of servers is one for the workbook: a run of another script (02_other.py, its own pidfile
    folder) or a pipeline finds the server a SIGKILLed run of experiment.py left. Before, only the next run of
    the same script looked, so on a GPU two servers' worth of memory stayed taken."""
    w, out = demo_world(tmp_path)
    env = env_for(tmp_path)
    a, server, _ = start(out, "--server-arg=--spawn-child", "--hold", "60", env=env)
    pids.append(a.pid)
    time.sleep(0.3)
    family = [server, *procs.descendants(server)]
    pids.extend(family)
    a.kill()
    a.communicate(timeout=10)
    assert len(family) == 2 and all(procs.alive(p) for p in family)
    (pidfile,) = (tmp_path / "cache" / "servers" / "experiment").glob("*.pid")
    found = f"found a process group left behind by a killed run ({pidfile.name}: pid {server}, "
    if next_run == "other-script":
        other = tmp_path / "02_other.py"
        other.symlink_to(EXPERIMENT)
        b = run([PY, other, "--out", w.root / "demo" / "results" / "02_other", "--server", "--tag", "next"], env)
        assert (b.returncode, b.stdout, b.stderr) == (0, "", "")
        said = (w.root / "demo" / "results" / "02_other" / "log.txt").read_text()
        assert (tmp_path / "cache" / "servers" / "02_other").is_dir()          # its own pidfile folder
    else:
        fs = fake_system(tmp_path / "p", ['Step("a", "ok.py")'])
        b = pipeline(fs, env=env)
        assert b.returncode == 0 and b.stderr == "" and TB not in b.stdout, b.stdout + b.stderr
        said = b.stdout
        assert said.splitlines()[1].startswith(found)                         # before the first step
    assert found in said
    assert procs.wait_gone(family, 5), [p for p in family if procs.alive(p)]
    assert not list((tmp_path / "cache" / "servers").rglob("*.pid"))
    w.check(partials=False)


@covers("proc-three-runs-three-ports", "proc-sigterm-stops-server")
def test_three_runs_at_once_get_three_ports_and_sigterm_stops_each_server(tmp_path, pids):
    w = World(tmp_path, systems=(), page=DEMO_PAGE)
    env = env_for(tmp_path)
    started = [start(w.root / "demo" / "results" / f"run{i}", "--server-arg=--spawn-child", "--hold", "60", env=env)
               for i in range(3)]
    time.sleep(0.3)
    family = []
    for p, server, _ in started:
        pids.extend([p.pid, server])
        family += [server, *procs.descendants(server)]
    pids.extend(family)
    ports = [port for _, _, port in started]
    assert len(set(ports)) == 3 and all(health(port) == 200 for port in ports), ports
    for p, _, _ in started:
        p.send_signal(signal.SIGTERM)
    for i, (p, _, _) in enumerate(started):
        _, err = p.communicate(timeout=60)
        (kept,) = (w.root / "demo" / "results" / ".failed" / f"run{i}").iterdir()
        assert p.returncode == 143 and TB not in err
        assert lines(err) == [f"[interrupted] stopped by SIGTERM; earlier results were left as they were (this run "
                              f"kept in {kept})."]
        assert json.loads((kept / "summary.json").read_text())["status"] == "interrupted"
    assert procs.wait_gone(family, 10), [q for q in family if procs.alive(q)]
    assert not list((tmp_path / "cache" / "servers" / "experiment").glob("*.pid"))
    w.check()


@covers("proc-no-fixed-port")
def test_no_test_or_script_binds_a_fixed_port():
    """Two `make test` at once must not collide: servers and rendezvous ports come from the OS (bind 0)."""
    allowed = {  # literal ports that are parsed or compared, never bound
        ("tests/test_cli.py", '(cli.port, "30000", 30000)'), ("tests/test_cli.py", '(cli.port, "70000", "1..65535")'),
        ("tests/test_sglang_helpers.py", "srv.port != 30000"), ("tests/test_sglang_scripts.py", '"--port", "70000"'),
        # a fact of mini-SGLang itself (its LLM's gloo group), documented where the script says to run one at a time
        ("mini-sglang/scripts/08_forward_timeline.py", "gloo binds 127.0.0.1:2333, so one at a time"),
    }
    pat = re.compile(r"""(port\W{0,3}\s*[=:,]\s*["']?\d{4,5}\b|--port["',\s]+["']?\d{4,5}\b|127\.0\.0\.1:\d{2,5}\b|"""
                     r"""localhost:\d{2,5}\b|\.bind\(\([^)]*,\s*[1-9]\d*\)\)|\b3000\d\b)""")
    hits = []
    files = [*TESTS.glob("*.py"), *TESTS.glob("fakes/*"), *(REPO / "common").rglob("*.py"), REPO / "Makefile",
             *[p for s in ("flashinfer", "mini-sglang", "sglang") for p in (REPO / s / "scripts").glob("*.*")]]
    for f in files:
        if f.is_file() and f.suffix in (".py", ".sh", "") and f != Path(__file__):
            for ln in f.read_text(errors="replace").splitlines():
                if pat.search(ln) and not any(str(f.relative_to(REPO)) == a and s in ln for a, s in allowed):
                    hits.append(f"{f.relative_to(REPO)}: {ln.strip()}")
    assert hits == []


@covers("proc-server-dies-at-startup")
def test_a_server_that_dies_during_start_up(tmp_path, pids):
    w, out = demo_world(tmp_path)
    r = experiment(out, "--server", "--server-arg=--die-after=0.3", "--server-arg=--no-health", env=env_for(tmp_path))
    (kept,) = (out.parent / ".failed" / "01_demo").iterdir()
    assert r.returncode == 1 and r.stdout == "" and TB not in r.stderr
    assert re.fullmatch(re.escape("[failed] ServerError: server exited with code 3 during start-up after ") + r"\d+" +
                        re.escape(f" s. Last log lines ({kept / 'server.log'}): fake server: model dummy-model on ")
                        + r"127\.0\.0\.1:\d+" + re.escape(" | fake server: dying on purpose (CUDA out of memory) "
                                                          f"(traceback: {kept / 'error.txt'})"),
                        lines(r.stderr)[0]) and len(lines(r.stderr)) == 1, r.stderr
    assert "dying on purpose" in (kept / "server.log").read_text()     # the line names a file that exists
    assert not list((tmp_path / "cache" / "servers").rglob("*.pid"))
    w.check()


@covers("proc-server-ignores-sigterm")
def test_a_server_that_ignores_sigterm_is_said_to_be_killed(tmp_path, pids):
    """Before: the stop waited the whole stop timeout in silence, then said 'stopped' as if SIGTERM had worked. The
    launcher gets SIGKILL first (SGLang's answers a SIGTERM to its group with a 5 s sleep); its child here ignores
    SIGTERM and gets no PR_SET_PDEATHSIG."""
    w, out = demo_world(tmp_path)
    w.kept.pop(out)                                       # this run succeeds and replaces the earlier one
    r = experiment(out, "--server", "--server-arg=--spawn-child", "--server-arg=--child-ignores-term", "--tag",
                   "stubborn", env=env_for(tmp_path))
    assert (r.returncode, r.stdout, r.stderr) == (0, "", ""), r.stderr
    log = [ln.split("] ", 1)[1] for ln in (out / "log.txt").read_text().splitlines()]
    i = log.index("server: still running 3 s after SIGTERM; sending SIGKILL")
    assert re.fullmatch(r"server: stopped \(2 processes, 3\.\d s; killed with SIGKILL after 3 s of SIGTERM\)", log[i + 1])
    assert not list((tmp_path / "cache" / "servers").rglob("*.pid"))
    w.check()


@covers("proc-second-ctrl-c-at-start")
@pytest.mark.parametrize("gap", [0.0, 0.01, 0.3])
def test_a_second_ctrl_c_while_the_server_starts(tmp_path, pids, gap):
    """Ctrl-C while waiting for /health, then again ``gap`` s later, while the server (which ignores SIGTERM) is
    being stopped. Before: the stop cut short left its atexit callback to write to the run's closed log
    ('Exception ignored in atexit callback ... ValueError: I/O operation on closed file.') and, when cut before
    the SIGKILL, the server running."""
    w, out = demo_world(tmp_path)
    p = subprocess.Popen([PY, str(EXPERIMENT), "--out", str(out), "--server", "--server-arg=--no-health",
                          "--server-arg=--ignore-term", "--start-timeout", "60"], env=env_for(tmp_path), cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids.append(p.pid)
    folder, t0 = tmp_path / "cache" / "servers" / "experiment", time.time()
    while not list(folder.glob("*.pid")) and time.time() - t0 < 30:
        time.sleep(0.02)
    (pidfile,) = folder.glob("*.pid")
    pids.append(json.loads(pidfile.read_text())["pgid"])
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    time.sleep(gap)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    (kept,) = (out.parent / ".failed" / "01_demo").iterdir()
    assert p.returncode == 130 and TB not in err, err
    assert lines(err) == [f"[interrupted] stopped by Ctrl-C; earlier results were left as they were (this run kept in "
                          f"{kept})."]
    assert procs.wait_gone(pids[1:], 10), [q for q in pids if procs.alive(q)]
    w.check()


@covers("proc-http-proxy-set")
def test_an_http_proxy_in_the_environment_does_not_hide_the_local_server(tmp_path, pids):
    """Clusters set http_proxy for downloads; requests to 127.0.0.1 must not go to it (a proxy that refuses
    every connection stands for it: a free port on 127.0.0.1 with nothing listening)."""
    w, out = demo_world(tmp_path)
    proxy = f"http://127.0.0.1:{procs.free_port()}"
    env = env_for(tmp_path, http_proxy=proxy, HTTP_PROXY=proxy, https_proxy=proxy, no_proxy="", NO_PROXY="")
    r = experiment(out, "--server", "--start-timeout", "10", "--tag", "proxied", env=env)
    w.kept.pop(out)                                       # this run succeeds and replaces the earlier one
    assert (r.returncode, r.stdout, r.stderr) == (0, "", ""), r.stderr
    assert "server: ready after" in (out / "log.txt").read_text()
    w.check()


@covers("proc-port-in-use")
def test_a_given_port_in_use_starts_nothing(tmp_path, pids):
    w, out = demo_world(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = experiment(out, "--server", "--port", str(port), env=env_for(tmp_path))
    assert r.returncode == 2 and r.stdout == "" and TB not in r.stderr
    assert lines(r.stderr) == [f"[setup] port {port} on 127.0.0.1 is already in use (another server running? "
                               f"`ss -ltnp | grep {port}`); choose another with --port"]
    (kept,) = (out.parent / ".failed" / "01_demo").iterdir()
    assert kept.name.endswith("-setup-error") and not (kept / "server.log").exists()
    w.check()


@covers("proc-gate-holder-killed")
def test_a_held_server_whose_run_is_killed_exits_by_itself(tmp_path, pids):
    """08 --ncu launches its counters server early, held by _sgl_gate until the GPU is free (here experiment.py --gate
    with the fake server's gated scheduler). SIGKILL the run while it is held: before, the scheduler stayed held until
    HANDS_ON_GATE_TIMEOUT (an hour) and then started on the GPU with no owner; now it sees its holder gone and exits,
    the server after it, without waiting for a next run to reap them."""
    w, out = demo_world(tmp_path)
    env = env_for(tmp_path, HANDS_ON_GATE_TIMEOUT=60)
    a, server, _ = start(out, "--gate", "--hold", "60", env=env)
    pids.append(a.pid)
    partial = next(out.parent.glob(".partial-01_demo-*"))
    t0 = time.time()
    while not list((partial / "gate").glob("*")) or "hands-on gate: holding" not in (partial / "server.log").read_text():
        assert time.time() - t0 < 30, "the scheduler never reached its gate"
        time.sleep(0.05)
    family = [server, *procs.descendants(server)]
    pids.extend(family)
    assert len(family) >= 2 and all(procs.alive(p) for p in family)
    a.kill()
    a.communicate(timeout=10)
    assert procs.wait_gone(family, 10), [(p, procs.cmdline(p)) for p in family if procs.alive(p)]
    log = [ln.split("] ", 1)[-1] for ln in (partial / "server.log").read_text().splitlines()]
    (closed,) = [ln for ln in log if ln.startswith("hands-on gate: closed")]
    assert re.fullmatch(rf"hands-on gate: closed: its holder \(pid {a.pid}\) is gone, so the scheduler exits after "
                        r"[\d.]+ s, before it touches the GPU", closed), closed
    assert "fake scheduler: configured" not in log and "Rank 0 scheduler is dead (exit code 3)" in log
    w.check(partials=False)                                  # the killed run changed no earlier result


@covers("proc-gate-timeout", "proc-gate-not-held")
@pytest.mark.parametrize("fault", ["proc-gate-timeout", "proc-gate-not-held"])
def test_a_gated_start_that_was_not_held_is_one_line(tmp_path, pids, fault):
    """The gate times out while its run lives (before: the scheduler went on to the GPU during the measurements and the
    run ended ok), or the plugin was not loaded at all (before: nothing checked the hold): one [failed] line, exit 1."""
    w, out = demo_world(tmp_path)
    if fault == "proc-gate-timeout":
        r = experiment(out, "--gate", "--hold", "3", env=env_for(tmp_path, HANDS_ON_GATE_TIMEOUT=1))
    else:
        r = experiment(out, "--gate", "--hold", "0.5", "--inject", "gate-unloaded", env=env_for(tmp_path))
    (kept,) = (out.parent / ".failed" / "01_demo").iterdir()
    assert r.returncode == 1 and r.stdout == "" and TB not in r.stderr, r.stderr
    if fault == "proc-gate-timeout":
        said = ("GateError: server[gated] exited while held by its gate, which closed: not released within 1 s "
                r"(HANDS_ON_GATE_TIMEOUT), so the scheduler exits after 1.0 s, before it touches the GPU; log "
                f"{kept / 'server.log'}")
        assert "Rank 0 scheduler is dead" in (kept / "server.log").read_text()
    else:
        said = (f"GateError: server[gated] started without being held by its gate (no passed-<pid>.json in "
                f"{kept / 'gate'}: SGLang did not load the hands_on_gate plugin), so it may have used the GPU before "
                "the release; its measurements are not trusted")
    assert lines(r.stderr) == [f"[failed] {said} (traceback: {kept / 'error.txt'})"]
    assert not list((tmp_path / "cache" / "servers").rglob("*.pid"))
    w.check()


@covers("proc-ncu-timeout")
def test_an_ncu_timeout_stops_ncu_and_the_application(tmp_path, pids):
    """The real flashinfer/scripts/ncu_profile.sh (common.capture.ncu profile) with a fake ncu that hangs and whose
    application runs in a session of its own (out of reach of killpg)."""
    w = World(tmp_path, systems=("flashinfer",))
    pid_file = tmp_path / "ncu.pids"
    env = env_for(tmp_path, FAKE_NCU="hang", FAKE_NCU_PIDS=pid_file, PYTHON=PY)
    out = tmp_path / "ncu"
    r = run(["bash", REPO / "flashinfer" / "scripts" / "ncu_profile.sh", "--out", out, "--timeout", "2", "--",
             PY, "-c", "import time; time.sleep(60)"], env, timeout=60)
    ncu_pid, app_pid = map(int, pid_file.read_text().split())
    pids.extend([ncu_pid, app_pid])
    assert r.returncode == 1 and TB not in r.stdout + r.stderr
    (tb,) = (tmp_path / "cache" / "errors").iterdir()
    assert lines(r.stderr) == [f"[failed] NcuError: ncu did not finish within 2 s (ncu and the profiled application "
                               f"were stopped); see {out / 'ncu_app_stdout.txt'} (traceback: {tb})"]
    assert not procs.alive(ncu_pid) and not procs.alive(app_pid)
    w.check()


# ------------------------------------------------------------------ (e) bad values, missing packages

BAD_VALUES = {
    "value-configs-negative": ("sglang/scripts/07_tp_scaling.py", ["--configs", "llama-3.1-8b:-1"],
                               "07_tp_scaling.py: error: argument --configs: bad entry 'llama-3.1-8b:-1' (expected "
                               "positive integers separated by commas, got '-1'); expected 'preset:tp,tp;preset:tp'"),
    "value-model-path-missing": ("sglang/scripts/02_radix_cache_analysis.py", ["--model-path", "/nonexistent"],
                                 "02_radix_cache_analysis.py: error: argument --model-path: '/nonexistent' is not a "
                                 "folder (give a local model folder with config.json and weights)"),
    "value-mem-fraction": ("sglang/scripts/01_baseline_perf.py", ["--mem-fraction", "5"],
                           "01_baseline_perf.py: error: argument --mem-fraction: expected a fraction in (0, 1], "
                           "got '5'"),
    "value-batches-abc": ("flashinfer/scripts/03_profile_decode.py", ["--batches", "abc"],
                          "03_profile_decode.py: error: argument --batches: expected positive integers separated by "
                          "commas, got 'abc'"),
    "value-unknown-preset": ("sglang/scripts/02_radix_cache_analysis.py", ["--preset", "gpt-9"],
                             "02_radix_cache_analysis.py: error: argument --preset: unknown model preset 'gpt-9'; "
                             "choose from llama-3.1-70b, llama-3.1-8b, qwen2.5-7b, tiny-llama"),
}


@covers(*BAD_VALUES)
@pytest.mark.parametrize("fault", list(BAD_VALUES))
def test_a_bad_value_stops_before_anything_starts(tmp_path, pids, fault):
    script, argv, message = BAD_VALUES[fault]
    w = World(tmp_path, systems=(script.split("/")[0],))
    out = w.root / "results" / Path(script).stem
    w.seed(script.split("/")[0], Path(script).stem, out=out)
    # a fake H200 and a stand-in sglang package: only the value can stop the script
    env = env_for(tmp_path, smi="h200", PYTHONPATH=sglang_stub(tmp_path))
    r = run([PY, REPO / script, "--quick", "--out", out, *argv], env, timeout=60)
    assert r.returncode == 2 and r.stdout == "" and TB not in r.stderr, r.stderr
    assert usage_then(r.stderr) == message
    assert not (tmp_path / "cache" / "servers").exists()
    w.check()


def sglang_stub(tmp_path: Path) -> Path:
    """A package named sglang (the scripts find it installed; nothing of it runs in these cases)."""
    d = tmp_path / "stub-sglang"
    (d / "sglang").mkdir(parents=True, exist_ok=True)
    (d / "sglang" / "__init__.py").write_text('__version__ = "0.0+stub"\n')
    return d


@covers("value-tp-over-visible-gpus")
def test_more_tensor_parallel_ranks_than_gpus(tmp_path, pids):
    w = World(tmp_path)
    out = w.root / "results" / "07_tp_scaling"
    w.seed("sglang", "07_tp_scaling", out=out)
    env = env_for(tmp_path, smi="h200", PYTHONPATH=sglang_stub(tmp_path))
    r = run([PY, REPO / "sglang" / "scripts" / "07_tp_scaling.py", "--configs", "llama-3.1-8b:2", "--out", out], env)
    assert r.returncode == 2 and r.stdout == "" and TB not in r.stderr
    assert lines(r.stderr) == ["[setup] --configs llama-3.1-8b:2 needs 2 GPUs; 1 visible (CUDA_VISIBLE_DEVICES limits "
                               "what is visible)."]
    assert not (tmp_path / "cache" / "servers").exists()
    w.check()


@covers("value-gpu-without-torch")
@pytest.mark.parametrize("script", ["01_baseline_perf", "03_backend_comparison"])
def test_a_gpu_machine_without_torch(tmp_path, pids, script):
    """The ceilings are measured in a child process, which stops with a [setup] line (exit 2): before, the script
    wrapped it as '[failed] RuntimeError: measuring the ceilings failed (exit 2) ...' (exit 1)."""
    w = World(tmp_path)
    out = w.root / "results" / script
    w.seed("sglang", script, out=out)
    env = env_for(tmp_path, smi="h200", PYTHONPATH=os.pathsep.join(map(str, (sglang_stub(tmp_path),
                                                                              blocked(tmp_path, "torch")))))
    r = run([PY, REPO / "sglang" / "scripts" / f"{script}.py", "--quick", "--out", out], env)
    log = tmp_path / "cache" / "ceilings" / "measure-NVIDIA_H200-driver580.159.04-sm1980-mem3201.log"   # the machine
    assert r.returncode == 2 and TB not in r.stdout + r.stderr, r.stderr
    assert lines(r.stderr) == ["[setup] Python package 'torch' is not importable (ModuleNotFoundError: No module named "
                               "'torch'). Install it: pip install -r requirements.txt (while measuring this GPU's "
                               f"ceilings; log {log})"]
    assert not (tmp_path / "cache" / "servers").exists() or not list((tmp_path / "cache" / "servers").rglob("*.pid"))
    w.check()


@covers("value-reanalyse-newer-schema")
@pytest.mark.parametrize("schema", [3, 99])
@pytest.mark.parametrize("script", ["mini-sglang/03_profile_store", "sglang/04_nsys_profile"])
def test_a_recording_of_a_newer_schema_is_refused(tmp_path, pids, schema, script):
    """A recording a later workbook wrote (its summary's schema above store.SCHEMA): before, --reanalyse ended ok and
    stamped the new run schema 2, which `make reports` then took. 03 reads it through recording.open (refused before
    its Run starts); 04 reads the summary itself (refused by Run.reanalysis_of: the run is kept as setup-error)."""
    system, stem = script.split("/")
    w = World(tmp_path, systems=(system,), code=True)
    if stem == "04_nsys_profile":
        src, commit = reanalysis_source(tmp_path), "abcdef123456"
        (src / "summary.json").write_text(json.dumps({"stem": stem, "provenance": {"git": {"commit": commit}}}))
    else:
        src = tmp_path / "recorded"
        shutil.copytree(FIXTURES / "recordings_h200" / system / stem, src)
        commit = json.loads((src / "summary.json").read_text())["provenance"]["git"]["commit"][:12]
    s = json.loads((src / "summary.json").read_text())
    (src / "summary.json").write_text(json.dumps({**s, "schema": schema}))
    before = snapshot(src)
    out = w.root / system / "results" / stem
    r = run([PY, REPO / system / "scripts" / f"{stem}.py", "--reanalyse", src, "--out", out], env_for(tmp_path))
    assert r.returncode == 2 and TB not in r.stdout + r.stderr, r.stdout + r.stderr
    assert lines(r.stderr) == [f"[setup] --reanalyse {src}: a recording of summary schema {schema}, newer than this "
                               f"workbook's (2): re-analyse it with the workbook that recorded it (commit {commit}), or "
                               "update this one (git pull); it is not rewritten as schema 2"]
    assert not out.exists() and snapshot(src) == before
    rep = report_cmd(w, env_for(tmp_path), "--quiet")                     # make reports: nothing new to take
    assert rep.returncode == 0 and "0 file(s) changed" in totals(rep.stdout), rep.stdout + rep.stderr
    w.check()


PARTIAL = {"sglang/02_radix_cache_analysis": ("policy", ["lpm-beats-fcfs-hit-rate", "lpm-beats-fcfs-ttft"]),
           "mini-sglang/01_test_kernels": ("launches", ["store-two-launches", "index-one-warp", "index-256-threads",
                                                        "index-masked-kernel"])}


@covers("value-reanalyse-partial-recording")
@pytest.mark.parametrize("script", list(PARTIAL))
def test_a_partial_recording_says_which_verdicts_it_could_not_judge(tmp_path, pids, script):
    """A copy of a real recording without one table its run wrote. Before: SGLang 02 ended ok with its LPM verdicts
    gone without a word; mini-SGLang 01 ended in '[failed] TypeError: 'NoneType' object is not subscriptable'."""
    system, stem = script.split("/")
    table, ids = PARTIAL[script]
    w = World(tmp_path, systems=(system,), code=True)
    src = tmp_path / "recorded"
    shutil.copytree(FIXTURES / "recordings_h200" / system / stem, src)
    (src / f"{table}.csv").unlink()
    had = {o["hypothesis"]: o["verdict"] for o in json.loads((src / "summary.json").read_text())["observations"]}
    out = w.root / system / "results" / stem
    r = run([PY, REPO / system / "scripts" / f"{stem}.py", "--reanalyse", src, "--out", out], env_for(tmp_path))
    assert r.returncode == 0 and r.stderr == "" and TB not in r.stdout, r.stdout + r.stderr
    s = json.loads((out / "summary.json").read_text())
    got = {o["hypothesis"]: o for o in s["observations"]}
    assert set(got) == set(had)                                         # none silently gone
    for h in ids:
        assert got[h]["verdict"] == "not run" and got[h]["observed"] == (
            f"not judged: the recording {src} lacks {table}.csv, which its run wrote (that run found it {had[h]})")
    assert [h for h, o in got.items() if o["verdict"] == "not run"] == ids
    assert f"not judged again, the recording lacks {table}.csv: {'; '.join(ids)}" in s["notes"]
    rep = report_cmd(w, env_for(tmp_path, ACCEPT_MIXED=1), "--quiet")      # the page lists them
    assert rep.returncode == 0, rep.stdout + rep.stderr
    page = (w.root / system / "reports" / "analysis.md").read_text()
    block = page.split(f"<!-- auto:{stem}/observations -->")[1].split("<!-- /auto -->")[0]
    assert block.count("**not run**") == len(ids) and f"lacks {table}.csv" in block
    w.check(reports=False)


@covers("value-reanalyse-partial-recording")
def test_a_recording_without_a_required_table_is_one_line_naming_its_verdicts(tmp_path, pids):
    src = tmp_path / "recorded"
    shutil.copytree(FIXTURES / "recordings_h200" / "mini-sglang" / "03_profile_store", src)
    (src / "reference.csv").unlink()
    ids = [o["hypothesis"] for o in json.loads((src / "summary.json").read_text())["observations"]]
    out = tmp_path / "out"
    r = run([PY, REPO / "mini-sglang" / "scripts" / "03_profile_store.py", "--reanalyse", src, "--out", out],
            env_for(tmp_path))
    assert r.returncode == 2 and r.stdout == "" and TB not in r.stderr, r.stderr
    assert lines(r.stderr) == [f"[setup] --reanalyse {src}: no reference.csv to re-analyse (written by 03_profile_store.py); "
                               f"without it none of the recording's {len(ids)} verdicts can be judged again "
                               f"({', '.join(ids)})"]
    assert not out.exists() and not (tmp_path / ".failed").exists()


@covers("value-ncu-csv-without-time")
def test_an_ncu_csv_without_the_time_metric_is_named(tmp_path, pids):
    w = World(tmp_path, systems=("flashinfer",))
    env = env_for(tmp_path, FAKE_NCU="notime", PYTHON=PY)
    out = tmp_path / "ncu"
    r = run(["bash", REPO / "flashinfer" / "scripts" / "ncu_profile.sh", "--out", out, "--", PY, "-c", "pass"], env)
    (tb,) = (tmp_path / "cache" / "errors").iterdir()
    assert r.returncode == 1 and TB not in r.stdout + r.stderr
    assert lines(r.stderr) == ["[failed] NcuParseError: the ncu CSV has no gpu__time_duration.sum column, so no kernel "
                               "time: collect it (--metrics gpu__time_duration.sum, or a section set such as "
                               f"SpeedOfLight/full) (traceback: {tb})"]
    assert not (out / "kernels.csv").exists()                          # no table of NaN times
    w.check()


@covers("cache-not-writable")
@pytest.mark.parametrize("how", ["cache-is-a-file", "home-cache-is-a-file", "chmod"])
def test_a_cache_folder_that_cannot_be_written(tmp_path, pids, how):
    """The server's pidfile goes to the cache ($HANDS_ON_CACHE, else ~/.cache/hands-on): before, a cache or HOME
    that could not be written was '[failed] PermissionError' / 'NotADirectoryError' with a traceback file."""
    w, out = demo_world(tmp_path)
    env = env_for(tmp_path)
    cache, why = tmp_path / "cache", "[Errno 20] Not a directory"
    if how == "cache-is-a-file":
        cache.write_text("a file where the cache folder should be\n")
    elif how == "home-cache-is-a-file":
        del env["HANDS_ON_CACHE"]
        env["HOME"] = str(tmp_path / "home")
        (tmp_path / "home").mkdir()
        (tmp_path / "home" / ".cache").write_text("a file\n")
        cache = tmp_path / "home" / ".cache" / "hands-on"
    else:
        cache.mkdir()
        cache.chmod(0o500)
        if os.access(cache, os.W_OK):
            cache.chmod(0o700)
            pytest.skip("running as root: chmod does not make a folder read-only")
        why = "[Errno 13] Permission denied"
    try:
        r = experiment(out, "--server", env=env)
    finally:
        if cache.is_dir():
            cache.chmod(0o700)
    assert r.returncode == 2 and r.stdout == "" and TB not in r.stderr, r.stderr
    assert lines(r.stderr) == [f"[setup] cache folder {cache / 'servers' / 'experiment'} is not writable ({why}); set "
                               "HANDS_ON_CACHE to a writable folder"]
    (kept,) = (out.parent / ".failed" / "01_demo").iterdir()
    assert kept.name.endswith("-setup-error") and not (kept / "server.log").exists()       # nothing started
    w.check()


@covers("home-read-only-matplotlib")
@pytest.mark.parametrize("how", ["home-is-a-file", "chmod", "cache-writable"])
def test_a_home_matplotlib_cannot_write_prints_only_the_one_line(tmp_path, pids, how):
    """07_tp_scaling.py imports matplotlib before it reads the recording. Before, matplotlib's 'mkdir -p failed for path
    .../.config/matplotlib' and 'Matplotlib created a temporary cache directory ...' came before the [setup] line."""
    w = World(tmp_path)
    env = env_for(tmp_path, TMPDIR=tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    home = tmp_path / "home"
    if how == "chmod":
        home.mkdir()
        home.chmod(0o500)
        if os.access(home, os.W_OK):
            home.chmod(0o700)
            pytest.skip("running as root: chmod does not make a folder read-only")
    else:
        tmp_path.joinpath("afile").write_text("a file\n")
        home = tmp_path / "afile" / "home"                 # a HOME below a file: nothing under it can be made
    env["HOME"] = str(home)
    if how != "cache-writable":
        del env["HANDS_ON_CACHE"]                          # the default cache is under that HOME too
    src = tmp_path / "empty"
    src.mkdir()
    try:
        r = run([PY, REPO / "sglang" / "scripts" / "07_tp_scaling.py", "--reanalyse", src, "--out", tmp_path / "o"], env)
    finally:
        if home.is_dir():
            home.chmod(0o700)
    assert r.returncode == 2 and r.stdout == "" and TB not in r.stderr, r.stderr
    assert lines(r.stderr) == [f"[setup] {src}: no tp_runs.csv to re-analyse (written by 07_tp_scaling.py)"]
    used = tmp_path / "cache" / "matplotlib" if how == "cache-writable" else \
        tmp_path / "tmp" / f"hands-on-matplotlib-{os.getuid()}"
    assert used.is_dir()                                            # MPLCONFIGDIR: matplotlib writes there
    w.check()


def _damaged_nsys(src: Path, how: str) -> tuple[Path, str]:
    """The recording's cuda_gpu_trace CSV damaged ``how``; (its path, what the one line says after it)."""
    csv_ = src / "timeline_overlap_on_cuda_gpu_trace.csv"
    text = csv_.read_text()
    ls = text.splitlines(keepends=True)
    if how == "value-nsys-csv-without-name":
        csv_.write_text(text.replace(",Name\n", ",Label\n", 1))
        return csv_, "no Name column (columns: Start (ns), Duration (ns), CorrId, Strm, Label): not an nsys stats " \
                     "table this reads"
    if how == "value-nsys-csv-cut-mid-row":           # the last row cut after its third field
        csv_.write_text("".join(ls[:40]) + ",".join(ls[40].split(",")[:3]))
        return csv_, "column Name, line 41: empty (the file cut mid-row?)"
    cut = text.index('"void', len("".join(ls[:15])))  # cut inside the quoted name of line 16
    csv_.write_text(text[:cut + 20])
    return csv_, ("column Name, line 16: a quote never closed (the file cut mid-quote?) (Error tokenizing data. C "
                  "error: EOF inside string starting at row 15)")


DAMAGED = ["value-ncu-text-in-a-number-column", "value-nsys-csv-without-name", "value-nsys-csv-cut-mid-row",
           "value-nsys-csv-cut-mid-quote", "value-trace-gz-cut"]
GZ_READER = "import sys\nsys.path.insert(0, {repo!r})\nfrom common.tables import trace\nfrom common.base.checks import run_main\n" \
            "run_main(lambda argv=None: trace.read_chrome_trace(sys.argv[1]))\n"


@covers(*DAMAGED)
@pytest.mark.parametrize("fault", DAMAGED)
def test_a_damaged_profile_file_is_named_with_its_column_and_row(tmp_path, pids, fault):
    """ncu_profile.sh over a value that is not a number, 04_nsys_profile.py --reanalyse over a damaged nsys CSV, a
    script reading a cut .json.gz trace: one [failed] line naming the file (column, row), no pandas/gzip error."""
    w = World(tmp_path)
    env = env_for(tmp_path, FAKE_NCU="text", PYTHON=PY)
    if fault == "value-ncu-text-in-a-number-column":
        out = tmp_path / "ncu"
        r = run(["bash", REPO / "flashinfer" / "scripts" / "ncu_profile.sh", "--out", out, "--", PY, "-c", "pass"], env)
        said = f"NcuParseError: {out / 'ncu.csv'}: column gpu__time_duration.sum, row 4 (RMSNormKernel): 'fast' is not a number"
    elif fault == "value-trace-gz-cut":
        gz = tmp_path / "trace.json.gz"
        whole = (FIXTURES / "sglang_story_trace_graphs_llama8b_h200_cut.json.gz").read_bytes()
        gz.write_bytes(whole[:len(whole) // 2])
        r = run([PY, "-c", GZ_READER.format(repo=str(REPO)), gz], env)
        said = (f"TraceError: trace {gz} is cut short or damaged (EOFError: Compressed file ended before the "
                "end-of-stream marker was reached)")
    else:
        out = w.root / "results" / "04_nsys_profile"
        w.seed("sglang", "04_nsys_profile", out=out)
        csv_, what = _damaged_nsys(reanalysis_source(tmp_path), fault)
        r = run([PY, REPO / "sglang" / "scripts" / "04_nsys_profile.py", "--reanalyse", csv_.parent, "--out", out], env)
        said = f"TraceError: {csv_}: {what}"
    assert r.returncode == 1 and TB not in r.stdout + r.stderr, r.stderr
    (line,) = lines(r.stderr)
    assert re.fullmatch(re.escape(f"[failed] {said} (traceback: ") + r"\S+(error\.txt|\d+\.txt)\)", line), line
    w.check()


@covers("package-pandas-script", "package-matplotlib-script")
@pytest.mark.parametrize("script, package", [("04_nsys_profile.py", "pandas"), ("07_tp_scaling.py", "matplotlib")],
                         ids=["package-pandas-script", "package-matplotlib-script"])
def test_a_script_without_an_optional_package(tmp_path, pids, script, package):
    w = World(tmp_path)
    out = w.root / "results" / Path(script).stem
    w.seed("sglang", Path(script).stem, out=out)
    src = tmp_path / "recorded"
    src.mkdir()
    r = run([PY, REPO / "sglang" / "scripts" / script, "--reanalyse", src, "--out", out],
            env_for(tmp_path, PYTHONPATH=blocked(tmp_path, package)))
    assert r.returncode == 2 and r.stdout == "" and TB not in r.stderr
    assert lines(r.stderr) == [f"[setup] Python package(s) not importable: '{package}' (pip install {package})"]
    w.check()


@covers("package-import-anywhere")
def test_an_import_of_a_missing_package_deep_in_main(tmp_path, pids):
    w, out = demo_world(tmp_path)
    r = experiment(out, "--import", "pandas", env=env_for(tmp_path, PYTHONPATH=blocked(tmp_path, "pandas")))
    assert r.returncode == 2 and r.stdout == "" and TB not in r.stderr
    assert lines(r.stderr) == ["[setup] Python package 'pandas' is not importable (ModuleNotFoundError: No module "
                               "named 'pandas'). Install it: pip install pandas"]
    (kept,) = (out.parent / ".failed" / "01_demo").iterdir()
    assert kept.name.endswith("-setup-error")
    assert json.loads((kept / "summary.json").read_text())["status"] == "setup-error"
    w.check()


OPTIONAL = """
import sys
sys.path.insert(0, {repo!r}); sys.path.insert(0, {fi!r})
import _fi_bench
from common.capture.ranges import nvtx_range
print(_fi_bench.cupti_python())
with nvtx_range("decode bs=1"):
    print("inside the range")
"""


@covers("package-cupti-python", "package-nvtx")
def test_cupti_python_and_nvtx_missing_degrade_with_a_named_install(tmp_path, pids):
    """Both are optional by design: without cupti-python FlashInfer's CUPTI cross-check is an inconclusive
    premise naming the install; without nvtx the ranges are torch annotations or nothing."""
    w = World(tmp_path, systems=("flashinfer",))
    code = OPTIONAL.format(repo=str(REPO), fi=str(REPO / "flashinfer" / "scripts"))
    r = run([PY, "-c", code], env_for(tmp_path, PYTHONPATH=blocked(tmp_path, "cupti", "nvtx")))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert lines(r.stdout) == ["cupti-python unavailable (ModuleNotFoundError: No module named 'cupti'); "
                               "pip install cupti-python", "inside the range"]
    w.check()


@covers("package-make-test-downloads")
def test_the_readme_says_what_make_test_downloads():
    """`make test` installs tests/requirements.txt from the package index (NVIDIA's ncu-report, import-linter, ...):
    the set-up text a new user reads first says so, with the size. Before, it said only 'installs the light test set'."""
    readme = (REPO / "README.md").read_text()
    setup = readme[readme.index("On any machine, GPU or not"):readme.index("Single experiments run on their own")]
    wanted = [re.split(r"[<>=\s]", ln, 1)[0] for ln in (TESTS / "requirements.txt").read_text().splitlines()
              if ln.strip() and not ln.startswith("#")]
    assert "ncu-report" in wanted and "import-linter" in wanted
    assert "](tests/requirements.txt)" in setup and re.search(r"\b\d+ MB\b", setup), setup
    for name in ("ncu-report", "import-linter"):          # the two that are no everyday Python packages
        assert name in setup, name


# ------------------------------------------------------------------ CI's own guard (.ci/run)

def guard_source() -> str:
    text = (REPO / ".ci" / "run").read_text()
    m = re.search(r"^# guard:begin[^\n]*\n(.*?)^# guard:end$", text, re.M | re.S)
    assert m, ".ci/run has no '# guard:begin' ... '# guard:end' section"
    return m.group(1)


def _git(repo: Path, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false",
                           *args], cwd=repo, capture_output=True, text=True, timeout=30, check=True)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_ci_report_guard_fails_when_a_report_changes(tmp_path):
    """.ci/run's guard, copied from the file, in a git repository of its own: exit 0 while the reports are
    as committed; non-zero when a report is modified, deleted or added; the old pathspec never failed."""
    repo = tmp_path / "clone"
    for s in ("flashinfer", "mini-sglang", "sglang"):
        (repo / s / "reports" / "figures").mkdir(parents=True)
        (repo / s / "reports" / "analysis.md").write_text(f"# {s}\n")
    (repo / "README.md").write_text("x\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "reports")
    script = guard_source() + '\nreports_unchanged && echo UNCHANGED\n'

    def guard():
        return subprocess.run(["bash", "-c", script], cwd=repo, capture_output=True, text=True, timeout=30)

    def old_guard():
        return subprocess.run(["git", "diff", "--exit-code", "--stat", "--", "*/reports"], cwd=repo,
                              capture_output=True, text=True, timeout=30)

    ok = guard()
    assert ok.returncode == 0 and "UNCHANGED" in ok.stdout, ok.stdout + ok.stderr
    (repo / "README.md").write_text("changed outside the reports\n")
    assert guard().returncode == 0
    page = repo / "sglang" / "reports" / "analysis.md"
    page.write_text("# sglang\nrewritten by make reports\n")
    changed = guard()
    assert changed.returncode != 0 and "UNCHANGED" not in changed.stdout
    assert "sglang/reports/analysis.md" in changed.stdout                # git diff --stat names the file
    assert old_guard().returncode == 0                        # the guard .ci/run had: it could not fail
    _git(repo, "checkout", "-q", "--", "sglang")
    (repo / "flashinfer" / "reports" / "figures" / "new.png").write_bytes(b"png")
    assert guard().returncode != 0                            # a new file in the reports
    (repo / "flashinfer" / "reports" / "figures" / "new.png").unlink()
    (repo / "mini-sglang" / "reports" / "analysis.md").unlink()
    assert guard().returncode != 0                            # a deleted report
    _git(repo, "checkout", "-q", "--", "mini-sglang")
    assert guard().returncode == 0


def test_ci_runs_the_three_steps_and_no_tests_is_a_failure():
    """.ci/run: make test, make check, make reports, each failing CI with its exit code; pytest's exit code
    5 (nothing collected) is a failure in the Makefile's test target, which CI runs (never pytest directly)."""
    text = (REPO / ".ci" / "run").read_text()
    assert re.findall(r"^step (.+)$", text, re.M) == ["make test", "make check", "make reports"]
    assert "pytest" not in re.sub(r"#.*", "", text)
    assert "if [ $$rc -eq 5 ]; then echo \"pytest collected no tests\"; exit 1; fi" in (REPO / "Makefile").read_text()
    bad = subprocess.run(["bash", "-c", re.search(r"^step\(\) \{.*?^\}$", text, re.M | re.S).group(0)
                          + "\nstep bash -c 'exit 5'\necho not reached"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 5 and "not reached" not in bad.stdout
    assert "ci: 'bash -c exit 5' failed (exit 5)" in bad.stdout

