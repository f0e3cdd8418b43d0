"""common.run.results keeps earlier results safe; common.render.report refreshes only auto blocks."""
import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from common.capture import store  # noqa: E402
from common.judge import verdicts  # noqa: E402
from common.render import report  # noqa: E402
from common.run import results  # noqa: E402


def _script(tmp_path, system="demo"):
    p = tmp_path / system / "scripts" / "01_demo.py"
    p.parent.mkdir(parents=True)
    p.write_text("# demo\n")
    return p


def test_run_writes_files_then_summary(tmp_path):
    script = _script(tmp_path)
    with results.Run(script, {"quick": True}, quiet=True) as run:
        run.table("sweep", [{"a": 1, "b": 2.5}])
        run.headline(tb_s=2.7)
        run.observe("decode is memory-bound", "DRAM 80%", "confirmed", "ncu.csv")
        run.story("STORY\n└── done")
        assert not (run.final_dir / "summary.json").exists()            # nothing final while running
    d = tmp_path / "demo" / "results" / "01_demo"
    s = json.loads((d / "summary.json").read_text())
    assert s["status"] == "ok" and s["schema"] == store.SCHEMA == 2
    assert s["tables"] == ["sweep"] and s["headline"]["tb_s"] == 2.7
    assert (d / "sweep.csv").read_text().splitlines() == ["a,b", "1,2.5"]
    assert not list(d.parent.glob(".partial-*")) and not list(d.glob(".partial-*"))
    assert {"date_utc", "command", "git", "packages", "gpu"} <= set(s["provenance"])


def test_run_records_the_command_a_wrapper_passes(tmp_path):
    """The 06 pipelines (common.run.pipeline) pass their own command line to Run."""
    script = _script(tmp_path)
    with results.Run(script, {}, quiet=True, command="./demo/scripts/06_full_pipeline.sh --quick --ncu") as run:
        pass
    s = json.loads((run.final_dir / "summary.json").read_text())
    assert s["provenance"]["command"] == "./demo/scripts/06_full_pipeline.sh --quick --ncu"
    with results.Run(script, {}, quiet=True) as run:
        pass
    assert json.loads((run.final_dir / "summary.json").read_text())["provenance"]["command"].split()[0] != "./demo"


def test_failed_run_keeps_last_good_result(tmp_path):
    script = _script(tmp_path)
    with results.Run(script, {}, quiet=True) as run:
        run.table("sweep", [{"a": 1}])
    d = tmp_path / "demo" / "results" / "01_demo"
    good = (d / "summary.json").read_text()
    with pytest.raises(ZeroDivisionError) as ei:
        with results.Run(script, {}, quiet=True) as run:
            run.table("sweep", [{"a": 999}])
            1 / 0
    assert (d / "summary.json").read_text() == good                       # untouched
    assert (d / "sweep.csv").read_text().splitlines()[1] == "1"
    assert sorted(p.name for p in d.iterdir()) == ["log.txt", "summary.json", "sweep.csv"]
    (failed,) = (tmp_path / "demo" / "results" / ".failed" / "01_demo").iterdir()
    assert failed.name.endswith("-failed") and ei.value.kept_in == failed
    fs = json.loads((failed / "summary.json").read_text())
    assert fs["status"] == "failed" and "ZeroDivisionError" in fs["error"] and "Traceback" in fs["traceback"]
    assert ei.value.error_file == failed / "error.txt" and "ZeroDivisionError" in (failed / "error.txt").read_text()
    assert (failed / "sweep.csv").read_text().splitlines()[1] == "999"     # the failed run's own files


