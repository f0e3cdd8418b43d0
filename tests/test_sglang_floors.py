"""SGLang 08's floor of each step (sglang/scripts/_sgl08_floors.py, common.tables.flops.step_floor) and the request on
two lanes (sglang/scripts/_sgl08_lanes.py, common.render.plots.lanes), on real traces.

Real data: the recording of tests/test_sglang_story.py's _new_recording: the H100 traced text request
(tests/fixtures/sglang_trace_one_text_request_h100.json.gz, its stamps in sglang_request_stamps_h100.json.gz: one
prefill of 513 tokens and 16 decode steps at batch 1, served with CUDA graphs and the overlap scheduler) as the
one-request story, inside the H200 recording of 023318a (its ceilings, its batch story). Two GPUs in one recording:
these tests check the arithmetic and the figures, not the numbers (the H200's ceilings divide an H100's kernels)."""
import csv
import json
import math
import sys
from pathlib import Path

import pytest

import kit  # tests/kit.py
from common.capture import models
from common.tables import flops

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "sglang" / "scripts"))
CFG = models.config("llama-3.1-8b")


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """The re-analysed recording's folder and its data as 08's analysis made it (pick, stories, kernel tables)."""
    pytest.importorskip("pandas")
    pytest.importorskip("matplotlib")
    from test_sglang_story import _new_recording, _script
    root = tmp_path_factory.mktemp("floors")
    src = _new_recording(root)
    out = root / "out" / "08_execution_story"
    m = _script()
    assert m.main(["--reanalyse", str(src), "--out", str(out)]) == 0
    data = m.load_raw(src)
    m.analyse(type("NoRun", (), {"table": lambda *a, **k: None, "log": lambda *a: None})(), data, CFG)
    return out, data


def _rows(out):
    with open(out / "floors.csv") as fh:
        return {r["step_kind"]: r for r in csv.DictReader(fh)}


def test_model_work_reads_the_weights_once_and_every_token_of_kv():
    """A decode step of Llama-3.1-8B must read every weight but the embedding table (it gathers one row per request)
    and each request's K and V once: the bytes of model_work are those, plus the activations (a few MB)."""
    w = flops.model_work(CFG, tokens=1, kv_lens=[600])
    table = CFG["vocab_size"] * CFG["hidden_size"] * 2
    assert w["weight_bytes"] == models.param_count(CFG) * 2 - table
    assert w["kv_bytes"] == 600 * models.kv_bytes_per_token(CFG)
    assert 0 < w["bytes"] - w["weight_bytes"] - w["kv_bytes"] < 20e6
    w64 = flops.model_work(CFG, tokens=64, kv_lens=[600] * 64)
    assert w64["weight_bytes"] == w["weight_bytes"] and w64["flops"] > 60 * w["flops"]


def test_step_floor_splits_the_period_and_names_what_binds():
    """Two kernels of known work: the floor is each one's roofline minimum, the rest goes to its part, and the parts
    add up to the period (the decomposition is exact; it is shown, never judged)."""
    ks = [{"ts_us": 0.0, "end_us": 10.0, "dur_us": 10.0, "bytes": 30e6, "flops": 1e9, "main": True},     # read: 10 us
          {"ts_us": 12.0, "end_us": 14.0, "dur_us": 2.0, "bytes": 1e6, "flops": None, "main": False}]
    f = flops.step_floor(ks, period_us=20.0, read_tb_s=3.0, bf16_tflops=1000.0)
    assert f["floor_us"] == pytest.approx(10.0 + 1e6 / 3e6)
    assert f["bound"] == "read" and f["read_us"] == pytest.approx(31 / 3) and f["compute_us"] == pytest.approx(1.0)
    assert f["below ceiling"] == pytest.approx(0.0) and f["small kernels"] == pytest.approx(2.0 - 1 / 3)
    assert f["GPU idle in step"] == pytest.approx(2.0) and f["CPU not hidden"] == pytest.approx(6.0)
    assert f["floor_us"] + sum(f[p] for p in flops.GAP_PARTS) == pytest.approx(20.0)
    last = flops.step_floor(ks, None, 3.0, 1000.0)              # the story's last step: no next one
    assert math.isnan(last["CPU not hidden"]) and last["period_us"] == 14.0
    with pytest.raises(ValueError, match="at least one kernel"):
        flops.step_floor([], 1.0, 3.0, 1000.0)


