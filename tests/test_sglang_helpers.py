"""sglang/scripts/_sglang.py: the SGLang server manager and the parsers of what the server says.

Fixtures (tests/fixtures/, all from one H200 on 2026-11-21/23, SGLang 0.5.17, Llama-3.1-8B config with
dummy weights; made by shared/device/probes/sgl_server_probe.py, sgl_load_probe.sh and the story probe):
  sglang_server_log_under_load_llama8b_dummy_h200.log   launch_server --log-level info under two
        bench_serving runs: 150 "Prefill batch", 9 "Decode batch", 1 retraction line (as recorded)
  sglang_server_metrics_llama8b_dummy_h200.txt          GET /metrics after 4 requests
  sglang_server_metrics_after_load_h200.txt             GET /metrics after both load runs
  sglang_bench_serving_{gsp_8x16,random_ids_rate32}_h200.jsonl   sglang.benchmark.serving --output-file
  sglang_server_trace_llama8b_h200_cut.json             the server's /start_profile trace (one
        step[EXTEND bs=1 toks=11] inside scheduler.run_batch) cut to its first 200 kernels, the CUDA
        runtime calls that launched them, the user annotations and the metadata
  torch_trace_sglang_extend_step_h200_cut{,160}.json    the same kind of trace, cut differently (memcpys kept)
  sglang_story_trace_graphs_llama8b_h200_cut.json.gz    /start_profile trace with CUDA graphs on (prefill and
        decode): two scheduler.run_batch ranges around step[EXTEND bs=1 toks=512] and step[DECODE bs=1],
        graph-replay kernels sharing their cudaGraphLaunch's correlation id (see tests/test_timeline.py)
Known-bad inputs are real lines/files damaged on purpose inside the tests. Servers here are the
stand-in tests/sglang_fake_server.py on 127.0.0.1, on a port the OS chose (never a fixed one).
Tests marked `stack` need SGLang installed (no GPU): skipped here, run by `make test-gpu` on the GPU machine.
"""
import importlib.util
import json
import math
import re
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from common.base import stats
from common.base.checks import SetupError
from common.capture import procs
from common.tables import trace

SCRIPTS = Path(__file__).resolve().parents[1] / "sglang" / "scripts"
sys.path.insert(0, str(SCRIPTS))
import _sglang as sg  # noqa: E402
from _sglang import ParseError, Server, ServerError  # noqa: E402

FAKE = Path(__file__).resolve().parent / "sglang_fake_server.py"
LOG = "sglang_server_log_under_load_llama8b_dummy_h200.log"
GRAPHS = "sglang_story_trace_graphs_llama8b_h200_cut.json.gz"


# ------------------------------------------------------------------ scheduler log lines

def test_batch_log_counts_and_fields(fixture_path):
    rows = sg.parse_batch_log(fixture_path(LOG).read_text())
    kinds = [r["kind"] for r in rows]
    assert kinds.count("prefill") == 150 and kinds.count("decode") == 9 and kinds.count("retract") == 1
    first = rows[0]   # the server warm-up: "The capital city of France is" = 30 byte tokens
    assert first["kind"] == "prefill" and first["new_seq"] == 1 and first["new_token"] == 30
    assert first["cached_token"] == 0 and first["cuda_graph"] is True and first["input_tput"] == pytest.approx(22.66)
    full = [r for r in rows if r["kind"] == "decode" and r["running_req"] == 181]
    assert full and full[0]["num_token"] == 777258 and full[0]["token_usage"] == pytest.approx(0.99)
    assert full[0]["queue_req"] == 75 and full[0]["gen_tput"] == pytest.approx(322.14)
    r = next(r for r in rows if r["kind"] == "retract")
    assert (r["retracted"], r["gained"], r["ratio_before"], r["ratio_after"]) == (1, 3707, 0.5977, 0.9531)
    assert all(rows[i]["ts"] <= rows[i + 1]["ts"] for i in range(len(rows) - 1))
    assert sum(sg.is_probe(r) for r in rows) >= 1          # a /health generation probe is in there


def test_batch_log_ms_tp_and_iter_variants(fixture_path):
    line = next(l for l in fixture_path(LOG).read_text().splitlines() if "Decode batch" in l)
    ms = line.replace("11:36:41]", "11:36:41.250 TP0]", 1).replace("Decode batch,", "Decode batch [42],", 1)
    r = sg.parse_batch_log(ms + "\n")[0]
    assert r["tp"] == 0 and r["iter"] == 42 and r["time"].endswith(".250")
    assert r["ts"] - int(r["ts"]) == pytest.approx(0.25)
    prefixed = "INFO uvicorn | " + line   # lines may carry another logger's prefix
    assert sg.parse_batch_log(prefixed + "\n")[0]["kind"] == "decode"


def test_batch_log_known_bad_fails_loudly(fixture_path):
    line = next(l for l in fixture_path(LOG).read_text().splitlines() if "Prefill batch" in l)
    cut = line[:line.index("token usage")]          # a line cut in the middle, then more lines follow
    with pytest.raises(ParseError, match="does not parse"):
        sg.parse_batch_log(f"{line}\n{cut}\n{line}\n")
    assert len(sg.parse_batch_log(f"{line}\n{cut}")) == 1   # ... but a last line still being written is fine
    assert len(sg.parse_batch_log(f"{cut}\n", strict=False)) == 0
    with pytest.raises(ParseError):
        sg.parse_batch_log(b"bytes are not text")


# ------------------------------------------------------------------ /metrics

def test_metrics_totals_labels_histograms(fixture_path):
    m = sg.parse_metrics(fixture_path("sglang_server_metrics_llama8b_dummy_h200.txt").read_text())
    assert m.total("sglang:cached_tokens_total") == 4081 and m.total("prompt_tokens_total") == 6156
    big = sg.parse_metrics(fixture_path("sglang_server_metrics_after_load_h200.txt").read_text())
    assert big.total("prompt_tokens_total") == 30 + 1.713926e06             # summed over is_streaming
    assert big.total("prompt_tokens_total", is_streaming="true") == 1.713926e06
    assert big.get("realtime_tokens_total", mode="prefill_cache") == 544480
    assert big.total("evicted_tokens_total") == 416239
    assert big.get("max_total_num_tokens") == 788603
    with pytest.raises(KeyError):
        big.get("realtime_tokens_total")                 # three modes match: ambiguous
    with pytest.raises(KeyError, match="enable-metrics"):
        big.total("no_such_metric")
    assert big.total("no_such_metric", 0.0) == 0.0
    h = big.histogram("time_to_first_token_seconds")
    assert h["count"] > 0 and h["buckets"][-1][0] == math.inf and h["buckets"][-1][1] == h["count"]
    assert all(a[1] <= b[1] for a, b in zip(h["buckets"], h["buckets"][1:]))


def test_hit_rate_from_counter_deltas(fixture_path):
    text = fixture_path("sglang_server_metrics_after_load_h200.txt").read_text()
    after = sg.parse_metrics(text)
    zero = sg.parse_metrics("\n".join(l if l.startswith("#") or not l.strip() else l.rsplit(" ", 1)[0] + " 0.0"
                                      for l in text.splitlines()))
    h = sg.hit_rate(zero, after)
    assert h["hit_rate_requests"] == pytest.approx(544475 / 1713956)
    assert h["hit_rate_scheduler"] == pytest.approx(544480 / (544480 + 1.175719e06))
    assert h["evicted_tokens"] == 416239 and h["retracted_requests"] == 1
    same = sg.hit_rate(after, after)
    assert math.isnan(same["hit_rate_requests"]) and same["evicted_tokens"] == 0


