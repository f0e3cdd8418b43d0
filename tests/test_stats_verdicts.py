"""common.base.stats and common.judge.verdicts: one percentile function, intervals, verdicts judged on intervals."""
import json
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


# ------------------------------------------------------------------ margins keyed by GPU model (common/judge/noise.json)

def _margins_file(tmp_path, text):
    p = tmp_path / "noise.json"
    p.write_text(text)
    return p


GOOD_ROW = {"system": "sglang", "stem": "02_radix_cache_analysis", "hypothesis": "lpm-beats-fcfs-hit-rate", "a": 0.03,
            "b": 0.04, "spread": 0.01, "noise": 0.29, "runs": "NVIDIA H200 · a · 2026-11-25 vs NVIDIA H200 · b · 2026-11-25"}


@pytest.mark.parametrize("text, why", [
    ('{"version": 2 "models": {}}', "is damaged (Expecting ','"),                      # one deleted ':' / ','
    ("", "is damaged (Expecting value"),                                               # an empty file
    (json.dumps({"version": 2, "models": {"NVIDIA H200": {"rows": [{**GOOD_ROW, "spread": "0.01"}]}}}),
     "spread is '0.01', not a number"),                                                # a spread written as text
    (json.dumps({"version": 2, "models": {"NVIDIA H200": {"rows": [{k: v for k, v in GOOD_ROW.items() if k != "runs"}]}}}),
     "rows[0] lacks runs"),                                                            # a row missing a key
    (json.dumps([GOOD_ROW]), "the file is a JSON list, not an object"),                # a top-level list
    (json.dumps({"version": 2, "models": {"NVIDIA H200": {"rows": None}}}), "rows is NoneType, not a list"),
    (json.dumps({"about": "the version-1 layout", "rows": [GOOD_ROW]}), "not a version-2 margins file"),
], ids=["deleted-colon", "empty", "spread-as-text", "row-without-key", "top-level-list", "rows-null", "old-layout"])
def test_a_damaged_margins_file_is_one_line_naming_it(tmp_path, text, why):
    from common.base.checks import SetupError
    from common.judge import noise
    p = _margins_file(tmp_path, text)
    with pytest.raises(SetupError) as e:
        noise.load(p)
    assert str(e.value).startswith(f"the run-to-run margins file {p} is damaged (") and why in str(e.value)
    assert "\n" not in str(e.value) and "git checkout" in str(e.value)


def test_the_committed_margins_file_loads_with_both_models():
    from common.judge import noise
    m = noise.load()
    assert set(m) >= {"NVIDIA H100 80GB HBM3", "NVIDIA H200"} and sum(map(len, m.values())) >= 70


def test_margins_are_the_models_own_or_borrowed_and_said(tmp_path):
    """A run uses its own GPU model's margin; where its model did not measure a quantity, the largest other one
    stands in and the verdict names the model it came from; no model: no margin."""
    from common.judge import noise, verdicts
    h100 = {**GOOD_ROW, "spread": 0.02, "runs": "NVIDIA H100 80GB HBM3 · c · 2026-11-27 vs NVIDIA H100 80GB HBM3 · d"}
    p = noise.write([GOOD_ROW, h100, {**h100, "hypothesis": "other", "spread": 5.0}], tmp_path / "noise.json")
    key = ("sglang", "02_radix_cache_analysis", "lpm-beats-fcfs-hit-rate")
    own = noise.margin_for(*key, "NVIDIA H200", path=p)
    assert own["spread"] == 0.01 and own["borrowed"] is False and own["model"] == "NVIDIA H200"
    a100 = noise.margin_for(*key, "NVIDIA A100-SXM4-80GB", path=p)
    assert a100["spread"] == 0.02 and a100["borrowed"] is True and a100["model"] == "NVIDIA H100 80GB HBM3"
    lent = noise.margin_for("sglang", "02_radix_cache_analysis", "other", "NVIDIA H200", path=p)
    assert lent["borrowed"] is True and lent["spread"] == 5.0            # H200 never measured "other"
    assert noise.margin_for("flashinfer", "x", "y", "NVIDIA H200", path=p) is None
    h = verdicts.declare("""
    lead = lead: LPM leads FCFS on hit rate
        judged on: hit-rate lead
        confirmed: >= 0.02
        source: test
    """)["lead"]
    rec = verdicts.judge(h, [0.035, 0.036, 0.037], noise=a100)
    assert rec["verdict"] == "inconclusive" and rec["margin"] == {"spread": 0.02, "model": "NVIDIA H100 80GB HBM3",
                                                                   "borrowed": True}
    assert "not measured on this GPU model: the largest known, from NVIDIA H100 80GB HBM3" in rec["observed"]
    with pytest.raises(ValueError, match="2 GPU models"):
        noise.compare(*_two_model_trees(tmp_path))


def _two_model_trees(tmp_path):
    out = []
    for name, gpu in (("a", "NVIDIA H100 80GB HBM3"), ("b", "NVIDIA H200")):
        d = tmp_path / name / "sglang" / "results" / "02_radix_cache_analysis"
        d.mkdir(parents=True)
        d.joinpath("summary.json").write_text(json.dumps({"provenance": {"gpu": gpu}, "observations": [
            {"hypothesis": "h", "interval": {"point": 1.0}}]}))
        out.append(tmp_path / name)
    return out


def test_a_run_with_a_damaged_margins_file_stops_before_anything_runs(tmp_path, monkeypatch):
    from common.base.checks import SetupError
    from common.judge import noise
    from common.run.results import Run
    monkeypatch.setattr(noise, "NOISE_FILE", _margins_file(tmp_path, '{"version": 2, "models": {"X": {"rows": null}}}'))
    script = tmp_path / "demo" / "scripts" / "01_demo.py"
    script.parent.mkdir(parents=True)
    script.write_text("")
    with pytest.raises(SetupError, match="is damaged"):
        Run(script, {}, quiet=True)
    assert not (tmp_path / "demo" / "results").exists()              # nothing was started, no folder written
