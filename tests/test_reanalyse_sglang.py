"""`--reanalyse DIR` of SGLang's numbered scripts (common.recording): each one's analysis again, on a CPU, without
sglang, from a real recording: tests/fixtures/recordings_h200/sglang/<stem>/ (tests/fixtures/README.md says which
run), the same verdict for every hypothesis as the run that recorded it (test_reanalyse.check_reanalysis)."""
import json
import sys
from pathlib import Path

import pytest

import kit  # tests/kit.py
from test_reanalyse import REC, check_reanalysis

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["02_radix_cache_analysis", "05_ncu_attention"]


@pytest.mark.parametrize("stem", SCRIPTS)
def test_sglang_reanalysis_gives_the_recordings_verdicts(stem, tmp_path):
    check_reanalysis("sglang", stem, tmp_path)


def _script(stem):
    sys.path.insert(0, str(ROOT / "sglang" / "scripts"))
    return kit.load_script(ROOT / "sglang" / "scripts" / f"{stem}.py", f"re_sglang_{stem}")


# ---- 03: its verdicts are judged on per-step values that the 224595d recording does not hold (only their medians)

def test_03_recording_without_step_values_is_one_setup_line(tmp_path):
    """The H200 recording of 224595d predates step_values.csv: one [setup] line says why it cannot be re-analysed,
    and no run folder is written."""
    pytest.importorskip("pandas")
    from common.checks import SetupError
    mod = _script("03_backend_comparison")
    with pytest.raises(SetupError, match=r"no step_values.csv \(a recording of 224595d3d7f8, before 03 wrote it\)"):
        mod.main(["--reanalyse", str(REC / "sglang" / "03_backend_comparison"), "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


def test_03_step_values_round_trip_and_reanalysis_path(tmp_path):
    """step_values.csv (written by the GPU path from now on) gives back each backend's per-step lists exactly; with
    it, the real recording's other tables re-analyse: greedy (judged on greedy.csv) gets the recording's verdict.
    The per-step values here are made up (the recording has none): the four verdicts on them are not compared."""
    pd = pytest.importorskip("pandas")
    pytest.importorskip("matplotlib")
    mod = _script("03_backend_comparison")
    src = REC / "sglang" / "03_backend_comparison"
    rows = [{"variant": "flashinfer", "_att_ms": [10.2, 10.3, 10.25], "_att_us": [1427.0, 1430.5], "_cpu_ms": [1.3, 1.2],
             "_launches": [2.0, 2.0]},
            {"variant": "triton", "_att_ms": [28.5, 28.4, 28.6], "_att_us": [1522.0, 1519.0], "_cpu_ms": [1.1, 1.0],
             "_launches": [2.0, 2.0]}]
    rec = tmp_path / "rec"
    rec.mkdir()
    for f in src.iterdir():
        (rec / f.name).write_bytes(f.read_bytes())
    pd.DataFrame(mod.step_value_rows(rows)).to_csv(rec / "step_values.csv", index=False)
    back = mod.rows_from(pd.read_csv(rec / "backends.csv"), pd.read_csv(rec / "step_values.csv"))
    assert [{k: r[k] for k in mod.STEP_VALUES} for r in back] == [{k: r[k] for k in mod.STEP_VALUES} for r in rows]
    assert mod.main(["--reanalyse", str(rec), "--out", str(tmp_path / "o")]) == 0
    before, after = (json.loads((d / "summary.json").read_text()) for d in (src, tmp_path / "o"))
    v = {s: {o["hypothesis"]: o["verdict"] for o in x["observations"]} for s, x in (("b", before), ("a", after))}
    assert v["a"]["greedy-agree"] == v["b"]["greedy-agree"] == "confirmed" and set(v["a"]) == set(v["b"])
    assert after["provenance"]["gpu"] == "NVIDIA H200" and (tmp_path / "o" / "story.txt").read_text().strip()
