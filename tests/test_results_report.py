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
    assert "committed text of a block without results" in text
    assert "| 1 | 1.23 |" in text and "| 2 | - |" in text
    assert "| tb_s |\n|---|\n| 1.23 |\n| - |" in text                  # column selection
    assert any("02_missing/story" in k for k in o.kept)
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
    kinds = {"story", "observations", "provenance", "headline", "errors"}
    n = 0
    for md in root.glob("*/reports/*.md"):
        text = md.read_text()
        assert text.count("<!-- auto:") == text.count("<!-- /auto -->"), md
        for m in report.BLOCK.finditer(text):
            key = m.group("key")
            n += 1
            if key in ("index", "runs") or key.startswith("versus/"):
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


VERSUS_PAGE = """# fake final report
<!-- auto:runs -->
<!-- /auto -->

## On the other GPU

<!-- auto:versus/other-gpu -->
_not run yet_
<!-- /auto -->

<!-- auto:04_profile_rmsnorm@other-gpu/table:fusion -->
_not run yet_
<!-- /auto -->
"""


def _other_gpu_world(tmp_path, fixture_path):
    """flashinfer/results/<stem> from the real H200 runs, and results/other-gpu/<stem> a copy of them
    that says it ran on an H100, with one verdict turned over (damaged on purpose: no second GPU model
    was lent when this was written) and no ceilings recorded in its provenance."""
    import shutil
    src = fixture_path("results_flashinfer_h200")
    res = tmp_path / "flashinfer" / "results"
    shutil.copytree(src, res)
    shutil.copytree(src, res / "other-gpu")
    for p in (res / "other-gpu").glob("*/summary.json"):
        s = json.loads(p.read_text())
        s["provenance"].update(gpu="NVIDIA H100 80GB HBM3", sm_count=132, l2_mb=50.0,
                               ceilings={"dram_tb_s": 3.0, "bf16_tflops": 700.0})
        s["provenance"]["gpus"][0].update(name="NVIDIA H100 80GB HBM3", memory_gb=79.6)
        for o in s["observations"]:
            if o.get("hypothesis") == "rmsnorm-bw":
                o["verdict"] = "confirmed"
        p.write_text(json.dumps(s))
    (tmp_path / "flashinfer" / "reports").mkdir()
    page = tmp_path / "flashinfer" / "reports" / "final-report.md"
    page.write_text(VERSUS_PAGE)
    return page


def test_versus_block_puts_each_verdict_of_two_gpus_side_by_side(tmp_path, fixture_path):
    page = _other_gpu_world(tmp_path, fixture_path)
    o = report.refresh(["flashinfer"], root=tmp_path, echo=lambda *a: None)
    text = page.read_text()
    assert "_not run yet_" not in text, o.kept
    block = text.split("<!-- auto:versus/other-gpu -->")[1].split("<!-- /auto -->")[0]
    assert block.count("<!-- run: ") == 2                        # one run line per side
    assert "| measured DRAM ceiling (TB/s) | 4.71 | 3 | 0.64 |" in block      # H200: from its 00 headline
    assert "| L2 (MB) | 60 | 50 | 0.83 |" in block
    assert ("1 of 10 hypotheses judged on both GPUs changed verdict (same verdict: 00_check_env 4/4, "
            "04_profile_rmsnorm 5/6).") in block
    row = next(l for l in block.splitlines() if "| rmsnorm-bw |" in l)
    assert "**refuted** 67" in row and "**confirmed** 67" in row and row.endswith("| **changed** |")
    assert "fusion-40" not in block and block.count("**changed**") == 1          # only what changed is listed
    # the other GPU's own table, from results/other-gpu/, with its run line
    fusion = text.split("<!-- auto:04_profile_rmsnorm@other-gpu/table:fusion -->")[1].split("<!-- /auto -->")[0]
    assert fusion.startswith("\n<!-- run: 1x NVIDIA H100 80GB HBM3") and "| tokens |" in fusion
    # the page names the other GPU's runs as a comparison on purpose, not as a mix of machines
    assert "This page mixes runs" not in text and not any("mixes" in m for m in o.mixed)
    header = text.split("<!-- /auto -->")[0]
    assert "Every block here compares GPUs on purpose: runs on 1x NVIDIA H200 (" in header and "1x NVIDIA H100" in header


def test_versus_all_lists_every_hypothesis(tmp_path, fixture_path):
    page = _other_gpu_world(tmp_path, fixture_path)
    page.write_text(VERSUS_PAGE.replace("versus/other-gpu", "versus/other-gpu:all"))
    report.refresh(["flashinfer"], root=tmp_path, echo=lambda *a: None)
    block = page.read_text().split("<!-- auto:versus/other-gpu:all -->")[1].split("<!-- /auto -->")[0]
    assert "| 04_profile_rmsnorm | fusion-40 | **refuted** 19.7 [19.7, 19.7] | **refuted** 19.7 [19.7, 19.7] |  |" in block
    assert block.count("| 00_check_env |") == 4 and block.count("**changed**") == 1


