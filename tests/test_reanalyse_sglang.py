"""`--reanalyse DIR` of SGLang's numbered scripts (common.run.recording): each one's analysis again, on a CPU, without
sglang, from a real recording: tests/fixtures/recordings_h200/sglang/<stem>/ (tests/fixtures/README.md says which
run), the same verdict for every hypothesis as the run that recorded it (test_reanalyse.check_reanalysis)."""
import json
from pathlib import Path

import pytest

from test_reanalyse import REC, check_reanalysis, load

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["02_radix_cache_analysis", "05_ncu_attention"]


# 05's decode verdicts used to pool the launches of another step (one request's 16.8 MB of KV) with the batch's (539 MB);
# on the batch's 2 launches of that recording they are inconclusive (2 samples), never judged on the other step
CHANGED = {"05_ncu_attention": {"decode-attention-tensor-low": "inconclusive"}}


@pytest.mark.parametrize("stem", SCRIPTS)
def test_sglang_reanalysis_gives_the_recordings_verdicts(stem, tmp_path):
    check_reanalysis("sglang", stem, tmp_path, changed=CHANGED.get(stem))


def test_05_decode_verdicts_leave_out_the_launches_of_another_step(tmp_path):
    """The recording's decode window caught two steps: launches 0-1 read one request's KV (16.8 MB per layer), 2-3 the
    batch's (539 MB). Only 2-3 are the batch 32 x 4k decode: the story names the others and no verdict counts them
    (before: 4 samples, DRAM 57.5% [24.6, 89.1] of the read ceiling, a range spanning two different steps)."""
    out = check_reanalysis("sglang", "05_ncu_attention", tmp_path, changed=CHANGED["05_ncu_attention"])
    s = json.loads((out / "summary.json").read_text())
    dram = next(o for o in s["observations"] if o["hypothesis"] == "decode-attention-memory-bound")
    assert dram["interval"]["n"] == 2 and dram["interval"]["lo"] > 85, dram["interval"]
    assert any("2 of 4 decode launches belong to another step" in n for n in s["notes"])
    assert "decode, another step (16.8 MB of KV read, the batch's 539 MB)" in (out / "story.txt").read_text()
    # the table says it too (it was written before the relabelling: its shape column named all 4 the batch's)
    import csv
    rows = [r for r in csv.DictReader((out / "attention_kernels.csv").open()) if r["stage"] == "decode"]
    other = {r["launch"] for r in rows if r["shape"].startswith("decode, another step (16.8 MB of KV read")}
    assert other == {"0", "1"} and {r["shape"] for r in rows if r["launch"] in ("2", "3")} == {"decode bs 32 kv 4096"}


def _script(stem):
    return load("sglang", stem, f"re_sglang_{stem}")


# ---- 03: its verdicts are judged on per-step values that the 224595d recording does not hold (only their medians)

def test_03_recording_without_step_values_is_one_setup_line(tmp_path):
    """The H200 recording of 224595d predates step_values.csv: one [setup] line says why it cannot be re-analysed,
    and no run folder is written."""
    pytest.importorskip("pandas")
    from common.base.checks import SetupError
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


# ---- 01: the client's TTFT and stamps of each traced request were in no table of the 224595d recording

