"""common.base.stats and common.judge.verdicts: one percentile function, intervals, verdicts judged on intervals."""
import math

import pytest

from common.base import stats
from common.judge import verdicts
from common.judge.verdicts import Hypothesis

H = Hypothesis("decode-bw", "decode streams the KV near the DRAM ceiling", "decode TB/s as % of the DRAM ceiling",
               low=70, high=90, source="PLAN.md: ~80% of peak HBM", unit="%")


def test_percentiles_match_numpy_linear():
    np = pytest.importorskip("numpy")
    v = [3.0, 1.0, 7.5, 2.2, 9.1, 4.4, 0.5]
    p = stats.percentiles(v, qs=(10, 50, 90, 99))
    for q in (10, 50, 90, 99):
        assert p[f"p{q}"] == pytest.approx(float(np.percentile(v, q)))
    assert math.isnan(stats.percentiles([])["p50"]) and stats.percentiles([None, 2.0])["p50"] == 2.0


def test_intervals():
    assert stats.interval([1.0]).method == "single" and not stats.interval([1.0]).enough
    iv = stats.interval([1.02, 0.98, 1.01])
    assert (iv.point, iv.lo, iv.hi, iv.n, iv.method) == (1.01, 0.98, 1.02, 3, "range") and iv.enough
    big = stats.interval([100 + (i % 7) for i in range(100)])
    assert big.method == "bootstrap95" and big.lo <= big.point <= big.hi and big.hi - big.lo < 6
    assert stats.interval([100 + (i % 7) for i in range(100)]) == big               # seeded: reproducible
    r = stats.ratio_interval(stats.interval([2.0, 2.2, 2.1]), stats.interval([1.0, 1.1, 1.05]))
    assert r.lo == pytest.approx(2.0 / 1.1) and r.hi == pytest.approx(2.2 / 1.0)


@pytest.mark.parametrize("values,verdict", [
    ([80, 81, 79.5], "confirmed"),          # inside [70, 90]
    ([95, 96, 97], "refuted"),               # entirely above
    ([60, 61, 62], "refuted"),               # entirely below
    ([88, 91, 89], "inconclusive"),          # straddles 90
    ([80], "inconclusive"),                  # one sample is never judged
    ([80, 81], "inconclusive"),              # fewer than 3 repetitions
])
def test_verdict_rule(values, verdict):
    assert verdicts.judge(H, values)["verdict"] == verdict


def test_a_failed_premise_is_inconclusive_whatever_the_number():
    rec = verdicts.judge(H, [80, 81, 80], premise="the kernel split the KV in 1 chunk, the plan assumed 8")
    assert rec["verdict"] == "inconclusive" and "premise failed: the kernel split" in rec["observed"]


def test_the_record_names_threshold_source_and_interval():
    rec = verdicts.judge(H, [88, 91, 89])
    assert "[70, 90]%" in rec["expected"] and "PLAN.md" in rec["expected"]
    assert rec["interval"]["lo"] == 88 and rec["interval"]["hi"] == 91 and "straddles" in rec["observed"]
    one_sided = Hypothesis("x", "fast", "speed-up", low=1.05)
    assert verdicts.judge(one_sided, [1.2, 1.3, 1.25])["verdict"] == "confirmed"
    assert verdicts.judge(one_sided, [1.0, 1.02, 1.01])["verdict"] == "refuted"


def test_the_guard_fails_when_the_rule_is_broken(monkeypatch):
    """Proof that the straddle test can fail: judging on the point value alone would confirm [88, 91]."""
    broken = lambda h, iv, premise=True, margin=0.0: "confirmed" if h.low <= iv.point <= h.high else "refuted"  # noqa: E731
    monkeypatch.setattr(verdicts, "verdict_for", broken)
    assert verdicts.judge(H, [88, 91, 89])["verdict"] == "confirmed"          # what a point-only rule says
    monkeypatch.undo()
    assert verdicts.judge(H, [88, 91, 89])["verdict"] == "inconclusive"


def test_facts_are_judged_over_every_observation():
    h = Hypothesis("split", "the planner splits the KV at small batch", "split_kv of the traced calls", source="H-05")
    assert verdicts.judge_fact(h, True, "split")["verdict"] == "confirmed"
    assert verdicts.judge_fact(h, [True, False, True], "split")["verdict"] == "inconclusive"
    assert verdicts.judge_fact(h, [False, False], "no split")["verdict"] == "refuted"
    assert verdicts.judge_fact(h, None, "not traced")["verdict"] == "inconclusive"
    rec = verdicts.judge_fact(h, True, "split", premise="one launch seen, two expected")
    assert rec["verdict"] == "inconclusive" and "premise failed: one launch seen" in rec["observed"]


def test_over_is_the_full_range_of_the_items():
    iv = stats.over([0.61, 0.64, 0.62, float("nan"), None], "shapes")
    assert (iv.lo, iv.hi, iv.n) == (0.61, 0.64, 3) and "3 shapes" in iv.method
    assert stats.over([1.0] * 20 + [1.3]).hi == 1.3        # many items stay a range, never a bootstrap


