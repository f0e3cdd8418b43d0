"""SGLang 01's pressure load (sglang/scripts/_sgl01_pressure.py): a load that fills the KV pool, its scheduler lines,
GPU memory by owner, the events, the figure, the Perfetto trace and 01's --reanalyse of it.

Real data: the pressure run that 08 (which held this load before 01) recorded on one H200 (2026-11-23, commit 023318a;
tests/fixtures/sglang_08_recording_h200/raw.json): 200 prompts of 512 in / 128 out at 50 req/s after a 10,000-token
prompt, pool 32768 tokens; its 624 scheduler lines, NVML memory (every 10th sample) and bench_serving headline. The
start-up memory lines of the H100 warm start (tests/fixtures/sglang_server_start_warm_h100.log) stand for the owners:
two GPUs in one record, which tests the analysis, not the numbers."""
import collections
import csv
import json
import math
import sys
from pathlib import Path

import pytest

import kit  # tests/kit.py
from test_reanalyse import REC

ROOT = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(ROOT / "sglang" / "scripts"))
import _sgl01_pressure as pl  # noqa: E402
import _sglang as sg  # noqa: E402


def _h200_pressure() -> dict:
    """The H200 pressure run as 01's record (pressure_run's pr): steps, memory, start-up owners, the run's row."""
    raw = json.loads((FIX / "sglang_08_recording_h200" / "raw.json").read_text())
    P = raw["P"]
    pr = {"steps": raw["pressure"], "mem": [tuple(m) for m in raw["mem"]],
          "own": sg.startup_memory(sg.memory_lines((FIX / "sglang_server_start_warm_h100.log").read_text())),
          "run": {"requests": P["load_n"], "input_len": P["load_in"], "output_len": P["load_out"], "rate": P["load_rate"],
                  "pool_tokens": P["pool"], "chunk": pl.CHUNK, "long_prompt": P["long_prompt"],
                  "offered_tokens": P["load_n"] * (P["load_in"] + P["load_out"]), **raw["bench"]}}
    pr["run"].update(pl.summary(pr))
    return pr


class Tables:
    """Where record_pressure / write_pressure write: CSVs in a folder (as results.Run.table does) and files by name."""

    def __init__(self, d: Path):
        self.dir = d

    def table(self, name, rows):
        import pandas as pd
        pd.DataFrame(list(rows)).to_csv(self.dir / f"{name}.csv", index=False)

    def path(self, name):
        return self.dir / name

    def log(self, *_a):
        pass


def test_the_pressure_figure_keeps_every_marker_and_states_clips():
    pytest.importorskip("matplotlib")
    fig = pl.pressure_figure(_h200_pressure())
    a1, a2, _a3 = fig.axes[:3]
    # the long prompt's chunk ran 15.5 s before the load (the benchmark client's start-up): kept, the gap cut out
    assert a1.get_legend().get_title().get_text() == "red: 4 retraction(s), purple: 1 chunked-prefill line(s)"
    assert len([ln for ln in a1.get_lines() if ln.get_linestyle() == ":"]) == 1
    assert any("15.5 s idle gap shown as 1 s" in t.get_text() for t in a1.texts)
    assert a2.get_title().startswith("2 step(s) clipped at 1000 ms (largest 15,512 ms")


def test_chunk_lines():
    assert pl.is_chunk({"kind": "prefill", "new_seq": 1, "new_token": 8192})
    assert not pl.is_chunk({"kind": "prefill", "new_seq": 16, "new_token": 8192})        # a full batch, not a chunk
    assert not pl.is_chunk({"kind": "prefill", "new_seq": 1, "new_token": 8192}, chunk=16384)   # the server's own size


