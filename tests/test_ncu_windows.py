"""Which traced step each Nsight Compute window of SGLang 08 stands for, on the real captures of test_timeline.

The fixture trace's prefill is a cold one (token IDs: nothing cached, the ragged attention kernel only); the
fixture ncu CSV holds three windows in order: that prefill, a decode step at batch 1, one at batch 32 (148 rows).
A served text prompt finds its BOS token cached (warm: ragged + paged + merge); a window must never lend its
counters to a step of the other path, and a window no traced step matches must keep its place in the alignment.
"""
import sys
from pathlib import Path

import pytest

from tests import kit
from tests.test_timeline import H200, kt, ncu_rows  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parent.parent
P = {"prompt": 512, "batch": 32}


@pytest.fixture(scope="module")
def s08():
    sys.path.insert(0, str(ROOT / "sglang" / "scripts"))
    return kit.load_script(ROOT / "sglang" / "scripts" / "08_execution_story.py", "story08w")


def test_prefill_path_from_the_log_or_the_kernels(s08, kt):
    assert s08.prefill_paths(kt) == {0: "cold"}                        # no merge kernel, no log: cold
    steps = sorted(kt["step"].unique())
    assert s08.prefill_paths(kt, [{"cached_token": 1}, {}]) == {0: "warm"}   # the log says one token was cached
    assert len(steps) == 2


def test_windows_stand_for_steps_of_their_own_path(s08, kt):
    specs = {w["name"]: w for w in s08.window_specs(kt, ["prefill-cold_b1", "prefill_b1", "decode_b1", "decode_b32"], P)}
    assert specs["prefill-cold_b1"]["step"] == 0                          # the cold window: the cold step
    assert specs["prefill-cold_b1"]["match"] == {"mode": "EXTEND", "bs": 1, "toks": 512}
    assert specs["prefill_b1"]["step"] is None                            # the served (warm) window: no warm step here
    assert specs["decode_b1"]["step"] == 1 and specs["decode_b32"]["step"] is None
    warm = s08.window_specs(kt, ["prefill-cold_b1", "prefill_b1"], P, [{"cached_token": 1}, {}])
    assert [w["step"] for w in warm] == [None, 0]


def test_an_untraced_window_keeps_its_place_and_gets_its_rows(kt, ncu_rows):
    from common import timeline
    wins = [{"name": "prefill_b1", "step": 0, "match": {"mode": "EXTEND", "bs": 1}},
            {"name": "decode_b1", "step": 1, "match": {"mode": "DECODE", "bs": 1}},
            {"name": "decode_b32", "step": None}]
    j, info = timeline.attach_counters(kt, ncu_rows, wins, H200)
    by = {i["window"]: i for i in info}
    lo, hi = by["decode_b32"]["ncu_rows"]
    assert by["decode_b1"]["ncu_rows"][1] == lo - 1 and hi == len(ncu_rows) - 1
    assert by["decode_b32"]["kernels_with_counters"] == 0 and by["decode_b32"]["expected"] == 0
    rows = ncu_rows.iloc[lo:hi + 1]
    assert not rows["kernel"].str.contains("PrefillWithKVCacheKernel<").any()     # no prefill row in a decode window
    assert by["decode_b1"]["matched"] == by["decode_b1"]["expected"]                # the others align as before


def test_cold_attention_is_the_cold_windows_second_layer(s08, kt, ncu_rows):
    from common import timeline, trace
    wins = [{"name": "prefill-cold_b1", "step": None},
            {"name": "decode_b1", "step": 1, "match": {"mode": "DECODE", "bs": 1}}]
    _j, info = timeline.attach_counters(kt, ncu_rows, wins, H200)
    cold = s08.cold_attention(ncu_rows, info)
    assert cold and all(trace.kernel_class(r["kernel"]) == "attention" for r in cold)
    assert any("PrefillWithKVCache" in r["kernel"] for r in cold) and len(cold) <= 2
    assert all(r["ncu_time_us"] > 0 for r in cold)
