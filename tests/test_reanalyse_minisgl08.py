"""`--reanalyse DIR` of mini-SGLang's 08_forward_timeline.py, proven on its real H200 recording.

tests/fixtures/recordings_h200/mini-sglang/08_forward_timeline/ holds the summary.json and the joined tables the
report reads (not the traces), copied from `08_forward_timeline.py --quick --ncu` in the H200 pipeline run of commit
a5d3c27 (2026-11-25): kernels_graph.csv gzipped whole, kernels_eager.csv cut to its layer-1 rows (gzipped; the
counters verdict reads layer 1 only; tests/fixtures/README.md). check_reanalysis (tests/test_reanalyse.py) re-analyses
it on this CPU and asserts the recording's verdict for every hypothesis, its provenance and a story."""
import json

import pytest

from test_reanalyse import REC, check_reanalysis


def test_minisgl08_reanalysis_gives_the_recordings_verdicts(tmp_path):
    # the TTFT waterfall's add-up is no longer judged: its parts are consecutive stamps, it adds up by construction
    ttft = "the ttft waterfall of the offline engine adds up"
    out = check_reanalysis("mini-sglang", "08_forward_timeline", tmp_path, dropped=(ttft,))
    before, after = (json.loads((d / "summary.json").read_text()) for d in (REC / "mini-sglang/08_forward_timeline", out))
    # the same detail on every other verdict (the layer checks, the timed steps, the counters, the decode add-up)
    assert [(o.get("hypothesis") or o["expected"], o.get("detail")) for o in after["observations"]] == \
        [(o.get("hypothesis") or o["expected"], o.get("detail")) for o in before["observations"]
         if not (o.get("hypothesis") or o["expected"]).startswith(ttft)]
    assert "(not judged: " in (out / "story.txt").read_text()
    for k, v in before["headline"].items():           # observer_pct_*: the recording's own (it predates traced_steps.csv)
        assert after["headline"][k] == pytest.approx(v), k
    assert "TTFT waterfall" in (out / "story.txt").read_text()


def test_minisgl08_reads_the_traced_steps_a_gpu_run_now_writes(tmp_path):
    """With traced_steps.csv (as analyse() now writes it) the profiler's cost is computed from it, not copied."""
    import pandas as pd

    from test_reanalyse import copy_recording
    mod, src = copy_recording("mini-sglang", "08_forward_timeline", tmp_path, "re_msgl08_traced")
    steps = pd.read_csv(src / "steps.csv")
    # each variant's traced decode steps at twice its timed median GPU time: observer_pct = +100 %
    rows = []
    for v, g in steps[steps["phase"] == "decode"].groupby("variant"):
        med = g.groupby("rep")["gpu_ms"].median().median()
        rows += [{"variant": v, "step": i, "phase": "decode", "gpu_ms": 2 * med} for i in range(1, 5)]
    pd.DataFrame(rows).to_csv(src / "traced_steps.csv", index=False)
    assert mod.main(["--reanalyse", str(src), "--out", str(tmp_path / "out")]) == 0
    head = json.loads((tmp_path / "out/summary.json").read_text())["headline"]
    assert head["observer_pct_graph"] == pytest.approx(100, abs=1)


def test_minisgl08_states_the_floor_of_its_steps(tmp_path):
    """The shown variant's prefill and decode step get a floor (common.tables.timeline.floor_row, the one SGLang 08
    uses): floors.csv and one finding per step built from its row. On this H200 recording: the decode step at batch 1
    must read Llama-3.1-8B's weights without the embedding (~15 GB) and is read-bound; the prefill is compute-bound;
    every floor sits below its traced period (a floor above it would mean a wrong ceiling or a wrong formula)."""
    import csv

    from common.tables import timeline
    from test_reanalyse import copy_recording
    mod, src = copy_recording("mini-sglang", "08_forward_timeline", tmp_path, "re_msgl08_floors")
    assert mod.main(["--reanalyse", str(src), "--out", str(tmp_path / "out")]) == 0
    rows = list(csv.DictReader((tmp_path / "out/floors.csv").open()))
    assert [(r["step_kind"], r["bound"]) for r in rows] == [("prefill", "compute"), ("decode", "read")]
    dec = rows[1]
    assert 14.0 < float(dec["gbytes"]) < 16.5 and dec["bs"] == "1"
    for r in rows:
        assert 0 < float(r["floor_ms"]) < float(r["period_ms"])
    found = json.loads((tmp_path / "out/summary.json").read_text())["findings"]
    typed = lambda k, v: v if k in ("step_kind", "bound", "mode") else int(v) if k in ("step", "bs", "kernels") \
        else float(v)                                                                    # noqa: E731 - CSV text back
    want = [timeline.floor_sentence({k: typed(k, v) for k, v in r.items()}) for r in rows]
    assert [s for s in found if "against a floor of" in s] == want