def test_metrics_known_bad_fails_loudly(fixture_path):
    lines = fixture_path("sglang_server_metrics_llama8b_dummy_h200.txt").read_text().splitlines()
    i = next(i for i, l in enumerate(lines) if l.startswith("sglang:cached_tokens_total"))
    broken = lines[:i] + [lines[i].replace('="device"', "=device")] + lines[i + 1:]
    with pytest.raises(ParseError, match=f"line {i + 1}"):
        sg.parse_metrics("\n".join(broken))
    with pytest.raises(ParseError, match="enable-metrics"):
        sg.parse_metrics("# only comments\n")
    with pytest.raises(ParseError):
        sg.parse_metrics("sglang:x 1.0.0\n")


# ------------------------------------------------------------------ bench_serving output

def test_bench_jsonl(fixture_path):
    gsp = sg.read_bench_jsonl(fixture_path("sglang_bench_serving_gsp_8x16_h200.jsonl"))
    assert len(gsp) == 1 and gsp[0]["completed"] == 128 and math.isinf(gsp[0]["request_rate"])
    h = sg.bench_headline(gsp[0])
    assert "server_info" not in h and h["total_throughput"] == pytest.approx(137633.7622875021)
    rid = sg.bench_headline(sg.read_bench_jsonl(fixture_path("sglang_bench_serving_random_ids_rate32_h200.jsonl"))[0])
    assert rid["request_rate"] == 32.0 and rid["median_itl_ms"] < rid["p99_itl_ms"]


def test_bench_known_bad(fixture_path, tmp_path):
    text = fixture_path("sglang_bench_serving_gsp_8x16_h200.jsonl").read_text()
    cut = tmp_path / "cut.jsonl"
    cut.write_text(text + text[: len(text) // 2])    # a second run cut while it was being appended
    with pytest.raises(ParseError, match="line 2"):
        sg.read_bench_jsonl(cut)
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"backend": "engine", "output_throughput": 1.0}) + "\n")
    with pytest.raises(ParseError, match="not a bench_serving result"):
        sg.read_bench_jsonl(other)
    with pytest.raises(ParseError, match="no bench_serving output"):
        sg.read_bench_jsonl(tmp_path / "missing.jsonl")


def test_bench_cmd_keeps_lengths_fixed():
    class S:   # no socket is opened: only the command line is built
        host, port, model_path = "127.0.0.1", 12345, "/m"
    cmd = sg.bench_cmd(S(), "/o.jsonl", num_prompts=8, input_len=512, output_len=64, rate=4)
    assert cmd[1:3] == ["-m", "sglang.benchmark.serving"] and "--tokenize-prompt" in cmd
    assert cmd[cmd.index("--random-range-ratio") + 1] == "1.0" and cmd[cmd.index("--request-rate") + 1] == "4"
    gsp = sg.bench_cmd(S(), "/o.jsonl", num_prompts=8, input_len=1, output_len=1, dataset="generated-shared-prefix")
    assert "--tokenize-prompt" not in gsp                  # bench_serving asserts against it for GSP


def test_latency_summary_uses_the_common_percentiles():
    res = [{"meta_info": {"prompt_tokens": 10, "completion_tokens": 4, "cached_tokens": 5},
            "client": {"t_send": 0.0, "t_done": 2.0, "e2e_s": 2.0, "ttft_s": 0.5, "itl_s": [0.1, 0.2, 0.3]}},
           {"meta_info": {"prompt_tokens": 10, "completion_tokens": 4, "cached_tokens": 0},
            "client": {"t_send": 1.0, "t_done": 4.0, "e2e_s": 3.0, "ttft_s": 1.5, "itl_s": [0.1]}},
           {"error": "HTTP 500"}]
    s = sg.latency_summary(res)
    assert s["failed"] == 1 and s["wall_s"] == 4.0 and s["output_throughput"] == 2.0
    assert s["hit_rate"] == 0.25 and s["p50_ttft_ms"] == pytest.approx(1000.0)
    assert s["p50_itl_ms"] == pytest.approx(150.0)
    assert s["p99_itl_ms"] == pytest.approx(stats.percentiles([100, 200, 300, 100])["p99"])
    assert sg.latency_summary([{"error": "x"}])["failed"] == 1


# ------------------------------------------------------------------ traces: steps through common.tables.trace.step_kernels

def test_steps_from_the_server_trace_use_the_run_batch_range(fixture_path):
    ev = trace.read_chrome_trace(fixture_path("sglang_server_trace_llama8b_h200_cut.json"))
    kt, steps = sg.steps(ev)
    assert [(s["mode"], s["bs"], s["toks"]) for s in steps] == [("EXTEND", 1, 11)]
    s = steps[0]
    assert s["how"] == "outer" and s["kernels"] == len(kt) > 150 and s["cpu_us"] > 0
    assert s["gemm_us"] > s["attention_us"] > 0 and s["kernel_us"] == pytest.approx(kt["dur_us"].sum())
    assert set(kt["cls"]) >= {"gemm", "attention", "norm", "rope", "activation", "kv_store"}
    # the same join as common.tables.trace.kernels_in_ranges on the outer range
    j = trace.kernels_in_ranges(ev, r"^scheduler\.run_batch$", empty_rows=False)
    assert s["kernels"] == int((j["gpu_kind"] == "kernel").sum())
    # without the outer range the step's own range is joined
    _, inner = sg.steps(ev[ev["name"] != "scheduler.run_batch"])
    assert inner[0]["how"] == "step" and inner[0]["kernels"] <= s["kernels"] and inner[0]["gemm_us"] > 0
    assert sg.parse_step_name("step[DECODE bs=32]") == {"mode": "DECODE", "bs": 32, "toks": None}
    assert sg.parse_step_name("scheduler.run_batch") is None


def test_steps_with_cuda_graph_replays(fixture_path):
    """CUDA graphs on: the decode step is one graph replay whose kernels share its cudaGraphLaunch's
    correlation id; the sampling kernels sit in scheduler.run_batch after the step range closes."""
    ev = trace.read_chrome_trace(fixture_path(GRAPHS))
    kt, steps = sg.steps(ev)
    rows = kt.to_dict("records")
    assert [(s["mode"], s["bs"], s["toks"], s["how"]) for s in steps] == [("EXTEND", 1, 512, "outer"),
                                                                          ("DECODE", 1, None, "outer")]
    pre, dec = steps
    assert (pre["kernels"], dec["kernels"]) == (382, 431)      # every kernel of each run_batch, graphs included
    inner = trace.kernels_in_ranges(ev, r"^step\[DECODE", empty_rows=False)
    assert int((inner["gpu_kind"] == "kernel").sum()) == 425      # the step range alone misses the sampling kernels
    after_step = {r["kernel"] for r in rows if r["step"] == 1} - set(inner["kernel"])
    assert "reduce_kernel" in {r["kernel"] for r in rows if r["step"] == 1} and after_step
    assert dec["gemm_us"] > dec["attention_us"] > 0 and pre["gemm_us"] > pre["attention_us"] > 0
    assert 0 < dec["dur_us"] < pre["dur_us"] and dec["cpu_us"] < pre["cpu_us"]
    assert sum(r["step"] == 1 for r in rows) == dec["kernels"]


def test_steps_from_a_trace_without_steps_is_a_clear_error(fixture_path):
    ev = trace.read_chrome_trace(fixture_path("torch_profiler_trace_flashinfer_rmsnorm_matmul_h200.json"))
    with pytest.raises(trace.TraceError, match="no step"):
        sg.steps(ev)


@pytest.mark.parametrize("name", ["torch_trace_sglang_extend_step_h200_cut.json",
                                  "torch_trace_sglang_extend_step_h200_cut160.json"])
