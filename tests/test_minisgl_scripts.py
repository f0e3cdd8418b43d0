"""The mini-SGLang numbered scripts on a CPU: --help (no torch here), CLI validation at parse time, main() reads as
phases in <= 100 lines, hypotheses declared as data with their sources, and verdicts that hold: judged on intervals of
repetitions, never confirmed outside their range, inconclusive when a premise failed or the interval straddles.

Recorded values used (real runs; no made-up numbers):
  fi_cross_check_decode_h200{,_b2e5,_b7d6}.csv  three real FlashInfer-track runs on H200s (tests/test_flashinfer_fi.py):
      ``workbook_ms`` of FlashInfer's decode at batch 32 x KV 4096, tensor-core ("tc": the kernel mini-SGLang's "fi"
      backend runs, GQA 4) and CUDA-core ("cuda": fi tc=off): three repetitions of the plan's decode point;
  mini-SGLang's committed H200 runs (mini-sglang/reports/analysis.md, experiments.md, environment.md): the measured
      copy ceiling 4.25 TB/s that every % of the older runs divided by (one DRAM figure: a record from before the
      kinds were measured apart); the ceilings of the latest committed run (environment.md, peaks table): DRAM read
      4.68 TB/s (triton read), write 4.70 (torch fill_), copy 4.24 (torch copy_), bf16 792 TFLOP/s, L2 60 MB, no
      "mixed" probe (it falls back to the fastest, as common.capture.ceilings.as_peaks does); 04's fi decode b32 x kv4096 at
      123.9 us (4.34 TB/s, "102% of measured copy ... confirmed"); 03's store at 65536 tokens, 2048-B rows: 99%
      sequential, 94% random of 4.25 TB/s, one store_kv_cache launch per call, two for torch index_put; 01's 18/18
      radix cases; 06's (now 08's) eager steps table of one generate (Llama-3.1-8B, batch 1: GPU ms and the GPU gap
      before each step);
  msgl_comm_*_4xh200.csv  05's real --quick --tp 2 4 run on 4x H200 (below);
  sglang_story_trace_graphs_llama8b_h200_cut.json.gz  a real SGLang capture with CUDA graphs (tests/test_timeline.py):
      no mini-SGLang graph trace is committed, so 08's analysis is exercised on it (the same FlashInfer / cuBLAS
      kernel names mini-SGLang launches; SGLang's step names mapped to mini-SGLang's prefill / decode).
"""
import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import kit  # tests/kit.py
ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "mini-sglang" / "scripts"
FIX = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(SCRIPTS))
import _msgl  # noqa: E402
import _msgl_forward  # noqa: E402
import _msgl_joined  # noqa: E402
from common.capture import models, timing  # noqa: E402
from common.tables import flops, kernels, timeline, trace  # noqa: E402
from common.judge import verdicts  # noqa: E402
from common.run.results import Run  # noqa: E402

PY = sorted(p for p in SCRIPTS.glob("[0-9][0-9]_*.py"))
SH = sorted(SCRIPTS.glob("*.sh"))
MSGL_H200 = {"gpu": "NVIDIA H200", "dram_tb_s": 4.70, "dram_read_tb_s": 4.68, "dram_write_tb_s": 4.70,
             "dram_copy_tb_s": 4.24, "dram_mixed_tb_s": 4.70, "bf16_tflops": 792.0, "l2_mb": 60.0, "source": "measured",
             "sources": {"dram_tb_s": "measured", "dram_read_tb_s": "measured", "dram_write_tb_s": "measured",
                         "dram_copy_tb_s": "measured", "dram_mixed_tb_s": "measured (fastest probe)",
                         "bf16_tflops": "measured"}}    # environment.md of the latest committed run
MSGL_H200_ONE_DRAM = {"gpu": "NVIDIA H200", "dram_tb_s": 4.25, "bf16_tflops": 789.0, "l2_mb": 60.0, "source": "measured",
                      "sources": {"dram_tb_s": "measured", "bf16_tflops": "measured"}}   # the older runs' one DRAM figure
DEC_BYTES = flops.decode_bytes([4096] * 32, 32, 8, 128, index_bytes_per_token=4)  # 537,919,488 B (analysis.md:735)


def load(stem):
    return kit.load_script(SCRIPTS / f"{stem}.py", f"msgl_{stem}")


