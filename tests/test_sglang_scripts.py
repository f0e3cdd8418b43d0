"""The SGLang track's scripts: --help everywhere, one clear line for a missing stack or a bad value (before
any server starts), the verdicts of 01/02 judged on intervals, and the pure logic inside the scripts (ITL
per token position, fits, stage mapping, configs, re-analysis of recorded runs).
Fixtures: see tests/test_sglang_helpers.py and the comments below."""
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kit  # tests/kit.py
from common.tables import kernels, trace  # noqa: E402
from common.judge import bounds, verdicts  # noqa: E402
from common.run import steps  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "sglang" / "scripts"
sys.path.insert(0, str(SCRIPTS))
import _sglang as sg  # noqa: E402

PY = sorted(SCRIPTS.glob("[0-9][0-9]_*.py"))
SH = sorted(SCRIPTS.glob("[0-9][0-9]_*.sh"))
SERVING = ["01_baseline_perf.py", "02_radix_cache_analysis.py", "03_backend_comparison.py", "04_nsys_profile.py",
           "05_ncu_attention.py", "07_tp_scaling.py"]


def load(name: str):
    return kit.load_script(SCRIPTS / name, "sglang_" + name.replace(".py", ""))


class Recorder:
    """What a results.Run receives from a script's verdicts(): judged and observed records, headline figures."""

    def __init__(self):
        self.obs, self.head = [], {}

    def judge(self, h, values, evidence="", premise=True, **kw):
        rec = {**verdicts.judge(h, values, premise=premise, **kw), "evidence": evidence}
        self.obs.append(rec)
        return rec

    def observe(self, expected, observed, verdict, evidence=""):
        self.obs.append({"expected": expected, "observed": observed, "verdict": verdict, "evidence": evidence})

    def fact(self, h, holds, observed, evidence="", premise=True):
        rec = {**verdicts.judge_fact(h, holds, observed, premise=premise), "evidence": evidence}
        self.obs.append(rec)
        return rec["verdict"]

    def headline(self, **kw):
        self.head.update(kw)

    def by_id(self):
        return {o["hypothesis"]: o for o in self.obs if "hypothesis" in o}


# ------------------------------------------------------------------ every script answers, without a GPU

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


@pytest.mark.parametrize("script", [p for p in SH if p.name != "06_full_pipeline.sh"], ids=lambda p: p.name)
def test_wrappers_are_thin_and_run_their_numbered_script(script):
    text = script.read_text()
    assert len(text.splitlines()) <= 40 and "STEM_FILE" not in text
    assert script.with_suffix(".py").exists() and 'exec "${PYTHON:-python3}" "${BASH_SOURCE[0]%.sh}.py" "$@"' in text


def test_every_experiment_is_a_numbered_script():
    names = {p.name for p in SCRIPTS.iterdir()}
    for n in ("00_check_env.py", "01_baseline_perf.py", "02_radix_cache_analysis.py", "03_backend_comparison.py",
              "04_nsys_profile.py", "05_ncu_attention.py", "07_tp_scaling.py", "04_nsys_profile.sh",
              "05_ncu_attention.sh", "06_full_pipeline.sh", "07_tp_scaling.sh"):
        assert n in names
    rooms = {n for n in names if n.startswith("_sgl_") and n.endswith(".py")}      # _sglang's rooms, one noun each
    assert rooms == {"_sgl_facts.py", "_sgl_server.py", "_sgl_shared.py", "_sgl_logs.py", "_sgl_bench.py", "_sgl_stamps.py",
                     "_sgl_gate.py"}
    # a numbered script's phases in files of their own (_sglNN_<phase>.py: 01's pressure load, 08's phases), each
    # beside the script NN that conducts it
    phases = {n for n in names if re.fullmatch(r"_sgl\d\d_[a-z_]+\.py", n)}
    assert phases and all(any(m.startswith(p[4:6] + "_") for m in names) for p in phases)
    assert not [n for n in names if n.startswith("_") and n.endswith(".py") and n not in ("_sglang.py", "_steps.py")
                and n not in rooms | phases]
    assert not (ROOT / "common" / "serving.py").exists()
    assert not [p for p in SCRIPTS.glob("*.py") if "STEM_FILE" in p.read_text() or "common.serving" in p.read_text()]


@pytest.mark.skipif(sg.sglang_installed(), reason="sglang is installed here: the scripts would really serve")
@pytest.mark.parametrize("script", SERVING)
def test_missing_stack_is_one_line_and_exit_2(script, tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPTS / script), "--quick", "--out", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and out.stderr.strip().startswith("[setup] Python package 'sglang'")
    assert len(out.stderr.strip().splitlines()) == 1


def _python_without_pandas():
    for exe in ("/usr/bin/python3", shutil.which("python3")):
        if exe and subprocess.run([exe, "-c", "import pandas"], capture_output=True).returncode != 0:
            return exe
    return None