def test_steps_on_the_other_sglang_fixtures(fixture_path, name):
    ev = trace.read_chrome_trace(fixture_path(name))
    _, (s,) = sg.steps(ev)
    assert (s["mode"], s["toks"], s["how"]) == ("EXTEND", 11, "outer") and s["kernels"] > 0
    assert s["kernels"] == int((trace.kernels_in_ranges(ev, r"^scheduler\.run_batch$", empty_rows=False)["gpu_kind"]
                                == "kernel").sum())


def test_join_steps_with_real_log(fixture_path):
    rows = [r for r in sg.parse_batch_log(fixture_path(LOG).read_text()) if r["kind"] != "retract"]
    window = rows[40:60]
    steps = [{"mode": "EXTEND", "bs": r["new_seq"], "toks": r["new_token"]} if r["kind"] == "prefill"
             else {"mode": "DECODE", "bs": r["running_req"], "toks": None} for r in window]
    steps[5] = {**steps[5], "bs": steps[5]["bs"] + 1}                 # one step that disagrees
    joined, info = sg.join_steps(steps, rows)
    assert info["ok"] and info["offset"] == 40 and info["matched"] == len(steps) - 1
    assert joined[0]["log_cached_token"] == window[0].get("cached_token")
    assert joined[5]["log_match"] is False and joined[6]["log_match"] is True
    assert "log_num_token" in joined[0]
    _, bad = sg.join_steps([{"mode": "EXTEND", "bs": 999, "toks": 7}] * 10, rows)
    assert not bad["ok"]


# ------------------------------------------------------------------ where a server start goes

# tests/fixtures/README.md: two starts of one launch_server command on a fresh H100 (2026-11-25), the epoch
# at which _sglang.Server launched each; the machine's clock (and so the log's) ran in UTC
START_LOGS = {"warm": ("sglang_server_start_warm_h100.log", 1795586053.253),
              "cold": ("sglang_server_start_cold_h100.log", 1795585715.911)}
UTC = __import__("datetime").timezone.utc


GATE_PHASES = ("scheduler_imports", "gate")     # only a server started under the gate (_sgl_gate) has them


def _breakdown(fixture_path, which):
    name, t0 = START_LOGS[which]
    return sg.startup_breakdown(fixture_path(name).read_text(), t0, tz=UTC)


def test_startup_breakdown_of_a_warm_start(fixture_path):
    ph = _breakdown(fixture_path, "warm")
    got = {p["phase"]: p["seconds"] for p in ph}
    assert got == pytest.approx({"imports": 27.747, "server_args": 5.535, "scheduler_start": 35.353, "dist_init": 0.064,
                                 "model_setup": 3.339, "weights": 0.221, "kv_pool": 1.952, "backend_init": 0.146,
                                 "prefill_graphs": 10.625, "decode_graphs": 4.095, "scheduler_ready": 0.399,
                                 "warmup": 1.309}, abs=1e-6)
    assert list(got) == [k for k, _rx, _w in sg.START_PHASES if k not in GATE_PHASES]   # every phase, in order
    assert all(b["start_s"] == pytest.approx(a["start_s"] + a["seconds"]) for a, b in zip(ph, ph[1:]))
    assert sum(got.values()) == pytest.approx(90.785)                          # "healthy after 91 s"
    note = {p["phase"]: p["note"] for p in ph}
    assert note["prefill_graphs"] == "58 token sizes 4-8192, first size 1.08 s"
    assert note["decode_graphs"] == "36 batch sizes 1-256, first size 0.11 s"
    assert note["kv_pool"] == "32768 tokens, K 2.00 GB + V 2.00 GB"
    assert note["weights"] == "load_format dummy, 15.02 GB in 0.22 s"
    assert "tokenizer manager ready at +35.4 s" in note["scheduler_start"]
    assert "tokenizer_e2e - scheduler_e2e = 32.4 s" in note["scheduler_start"]          # SGLang's own figures agree
    assert note["scheduler_ready"].startswith("SGLang: load_weight=0.22, kv_cache_allocation=0.01, scheduler_e2e=23.78")
    assert note["imports"] == "ends at a time stamp of 1 s resolution" and "JIT" not in " ".join(note.values())
    # with the time /health answered, a last phase; the flat row for a CSV
    ph = sg.startup_breakdown(fixture_path(START_LOGS["warm"][0]).read_text(), 1795586053.253, 1795586144.253, tz=UTC)
    assert ph[-1]["phase"] == "health" and ph[-1]["seconds"] == pytest.approx(0.215)
    row = sg.breakdown_row(ph)
    assert row["prefill_graphs_s"] == 10.62 and row["health_s"] == 0.21 and "first size 1.08 s" in row["notes"]
    lines = sg.breakdown_lines(ph, 91.0)
    assert len(lines) == 13 and lines[8].startswith("  +  74.4 s    10.6 s   12%  prefill_graphs")


def test_startup_breakdown_of_a_gated_start(fixture_path):
    # SGLang 08's counters server under ncu, launched with the run and held by _sgl_gate while the stories ran (H100,
    # 1c8479f, 2026-11-27; the log up to "fired up"); the gate's two stamped lines cut the scheduler's start in three
    text = fixture_path("sglang_server_start_gated_under_ncu_h100.log").read_text()
    ph = sg.startup_breakdown(text, 1795803423.254, tz=UTC)
    got = {p["phase"]: p["seconds"] for p in ph}
    assert list(got)[:5] == ["imports", "server_args", "scheduler_imports", "gate", "scheduler_start"]
    assert got["gate"] == pytest.approx(67.612, abs=1e-6)                      # 18:17:55.350 -> 18:19:02.962
    assert got["scheduler_imports"] == pytest.approx(22.3, abs=0.1) and got["scheduler_start"] < 3
    what = {p["phase"]: p["what"] for p in ph}
    assert what["scheduler_start"].startswith("after the gate") and "held by the workbook" in what["gate"]
    assert sum(got.values()) == pytest.approx(131.0, abs=0.5)                 # "ready after 131 s"


def test_startup_breakdown_of_a_cold_start_names_the_jit_compiles(fixture_path):
    ph = _breakdown(fixture_path, "cold")
    got = {p["phase"]: p["seconds"] for p in ph}
    assert got["prefill_graphs"] == pytest.approx(211.762) and got["warmup"] == pytest.approx(13.193)
    assert got["imports"] == pytest.approx(29.089) and got["scheduler_start"] == pytest.approx(34.41)
    assert sum(got.values()) == pytest.approx(303.265)                        # "healthy after 304 s"
    note = {p["phase"]: p["note"] for p in ph}
    assert note["prefill_graphs"] == "58 token sizes 4-8192, first size 201.35 s (JIT compiles on first use)"
    assert note["warmup"] == "its forward took 12.00 s (JIT compiles on first use)"


def test_startup_breakdown_known_bad_and_partial_logs(fixture_path):
    text = fixture_path(START_LOGS["warm"][0]).read_text()
    assert sg.startup_breakdown("fake server: no SGLang lines\n", 0.0) == []
    # no prefill graphs (--disable-prefill-cuda-graph): its phase is absent, the time stays counted
    cut = "\n".join(l for l in text.split("\n") if "prefill CUDA graph" not in l and "Capturing num tokens" not in l)
    ph = sg.startup_breakdown(cut, START_LOGS["warm"][1], tz=UTC)
    got = {p["phase"]: p["seconds"] for p in ph}
    assert "prefill_graphs" not in got and got["decode_graphs"] == pytest.approx(4.095)
    assert got["backend_init"] == pytest.approx(0.146 + 10.625)                  # up to the decode capture's begin
    assert sum(got.values()) == pytest.approx(90.785)
    # a line of 1 s resolution after a ms one never makes a negative phase
    early = text.replace("[2026-11-25 05:55:44.038] The server", "[2026-11-25 05:55:42] The server")
    assert min(p["seconds"] for p in sg.startup_breakdown(early, START_LOGS["warm"][1], tz=UTC)) >= 0


