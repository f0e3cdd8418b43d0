"""Results and reports survive every failure: whole-run folders, failed runs kept and pruned, disk full,
read-only results, crashes between renames, concurrent runs; reports that only move forward (bad
summaries skipped, all-or-nothing writes, provenance per block, a runs header that flags mixed machines);
run_main's one line, exit code and per-run traceback file."""
import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from common.base import checks  # noqa: E402
from common.capture import store  # noqa: E402
from common.judge.verdicts import Hypothesis  # noqa: E402
from common.render import report  # noqa: E402
from common.run import results  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _script(tmp_path, stem="01_demo", system="demo"):
    p = tmp_path / system / "scripts" / f"{stem}.py"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("# demo\n")
    return p


def _prov(run, gpu="NVIDIA H200", n=1, torch="2.11.0+cu130", commit="6ca9eea", date="2026-11-21T16:08:31Z"):
    """Fixed provenance, so the hidden run lines do not depend on this machine."""
    run.summary["provenance"].update(gpu=gpu, gpu_count=n, packages={"torch": torch},
                                     git={"commit": commit, "dirty": False}, date_utc=date)


def _good_run(tmp_path, stem="01_demo", rows=({"a": 1},), **prov):
    with results.Run(_script(tmp_path, stem), {}, quiet=True) as run:
        _prov(run, **prov)
        run.table("sweep", list(rows))
        run.story(f"STORY of {stem}")
        run.headline(tb_s=2.5)
    return run.final_dir


