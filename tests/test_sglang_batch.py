"""SGLang 01's decode step against batch size (sglang/scripts/_sgl01_batch.py): a sweep point read from the scheduler's
lines, the read and compute floors of each point, the batch where the step leaves the read floor's scaling, the figure
and the findings.

Real data where there is some: the lines of a sweep point of the warm H200 `make quick` (2026-11-28) whose 128 requests,
sent from a thread each, did not decode together (sglang_01_batch128_stragglers_h200.log); the scheduler's Decode lines of the H200 pressure run
recorded by 08 (tests/fixtures/sglang_08_recording_h200/raw.json: steps at batch 1 and at batch 51 on a full pool,
SGLang's own step clock, each line's CUDA-graph flag) stand for two points. The rest runs on a small made-up table
(said at each test): the shape of a sweep, not a measurement."""
import json
import sys
from pathlib import Path

import pytest

from common.capture import models

ROOT = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(ROOT / "sglang" / "scripts"))
import _sgl01_batch as bt  # noqa: E402

CFG = models.config("llama-3.1-8b")
PK = json.loads((FIX / "sglang_08_recording_h200" / "raw.json").read_text())["pk"]     # the H200's measured ceilings


class _Stub:
    """What batch_sweep asks of a server, with the scheduler's lines of one real sweep point as every point's log."""

    def __init__(self, lines: str):
        self.lines, self.batches = lines, []

    def server_info(self):
        return {"max_total_num_tokens": 32768}

    def flush_cache(self):
        pass

    def log_mark(self):
        return 0

    def log_since(self, _mark):
        return self.lines

    def generate_batch(self, input_ids, sampling_params):
        self.batches.append((len(input_ids), {len(x) for x in input_ids}, sampling_params))
        return [{} for _ in input_ids]

    def generate_many(self, *a, **k):
        raise AssertionError("a sweep point is one batched request, not a thread per request")


def test_a_sweep_point_is_one_batched_request_and_stragglers_are_said():
    """Each point sends its batch as one /generate (SGLang hands the batch to its scheduler in one loop): from a thread
    each, 3 of 128 requests came after 125 had started decoding on the H200, so no step ran at 128 and the point was
    lost. On those real lines the point is None and the sweep says so as a point error; the requests sent are the
    batch, PROMPT tokens each, greedy."""
    text = (FIX / "sglang_01_batch128_stragglers_h200.log").read_text()
    lines = bt.sg.parse_batch_log(text)
    assert bt.point(lines, 128) is None and bt.point(lines, 125)["steps"] == 48
    errors, logged = [], []
    run = type("R", (), {"log": staticmethod(logged.append),
                         "point_error": staticmethod(lambda where, e: errors.append((where, str(e))))})
    srv = _Stub(text)
    rows = bt.batch_sweep(srv, {"reps": 1}, run, quick=True)
    sizes = [b for b, _l, _sp in srv.batches]
    assert sizes == [b for b in bt.BATCHES if b * 112 <= 32768]
    assert all(lens == {bt.SHAPES["quick"]["prompt"]} and sp["max_new_tokens"] == bt.SHAPES["quick"]["new"]
               and sp["temperature"] == 0 for _b, lens, sp in srv.batches)
    assert rows == []                   # those lines hold no step at any batch of the sweep: every point is an error
    said = {w["batch"]: e for w, e in errors}
    assert set(said) == set(sizes) and said[128] == "no decode step at batch 128 in the scheduler's lines"


def _h200_lines():
    return json.loads((FIX / "sglang_08_recording_h200" / "raw.json").read_text())["pressure"]


def test_a_point_is_the_schedulers_step_at_the_full_batch():
    """On the real lines: the step at a batch is SGLang's clock (running / gen throughput, the first line after a
    change left out), the KV those steps held, and whether each replayed a graph; a batch with no line is None."""
    lines = _h200_lines()
    p1, p51 = bt.point(lines, 1), bt.point(lines, 51)
    assert p1["steps"] == 41 and p1["graph_steps"] == 41 and p1["cuda_graph"] is True
    assert p1["step_ms"] == pytest.approx(4.90, abs=0.01) and p51["step_ms"] == pytest.approx(6.57, abs=0.01)
    assert p51["kv_tokens"] == pytest.approx(28736.5)
    assert bt.point(lines, 200) is None
    eager = [{**r, "cuda_graph": False} if r.get("running_req") == 51 and i % 2 else r for i, r in enumerate(lines)]
    # every other batch-51 line made eager: some steps still replayed a graph, fewer than when all of them did
    assert bt.point(eager, 51)["cuda_graph"] is False and 0 < bt.point(eager, 51)["graph_steps"] < p51["graph_steps"]


def test_two_real_steps_against_their_floors():
    """Batch 1 and batch 51 of the real pressure run (its full pool: 28,737 KV tokens at 51): the read floor grows with
    the KV the step reads, the compute floor with the batch; the step at 51 grows about as much as its bytes (within
    LEAVE_TOL), so by this rule it is still bound by reading: weights and KV."""
    rows = bt.with_floors([{**bt.point(_h200_lines(), b), "rep": 0} for b in (1, 51)], CFG, PK)
    r1, r51 = rows
    w = models.param_count(CFG) * 2 - CFG["vocab_size"] * CFG["hidden_size"] * 2
    assert r1["weights_gb"] == r51["weights_gb"] == pytest.approx(w / 1e9)
    must = (r51["weights_gb"] + r51["kv_gb"]) / PK["dram_tb_s"]          # + the activations in and out (a few %)
    assert must < r51["read_ms"] < 1.05 * must
    assert r51["compute_ms"] == pytest.approx(51 * r1["compute_ms"], rel=0.2) and r51["compute_ms"] < r51["read_ms"]
    at, ratios = bt.leaves_read_floor(rows)
    assert at is None and 1.0 < ratios[1]["over_read_scaling"] < 1 + bt.LEAVE_TOL