def test_the_floors_of_the_traced_steps(recording):
    """On the H100 request: the 512-token prefill's floor is its FLOPs over the bf16 ceiling, a batch-1 decode step's
    the weights and KV over the read ceiling (15.1 GB); each row's parts add up to its traced period; the prefill's
    largest part above its floor is the GPU idle between its kernels (its attention runs eagerly between the pieces
    of a breakable CUDA graph: the GPU waits for the CPU's launches), the decode step's is its kernels below their
    ceiling, and the overlap scheduler hides the CPU between decode steps (under 1% of the period)."""
    out, data = recording
    rows = _rows(out)
    pre, dec = rows["prefill, one request"], rows["decode, one request"]
    assert pre["bound"] == "compute" and dec["bound"] == "read"
    assert float(dec["gbytes"]) == pytest.approx(15.09, abs=0.01) and int(dec["bs"]) == 1
    for r in (pre, dec):
        parts = [float(r[c]) for c in ("below_ceiling_ms", "small_kernels_ms", "gpu_idle_ms", "cpu_not_hidden_ms")]
        assert float(r["floor_ms"]) + sum(parts) == pytest.approx(float(r["period_ms"]), rel=1e-9)
    pk = data["pk"]
    assert float(dec["floor_ms"]) == pytest.approx(float(dec["gbytes"]) * 1e9 / (pk["dram_tb_s"] * 1e12) * 1e3, rel=0.01)
    assert max(("below_ceiling_ms", "small_kernels_ms", "gpu_idle_ms", "cpu_not_hidden_ms"),
               key=lambda c: float(pre[c])) == "gpu_idle_ms"
    assert max(("below_ceiling_ms", "small_kernels_ms", "gpu_idle_ms", "cpu_not_hidden_ms"),
               key=lambda c: float(dec[c])) == "below_ceiling_ms"
    assert float(dec["cpu_not_hidden_ms"]) < 0.01 * float(dec["period_ms"])
    s = json.loads((out / "summary.json").read_text())
    found = [x for x in s["findings"] if " a traced period of " in x]
    assert found[0].startswith("Prefill, one request at batch 1: a traced period of") and "bf16 ceiling" in found[0]
    assert "the GPU idle between the step's kernels" in found[0]
    assert "GEMM and attention kernels running below their ceiling" in found[1]
    story = (out / "story.txt").read_text()
    assert "floor of each step" in story and "the pressure load's batch" not in story   # no loaded window recorded


def test_a_loaded_window_adds_its_row(tmp_path, recording):
    """A recording with a traced window at the pressure load's batch (here the H100 request's trace stands in for it:
    the plumbing, not a measurement) gets a row and a finding comparing its floor with batch 1's; a run whose window
    failed says 'not observed' and why."""
    _out, data = recording
    import _sgl08_floors as fl
    rows = fl.floor_rows({**data, "kt_loaded": data["kt_one"], "spans_loaded": data["spans_one"]}, data["pk"])
    assert [r["story"] for r in rows][-1] == "loaded" and rows[-1]["step_kind"] == "decode, the pressure load's batch"
    items = fl.floor_items(rows, {"loaded_info": {"batch": 63, "pool": 32768, "prompt": 384, "new": 192}})
    assert "the pressure load's batch: 63 requests of 384 in / 192 out on a 32,768-token pool" in items[0][1][-1][0]
    miss = fl.floor_items(rows[:2], {"loaded_error": "ServerError: timed out"})
    assert miss[0][1][-1][0] == "the pressure load's batch: not observed (ServerError: timed out)"


