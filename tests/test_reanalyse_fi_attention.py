"""FlashInfer 02 (prefill) and 03 (decode) --reanalyse on their real H200 recordings: the same verdict for every
hypothesis as the run that recorded them (tests/test_reanalyse.check_reanalysis).

tests/fixtures/recordings_h200/flashinfer/<stem>/: summary.json and the tables the analysis reads, trace.json
gzipped (the per-call verdicts join its kernels to the traced calls) and, for 02, ncu/merge_full.csv gzipped (the
merge kernel's closer look); tests/fixtures/README.md says which run."""
import json

import pytest

from test_reanalyse import check_reanalysis

SCRIPTS = [("flashinfer", "02_profile_prefill"), ("flashinfer", "03_profile_decode")]


@pytest.mark.parametrize("system,stem", SCRIPTS, ids=[s for _, s in SCRIPTS])
def test_reanalysis_gives_the_recordings_verdicts(system, stem, tmp_path):
    check_reanalysis(system, stem, tmp_path)


def test_prefill_story_keeps_the_merge_kernels_closer_look(tmp_path):
    """02's story reads merge_look.csv and ncu/merge_full.csv: the closer look comes back whole."""
    out = check_reanalysis("flashinfer", "02_profile_prefill", tmp_path)
    story = (out / "story.txt").read_text()
    look = story.split("THE MERGE KERNEL, A CLOSER LOOK")[1]
    for line in ("PersistentVariableLengthMergeStatesKernel: 45.4 us under ncu", "launch: 1,584 CTAs for 132 SMs",
                 "pipes (% of peak while active): alu 54%", "instructions: 32,489,280 warp instructions",
                 "stalls: not_selected 33%"):
        assert line in look
    assert ": nan" not in story                      # an empty stall note read back from its CSV is no note


def test_decode_per_call_verdicts_come_from_the_recorded_trace(tmp_path):
    """03's merge and plan() verdicts read each traced call (trace.json), not calls.csv's medians."""
    out = check_reanalysis("flashinfer", "03_profile_decode", tmp_path)
    obs = {o["hypothesis"]: o for o in json.loads((out / "summary.json").read_text())["observations"]}
    assert "24/24 traced calls agree with plan_info" in obs["merge-iff-split"]["observed"]
    assert obs["merge-visible-at-batch-1"]["interval"]["n"] == 3 and obs["plan-no-kernel"]["verdict"] == "confirmed"


def test_a_recording_without_its_trace_is_one_setup_line(tmp_path):
    from common.base.checks import SetupError
    from test_reanalyse import copy_recording
    mod, src = copy_recording("flashinfer", "03_profile_decode", tmp_path, "re_fi03_notrace")
    (src / "trace.json.gz").unlink()
    with pytest.raises(SetupError, match="no trace.json to re-analyse"):
        mod.main(["--reanalyse", str(src), "--out", str(tmp_path / "out")])