def test_events_memory_by_owner_and_the_perfetto_tracks(tmp_path):
    pr = _h200_pressure()
    cls = pl.step_classes([{"class": "gemm", "prefill_pct": 82.0, "decode_pct": 86.0},
                           {"class": "attention", "prefill_pct": 6.0, "decode_pct": 8.0},
                           {"class": "norm", "prefill_pct": 3.0, "decode_pct": 3.5}, {"class": "rope", "prefill_pct": 1.0,
                                                                                     "decode_pct": 1.0}])
    assert cls == {"prefill": "gemm 82%, attention 6%, norm 3%", "decode": "gemm 86%, attention 8%, norm 4%"}
    evs = pl.pressure_events(pr, cls)
    kinds = collections.Counter(e["kind"] for e in evs)
    assert kinds["retraction"] == 4 and kinds["chunked prefill"] == 1 and kinds["queue starts"] >= 1
    assert {"pool full", "queue drains"} <= set(kinds)
    assert "queue drains at step 491 (21.94 s): every waiting request was admitted" in [e["text"] for e in evs][-1]
    assert "its kernels: gemm 86%, attention 8%, norm 4%" in next(e["text"] for e in evs if e["kind"] == "pool full")
    # each event at its step of the load, with what the GPU did there: the chunk is step 1, the pool fills at step
    # 100, the first retraction is told with the decode step after it (SGLang's clock: running / gen throughput)
    first = {}
    for e in evs:
        first.setdefault(e["kind"], e)
    assert (first["chunked prefill"]["step"], first["pool full"]["step"], first["retraction"]["step"]) == (1, 100, 164)
    assert "the GPU: a decode step of 54 requests over 32214 KV tokens, 6.55 ms by SGLang's clock" in \
        first["retraction"]["text"]
    assert "by SGLang's clock" not in first["queue starts"]["text"]      # the first line after a prefill spans it
    pl.write_pressure(Tables(tmp_path), pr, evs)
    mem = list(csv.DictReader((tmp_path / "gpu_memory_owners.csv").open()))
    assert list(mem[0])[:3] == ["t", "t_s", "used_gb"] and float(mem[0]["weights_gb"]) == 15.02
    assert abs(float(mem[0]["rest_gb"]) - (26.06 - 15.02 - 4.0 - 1.13 - 2.16)) < 0.01
    ev = json.loads((tmp_path / "story_pressure.json").read_text())["traceEvents"]
    assert {"running", "queued", "token usage", "KV pool (GB)", "rest (GB)"} <= {e["name"] for e in ev if e["ph"] == "C"}
    assert sum(e["ph"] == "i" and e["name"] == "chunked prefill" for e in ev) == 1
    assert sum(e["ph"] == "i" and e["name"] == "retraction" for e in ev) == 4
    kit.check_perfetto(ev)


def test_the_perfetto_trace_processor_opens_the_pressure_trace(tmp_path):
    from test_sglang_story import _trace_processor
    tp, binp = _trace_processor()
    pr = _h200_pressure()
    pl.write_pressure(Tables(tmp_path), pr, pl.pressure_events(pr))
    with tp.TraceProcessor(trace=str(tmp_path / "story_pressure.json"), config=tp.TraceProcessorConfig(bin_path=binp)) as t:
        tracks = set(t.query("select name from counter_track").as_pandas_dataframe()["name"])
        assert {"KV pool (GB)", "rest (GB)", "running"} <= tracks


def test_the_record_round_trips_through_its_tables(tmp_path):
    """record_pressure writes what read_pressure gives back: the same steps, memory, owners and run row."""
    pd = pytest.importorskip("pandas")
    pr = _h200_pressure()
    pl.record_pressure(Tables(tmp_path), pr)
    sys.path.insert(0, str(ROOT / "sglang" / "scripts"))
    m01 = kit.load_script(ROOT / "sglang" / "scripts" / "01_baseline_perf.py", "pressure01")
    back = pl.read_pressure({t: pd.read_csv(tmp_path / f"{t}.csv") for t in pl.PRESSURE_TABLES}, m01._records)
    assert back["steps"] == [{k: v for k, v in r.items() if v is not None} for r in pr["steps"]]   # None: no cell
    assert back["own"] == pr["own"]
    assert [x for m in back["mem"] for x in m] == pytest.approx([x for m in pr["mem"] for x in m])
    assert {k: back["run"][k] for k in pr["run"] if pr["run"][k] is not None} == \
        {k: v for k, v in pr["run"].items() if v is not None}
    assert pl.read_pressure({"pressure_run": None, "pressure_steps": None}, m01._records) is None   # an older 01


