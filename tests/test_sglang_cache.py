"""SGLang 02's cache over time (sglang/scripts/02_radix_cache_analysis.py round_robin, part of its eviction
experiment): a round-robin over more prefixes than the pool holds, per request meta_info vs the scheduler log,
judged by lru-thrash; its re-analysis.

Real data: the cache phase that 08 (which held this round-robin before 02) recorded on one H200 (2026-11-23, commit
023318a; tests/fixtures/sglang_08_recording_h200/raw.json "cache"): 8 prefixes of 4096 token IDs (+ 32 new tokens
each) in a pool of 32768 tokens, two passes in the same order, then the last prefix again: 17 requests, each with
meta_info's cached tokens, the scheduler log's, and its outcome."""
import json
import sys
from pathlib import Path

import pytest

from test_reanalyse import REC, load

ROOT = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(ROOT / "sglang" / "scripts"))
import _sglang as sg  # noqa: E402

H200_POOL, H200_PREFIX, H200_GROUPS = 32768, 4096, 8


def _h200_cache() -> list[dict]:
    return json.loads((FIX / "sglang_08_recording_h200" / "raw.json").read_text())["cache"]


class ReplayServer:
    """A stand-in for _sglang.Server that answers each /generate with the cached tokens the H200 run's request of
    the same position got, and writes the scheduler's prefill line for it (SGLang's format, its cached tokens the
    log's of that request): what 02's round_robin reads of a server."""
    LINE = ("[2026-11-23 10:50:17.298] Prefill batch, #new-seq: 1, #new-token: {new}, #cached-token: {cached}, token "
            "usage: 0.10, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: True, input throughput "
            "(token/s): 1000.00\n")

    def __init__(self, recorded):
        self.recorded, self.log, self.n = recorded, "", 0
        self.metrics_text = (FIX / "sglang_server_metrics_llama8b_dummy_h200.txt").read_text()

    def flush_cache(self):
        pass

    def metrics(self):
        return sg.parse_metrics(self.metrics_text)

    def log_mark(self):
        return len(self.log)

    def log_since(self, mark=0):
        return self.log[mark:]

    def generate(self, input_ids, sampling_params):
        r = self.recorded[self.n]
        self.n += 1
        self.log += self.LINE.format(new=len(input_ids) - r["log_cached"], cached=r["log_cached"])
        return {"meta_info": {"prompt_tokens": len(input_ids), "cached_tokens": r["api_cached"], "e2e_latency": 0.02},
                "client": {"e2e_s": 0.02}}


class Log:
    def log(self, *_a):
        pass


def test_the_round_robin_reads_each_request_as_08_did():
    """02's round_robin on a server that answers as the H200 did: the same 17 requests in the same order (two passes
    over 8 groups, then the last), each with the outcome, hit fraction and log/meta_info agreement 08 recorded; one
    row of eviction.csv (order cyclic: no second-pass hit) and a case of hit_rate_3ways.csv."""
    m = load("sglang", "02_radix_cache_analysis", "cache02")
    rec = _h200_cache()
    P = {**m.QUICK, "group_len": H200_PREFIX}
    out = {"ev": [], "evg": [], "rr": [], "agree": []}
    m.round_robin(ReplayServer(rec), H200_POOL, H200_GROUPS, P, 0, Log(), out)
    keys = ("request", "pass", "group", "api_cached", "log_cached", "agree", "hit_fraction", "prefix_inserted_before",
            "outcome")
    assert [{k: r[k] for k in keys} for r in out["rr"]] == [{k: r[k] for k in keys} for r in rec]
    assert [r["outcome"] for r in out["rr"]] == ["miss"] * 8 + ["evicted"] * 8 + ["hit"]    # 8 prefixes, room for ~7
    assert all(r["prompt"] == H200_PREFIX + m.SUFFIX for r in out["rr"])
    ev = out["ev"]
    assert len(ev) == 1 and ev[0]["order"] == "cyclic" and ev[0]["pass2_hit_rate"] == 0 and ev[0]["groups_kept"] == 0
    assert len(out["evg"]) == 8 and not any(g["kept"] for g in out["evg"])
    a = out["agree"][0]
    assert a["case"] == "round-robin 8 x 4096, pool 32768" and a["meta_info"] == pytest.approx(a["log"])