@pytest.mark.skipif(_python_without_pandas() is None, reason="every python3 here has pandas")
@pytest.mark.parametrize("script", ["04_nsys_profile.py", "07_tp_scaling.py"])
def test_missing_pandas_is_one_setup_line(script, tmp_path):
    out = subprocess.run([_python_without_pandas(), str(SCRIPTS / script), "--reanalyse", str(tmp_path), "--out",
                          str(tmp_path / "r")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().startswith("[setup] Python package(s) not importable: 'pandas' (pip install pandas)")
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


# ------------------------------------------------------------------ bad values: one line, exit 2, nothing started

BAD = [
    ("01_baseline_perf.py", ["--mem-fraction", "5"], "argument --mem-fraction: expected a fraction in (0, 1], got '5'"),
    ("01_baseline_perf.py", ["--mem-fraction", "0"], "argument --mem-fraction: expected a fraction in (0, 1], got '0'"),
    ("01_baseline_perf.py", ["--rates", "4,abc"],
     "argument --rates: expected request rates (positive numbers or 'inf') separated by commas, got '4,abc'"),
    ("01_baseline_perf.py", ["--port", "70000"], "argument --port: expected a TCP port in 1..65535, got '70000'"),
    ("02_radix_cache_analysis.py", ["--model-path", "/nonexistent"],
     "argument --model-path: '/nonexistent' is not a folder (give a local model folder with config.json and weights)"),
    ("02_radix_cache_analysis.py", ["--pool-tokens", "abc"],
     "argument --pool-tokens: expected positive integers separated by commas, got 'abc'"),
    ("02_radix_cache_analysis.py", ["--preset", "gpt-9"],
     "argument --preset: unknown model preset 'gpt-9'; choose from llama-3.1-70b, llama-3.1-8b, qwen2.5-7b, tiny-llama"),
    ("03_backend_comparison.py", ["--variants", "flashinfer,cuda"],
     "argument --variants: unknown value(s) cuda; choose from flashinfer, triton, fa3, flashinfer-cudacore-decode"),
    ("04_nsys_profile.py", ["--start-timeout", "-3"], "argument --start-timeout: expected a positive number, got '-3'"),
    ("05_ncu_attention.py", ["--decode-bs", "0"], "argument --decode-bs: expected a positive integer, got '0'"),
    ("05_ncu_attention.py", ["--backends", "flashinfer,xformers"],
     "argument --backends: unknown value(s) xformers; choose from flashinfer, triton, fa3"),
    ("07_tp_scaling.py", ["--configs", "llama-3.1-8b:-1"],
     "argument --configs: bad entry 'llama-3.1-8b:-1' (expected positive integers separated by commas, got '-1'); "
     "expected 'preset:tp,tp;preset:tp'"),
    ("07_tp_scaling.py", ["--configs", "gpt-9:2"],
     "argument --configs: bad entry 'gpt-9:2' (unknown model preset 'gpt-9'; choose from llama-3.1-70b, llama-3.1-8b, "
     "qwen2.5-7b, tiny-llama); expected 'preset:tp,tp;preset:tp'"),
    ("07_tp_scaling.py", ["--mem-fraction", "1.5"], "argument --mem-fraction: expected a fraction in (0, 1], got '1.5'"),
]


@pytest.mark.parametrize("script,argv,message", BAD, ids=[f"{s[:2]}{a[0]}={a[1]}" for s, a, _ in BAD])
def test_bad_values_stop_before_anything_starts(script, argv, message, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HANDS_ON_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, str(SCRIPTS / script), "--quick", "--out", str(tmp_path / "r"), *argv],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stderr.strip().splitlines()[-1] == f"{script}: error: {message}"
    assert "Traceback" not in out.stderr and not out.stdout
    assert not (tmp_path / "cache" / "servers").exists() and not (tmp_path / "r").exists()


def test_model_folder_without_config_json(tmp_path):
    (tmp_path / "m").mkdir()
    out = subprocess.run([sys.executable, str(SCRIPTS / "01_baseline_perf.py"), "--model-path", str(tmp_path / "m")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].endswith(f"'{tmp_path / 'm'}' has no config.json (is it a Hugging Face "
                                                        "model folder?)")


def test_the_quick_pipelines_shared_server_is_exactly_what_01_02_03_08_ask_for(tmp_path, monkeypatch):
    """Issue #22: with their default options and --quick, 01, 02's FCFS server, 03's FlashInfer variant and
    08 (FlashInfer) compute exactly the shared server's model, flags and environment, so they run on it;
    02's LPM pass, 03's other variants, 08 on FA3, --all and any --server-arg start their own, and the
    reason names the difference."""
    import os
    monkeypatch.setenv("HANDS_ON_CACHE", str(tmp_path))
    shared = sg.SharedServer(mode="quick")
    model, fl = shared.config(write=False)
    info = {"model_path": model, "flags": fl, "env": sg._sglang_env(shared.server_env), "pid": os.getpid()}

    def why(mf, env=sg.SERVING_ENV):
        return sg.why_not_shared(info, mf[0], mf[1], env)
    m01, m02, m03, m08 = (load(n) for n in ("01_baseline_perf.py", "02_radix_cache_analysis.py",
                                            "03_backend_comparison.py", "08_execution_story.py"))
    a = m01.parse_args(["--quick"])
    assert why(m01.server_flags(a, write=False)) is None
    assert why(m01.server_flags(m01.parse_args([]), write=False)).startswith("its flags differ from the shared "
                                                                             "server's: lacks --max-total-tokens")
    assert "adds --page-size 16" in why(m01.server_flags(m01.parse_args(["--quick", "--server-arg=--page-size 16"]),
                                                         write=False))
    a, pool = m02.parse_args(["--quick"]), m02.QUICK["pools"][0]
    assert why(m02.server_flags(a, "fcfs", pool, write=False)) is None
    assert why(m02.server_flags(a, "lpm", pool, write=False)).endswith("adds --schedule-policy lpm")
    assert "--max-total-tokens 16384 (shared: 32768)" in why(m02.server_flags(a, "fcfs", 16384, write=False))
    a = m03.parse_args(["--quick"])
    m, f, e = m03.server_flags(a, "flashinfer", write=False)
    assert why((m, f), e) is None
    m, f, e = m03.server_flags(a, "triton", write=False)
    assert why((m, f), e).endswith("--attention-backend triton (shared: flashinfer)")
    m, f, e = m03.server_flags(a, "flashinfer-cudacore-decode", write=False)
    assert why((m, f), e) == "its SGLANG_* environment differs: SGLANG_FLASHINFER_USE_TENSOR_CORE=false"
    a = m08.parse_args(["--quick"])
    P = {**m08.QUICK, "pool": a.pool or m08.QUICK["pool"]}
    assert why(m08.server_flags(a, P, "flashinfer", write=False), m08.ENV) is None
    assert why(m08.server_flags(a, P, None, write=False), m08.ENV).endswith("lacks --attention-backend flashinfer")
    # the real pipeline offers it to those four steps, in --quick only
    loaded, _notes, servers = steps.load_system(ROOT, "sglang")
    assert {s.name for s in loaded if s.server} == {"01_baseline_perf", "02_radix_cache_analysis",
                                                   "03_backend_comparison", "08_execution_story"}
    assert servers["default"].modes == ("quick",) and servers["default"].provider == "_sglang:SharedServer"


def test_the_held_lpm_and_triton_servers_are_exactly_what_02_and_03_ask_for(tmp_path, monkeypatch):
    """Issue #38: 02's LPM pass and 03's Triton variant run on the pipeline's held servers 'lpm' and 'triton' (their
    imports overlapped with the steps before): each server's model, flags and environment are exactly those the
    script computes with its default options and --quick, the other configurations' are not, and the pipeline
    offers each to its step only, in --quick only, launched when the run begins."""
    import os
    monkeypatch.setenv("HANDS_ON_CACHE", str(tmp_path))
    loaded, _notes, servers = steps.load_system(ROOT, "sglang")
    infos = {}
    for name, svc in servers.items():
        assert svc.held and svc.modes == ("quick",) and svc.provider == "_sglang:SharedServer", name
        h = sg.SharedServer(name, "quick", **svc.options)
        model, fl = h.config(write=False)
        infos[name] = {"model_path": model, "flags": fl, "env": sg._sglang_env(h.server_env), "pid": os.getpid()}
    m02, m03 = load("02_radix_cache_analysis.py"), load("03_backend_comparison.py")
    a, pool = m02.parse_args(["--quick"]), m02.QUICK["pools"][0]
    _m, lpm = m02.server_flags(a, "lpm", pool, write=False)
    _m, fcfs = m02.server_flags(a, "fcfs", pool, write=False)
    m, tri, env = m03.server_flags(m03.parse_args(["--quick"]), "triton", write=False)

    def fits(name, fl, e=sg.SERVING_ENV):
        return sg.why_not_shared(infos[name], m, fl, e) is None
    assert fits("lpm", lpm) and not fits("lpm", fcfs) and not fits("default", lpm)
    assert fits("triton", tri, env) and not fits("default", tri, env) and not fits("triton", fcfs)
    by = {s.name: s.servers for s in loaded}
    assert by["02_radix_cache_analysis"] == ("default", "lpm") and by["03_backend_comparison"] == ("default", "triton")
    assert by["01_baseline_perf"] == by["08_execution_story"] == ("default",)


def test_tp_configs_must_fit_the_visible_gpus(monkeypatch):
    from common.capture import gpu
    from common.base.checks import SetupError
    m = load("07_tp_scaling.py")
    assert m.configs("llama-3.1-8b:1,2;llama-3.1-70b:4") == [("llama-3.1-8b", 1), ("llama-3.1-8b", 2), ("llama-3.1-70b", 4)]
    monkeypatch.setattr(gpu, "gpus", lambda: [{"index": 0}, {"index": 1}])
    wanted = m.configs("llama-3.1-8b:1,2,4;llama-3.1-70b:2,4")
    have, fits, skipped = m.fitting(wanted, explicit=False)        # the defaults: run what fits
    assert have == 2 and fits == [("llama-3.1-8b", 1), ("llama-3.1-8b", 2), ("llama-3.1-70b", 2)]
    assert skipped == [("llama-3.1-8b", 4), ("llama-3.1-70b", 4)]
    with pytest.raises(SetupError, match=r"^--configs llama-3.1-8b:1, llama-3.1-8b:2, llama-3.1-8b:4, llama-3.1-70b:2, "
                       r"llama-3.1-70b:4 needs 4 GPUs; 2 visible"):
        m.fitting(wanted, explicit=True)                             # asked for: must fit, before any server
    monkeypatch.setattr(gpu, "gpus", lambda: [])
    with pytest.raises(SetupError, match="No NVIDIA GPU visible"):
        m.fitting(wanted, explicit=False)
    # NCCL only right after the first configuration at the largest TP that fits
    assert m.run_plan(fits, no_nccl=False) == [("llama-3.1-8b", 1, False), ("llama-3.1-8b", 2, False),
                                               ("llama-3.1-8b", 2, True), ("llama-3.1-70b", 2, False)]
    assert m.run_plan(fits, no_nccl=True) == [(p, t, False) for p, t in fits]


# ------------------------------------------------------------------ 01: ITL by token position, fits, verdicts on intervals

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


def test_01_says_what_the_bench_worker_saves():
    rows = [{"name": "control", "how": "own process", "worker_run": 0, "wall_s": 22.0, "duration_s": 3.0,
             "start_s": None, "run_s": None, "overhead_s": 19.0},
            {"name": "r0", "how": "worker", "worker_run": 1, "wall_s": 14.0, "duration_s": 3.0, "start_s": 10.0,
             "run_s": 3.5, "overhead_s": 11.0},
            *({"name": f"r{i}", "how": "worker", "worker_run": i + 1, "wall_s": 3.6, "duration_s": 3.0,
               "start_s": 0.0, "run_s": 3.5, "overhead_s": 0.6} for i in range(1, 7))]
    assert load("01_baseline_perf.py").bench_summary(rows) == {
        "bench_runs": 7, "bench_worker_start_s": 10.0, "bench_saved_s": 60.0, "bench_worker_overhead_s": 0.6,
        "bench_own_process_overhead_s": 19.0}


def test_01_counts_the_whole_import_of_a_worker_started_early():
    # BenchWorker.warm(): the first run waited 1.5 s of a 21 s import; every extra process would pay all 21 s
    rows = [{"name": "r0", "how": "worker", "worker_run": 1, "wall_s": 5.0, "duration_s": 3.0, "start_s": 1.5,
             "import_s": 21.0, "run_s": 3.4, "overhead_s": 2.0},
            *({"name": f"r{i}", "how": "worker", "worker_run": i + 1, "wall_s": 3.6, "duration_s": 3.0,
               "start_s": 0.0, "import_s": None, "run_s": 3.5, "overhead_s": 0.6} for i in range(1, 4))]
    assert load("01_baseline_perf.py").bench_summary(rows) == {
        "bench_runs": 4, "bench_worker_start_s": 1.5, "bench_worker_import_s": 21.0, "bench_saved_s": 63.0,
        "bench_worker_overhead_s": 0.6}


def test_linear_fit_and_rise():
    m = load("01_baseline_perf.py")
    s, b, r2 = m.linear_fit([1, 2, 3, 4], [3, 5, 7, 9])
    assert (s, b, r2) == pytest.approx((2.0, 1.0, 1.0))
    assert m.linear_fit([1, 2], [1, 2])[0] != m.linear_fit([1, 2], [1, 2])[0]     # NaN with < 3 points
    rows = [{"token": i, "itl_ms": 10.0 if i <= 16 else 12.5} for i in range(1, 129)]
    assert m.rise_pct(rows) == pytest.approx(25.0)


def test_class_table_and_request_figures_on_the_graph_trace(fixture_path):
    m = load("01_baseline_perf.py")
    _, steps = sg.steps(trace.read_chrome_trace(fixture_path("sglang_story_trace_graphs_llama8b_h200_cut.json.gz")))
    table = m.class_table(steps)
    assert table[0]["class"] == "gemm" and sum(r["prefill_pct"] for r in table) == pytest.approx(100.0)
    assert sum(r["decode_pct"] for r in table) == pytest.approx(100.0)
    f = m.request_figures({"steps": steps, "result": {"client": {"ttft_s": 0.030}}})
    assert f["prefill_gpu_ms"] == pytest.approx(steps[0]["dur_us"] / 1e3)
    assert f["cpu_share_pct"] == pytest.approx(100 * (1 - steps[0]["dur_us"] / 1e3 / 30.0))
    att = next(r["prefill_pct"] for r in table if r["class"] == "attention")
    assert 0 < att < 10                              # 512 tokens: GEMMs dominate (08 judges it: prefill-attention-share)


def _01_inputs(pd, reps=3):
    """The committed H200 run's numbers (analysis.md, 01 observations), as ``reps`` repetitions around them."""
    jit = [1.0, 0.97, 1.02][:reps]
    req = [{"ttft_ms": 86.2 * j, "prefill_gpu_ms": 48.0, "cpu_share_pct": 100 * (1 - 48.0 / (86.2 * j))} for j in jit]
    top = [{"rate": "32", "rep": i, "median_itl_ms": 5.6, "p99_itl_ms": 34.1 * j, "max_token_usage": 0.02,
            "retractions": 0} for i, j in enumerate(jit)]
    itl = pd.DataFrame([{"batch": 1, "prompt_len": 512, "rep": i, "itl_ms": 5.5, "token": 1} for i in range(reps)])
    a = {"req": req, "classes": [{"class": "gemm", "prefill_pct": 84.0}], "rise": [-0.9 * j for j in jit],
         "b1_pct": [77.0 * j for j in jit], "fits": [(0.06e-3, 0.01 * j) for j in jit], "top_loads": top, "itl": itl,
         "wbytes": 16.06e9, "kvb": 131072, "b1_L": 512}
    d = {"loads": top, "bar": [{"ratio_pct": 104.3 * j} for j in jit]}
    return d, a


def test_01_verdicts_are_judged_on_repetitions():
    pd = pytest.importorskip("pandas")
    m = load("01_baseline_perf.py")
    rec = Recorder()
    m.verdicts(rec, *_01_inputs(pd))
    v = {k: o["verdict"] for k, o in rec.by_id().items()}
    assert v == {"ttft-cpu-share": "confirmed", "itl-rise-b1": "refuted", "itl-linear-kv": "refuted",
                 "itl-tail-under-load": "confirmed", "retract-at-plateau": "inconclusive", "perf-bar": "confirmed"}
    o = rec.by_id()
    # judged on the pressure load only (the rate loads never fill the pool): none in these inputs
    assert o["retract-at-plateau"]["observed"].startswith("not observed: this run has no pressure load")
    assert o["ttft-cpu-share"]["interval"]["n"] == 3 and o["ttft-cpu-share"]["range"] == [6, 100]
    assert "PLAN.md" in o["itl-rise-b1"]["source"] and rec.head["perf_bar_pct"] == pytest.approx(104.3 * 0.97)
    assert rec.head["decode_b1_pct_of_dram_ceiling"] == pytest.approx(77.0)    # 08 judges it; 01 still tells it
    # the committed run had one sample each: never judged now
    one = Recorder()
    m.verdicts(one, *_01_inputs(pd, reps=1))
    assert {o["verdict"] for o in one.by_id().values()} == {"inconclusive"}
    assert "1 sample(s): at least 3 repetitions" in one.by_id()["perf-bar"]["observed"]


# ------------------------------------------------------------------ 02: hit rate three ways, verdicts on intervals

def test_hit3_on_real_log_lines(fixture_path):
    m = load("02_radix_cache_analysis.py")
    rows = sg.parse_batch_log(fixture_path("sglang_server_log_under_load_llama8b_dummy_h200.log").read_text())
    pre = [r for r in rows if r["kind"] == "prefill" and not sg.is_probe(r)][:5]
    meta = [{"prompt_tokens": r["new_token"] + r["cached_token"], "cached_tokens": r["cached_token"]} for r in pre]
    c, p = sum(x["cached_tokens"] for x in meta), sum(x["prompt_tokens"] for x in meta)
    before = sg.parse_metrics('sglang:cached_tokens_total{a="1"} 0\nsglang:prompt_tokens_total{a="1"} 0\n')
    after = sg.parse_metrics(f'sglang:cached_tokens_total{{a="1"}} {c}\nsglang:prompt_tokens_total{{a="1"}} {p}\n')
    h = m.hit3(meta, pre, before, after)
    assert h["meta_info"] == pytest.approx(c / p) == pytest.approx(h["log"]) == pytest.approx(h["metrics_requests"])


def _02_inputs(lpm_hits, fcfs_hits, reps=3):
    """The committed H200 run's numbers (analysis.md, 02 observations) as repetitions: half-shared cold 28.7 ms
    with warm/cold 1.20, prefix 4096 warm/cold 0.23, LPM 0.745 vs FCFS 0.721 (+0.024), TTFT 686 vs 864 ms."""
    cw, agree, ev, ks = [], [], [], []
    for r in range(reps):
        for case, L, k, sfx, cold, warm in (("prefix 1024 x4", 1024, 4, 32, 30.0, 22.0),
                                            ("prefix 4096 x4", 4096, 4, 32, 95.0, 95.0 * 0.23),
                                            ("half-shared 512", 256, 1, 256, 28.7, 28.7 * 1.20)):
            cw.append({"case": case, "rep": r, "prefix_len": L, "suffix_len": sfx, "kind": "cold", "e2e_ms": cold,
                       "prompt_tokens": L + sfx + 1, "cached_tokens": 0})
            cw += [{"case": case, "rep": r, "prefix_len": L, "suffix_len": sfx, "kind": "warm", "e2e_ms": warm,
                    "prompt_tokens": L + sfx + 1, "cached_tokens": L} for _ in range(k)]
            cw.append({"case": case, "rep": r, "prefix_len": L, "suffix_len": sfx, "kind": "repeat", "e2e_ms": warm,
                       "prompt_tokens": L + sfx + 1, "cached_tokens": L + sfx})
            agree.append({"case": case, "rep": r, "meta_info": 0.5, "log": 0.5, "metrics_requests": 0.5})
        ev += [{"rep": r, "ws_over_pool": 0.44, "pass2_hit_rate": 0.98, "groups": 7, "groups_kept": 7, "lru_order": True},
               {"rep": r, "ws_over_pool": 1.46, "pass2_hit_rate": 0.64, "groups": 23, "groups_kept": 15, "lru_order": True}]
        ks += [{"kind": "cold", "rep": r, "cached_tokens": 0, "attention_kernels": "PrefillWithKVCacheKernel"},
               {"kind": "warm", "rep": r, "cached_tokens": 2048, "attention_kernels":
                "BatchPrefillWithPagedKVCacheKernel;MergeStateKernel;PrefillWithKVCacheKernel"}]
    pol = [{"policy": "lpm", "rep": r, "hit_rate": h, "p50_ttft_ms": 686.0 + 10 * r} for r, h in enumerate(lpm_hits)] + \
          [{"policy": "fcfs", "rep": r, "hit_rate": h, "p50_ttft_ms": 864.0 - 10 * r} for r, h in enumerate(fcfs_hits)]
    return {"cw": cw, "agree": agree, "ev": ev, "ks": ks, "pol": pol, "flags": ["--load-format", "dummy"]}


def test_02_verdicts_are_judged_on_repetitions():
    pd = pytest.importorskip("pandas")
    m = load("02_radix_cache_analysis.py")
    rec = Recorder()
    m.verdicts(rec, _02_inputs([0.745, 0.731, 0.752], [0.721, 0.726, 0.719]), pd, m.QUICK, "flashinfer")
    o = rec.by_id()
    assert {k: x["verdict"] for k, x in o.items()} == {
        "warm-cached-exact": "confirmed", "repeat-cached-exact": "confirmed", "half-shared-warm-over-cold": "refuted",
        "prefill-follows-uncached-fraction": "refuted", "attention-kernel-switch": "confirmed",
        "hit-rate-3-ways": "confirmed", "eviction-hit-rate-falls": "confirmed", "eviction-lru-order": "confirmed",
        "lpm-beats-fcfs-hit-rate": "inconclusive", "lpm-beats-fcfs-ttft": "confirmed"}
    # "LPM ahead by +0.024 against a 0.02 threshold": over three repetitions the gain straddles the bound
    assert "straddles >= 0.02" in o["lpm-beats-fcfs-hit-rate"]["observed"]
    assert o["lpm-beats-fcfs-hit-rate"]["interval"]["lo"] == pytest.approx(0.005)
    assert "CUDA graphs: prefill on, decode on" in o["half-shared-warm-over-cold"]["observed"]    # the configuration
    assert o["prefill-follows-uncached-fraction"]["range"] == [None, round(3 * 32 / 4128 + 0.1, 3)]
    clear = Recorder()
    m.verdicts(clear, _02_inputs([0.80, 0.79, 0.81], [0.72, 0.73, 0.71]), pd, m.QUICK, "triton")
    c = clear.by_id()
    assert c["lpm-beats-fcfs-hit-rate"]["verdict"] == "confirmed"
    assert c["attention-kernel-switch"]["verdict"] == "inconclusive" and "premise failed: backend triton" in \
        c["attention-kernel-switch"]["observed"]


def test_02_a_failed_premise_makes_eviction_inconclusive():
    pd = pytest.importorskip("pandas")
    m = load("02_radix_cache_analysis.py")
    d = _02_inputs([0.8] * 3, [0.7] * 3)
    for e in d["ev"]:
        if e["ws_over_pool"] < 1:
            e["pass2_hit_rate"] = 0.5                       # the cache did not even work when everything fit
    rec = Recorder()
    m.judge_eviction(rec, pd.DataFrame(d["ev"]))
    o = rec.by_id()["eviction-hit-rate-falls"]
    assert o["verdict"] == "inconclusive" and "premise failed" in o["observed"]


# ------------------------------------------------------------------ 03 / 04 / 05 / 07 pure helpers

def test_matched_prefix_and_sharegpt_file(tmp_path):
    m = load("03_backend_comparison.py")
    assert m.matched_prefix([1, 2, 3], [1, 2, 4]) == 2 and m.matched_prefix([1], [1]) == 1 and m.matched_prefix([], [5]) == 0
    prompts = [sg.random_text(511, 90_000 + i) for i in range(20)]
    f = m.sharegpt_file(tmp_path / "sg.json", prompts)
    data = json.loads(f.read_text())
    # what sglang.benchmark.datasets.sharegpt reads: conversations[0/1]["value"], >= 2 turns, completion >= 2 chars
    pairs = [(d["conversations"][0]["value"], d["conversations"][1]["value"]) for d in data if len(d["conversations"]) >= 2]
    assert [p for p, _ in pairs] == prompts and all(len(c) >= 2 for _, c in pairs)
    assert len({p[:32] for p in prompts}) == 20 and all(p.isascii() for p in prompts)   # no shared prefix; 1 char = 1 token
    g = m.greedy_rows({"flashinfer": [[1, 2, 3]], "triton": [[1, 2, 4]]})
    assert [(r["variant"], r["matched_prefix"], r["identical"]) for r in g] == [("flashinfer", 3, True), ("triton", 2, False)]


def test_timeline_analysis_on_real_trace(fixture_path):
    m = load("04_nsys_profile.py")
    ev = trace.read_chrome_trace(fixture_path("sglang_server_trace_llama8b_h200_cut.json"))
    k = trace.kernels(ev)
    ranges = ev[(ev["kind"] == "user_annotation") & ev["name"].str.startswith("scheduler.")]
    a = m.analyse(k, ranges, "t")
    assert a["kernels"] == len(k) and 0 < a["busy"] <= 1 and a["classes"].index[0] == "gemm"
    assert set(a["gaps"]["phase"]) <= {"scheduler.run_batch", "none", "-"}      # "-": gaps < 20 us
    assert len(a["busy_slices"]) == len(a["att_over_gemm"]) == m.SLICES
    assert all(0 <= b <= 100 for b in a["busy_slices"])
    assert m.phase_name(":scheduler.run_batch") == "scheduler.run_batch"
    assert m.cpu_phase_at(ranges, -1.0) == "none"


def test_ncu_stage_mapping_and_stall_lead():
    pd = pytest.importorskip("pandas")
    m = load("05_ncu_attention.py")
    assert m.stage_of("PrefillWithKVCacheKernel", "flashinfer") == "prefill"
    assert m.stage_of("BatchPrefillWithPagedKVCacheKernel", "flashinfer") == "decode"
    assert m.stage_of("_fwd_grouped_kernel_stage1", "triton") == "decode"
    assert m.stage_of("_fwd_kernel", "triton") == "prefill"
    assert m.stage_of("x", "fa3") == "unknown"
    row = pd.Series({"stall_long_scoreboard_pct": 60.0, "stall_wait_pct": 20.0, "stall_barrier_pct": float("nan")})
    assert m.stall_lead(row) == pytest.approx(3.0)
    assert m.stall_lead(pd.Series({"stall_long_scoreboard_pct": 10.0, "stall_wait_pct": 40.0})) == pytest.approx(0.25)


def test_ncu_story_says_what_the_wait_stall_means(fixture_path):
    """F6: `wait` is a fixed-latency dependency, not producer/consumer synchronisation."""
    import gzip
    from common.capture import ncu
    pd = pytest.importorskip("pandas")
    m = load("05_ncu_attention.py")
    s = kernels.summarize(ncu.read_raw(gzip.open(fixture_path("sglang_story_ncu_graph_nodes_2layers_h200.csv.gz"), "rt").read()))
    s = s[s["kernel"].str.contains("Prefill")].head(4).copy()
    s.insert(0, "backend", "flashinfer")
    s.insert(1, "stage", "prefill")
    s["shape"] = "prefill 512 tok"
    s["graphs"] = "CUDA graphs: prefill on, decode on — SGLang's defaults"
    text = m.tell(s, {"gpu": "NVIDIA H200", "dram_tb_s": 4.5, "bf16_tflops": 800.0}, 2)
    tops = {bounds.top_stall(r) for r in s.to_dict("records")} - {""}
    assert tops and all(f"top stall {t}: {bounds.STALL_MEANING[t]}" in text for t in tops)
    assert "producer" not in text and pd is not None


def test_wait_file_waits_for_a_finished_report(tmp_path):
    import threading
    m = load("04_nsys_profile.py")
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
    m = load("04_nsys_profile.py")
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
    r = subprocess.run([sys.executable, str(SCRIPTS / "04_nsys_profile.py"), "--reanalyse", str(src), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "ok" and s["stem"] == "04_nsys_profile"
    assert any(o["verdict"] == "confirmed" and "prefill only" in o["observed"] for o in s["observations"])
    judged = {o["hypothesis"]: o for o in s["observations"] if "hypothesis" in o}
    assert judged["attention-dominates"]["interval"]["n"] == 5 and judged["attention-dominates"]["verdict"] == "refuted"
    assert (out / "timeline_overlap_on_cuda_gpu_trace.csv").exists() and (out / "kernels.csv").exists()
    assert (out / "slices.csv").exists()
    p = s["provenance"]
    assert p["gpu"] == "NVIDIA H200" and p["git"]["commit"] == "46ebaf8" and "--reanalyse" in p["reanalysed"]["command"]
    assert s["story"].startswith("SYSTEM TIMELINE — llama-3.1-8b, flashinfer, burst 16 x (512 in, 64 out)")


# sglang_tp_runs_4xh200.csv, sglang_tp_allreduce_kernels_4xh200.csv, nvidia_smi_topo_4xh200.txt: tp_runs.csv,
# allreduce_kernels.csv and topology.txt of the real `07_tp_scaling.sh --quick --configs
# 'llama-3.1-8b:1,4;llama-3.1-70b:4' --time-budget 7` run on 4x H200 (NV18 between every pair), commit fea9650.
def _tp_folder(tmp_path, fixture_path, intervals=False):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(fixture_path("sglang_tp_allreduce_kernels_4xh200.csv"), src / "allreduce_kernels.csv")
    shutil.copy(fixture_path("nvidia_smi_topo_4xh200.txt"), src / "topology.txt")
    shutil.copy(fixture_path("sglang_tp_runs_4xh200.csv"), src / "tp_runs.csv")
    if intervals:   # the same rows as a run of this version writes them: each judged median with its interval
        import pandas as pd
        df = pd.read_csv(src / "tp_runs.csv")
        for c, rel in (("itl_b1_ms", 0.02), ("allreduce_us_per_step", 0.03), ("allreduce_share_pct", 0.03)):
            df[f"{c}_lo"], df[f"{c}_hi"], df[f"{c}_n"] = df[c] * (1 - rel), df[c] * (1 + rel), 8
        df.to_csv(src / "tp_runs.csv", index=False)
    return src


def _reanalyse_07(src, out):
    r = subprocess.run([sys.executable, str(SCRIPTS / "07_tp_scaling.py"), "--reanalyse", str(src), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads((out / "summary.json").read_text())


def test_07_reanalysis_of_a_real_4gpu_run(tmp_path, fixture_path):
    s = _reanalyse_07(_tp_folder(tmp_path, fixture_path), tmp_path / "out")
    obs = {o.get("hypothesis") or o["expected"].split(" (")[0]: o for o in s["observations"]}
    custom = next(o for k, o in obs.items() if k.startswith("decode all-reduces"))
    assert custom["verdict"] == "confirmed" and "all_reduce_kernel" in custom["observed"]
    assert "all-gather: ncclDevKernel_AllGather" in custom["observed"]
    # rows recorded before intervals were kept hold one number each: judged inconclusive, never on one sample
    assert obs["custom-ar-less-time"]["verdict"] == "inconclusive" and "1 sample(s)" in obs["custom-ar-less-time"]["observed"]
    topo = next(o for k, o in obs.items() if k.startswith("the plan's box"))
    assert topo["verdict"] == "refuted" and "6 of 6 GPU pairs on NVLink (NV18)" in topo["observed"]
    ak = (tmp_path / "out" / "allreduce_kernels.csv").read_text()
    assert ak == fixture_path("sglang_tp_allreduce_kernels_4xh200.csv").read_text()        # kept, not regrouped
    assert s["headline"]["itl_b1_ms_llama-3.1-8b_tp4_nccl"] > 0 and (tmp_path / "out" / "tp_scaling.png").exists()
    assert s["story"].startswith("TENSOR PARALLEL SCALING — ") and s["stem"] == "07_tp_scaling"
    m = load("07_tp_scaling.py")
    with pytest.raises(m.SetupError, match="no tp_runs.csv"):
        m.main_reanalyse(m.parse_args(["--reanalyse", str(tmp_path / "none")]))


def test_07_verdicts_on_kept_intervals(tmp_path, fixture_path):
    s = _reanalyse_07(_tp_folder(tmp_path, fixture_path, intervals=True), tmp_path / "out")
    v = {o["hypothesis"]: o for o in s["observations"] if "hypothesis" in o}
    assert v["custom-ar-less-time"]["verdict"] == "confirmed"           # 646 vs NCCL's us/step, intervals apart
    assert v["tp-itl-sublinear"]["verdict"] == "confirmed" and v["tp-itl-sublinear"]["range"] == [1, 4.0]
    assert v["tp-allreduce-share-grows"]["verdict"] == "confirmed"      # 0% at TP 1 -> 20.8% at TP 4


def test_07_merge_keeps_earlier_rows_marked_and_replaces_remeasured(tmp_path, fixture_path):
    """--merge: an earlier run's rows join this run's, marked with when they were measured; a
    configuration measured again replaces the old row (real 4x H200 rows, fea9650)."""
    pd = pytest.importorskip("pandas")
    src = tmp_path / "old"
    src.mkdir()
    shutil.copy(fixture_path("sglang_tp_runs_4xh200.csv"), src / "tp_runs.csv")
    shutil.copy(fixture_path("sglang_tp_allreduce_kernels_4xh200.csv"), src / "allreduce_kernels.csv")
    (src / "summary.json").write_text(json.dumps({"provenance": {"date_utc": "2026-11-21T13:40:00Z", "git": {"commit": "fea9650"},
                                                                 "gpu_count": 4, "gpu": "NVIDIA H200"}}))
    m = load("07_tp_scaling.py")
    tables, prev = m.load_merge(src, pd)
    old, akd = tables["tp_runs"], tables["allreduce_kernels"]
    tag = "2026-11-21T13:40 on 4x NVIDIA H200 @ fea9650"            # when, on which machine, at which commit
    assert set(old["measured"]) == {tag} and len(akd) and prev["provenance"]["git"]
    assert not len(tables["ttft_parts"])                            # a table an older run did not write: empty
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
    again = m.load_merge(src, pd)[0]["tp_runs"]
    assert "this run" not in set(again["measured"]) and set(again["measured"]) == {tag}
    with pytest.raises(m.SetupError, match="no tp_runs.csv"):
        m.load_merge(tmp_path / "none", pd)


def test_itl_linear_in_kv_is_not_judged_where_the_kv_range_cannot_show_a_line(fixture_path):
    """tests/fixtures/sglang_01_itl_vs_kv_b16_h200.csv: the batch-16 ITL rows of 01 --quick on an H200 (224595d):
    KV 8,208-10,736 tokens, 1.9% of the bytes a step reads (16 GB of weights). Its R^2 of ~0.005 was 'refuted';
    the sweep cannot test the claim, so the verdict is inconclusive with that reason."""
    import pandas as pd
    m = load("01_baseline_perf.py")
    big = pd.read_csv(fixture_path("sglang_01_itl_vs_kv_b16_h200.csv"))
    wbytes, kvb = 16.06e9, 128 * 1024                               # Llama-3.1-8B: bf16 weights, K+V per token
    lo, hi, share = m.kv_span(big, wbytes, kvb)
    assert (lo, hi) == (8208, 10736) and 0.015 < share < 0.025
    got = []
    run = type("R", (), {"judge": lambda self, h, v, **kw: got.append((h.id, kw.get("premise"))),
                         "fact": lambda self, *a, **kw: None, "headline": lambda self, **kw: None})()
    a = {"req": [], "classes": [], "rise": [], "b1_pct": [], "fits": [(5e-5, 0.005)] * 3, "kv_span": (lo, hi, share),
         "top_loads": []}
    m.verdicts(run, {"loads": [], "bar": []}, a)
    (hid, premise), = [g for g in got if g[0] == "itl-linear-kv"]
    assert isinstance(premise, str) and "changes the bytes a step reads by 1.9%" in premise
    m.verdicts(run, {"loads": [], "bar": []}, {**a, "kv_span": (512, 65536, 0.3)})
    assert got[-1] == ("itl-linear-kv", True)                       # a sweep that can show a line is judged