@pytest.fixture
def run(tmp_path):
    r = Run(SCRIPTS / "04_profile_attention.py", {}, out=tmp_path / "run", quiet=True)
    yield r
    r.finish()


def verdict(run, hid):
    """The latest observation of hypothesis ``hid`` (its id, or the start of its claim)."""
    return next(o for o in reversed(run.summary["observations"]) if o.get("hypothesis") == hid
                or o["expected"].startswith(hid))


# ------------------------------------------------------------------ the track, --help, the shell wrappers
def test_the_track_is_complete_one_topic_per_number():
    names = {p.name for p in PY} | {p.name for p in SH}
    for n in ("00_check_env.py", "01_test_kernels.py", "02_profile_index.py", "03_profile_store.py",
              "04_profile_attention.py", "05_profile_comm.py", "06_full_pipeline.sh", "07_profile_radix.py",
              "08_forward_timeline.py", "ncu_profile.sh"):
        assert n in names
    numbers = [p.name[:2] for p in PY + SH if p.name[:2].isdigit()]
    assert len(numbers) == len(set(numbers)) and "06_forward_timeline.py" not in names


@pytest.mark.parametrize("script", PY, ids=lambda p: p.name)
def test_python_help_runs_without_torch(script):
    p = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    title = script.read_text().split('"""')[1].splitlines()[0]
    assert title.startswith(script.name[:2] + " · ")          # the docstring's title line
    assert "--quick" in p.stdout and "Run" in p.stdout and "What the plan expected" in p.stdout


