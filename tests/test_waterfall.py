"""common.tables.waterfall and SGLang's stamps (sglang/scripts/_sglang.py) on real H100 recordings.

Fixtures (tests/fixtures/README.md, round 3, a fresh H100, 2026-11-25):
  sglang_request_stamps_h100.json.gz        20 streamed requests, one at a time (10 text, 10 input_ids; the first
      text one paid a one-off JIT), each with the client's clock, the first/last chunk's meta_info and the
      /metrics latency histograms before and after it; and one traced request (its stamps)
  sglang_trace_one_text_request_h100.json.gz the torch-profiler trace of that traced request
"""
import gzip
import json
import sys
from pathlib import Path

import pytest

from common.tables import trace, waterfall
from common.tables.waterfall import WaterfallError

ROOT = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(ROOT / "sglang" / "scripts"))
import _sglang as sg  # noqa: E402


def as_result(r: dict) -> dict:
    """A fixture request as Server.generate(stream=True) returns it: the last chunk's meta_info and the client."""
    c = r["chunk_t"]
    return {"meta_info": r["last_meta"], "client": {"t_send": r["t_send"], "t_first": c[0], "t_done": c[-1],
                                                    "ttft_s": c[0] - r["t_send"], "itl_s": [b - a for a, b in zip(c, c[1:])]}}


@pytest.fixture(scope="module")
def rec():
    return json.load(gzip.open(FIX / "sglang_request_stamps_h100.json.gz"))


@pytest.fixture(scope="module")
def wfs(rec):
    """One untraced waterfall per request, JIT request left out: {'text': [...], 'ids': [...]}."""
    out = {"text": [], "ids": []}
    for i, r in enumerate(rec["requests"]):
        if i == 0:                                    # the server's first text request: 11.7 s of one-off JIT
            continue
        out[r["kind"]].append(sg.ttft_waterfall(as_result(r), r["metrics_before"], r["metrics_after"], label=f"{i}"))
    return out


@pytest.fixture(scope="module")
def ev():
    return trace.read_chrome_trace(FIX / "sglang_trace_one_text_request_h100.json.gz")


def test_one_request_from_stamps_to_the_clients_ttft(rec):
    r = rec["requests"][1]                            # text, rep 1: TTFT 28.4 ms
    wf = sg.ttft_waterfall(as_result(r), r["metrics_before"], r["metrics_after"])
    ms = {p["name"]: p["ms"] for p in wf["parts"]}
    assert list(ms) == [name for _k, name in sg.TTFT_CHAIN[1:]]          # every stamp present: 8 parts
    assert 1.5 < ms["HTTP receive"] < 2.1 and 0.8 < ms["tokenize + dispatch"] < 1.2
    # scheduler_recv from the /metrics request_process stage (one observation between the two scrapes)
    assert 0.02 < ms["request processing"] < 0.1 and 0.4 < ms["to the scheduler"] < 0.8
    assert 21 < ms["prefill forward"] < 23 and 2 < ms["detokenize + return"] < 2.6
    assert abs(wf["total_ms"] - 28.41) < 0.05 and wf["ok"] and abs(wf["remainder_ms"]) < 1e-6
    assert waterfall.check(wf) is not None


def test_without_metrics_the_unstamped_boundary_merges_its_parts(rec):
    r = rec["requests"][1]
    wf = sg.ttft_waterfall(as_result(r))                                # no /metrics scrapes: no scheduler_recv
    names = [p["name"] for p in wf["parts"]]
    assert "to the scheduler + request processing" in names and wf["ok"]     # no time dropped


