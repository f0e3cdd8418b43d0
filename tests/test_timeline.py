"""common.tables.timeline: the joined story on real SGLang captures (one H200, 2026-11-23, CUDA graphs on).

Fixtures (made by a probe run of SGLang 0.5.17, Llama-3.1-8B shapes, dummy weights, flashinfer backend,
default serving configuration: prefill and decode CUDA graphs on):
  sglang_story_trace_graphs_llama8b_h200_cut.json.gz  /start_profile torch trace of one 512-token request,
      cut to its prefill run_batch and the next decode run_batch (runtime, annotation and GPU events only)
  sglang_story_ncu_graph_nodes_2layers_h200.csv.gz    the same server cut to 2 layers under
      `ncu --graph-profiling node --profile-from-start off` (summary metrics), three one-step windows
      opened with /start_profile CUDA_PROFILER: prefill of 512 tokens, a decode step at batch 1, at batch 32
"""
import gzip
import json
import re

import pytest

from common.capture import models, ncu  # noqa: E402
from common.tables import kernels, timeline, trace  # noqa: E402
from common.judge import bounds  # noqa: E402

TRACE = "sglang_story_trace_graphs_llama8b_h200_cut.json.gz"
NCU = "sglang_story_ncu_graph_nodes_2layers_h200.csv.gz"
STEP = re.compile(r"^step\[(?P<mode>[A-Z_]+) bs=(?P<bs>\d+)(?: toks=(?P<toks>\d+))?\]$")


def parse(name):
    m = STEP.match(name)
    return {"mode": m["mode"], "bs": int(m["bs"]), "toks": int(m["toks"]) if m["toks"] else int(m["bs"])}


@pytest.fixture(scope="module")
def kt(request):
    from pathlib import Path
    fx = Path(__file__).parent / "fixtures"
    ev = trace.read_chrome_trace(fx / TRACE)
    return timeline.layered(trace.step_kernels(ev, r"^step\[", outer=r"^scheduler\.run_batch$", parse=parse), layers=32)


@pytest.fixture(scope="module")
def ncu_rows():
    from pathlib import Path
    text = gzip.open(Path(__file__).parent / "fixtures" / NCU, "rt").read()
    return kernels.summarize(ncu.read_raw(text), peaks=H200)


H200 = {"dram_tb_s": 4.71, "bf16_tflops": 811.0, "l2_mb": 60.0}   # the ceilings of the H200 these ran on (one DRAM
                                                                 # figure: that run measured no read/write/copy apart)


def test_steps_layers_and_roles(kt):
    assert kt["step"].nunique() == 2 and list(kt.groupby("step")["mode"].first()) == ["EXTEND", "DECODE"]
    for s in (0, 1):
        g = kt[kt["step"] == s]
        assert g["layer"].max() == 31                                   # all 32 layers found, graphs included
        roles = set(g["role"])
        assert {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "attention", "rope", "kv_store",
                "input_norm", "post_norm", "act", "lm_head", "sampling"} <= roles
        assert (g[g["role"] == "lm_head"]["cls"] == "gemm").all() and (g["role"] == "lm_head").sum() == 1
    dec = kt[kt["step"] == 1]
    # decode splits the O and down projections (split-K): the reduce kernels carry the same role
    assert set(dec[dec["kernel"] == "splitKreduce_kernel"]["role"]) == {"o_proj", "down_proj"}
    # the sampling kernels sit in scheduler.run_batch, after the step range: the outer range keeps them
    assert "reduce_kernel" in set(dec[dec["role"] == "sampling"]["kernel"])


def test_work_rates_on_the_real_step(kt):
    cfg = models.config("llama-3.1-8b")
    w = timeline.add_work(kt, cfg, {0: {"tokens": 512, "qo_lens": [512], "kv_lens": [512]},
                                    1: {"tokens": 1, "kv_lens": [513]}}, {"dram_tb_s": 4.8, "bf16_tflops": 989,
                                                                          "l2_mb": 60.0})
    gate = w[(w["step"] == 0) & (w["role"] == "gate_up_proj") & (w["layer"] == 3)].iloc[0]
    assert gate["flops"] == 2 * 512 * 28672 * 4096 and 500 < gate["tflop_s"] < 989     # below the datasheet
    head = w[(w["step"] == 1) & (w["role"] == "lm_head")].iloc[0]
    assert head["bytes"] > 128256 * 4096 * 2 and 3 < head["eff_tb_s"] < 4.8             # reads the vocab matrix
    # the decode step reads 16 GB of weights (>> 4 x 60 MB of L2): its GEMMs get a weight-streaming %
    assert head["stream_pct"] == pytest.approx(100 * head["eff_tb_s"] / 4.8)
    norm = w[(w["step"] == 1) & (w["role"] == "post_norm")].iloc[3]
    assert norm["eff_tb_s"] > 0 and norm["stream_pct"] != norm["stream_pct"]          # a norm: effective only
    reduces = w[(w["kernel"] == "splitKreduce_kernel")]
    assert reduces["flops"].isna().all()                       # the second part of a role carries no work