@pytest.mark.parametrize("start", ["inherited", "ignored"])
def test_interrupted_run_is_recorded_not_promoted(tmp_path, start):
    """A real Ctrl-C (SIGINT) in the middle of a run: earlier results stay, the run says 'interrupted'. Also when
    the script started with SIGINT ignored, as a background job of a non-interactive shell (`( python x.py & )`,
    `nohup ... &`) starts it: Python then installs no KeyboardInterrupt handler, and before run_main put it back a
    `kill -INT` did nothing (the test timed out)."""
    script = _script(tmp_path)
    root = Path(__file__).resolve().parents[1]
    code = textwrap.dedent(f"""
        import sys, time; sys.path.insert(0, {str(root)!r})
        from common.run.results import Run
        from common.base.checks import run_main
        def main(argv=None):
            with Run({str(script)!r}, {{}}, quiet=True) as run:
                run.table("sweep", [{{"a": 2}}]); print("ready", flush=True); time.sleep(30)
        run_main(main)
    """)
    pre = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if start == "ignored" else (
        lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=pre)
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    d = tmp_path / "demo" / "results" / "01_demo"
    assert not (d / "summary.json").exists()
    (kept,) = (tmp_path / "demo" / "results" / ".failed" / "01_demo").glob("*-interrupted")
    assert p.returncode == 130 and err == ("[interrupted] stopped by Ctrl-C; earlier results were left as "
                                           f"they were (this run kept in {kept}).\n")
    assert json.loads((kept / "summary.json").read_text())["status"] == "interrupted"