def test_median_of_the_repetitions_adds_up(wfs, rec):
    for kind, ws in wfs.items():
        med = waterfall.median(ws)
        assert med["n"] == len(ws) and med["ok"], kind
        assert abs(med["remainder_pct"]) < 5
        lines = waterfall.render(med, title=kind)
        assert all(len(ln) <= 120 for ln in lines) and "✓ adds up within 5%" in lines[-1]
        mid = ws[med["median_rep"]]["total_ms"]
        assert sorted(w["total_ms"] for w in ws)[(len(ws) - 1) // 2] == mid          # the median repetition
    # the tokenizer is visible: text requests spend ~0.7 ms more in tokenize + dispatch than input_ids ones
    tok = {k: {p["name"]: p["ms"] for p in waterfall.median(ws)["parts"]}["tokenize + dispatch"] for k, ws in wfs.items()}
    assert tok["text"] - tok["ids"] > 0.4


def test_a_waterfall_that_does_not_add_up_fails_its_check(wfs, rec):
    med = waterfall.median(wfs["text"])
    # the parts of these requests against the TTFT of the traced one (47 ms): 10% unattributed
    bad = waterfall.median(wfs["text"], total_ms=med["sum_ms"] * 1.10)
    assert not bad["ok"]
    with pytest.raises(WaterfallError, match="unattributed, more than 5%"):
        waterfall.check(bad)
    assert "✗ DOES NOT ADD UP" in waterfall.render(bad)[-1]
    # a stamp on a clock that disagrees: forward_entry 30 ms late makes the prefill forward negative
    r = as_result(rec["requests"][1])
    r["meta_info"] = {**r["meta_info"], "forward_entry_time": r["meta_info"]["forward_entry_time"] + 0.030}
    skewed = sg.ttft_waterfall(r)
    assert skewed["negative"] == ["prefill forward"] and not skewed["ok"]
    with pytest.raises(WaterfallError, match="negative parts"):
        waterfall.check(skewed)


def test_the_prefill_forward_split_on_the_traced_request(rec, ev):
    st = sg.request_stamps(as_result(rec["traced"]))
    sp = sg.prefill_split(ev, st, layers=32)
    ms = {p["name"]: p["ms"] for p in sp["parts"]}
    assert list(ms) == ["batch scheduling", "run_batch before the forward", "forward prep + attention plan",
                        "GPU forward", "sampling", "overlap: next step first", "result processing"]
    assert all(v >= 0 for v in ms.values()) and sp["ok"]
    assert abs(sp["total_ms"] - (st["prefill_finished"] - st["forward_entry"]) * 1e3) < 1e-6
    # the piecewise prefill graph: the CPU launches it layer by layer, the GPU is busy about half of the span
    assert 20 < ms["GPU forward"] < 30 and 35 < sp["gpu_busy_pct"] < 60 and sp["kernels"] > 400
    # FlashInfer plan(): two calls (ragged + paged: the BOS token is a 1-token cached prefix)
    assert sp["plan_calls"] == 2 and 0.1 < sp["plan_ms"] < 0.5
    # the overlap scheduler launches decode step 1 before it reads the prefill's result: ~4.8 ms of the TTFT
    assert 3 < ms["overlap: next step first"] < 7


def test_split_and_traced_vs_untraced_per_part(wfs, rec, ev):
    med = waterfall.median(wfs["text"])
    tr = sg.ttft_waterfall(as_result(rec["traced"]), label="traced")            # the traced request: no /metrics
    u, t = waterfall.align(med, tr)
    assert [p["name"] for p in u["parts"]] == [p["name"] for p in t["parts"]]
    assert "to the scheduler + request processing" in [p["name"] for p in u["parts"]] and u["ok"]
    u = waterfall.with_split(u, "prefill forward", sg.prefill_split(ev, sg.request_stamps(as_result(rec["traced"])), 32))
    r = waterfall.ratios(u, t)
    assert r["queue wait"] > 3                     # the profiled scheduler loop takes longer to pick the request up
    lines = waterfall.render(u, traced=t, title="TTFT")
    from common.base import story
    tree = story.tree("S", [("TTFT", [(ln, []) for ln in waterfall.render(u, traced=t, width=110)])])  # as 08 does
    folded = story.fold(tree).split("\n")
    assert all(len(ln) <= 120 for ln in folded)
    flat = " ".join(" ".join(folded).replace("│", " ").split())
    assert "after the request joined the batch" in flat and "copies to the GPU" in flat   # folded, never cut
    assert any("GPU forward" in ln for ln in lines) and any("x" in ln and "prefill forward" in ln for ln in lines)
    rows = waterfall.rows(u, traced=t)
    assert rows[-1]["part"] == "(unattributed)" and any(x["level"] == 1 for x in rows)
    spans = waterfall.spans_of(tr)
    assert len(spans) == len(tr["parts"]) and all(b >= a for _n, a, b in spans)


def test_one_decode_step_as_the_scheduler_loop_spends_it(ev):
    ds = sg.decode_split(ev)
    ms = {p["name"]: p["ms"] for p in ds["parts"]}
    assert ds["bs"] == 1 and ds["iterations"] >= 10 and ds["ok"]          # the loop's ranges cover >= 95% of it
    assert ms["run_batch"] + ms["process_batch_result"] > 0.8 * ds["total_ms"]
    assert ds["gpu_busy_pct"] > 90                                          # the decode graph keeps the GPU busy
    itl = sg.itl_waterfall(6.45, 6.40)
    assert itl["ok"] and abs(itl["remainder_ms"] - 0.05) < 1e-9
    assert not sg.itl_waterfall(6.45, 5.0)["ok"]                           # 22% of the ITL unexplained: fails


def test_the_median_is_one_real_repetition_not_a_sum_of_medians():
    """Three generates whose parts each add up exactly (consecutive stamps); one part's spread is wide (a first
    launch of 22-40 ms, as mini-SGLang 08's prefill launch on an H100). Per-part medians sum to 6.5 ms less than
    the median total (+13%: 'does not add up' with nothing unattributed anywhere); the median repetition adds up."""
    chain = [("a", None), ("b", "tokenize"), ("c", "launch"), ("d", "wait")]
    reps = [(1.5, 22.0, 16.0), (1.6, 40.0, 1.0), (1.7, 30.0, 14.0)]          # totals 39.5, 42.6, 45.7 ms
    ws = []
    for i, (t, l, w) in enumerate(reps):
        ws.append(waterfall.build({"a": 0.0, "b": t / 1e3, "c": (t + l) / 1e3, "d": (t + l + w) / 1e3}, chain,
                                  label=f"rep {i}"))
    assert all(w["ok"] and abs(w["remainder_ms"]) < 1e-9 for w in ws)
    med = waterfall.median(ws)
    assert med["median_rep"] == 1 and abs(med["total_ms"] - 42.6) < 1e-6
    assert med["ok"] and abs(med["remainder_ms"]) < 1e-9
    launch = next(p for p in med["parts"] if p["name"] == "launch")
    assert launch["ms"] == pytest.approx(40.0) and launch["median_ms"] == pytest.approx(30.0)
    assert (launch["min_ms"], launch["max_ms"]) == (pytest.approx(22.0), pytest.approx(40.0))
    sum_of_medians = sum(p["median_ms"] for p in med["parts"])
    assert abs(med["total_ms"] - sum_of_medians) > 0.05 * med["total_ms"]      # what the old rule judged


def test_a_waterfall_that_adds_up_by_construction_is_shown_not_judged():
    chain = [("a", None), ("b", "x"), ("c", "y")]
    wf = waterfall.build({"a": 0.0, "b": 0.001, "c": 0.003}, chain)
    assert "✓ adds up" in waterfall.render(wf)[-1]
    last = waterfall.render(wf, judged=False)[-1]
    assert "not judged" in last and "✓" not in last and "✗" not in last
