"""`--reanalyse DIR` of mini-SGLang's numbered scripts, proven on their real H200 recordings.

Each folder tests/fixtures/recordings_h200/mini-sglang/<stem>/ holds the summary.json and the tables the script's
analysis reads, copied from its run in `./mini-sglang/scripts/06_full_pipeline.sh --quick --ncu` on one H200
(commit a5d3c27, 2026-11-25; tests/fixtures/README.md). check_reanalysis (tests/test_reanalyse.py) re-analyses it on
this CPU and asserts the recording's verdict for every hypothesis, its provenance and a story."""
import pytest

from test_reanalyse import check_reanalysis

STEMS = ["01_test_kernels", "02_profile_index", "04_profile_attention", "07_profile_radix"]


@pytest.mark.parametrize("stem", STEMS)
def test_minisgl_reanalysis_gives_the_recordings_verdicts(stem, tmp_path):
    check_reanalysis("mini-sglang", stem, tmp_path)


def test_04_reads_its_plan_syncs_from_the_table_a_gpu_run_now_writes(tmp_path):
    """The 2026-11-25 recording predates plan_syncs.csv: its syncs are counted again in its trace (gzipped whole in
    the fixture). A recording with plan_syncs.csv (here: those counts, as compare() now writes them) and no trace
    gives the same verdicts; one with neither is one [setup] line, not a missing verdict."""
    import json

    import pandas as pd

    from common.run import recording
    from common.tables import trace
    from common.base.checks import SetupError
    from test_reanalyse import _verdicts, copy_recording
    m04, src = copy_recording("mini-sglang", "04_profile_attention", tmp_path, "re_minisgl_04_syncs")
    syncs = m04.plan_syncs(trace.read_chrome_trace(src / "trace.json.gz"))
    assert len(syncs) == 15 and {n for name, n in syncs if name.startswith("call: fi")} == {1}
    pd.DataFrame(syncs, columns=["range", "syncs"]).to_csv(src / "plan_syncs.csv", index=False)
    (src / "trace.json.gz").unlink()
    rec = recording.open(src, m04.__file__, tables=("backends",), optional=("compare", "plan_syncs"))
    assert m04.recorded_syncs(rec) == syncs
    assert m04.main(["--reanalyse", str(src), "--out", str(tmp_path / "out")]) == 0
    before, after = (json.loads((d / "summary.json").read_text()) for d in (src, tmp_path / "out"))
    assert _verdicts(after) == _verdicts(before) and _verdicts(after)["fi-plan-sync"] == "confirmed"
    (src / "plan_syncs.csv").unlink()
    rec = recording.open(src, m04.__file__, tables=("backends",), optional=("compare", "plan_syncs"))
    with pytest.raises(SetupError, match="no plan_syncs.csv and no trace.json"):
        m04.recorded_syncs(rec)
