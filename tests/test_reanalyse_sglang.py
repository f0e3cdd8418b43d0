"""`--reanalyse DIR` of SGLang's numbered scripts (common.recording): each one's analysis again, on a CPU, without
sglang, from a real recording: tests/fixtures/recordings_h200/sglang/<stem>/ (tests/fixtures/README.md says which
run), the same verdict for every hypothesis as the run that recorded it (test_reanalyse.check_reanalysis)."""
import pytest

from test_reanalyse import check_reanalysis

SCRIPTS = ["02_radix_cache_analysis"]


@pytest.mark.parametrize("stem", SCRIPTS)
def test_sglang_reanalysis_gives_the_recordings_verdicts(stem, tmp_path):
    check_reanalysis("sglang", stem, tmp_path)
