"""mini-SGLang 08's waterfall of one offline generate (_msgl_forward.Forward.clocked -> _msgl_waterfall.waterfall_of /
decode_iteration).

No recording of the wrapped calls exists yet (they need a GPU run of 08_forward_timeline.py): the event list below is
constructed by hand in the shape Forward.clocked records — (name, t0, t1, info) in perf_counter seconds, in the order
mini-SGLang's overlap loop makes the calls (scheduler/scheduler.py:83-106, llm/llm.py:45-72) — so these tests check
the analysis, not mini-SGLang's numbers.
"""
import sys
from pathlib import Path

import pytest

from common.tables import waterfall

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def m():
    sys.path.insert(0, str(ROOT / "mini-sglang" / "scripts"))
    import _msgl_waterfall
    return _msgl_waterfall


def clocked(decode_gap_ms: float = 0.0) -> dict:
    """One generate: receive (tokenize inside), schedule (metadata inside), the prefill launch (plan inside), the empty
    first result, then iteration 2 (decode 1 scheduled and launched) before the prefill's result is read, then decode
    iterations of 6 ms each (``decode_gap_ms`` of each spent outside every wrapped call)."""
    ms = 1e-3
    ev = [("receive", 0.1 * ms, 0.9 * ms, 1), ("tokenize", 0.2 * ms, 0.8 * ms, None),
          ("schedule", 1.0 * ms, 1.6 * ms, True), ("attention metadata", 1.2 * ms, 1.4 * ms, None),
          ("forward launch", 1.7 * ms, 12.0 * ms, None), ("FlashInfer plan()", 2.0 * ms, 2.2 * ms, None),
          ("result", 12.1 * ms, 12.1 * ms, False),
          ("receive", 12.2 * ms, 12.3 * ms, 0), ("schedule", 12.3 * ms, 12.8 * ms, True),
          ("forward launch", 12.8 * ms, 14.8 * ms, None), ("result", 15.0 * ms, 30.2 * ms, True),
          ("send", 30.0 * ms, 30.1 * ms, 1)]
    t = 30.2 * ms
    for _ in range(6):
        step = (6.0 - decode_gap_ms) * ms
        ev += [("receive", t, t + 0.1 * ms, 0), ("schedule", t + 0.1 * ms, t + 0.6 * ms, True),
               ("forward launch", t + 0.6 * ms, t + 2.6 * ms, None), ("result", t + 2.6 * ms, t + step, True),
               ("send", t + step - 0.1 * ms, t + step, 1)]
        t += 6.0 * ms
    steps = [{"phase": "prefill", "gpu_ms": 14.0}] + [{"phase": "decode", "gpu_ms": 5.5}] * 7
    return {"call": 0.0, "events": ev, "steps": steps}


def test_the_ttft_of_one_offline_generate(m):
    wf = m.waterfall_of(clocked())
    ms = {p["name"]: round(p["ms"], 3) for p in wf["parts"]}
    assert ms == {"tokenize": 0.9, "batch scheduling": 0.3, "attention metadata": 0.2, "sampler prepare": 0.2,
                  "prefill launch (CPU)": 10.4, "overlap: next step first": 3.0, "wait for the GPU + result": 15.0}
    assert wf["ok"] and abs(wf["total_ms"] - 30.0) < 1e-9
    assert abs(wf["plan_ms"] - 0.2) < 1e-9 and abs(wf["tokenize_ms"] - 0.6) < 1e-9 and wf["prefill_gpu_ms"] == 14.0


def test_one_decode_step_and_the_story_block(m):
    w = m.waterfall_summary([clocked() for _ in range(5)])
    assert w["ttft"]["ok"] and w["ttft"]["n"] == 5
    d = w["decode"]
    assert d["ok"] and abs(d["total_ms"] - 6.0) < 1e-6 and abs(d["remainder_ms"]) < 1e-6
    lines = [ln for item in m.waterfall_items(w) for ln, _k in item[1]]
    assert all(len(ln) <= 120 for ln in lines) and any("✓ adds up within 5%" in ln for ln in lines)
    assert any("records no time stamps" in ln for ln in lines)           # what it cannot: said on the page


def test_time_outside_every_wrapped_call_fails_the_check(m):
    # 1 of every 6 ms of a decode step spent in the loop outside the wrapped calls: 17% unattributed
    w = m.waterfall_summary([clocked(decode_gap_ms=1.0) for _ in range(5)])
    assert not w["decode"]["ok"]
    with pytest.raises(waterfall.WaterfallError, match="unattributed"):
        waterfall.check(w["decode"])
    lines = [ln for item in m.waterfall_items(w) for ln, _k in item[1]]
    assert any("✗ DOES NOT ADD UP" in ln for ln in lines)