def test_the_loaded_batch_is_01s_plateau():
    """08 traces its loaded step at the batch 01's pressure load admits (_sgl01_pressure.plateau), on 01's load shape:
    63 with --quick on the pipeline's pool, the same count the scheduler model of tests/test_sglang_pressure.py
    reaches."""
    import _sgl01_pressure as pl
    import _sglang as sg
    from test_sglang_pressure import admit_and_decode
    q = pl.load_shape(quick=True)
    n = pl.plateau(sg.QUICK_POOL_TOKENS, q["pressure_in"], q["pressure_out"])
    assert n == 63
    m01 = kit.load_script(ROOT / "sglang" / "scripts" / "01_baseline_perf.py", "floors01")
    assert {k: m01.QUICK[k] for k in q} == q
    got = admit_and_decode(pl.burst_size(sg.QUICK_POOL_TOKENS, m01.QUICK), q["pressure_in"], q["pressure_out"],
                           sg.QUICK_POOL_TOKENS)
    assert abs(got["most_running"] - n) <= 2


def test_one_request_on_two_lanes(recording):
    """The H100 request on one millisecond axis: the stamps in their order, the tokenizer's work before the batch is
    formed, the prefill's kernels after forward_entry and before prefill_finished, 32 layer boxes per forward, and the
    overlap scheduler visible: the scheduler's run_batch for the next decode step runs while the GPU still runs the
    current step's layers."""
    _out, data = recording
    import _sgl08_lanes as ln
    spans, marks, (lo, hi) = ln.lane_spans(data)
    t = dict((label, x) for label, x in marks)
    assert list(t) == ["received", "to the scheduler", "batch formed", "prefill finished", "chunk sent", "first token"]
    assert list(t.values()) == sorted(t.values()) and lo == 0.0 and hi > t["first token"]
    gpu = sorted((s for s in spans if s["lane"] == ln.GPU), key=lambda s: s["start"])
    prefill = [s for s in gpu if s["step"] == gpu[0]["step"]]
    assert sum(s["series"] == "GPU: one layer" for s in prefill) == 32
    assert t["batch formed"] < prefill[0]["start"] and prefill[-1]["end"] < t["prefill finished"]
    # the first decode step's layers already run before prefill_finished: the scheduler launched it first
    assert any(s["step"] != gpu[0]["step"] and s["start"] < t["prefill finished"] for s in gpu)
    tok = [s for s in spans if s["series"] == "tokenize + dispatch"][0]
    assert tok["end"] <= t["batch formed"]
    runs = [s for s in spans if s["series"] == "run_batch"]
    layers = [s for s in gpu if s["series"] == "GPU: one layer" and s["step"] != gpu[0]["step"]]
    assert any(r["start"] < g["end"] and g["start"] < r["end"] for r in runs for g in layers)   # CPU and GPU at once
    fig = ln.lanes_figure(data, "test")
    ax = fig.axes[0]
    assert [x.get_text() for x in ax.get_yticklabels()][::-1] == list(ln.LANES)        # top to bottom
    labels = [h.get_label() for h in ax.get_legend().legend_handles]
    assert len(labels) == len(set(labels)) and "run_batch" in labels and "stamps (dashed, labelled)" in labels
    colours = [tuple(h.get_facecolor()) for h in ax.get_legend().legend_handles[:-1]]
    assert len(colours) == len(set(colours))                   # one colour per series


def test_the_story_findings_read_the_runs_own_figures(recording):
    """The sentences beside the story are written from the run's figures: the prefill forward's share of the untraced
    TTFT (the waterfall's median repetition), the prefill's kernel mix (its layer tree), the decode step as one graph
    replay beside the scheduler's iteration (the traced split), the GEMMs against their ceilings."""
    out, _data = recording
    s = json.loads((out / "summary.json").read_text())
    first = s["findings"][:5]
    rows = list(csv.DictReader(open(out / "waterfall.csv")))
    pf = next(r for r in rows if r["waterfall"] == "ttft" and r["level"] == "0" and "prefill forward" in r["part"])
    assert first[0].startswith(f"Untraced, the prefill forward is ") and f"({float(pf['ms']):.1f} of" in first[0]
    assert first[1].startswith("In the one-request prefill step (bs 1) the four layer GEMMs take")
    assert first[2].startswith("A batch-1 decode step is one CUDA-graph replay of 431 kernels")
    assert first[3].startswith("At batch 1 the decode gate-up GEMM streams its weights at")
    assert first[4].startswith("In the one-request prefill the layer GEMMs reach") and "(o_proj, " in first[4]
