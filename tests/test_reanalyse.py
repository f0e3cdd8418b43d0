"""`--reanalyse DIR` (common.run.recording): each numbered script's analysis again, on a CPU, from a real recording.

tests/fixtures/recordings_h200/<system>/<stem>/: the summary.json and tables of a real run on one H200
(tests/fixtures/README.md says which run). A re-analysis must give the same verdict for every hypothesis as the
run that recorded the files, keep the recording's hardware provenance, and write its story."""
import json
import re
import sys
from pathlib import Path

import pytest

import kit  # tests/kit.py

ROOT = Path(__file__).resolve().parents[1]
REC = Path(__file__).parent / "fixtures" / "recordings_h200"
# (system, script stem): scripts whose --reanalyse is proven on a recording here
REANALYSED = [("mini-sglang", "03_profile_store")]


def _verdicts(summary: dict) -> dict:
    return {o.get("hypothesis") or o["expected"]: o["verdict"] for o in summary["observations"]}


def load(system: str, stem: str, name: str | None = None):
    """The script <system>/scripts/<stem>.py as a module (its folder on sys.path for its helper module)."""
    scripts = ROOT / system / "scripts"
    sys.path.insert(0, str(scripts))
    return kit.load_script(scripts / f"{stem}.py", name or f"re_{system}_{stem}".replace("-", "_"))


def copy_recording(system: str, stem: str, tmp_path: Path, name: str | None = None):
    """(the script as a module, a copy of its recording under tmp_path/rec) for tests that add files to it."""
    import shutil
    src = tmp_path / "rec"
    shutil.copytree(REC / system / stem, src)
    return load(system, stem, name), src


def check_reanalysis(system: str, stem: str, tmp_path: Path, dropped: tuple = (), changed: dict | None = None) -> Path:
    """Re-analyse tests/fixtures/recordings_h200/<system>/<stem>/ with the script's --reanalyse; assert the same
    verdicts, the recording's provenance and a story. ``dropped``: hypotheses the script no longer judges (each
    must be gone from the new run); ``changed``: {hypothesis: verdict} the script now judges differently on
    purpose (each must read so). Returns the new run's folder (for further checks)."""
    pytest.importorskip("pandas")
    pytest.importorskip("matplotlib")
    from unittest import mock
    mod = load(system, stem)
    src = REC / system / stem
    out = tmp_path / stem
    # judged as the recording was: without the run-to-run noise common/judge/noise.json has measured since (its margins
    # move knife-edge verdicts to inconclusive: tests/test_stats_verdicts.py covers them)
    with mock.patch("common.judge.noise.margin_for", return_value=None):
        assert mod.main(["--reanalyse", str(src), "--out", str(out)]) == 0
    before, after = (json.loads((d / "summary.json").read_text()) for d in (src, out))
    kept = {k: v for k, v in _verdicts(before).items() if not k.startswith(dropped)} if dropped else _verdicts(before)
    kept.update(changed or {})
    assert _verdicts(after) == kept and len(_verdicts(after)) >= 3
    assert after["provenance"]["gpu"] == before["provenance"]["gpu"] and "reanalysed" in after["provenance"]
    assert after["args"].get("quick") == before["args"].get("quick")       # the mode of the measured run, kept
    assert after["args"].get("out") == str(out)                            # ... but this call's output folder
    tables = [f.name for f in src.glob("*.csv")]
    assert tables and all((out / t).is_file() for t in tables)             # the tables travel: re-analysable again
    story = (out / "story.txt").read_text()
    assert story.strip()
    # a missing value is '-' on a page, never Python's 'nan' (the memcpy rows of mini-SGLang's launch lists printed
    # "grid nan": a copy has no grid, and a table cell read back is NaN)
    assert not re.findall(r".*\bnan\b.*", story, flags=re.I), re.findall(r".*\bnan\b.*", story, flags=re.I)[:3]
    return out


@pytest.mark.parametrize("system,stem", REANALYSED, ids=[f"{s}/{t}" for s, t in REANALYSED])
def test_reanalysis_gives_the_recordings_verdicts(system, stem, tmp_path):
    check_reanalysis(system, stem, tmp_path)


def test_a_folder_that_is_no_recording_is_one_line(tmp_path, capsys):
    from common.run import recording
    from common.base.checks import SetupError
    with pytest.raises(SetupError, match="no readable summary.json"):
        recording.open(tmp_path, ROOT / "mini-sglang/scripts/03_profile_store.py", tables=("sweep",))
    (tmp_path / "summary.json").write_text(json.dumps({"stem": "02_profile_index"}))
    with pytest.raises(SetupError, match="a recording of 02_profile_index.py, not of 03_profile_store.py"):
        recording.open(tmp_path, ROOT / "mini-sglang/scripts/03_profile_store.py", tables=("sweep",))
    (tmp_path / "summary.json").write_text(json.dumps({"stem": "03_profile_store"}))
    with pytest.raises(SetupError, match="no sweep.csv to re-analyse"):
        recording.open(tmp_path, ROOT / "mini-sglang/scripts/03_profile_store.py", tables=("sweep",))
