"""`--reanalyse DIR` of FlashInfer's 00, 01, 04, 05 and 07 (common.recording): each script's analysis again, on a CPU,
from its real H200 recording in tests/fixtures/recordings_h200/flashinfer/<stem>/ (the `--quick --ncu` pipeline run
of commit a5d3c27, 2026-11-25; tests/fixtures/README.md): the same verdict for every hypothesis as the recording."""
import pytest

from test_reanalyse import check_reanalysis

# script stems whose --reanalyse is proven on their recording
STEMS = ["04_profile_rmsnorm", "05_profile_rope"]


@pytest.mark.parametrize("stem", STEMS)
def test_flashinfer_reanalysis_gives_the_recordings_verdicts(stem, tmp_path):
    check_reanalysis("flashinfer", stem, tmp_path)