def _made_up(flat_until=32, eager_from=None):
    """A made-up sweep (no GPU sweep recorded yet): the batch-1 step of the real H200 lines, flat with the bytes up to
    ``flat_until``, then growing with the batch; points from ``eager_from`` on without CUDA graphs."""
    rows = []
    for b in bt.BATCHES:
        for rep, jitter in enumerate((0.99, 1.0, 1.01)):
            step = 4.9 * (1 + 0.0005 * b) * (1 if b <= flat_until else b / flat_until) * jitter
            rows.append({"batch": b, "rep": rep, "step_ms": step, "kv_tokens": b * 90,
                         "cuda_graph": not (eager_from and b >= eager_from)})
    return bt.with_floors(rows, CFG, PK)


def test_the_batch_where_the_step_leaves_the_read_floor():
    """Made-up sweeps: flat to 32 then growing with the batch -> it leaves at 64; flat throughout -> never (the findings
    say which); the guard: the rule compares against the read floor's growth, so a flat step is never 'leaving'."""
    rows = _made_up(flat_until=32)
    at, ratios = bt.leaves_read_floor(rows)
    assert at == 64 and all(r["over_read_scaling"] < 1 + bt.LEAVE_TOL for r in ratios if r["batch"] <= 32)
    found = bt.batch_findings(rows)
    assert found[0].startswith("From batch 1 to batch 256 the decode step goes from")
    assert found[1].startswith("The step stops being bound by reading the weights at batch 64: there it runs")
    assert "(up to batch 32 within 10%)" in found[1]
    assert "no swept batch is compute-bound by the floors" in found[2] or "passes the read floor" in found[2]
    assert found[3] == "Every point's decode steps replayed a CUDA graph."
    flat = _made_up(flat_until=10_000)
    assert bt.leaves_read_floor(flat)[0] is None
    assert "in this sweep the step stays bound by reading the weights" in bt.batch_findings(flat)[1]
    assert bt.batch_findings(rows[:3]) == []                    # one batch: nothing to compare


def test_the_figure_draws_both_floors_and_hollow_eager_points():
    pytest.importorskip("matplotlib")
    rows = _made_up(flat_until=32, eager_from=128)
    fig = bt.batch_figure(rows, PK)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["measured decode step (each repetition; line: median)",
                      "steps without a CUDA graph (above the captured sizes)",
                      "read floor: weights + KV over the DRAM read ceiling", "compute floor: FLOPs over the bf16 ceiling"]
    lines = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert len({ln.get_color() for ln in lines}) == 2                        # one colour per floor
    assert any("leaves the read floor's scaling" in t.get_text() for t in ax.texts)
    assert "Batches 128, 256 decoded with eager launches" in bt.batch_findings(rows)[3]
    items = bt.batch_items(rows)
    assert items[0][0].endswith("leaves the read floor scaling at batch 64") and len(items[0][1]) == len(bt.BATCHES)


def test_the_quick_sweep_fits_the_pool():
    """256 requests of the --quick shape fit the pipeline's pool, so every batch of the sweep is admitted at once."""
    import _sglang as sg
    q = bt.SHAPES["quick"]
    assert max(bt.BATCHES) * (q["prompt"] + q["new"]) <= 0.9 * sg.QUICK_POOL_TOKENS


def test_01_reanalyses_its_batch_sweep(tmp_path):
    """01's --reanalyse of a recording with itl_vs_batch.csv (the made-up sweep above, beside the real H200 recording of
    tests/test_reanalyse_sglang.py): the figure, the findings and the story's section; a recording without the table
    (the real one as recorded) makes none of them."""
    pd = pytest.importorskip("pandas")
    pytest.importorskip("matplotlib")
    from test_reanalyse_sglang import recording_01
    mod, rec = recording_01(tmp_path)
    plain = tmp_path / "plain"
    assert mod.main(["--reanalyse", str(rec), "--out", str(plain)]) == 0
    assert not (plain / "itl_vs_batch.png").exists() and not json.loads((plain / "summary.json").read_text())["findings"]
    keep = ("batch", "rep", "step_ms", "kv_tokens", "cuda_graph")
    pd.DataFrame([{k: r[k] for k in keep} for r in _made_up(flat_until=32)]).to_csv(rec / "itl_vs_batch.csv", index=False)
    out = tmp_path / "o"
    assert mod.main(["--reanalyse", str(rec), "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert (out / "itl_vs_batch.png").stat().st_size > 10_000 and "itl_vs_batch" in s["figures"]
    assert any(f.startswith("The step stops being bound by reading the weights at batch 64") for f in s["findings"])
    assert "decode step against batch size" in (out / "story.txt").read_text()
    assert (out / "itl_vs_batch.csv").is_file()                 # the recording travels