def test_floors_of_the_loads_steps_and_the_plateau():
    """The floor of a step from its scheduler line alone (the load is not traced): a decode line's batch and KV over
    the DRAM read ceiling, a prefill line's FLOPs over the bf16 ceiling; the decode steps on a full pool at their most
    common batch (52 on the H200 run: 31,407 KV tokens, 6.57 ms by SGLang's clock) against theirs; the findings name
    the step where the pool filled and the first retraction."""
    from common.capture import models
    cfg, pk = models.config("llama-3.1-8b"), json.loads((FIX / "sglang_08_recording_h200" / "raw.json").read_text())["pk"]
    pr = _h200_pressure()
    dec = {"kind": "decode", "running_req": 52, "num_token": 31407}
    w = models.param_count(cfg) * 2 - cfg["vocab_size"] * cfg["hidden_size"] * 2 + 31407 * models.kv_bytes_per_token(cfg)
    assert w / (pk["dram_tb_s"] * 1e9) < pl.line_floor_ms(dec, cfg, pk) < 1.05 * w / (pk["dram_tb_s"] * 1e9)
    chunk = pl.line_floor_ms({"kind": "prefill", "new_seq": 1, "new_token": 8192, "cached_token": 0}, cfg, pk)
    assert chunk > 2 * 7.5e9 * 8192 / (pk["bf16_tflops"] * 1e9)          # 2 FLOPs per weight per token, and attention
    assert pl.line_floor_ms({"kind": "retract"}, cfg, pk) is None and pl.line_floor_ms(dec, None, pk) is None
    p = pl.at_plateau(pr, cfg, pk)
    assert (p["batch"], p["kv_tokens"], p["steps"]) == (52, 31407, 79) and p["step_ms"] == pytest.approx(6.57, abs=0.01)
    assert pl.retractions(pr) == 4
    evs = pl.pressure_events(pr, floor=lambda r: pl.line_floor_ms(r, cfg, pk))
    found = pl.pressure_findings(pr, evs, p)
    assert found[0].startswith("The long prompt is prefilled in chunks: its first chunk is step 1 of the load, a "
                               "prefill step of 8192 new tokens (1 sequence), floor")
    assert found[1].startswith("Requests start to queue at step 83")
    assert found[2].startswith("The pool fills at step 100 (17.8 s), during a decode step of 54 requests over 29353 KV "
                               "tokens, 6.65 ms by SGLang's clock") and "the first retraction follows at step 164, 64 " \
        "steps later" in found[2] and found[2].endswith("4 request(s) are retracted in all.")
    assert found[3].startswith("On a full pool the decode step of 52 requests over 31,407 KV tokens takes 6.57 ms")
    cold = {**pr, "steps": [{**r, "token_usage": min(r.get("token_usage") or 0, 0.5)} for r in pr["steps"]
                            if r["kind"] != "retract"]}
    assert pl.at_plateau(cold, cfg, pk) is None
    assert pl.pressure_findings(cold, pl.pressure_events(cold), None)[-1].startswith("The pool never filled")


def test_01_reanalyses_its_pressure_load(tmp_path):
    """01's --reanalyse of a recording with the pressure tables (the H200 run above, written by record_pressure beside
    the real 01 recording and the made-up traced-request tables of test_reanalyse_sglang): retract-at-plateau is
    judged on this load (the pool filled: its fullest steps at 0.99-1.0; 4 requests retracted: confirmed; the rate
    loads before it, which never filled the pool, no longer judge it), the story tells the load, the figure, the
    events and the Perfetto trace are written; every other verdict is the recording's."""
    pytest.importorskip("matplotlib")
    from test_reanalyse_sglang import DROPPED_01, MADE_UP_01, recording_01
    mod, rec = recording_01(tmp_path)
    pl.record_pressure(Tables(rec), _h200_pressure())
    out = tmp_path / "o"
    assert mod.main(["--reanalyse", str(rec), "--out", str(out)]) == 0
    before, after = (json.loads((d / "summary.json").read_text()) for d in (REC / "sglang" / "01_baseline_perf", out))
    v = [{o["hypothesis"]: o["verdict"] for o in x["observations"]} for x in (before, after)]
    assert set(v[1]) == set(v[0]) - set(DROPPED_01)
    assert {h: v[1][h] for h in set(v[1]) - set(MADE_UP_01) - {"retract-at-plateau"}} == \
        {h: v[0][h] for h in set(v[1]) - set(MADE_UP_01) - {"retract-at-plateau"}}
    ret = next(o for o in after["observations"] if o["hypothesis"] == "retract-at-plateau")
    assert v[0]["retract-at-plateau"] == "inconclusive" and ret["verdict"] == "confirmed"     # the rate loads: 0.40
    assert "token usage 0.99-1.00" in ret["observed"] and "4 request(s) retracted in 4 retract line(s)" in ret["observed"]
    assert any(f.startswith("The pool fills at step 100") for f in after["findings"])
    story = (out / "story.txt").read_text()
    assert "pressure: 200 x (512 in, 128 out) at 50 req/s after a 10,000-token prompt, pool 32,768 tokens" in story
    assert "max running 66, max queued 74, max token usage 1.00, retractions 4 in 4 line(s), chunked prefill" in story
    assert "retraction at step 164 (18.17 s): 1 request(s) retracted, 594 tokens freed" in story
    assert "more events in pressure_events.csv" in story and "on a full pool (usage >= 0.9) the decode step" in story
    for f in ("pressure.png", "gpu_memory_owners.csv", "pressure_events.csv", "story_pressure.json", "pressure_steps.csv"):
        assert (out / f).is_file(), f
    # the recording travels: the new run can be re-analysed in its turn, to the same verdicts
    again = tmp_path / "again"
    assert mod.main(["--reanalyse", str(out), "--out", str(again)]) == 0
    assert [o["verdict"] for o in json.loads((again / "summary.json").read_text())["observations"]] == \
        [o["verdict"] for o in after["observations"]]