# ------------------------------------------------------------------ flags, options, small helpers

def test_flags_and_forbidden_flags(tmp_path):
    assert sg.flags(tp_size=2, enable_metrics=True, disable_radix_cache=False, port=None,
                    json_model_override_args={"num_hidden_layers": 2}) == \
        ["--tp-size", "2", "--enable-metrics", "--json-model-override-args", '{"num_hidden_layers": 2}']
    with pytest.raises(SetupError, match="multicast"):
        Server("m", ["--enable-nccl-nvls"], log_path=tmp_path / "l")
    assert len(sg.random_text(77, 1)) == 77 and sg.random_text(77, 1) == sg.random_text(77, 1)
    assert sg.random_ids(5, 1) == sg.random_ids(5, 1) != sg.random_ids(5, 2)


def test_default_server_config_keeps_cuda_graphs(tmp_path, monkeypatch):
    """No --quick shortcut: every server runs SGLang's default CUDA graphs (prefill and decode)."""
    import argparse
    monkeypatch.setenv("HANDS_ON_CACHE", str(tmp_path))
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    sg.add_model_args(p)
    args = p.parse_args(["--quick", "--server-arg=--page-size 16", "--mem-fraction", "0.5"])
    model_dir, base = sg.model_and_flags(args)
    assert Path(model_dir, "config.json").is_file() and not any("cuda-graph" in f for f in base)
    assert base == ["--load-format", "dummy", "--mem-fraction-static", "0.5", "--page-size", "16"]
    assert sg.graphs_text(base) == "CUDA graphs: prefill on, decode on — SGLang's defaults"
    assert sg.graphs_text(["--disable-prefill-cuda-graph", "--cuda-graph-max-bs-decode", "64"]) == \
        "CUDA graphs: prefill off, decode on (decode captured up to bs 64)"
    assert sg.model_and_flags(args, preset="tiny-llama")[0].endswith("tiny-llama")
    with pytest.raises(SystemExit):
        p.parse_args(["--server-arg=--enable-nccl-nvls"])


def test_serving_flags_and_what_quick_changes(tmp_path, monkeypatch):
    """One function builds the flags of every experiment that can share a server; --quick's changes from
    SGLang's defaults come with their reasons and lead the story (issue #22, item 3)."""
    import argparse
    monkeypatch.setenv("HANDS_ON_CACHE", str(tmp_path))
    p = argparse.ArgumentParser()
    sg.add_model_args(p)
    args = p.parse_args([])
    model, quick = sg.serving_flags(args, quick=True)
    assert quick == ["--load-format", "dummy", "--mem-fraction-static", "0.8", "--attention-backend", "flashinfer",
                     "--random-seed", "0", "--enable-metrics", "--log-level", "info", "--decode-log-interval", "1",
                     "--max-total-tokens", "32768"]          # decode CUDA graphs: SGLang's own (01 sweeps to 256)
    _, full = sg.serving_flags(args, quick=False)
    assert "--max-total-tokens" not in full and "--cuda-graph-max-bs-decode" not in full
    assert sg.serving_flags(args, quick=True, pool=32768)[1] == quick                   # 02's and 08's default pool
    assert sg.serving_flags(args, quick=True, schedule_policy="lpm")[1] == quick + ["--schedule-policy", "lpm"]
    assert sg.serving_flags(args, quick=False, write=False)[0] == model
    ch = {c["setting"]: c for c in sg.changes_from_defaults(quick, sg.SERVING_ENV, quick=True)}
    assert [k for k, c in ch.items() if c["quick"]] == ["--max-total-tokens"]
    assert all(c["why"] for c in ch.values()) and ch["SGLANG_LOG_MS"]["value"] == "1"
    line = sg.config_line(quick, sg.SERVING_ENV, quick=True)
    assert line.startswith("NOT SGLang's default configuration: --quick sets KV pool 32768 tokens (SGLang: sized "
                           "from free memory); also --load-format dummy, --mem-fraction-static 0.8, "
                           "--attention-backend flashinfer")
    assert "SGLANG_LOG_MS=1" in line
    assert sg.config_line(full, {}, quick=False).startswith("SGLang's defaults except --load-format dummy")
    assert sg.parse_flags(["--a", "1", "--b", "--c=x", "--d", "1", "2"]) == {"--a": "1", "--b": True, "--c": "x",
                                                                               "--d": ["1", "2"]}
    assert sg.flag_diff(quick, list(reversed(quick[-2:])) + quick[:-2]) != ""     # a value moved is not the same
    assert sg.flag_diff(quick, quick[-2:] + quick[:-2]) == ""                      # same flags, another order
    assert sg.flag_diff(quick, quick + ["--schedule-policy", "lpm"]) == "adds --schedule-policy lpm"
    assert sg.flag_diff(quick, full) == "lacks --max-total-tokens 32768"
    assert sg.flag_diff(quick, quick[:-1] + ["65536"]) == "--max-total-tokens 65536 (shared: 32768)"
    capped = quick + ["--cuda-graph-max-bs-decode", "64"]           # a graph cap is a change from the defaults
    assert sg.flag_diff(quick, capped) == "adds --cuda-graph-max-bs-decode 64"


# ------------------------------------------------------------------ the server manager (a stand-in server)

def fake(tmp_path, *extra, **kw):
    kw.setdefault("start_timeout", 30)
    kw.setdefault("stop_timeout", 3)
    kw.setdefault("pidfile", tmp_path / "servers" / "server.pid")
    return Server("dummy-model", list(extra), log_path=tmp_path / "server.log", launcher=[sys.executable, str(FAKE)],
                  echo=lambda *_: None, **kw)


def test_server_starts_serves_and_stops_its_whole_group(tmp_path):
    srv = fake(tmp_path, "--spawn-child", "--ready-after", "0.5")
    assert srv.port != 30000 and srv.host == "127.0.0.1"             # a port the OS chose
    with srv:
        assert srv.alive() and srv.pidfile.is_file()
        assert json.loads(srv.pidfile.read_text())["owner"] == os.getpid()
        pgid = srv.proc.pid
        time.sleep(0.3)
        members = procs.group_pids(pgid)
        assert len(members) >= 2                      # server + its child
        out = srv.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 5})
        assert out["meta_info"]["completion_tokens"] == 5 and out["client"]["e2e_s"] > 0
        st = srv.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 5}, stream=True)
        assert st["meta_info"]["completion_tokens"] == 5 and len(st["client"]["itl_s"]) == 4 and st["client"]["ttft_s"] > 0
        many = srv.generate_many([{"input_ids": [1], "sampling_params": {"max_new_tokens": 2}}] * 6, stream=True)
        assert sg.latency_summary(many)["completion_tokens"] == 12
        assert srv.metrics().total("cached_tokens_total") == 4
        srv.flush_cache()
        assert "fake server" in srv.log_since(0)
    assert srv.stop_report["left_over"] == [] and not any(procs.alive(p) for p in members)
    assert procs.port_free("127.0.0.1", srv.port) and not srv.pidfile.exists()


def test_server_stop_does_not_wait_for_sglangs_crash_sleep(tmp_path):
    """SGLang 0.5.17 takes a child that dies of SIGTERM for a crash and sleeps 5 s before it exits (5.3-5.8 s per stop
    of the H200 pipeline's servers): the launcher goes first, with SIGKILL, its child with it (PR_SET_PDEATHSIG)."""
    srv = fake(tmp_path, "--spawn-child", "--crash-sleep", "4", stop_timeout=10)
    with srv:
        time.sleep(0.3)
        members = procs.group_pids(srv.proc.pid)
        assert len(members) >= 2
        t0 = time.monotonic()
    took = time.monotonic() - t0
    assert took < 2.5, f"the stop waited for the launcher's crash sleep ({took:.1f} s)"
    assert srv.stop_report["left_over"] == [] and not srv.stop_report["killed"]
    assert not any(procs.alive(p) for p in members)
    assert "crash diagnostics" not in srv.log_since(0)