def test_02_judges_lru_thrash_on_the_round_robin(tmp_path):
    """02's --reanalyse of its real H200 recording with the H200 round-robin beside it (round_robin.csv as
    round_robin writes it): lru-thrash is judged on the 8 second-pass requests (no hit: confirmed), the story tells
    each request and the log/meta_info agreement, round_robin.png is drawn; every other verdict is the recording's
    (a recording without round_robin.csv judges no lru-thrash: test_reanalyse_sglang)."""
    pd = pytest.importorskip("pandas")
    pytest.importorskip("matplotlib")
    m = load("sglang", "02_radix_cache_analysis", "cache02r")
    src = REC / "sglang" / "02_radix_cache_analysis"
    rec = tmp_path / "rec"
    rec.mkdir()
    for f in src.iterdir():
        (rec / f.name).write_bytes(f.read_bytes())
    out = {"ev": [], "evg": [], "rr": [], "agree": []}
    m.round_robin(ReplayServer(_h200_cache()), H200_POOL, H200_GROUPS, {**m.QUICK, "group_len": H200_PREFIX}, 0, Log(),
                  out)
    pd.DataFrame(out["rr"]).to_csv(rec / "round_robin.csv", index=False)
    o = tmp_path / "o"
    from unittest import mock
    with mock.patch("common.judge.noise.margin_for", return_value=None):    # judged as the recording was judged
        assert m.main(["--reanalyse", str(rec), "--out", str(o)]) == 0
    before, after = (json.loads((d / "summary.json").read_text()) for d in (src, o))
    v = [{x["hypothesis"]: x["verdict"] for x in s["observations"]} for s in (before, after)]
    assert {h: v[1][h] for h in v[0]} == v[0] and set(v[1]) == set(v[0]) | {"lru-thrash"}
    thrash = next(x for x in after["observations"] if x["hypothesis"] == "lru-thrash")
    assert thrash["verdict"] == "confirmed" and thrash["interval"]["n"] == 8 and thrash["interval"]["hi"] == 0
    assert "0 of 8 second-pass requests hit" in thrash["observed"]
    story = " ".join((o / "story.txt").read_text().replace("│", " ").split())       # the tree's wrapped lines, joined
    assert "the cache over time: round-robin" in story and "0m 1m 2m 3m 4m 5m 6m 7m 0e 1e" in story
    assert "8 groups (1.01x)" in story and "7h; log = meta_info on 17/17 requests" in story
    assert (o / "round_robin.png").stat().st_size > 10_000 and (o / "round_robin.csv").is_file()


def test_the_hit_rate_figure_and_verdicts_keep_to_the_reverse_order(monkeypatch):
    """eviction.csv holds both pass-2 orders now: the hit-rate figure and the eviction verdicts read the reverse-order
    sweeps only (the round-robin's own verdict is lru-thrash), so a cyclic sweep at the same working set (no hit)
    does not pull their values down. The rows: the H200 recording's eviction.csv, plus a cyclic copy of each sweep
    over the pool with pass-2 hit rate 0 (what the round-robin above reads)."""
    pd = pytest.importorskip("pandas")
    m = load("sglang", "02_radix_cache_analysis", "cache02f")
    from common.render import plots
    ev = pd.read_csv(REC / "sglang" / "02_radix_cache_analysis" / "eviction.csv")
    cyc = ev[ev["ws_over_pool"] >= m.CYCLIC_MIN].assign(order="cyclic", pass2_hit_rate=0.0, groups_kept=0)
    both = pd.concat([ev.assign(order="reverse"), cyc])
    seen = []
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    monkeypatch.setattr(plots, "sweep", lambda med, *a, **k: seen.append(med) or plt.subplots()[0])

    class Run:
        def figure(self, *_a):
            pass
    m.figure(Run(), ev)
    m.figure(Run(), both)
    assert seen[1].equals(seen[0]) and len(cyc)              # the cyclic sweeps left out of the figure
    from test_sglang_scripts import Recorder
    a, b = Recorder(), Recorder()
    m.judge_eviction(a, ev)
    m.judge_eviction(b, both)
    assert [(o["verdict"], o["observed"]) for o in b.obs] == [(o["verdict"], o["observed"]) for o in a.obs]