# ------------------------------------------------------------------ the --quick load fills the pool, on any GPU

def admit_and_decode(n, prompt, out, pool, chunk=8192, page=1, ratio=0.7, decay_steps=600, retract_steps=20):
    """A model of SGLang 0.5.17's scheduler for ``n`` requests sent at once (managers/schedule_policy.py PrefillAdder,
    schedule_batch.py retract_decode, new_token_ratio_tracker.py): a prefill step admits whole prompts, oldest first,
    while prompt + max_new + page < the free tokens minus ratio x the running requests' remaining output (and at most
    ``chunk`` new tokens a step); prefill goes first; a decode step needs one free token per running request, else the
    request with the least output is retracted (back to the queue, its tokens freed) until it fits, and the ratio
    becomes (decoded + retract_steps x running) / their max_new; otherwise it decays to 0.14 x its start over
    decay_steps steps. Time does not enter it: what it returns holds on any GPU. Returns the requests still queued at
    the first decode step (admission has stopped: they wait for KV space), the most requests running, the decode step
    of the first retraction (None: none) and of the first request's last token."""
    lo, step = 0.14 * ratio, (ratio - 0.14 * ratio) / decay_steps
    queue = collections.deque({"in": prompt, "g": 0} for _ in range(n))
    running, queued, most, first_retract, first_done, k = [], None, 0, None, None, 0
    while queue or running:
        free = pool - sum(r["in"] + r["g"] for r in running)
        reserved = sum(ratio * (out - r["g"]) for r in running)
        budget, admitted = chunk, []
        while queue and queue[0]["in"] <= budget and queue[0]["in"] + (out - queue[0]["g"]) + page < \
                free - reserved - sum(a["in"] + out - a["g"] for a in admitted):
            budget -= queue[0]["in"]
            admitted.append(queue.popleft())
        if admitted:
            running += admitted
            most = max(most, len(running))
            continue
        k += 1
        queued = len(queue) if queued is None else queued
        if free < len(running):                               # the pool is full: retract
            first_retract = first_retract or k
            running.sort(key=lambda r: (r["g"], -r["in"]), reverse=True)
            while len(running) > 1 and pool - sum(r["in"] + r["g"] for r in running) < len(running):
                r = running.pop()
                queue.appendleft({"in": r["in"] + r["g"], "g": 0})
            ratio = min(1.0, (sum(r["g"] for r in running) + retract_steps * len(running)) / (out * len(running) + 1))
        else:
            ratio = max(ratio - step, lo)
        for r in running:
            r["g"] += 1
        if any(r["g"] >= out for r in running):
            first_done = first_done or k
            running = [r for r in running if r["g"] < out]
    return {"queued": queued, "most_running": most, "first_retract": first_retract, "first_done": first_done}


def test_the_quick_pressure_load_must_fill_the_pool():
    """The --quick load on the pipeline's pool (sg.QUICK_POOL_TOKENS) and SGLang's chunk of 8192, in the model above:
    requests still queue once admission stops (they wait for KV space), the running batch stays near the plateau 08 traces (_sgl01_pressure.plateau), the pool
    runs out (a retraction) before the first wave's last token, with >= 20% of its output left as margin, and the long
    prompt needs more than one chunk. 01's rate loads before it (32 prompts of 512 / 64) fill none of it."""
    m01 = kit.load_script(ROOT / "sglang" / "scripts" / "01_baseline_perf.py", "pressure01q")
    P, pool = m01.QUICK, sg.QUICK_POOL_TOKENS
    n = pl.burst_size(pool, P)
    assert n == 114 and n * (P["pressure_in"] + P["pressure_out"]) >= 2 * pool            # the docstring's arithmetic
    got = admit_and_decode(n, P["pressure_in"], P["pressure_out"], pool)
    assert got["queued"] > 0 and abs(got["most_running"] - pl.plateau(pool, P["pressure_in"], P["pressure_out"])) <= 2, got
    assert got["first_retract"] is not None and got["first_retract"] <= 0.8 * P["pressure_out"] < got["first_done"], got
    assert P["long_prompt"] > pl.CHUNK
    old = admit_and_decode(P["load_n"], P["load_in"], P["load_out"], pool)               # 01's rate loads, even at once
    assert old["queued"] == 0 and old["first_retract"] is None
    assert math.ceil(2 * pool / (P["load_in"] + P["load_out"])) > P["load_n"]