def test_generate_batch_is_one_request_with_a_result_each(tmp_path):
    srv = fake(tmp_path)
    with srv:
        out = srv.generate_batch([[1, 2, 3], [4, 5]], {"max_new_tokens": 3})
        assert [o["meta_info"]["prompt_tokens"] for o in out] == [3, 2]
        assert all(o["meta_info"]["completion_tokens"] == 3 and o["client"]["e2e_s"] > 0 for o in out)
        assert srv.log_since(0).count("Prefill batch, #new-seq: 2,") == 1          # one request carried both


def test_server_prints_where_its_start_went(tmp_path):
    said = []
    srv = fake(tmp_path, "--sglang-log", "--ready-after", "1.1")
    srv.echo = said.append
    with srv:
        phases = [p["phase"] for p in srv.startup_phases]
    assert phases == ["imports", "server_args", "scheduler_start", "dist_init", "model_setup", "weights", "kv_pool",
                      "backend_init", "decode_graphs", "warmup", "health"]
    total = srv.startup_phases[-1]["start_s"] + srv.startup_phases[-1]["seconds"]
    assert total == pytest.approx(srv.startup_s, abs=0.05)                   # the phases add up to the start
    text = next(m for m in said if "where the" in m)
    assert text.startswith(f"server: where the {srv.startup_s:.1f} s of its start went (its log's time stamps):\n")
    assert "decode_graphs" in text and "[4 batch sizes 1-8" in text and "kv_pool" in text


def test_a_given_port_in_use_is_a_setup_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(SetupError, match=f"port {port}.*in use"):
            with fake(tmp_path, port=port):
                pass


def test_server_dying_during_startup_shows_its_log(tmp_path):
    with pytest.raises(ServerError, match="exited with code 3(.|\n)*CUDA out of memory"):
        with fake(tmp_path, "--die-after", "0.5", "--no-health"):
            pass


def test_start_timeout_stops_everything(tmp_path):
    srv = fake(tmp_path, "--no-health", "--spawn-child", start_timeout=2)
    with pytest.raises(ServerError, match="not healthy after 2 s"):
        srv.__enter__()
    assert srv.proc is None and srv.stop_report["left_over"] == []


def test_sigterm_ignored_escalates_to_sigkill(tmp_path):
    srv = fake(tmp_path, "--ignore-term", "--spawn-child", stop_timeout=1)
    with srv:
        pass
    assert srv.stop_report["left_over"] == [] and srv.stop_report["returncode"] == -signal.SIGKILL


def test_ctrl_c_inside_the_block_stops_the_server(tmp_path):
    srv = fake(tmp_path, "--spawn-child")
    with pytest.raises(KeyboardInterrupt):
        with srv:
            time.sleep(0.3)
            members = procs.group_pids(srv.proc.pid)
            raise KeyboardInterrupt
    assert not any(procs.alive(p) for p in members)


def test_wrapper_gets_to_write_its_report(tmp_path):
    report = tmp_path / "report.txt"
    srv = fake(tmp_path, "--spawn-child", wrapper=[sys.executable, str(FAKE), "--wrapper", str(report), "--"],
               wrapper_stop_timeout=20)
    with srv:
        assert srv.generate(input_ids=[1], sampling_params={"max_new_tokens": 1})["meta_info"]["completion_tokens"] == 1
    assert report.read_text().startswith("app exited")        # the app was stopped first, the tool finished
    assert srv.stop_report["left_over"] == []


def test_wrapper_that_moves_the_app_to_its_own_session(tmp_path):
    """The app is out of the wrapper's process group (killpg cannot reach it): it is still found,
    stopped first, the report gets written, and nothing is left running."""
    report = tmp_path / "report.txt"
    srv = fake(tmp_path, "--spawn-child", wrapper=[sys.executable, str(FAKE), "--wrapper-setsid", str(report), "--"],
               wrapper_stop_timeout=20)
    with srv:
        pgid = srv.proc.pid
        time.sleep(0.3)
        below = procs.descendants(pgid)
        assert len(below) >= 2 and not set(below) & set(procs.group_pids(pgid))   # app + its child, elsewhere
    assert report.read_text().startswith("app exited")
    assert srv.stop_report["left_over"] == [] and not any(procs.alive(p) for p in below)
    assert "<- SIGTERM" in (tmp_path / "server.log").read_text()


def test_sigterm_to_the_script_stops_the_server(tmp_path):
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        pytest.skip("SIGTERM already handled by the test runner")
    srv = fake(tmp_path, "--spawn-child")
    with pytest.raises(KeyboardInterrupt):
        with srv:
            time.sleep(0.3)
            members = procs.group_pids(srv.proc.pid)
            os.kill(os.getpid(), signal.SIGTERM)      # e.g. `timeout` or a job scheduler ending the script
            time.sleep(5)
    assert not any(procs.alive(p) for p in members)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL      # the handler was put back


# ------------------------------------------------------------------ one server for several experiments

FL = ["--load-format", "dummy", "--enable-metrics", "--log-level", "info", "--max-total-tokens", "32768"]


def _busy(srv, seconds):
    """A request the stand-in keeps running for ``seconds`` (as one a killed experiment left behind)."""
    t = threading.Thread(target=lambda: srv.generate(input_ids=[1], sampling_params={"max_new_tokens": 1,
                                                                                   "fake_running_s": seconds}))
    t.start()
    time.sleep(0.3)
    return t


def test_fresh_flushes_and_refuses_a_busy_server(tmp_path):
    with fake(tmp_path, "--log-level", "info") as srv:
        assert srv.fresh() == {"num_running_reqs": 0, "num_waiting_reqs": 0, "num_used_tokens": 0}
        assert "Cache flushed successfully" in srv.log_since(0)
        t = _busy(srv, 2.0)
        with pytest.raises(ServerError, match="could not be flushed"):
            srv.fresh(timeout=0.3)                              # SGLang's 400 after its timeout
        assert srv.fresh(timeout=10)["num_running_reqs"] == 0   # waits for the request, then flushes
        t.join()


def _shared(tmp_path, said, **kw):
    kw = {"model_path": "dummy-model", "flags": FL, "launcher": [sys.executable, str(FAKE), "--spawn-child"],
          "start_timeout": 30, "stop_timeout": 3, **kw}
    return sg.SharedServer("default", "quick", said.append, **kw)


