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
from common.tables import kernels

ROOT = Path(__file__).resolve().parent.parent
P = {"prompt": 512, "batch": 32}


@pytest.fixture(scope="module")
def s08():
    """08's counters phase (sglang/scripts/_sgl08_counters.py): the windows, their join, the transitions."""
    sys.path.insert(0, str(ROOT / "sglang" / "scripts"))
    return kit.load_script(ROOT / "sglang" / "scripts" / "_sgl08_counters.py", "_sgl08_counters")


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
    from common.tables import timeline
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
    from common.tables import timeline, trace
    wins = [{"name": "prefill-cold_b1", "step": None},
            {"name": "decode_b1", "step": 1, "match": {"mode": "DECODE", "bs": 1}}]
    _j, info = timeline.attach_counters(kt, ncu_rows, wins, H200)
    cold = s08.cold_attention(ncu_rows, info)
    assert cold and all(trace.kernel_class(r["kernel"]) == "attention" for r in cold)
    assert any("PrefillWithKVCache" in r["kernel"] for r in cold) and len(cold) <= 2
    assert all(r["ncu_time_us"] > 0 for r in cold)



@pytest.fixture(scope="module")
def run_h200():
    """The H200 run of 2026-11-25 (`08_execution_story.py --quick --ncu`, commit c447205): its one-request story's
    kernel table cut to the prefill (step 0) and the decode step the decode window stands for (step 33), and the
    raw ncu CSV of its five windows (cold prefill, served prefill, decode b1, prefill of 16, decode b32)."""
    import gzip

    import pandas as pd
    from common.capture import ncu
    fx = ROOT / "tests" / "fixtures"
    kt = pd.read_csv(fx / "sglang_08_kernels_steps_0_33_h200.csv.gz")
    rows = kernels.summarize(ncu.read_raw(gzip.open(fx / "sglang_08_ncu_five_windows_h200.csv.gz", "rt").read()), peaks=H200)
    return kt, rows


def test_the_served_prefill_takes_its_own_window_on_the_real_run(s08, run_h200):
    """On this run one global alignment took 56 of the served prefill's 57 kernels from the cold window's rows
    (the cold window lacks only the paged and merge kernels). Window after window, it takes its own rows."""
    from common.tables import timeline
    kt, rows = run_h200
    names = ["prefill-cold_b1", "prefill_b1", "decode_b1", "prefill_b16", "decode_b32"]
    specs = s08.window_specs(kt, names, {"prompt": 512, "batch": 32})
    assert [w["step"] for w in specs] == [None, 0, 33, None, None]     # the 8192-token window: no such step here
    j, info = timeline.attach_counters(kt, rows, specs, H200)
    by = {i["window"]: i for i in info}
    cold_lo, cold_hi = by["prefill-cold_b1"]["ncu_rows"]
    assert cold_lo == 0 and by["prefill_b1"]["ncu_rows"][0] == cold_hi + 1
    assert not rows.iloc[cold_lo:cold_hi + 1]["kernel"].str.contains("Merge").any()   # the cold rows: no merge
    assert by["prefill_b1"]["matched"] >= by["prefill_b1"]["expected"] - 1
    same = s08.same_kernels(j, "prefill_b1")
    assert same["same_grid_pct"] == 100.0 and 1.0 < same["ncu_over_traced"] < 1.5


def test_the_cache_transition_joins_the_cold_and_the_served_prefill_windows(s08, run_h200):
    """With the counters, 08's transitions name the cache's cold -> warm prefill (its cache over time, request by
    request, is 02's now): one layer's attention under ncu in the cold window (token IDs, nothing cached: the ragged
    kernel only) beside the served prefill's (text: its BOS cached, ragged + paged + merge), at the served prefill's
    time. On the real H200 run: the same prompt length, each kernel with its ncu time."""
    from common.tables import timeline
    kt, rows = run_h200
    specs = s08.window_specs(kt, ["prefill-cold_b1", "prefill_b1", "decode_b1", "prefill_b16", "decode_b32"], P)
    j, info = timeline.attach_counters(kt, rows, specs, H200)
    data = {"kt_one": j, "base_one": 1000.0, "P": P, "cold_attention": s08.cold_attention(rows, info, 2)}
    tr = s08.transitions(data)
    assert [t["kind"] for t in tr] == ["prefill -> decode", "cache cold -> warm"]
    text = tr[1]["text"]
    assert text.startswith("cache cold -> warm: a 512-token prefill, per layer under ncu: attention ragged only "
                           "(nothing cached) PrefillWithKVCacheKernel")
    cold, warm = text.split(" -> ragged + paged + merge (prefix in the cache) ")
    assert "Merge" not in cold and "Paged" not in cold and "BatchPrefillWithPagedKVCache" in warm and "MergeState" in warm
    assert tr[1]["t"] == pytest.approx((kt[kt["step"] == 0]["ts_us"].min() + 1000.0) / 1e6)
    assert "(ncu)" in warm and " us (ncu)" in cold
    plain = s08.transitions({**data, "cold_attention": []})          # no cold window: no such event
    assert [t["kind"] for t in plain] == ["prefill -> decode"]