def test_01_recording_without_requests_is_one_setup_line(tmp_path):
    pytest.importorskip("pandas")
    from common.base.checks import SetupError
    mod = _script("01_baseline_perf")
    with pytest.raises(SetupError, match=r"no requests.csv, batch_log.csv, batch.csv \(a recording of 224595d3d7f8, "
                                         r"before 01 wrote them\)"):
        mod.main(["--reanalyse", str(REC / "sglang" / "01_baseline_perf"), "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


def _raw_request(rep, ttft_s):
    """A traced request as 01's GPU path holds it (made up: the recording has none)."""
    t0 = 1000.0 + rep
    itl = [0.0055] * 127
    return {"rep": rep, "result": {"client": {"t_send": t0, "t_first": t0 + ttft_s, "t_done": t0 + ttft_s + sum(itl),
                                              "ttft_s": ttft_s, "itl_s": itl},
                                   "meta_info": {"prompt_tokens": 513, "completion_tokens": 128, "queue_time": 0.001,
                                                 "api_server_dispatch_finish_ts": t0 + 0.002,
                                                 "forward_entry_time": t0 + 0.004, "e2e_latency": 0.72}},
            "log_rows": [{"kind": "prefill"}] + [{"kind": "decode"}] * 127, "join": {"matched": 33, "of": 33}}


# judged by 08 since 01 and 08 both judged them (08: on each layer's traced GEMMs, beside the same prefill step's roles)
DROPPED_01 = ("prefill-attention-share", "decode-b1-weights-bw")
# the verdicts the made-up values of recording_01 enter: ttft-cpu-share (the made-up TTFT) and itl-linear-kv (judged
# since 224595d only where the KV range can show a line: inconclusive now, tests/test_sglang_scripts.py)
MADE_UP_01 = ("ttft-cpu-share", "itl-linear-kv")


def recording_01(tmp_path):
    """(01's module, a recording folder): the real H200 recording's tables plus requests.csv, batch_log.csv,
    batch.csv and joins.csv as the GPU path now writes them (request_record, batch_record, join_rows; their values
    made up here)."""
    pd = pytest.importorskip("pandas")
    mod = _script("01_baseline_perf")
    src = REC / "sglang" / "01_baseline_perf"
    rec = tmp_path / "rec"
    rec.mkdir()
    for f in src.iterdir():
        (rec / f.name).write_bytes(f.read_bytes())
    raw = [_raw_request(i, 0.030 + 0.005 * i) for i in range(3)]
    pd.DataFrame([mod.request_record(r) for r in raw]).to_csv(rec / "requests.csv", index=False)
    batch = [{"client": {"t_send": 0.0, "t_first": 0.05, "t_done": 0.3, "ttft_s": 0.05, "itl_s": [0.008] * 31,
                         "e2e_s": 0.3}, "meta_info": {"prompt_tokens": 513, "completion_tokens": 32}} for _ in range(8)]
    pd.DataFrame([mod.batch_record({"batch": batch})]).to_csv(rec / "batch.csv", index=False)
    pd.DataFrame([{"kind": "prefill", "new_seq": 8, "new_token": 4104, "running_req": 0},
                  {"kind": "decode", "new_seq": None, "new_token": None, "running_req": 8}]).to_csv(
        rec / "batch_log.csv", index=False)
    pd.DataFrame(mod.join_rows({"under_load_join": {"offset": 3, "matched": 24, "of": 24, "ok": True}})).to_csv(
        rec / "joins.csv", index=False)
    return mod, rec


def test_01_new_tables_round_trip_and_reanalysis_path(tmp_path):
    """--reanalyse runs on recording_01, and every verdict those made-up values do not enter gets the recording's
    verdict; the two 08 judges now (DROPPED_01) are gone, and a recording without a pressure load judges no
    pressure-usage (tests/test_sglang_pressure.py re-analyses one with it)."""
    pytest.importorskip("matplotlib")
    mod, rec = recording_01(tmp_path)
    src = REC / "sglang" / "01_baseline_perf"
    assert mod.main(["--reanalyse", str(rec), "--out", str(tmp_path / "o")]) == 0
    before, after = (json.loads((d / "summary.json").read_text()) for d in (src, tmp_path / "o"))
    v = [{o["hypothesis"]: o["verdict"] for o in x["observations"]} for x in (before, after)]
    assert len(v[0]) == 8 and set(v[1]) == set(v[0]) - set(DROPPED_01)
    same = set(v[1]) - set(MADE_UP_01)
    assert {h: v[1][h] for h in same} == {h: v[0][h] for h in same}
    assert v[1]["itl-linear-kv"] == "inconclusive"
    story = (tmp_path / "o" / "story.txt").read_text()
    assert "trace<->log join 33/33" in story and "ITL p50 5.50 ms" in story and "sampled steps under load (join 24/24)" in story
    assert "pressure:" not in story and not (tmp_path / "o" / "pressure.png").exists()
    assert after["provenance"]["gpu"] == "NVIDIA H200"


# ---- 00: two observations (facts of the machine), so check_reanalysis's ">= 3 verdicts" does not apply

def test_00_reanalysis_gives_the_recordings_observations(tmp_path):
    """The H200 recording of 224595d predates serving.csv: its compute capability comes from the GPU's name (NVIDIA's
    table), the sglang import from the headline; the same two observations and headline, links from topology.txt."""
    pytest.importorskip("pandas")
    mod = _script("00_check_env")
    src, out = REC / "sglang" / "00_check_env", tmp_path / "o"
    assert mod.main(["--reanalyse", str(src), "--out", str(out)]) == 0
    before, after = (json.loads((d / "summary.json").read_text()) for d in (src, out))
    assert [(o["expected"], o["verdict"], o["observed"]) for o in after["observations"]] == \
        [(o["expected"], o["verdict"], o["observed"]) for o in before["observations"]]
    assert after["headline"] == before["headline"] and after["provenance"]["gpu"] == "NVIDIA H200"
    assert "reanalysed" in after["provenance"]
    story = (out / "story.txt").read_text()
    assert "cc 9.0" in story and "server_args: not recorded" in story and (out / "topology.txt").is_file()


def test_00_serving_csv_is_read_back(tmp_path):
    """serving.csv as the GPU path now writes it (Record.serving_row): the compute capability and the sglang import
    come from it, not from the GPU's name."""
    pd = pytest.importorskip("pandas")
    mod = _script("00_check_env")
    src, rec = REC / "sglang" / "00_check_env", tmp_path / "rec"
    rec.mkdir()
    for f in src.iterdir():
        (rec / f.name).write_bytes(f.read_bytes())
    x = mod.Record({}, [], 9, "9.0", "13.0", {}, {"ok": True, "version": "0.5.17", "import_s": 13.8,
                                                 "server_args": True, "server_args_msg": "0.5.17"}, [])
    pd.DataFrame([x.serving_row()]).to_csv(rec / "serving.csv", index=False)
    assert mod.main(["--reanalyse", str(rec), "--out", str(tmp_path / "o")]) == 0
    story = (tmp_path / "o" / "story.txt").read_text()
    assert "cc 9.0" in story and "sglang 0.5.17 (import 13.8 s)\n" in story and "server_args" not in story
