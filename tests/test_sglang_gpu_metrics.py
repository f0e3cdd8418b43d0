"""SGLang 04's metrics pass (sglang/scripts/04_nsys_profile.py metrics_pass; 08 held it before): the GPU's own counters
over the served timeline (nsys GPU metrics), beside the untraced bursts; its --reanalyse.

Real data: the nsys tables of an H200 timeline (tests/fixtures/sglang_nsys_cuda_gpu_trace_cut_h200.csv,
sglang_nsys_nvtx_pushpop_cut_h200.csv: what 04 --reanalyse reads, as in tests/test_faults.py). No GPU-metrics sample of
a real run is kept as a fixture: the sampled side is the one a machine without a usable nsys records (GpuMetrics' own
reason, read from it here); the bursts' client figures in gpu_metrics_runs.csv are made up (they enter no verdict)."""
import json
import shutil
from pathlib import Path

import pytest

from test_reanalyse import load

FIX = Path(__file__).parent / "fixtures"


def _recording(tmp_path) -> Path:
    src = tmp_path / "recorded"
    src.mkdir(parents=True)
    shutil.copy(FIX / "sglang_nsys_cuda_gpu_trace_cut_h200.csv", src / "timeline_overlap_on_cuda_gpu_trace.csv")
    shutil.copy(FIX / "sglang_nsys_nvtx_pushpop_cut_h200.csv", src / "timeline_overlap_on_nvtx_pushpop_trace.csv")
    return src


def _why_not_sampled(tmp_path, monkeypatch) -> str:
    from common.capture import nsys
    monkeypatch.setattr(nsys, "find", lambda: None)
    with nsys.GpuMetrics(tmp_path / "gm") as gm:
        pass
    return gm.why


def test_a_metrics_pass_that_could_not_sample_says_why(tmp_path, monkeypatch):
    """The bursts of the metrics pass as 04 writes them (burst_row; the sampled one with GpuMetrics' reason): a
    re-analysis tells the reason in the story, draws no figure, and judges as without the pass."""
    pd = pytest.importorskip("pandas")
    m = load("sglang", "04_nsys_profile", "gm04")
    why = _why_not_sampled(tmp_path, monkeypatch)
    bare, src = _recording(tmp_path / "a"), _recording(tmp_path / "b")
    res = [{"client": {"t_send": 10.0, "t_first": 10.03, "t_done": 10.4, "ttft_s": 0.03, "itl_s": [0.006] * 63,
                       "e2e_s": 0.4}, "meta_info": {"prompt_tokens": 512, "completion_tokens": 64}}] * 16
    runs = [m.burst_row(res, "untraced", i) for i in range(m.METRICS_REPS)] + [
        {**m.burst_row(res, "sampled", 0), "t0": None, "why": why}]
    pd.DataFrame(runs).to_csv(src / "gpu_metrics_runs.csv", index=False)
    outs = {}
    for name, rec in (("bare", bare), ("with", src)):
        outs[name] = tmp_path / f"o_{name}"
        assert m.main(["--reanalyse", str(rec), "--out", str(outs[name])]) == 0
    story = (outs["with"] / "story.txt").read_text()
    assert "the GPU's own counters over the served timeline (nsys GPU metrics)" in story
    assert f"not sampled ({why[:40]}" in " ".join(story.replace("│", " ").split())
    assert "nsys GPU metrics" not in (outs["bare"] / "story.txt").read_text()           # a recording without the pass
    assert not (outs["with"] / "gpu_metrics.png").exists() and (outs["with"] / "gpu_metrics_runs.csv").is_file()
    v = [[(o.get("hypothesis"), o["verdict"]) for o in json.loads((d / "summary.json").read_text())["observations"]]
         for d in outs.values()]
    assert v[0] == v[1]
    back = m.read_metrics(outs["with"])
    assert back["runs"][-1]["why"] == why and "rows" not in back and back["runs"][0]["ttft_ms"] == pytest.approx(30.0)