def test_an_experiment_runs_on_the_shared_server_only_with_exactly_its_settings(tmp_path, monkeypatch):
    from common.run.results import Run
    monkeypatch.setenv("HANDS_ON_CACHE", str(tmp_path / "cache"))
    said = []
    h = _shared(tmp_path, said)
    h.start(tmp_path / "logs")
    pid = h.info()["pid"]
    try:
        assert json.loads(h.srv.pidfile.read_text())["owner"] == os.getpid()
        assert h.srv.pidfile.parent == tmp_path / "cache" / "servers" / sg.PIPELINE_STEM
        (var, value), = h.env().items()
        monkeypatch.setenv(var, value)
        own = {"launcher": [sys.executable, str(FAKE)], "start_timeout": 30, "stop_timeout": 3}
        with Run(tmp_path / "demo" / "scripts" / "01_demo.py", {}, out=tmp_path / "out", quiet=True) as run:
            with sg.server(run, "dummy-model", FL, quick=True, **own) as srv:
                assert srv.shared["pid"] == pid and srv.port == h.srv.port and srv.alive()
                assert srv.generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 2})["meta_info"]
            assert procs.alive(pid) and h.check() is None                   # the experiment did not stop it
            with sg.server(run, "dummy-model", FL + ["--schedule-policy", "lpm"], quick=True, own_why="LPM vs FCFS",
                           log_name="server_lpm.log", **own) as srv:
                assert srv.shared is None and srv.port != h.srv.port
                other = srv.group.pid
            with sg.server(run, "dummy-model", FL, quick=True, env={**sg.SERVING_ENV,
                           "SGLANG_FLASHINFER_USE_TENSOR_CORE": "false"}, log_name="server_cc.log", **own) as srv:
                assert srv.shared is None
            with sg.server(run, "dummy-model", FL, quick=True, port=procs.free_port(), log_name="server_p.log",
                           **own) as srv:
                assert srv.shared is None
            log = (run.dir / "log.txt").read_text()
            copy = (run.dir / "server.log").read_text()
            servers = run.summary["servers"]
        assert not procs.alive(other) and procs.alive(pid)
        assert f"server: runs on the pipeline's shared server 'default' (pid {pid}, http://127.0.0.1:{h.srv.port}" in log
        assert ("starts its own server, not the pipeline's shared 'default': its flags differ from the shared "
                "server's: adds --schedule-policy lpm -- LPM vs FCFS") in log
        assert "its SGLANG_* environment differs: SGLANG_FLASHINFER_USE_TENSOR_CORE=false" in log
        assert "--port " in log and "was asked for" in log
        assert copy.startswith("# the shared server's log") and "Cache flushed successfully" in copy
        assert [x["how"] for x in servers] == ["shared", "own", "own", "own"]
        assert servers[0]["changes"][-1]["setting"] == "SGLANG_PROFILE_RECORD_SHAPES"
        rows = (tmp_path / "out" / "server_start.csv").read_text().splitlines()
        assert len(rows) == 4 and rows[0].startswith("started_by,server,start_s")    # the three own starts
    finally:
        h.stop()
    assert not procs.alive(pid) and not h.srv


def test_the_shared_servers_check_finds_it_dead_or_busy_and_it_declines_a_small_gpu(tmp_path, monkeypatch):
    from common.run.steps import ServiceSkipped
    monkeypatch.setenv("HANDS_ON_CACHE", str(tmp_path / "cache"))
    said = []
    h = _shared(tmp_path, said, check_timeout=0.3)
    assert "dummy-model --load-format dummy" in h.describe() and h.describe().startswith("SGLANG_LOG_MS=1 ")
    h.start(tmp_path / "logs")
    try:
        assert h.check() is None
        t = _busy(h.srv, 1.5)
        assert "could not be flushed" in h.check()              # a request a step left running: not usable
        t.join()
        assert h.check() is None
        os.kill(h.info()["pid"], signal.SIGKILL)
        time.sleep(0.3)
        assert h.check().startswith("its process is gone")
    finally:
        h.stop()
    import _sgl_shared                                   # the room of _sglang that holds the shared server
    monkeypatch.setattr(_sgl_shared, "gpu_total_gb", lambda index=0: 40.0)
    with pytest.raises(ServiceSkipped, match="GPU 0 has 40 GB, under 70 GB"):
        _shared(tmp_path, said).start(tmp_path / "logs")


# ------------------------------------------------------------------ a server left behind by a SIGKILLed run

RUN = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {scripts!r})
    import _sglang as sg
    srv = sg.Server("dummy-model", ["--spawn-child"], log_path={log!r}, launcher=[sys.executable, {fake!r}],
                    echo=lambda m: print(m, flush=True), start_timeout=30, stop_timeout=3)
    srv.start()
    print("SERVER", srv.group.pid, srv.port, srv.pidfile, flush=True)
    time.sleep(60)
