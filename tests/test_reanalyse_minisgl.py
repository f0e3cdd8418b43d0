"""`--reanalyse DIR` of mini-SGLang's numbered scripts, proven on their real H200 recordings.

Each folder tests/fixtures/recordings_h200/mini-sglang/<stem>/ holds the summary.json and the tables the script's
analysis reads, copied from its run in `./mini-sglang/scripts/06_full_pipeline.sh --quick --ncu` on one H200
(commit a5d3c27, 2026-11-25; tests/fixtures/README.md). check_reanalysis (tests/test_reanalyse.py) re-analyses it on
this CPU and asserts the recording's verdict for every hypothesis, its provenance and a story."""
import pytest

from test_reanalyse import check_reanalysis

STEMS = ["02_profile_index"]


@pytest.mark.parametrize("stem", STEMS)
def test_minisgl_reanalysis_gives_the_recordings_verdicts(stem, tmp_path):
    check_reanalysis("mini-sglang", stem, tmp_path)