def test_counters_join_kernel_by_kernel(kt, ncu_rows):
    assert len(ncu_rows) == 148
    wins = [{"name": "prefill_b1", "step": 0, "match": {"mode": "EXTEND", "bs": 1}},
            {"name": "decode_b1", "step": 1, "match": {"mode": "DECODE", "bs": 1}}]
    j, info = timeline.attach_counters(kt, ncu_rows, wins, H200)
    by = {i["window"]: i for i in info}
    assert by["decode_b1"]["matched"] == by["decode_b1"]["expected"]             # every kernel of the window
    assert by["prefill_b1"]["matched"] >= by["prefill_b1"]["expected"] - 2
    dec = j[j["step"] == 1]
    assert dec["ncu_window"].notna().mean() > 0.97
    # layer 17 of the full model takes the counters of layer 1 of the 2-layer run: same kernels, same shapes
    g17 = dec[(dec["layer"] == 17) & (dec["role"] == "gate_up_proj")].iloc[0]
    g1 = dec[(dec["layer"] == 1) & (dec["role"] == "gate_up_proj")].iloc[0]
    assert g17["dram_pct"] == g1["dram_pct"] and g17["dram_pct"] > 70                   # decode GEMV streams weights
    assert g1["dram_kind"] == "read" and not g1["l2_resident"]                            # ... from DRAM
    pre = j[(j["step"] == 0) & (j["role"] == "gate_up_proj")].iloc[5]
    assert pre["tensor_pct"] > 80                                                          # prefill GEMM: tensor cores
    assert bounds.bound({**pre, "top_stalls": pre["top_stalls"]}) == "compute-bound (tensor cores)"
    # the ncu time and the traced time of a kernel are close (same shapes; ncu flushed caches per replay there)
    assert 0.7 < g1["ncu_time_us"] / g1["dur_us"] < 1.3 and g1["ncu_ratio"] == g1["ncu_time_us"] / g1["dur_us"]


def test_layer_tree_shares_add_up(kt):
    tree = timeline.layer_tree(kt, step=1)
    total = sum(r["share_all_layers_pct"] for r in tree)
    assert 95 < total < 105                          # one layer x 32 + the once-per-step kernels = the step
    assert {r["segment"] for r in tree} == {"pre", "layer", "post"}
    sh = timeline.class_shares(kt)
    dec = sh[sh["mode"] == "DECODE"].set_index("cls")["share_pct"]
    assert dec["gemm"] > 70 and dec["gemm"] == dec.max()                     # decode at batch 1: GEMV-bound


def test_perfetto_trace_is_valid_and_windowed(kt, tmp_path):
    steps = [{"name": f"step {s}", "start_us": float(g["ts_us"].min()), "dur_us": float(g["end_us"].max() - g["ts_us"].min()),
              "bs": 1} for s, g in kt.groupby("step")]
    ev, meta = timeline.perfetto_events(kt, steps=steps, counters={"running": [(float(kt["ts_us"].min()), 1.0)]},
                                        requests=[{"id": 0, "phases": [("prefill", steps[0]["start_us"], steps[1]["start_us"])]}])
    p = timeline.write_perfetto(tmp_path / "story.json", ev, meta)
    d = json.loads(p.read_text())
    kinds = {e["ph"] for e in d["traceEvents"]}
    assert {"X", "M", "C"} <= kinds and d["metadata"]["steps_left_out"] == []
    assert all(e["ts"] >= 0 for e in d["traceEvents"] if e["ph"] == "X")
    small, m2 = timeline.perfetto_events(kt, max_kernels=450)
    assert m2["steps_left_out"] == [1] and m2["kernels"] == (kt["step"] == 0).sum()      # whole steps, from the start
    with pytest.raises(ValueError, match="MiB"):
        timeline.write_perfetto(tmp_path / "big.json", ev, meta, max_bytes=1000)