""")


def _start_run(tmp_path, env):
    """A script (its own stem: killed_run) that starts a fake server and waits; returns (proc, server pid, pidfile)."""
    script = tmp_path / "killed_run.py"
    script.write_text(RUN.format(scripts=str(SCRIPTS), log=str(tmp_path / "server.log"), fake=str(FAKE)))
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    t0 = time.time()
    while time.time() - t0 < 30:
        line = p.stdout.readline()
        if line.startswith("SERVER "):
            _, pid, _port, pidfile = line.split()
            return p, int(pid), Path(pidfile)
    p.kill()
    raise AssertionError("the run did not start its server")


def test_a_server_left_by_a_sigkilled_run_is_found_and_stopped(tmp_path):
    env = {**os.environ, "HANDS_ON_CACHE": str(tmp_path / "cache")}
    run, server, pidfile = _start_run(tmp_path, env)
    try:
        assert pidfile.parent == tmp_path / "cache" / "servers" / "killed_run" and pidfile.is_file()
        # a second server of the same script while that run is alive: its server is left alone
        with fake(tmp_path / "b", pidfile=pidfile.parent / "other.pid"):
            assert procs.alive(server)
        run.send_signal(signal.SIGKILL)                         # no handler runs: the server stays behind
        run.wait(10)
        time.sleep(0.2)
        assert procs.alive(server) and pidfile.is_file()
        said = []
        srv = fake(tmp_path / "c", pidfile=pidfile.parent / "next.pid")
        srv.echo = said.append
        with srv:                                               # the next run of the script finds it and stops it
            assert not procs.alive(server) and not pidfile.exists()
        assert any("left behind by a killed run" in m for m in said)
    finally:
        if procs.alive(run.pid):
            run.kill()
        if procs.alive(server):
            os.killpg(server, signal.SIGKILL)                  # the group this test's run started
        run.stdout.close()


# ------------------------------------------------------------------ the gate of a server started early

GATED_CHILD = '''
import multiprocessing as mp, time
from importlib.metadata import entry_points
def plugins():                      # what SGLang's load_plugins() does: every general plugin, called
    for ep in entry_points(group="sglang.srt.plugins"):
        ep.load()()
def child():
    plugins()
    print("child went on", flush=True)
if __name__ == "__main__":
    t = time.time()
    plugins()                        # the launcher process: never held
    print(f"parent went on after {time.time() - t:.2f} s", flush=True)
    mp.set_start_method("spawn")
    p = mp.Process(target=child)
    p.start()
    p.join()
'''


def test_the_gate_holds_the_scheduler_not_the_launcher_until_released(tmp_path):
    gate = sg.Gate(tmp_path / "gate")
    (tmp_path / "app.py").write_text(GATED_CHILD)
    env = {**os.environ, **gate.env()}
    proc = subprocess.Popen([sys.executable, str(tmp_path / "app.py")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    assert proc.poll() is None                                  # the child is held
    gate.release()
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "child went on" in out
    assert float(re.search(r"parent went on after ([\d.]+) s", out)[1]) < 0.5
    held = float(re.search(r"hands-on gate: released after ([\d.]+) s", err)[1])
    assert held >= 1.0 and "hands-on gate: holding the scheduler" in err
    # the phases of a gated start read those lines; without HANDS_ON_GATE the plugin does nothing
    env.pop("HANDS_ON_GATE")
    quick = subprocess.run([sys.executable, str(tmp_path / "app.py")], env=env, capture_output=True, text=True,
                           timeout=30)
    assert "child went on" in quick.stdout and "hands-on gate" not in quick.stderr


def _gated_app(tmp_path, gate, **env):
    (tmp_path / "app.py").write_text(GATED_CHILD)
    return subprocess.Popen([sys.executable, str(tmp_path / "app.py")], env={**os.environ, **gate.env(), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_gate_fails_closed_when_its_holder_dies(tmp_path):
    """The holder (a stand-in for 08's run) is SIGKILLed while the scheduler is held: the scheduler exits at once,
    never going on (before: held until HANDS_ON_GATE_TIMEOUT, an hour, then it went on to the GPU)."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        gate = sg.Gate(tmp_path / "gate", holder=holder.pid)
        assert gate.env()["HANDS_ON_GATE_HOLDER"].startswith(f"{holder.pid}:")
        proc = _gated_app(tmp_path, gate, HANDS_ON_GATE_TIMEOUT="60")
        time.sleep(1.5)
        assert proc.poll() is None                                  # held while its holder lives
        holder.kill()
        holder.wait()
        out, err = proc.communicate(timeout=10)                     # the app ends: its child exited at once
    finally:
        holder.kill()
    assert "child went on" not in out, out
    (line,) = [ln for ln in err.splitlines() if "hands-on gate: closed" in ln]
    assert re.search(rf"hands-on gate: closed: its holder \(pid {holder.pid}\) is gone, so the scheduler exits after "
                     r"[\d.]+ s, before it touches the GPU$", line), line
    assert gate.closed().startswith(f"its holder (pid {holder.pid}) is gone")
    with pytest.raises(sg.GateError, match="started without being held by its gate"):
        gate.verify()


def test_the_gate_fails_closed_on_its_timeout(tmp_path):
    """No release within HANDS_ON_GATE_TIMEOUT while the holder lives: the scheduler exits (before: it went on to the
    GPU without a word while the run still measured, and the start breakdown said it was held until the GPU was free)."""
    gate = sg.Gate(tmp_path / "gate")
    proc = _gated_app(tmp_path, gate, HANDS_ON_GATE_TIMEOUT="1")
    out, err = proc.communicate(timeout=30)
    assert "child went on" not in out and "released after" not in err, out + err
    assert re.search(r"hands-on gate: closed: not released within 1 s \(HANDS_ON_GATE_TIMEOUT\), so the scheduler "
                     r"exits after 1\.\d s, before it touches the GPU", err), err
    assert [p["phase"] for p in sg.startup_breakdown(err, time.time() - 5)].count("gate") == 0   # never "held until free"


def test_the_gate_verifies_the_hold(tmp_path):
    """verify(): the seconds held, from the file the gate wrote when it let the scheduler through after the release;
    a start without it (the plugin not loaded) is a GateError."""
    gate = sg.Gate(tmp_path / "gate")
    proc = _gated_app(tmp_path, gate)
    said = []                                   # until the hold begins (its start can take a while on a loaded machine)
    while not said or ("hands-on gate: holding" not in said[-1] and said[-1]):
        said.append(proc.stderr.readline())
    assert "hands-on gate: holding" in said[-1], said
    time.sleep(1.0)
    gate.release()
    proc.communicate(timeout=30)
    assert gate.verify() >= 0.9
    again = sg.Gate(tmp_path / "gate")                              # a new gate forgets the last one's files
    with pytest.raises(sg.GateError, match=r"started without being held by its gate \(no passed-<pid>.json in "):
        again.verify()


# ------------------------------------------------------------------ bench_serving in one worker process

FAKE_BENCH = '''
import argparse, json, os, sys, time
time.sleep(float(os.environ.get("FAKE_IMPORT_S") or 0))      # a slow import, as sglang's (~20 s)
def cli_main():
    p = argparse.ArgumentParser()
    p.add_argument("--output-file", required=True)
    p.add_argument("--num-prompts", type=int, default=1)
    p.add_argument("--sleep", type=float, default=0)
    p.add_argument("--fail", action="store_true")
    p.add_argument("--die", action="store_true")
    a, _ = p.parse_known_args()
    print("stand-in bench_serving in pid", os.getpid())
    if a.die:
        os._exit(9)
    time.sleep(a.sleep)
    if a.fail:
        raise RuntimeError("boom")
    rec = {}
    if os.environ.get("FAKE_BENCH_RECORD"):        # a real bench_serving record (tests/fixtures)
        rec = json.loads(open(os.environ["FAKE_BENCH_RECORD"]).readline())
    with open(a.output_file, "a") as f:
        f.write(json.dumps({**rec, "pid": os.getpid(), "completed": a.num_prompts}) + "\\n")
'''


def _worker(tmp_path, record=None, import_s=0.0):
    (tmp_path / "fakebench.py").write_text(FAKE_BENCH)
    env = {"PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}", "FAKE_BENCH_RECORD": str(record or ""),
           "FAKE_IMPORT_S": str(import_s)}
    return sg.BenchWorker(env, tmp_path / "worker.log", echo=lambda *_: None, module="fakebench")


def _out(tmp_path, name):
    return json.loads((tmp_path / f"{name}.jsonl").read_text().splitlines()[-1])


def test_bench_worker_runs_many_benchmarks_in_one_process(tmp_path):
    w = _worker(tmp_path)
    try:
        assert w.run(["--output-file", tmp_path / "a.jsonl", "--num-prompts", "8"], tmp_path / "a.log") == 0
        pid = w.pid
        assert w.run(["--output-file", tmp_path / "b.jsonl"], tmp_path / "b.log") == 0
        assert _out(tmp_path, "a")["pid"] == _out(tmp_path, "b")["pid"] == pid        # imported once
        log = (tmp_path / "b.log").read_text()
        assert log.startswith(f"$ {sys.executable} -m fakebench --output-file") and "run 2)" in log
        assert f"stand-in bench_serving in pid {pid}" in log and not list(tmp_path.glob("*.done"))
        # a failing run: its exit code and traceback, and the worker goes on
        assert w.run(["--output-file", tmp_path / "c.jsonl", "--fail"], tmp_path / "c.log") == 1
        assert "RuntimeError: boom" in (tmp_path / "c.log").read_text()
        assert w.run(["--output-file", tmp_path / "d.jsonl", "--bogus"], tmp_path / "d.log") == 0   # unknown args kept
        assert w.run(["--num-prompts", "x"], tmp_path / "e.log") == 2                  # argparse's exit code
        assert w.pid == pid
    finally:
        w.stop()
    assert not procs.alive(pid)


def test_a_warmed_bench_worker_pays_only_what_is_left_of_its_import(tmp_path):
    cold = _worker(tmp_path, import_s=1.0)
    try:
        assert cold.run(["--output-file", tmp_path / "a.jsonl"], tmp_path / "a.log") == 0
        assert cold.last["start_s"] >= 0.9 and cold.last["wall_s"] >= cold.last["start_s"]     # waited for it
        assert cold.run(["--output-file", tmp_path / "b.jsonl"], tmp_path / "b.log") == 0
        assert cold.last["start_s"] == 0.0 and cold.last["import_s"] is None                   # paid once
    finally:
        cold.stop()
    warm = _worker(tmp_path, import_s=1.0).warm()
    try:
        time.sleep(1.6)                                         # other work while it imports
        assert warm.run(["--output-file", tmp_path / "c.jsonl"], tmp_path / "c.log") == 0
        assert warm.last["start_s"] < 0.3 and warm.last["wall_s"] < 0.9                      # the import was done
        assert 0.9 <= warm.last["import_s"] < 1.6                  # ... and still counted whole (spawn -> import)
    finally:
        warm.stop()


def test_bench_worker_timeout_or_death_stops_it_and_the_next_run_starts_a_new_one(tmp_path):
    w = _worker(tmp_path)
    try:
        with pytest.raises(procs.ProcError, match="did not finish within 1 s"):
            w.run(["--output-file", tmp_path / "a.jsonl", "--sleep", "30"], tmp_path / "a.log", timeout=1)
        assert w.group is None
        assert w.run(["--output-file", tmp_path / "b.jsonl"], tmp_path / "b.log") == 0
        pid = w.pid
        with pytest.raises(procs.ProcError, match=r"worker exited \(code 9\)"):
            w.run(["--output-file", tmp_path / "c.jsonl", "--die"], tmp_path / "c.log")
        assert not procs.alive(pid)
        assert w.run(["--output-file", tmp_path / "d.jsonl"], tmp_path / "d.log") == 0 and w.pid != pid
    finally:
        w.stop()


def test_run_bench_goes_through_the_servers_worker_which_stops_with_the_server(tmp_path, fixture_path):
    srv = fake(tmp_path)
    srv._bench = _worker(tmp_path, fixture_path("sglang_bench_serving_random_ids_rate32_h200.jsonl"))
    with srv:
        rec = sg.run_bench(srv, tmp_path / "bench", "rate_8_0", num_prompts=32, input_len=512, output_len=64, rate=8,
                           echo=lambda *_: None)
        assert rec["completed"] == 32 and rec["_wall_s"] > 0
        pid = srv._bench.pid
        assert procs.alive(pid)
        # where its wall time went (issue #22 item 4): the first run paid the worker's start, the second did not
        first = sg.bench_timing(rec, "rate_8_0")
        again = sg.bench_timing(sg.run_bench(srv, tmp_path / "bench", "rate_8_1", num_prompts=32, input_len=512,
                                             output_len=64, rate=8, echo=lambda *_: None), "rate_8_1")
        assert (first["how"], first["worker_run"], again["worker_run"], again["start_s"]) == ("worker", 1, 2, 0.0)
        assert 0 < first["start_s"] < first["wall_s"] and first["run_s"] >= 0 and again["wall_s"] < first["wall_s"]
        assert first["duration_s"] == rec["duration"] and first["overhead_s"] == pytest.approx(
            first["wall_s"] - rec["duration"], abs=1e-3)
        with pytest.raises(ServerError, match="bench_serving bad failed"):   # no output file: one error naming the log
            sg.run_bench(srv, tmp_path / "bench", "bad", num_prompts=1, input_len=1, output_len=1,
                         echo=lambda *_: None, extra=("--fail",))
    assert not procs.alive(pid)


def _installed(path: str) -> bool:
    """Whether a file of an installed package is on sys.path, without importing it (this repository's
    own sglang/ folder would pass for a namespace package with find_spec)."""
    return any((Path(p or ".") / path).is_file() for p in sys.path)


@pytest.mark.stack
@pytest.mark.skipif(not (_installed("sglang/benchmark/serving.py") and importlib.util.find_spec("tokenizers")),
                    reason="SGLang is not installed here (it is on the GPU machine)")
def test_bench_worker_drives_the_real_bench_serving_like_its_command_line(tmp_path):
    """Where SGLang is installed: the real ``sglang.benchmark.serving``, run twice in one worker against
    the stand-in server with a synthetic tokenizer, gives the record its own command line gives."""
    from common.capture import models
    model = models.write_model_dir("tiny-llama", tmp_path / "model")
    srv = Server(str(model), [], log_path=tmp_path / "server.log", launcher=[sys.executable, str(FAKE)],
                 echo=lambda *_: None, start_timeout=30, stop_timeout=3, pidfile=tmp_path / "server.pid")
    kw = dict(num_prompts=5, input_len=24, output_len=6, rate="inf", echo=lambda *_: None, timeout=300)
    keys = ("completed", "total_input_tokens", "total_output_tokens", "random_input_len", "random_output_len")
    with srv:
        a = sg.run_bench(srv, tmp_path / "bench", "a", **kw)
        pid = srv._bench.pid
        b = sg.run_bench(srv, tmp_path / "bench", "b", **{**kw, "num_prompts": 3, "output_len": 2})
        assert srv._bench.pid == pid and srv._bench.runs == 2                      # one process, two runs
        cmd = sg.bench_cmd(srv, tmp_path / "c.jsonl", num_prompts=5, input_len=24, output_len=6, rate="inf")
        subprocess.run(cmd, env={**os.environ, **sg.tool_env(srv.model_path)}, check=True, timeout=300,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        c = sg.read_bench_jsonl(tmp_path / "c.jsonl")[-1]
    assert not procs.alive(pid)                                                    # stopped with the server
    assert [a[k] for k in keys] == [c[k] for k in keys] == [5, 5 * 24, 5 * 6, 24, 6]
    assert a["input_lens"] == c["input_lens"] and a["output_lens"] == c["output_lens"]   # same seed, same requests
    assert [b[k] for k in keys] == [3, 3 * 24, 3 * 2, 24, 2]                       # no state kept between runs
    assert "Benchmark duration" in (tmp_path / "bench" / "a.log").read_text()


# launch_server flags written outside flags(): (file under sglang/scripts, flag)
LITERAL_SERVER_FLAGS = (("_sgl_facts.py", "--load-format"), ("_sgl_facts.py", "--mem-fraction-static"),
                        ("_sgl_facts.py", "--disable-prefill-cuda-graph"), ("_sgl_facts.py", "--disable-decode-cuda-graph"),
                        ("_sgl_facts.py", "--disable-cuda-graph"), ("04_nsys_profile.py", "--disable-overlap-schedule"))


SERVING_FLAGS_OWN = {"quick", "backend", "pool", "write"}   # serving_flags()'s own keywords; the rest go to flags()


def _server_flags_in_scripts() -> set[str]:
    """Every launch_server flag the SGLang scripts pass: the keywords of their flags(...) calls and the
    extra keywords of their serving_flags(...) calls, and the literal ones above (each checked to be still
    in its file, so the list cannot go stale)."""
    import ast
    out = set()
    for f in SCRIPTS.glob("*.py"):
        for n in ast.walk(ast.parse(f.read_text())):
            name = getattr(n.func, "attr", getattr(n.func, "id", None)) if isinstance(n, ast.Call) else None
            if name in ("flags", "serving_flags"):
                out |= {"--" + k.arg.replace("_", "-") for k in n.keywords
                        if k.arg and not (name == "serving_flags" and k.arg in SERVING_FLAGS_OWN)}
    for name, flag in LITERAL_SERVER_FLAGS:
        assert f'"{flag}"' in (SCRIPTS / name).read_text(), f"{flag} is no longer in {name}: update the list"
        out.add(flag)
    return out


def test_server_flags_in_scripts_are_collected():
    got = _server_flags_in_scripts()
    assert {"--attention-backend", "--tp-size", "--enable-metrics", "--load-format"} <= got and len(got) >= 15
    assert {"--schedule-policy", "--max-total-tokens", "--cuda-graph-max-bs-decode", "--random-seed"} <= got


@pytest.mark.stack
@pytest.mark.skipif(not _installed("sglang/srt/server_args.py"), reason="SGLang is not installed here")
def test_every_server_flag_the_scripts_pass_is_one_launch_server_takes():
    """A renamed or removed launch_server option (an SGLang upgrade) fails here, on a CPU, not minutes
    into a GPU run."""
    import argparse
    from sglang.srt.server_args import ServerArgs
    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    known = {o for a in p._actions for o in a.option_strings}
    assert sorted(_server_flags_in_scripts() - known) == []


def test_every_name_taken_from_the_sglang_helper_is_there():
    """_sglang is the face of its rooms (_sgl_facts, _sgl_logs, ...): it names each name it hands on. Every `sg.<name>`
    a script, a test or common/ uses (where `sg` is _sglang) must be one of them (a name that only a GPU run would
    reach fails here, on the CPU). A file name such as "sg.json" is no use of the module."""
    import re
    root = SCRIPTS.parents[1]
    used = {}
    for f in [*root.glob("sglang/scripts/*.py"), *root.glob("tests/*.py"), *root.glob("common/**/*.py")]:
        text = f.read_text()
        for alias in set(re.findall(r"import _sglang as (\w+)", text)):
            for name in re.findall(rf"(?<![\w./\"'])\b{alias}\.(\w+)", text):
                used.setdefault(name, f.name)
    assert len(used) > 40, used            # the scan found the helper's users
    assert [f"{n} (used in {f})" for n, f in sorted(used.items()) if not hasattr(sg, n)] == []