def test_point_errors_and_verdicts(tmp_path):
    assert results.VERDICTS is verdicts.VERDICTS
    with results.Run(_script(tmp_path), {}, quiet=True) as run:
        run.point_error({"batch": 256, "kv": 32768}, MemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
        with pytest.raises(ValueError):
            run.observe("x", "y", "maybe")
    s = store.load_summary(run.final_dir)
    assert s["point_errors"] == [{"batch": 256, "kv": 32768, "error": "MemoryError: CUDA out of memory. Tried to allocate 2 GiB"}]


def test_an_optional_pass_that_fails_is_a_note_and_the_run_goes_on(tmp_path):
    def ncu_pass(n):
        raise RuntimeError(f"ncu: ERR_NVGPUCTRPERM x{n}\nsecond line")
    with results.Run(_script(tmp_path), {}, quiet=True) as run:
        assert run.optional("ncu pass", lambda: 7) == 7
        assert run.optional("ncu pass", ncu_pass, 2) is None
        with pytest.raises(KeyboardInterrupt):                   # Ctrl-C still ends the run
            run.optional("counters", lambda: (_ for _ in ()).throw(KeyboardInterrupt()))
        run.table("sweep", [{"a": 1}])
    s = store.load_summary(run.final_dir)
    assert s["notes"] == ["ncu pass skipped: RuntimeError: ncu: ERR_NVGPUCTRPERM x2"] and s["status"] == "ok"


def test_atomic_json_never_leaves_partial_file(tmp_path):
    p = tmp_path / "s.json"
    store.write_json_atomic(p, {"x": float("nan"), "y": [1.0, float("inf")]})
    assert json.loads(p.read_text()) == {"x": None, "y": [1.0, None]}
    assert [f.name for f in tmp_path.iterdir()] == ["s.json"]


REPORT = """# Demo

Hand-written text stays.

<!-- auto:01_demo/story -->
_not run yet_
<!-- /auto -->

<!-- auto:01_demo/observations -->
_not run yet_
<!-- /auto -->

<!-- auto:02_missing/story -->
committed text of a block without results
<!-- /auto -->

<!-- auto:01_demo/table:sweep -->
old
<!-- /auto -->

<!-- auto:01_demo/table:sweep[tb_s] -->
old
<!-- /auto -->
"""


def test_report_refresh_fills_blocks_and_keeps_the_rest(tmp_path):
    script = _script(tmp_path)
    (tmp_path / "demo" / "reports").mkdir()
    md = tmp_path / "demo" / "reports" / "analysis.md"
    md.write_text(REPORT)
    with results.Run(script, {}, quiet=True) as run:
        run.table("sweep", [{"batch": 1, "tb_s": 1.23456}, {"batch": 2, "tb_s": float("nan")}])
        run.observe("decode is memory-bound", "DRAM 81% | SM 12%", "confirmed", "ncu.csv")
        run.story("STORY\n└── decode 198 us")
    o = report.refresh(["demo"], root=tmp_path, echo=lambda *a: None)
    text = md.read_text()
    assert "Hand-written text stays." in text
    assert "```text\nSTORY\n└── decode 198 us\n```" in text
    assert "| decode is memory-bound | DRAM 81% \\| SM 12% | **confirmed** | ncu.csv |" in text
    assert "_Not measured in this run on 0x no GPU: no run of 02_missing" in text    # never another run's text
    assert "| 1 | 1.23 |" in text and "| 2 | - |" in text
    assert "| tb_s |\n|---|\n| 1.23 |\n| - |" in text                  # column selection
    assert "demo/reports/analysis.md: 02_missing/story" in o.refreshed
    # a second refresh with the same results changes nothing
    before = md.read_bytes()
    o2 = report.refresh(["demo"], root=tmp_path, echo=lambda *a: None)
    assert md.read_bytes() == before and o2.files_written == []


def test_report_refresh_without_results_changes_no_file(tmp_path):
    (tmp_path / "demo" / "reports").mkdir(parents=True)
    md = tmp_path / "demo" / "reports" / "analysis.md"
    md.write_text(REPORT)
    o = report.refresh(["demo"], root=tmp_path, echo=lambda *a: None)
    assert md.read_text() == REPORT and o.files_written == [] and len(o.kept) == 5


def test_committed_reports_are_well_formed():
    """Every auto block in the repository's reports opens and closes, with a known key kind."""
    root = Path(__file__).resolve().parents[1]
    kinds = {"story", "observations", "provenance", "headline", "errors", "findings"}
    n = 0
    for md in root.glob("*/reports/*.md"):
        text = md.read_text()
        assert text.count("<!-- auto:") == text.count("<!-- /auto -->"), md
        for m in report.BLOCK.finditer(text):
            key = m.group("key")
            n += 1
            if key in ("index", "runs", "reference"):
                continue
            stem, what = key.split("/", 1)
            assert stem[:2].isdigit(), (md, key)
            assert what in kinds or what.split(":")[0] in ("table", "figure", "story"), (md, key)
    assert n > 0


def test_report_handles_an_empty_table(tmp_path):
    script = _script(tmp_path)
    (tmp_path / "demo" / "reports").mkdir()
    md = tmp_path / "demo" / "reports" / "x.md"
    md.write_text("<!-- auto:01_demo/table:sweep -->\nold\n<!-- /auto -->\n")
    with results.Run(script, {}, quiet=True) as run:
        run.path("sweep.csv").write_text("")
    report.refresh(["demo"], root=tmp_path, echo=lambda *a: None)
    assert "empty table" in md.read_text()


REFERENCE_PAGE = """# fake final report
<!-- auto:runs -->
<!-- /auto -->

## Against the reference run

<!-- auto:reference -->
_committed comparison_
<!-- /auto -->
"""


def _reference_world(tmp_path, fixture_path, gpu="NVIDIA H200", flip=("rmsnorm-bw",)):
    """flashinfer/results/<stem>: the real H200 runs (relabelled to ``gpu`` when asked); the committed reference: a copy
    of them that says it ran on an H100 (DRAM ceilings, L2 and memory of one; measured figures kept), with the
    ceilings the H200 measured in tests/fixtures/ceilings_h200_v5.json recorded on this run (these runs predate that), with the
    verdicts of ``flip`` turned over on purpose, written by common.render.reference.build."""
    import shutil

    from common.capture import ceilings
    from common.render import reference
    measured = ceilings.ceilings_brief(json.loads(fixture_path("ceilings_h200_v5.json").read_text()))   # the H200's
    src = fixture_path("results_flashinfer_h200")
    res = tmp_path / "flashinfer" / "results"
    shutil.copytree(src, res)
    ref_runs = []
    for p in sorted(res.glob("*/summary.json")):
        s = json.loads(p.read_text())
        s["provenance"].update(ceilings=measured, **({"gpu": gpu} if gpu != "NVIDIA H200" else {}))
        p.write_text(json.dumps(s))
        r = json.loads(json.dumps(s))
        r["provenance"].update(gpu="NVIDIA H100 80GB HBM3", l2_mb=50.0, date_utc="2026-11-20T10:00:00Z",
                               ceilings={**(r["provenance"].get("ceilings") or {}), "dram_copy_tb_s": 3.0,
                                         "dram_read_tb_s": 3.16, "bf16_tflops": 801.0})
        r["provenance"]["gpus"][0].update(name="NVIDIA H100 80GB HBM3", memory_gb=79.6)
        for o in r["observations"]:
            if o.get("hypothesis") in flip:
                o["verdict"] = "confirmed" if o["verdict"] != "confirmed" else "refuted"
        ref_runs.append(r)
    (tmp_path / "flashinfer" / "reports").mkdir()
    (tmp_path / "flashinfer" / "reports" / "reference.json").write_text(json.dumps(reference.build("flashinfer", ref_runs)))
    page = tmp_path / "flashinfer" / "reports" / "final-report.md"
    page.write_text(REFERENCE_PAGE)
    return page


def _ref_block(page):
    return page.read_text().split("<!-- auto:reference -->")[1].split("<!-- /auto -->")[0]


def test_the_reference_block_lists_each_changed_verdict_with_its_measured_reason(tmp_path, fixture_path):
    page = _reference_world(tmp_path, fixture_path)
    report.refresh(["flashinfer"], root=tmp_path, echo=lambda *a: None)
    block = _ref_block(page)
    assert block.count("<!-- run: 1x NVIDIA H200") == 1 and "H100" not in block.split("Against")[0]  # this run's line
    assert "Against the reference run on 1x NVIDIA H100 80GB HBM3 (`flashinfer/reports/reference.json`):" in block
    assert "| L2 (MB) | 60 | 50 | 1.20 |" in block and "| GPU memory (GB) | 151 | 79.6 | 1.89 |" in block
    assert "1 of 10 hypotheses judged in both runs changed verdict." in block
    row = next(ln for ln in block.splitlines() if "| rmsnorm-bw |" in ln)
    # judged on "% of the measured DRAM ceiling" (of its kind): the reason is the DRAM ceilings' measured ratios
    assert "**refuted** 67" in row and "**confirmed** 67" in row and "DRAM copy ceiling x1.43 (4.28 vs 3.00 TB/s)" in row
    assert "Run-to-run margins: measured on NVIDIA H200." in block


def test_a_change_nothing_measured_explains_is_shown_as_unexplained(tmp_path, fixture_path):
    page = _reference_world(tmp_path, fixture_path, flip=("auto-is-fa3",))     # a deterministic fact of the code
    report.refresh(["flashinfer"], root=tmp_path, echo=lambda *a: None)
    row = next(ln for ln in _ref_block(page).splitlines() if "| auto-is-fa3 |" in ln)
    assert "**unexplained**: no measured figure it depends on" in row


def test_the_reference_run_itself_and_a_model_without_margins_say_so(tmp_path, fixture_path):
    from common.render import reference
    page = _reference_world(tmp_path, fixture_path, gpu="NVIDIA A100-SXM4-80GB")
    report.refresh(["flashinfer"], root=tmp_path, echo=lambda *a: None)
    assert ("Run-to-run margins: none measured on NVIDIA A100-SXM4-80GB; each verdict used the largest margin known "
            "for its quantity") in _ref_block(page)
    reference.write(["flashinfer"], root=tmp_path, echo=lambda *a: None)        # this run becomes the reference
    report.refresh(["flashinfer"], root=tmp_path, echo=lambda *a: None)
    assert "This page is the reference run itself (1x NVIDIA A100-SXM4-80GB; its 10 judged quantities" in _ref_block(page)
    (tmp_path / "flashinfer" / "reports" / "reference.json").unlink()
    report.refresh(["flashinfer"], root=tmp_path, echo=lambda *a: None)
    assert "No reference run is committed for flashinfer (flashinfer/reports/reference.json)" in _ref_block(page)


def test_a_results_other_gpu_folder_is_named_not_read(tmp_path, fixture_path):
    import shutil
    page = _reference_world(tmp_path, fixture_path)
    shutil.copytree(tmp_path / "flashinfer" / "results" / "04_profile_rmsnorm",
                    tmp_path / "flashinfer" / "results" / "other-gpu" / "04_profile_rmsnorm")
    o = report.refresh(["flashinfer"], root=tmp_path, echo=lambda *a: None)
    assert ("skipped flashinfer/results/other-gpu: not read any more; to compare two machines, make one run the "
            "reference (python -m common reference --write) and refresh the other") in o.skipped
    assert "1 of 10 hypotheses" in _ref_block(page)