@pytest.mark.parametrize("script", SH, ids=lambda p: p.name)
def test_shell_help(script):
    p = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "Usage" in p.stdout and "set -euo" not in p.stdout
    bad = subprocess.run(["bash", str(script), "--no-such-flag"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2


def test_ncu_wrapper_is_thin_and_hands_over_to_common_ncu():
    text = (SCRIPTS / "ncu_profile.sh").read_text()
    assert len(text.splitlines()) <= 40 and "-m common ncu profile" in text
    p = subprocess.run(["bash", str(SCRIPTS / "ncu_profile.sh"), "--kernel", "index", "--count", "two", "--", "true"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].endswith("argument --count: invalid int value: 'two'")


# ------------------------------------------------------------------ every CLI value checked at parse time
@pytest.mark.parametrize("script,args,line", [
    ("01_test_kernels.py", ["--kernels", "index,foo"], "argument --kernels: unknown value(s) foo; choose from index, "
                                                       "store, radix, pynccl"),
    ("02_profile_index.py", ["--tokens", "abc"], "argument --tokens: expected positive integers separated by commas, "
                                                 "got 'abc'"),
    ("02_profile_index.py", ["--models", "llama-9"], "argument --models: unknown value(s) llama-9; choose from "
                                                     "llama-3.1-8b, llama-3.1-70b, qwen2.5-7b, tiny-llama"),
    ("03_profile_store.py", ["--rows", "2048,300"], "argument --rows: unknown value(s) 300; choose from 2048, 1024, 512, 256"),
    ("03_profile_store.py", ["--patterns", "zigzag"], "argument --patterns: unknown value(s) zigzag; choose from "
                                                      "sequential, random, reversed"),
    ("04_profile_attention.py", ["--kv-lens", "4096,-1"], "argument --kv-lens: expected positive integers separated by "
                                                          "commas, got '4096,-1'"),
    ("05_profile_comm.py", ["--tp", "1"], "argument --tp: expected a TP size >= 2 (an all-reduce needs two ranks), got '1'"),
    ("05_profile_comm.py", ["--timeout", "-3"], "argument --timeout: expected a positive number, got '-3'"),
    ("07_profile_radix.py", ["--depths", "0,4"], "argument --depths: expected positive integers separated by commas, "
                                                 "got '0,4'"),
    ("08_forward_timeline.py", ["--batch", "0"], "argument --batch: expected a positive integer, got '0'"),
    ("08_forward_timeline.py", ["--decode-steps", "2"], "argument --decode-steps: expected an integer >= 3 (a verdict "
                                                        "needs 3 repetitions), got '2'"),
    ("08_forward_timeline.py", ["--variants", "eager,fast"], "argument --variants: unknown value(s) fast; choose from "
                                                             "eager, graph, graph-no-overlap, eager-no-overlap"),
    ("08_forward_timeline.py", ["--model", "llama-9"], "argument --model: unknown model preset 'llama-9'; choose from "
                                                       "llama-3.1-70b, llama-3.1-8b, qwen2.5-7b, tiny-llama"),
    ("08_forward_timeline.py", ["--prompt-len", "20000"], "argument --prompt-len: 20000 tokens plus the decode steps "
                                                          "exceed max_seq_len 16384"),
])
def test_bad_values_are_one_argparse_line_before_any_gpu_work(script, args, line):
    p = subprocess.run([sys.executable, str(SCRIPTS / script), *args], capture_output=True, text=True, timeout=60)
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert last == f"{script}: error: {line}", last


def test_tp_larger_than_the_gpus_is_refused_before_any_rank_starts():
    """--tp is checked with common.run.cli.check_gpus_for (NVML / nvidia-smi, no torch): this CPU box has no GPU."""
    p = subprocess.run([sys.executable, str(SCRIPTS / "05_profile_comm.py"), "--tp", "2"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("[setup] No NVIDIA GPU visible")


# ------------------------------------------------------------------ the shape of each script
@pytest.mark.parametrize("script", PY, ids=lambda p: p.name)
def test_main_reads_as_phases_in_at_most_100_lines(script):
    tree = ast.parse(script.read_text())
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    assert main.end_lineno - main.lineno + 1 <= 100


@pytest.mark.parametrize("script", PY, ids=lambda p: p.name)
def test_hypotheses_are_data_with_a_source(script):
    mod = load(script.stem)
    hs = {k: v for k, v in getattr(mod, "H", {}).items() if isinstance(v, verdicts.Hypothesis)}
    assert hs, f"{script.name} declares no hypotheses"
    for name, h in hs.items():
        assert h.source and h.claim and h.quantity, name
    assert len({h.id for h in hs.values()}) == len(hs)


def test_the_plan_figures_are_judged_as_their_ranges():
    m02, m03, m04, m05 = (load(s) for s in ("02_profile_index", "03_profile_store", "04_profile_attention",
                                            "05_profile_comm"))
    assert (m02.H["bw_large"].low, m02.H["bw_large"].high) == (70, 80) and "70-80%" in m02.H["bw_large"].source
    assert (m03.H["seq"].low, m03.H["seq"].high) == (70, 75) and (m03.H["random"].low, m03.H["random"].high) == (55, 65)
    assert (m04.H["decode_bw"].low, m04.H["decode_bw"].high) == (70, 85) and "70-85%" in m04.H["decode_bw"].source
    assert (m05.H["busbw"].low, m05.H["busbw"].high) == (85, 95)


def test_generic_jobs_come_from_common():
    for p in PY + sorted(SCRIPTS.glob("_msgl*.py")):
        text = p.read_text()
        assert "launches_by_range" not in text and "apply_nccl_safe_env" not in text and "def free_port" not in text
        assert "from torch.profiler import" not in text                 # captures go through common.tables.trace
        assert not re.search(r"def (index|store)_bytes|def bus_bandwidth|def kernel_period|def load_events", text)


# ------------------------------------------------------------------ verdicts that hold (issue 16, item 2)
def _decode_cmp(tc_us, cuda_us, pk=MSGL_H200):
    """compare.csv rows of fi / fi tc=off at decode b32 x kv4096 from real kernel times (us), through 04's own work()
    and common.capture.timing.rates as its measure() writes them (``pk``: the ceilings divided by)."""
    import pandas as pd
    m04 = load("04_profile_attention")
    q, kv = [1] * 32, [4096] * 32
    f, nbytes, mix = m04.work("decode", q, kv)
    assert nbytes == DEC_BYTES and mix == "read"
    rows = []
    for var, times in (("fi", tc_us), ("fi tc=off", cuda_us)):
        for rep, t in enumerate(times):
            r = timing.rates(t / 1e3, bytes=nbytes, flops=f, peaks=pk, mix=mix, working_set=nbytes)
            rows.append({"variant": var, "phase": "decode", "point": "decode bs=32 kv=4096", "rep": rep, "time_us": t,
                         "plan_cpu_us": None, **timing.rate_row(r)})
    return pd.DataFrame(rows)


def _fixture_decode_us(variant):
    import csv
    out = []
    for f in ("fi_cross_check_decode_h200.csv", "fi_cross_check_decode_h200_b2e5.csv", "fi_cross_check_decode_h200_b7d6.csv"):
        out += [1e3 * float(r["workbook_ms"]) for r in csv.DictReader((FIX / f).open()) if r["variant"] == variant
                and r["batch"] == "32" and r["kv_len"] == "4096"]
    return out


def _judge04(run, tc_us, pk=MSGL_H200):
    m04 = load("04_profile_attention")
    x = SimpleNamespace(cmp=_decode_cmp(tc_us, _fixture_decode_us("cuda"), pk), kern=None, syncs=[], ncu=None, pk=pk,
                        ceiling=m04.ceilings.ceiling_text(pk, "dram_read_tb_s", short=True))
    m04.judge(run, x)
    return verdict(run, "decode-attn-bw")


def test_decode_attention_outside_the_range_is_never_confirmed(run):
    """Three real repetitions of tensor-core decode b32 x kv4096 on H200s: 4.16-4.24 TB/s effective, a DRAM rate (its
    538 MB working set is 9x the 60 MB L2), 88.9-90.6% of the committed run's 4.68 TB/s read ceiling. The old rule
    (>= 70% -> confirmed) confirmed such a run against the plan's 70-85%; outside the range is refuted."""
    tc = _fixture_decode_us("tc")
    assert len(tc) == 3
    rec = _judge04(run, tc)
    assert rec["verdict"] == "refuted" and 88.5 < rec["interval"]["lo"] < rec["interval"]["hi"] < 91
    assert "[70, 85]%" in rec["expected"] and "1.4-1.7 TB/s" in rec["source"]
    assert "DRAM read ceiling 4.68 TB/s" in rec["observed"] and "working set 538 MB = 8.6 x L2" in rec["observed"]


def test_a_kernel_above_the_ceiling_is_a_failed_premise_and_the_guard_is_what_decides(run, monkeypatch):
    """The committed mini-SGLang 04 value (123.9 us = 4.34 TB/s effective over a 538 MB working set) read 102% of the
    one DRAM figure its run had, 4.25 TB/s (a copy probe: the wrong kind for a read). Divided by that record the
    ceiling is beaten: inconclusive, never confirmed. Breaking the guard (_msgl.eff_premise) turns the same numbers
    into a verdict, which proves the guard is what holds it back. Against the read ceiling of the latest committed
    run (4.68 TB/s) the same times are 92.8% and are judged: refuted."""
    values = [123.9] + _fixture_decode_us("tc")
    rec = _judge04(run, values, MSGL_H200_ONE_DRAM)
    assert rec["verdict"] == "inconclusive" and "premise failed: 102% of the measured DRAM (fastest stream) ceiling 4.25 TB/s" in \
        rec["observed"]
    monkeypatch.setattr(_msgl, "eff_premise", lambda *a, **k: True)
    assert _judge04(run, values, MSGL_H200_ONE_DRAM)["verdict"] == "refuted"
    monkeypatch.undo()
    rec = _judge04(run, values)
    assert rec["verdict"] == "refuted" and rec["interval"]["hi"] == pytest.approx(92.8, abs=0.1)



def test_store_fused_85_is_inconclusive_when_store_is_already_one_launch(run):
    """The committed 03 run: one store_kv_cache launch per call, 99% / 94% of the 4.25 TB/s ceiling (sequential /
    random, 65536 tokens, 2048-B rows). Its 'fused they would reach 85%' verdict read 'confirmed' although the
    premise (two launches to fuse) failed; now it is inconclusive and says why."""
    import pandas as pd
    m03 = load("03_profile_store")
    launches = pd.DataFrame(
        [{"label": "call: minisgl.store_cache row=2048 tokens=8192", "call": c, "gpu_kind": "kernel",
          "kernel": "store_kv_cache"} for c in range(3)] +
        [{"label": "call: torch index_put K, V row=2048 tokens=8192", "call": c, "gpu_kind": "kernel",
          "kernel": "index_elementwise_kernel"} for c in range(3) for _k in range(2)])
    b = flops.store_bytes(65536, 2048, 4)
    rows = []
    for p, pct in (("sequential", 99.0), ("random", 94.0)):      # the committed run's %, of its 4.25 TB/s: times
        t_us = b["total"] / (pct * 4.25e6 / 100)
        r = timing.rates(t_us / 1e3, bytes=b["total"], peaks=MSGL_H200, mix="copy", working_set=b["total"])
        rows.append({"row_bytes": 2048, "pattern": p, "rep": 0, "time_us": t_us, **timing.rate_row(r)})
    ref = pd.DataFrame(rows)
    x = SimpleNamespace(ref=ref, launches=launches, kern=None, ceiling="the measured DRAM copy ceiling 4.24 TB/s",
                        pk=MSGL_H200, p=SimpleNamespace(rows=(2048,), big=65536))
    m03.judge(run, x)
    two = verdict(run, "store makes two kernel launches")
    assert two["verdict"] == "refuted" and "[1] launch(es) per call" in two["observed"] and "[2] per call" in two["observed"]
    fused = verdict(run, "store-fused-85")
    assert fused["verdict"] == "inconclusive"
    assert "premise failed: store_cache already copies K and V in one launch" in fused["observed"]
    assert verdict(run, "store-seq-bw")["verdict"] == "inconclusive"          # one sample is never judged
    assert "1 sample(s)" in verdict(run, "store-seq-bw")["observed"]


def test_all_kernels_match_says_why_it_is_inconclusive_on_one_gpu(run):
    """The committed 01 run's radix cases all exact; PyNCCL not run on one GPU: the success criterion is a failed
    premise (inconclusive), and the evidence names the reason; what one GPU can check is confirmed."""
    m01 = load("01_test_kernels")
    chk = m01.Checks(run)
    for i in range(18):
        chk.add("radix", f"case {i}", True)
    x = SimpleNamespace(args=SimpleNamespace(kernels=["radix", "pynccl"]), chk=chk, launches=None,
                        pynccl="PyNCCL needs two GPUs of one host; 1 visible here, so its cases were not run")
    m01.judge(run, x)
    assert verdict(run, "index, store and radix match")["verdict"] == "confirmed"
    alls = verdict(run, "all custom kernels match")
    assert alls["verdict"] == "inconclusive" and "premise failed: PyNCCL needs two GPUs of one host" in alls["observed"]


# msgl_comm_allreduce_4xh200.csv, msgl_comm_copy_overhead_4xh200.csv, msgl_comm_launches_rank0_4xh200.csv:
# allreduce.csv, copy_overhead.csv and launches.csv of the real `05_profile_comm.py --quick --tp 2 4` run on
# 4x H200 (NV18 between every pair, NVLink multicast off), commit 6977385. That run kept one median per point.
def test_05_reanalysis_of_a_real_4gpu_run(tmp_path, fixture_path):
    pytest.importorskip("pandas")
    src = tmp_path / "src"
    src.mkdir()
    for a, b in (("allreduce", "msgl_comm_allreduce_4xh200"), ("copy_overhead", "msgl_comm_copy_overhead_4xh200"),
                 ("launches", "msgl_comm_launches_rank0_4xh200")):
        shutil.copy(fixture_path(f"{b}.csv"), src / f"{a}.csv")
    (src / "summary.json").write_text(json.dumps({"provenance": {"gpu": "NVIDIA H200", "gpu_count": 4},
                                                  "headline": {"p2p_gb_s": 397.0}, "args": {"analyze": False}}))
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(SCRIPTS / "05_profile_comm.py"), "--reanalyse", str(src), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    v = {o["expected"]: (o["verdict"], o["observed"]) for o in s["observations"]}
    copies = next(x for k, x in v.items() if k.startswith("the symmetric buffer adds"))
    # NCCL's one-time set-up copies in the first traced call are not the buffer's per-call DtoD copies
    assert copies[0] == "confirmed" and "buffered [2, 2], direct [0, 0]" in copies[1] and "one-time" in copies[1]
    # one median per point: a single sample is never judged (the old run read 'refuted' on it)
    bw = next(x for k, x in v.items() if k.startswith("all-reduce reaches"))
    assert bw[0] == "inconclusive" and "one sample" in bw[1] and "311 GB/s" in bw[1] and "78% of the measured" in bw[1]
    # graph/eager at 8 KiB: 0.49 (pynccl buffer), 1.43 (direct), 0.31 (torch nccl): the interval straddles 1
    graph = next(x for k, x in v.items() if k.startswith("CUDA-graph replay lowers"))
    assert graph[0] == "inconclusive" and "straddles" in graph[1]
    assert s["headline"]["tp_sizes"] == "2,4" and (out / "busbw.png").exists() and s["story"].startswith("ALL-REDUCE")
    est = (out / "forward_estimate.csv").read_text()
    assert "decode bs=1" in est and "prefill 8192" in est
    bad = subprocess.run([sys.executable, str(SCRIPTS / "05_profile_comm.py"), "--reanalyse", str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "no allreduce.csv" in bad.stdout + bad.stderr and "Traceback" not in bad.stderr


def test_log_log_interpolation():
    pd = pytest.importorskip("pandas")
    m = load("05_profile_comm")
    df = pd.DataFrame({"bytes": [1024, 4096, 16384], "time_us": [10.0, 10.0, 40.0]})
    assert m.interp_us(df, 4096) == pytest.approx(10.0)
    assert m.interp_us(df, 8192) == pytest.approx(20.0)        # halfway in log(bytes) -> geometric mean
    assert m.interp_us(df, 100) == pytest.approx(10.0)         # clamped below the sweep
    assert m.interp_us(df, 1 << 20) == pytest.approx(40.0)     # and above


def test_radix_verdicts_are_ratios_of_one_repetition():
    """07 judges shares, ratios and exponents per repetition; its sizes always hold what those need."""
    m07 = load("07_profile_radix")
    p = m07.plan(SimpleNamespace(quick=True, depths=[4, 16], keys=[64], leaves=None))
    assert p.depths == [1, 4, 16] and 16 * m07.TURN in p.tokens and {8, 512} <= set(p.keys)
    assert (m07.H["tokens"].high, m07.H["match_depth"].low) == (0.5, 0.5)
    assert "knife-edge" in m07.__doc__ and m07.REPEATS >= 3


# ------------------------------------------------------------------ 08: the joined view on a recorded trace
@pytest.fixture(scope="module")
def sgl():
    """SGLang's graph capture (one prefill run_batch, one decode run_batch) as 08 reads a traced generate."""
    m08 = load("08_forward_timeline")
    ev = trace.read_chrome_trace(FIX / "sglang_story_trace_graphs_llama8b_h200_cut.json.gz")
    rx = re.compile(r"^step\[(?P<mode>[A-Z_]+) bs=(?P<bs>\d+)(?: toks=(?P<toks>\d+))?\]$")

    def parse(name):
        g = rx.match(name)
        return {"mode": {"EXTEND": "prefill", "DECODE": "decode"}[g["mode"]], "bs": int(g["bs"]),
                "toks": int(g["toks"] or g["bs"])}
    work = [{"tokens": 512, "qo_lens": [512], "kv_lens": [512]}, {"tokens": 1, "qo_lens": [1], "kv_lens": [513]}]
    kt = _msgl_joined.kernel_table(ev, work, models.config("llama-3.1-8b"), MSGL_H200, outer=r"^scheduler\.run_batch$",
                                   parse=parse)
    return SimpleNamespace(m=m08, ev=ev, kt=kt)


def test_08_kernel_table_layers_roles_and_work(sgl):
    kt = sgl.kt
    assert list(kt.groupby("step")["mode"].first()) == ["prefill", "decode"]
    assert kt.groupby("step")["layer"].max().tolist() == [31, 31]
    assert {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "attention", "kv_store", "lm_head"} <= set(kt["role"])
    gate = kt[(kt["step"] == 0) & (kt["role"] == "gate_up_proj") & (kt["layer"] == 3)].iloc[0]
    assert gate["flops"] == 2 * 512 * 28672 * 4096 and gate["pct_bf16_ceiling"] > 50
    tree = timeline.layer_tree(kt, 1)
    assert 95 < sum(r["share_all_layers_pct"] for r in tree) < 105


def test_08_layer_facts_on_a_real_trace(sgl, tmp_path):
    """Decode layers run the plan's order; SGLang's prefill layers attend before they store the KV (and launch an
    elementwise kernel): a mixed fact is inconclusive, never confirmed; no Layer_i range inside a graph replay."""
    import pandas as pd
    m, j = sgl.m, _msgl_joined
    order = j.layer_order(sgl.kt)
    dec = [r for r in order if r["mode"] == "decode"]
    pre = [r for r in order if r["mode"] == "prefill"]
    assert len(dec) == len(pre) == 32 and all(r["matches"] for r in dec) and not any(r["matches"] for r in pre)
    assert pre[0]["sequence"].startswith("norm > gemm > rope > attention > kv_store") and "elementwise" in pre[0]["others"]
    ranges = j.range_check(sgl.ev, sgl.kt, 32)
    assert [r["layer_ranges"] for r in ranges] == [0, 0] and [r["graph_launches"] > 0 for r in ranges] == [True, True]
    r = Run(SCRIPTS / "08_forward_timeline.py", {}, out=tmp_path / "run", quiet=True)
    a = {"order": [{"variant": "graph", **o} for o in order], "ranges": [{"variant": "graph", **x} for x in ranges],
         "steps": pd.DataFrame(), "prefix": pd.DataFrame(), "ncu": [], "kt": {"graph": sgl.kt}}
    m.judge(r, a, ())
    assert verdict(r, "layer-order")["verdict"] == "inconclusive" and "holds in 32 of 64" in verdict(r, "layer-order")["observed"]
    assert verdict(r, "no-ranges-in-graphs")["verdict"] == "confirmed"
    assert verdict(r, "layer-ranges-eager")["verdict"] == "inconclusive"       # no eager variant: a failed premise
    assert verdict(r, "plan-sync-per-step")["verdict"] == "refuted"            # SGLang plans outside its step ranges
    a["order"] = [o for o in a["order"] if o["mode"] == "decode"]
    m.judge(r, a, ())
    assert verdict(r, "layer-order")["verdict"] == "confirmed"                 # decode layers alone: the plan's order
    r.finish()


def test_08_analysis_end_to_end_with_counters(tmp_path):
    """analyse() as a run calls it: SGLang's graph capture with its two step ranges renamed as mini-SGLang names them
    (step[prefill bs=1 pad=1 tokens=512], step[decode bs=1 pad=1 tokens=1]; events otherwise unchanged) and the real
    ncu CSV of the same model cut to 2 layers (tests/test_timeline.py): the joined tables, the counters on every kernel
    class of a layer, the Perfetto trace, the figures."""
    import gzip

    from common.capture import ncu
    from common.render import plots
    m08 = load("08_forward_timeline")
    tr = json.loads(gzip.open(FIX / "sglang_story_trace_graphs_llama8b_h200_cut.json.gz", "rt").read())
    names = {"step[EXTEND bs=1 toks=512]": "step[prefill bs=1 pad=1 tokens=512]",
             "step[DECODE bs=1]": "step[decode bs=1 pad=1 tokens=1]"}
    for e in tr["traceEvents"]:
        e["name"] = names.get(e.get("name"), e.get("name"))
    (tmp_path / "trace_graph.json").write_text(json.dumps(tr))
    rows = kernels.summarize(ncu.read_raw(gzip.open(FIX / "sglang_story_ncu_graph_nodes_2layers_h200.csv.gz", "rt").read()))
    data = {"traced": {"graph": {"path": tmp_path / "trace_graph.json", "work": [
        {"tokens": 512, "qo_lens": [512], "kv_lens": [512]}, {"tokens": 1, "qo_lens": [1], "kv_lens": [513]}]}},
        "steps": [], "prefix": []}
    run = Run(SCRIPTS / "08_forward_timeline.py", {}, out=tmp_path / "run", quiet=True)
    a = _msgl_joined.analyse(run, data, models.config("llama-3.1-8b"), MSGL_H200, rows)
    win = {w["window"]: w for w in a["ncu"]}
    assert win["decode"]["matched"] == win["decode"]["expected"] and win["prefill"]["matched"] >= win["prefill"]["expected"] - 2
    kt = a["kt"]["graph"]
    assert kt["ncu_window"].notna().mean() > 0.95 and kt[kt["role"] == "gate_up_proj"]["flops"].notna().all()
    m08.judge(run, a, ("graph",))
    assert verdict(run, "counters-every-class")["verdict"] == "confirmed"
    run.figure("timeline", plots.joined_timeline(kt, title="test"))
    run.figure("layer_tree", plots.layer_tree(a["tree"], MSGL_H200))
    run.finish()
    out = tmp_path / "run"
    story = json.loads((out / "story_graph.json").read_text())
    assert (out / "story_graph.json").stat().st_size < 5 << 20 and {e["ph"] for e in story["traceEvents"]} >= {"X", "M"}
    assert {"kernels_graph.csv", "layer_check.csv", "layer_tree.csv", "class_shares.csv", "ncu_windows.csv",
            "timeline.png", "layer_tree.png"} <= {p.name for p in out.iterdir()}


def test_08_per_generate_on_the_committed_eager_steps():
    """06's (now 08's) committed eager generate: the gap after the prefill (10 us) is not a decode-to-decode gap."""
    import pandas as pd
    gpu_ms = [21.9, 5.65, 8.88, 8.92, 8.98, 8.98, 9.02, 8.73, 8.93, 8.98, 9.06, 8.90, 8.96, 9.22, 8.99, 9.09, 9.16]
    gaps = [None, 0.01, 0.47, 0.37, 0.32, 0.36, 0.29, 0.30, 0.29, 0.32, 0.34, 0.30, 0.31, 0.32, 0.31, 0.31, 0.31]
    steps = pd.DataFrame([{"variant": "eager", "rep": 0, "step": i, "phase": "prefill" if i == 0 else "decode",
                           "gpu_ms": g, "gap_before_ms": gap} for i, (g, gap) in enumerate(zip(gpu_ms, gaps))])
    m08 = load("08_forward_timeline")
    per_generate = _msgl_joined.per_generate
    assert per_generate(steps, "eager", "gpu_ms") == [pytest.approx(8.98)]
    assert per_generate(steps, "eager", "gap_before_ms") == [pytest.approx(0.31)]
    assert per_generate(steps, "eager", "gpu_ms", "prefill") == [21.9]
    fig = m08.variants_figure(steps)
    assert len(fig.axes) == 2
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_08_variants_and_steps_are_named_as_the_engine_runs_them():
    m08 = load("08_forward_timeline")
    assert _msgl_forward.parse_step("step[decode bs=32 pad=32 tokens=32]") == {"mode": "decode", "bs": 32, "pad": 32,
                                                                            "toks": 32}
    assert _msgl_forward.parse_step("Layer_3") == {}
    s = m08.settings(SimpleNamespace(quick=True, variants=None, decode_steps=None, ncu=False, backend=["fi"]))
    assert s.variants == ("eager", "graph", "graph-no-overlap") and s.decode >= 3 and not s.ncu
    full = m08.settings(SimpleNamespace(quick=False, variants=None, decode_steps=None, ncu=False, backend=["fi"]))
    assert full.ncu and "eager-no-overlap" in full.variants
    for cite in ("engine/graph.py:149-150", "scheduler/scheduler.py:121-131", "env.py:69", "llm/llm.py:90"):
        assert cite in m08.__doc__


def test_tvm_ffi_cache_rows(tmp_path):
    m = load("00_check_env")
    a = tmp_path / "minisgl__index_8192_4_128_1_false_0123456789abcdef"
    a.mkdir()
    (a / "minisgl__index_8192_4_128_1_false.so").write_bytes(b"x" * 2048)
    (tmp_path / "minisgl__radix_fedcba9876543210").mkdir()
    (tmp_path / "other_module_0123456789abcdef").mkdir()
    rows = {r["module"]: r for r in m.jit_cache_rows(tmp_path)}
    assert set(rows) == {"index", "radix"}
    assert rows["index"]["template_args"] == "8192_4_128_1_false" and rows["index"]["built"]
    assert rows["radix"]["template_args"] == "" and not rows["radix"]["built"]
    assert m.jit_cache_rows(tmp_path / "missing") == []
    assert [r["folder"] for r in m.built(list(rows.values()), "index", "8192_4")] == [a.name]


def test_ncu_cell_first_dim_and_store_copies_labels():
    assert load("02_profile_index").first_dim("(64, 1, 1)") == 64 and load("02_profile_index").first_dim("") is None
    m = load("03_profile_store")
    assert m.copies("store_kv_cache", 2048, 64).startswith("K and V rows of all 64 tokens")
    assert m.copies("index_elementwise_kernel", 2048, 64).startswith("one cache's rows")
    assert m.copies("vectorized_elementwise_kernel", 2048, 64).startswith("a helper")
