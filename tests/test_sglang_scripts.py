"""The SGLang track's scripts: --help everywhere, a clean one-line exit where SGLang is missing, and
the pure logic inside the scripts (ITL per token position, fits, joins, stage mapping, configs).
Fixtures: see tests/test_sglang_serving.py."""
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common import serving, trace

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "sglang" / "scripts"
PY = sorted(p for p in SCRIPTS.glob("*.py"))
SH = sorted(SCRIPTS.glob("[0-9][0-9]_*.sh"))


def load(name: str):
    spec = importlib.util.spec_from_file_location(name.replace(".py", "").lstrip("0123456789_") or name, SCRIPTS / name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("script", PY, ids=lambda p: p.name)
def test_python_help_runs_without_gpu_packages(script):
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--quick" in out.stdout and "--out" in out.stdout


@pytest.mark.parametrize("script", SH, ids=lambda p: p.name)
def test_shell_help(script):
    out = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Usage" in out.stdout


def test_expected_scripts_exist():
    names = {p.name for p in SCRIPTS.iterdir()}
    for n in ("00_check_env.py", "01_baseline_perf.py", "02_radix_cache_analysis.py", "03_backend_comparison.py",
              "04_nsys_profile.sh", "05_ncu_attention.sh", "06_full_pipeline.sh", "07_tp_scaling.sh"):
        assert n in names


@pytest.mark.skipif(serving.sglang_installed(), reason="sglang is installed here: the scripts would really serve")
@pytest.mark.parametrize("script", ["01_baseline_perf.py", "02_radix_cache_analysis.py", "03_backend_comparison.py",
                                    "_nsys_profile.py", "_ncu_attention.py", "_tp_scaling.py"])
def test_missing_stack_is_one_line_and_exit_2(script, tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPTS / script), "--quick", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and out.stderr.strip().startswith("[setup]")
    assert len(out.stderr.strip().splitlines()) == 1


def test_pipeline_rejects_unknown_flags():
    out = subprocess.run(["bash", str(SCRIPTS / "06_full_pipeline.sh"), "--bogus"], capture_output=True, text=True)
    assert out.returncode == 2 and "unknown flag" in out.stderr


# ------------------------------------------------------------------ 01: ITL by token position, fits

def _stream(t_first, itls, t_send=0.0):
    return {"meta_info": {"completion_tokens": len(itls) + 1},
            "client": {"t_send": t_send, "t_first": t_first, "t_done": t_first + sum(itls), "itl_s": itls,
                       "ttft_s": t_first - t_send, "e2e_s": t_first + sum(itls) - t_send}}


def test_itl_rows_start_when_the_whole_batch_decodes():
    m = load("01_baseline_perf.py")
    early = _stream(0.10, [0.01] * 10)          # first token at 0.10, while the other is still prefilling
    late = _stream(0.15, [0.02] * 10)
    rows = m.itl_rows([early, late, {"error": "x"}], batch=2, prompt_len=100)
    # early's tokens before t=0.15 are dropped (token i's ITL counts once its previous token is >= 0.15)
    assert rows[0]["token"] == 1 and rows[0]["requests"] == 1 and rows[0]["itl_ms"] == pytest.approx(20.0)
    both = [r for r in rows if r["requests"] == 2]
    assert both and both[0]["itl_ms"] == pytest.approx(15.0)
    assert rows[0]["kv_tokens"] == 2 * (100 + 1)


def test_linear_fit_and_rise():
    m = load("01_baseline_perf.py")
    s, b, r2 = m.linear_fit([1, 2, 3, 4], [3, 5, 7, 9])
    assert (s, b, r2) == pytest.approx((2.0, 1.0, 1.0))
    assert m.linear_fit([1, 2], [1, 2])[0] != m.linear_fit([1, 2], [1, 2])[0]     # NaN with < 3 points
    rows = [{"token": i, "itl_ms": 10.0 if i <= 16 else 12.5} for i in range(1, 129)]
    assert m.rise_pct(rows) == pytest.approx(25.0)


def test_family_table_on_real_trace(fixture_path):
    m = load("01_baseline_perf.py")
    steps = serving.steps_from_trace(trace.read_chrome_trace(fixture_path("sglang_server_trace_llama8b_h200_cut.json")))
    fam = m.family_table(steps)
    assert fam[0]["family"] == "gemm" and sum(r["prefill_pct"] for r in fam) == pytest.approx(100.0)
    assert all(r["decode_us_per_step"] == 0 for r in fam)           # the trace holds no decode step
    assert "cpu" not in {r["family"] for r in fam}


# ------------------------------------------------------------------ 02: hit rate three ways

def test_hit3_on_real_log_lines(fixture_path):
    m = load("02_radix_cache_analysis.py")
    rows = serving.parse_batch_log(fixture_path("sglang_server_log_under_load_llama8b_dummy_h200.log").read_text())
    pre = [r for r in rows if r["kind"] == "prefill" and not serving.is_probe(r)][:5]
    meta = [{"prompt_tokens": r["new_token"] + r["cached_token"], "cached_tokens": r["cached_token"]} for r in pre]
    c, p = sum(x["cached_tokens"] for x in meta), sum(x["prompt_tokens"] for x in meta)
    before = serving.parse_metrics('sglang:cached_tokens_total{a="1"} 0\nsglang:prompt_tokens_total{a="1"} 0\n')
    after = serving.parse_metrics(f'sglang:cached_tokens_total{{a="1"}} {c}\nsglang:prompt_tokens_total{{a="1"}} {p}\n')
    h = m.hit3(meta, pre, before, after)
    assert h["meta_info"] == pytest.approx(c / p) == pytest.approx(h["log"]) == pytest.approx(h["metrics_requests"])


# ------------------------------------------------------------------ 03 / 04 / 05 / 07 pure helpers

def test_matched_prefix_and_sharegpt_file(tmp_path):
    m = load("03_backend_comparison.py")
    assert m.matched_prefix([1, 2, 3], [1, 2, 4]) == 2 and m.matched_prefix([1], [1]) == 1 and m.matched_prefix([], [5]) == 0
    prompts = [serving.random_text(511, 90_000 + i) for i in range(20)]
    f = m.sharegpt_file(tmp_path / "sg.json", prompts)
    data = json.loads(f.read_text())
    # what sglang.benchmark.datasets.sharegpt reads: conversations[0/1]["value"], >= 2 turns, completion >= 2 chars
    pairs = [(d["conversations"][0]["value"], d["conversations"][1]["value"]) for d in data if len(d["conversations"]) >= 2]
    assert [p for p, _ in pairs] == prompts and all(len(c) >= 2 for _, c in pairs)
    assert len({p[:32] for p in prompts}) == 20 and all(p.isascii() for p in prompts)   # no shared prefix; 1 char = 1 token


def test_offline_bar_cli_runs_the_engines_config(tmp_path, monkeypatch):
    monkeypatch.setenv("HANDS_ON_CACHE", str(tmp_path))     # the preset's model dir goes here
    m = load("03_backend_comparison.py")
    args = m.parse_args(["--quick"])
    _, base = serving.model_and_flags(args)
    assert "--disable-prefill-cuda-graph" in base            # --quick servers skip the prefill capture
    cli = m.cli_flags(base)
    assert "--disable-prefill-cuda-graph" not in cli         # ... the bar's CLI must not (the Engine captures)
    assert cli == [f for f in base if f != "--disable-prefill-cuda-graph"] and "--load-format" in cli


def test_timeline_analysis_on_real_trace(fixture_path):
    m = load("_nsys_profile.py")
    ev = trace.read_chrome_trace(fixture_path("sglang_server_trace_llama8b_h200_cut.json"))
    k = trace.kernels(ev)
    ranges = ev[(ev["kind"] == "user_annotation") & ev["name"].str.startswith("scheduler.")]
    a = m.analyse(k, ranges, "t")
    assert a["kernels"] == len(k) and 0 < a["busy"] <= 1 and a["families"].index[0] == "gemm"
    assert set(a["gaps"]["phase"]) <= {"scheduler.run_batch", "none", "-"}      # "-": gaps < 20 us
    assert m.phase_name(":scheduler.run_batch") == "scheduler.run_batch"
    assert m.cpu_phase_at(ranges, -1.0) == "none"


def test_ncu_stage_mapping():
    m = load("_ncu_attention.py")
    assert m.stage_of("PrefillWithKVCacheKernel", "flashinfer") == "prefill"
    assert m.stage_of("BatchPrefillWithPagedKVCacheKernel", "flashinfer") == "decode"
    assert m.stage_of("_fwd_grouped_kernel_stage1", "triton") == "decode"
    assert m.stage_of("_fwd_kernel", "triton") == "prefill"
    assert m.stage_of("x", "fa3") == "unknown"


def test_tp_configs():
    m = load("_tp_scaling.py")
    assert m.parse_configs("llama-3.1-8b:1,2;llama-3.1-70b:4") == [("llama-3.1-8b", 1), ("llama-3.1-8b", 2),
                                                                   ("llama-3.1-70b", 4)]
    from common.checks import SetupError
    with pytest.raises(SetupError):
        m.parse_configs("gpt-9:2")
    with pytest.raises(SetupError):
        m.parse_configs("llama-3.1-8b")


def test_wait_file_waits_for_a_finished_report(tmp_path):
    import threading
    m = load("_nsys_profile.py")
    f = tmp_path / "t.nsys-rep"
    assert not m.wait_file(f, timeout=1.0, still_s=0.2)                 # never written
    def writer():
        for _ in range(4):
            with open(f, "ab") as fh:
                fh.write(b"x" * 100)
            time.sleep(0.3)
    th = threading.Thread(target=writer)
    t0 = time.time()
    th.start()
    assert m.wait_file(f, timeout=10, still_s=0.6)
    th.join()
    assert f.stat().st_size == 400 and time.time() - t0 >= 0.9           # returned only after the last write


# sglang_nsys_cuda_gpu_trace_cut_h200.csv / sglang_nsys_nvtx_pushpop_cut_h200.csv: `nsys stats --report
# cuda_gpu_trace,nvtx_pushpop_trace --format csv` of the real 04_nsys_profile.sh --quick run (H200, commit
# 46ebaf8: nsys --cuda-graph-trace=node, SGLANG_ENABLE_NVTX_SCHEDULER=1), cut to the 21 ms around the last
# prefill kernel (the columns Start, Duration, CorrId, Strm, Name kept; NVTX: Start, End, Duration, Name,
# PID, TID, Lvl): one prefill step's tail between CUDA-graph decode replays.
def _nsys_folder(tmp_path, fixture_path, drop_corr=False):
    import shutil
    d = tmp_path / "run"
    d.mkdir(parents=True)
    gt = d / "timeline_overlap_on_cuda_gpu_trace.csv"
    shutil.copy(fixture_path("sglang_nsys_cuda_gpu_trace_cut_h200.csv"), gt)
    if drop_corr:
        import pandas as pd
        pd.read_csv(gt).drop(columns=["CorrId"]).to_csv(gt, index=False)
    shutil.copy(fixture_path("sglang_nsys_nvtx_pushpop_cut_h200.csv"), d / "timeline_overlap_on_nvtx_pushpop_trace.csv")
    return d


def test_04_reanalysis_splits_prefill_and_decode_by_graph_replays(tmp_path, fixture_path):
    m = load("_nsys_profile.py")
    (a,) = m.reanalyse(_nsys_folder(tmp_path, fixture_path))
    assert a["tool"] == "nsys" and a["kernels"] > 500 and a["split_by"].startswith("CUDA-graph")
    assert "PrefillWithKVCacheKernel" in a["prefill_only_attention"]                       # ragged, eager
    assert "BatchPrefillWithPagedKVCacheKernel" in a["decode_attention"]                   # tensor-core decode, in graphs
    assert "PrefillWithKVCacheKernel" not in a["decode_attention"]
    assert set(a["ranges"]["name"]) <= set(m.PHASES) and len(a["ranges"]) > 0
    # without correlation ids the split falls back to time, and says so
    (b,) = m.reanalyse(_nsys_folder(tmp_path / "b", fixture_path, drop_corr=True))
    assert b["split_by"].startswith("time")
    with pytest.raises(m.SetupError, match="no timeline_"):
        m.reanalyse(tmp_path)


def test_04_reanalyse_cli_writes_a_run(tmp_path, fixture_path):
    src = _nsys_folder(tmp_path, fixture_path)
    (src / "summary.json").write_text(json.dumps({          # the recording run's summary, as 04 writes it
        "provenance": {"gpu": "NVIDIA H200", "gpu_count": 1, "git": {"commit": "46ebaf8"}, "command": "_nsys_profile.py --quick"},
        "args": {"quick": True, "preset": "llama-3.1-8b", "backend": "flashinfer"}}))
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(SCRIPTS / "_nsys_profile.py"), "--reanalyse", str(src), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "ok" and any(o["verdict"] == "confirmed" and "prefill only" in o["observed"]
                                       for o in s["observations"])
    assert (out / "timeline_overlap_on_cuda_gpu_trace.csv").exists() and (out / "kernels.csv").exists()
    p = s["provenance"]
    assert p["gpu"] == "NVIDIA H200" and p["git"]["commit"] == "46ebaf8" and "--reanalyse" in p["reanalysed"]["command"]
    assert s["story"].startswith("SYSTEM TIMELINE — llama-3.1-8b, flashinfer, burst 16 x (512 in, 64 out)")


# sglang_tp_runs_4xh200.csv, sglang_tp_allreduce_kernels_4xh200.csv, nvidia_smi_topo_4xh200.txt: tp_runs.csv,
# allreduce_kernels.csv and topology.txt of the real `07_tp_scaling.sh --quick --configs
# 'llama-3.1-8b:1,4;llama-3.1-70b:4' --time-budget 7` run on 4x H200 (NV18 between every pair), commit fea9650.
def test_07_reanalysis_of_a_real_4gpu_run(tmp_path, fixture_path):
    import shutil
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(fixture_path("sglang_tp_runs_4xh200.csv"), src / "tp_runs.csv")
    shutil.copy(fixture_path("sglang_tp_allreduce_kernels_4xh200.csv"), src / "allreduce_kernels.csv")
    shutil.copy(fixture_path("nvidia_smi_topo_4xh200.txt"), src / "topology.txt")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(SCRIPTS / "_tp_scaling.py"), "--reanalyse", str(src), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    v = {o["expected"].split(" (")[0].split(":")[-1].strip(): (o["verdict"], o["observed"]) for o in s["observations"]}
    custom = next(x for k, x in v.items() if k.startswith("decode all-reduces"))
    assert custom[0] == "confirmed" and "all_reduce_kernel" in custom[1] and "all-gather: ncclDevKernel_AllGather" in custom[1]
    assert next(x for k, x in v.items() if k.startswith("the custom all-reduce spends less"))[0] == "confirmed"
    topo = next(x for k, x in v.items() if k.startswith("the plan's box"))
    assert topo[0] == "refuted" and "6 of 6 GPU pairs on NVLink (NV18)" in topo[1]
    ak = (out / "allreduce_kernels.csv").read_text()
    assert ak == fixture_path("sglang_tp_allreduce_kernels_4xh200.csv").read_text()        # kept, not regrouped
    assert s["headline"]["itl_b1_ms_llama-3.1-8b_tp4_nccl"] > 0 and (out / "tp_scaling.png").exists()
    assert s["story"].startswith("TENSOR PARALLEL SCALING — ")
    m = load("_tp_scaling.py")
    with pytest.raises(m.SetupError, match="no tp_runs.csv"):
        m.main_reanalyse(m.parse_args(["--reanalyse", str(tmp_path / "none")]))


def test_07_merge_keeps_earlier_rows_marked_and_replaces_remeasured(tmp_path, fixture_path):
    """--merge: an earlier run's rows join this run's, marked with when they were measured; a
    configuration measured again replaces the old row (real 4x H200 rows, fea9650)."""
    import shutil
    pd = pytest.importorskip("pandas")
    src = tmp_path / "old"
    src.mkdir()
    shutil.copy(fixture_path("sglang_tp_runs_4xh200.csv"), src / "tp_runs.csv")
    shutil.copy(fixture_path("sglang_tp_allreduce_kernels_4xh200.csv"), src / "allreduce_kernels.csv")
    (src / "summary.json").write_text(json.dumps({"provenance": {"date_utc": "2026-11-21T13:40:00Z", "git": {"commit": "fea9650"}}}))
    m = load("_tp_scaling.py")
    old, akd, prev = m.load_merge(src, pd)
    assert set(old["measured"]) == {"2026-11-21T13:40 @ fea9650"} and len(akd) and prev["provenance"]["git"]
    now = old[(old["model"] == "llama-3.1-8b") & (old["tp"] == 4) & old["custom_allreduce"]].copy()
    now["itl_b1_ms"] = 1.0
    now["measured"] = "this run"
    now = pd.concat([now, now.assign(tp=2)], ignore_index=True)
    both = m.merge_rows(now, old)
    assert len(both) == len(old) + 1                                      # TP 2 added, TP 4 replaced
    tp4 = both[(both["model"] == "llama-3.1-8b") & (both["tp"] == 4) & both["custom_allreduce"]]
    assert list(tp4["measured"]) == ["this run"] and list(tp4["itl_b1_ms"]) == [1.0]
    assert (both[both["measured"] != "this run"]["tp"] != 2).all()
    both.to_csv(src / "tp_runs.csv", index=False)              # merging a merged run: its own rows get its tag
    again, _, _ = m.load_merge(src, pd)
    assert "this run" not in set(again["measured"]) and set(again["measured"]) == {"2026-11-21T13:40 @ fea9650"}
    with pytest.raises(m.SetupError, match="no tp_runs.csv"):
        m.load_merge(tmp_path / "none", pd)