def test_hypotheses_declared_as_text_read_back_as_the_report_writes_them():
    reps = 5
    H = verdicts.declare(f"""
        # the plan's figure and where it is from
        bw = decode-bw: decode is memory-bound at ~80% of peak HBM
                (batch 32, KV 4096)
            judged on: TB/s as % of the measured DRAM ceiling, {reps} repetitions
            confirmed: [70, 90]%
            source: PLAN.md session 3: '~80% of peak HBM'
        share = tp-share: the all-reduce share grows
            judged on: smallest rise between TP sizes
            confirmed: >= 0 pp
        ratio = ratio-small: one node costs at most half of the path
            judged on: t(one node) / t(path)
            confirmed: <= 0.5
        fact = some-fact: the store is one launch
            judged on: launches per call
    """)
    assert list(H) == ["bw", "share", "ratio", "fact"]
    bw = H["bw"]
    assert (bw.id, bw.low, bw.high, bw.unit) == ("decode-bw", 70, 90, "%")
    assert bw.claim == "decode is memory-bound at ~80% of peak HBM (batch 32, KV 4096)"
    assert bw.quantity.endswith("5 repetitions") and bw.source.startswith("PLAN.md session 3")
    assert (H["share"].low, H["share"].high, H["share"].range_text()) == (0, None, ">= 0 pp")
    assert (H["ratio"].low, H["ratio"].high) == (None, 0.5) and H["fact"].range_text() == "(no range)"
    for h in H.values():                      # what the report prints is what was declared
        if h.low is not None or h.high is not None:
            assert verdicts.parse_range(h.range_text()) == {"low": h.low, "high": h.high, "unit": h.unit}


@pytest.mark.parametrize("text, why", [
    ("bw decode-bw: no key", "key = id: claim"),
    ("bw = decode-bw: claim\n    confirmed: >= 1", "no 'judged on:'"),
    ("bw = a: c\n    judged on: q\nbw = b: c\n    judged on: q", "declared twice"),
    ("bw = a: c\n    judged on: q\n    confirmed: about 80%", "a range is"),
    ("bw = a: c\n    judged on: q\n    judged on: r", "given twice"),
])
def test_a_malformed_hypothesis_block_fails_at_import_naming_the_line(text, why):
    with pytest.raises(ValueError, match=why):
        verdicts.declare(text)


def test_run_to_run_noise_from_two_real_runs_and_the_margin_it_sets(fixture_path, tmp_path):
    """tests/fixtures/noise_h200/{a,b}: the observations of SGLang 02 and 08 from two pipeline runs on one H200
    (224595d --quick --ncu, a5d3c27 --quick; 2026-11-25). The LPM-over-FCFS hit-rate lead read 0.0349 and 0.0478:
    a spread of 0.0129, against a bound of 0.02."""
    from common.judge import noise, verdicts
    from common.base.stats import Interval
    rows = {r["hypothesis"]: r for r in noise.compare(fixture_path("noise_h200/a"), fixture_path("noise_h200/b"))}
    lpm = rows["lpm-beats-fcfs-hit-rate"]
    assert lpm["a"] == pytest.approx(0.0349, abs=1e-4) and lpm["spread"] == pytest.approx(0.0129, abs=1e-4)
    assert rows["pressure-usage"]["spread"] == 0                    # a quantity that did not move
    path = noise.write(list(rows.values()), tmp_path / "noise.json")
    assert noise.lookup("sglang", "02_radix_cache_analysis", "lpm-beats-fcfs-hit-rate", path)["spread"] == lpm["spread"]
    h = verdicts.declare("""
    lead = lead: LPM leads FCFS on hit rate
        judged on: hit-rate lead
        confirmed: >= 0.02
        source: test
    """)["lead"]
    iv = Interval(0.0349, 0.0239, 0.0349, 3, "range")               # that run's interval
    assert verdicts.verdict_for(h, iv) == "confirmed"
    assert verdicts.verdict_for(h, iv, margin=lpm["spread"]) == "confirmed"     # 0.0349 - 0.0129 = 0.022 >= 0.02
    rec = verdicts.judge(h, iv, noise={"spread": 0.016, "runs": "x vs y"})      # a noisier quantity: would flip
    assert rec["verdict"] == "inconclusive" and "within the run-to-run noise" in rec["observed"]
    far = verdicts.judge(h, Interval(0.01, 0.009, 0.011, 3, "range"), noise={"spread": 0.005, "runs": "x"})
    assert far["verdict"] == "refuted" and "holds with the run-to-run noise" in far["observed"]


def test_a_second_pair_of_runs_keeps_the_larger_spread(fixture_path, tmp_path):
    """Two measurements of one quantity's noise: the wider move stays (a quieter pair does not undo it), and a
    wider new move replaces a narrower one."""
    from common.judge import noise
    rows = {r["hypothesis"]: r for r in noise.compare(fixture_path("noise_h200/a"), fixture_path("noise_h200/b"))}
    lpm = rows["lpm-beats-fcfs-hit-rate"]
    path = noise.write([lpm], tmp_path / "noise.json")
    noise.write([{**lpm, "a": 0.03, "b": 0.031, "spread": 0.001, "noise": 0.03, "runs": "quiet pair"}], path)
    kept = noise.lookup("sglang", "02_radix_cache_analysis", "lpm-beats-fcfs-hit-rate", path)
    assert kept["spread"] == lpm["spread"] and kept["runs"] == lpm["runs"]
    noise.write([{**lpm, "spread": 0.05, "noise": 1.0, "runs": "loud pair"}], path)
    assert noise.lookup("sglang", "02_radix_cache_analysis", "lpm-beats-fcfs-hit-rate", path)["runs"] == "loud pair"