def test_the_batch_prefill_is_not_half_taken_from_the_cold_window(run_h200):
    """The batch story of the same run (kernel table cut to its first prefill, 1 request of 511 tokens, and the
    decode step at batch 32): one global alignment spread its prefill window over rows 1-113, the cold window's
    and its own. Window after window, it takes only its own rows."""
    import pandas as pd
    from common.tables import timeline
    _kt, rows = run_h200
    kt = pd.read_csv(ROOT / "tests" / "fixtures" / "sglang_08_batch_kernels_steps_0_36_h200.csv.gz")
    specs = [{"name": "prefill-cold_b1", "step": None},
             {"name": "prefill_b1", "step": 0, "match": {"mode": "EXTEND", "bs": 1}},
             {"name": "decode_b1", "step": None}, {"name": "prefill_b16", "step": None},
             {"name": "decode_b32", "step": 36, "match": {"mode": "DECODE", "bs": 32}}]
    _j, info = timeline.attach_counters(kt, rows, specs, H200)
    by = {i["window"]: i for i in info}
    assert by["prefill-cold_b1"]["ncu_rows"] == (0, 56)                         # the cold window, whole
    assert by["prefill_b1"]["ncu_rows"] == (57, 113)
    assert by["decode_b32"]["matched"] == by["decode_b32"]["expected"] == 43


ONE_LAYER = "sglang_08_ncu_1layer_four_windows_h100.csv.gz"


def test_a_server_cut_to_one_layer_lends_every_layer_its_counters(kt):
    """The counters' server cut to 1 layer (08 since 1c8479f): its layer opens with RMSNorm where the full model's
    later layers open with FusedAddRMSNorm, which the cut layer runs after its attention, at the same grid. Fixture:
    sglang/results/08_execution_story/ncu/ncu.csv of the H100 pipeline run of 1c8479f (2026-11-27; 156 kernels in
    four windows: cold prefill, warm prefill, decode at batch 1 and 32), gzipped; the traced steps are the H200
    fixture's (same shapes, 132 SMs on both GPUs)."""
    import gzip
    from common.capture import ncu
    from common.tables import timeline
    rows = kernels.summarize(ncu.read_raw(gzip.open(ROOT / "tests" / "fixtures" / ONE_LAYER, "rt").read()), peaks=H200)
    wins = [{"name": "prefill-cold_b1", "step": 0, "match": {"mode": "EXTEND", "bs": 1}},
            {"name": "prefill_b1", "step": None},
            {"name": "decode_b1", "step": 1, "match": {"mode": "DECODE", "bs": 1}},
            {"name": "decode_b32", "step": None}]
    j, info = timeline.attach_counters(kt, rows, wins, H200, keep_layers=1)
    by = {i["window"]: i for i in info}
    layers = int(kt["layer"].max()) + 1
    for name, step in (("prefill-cold_b1", 0), ("decode_b1", 1)):
        assert by[name]["matched"] >= by[name]["expected"] - 2                  # the cut step aligns (2 H200-only kernels)
        assert by[name]["by_shape"] == layers - 1                               # each later layer's first norm
        g = j[(j["step"] == step) & (j["segment"] == "layer")]
        lo, hi = by[name]["ncu_rows"]
        profiled = set(rows["kernel"].iloc[lo:hi + 1])
        # every layer kernel the cut layer also ran has counters (the H200's down_proj GEMM is another cuBLAS
        # kernel than the H100's: its name is not in the window)
        assert g[g["kernel"].isin(profiled)]["ncu_window"].notna().all()
        first = g[(g["layer"] > 0) & (g["pos"] == 0)]
        assert len(first) == layers - 1 and first["ncu_window"].notna().all()
        assert (first["kernel"] == "FusedAddRMSNormKernel").all()
    # by position alone (no kernel of the same name and grid to fall back on) those norms would go without
    plain = rows.copy()
    plain.loc[plain["kernel"].str.contains("FusedAddRMSNorm"), "grid"] = "(2, 2, 2)"
    _j, info2 = timeline.attach_counters(kt, plain, wins, H200, keep_layers=1)
    assert {i["window"]: i["by_shape"] for i in info2}["decode_b1"] == 0
