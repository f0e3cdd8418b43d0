"""sglang/scripts/08_execution_story.py: the joined story re-analysed on CPU from a real recording.

Fixture tests/fixtures/sglang_08_recording_h200/: the raw.json that `08_execution_story.py --quick --ncu`
recorded on one H200 (2026-11-23, commit 023318a): the real observer rows (3 untraced + 3 traced
repetitions per story), the 624 scheduler lines of the pressure run, NVML memory samples (every 10th kept),
the 17 requests of the cache phase, the recording's summary.json (provenance); trimmed so that each story
points at the cut trace tests/fixtures/sglang_story_trace_graphs_llama8b_h200_cut.json.gz (one prefill and
one decode step) and its server log, and without the ncu windows (tests/test_timeline.py joins those)."""
import json
import shutil
import sys
from pathlib import Path

import pytest

import kit  # tests/kit.py
ROOT = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures"


def _script():
    sys.path.insert(0, str(ROOT / "sglang" / "scripts"))
    return kit.load_script(ROOT / "sglang" / "scripts" / "08_execution_story.py", "story08")


@pytest.fixture(scope="module")
def redone(tmp_path_factory):
    pytest.importorskip("pandas")
    pytest.importorskip("matplotlib")
    src = tmp_path_factory.mktemp("rec") / "08_execution_story"
    shutil.copytree(FIX / "sglang_08_recording_h200", src)
    shutil.copy(FIX / "sglang_story_trace_graphs_llama8b_h200_cut.json.gz", src.parent)
    out = tmp_path_factory.mktemp("out") / "08_execution_story"
    assert _script().main(["--reanalyse", str(src), "--out", str(out)]) == 0
    return out


def test_reanalysis_keeps_the_recordings_provenance(redone):
    s = json.loads((redone / "summary.json").read_text())
    assert s["status"] == "ok" and s["provenance"]["git"]["commit"].startswith("023318a")
    assert s["provenance"]["gpu"] == "NVIDIA H200" and "reanalysed" in s["provenance"]


def test_verdicts_on_the_real_repetitions(redone):
    obs = {o.get("hypothesis"): o for o in json.loads((redone / "summary.json").read_text())["observations"]}
    # the real observer rows: ITL +0.43% [0.42, 1.09] -> within 5%; TTFT +24% [9, 132] -> outside
    assert obs["observer-effect"]["verdict"] == "confirmed" and obs["observer-effect"]["interval"]["n"] == 3
    assert obs["observer-effect-ttft"]["verdict"] == "refuted"
    assert obs["pressure-usage"]["verdict"] == "confirmed"                  # the pool filled (usage 0.99-1.0)
    assert obs["lru-thrash"]["verdict"] == "confirmed" and obs["lru-thrash"]["interval"]["hi"] == 0
    agree = [o for o in obs.values() if "agree on every request" in o["expected"]][0]
    assert agree["verdict"] == "confirmed" and agree["observed"].startswith("17/17")


def test_outputs_of_the_joined_story(redone):
    story = (redone / "story.txt").read_text()
    assert "EXECUTION STORY" in story and "DECODE step (bs 1)" in story and "gate_up_proj" in story
    tree = (redone / "layer_tree.csv").read_text().splitlines()
    assert len(tree) > 20 and "share_all_layers_pct" in tree[0]
    perfetto = json.loads((redone / "story_one.json").read_text())
    assert {e["ph"] for e in perfetto["traceEvents"]} >= {"X", "M", "C"}
    assert (redone / "story_one.json").stat().st_size <= 5 << 20
    for fig in ("timeline", "layer_tree", "pressure", "cache"):
        assert (redone / f"{fig}.png").stat().st_size > 10_000
    outcomes = [ln.rsplit(",", 1)[1] for ln in (redone / "cache_requests.csv").read_text().splitlines()[1:]]
    assert outcomes == ["miss"] * 8 + ["evicted"] * 8 + ["hit"]           # 8 prefixes in a pool for ~7: LRU thrash


def test_chunk_lines_and_the_backend_check():
    m = _script()
    assert m.is_chunk({"kind": "prefill", "new_seq": 1, "new_token": 8192})
    assert not m.is_chunk({"kind": "prefill", "new_seq": 16, "new_token": 8192})        # a full batch, not a chunk
    backend, why = m.backend_choice()                    # no sgl_kernel here: FlashInfer, and the reason
    assert backend == "flashinfer" and "FA3" in why
