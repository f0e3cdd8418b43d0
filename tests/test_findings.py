"""The findings a script writes (common.run.results.Run.finding): the sentences the pages state about a run, written from
the run's own figures, so that they hold on whatever GPU ran (tests/test_page_text.py keeps such sentences out of the
hand-written text). Each script's findings on its real H200 recording (tests/fixtures/recordings_h200, re-analysed on
the CPU: the same figures its story and verdicts print), and one finding whose interpretation turns when the figures do."""
import csv
import json

import pytest

from test_reanalyse import check_reanalysis, copy_recording

FINDINGS = {
    ("flashinfer", "02_profile_prefill"): [
        "FA2 at batch 1, 512 new tokens on 512 KV splits the KV: its merge kernel takes 45.4 us of ncu time, longer "
        "than the 20.8 us of the attention kernel it merges."],
    ("flashinfer", "03_profile_decode"): [
        "At KV 4096 the tensor-core path (the prefill kernel) against the CUDA-core kernel, kernel time: batch 1: 14.8 "
        "against 13.5 us (slower); batch 32: 127 against 202 us (faster; 91.9% against 57.8% of the read ceiling); "
        "batch 256: 975 against 1,450 us (faster; 95.8% against 64.4% of the read ceiling)."],
    ("flashinfer", "04_profile_rmsnorm"): [
        "Fusing the residual add into RMSNorm saves 25.6% of the kernel time for 19.7% fewer DRAM bytes (ncu) at the "
        "fusion point: the time does not follow the bytes."],
    ("mini-sglang", "04_profile_attention"): [
        "At decode batch 32 x KV 4096 the tensor-core path takes 126 us of kernel time against 203 us with tensor cores "
        "off (faster); ncu: BatchPrefillWithPagedKVCacheKernel memory-bound: DRAM SOL 86%, SM SOL 19%, tensor 11%; "
        "BatchDecodeWithPagedKVCacheKernel compute-bound: DRAM SOL 56%, SM SOL 73%, tensor 0%."],
    ("mini-sglang", "08_forward_timeline"): [
        "The largest part of the wall time to the first token (24.12 ms) is prefill launch (CPU): 20.04 ms, 83.1%.",
        "The largest part of the period between two tokens (4.97 ms) is process_last_data (waits for the GPU): 3.75 ms, "
        "75.4%.",
        "In the decode step (batch 1) the layers' GEMMs take 77.9% of the kernel time; the largest, gate_up_proj, streams "
        "its weights at 88.9% of the DRAM read ceiling, at or above the 70% that counts as saturated (ncu: 88.3% of the "
        "read ceiling).",
        "In the prefill step (batch 1) the layers' GEMMs run at 86.7% to 94.3% of the bf16 ceiling; the split-KV merge "
        "kernel takes 42.4 us of kernel time per layer, longer than the 18.8 us of the attention kernel it merges.",
        "A prompt sharing 1024 tokens with the previous one prefills its 64 new tokens in 19.87 ms of GPU time against "
        "25.87 ms for the first 1088: 0.77 of the time for 0.06 of the tokens, so a cost per step that does not grow "
        "with the tokens sets its time.",
        "Prefill at batch 1: a traced period of 56.3 ms against a floor of 9.68 ms (its 7,218 GFLOP over the bf16 "
        "ceiling), 17.2% of the period; of the 46.6 ms above it the largest part is the GPU idle between the step's "
        "kernels (40.3 ms).",
        "Decode at batch 1: a traced period of 5.05 ms against a floor of 3.28 ms (the 15.1 GB it must read over the "
        "DRAM read ceiling), 64.9% of the period; of the 1.77 ms above it the largest part is GEMM and attention "
        "kernels running below their ceiling (1.13 ms)."],
}


@pytest.mark.parametrize("system,stem", list(FINDINGS), ids=[f"{s}/{t}" for s, t in FINDINGS])
def test_findings_are_written_from_the_runs_figures(system, stem, tmp_path):
    # 08's TTFT add-up is not judged any more (its parts add up by construction: tests/test_reanalyse_minisgl08.py)
    out = check_reanalysis(system, stem, tmp_path, dropped=("the ttft waterfall",) if stem == "08_forward_timeline" else ())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["findings"] == FINDINGS[(system, stem)]
    story = (out / "story.txt").read_text()
    for figure in ("45.4", "20.8") if stem == "02_profile_prefill" else ():
        assert f"ncu {figure} us" in story          # the figures the story prints, not other ones


def test_a_finding_turns_with_the_figures(tmp_path):
    """04's interpretation is computed, not written: with the fused kernel's time cut to save as much as the bytes
    do, the same recording's finding says the time follows the bytes."""
    pytest.importorskip("pandas")
    mod, src = copy_recording("flashinfer", "04_profile_rmsnorm", tmp_path, "re_fi04_turn")
    path = src / "reference.csv"
    rows = list(csv.DictReader(path.open()))
    add = {r["rep"]: float(r["time_us"]) for r in rows if r["variant"] == "torch add + flashinfer.rmsnorm"}
    assert add, "the recording's add-then-norm rows moved: update this test"
    for r in rows:
        if r["variant"] == "flashinfer.fused_add_rmsnorm" and r["rep"] in add and r["tokens"] == "65536":
            r["time_us"] = str(add[r["rep"]] * (1 - 0.197))
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert mod.main(["--reanalyse", str(src), "--out", str(tmp_path / "out")]) == 0
    found = json.loads((tmp_path / "out" / "summary.json").read_text())["findings"]
    assert found == ["Fusing the residual add into RMSNorm saves 19.7% of the kernel time for 19.7% fewer DRAM bytes "
                     "(ncu) at the fusion point: the time follows the bytes."]