def _snapshot(d: Path) -> dict:
    """Every file under ``d`` with the hash of its bytes."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def _py(code: str, env=None, **kw):
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, **(env or {})}, **kw)


# ---------------------------------------------------------------- results: whole runs

def test_a_new_run_replaces_the_folder_whole(tmp_path):
    script = _script(tmp_path)
    with results.Run(script, {}, quiet=True) as run:
        run.table("sweep", [{"a": 1}])
        run.path("nvtx_ranges.csv").write_text("old run only\n")
    d = run.final_dir
    with results.Run(script, {}, quiet=True) as run:
        run.table("sweep", [{"a": 2}])
    assert sorted(p.name for p in d.iterdir()) == ["log.txt", "summary.json", "sweep.csv"]   # old extra file gone
    prev = d.parent / ".previous" / "01_demo"
    assert (prev / "nvtx_ranges.csv").exists() and (prev / "sweep.csv").read_text().splitlines()[1] == "1"
    assert [p.name for p in d.parent.iterdir() if p.name.startswith((".partial", ".trash"))] == []


def test_out_dir_gets_the_same_layout(tmp_path):
    out = tmp_path / "elsewhere" / "mine"
    with results.Run(_script(tmp_path), {}, out=out, quiet=True) as run:
        assert run.dir.parent == out.parent and run.dir.name.startswith(".partial-mine-")
    assert (out / "summary.json").exists()
    with pytest.raises(RuntimeError):
        with results.Run(_script(tmp_path), {}, out=out, quiet=True):
            raise RuntimeError("x")
    assert len(list((out.parent / ".failed" / "mine").iterdir())) == 1


class _Died(BaseException):
    """Stands for the process being killed: no handler runs."""


def test_crash_between_the_two_renames_is_recovered(tmp_path, monkeypatch):
    d = _good_run(tmp_path)
    before = _snapshot(d)
    real = os.rename

    def rename(src, dst):
        if Path(src).name.startswith(".partial-") and Path(dst) == d:
            raise _Died()
        return real(src, dst)
    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(_Died):
        with results.Run(_script(tmp_path), {}, quiet=True) as run:
            run.table("sweep", [{"a": 2}])
    monkeypatch.setattr(os, "rename", real)
    assert not d.exists() and (d.parent / ".previous" / "01_demo" / "summary.json").exists()
    assert store.load_summary(d)["status"] == "ok"              # load_summary puts the last good run back
    assert _snapshot(d) == before
    # the same through a new Run
    real(d, d.parent / ".previous" / "01_demo")
    results.Run(_script(tmp_path), {}, quiet=True).fail(RuntimeError("x"))
    assert _snapshot(d) == before


def test_failed_runs_are_kept_under_dot_failed_and_pruned_to_5(tmp_path, monkeypatch):
    d = _good_run(tmp_path)
    before = _snapshot(d)
    for i in range(7):
        with pytest.raises(ValueError):
            with results.Run(_script(tmp_path), {}, quiet=True) as run:
                run.note(f"attempt {i}")
                raise ValueError(f"bad {i}")
    kept = sorted((d.parent / ".failed" / "01_demo").iterdir())
    assert len(kept) == store.KEEP_FAILED == 5
    assert [json.loads((k / "summary.json").read_text())["notes"] for k in kept] == [[f"attempt {i}"] for i in range(2, 7)]
    assert all((k / "error.txt").read_text().count("ValueError: bad") == 1 for k in kept)
    assert _snapshot(d) == before                                       # the last good run, byte for byte


def test_finish_with_a_status_other_than_ok_is_not_promoted(tmp_path):
    d = _good_run(tmp_path)
    before = _snapshot(d)
    run = results.Run(_script(tmp_path), {}, quiet=True)
    kept = run.finish("partial")
    assert kept.parent == d.parent / ".failed" / "01_demo" and kept.name.endswith("-partial")
    assert json.loads((kept / "summary.json").read_text())["status"] == "partial" and _snapshot(d) == before


def test_stale_partial_folders_of_dead_processes_are_pruned(tmp_path):
    base = tmp_path / "demo" / "results"
    base.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = [base / f".partial-01_demo-20260101-000000-000001-{dead.pid}", base / f".trash-01_demo-x-{dead.pid}"]
        live = base / f".partial-01_demo-20260101-000000-000002-{alive.pid}"
        for p in stale + [live]:
            (p / "ncu").mkdir(parents=True)
        with results.Run(_script(tmp_path), {}, quiet=True):
            pass
        assert not any(p.exists() for p in stale) and live.exists()
    finally:
        alive.kill()
        alive.wait()


def test_read_only_results_folder_is_one_setup_line(tmp_path):
    base = tmp_path / "demo" / "results"
    base.mkdir(parents=True)
    base.chmod(0o500)
    try:
        if os.access(base, os.W_OK):
            pytest.skip("running as root: chmod does not make the folder read-only")
        with pytest.raises(checks.SetupError) as ei:
            results.Run(_script(tmp_path), {}, quiet=True)
        assert str(ei.value) == (f"results folder {base} is not writable: [Errno 13] Permission denied "
                                 "(fix its permissions or pass --out DIR)")
    finally:
        base.chmod(0o700)


def test_results_path_that_is_a_file_is_one_setup_line(tmp_path):
    """The same guard, also as root: the results folder cannot be created."""
    base = tmp_path / "demo" / "results"
    base.parent.mkdir(parents=True)
    base.write_text("not a folder")
    script = _script(tmp_path)
    with pytest.raises(checks.SetupError) as ei:
        results.Run(script, {}, quiet=True)
    assert str(ei.value) == (f"results folder {base / Path(script).stem} cannot be made: {base} is a file, not a "
                             "folder (move it away or pass --out DIR)")      # not 'not writable ... permissions'


def _enospc(*a, **k):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_disk_full_while_finishing_keeps_earlier_results(tmp_path, monkeypatch):
    d = _good_run(tmp_path)
    before = _snapshot(d)
    real = store.write_json_atomic
    monkeypatch.setattr(store, "write_json_atomic",
                        lambda p, data: _enospc() if ".partial-" in str(p) else real(p, data))
    with pytest.raises(store.ResultsError) as ei:
        with results.Run(_script(tmp_path), {}, quiet=True) as run:
            run.table("sweep", [{"a": 2}])
    (rec,) = (d.parent / ".failed" / "01_demo").iterdir()            # a small record could be written
    assert str(ei.value) == (f"results of 01_demo not saved ([Errno 28] No space left on device while "
                             f"finishing); {d} left as it was; record in {rec}")
    assert sorted(p.name for p in rec.iterdir()) == ["error.txt", "summary.json"]
    assert _snapshot(d) == before and not list(d.parent.glob(".partial-*"))


def test_disk_full_everywhere_leaves_no_partial_and_no_record(tmp_path, monkeypatch):
    d = _good_run(tmp_path)
    before = _snapshot(d)
    monkeypatch.setattr(store, "write_json_atomic", _enospc)
    with pytest.raises(store.ResultsError) as ei:
        with results.Run(_script(tmp_path), {}, quiet=True):
            pass
    assert str(ei.value) == (f"results of 01_demo not saved ([Errno 28] No space left on device while "
                             f"finishing); {d} left as it was")
    assert _snapshot(d) == before and not list(d.parent.glob(".partial-*"))
    assert not (d.parent / ".failed" / "01_demo").exists() or not list((d.parent / ".failed" / "01_demo").iterdir())


def test_disk_full_while_writing_a_table_is_one_results_error(tmp_path, monkeypatch):
    d = _good_run(tmp_path)
    before = _snapshot(d)
    real = Path.write_text
    monkeypatch.setattr(Path, "write_text",
                        lambda self, *a, **k: _enospc() if self.name == "story.txt" else real(self, *a, **k))
    with pytest.raises(store.ResultsError) as ei:
        with results.Run(_script(tmp_path), {}, quiet=True) as run:
            run.story("x")
    monkeypatch.undo()
    (rec,) = (d.parent / ".failed" / "01_demo").iterdir()
    assert str(ei.value) == f"results of 01_demo not saved ([Errno 28] No space left on device); {d} left as it was; record in {rec}"
    assert _snapshot(d) == before and not list(d.parent.glob(".partial-*"))


def test_two_runs_at_once_last_to_finish_wins_whole(tmp_path):
    script = _script(tmp_path)
    a = results.Run(script, {"who": "a"}, quiet=True)
    b = results.Run(script, {"who": "b"}, quiet=True)
    a.path("only_a.txt").write_text("a")
    b.path("only_b.txt").write_text("b")
    b.finish()
    a.finish()
    d = a.final_dir
    assert json.loads((d / "summary.json").read_text())["args"] == {"who": "a"} and not (d / "only_b.txt").exists()
    prev = d.parent / ".previous" / "01_demo"
    assert json.loads((prev / "summary.json").read_text())["args"] == {"who": "b"} and not (prev / "only_a.txt").exists()


def test_concurrent_processes_never_mix_two_runs(tmp_path):
    script = _script(tmp_path)
    code = f"""
        import sys; sys.path.insert(0, {str(ROOT)!r})
        from common.run.results import Run
        me = sys.argv[1]
        for i in range(4):
            with Run({str(script)!r}, {{"who": me, "i": i}}, quiet=True) as run:
                for k in range(3):
                    run.path(f"{{me}}_{{i}}_{{k}}.txt").write_text(me)
    """
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), w]) for w in "pqrs"]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    base = tmp_path / "demo" / "results"
    for d in (base / "01_demo", base / ".previous" / "01_demo"):
        s = json.loads((d / "summary.json").read_text())
        who, i = s["args"]["who"], s["args"]["i"]
        assert sorted(p.name for p in d.glob("*.txt")) == sorted([f"{who}_{i}_{k}.txt" for k in range(3)] + ["log.txt"])
    assert [p.name for p in base.iterdir() if p.name.startswith((".partial", ".trash"))] == []


def test_judge_appends_the_verdict_with_its_evidence(tmp_path):
    h = Hypothesis("bw", "decode is memory-bound", quantity="DRAM % of peak", unit="%", low=70, high=90,
                   source="PLAN.md")
    with results.Run(_script(tmp_path), {}, quiet=True) as run:
        rec = run.judge(h, [81.0, 80.0, 82.0], evidence="ncu.csv row 3")
        run.judge(h, [81.0, 80.0, 82.0], premise="no split happened")
    obs = store.load_summary(run.final_dir)["observations"]
    assert rec["verdict"] == "confirmed" and obs[0]["evidence"] == "ncu.csv row 3"
    assert [o["verdict"] for o in obs] == ["confirmed", "inconclusive"]


def test_table_without_pandas_writes_the_same_csv(tmp_path):
    code = f"""
        import sys; sys.modules["pandas"] = None; sys.path.insert(0, {str(ROOT)!r})
        from common.run.results import Run
        with Run({str(_script(tmp_path))!r}, {{}}, quiet=True) as run:
            run.table("sweep", [{{"a": 1, "b": 2.5}}, {{"a": 2, "b": "x"}}])
    """
    p = _py(code)
    assert p.communicate(timeout=60)[1] == "" and p.returncode == 0
    assert (tmp_path / "demo" / "results" / "01_demo" / "sweep.csv").read_text().splitlines() == ["a,b", "1,2.5", "2,x"]


# ---------------------------------------------------------------- run_main: one line, exit code, error file

RUN_MAIN = """
    import sys, time; sys.path.insert(0, {root!r})
    from common.run.results import Run
    from common.base.checks import run_main, SetupError
    def main(argv=None):
        with Run({script!r}, {{}}, quiet=True) as run:
            {body}
    run_main(main)