def test_versus_block_without_the_second_gpus_runs_keeps_its_text(tmp_path, fixture_path):
    page = _other_gpu_world(tmp_path, fixture_path)
    import shutil
    shutil.rmtree(tmp_path / "flashinfer" / "results" / "other-gpu")
    o = report.refresh(["flashinfer"], root=tmp_path, echo=lambda *a: None)
    assert page.read_text() == VERSUS_PAGE
    assert any("versus/other-gpu (no experiment has a finished run in both" in k for k in o.kept)



def test_a_run_records_the_ceilings_it_divided_by_in_its_provenance(tmp_path, monkeypatch):
    from common.capture import ceilings
    c = {"version": ceilings.CEILINGS_VERSION, "uuid": "GPU-x", "machine": "NVIDIA H200-driver580-sm1980-mem3201",
         "mode": "quick", "date_utc": "2026-11-23T10:00:00Z",
         "dram": {"tb_s": 4.71, "kinds": {"read": {"tb_s": 4.6, "spread_pct": 0.4}, "write": {"tb_s": 4.71},
                                          "copy": {"tb_s": 4.4}}},
         "bf16": {"tflops": 811.0, "sm_mhz": 1980, "spread_pct": 1.2}, "nvlink": {"note": "one GPU visible"}}
    monkeypatch.setattr(ceilings, "load_ceilings", lambda device=0: c)
    with results.Run(_script(tmp_path), {}, quiet=True) as run:
        pass
    got = store.load_summary(run.final_dir)["provenance"]["ceilings"]
    assert got == {"dram_tb_s": 4.71, "bf16_tflops": 811.0, "dram_read_tb_s": 4.6, "dram_write_tb_s": 4.71,
                   "dram_copy_tb_s": 4.4, "dram_mixed_tb_s": None, "bf16_sm_mhz": 1980, "nvlink_busbw_gb_s": None,
                   "version": ceilings.CEILINGS_VERSION, "mode": "quick", "date_utc": "2026-11-23T10:00:00Z", "uuid": "GPU-x",
                   "machine": "NVIDIA H200-driver580-sm1980-mem3201",
                   "spread_pct": {"bf16_tflops": 1.2, "dram_read_tb_s": 0.4},     # the spread of the probe behind each
                   "method": {}}   # this made-up set has no probe details to name (a measured set has them)
    # a re-analysis keeps the recording's denominators, not this machine's
    monkeypatch.setattr(ceilings, "load_ceilings", lambda device=0: {**c, "dram": {"tb_s": 9.9}})
    prev = store.load_summary(run.final_dir)
    with results.Run(_script(tmp_path, system="demo2"), {}, quiet=True) as again:
        again.reanalysis_of(prev, run.final_dir)
    assert store.load_summary(again.final_dir)["provenance"]["ceilings"]["dram_tb_s"] == 4.71


def test_a_measured_ceilings_set_records_how_each_was_measured(fixture_path):
    """tests/fixtures/ceilings_h200_v5.json: the ceilings the H200 measured for the a5d3c27 pipelines (2026-11-25)."""
    import json
    from common.capture import ceilings
    from common.run import recording
    brief = ceilings.ceilings_brief(json.loads(fixture_path("ceilings_h200_v5.json").read_text()))
    assert brief["method"]["dram_copy_tb_s"] == "fastest copy probe: torch copy_"
    rec = recording.Recording(Path("."), {"provenance": {"gpu": "NVIDIA H200", "ceilings": brief}})
    pk = rec.peaks
    assert pk["sources"]["dram_copy_tb_s"] == "measured" and pk["l2_mb"] == 60
    assert "the measured DRAM copy ceiling" in __import__("common.capture.timing", fromlist=["x"]).dram_ceiling_text(pk, "copy")


def test_versus_block_names_the_host_cpu_when_a_run_recorded_it(tmp_path, fixture_path):
    """CPU-side times (tokenize, schedule, launch, plan()) follow the host, so the machine table shows the host CPU
    beside the GPU; runs that predate the field (the real H200 fixtures) show no such row rather than a blank one."""
    from common.capture import gpu
    model = gpu.cpu_model(str(fixture_path("proc_cpuinfo_first_cpu_amd_epyc.txt")))
    assert model == "AMD EPYC" and gpu.cpu_model(str(tmp_path / "none")) in (None, __import__("platform").processor())
    page = _other_gpu_world(tmp_path, fixture_path)
    report.refresh(["flashinfer"], root=tmp_path, echo=lambda *a: None)
    assert "| host CPU |" not in page.read_text()
    page.write_text(VERSUS_PAGE)
    for p in (tmp_path / "flashinfer" / "results" / "other-gpu").glob("*/summary.json"):
        s = json.loads(p.read_text())
        s["provenance"]["host"]["cpu_model"] = model
        p.write_text(json.dumps(s))
    report.refresh(["flashinfer"], root=tmp_path, echo=lambda *a: None)
    assert "| host CPU | - | AMD EPYC |" in page.read_text()