"""


def _run_main(tmp_path, body, env=None):
    code = RUN_MAIN.format(root=str(ROOT), script=str(_script(tmp_path)), body=body)
    p = _py(code, env={"HANDS_ON_CACHE": str(tmp_path / "cache"), **(env or {})})
    out, err = p.communicate(timeout=60)
    return p.returncode, err


def test_run_main_failure_names_the_runs_own_error_file(tmp_path):
    rc, err = _run_main(tmp_path, "1 / 0")
    (kept,) = (tmp_path / "demo" / "results" / ".failed" / "01_demo").iterdir()
    assert rc == 1 and err == f"[failed] ZeroDivisionError: division by zero (traceback: {kept / 'error.txt'})\n"
    assert "Traceback" in (kept / "error.txt").read_text() and not (tmp_path / "cache" / "errors").exists()


def test_run_main_setup_error_is_exit_2(tmp_path):
    rc, err = _run_main(tmp_path, "raise SetupError('no GPU here')")
    assert rc == 2 and err == "[setup] no GPU here\n"
    (kept,) = (tmp_path / "demo" / "results" / ".failed" / "01_demo").iterdir()
    assert kept.name.endswith("-setup-error")


def test_run_main_disk_full_is_one_line(tmp_path):
    body = "import errno; raise OSError(errno.ENOSPC, 'No space left on device')"
    rc, err = _run_main(tmp_path, body)
    (kept,) = (tmp_path / "demo" / "results" / ".failed" / "01_demo").iterdir()
    d = tmp_path / "demo" / "results" / "01_demo"
    assert rc == 2 and err == (f"[setup] results of 01_demo not saved ([Errno 28] No space left on device); "
                               f"{d} left as it was; record in {kept}\n")


def test_run_main_without_a_run_keeps_per_run_error_files_pruned_to_20(tmp_path):
    errors = tmp_path / "cache" / "errors"
    errors.mkdir(parents=True)
    for i in range(25):
        (errors / f"20200101-000000-{i:06d}-1.txt").write_text("old")
    code = f"""
        import sys; sys.path.insert(0, {str(ROOT)!r})
        from common.base.checks import run_main
        def main(argv=None):
            raise KeyError("nope")
        run_main(main)
    """
    p = _py(code, env={"HANDS_ON_CACHE": str(tmp_path / "cache")})
    err = p.communicate(timeout=60)[1]
    files = sorted(errors.iterdir())
    assert p.returncode == 1 and len(files) == checks.KEEP_ERRORS == 20
    new = files[-1]
    assert new.name.endswith(f"-{p.pid}.txt") and "KeyError" in new.read_text()
    assert err == f"[failed] KeyError: 'nope' (traceback: {new})\n"


def test_sigterm_is_recorded_as_interrupted(tmp_path):
    d = _good_run(tmp_path)
    before = _snapshot(d)
    code = RUN_MAIN.format(root=str(ROOT), script=str(_script(tmp_path)),
                           body='run.table("sweep", [{"a": 9}]); print("ready", flush=True); time.sleep(30)')
    p = _py(code, env={"HANDS_ON_CACHE": str(tmp_path / "cache")})
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    err = p.communicate(timeout=30)[1]
    (kept,) = (d.parent / ".failed" / "01_demo").iterdir()
    assert p.returncode == 143 and err == ("[interrupted] stopped by SIGTERM; earlier results were left as they "
                                           f"were (this run kept in {kept}).\n")
    assert json.loads((kept / "summary.json").read_text())["status"] == "interrupted" and _snapshot(d) == before


def test_require_modules_names_every_missing_one():
    with pytest.raises(checks.SetupError) as ei:
        checks.require_modules(("json", None), ("no_such_mod_a", "pip install a"), ("no_such_mod_b", None))
    assert str(ei.value) == ("Python package(s) not importable: 'no_such_mod_a' (pip install a), "
                             "'no_such_mod_b' (pip install no_such_mod_b)")
    assert checks.require_modules(("json", None), ("csv", None))[0].__name__ == "json"


# ---------------------------------------------------------------- reports only move forward

PAGE = """# Demo

<!-- auto:runs -->
_not run yet_
<!-- /auto -->

<!-- auto:01_demo/story -->
committed story
<!-- /auto -->

<!-- auto:01_demo/table:sweep -->
committed table
<!-- /auto -->

<!-- auto:02_other/story -->
committed other story
<!-- /auto -->
"""


def _page(tmp_path, name="analysis.md", text=PAGE):
    md = tmp_path / "demo" / "reports" / name
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(text)
    return md


def _quiet(*a):
    pass


def _block(text, key):
    return report.BLOCK.search(text[text.index(f"<!-- auto:{key} -->"):]).group("body")


RUN_H200 = "<!-- run: 1x NVIDIA H200 · torch 2.11.0+cu130 · commit 6ca9eea · 2026-11-21 -->"


def test_blocks_carry_their_run_and_the_page_lists_its_runs(tmp_path):
    md = _page(tmp_path)
    _good_run(tmp_path)
    _good_run(tmp_path, "02_other", date="2026-11-22T10:00:00Z", commit="d505b50")
    o = report.refresh(["demo"], root=tmp_path, echo=_quiet)
    text = md.read_text()
    assert _block(text, "01_demo/story") == f"{RUN_H200}\n```text\nSTORY of 01_demo\n```\n"
    assert _block(text, "runs") == (
        "Runs behind this page (from the run line each block below carries):\n\n"
        "| GPU | stack | commit | date | results of |\n|---|---|---|---|---|\n"
        "| 1x NVIDIA H200 | torch 2.11.0+cu130 | 6ca9eea | 2026-11-21 | 01_demo |\n"
        "| 1x NVIDIA H200 | torch 2.11.0+cu130 | d505b50 | 2026-11-22 | 02_other |\n")
    assert o.mixed == [] and "demo/reports/analysis.md: runs" in o.refreshed
    again = report.refresh(["demo"], root=tmp_path, echo=_quiet)
    assert again.files_written == [] and md.read_text() == text                     # idempotent


def test_runs_header_on_a_clone_without_results_is_byte_identical(tmp_path):
    md = _page(tmp_path)
    _good_run(tmp_path)
    report.refresh(["demo"], root=tmp_path, echo=_quiet)
    committed = md.read_bytes()
    clone = tmp_path / "clone"
    _page(clone, text=committed.decode())
    o = report.refresh(["demo"], root=clone, echo=_quiet)
    assert (clone / "demo" / "reports" / "analysis.md").read_bytes() == committed and o.files_written == []
    assert o.refreshed == ["demo/reports/analysis.md: runs"]                # recomputed from the kept blocks
    assert "1 block(s) carry no run: this run did not measure them" in _block(committed.decode(), "runs")  # 02_other


def test_a_page_is_one_machines_the_newest_runs(tmp_path, capsys, monkeypatch):
    """Runs of two machines in results/: the pages are the newest run's machine's; the other machine's run is one
    line, and its block says this run did not measure it (never the other machine's figures beside)."""
    md = _page(tmp_path)
    _good_run(tmp_path, date="2026-11-22T10:00:00Z")
    _good_run(tmp_path, "02_other", gpu="NVIDIA H100 80GB HBM3", torch="2.10.0")
    monkeypatch.setattr(report, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(report, "refresh", lambda systems, root=tmp_path, **k: _refresh(["demo"], root=root))
    assert report.main([]) == 0
    out = capsys.readouterr().out
    assert ("skipped demo/results/02_other/summary.json: its run on 1x NVIDIA H100 80GB HBM3 is not this refresh's "
            "machine (1x NVIDIA H200, that of the newest run): a page shows one machine's runs (`make reports "
            "ACCEPT_MIXED=1` puts them beside)") in out
    text = md.read_text()
    assert "mixes" not in text and "H100" not in _block(text, "runs")
    assert _block(text, "02_other/story") == ("_Not measured in this run on 1x NVIDIA H200: no run of 02_other; "
                                              "`python demo/scripts/02_other.py --quick` measures it._\n")


def test_accept_mixed_puts_two_machines_beside_and_says_so(tmp_path, capsys, monkeypatch):
    md = _page(tmp_path)
    _good_run(tmp_path)
    _good_run(tmp_path, "02_other", gpu="NVIDIA H100 80GB HBM3", torch="2.10.0")
    monkeypatch.setenv("ACCEPT_MIXED", "1")
    monkeypatch.setattr(report, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(report, "refresh", lambda systems, root=tmp_path, **k: _refresh(["demo"], root=root))
    assert report.main([]) == 0
    mixed = "This page mixes runs from 2 machines: 1x NVIDIA H200; 1x NVIDIA H100 80GB HBM3"
    assert _block(md.read_text(), "runs").startswith(f"**{mixed}; compare their figures with care.**\n\n")
    assert f"demo/reports/analysis.md: {mixed}\n" in capsys.readouterr().out


_refresh = report.refresh


def test_old_schema_summary_is_skipped_and_the_rest_refreshed(tmp_path):
    md = _page(tmp_path)
    _good_run(tmp_path)
    d = _good_run(tmp_path, "02_other")
    s = json.loads((d / "summary.json").read_text())
    del s["schema"]
    (d / "summary.json").write_text(json.dumps(s))
    o = report.refresh(["demo"], root=tmp_path, echo=_quiet)
    assert o.skipped == ['skipped demo/results/02_other/summary.json: no "schema" key (an older summary; '
                         'reports read schema 2): re-run the script']
    text = md.read_text()
    assert _block(text, "02_other/story").startswith("_Not measured in this run on 1x NVIDIA H200: no run of 02_other")
    assert "STORY of 01_demo" in _block(text, "01_demo/story")


@pytest.mark.parametrize("content, why", [
    (b"{not json", "not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
    (b"\x89PNG\r\n", "not text (undecodable bytes)"),
    (b"[1, 2]", "not a JSON object (a list)"),
    (b'{"schema": 1, "status": "ok"}', "schema 1 is older than 2: re-run the script"),
    (b'{"schema": 2, "status": "running", "provenance": {"date_utc": "x"}}',
     "status 'running': only finished, successful runs refresh reports"),
    (b'{"schema": 2, "status": "ok"}', "no provenance (GPU, stack, commit, date)"),
    (b'{"schema": 2, "status": "ok", "provenance": {"date_utc": "x"}, "observations": [{"expected": 1}]}',
     "observation 1 lacks expected/observed/verdict"),
    (b'{"schema": 2, "status": "ok", "provenance": {"date_utc": "x"}, "story": 5}', '"story" is a int, not a str'),
])
def test_bad_summaries_are_skipped_with_one_line(tmp_path, content, why):
    md = _page(tmp_path)
    d = tmp_path / "demo" / "results" / "01_demo"
    d.mkdir(parents=True)
    (d / "summary.json").write_bytes(content)
    o = report.refresh(["demo"], root=tmp_path, echo=_quiet)
    assert o.skipped == [f"skipped demo/results/01_demo/summary.json: {why}"]
    assert md.read_text() == PAGE and o.files_written == []


def test_a_table_that_is_not_text_is_said_in_its_block(tmp_path):
    md = _page(tmp_path)
    d = _good_run(tmp_path)
    (d / "sweep.csv").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    o = report.refresh(["demo"], root=tmp_path, echo=_quiet)
    assert o.skipped == ["skipped demo/results/01_demo/sweep.csv: not text (undecodable byte 0x89 at offset 0)"]
    text = md.read_text()
    assert _block(text, "01_demo/table:sweep") == (      # never the committed (another run's) table beside this run's
        "_Not measured in this run on 1x NVIDIA H200: 01_demo's run has no sweep (skipped: not text (undecodable byte "
        "0x89 at offset 0)); `01_demo` measures it._\n") and "STORY of 01_demo" in text


def test_a_ragged_table_is_said_in_its_block(tmp_path):
    md = _page(tmp_path)
    d = _good_run(tmp_path)
    (d / "sweep.csv").write_text("a,b\n1,2\n3,4,5\n")
    o = report.refresh(["demo"], root=tmp_path, echo=_quiet)
    assert o.skipped == ["skipped demo/results/01_demo/sweep.csv: line 3 has 3 fields, the header 2"]
    assert "01_demo's run has no sweep (skipped: line 3 has 3 fields, the header 2)" in \
        _block(md.read_text(), "01_demo/table:sweep")


def test_refresh_is_all_or_nothing(tmp_path, monkeypatch, capsys):
    """An unexpected error in a later page: no page and no figure is written, one line, exit 1."""
    first = _page(tmp_path, "a.md", PAGE + "\n<!-- auto:01_demo/figure:roof -->\nold\n<!-- /auto -->\n")
    later = _page(tmp_path, "b.md", "<!-- auto:02_other/headline -->\nold\n<!-- /auto -->\n")
    d = _good_run(tmp_path)
    (d / "roof.png").write_bytes(b"png")
    _good_run(tmp_path, "02_other")
    real = report.Renderer._body

    def body(self, stem, what, s):
        if what == "headline":
            raise KeyError("boom")
        return real(self, stem, what, s)
    monkeypatch.setattr(report.Renderer, "_body", body)
    before = (first.read_bytes(), later.read_bytes())
    with pytest.raises(report.RenderError) as ei:
        report.refresh(["demo"], root=tmp_path, echo=_quiet)
    assert str(ei.value) == "demo/reports/b.md: block 02_other/headline: KeyError: 'boom'"
    assert (first.read_bytes(), later.read_bytes()) == before
    assert not (tmp_path / "demo" / "reports" / "figures").exists()
    monkeypatch.setattr(report, "refresh", lambda systems, **k: _refresh(["demo"], root=tmp_path))
    assert report.main(["--quiet"]) == 1
    assert capsys.readouterr().out == ("[failed] reports not refreshed, no file written: "
                                       "demo/reports/b.md: block 02_other/headline: KeyError: 'boom'\n")


def test_index_lists_this_machines_runs_and_says_which_script_did_not_run(tmp_path):
    _script(tmp_path, "00_check_env")
    _good_run(tmp_path)
    md = _page(tmp_path, "INDEX.md", "<!-- auto:index -->\n| script | last run | status | GPU | headline |\n|---|---|---|---|---|\n"
               "| [`00_check_env.py`](../scripts/00_check_env.py) | 2026-11-21T16:08:31Z | ok | NVIDIA H200 | copy_tb_s=4.28 |\n"
               "| [`01_demo.py`](../scripts/01_demo.py) | old | ok | NVIDIA H200 | - |\n<!-- /auto -->\n")
    for _ in range(2):
        with pytest.raises(RuntimeError):
            with results.Run(_script(tmp_path), {}, quiet=True):
                raise RuntimeError("x")
    report.refresh(["demo"], root=tmp_path, echo=_quiet)
    assert md.read_text().splitlines()[3:5] == [
        "| [`00_check_env.py`](../scripts/00_check_env.py) | - | not run on 1x NVIDIA H200 | - | - |",
        "| [`01_demo.py`](../scripts/01_demo.py) | 2026-11-21T16:08:31Z | ok (2 failed kept) | NVIDIA H200 | tb_s=2.50 |"]


def test_report_runs_without_pandas_or_matplotlib(tmp_path):
    md = _page(tmp_path)
    _good_run(tmp_path, rows=[{"batch": 1, "tb_s": 1.23456}, {"batch": 2, "tb_s": float("nan")}])
    code = f"""
        import sys; sys.modules["pandas"] = None; sys.modules["matplotlib"] = None
        sys.path.insert(0, {str(ROOT)!r})
        from pathlib import Path
        from common.render import report
        o = report.refresh(["demo"], root=Path({str(tmp_path)!r}))
        print(len(o.refreshed), o.skipped)
    """
    p = _py(code)
    out, err = p.communicate(timeout=60)
    assert (p.returncode, err, out) == (0, "", "4 []\n")           # 02_other's block: "not measured"
    assert _block(md.read_text(), "01_demo/table:sweep") == f"{RUN_H200}\n| batch | tb_s |\n|---|---|\n| 1 | 1.23 |\n| 2 | - |\n"


def test_a_folder_renamed_away_while_it_is_looked_at_is_not_called_a_file(tmp_path, monkeypatch):
    """Four runs of one script at once (the test above) failed once under load with '.previous/01_demo is not
    a folder': another run renamed it between foreign()'s stat and a second look (os.path.isdir). The stat's own
    mode is the answer; a folder that vanishes between two looks is looked at again."""
    import common.run.results as R
    script = _script(tmp_path)
    with R.Run(str(script), {"i": 0}, quiet=True) as run:
        run.path("a.txt").write_text("x")
    final = tmp_path / "demo" / "results" / "01_demo"
    real_isdir = os.path.isdir
    monkeypatch.setattr(R.os.path, "isdir", lambda p: False if Path(p) == final else real_isdir(p))   # "gone"
    assert store.foreign(final, "demo/scripts/01_demo.py") is None


