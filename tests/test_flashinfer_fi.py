"""FlashInfer track helpers (flashinfer/scripts/_fi.py) and script plumbing, on real fixtures.

Fixtures added for these tests (tests/fixtures/):
  torch_trace_sglang_extend_step_h200_cut.json
      cut from ../shared/fixtures/torch_profiler_trace_sglang_server_llama8b_dummy_h200_trimmed.json
      (SGLang server, Llama-3.1-8B shape, flashinfer backend, one EXTEND step of 11 tokens): the
      range `step[EXTEND bs=1 toks=11]`, the CUDA runtime/driver calls from 3 ms before to 3.4 ms
      after its start, and the kernels and memcpys those calls launched; python/cpu_op events dropped.
  flashinfer_probe_results_h200.jsonl
      the output lines of ../shared/device/probes/fi_probe.py (+ msgl_probe.py) on the H200, as recorded.
  ninja_log_v5_two_objects_rebuilt.txt
      the .ninja_log ninja 1.11.1 wrote for a 2-object shared library built, then rebuilt after
      touching one source (same v5 format FlashInfer's JIT folders hold).
Also used: ncu_raw_fullset_flashinfer_5kernels_h200.csv (see tests/fixtures/README.md).
"""
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "flashinfer" / "scripts"
sys.path.insert(0, str(SCRIPTS))
import _fi  # noqa: E402
from common import ncu, trace  # noqa: E402

NCU_FULL = "ncu_raw_fullset_flashinfer_5kernels_h200.csv"
TRACE = "torch_trace_sglang_extend_step_h200_cut.json"


def load_script(stem):
    spec = importlib.util.spec_from_file_location(f"fi_{stem}", SCRIPTS / f"{stem}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def ncu_rows(fixture_path):
    s = ncu.summarize(ncu.read_raw(fixture_path(NCU_FULL)))
    return {k: r for k, r in zip(s["kernel"], s.to_dict("records"))}


# ------------------------------------------------------------------ arithmetic

def test_causal_pairs_bottom_right():
    assert _fi.causal_pairs(4, 4) == 1 + 2 + 3 + 4
    # 2 new tokens on 5 keys: they see 4 and 5 keys (mask aligned bottom-right)
    assert _fi.causal_pairs(2, 5) == 4 + 5
    brute = sum(1 for i in range(7) for j in range(19) if j <= 19 - 7 + i)
    assert _fi.causal_pairs(7, 19) == brute
    assert _fi.causal_pairs(0, 9) == 0


def test_causal_prefill_needs_kv_at_least_qo():
    with pytest.raises(ValueError, match="qo_len <= kv_len"):
        _fi.causal_pairs(10, 9)
    with pytest.raises(ValueError, match="one entry per request"):
        _fi.prefill_flops([1, 2], [3], 32, 128)


def test_prefill_flops_reproduce_the_h200_probe(fixture_path):
    # fi_probe.py timed FA2 prefill: 8 requests x 512 new tokens on 4096 KV, 32 q heads, head_dim 128
    rec = next(json.loads(l) for l in fixture_path("flashinfer_probe_results_h200.jsonl").read_text().splitlines()
               if '"batch_prefill_paged_fa2"' in l)
    flops = _fi.prefill_flops([512] * 8, [4096] * 8, 32, 128)
    assert flops / (rec["ms"] * 1e-3) / 1e12 == pytest.approx(rec["TFLOP_s"], rel=2e-3)
    # non-causal attends every pair: more work than causal on the same shape
    assert _fi.prefill_flops([512] * 8, [4096] * 8, 32, 128, causal=False) > flops


def test_decode_bytes_reproduce_the_h200_probe(fixture_path):
    rec = next(json.loads(l) for l in fixture_path("flashinfer_probe_results_h200.jsonl").read_text().splitlines()
               if '"batch_decode_paged"' in l)
    kv = [4096] * 32
    qo_bytes = 2 * 32 * 32 * 128 * 2                      # q read + o written, 32 q heads
    kv_bytes = _fi.decode_bytes(kv, 32, 8, 128) - qo_bytes
    assert kv_bytes == 32 * 4096 * 2 * 8 * 128 * 2        # the probe's count: K and V, 8 kv heads, bf16
    assert kv_bytes / (rec["ms"] * 1e-3) / 1e9 == pytest.approx(rec["GB_s"], rel=2e-3)
    assert _fi.decode_flops(kv, 32, 128) == 4 * 32 * 128 * sum(kv)
    assert _fi.intensity(_fi.decode_flops(kv, 32, 128), kv_bytes) == pytest.approx(32 / 8)   # = GQA group


def test_formulas_match_dram_bytes_ncu_read(ncu_rows):
    """The bytes each kernel must read (formula) against what ncu saw it read from DRAM (same probe shapes)."""
    dec = ncu_rows["BatchDecodeWithPagedKVCacheKernel"]
    read = _fi.decode_bytes([4096] * 32, 32, 8, 128) - 32 * 32 * 128 * 2       # all but the output
    assert dec["dram_read_mb"] * 1e6 == pytest.approx(read, rel=0.01)
    pre = ncu_rows["BatchPrefillWithPagedKVCacheKernel"]
    read = _fi.prefill_bytes([512] * 8, [4096] * 8, 32, 8, 128) - 8 * 512 * 32 * 128 * 2
    assert pre["dram_read_mb"] * 1e6 == pytest.approx(read, rel=0.03)
    rope = ncu_rows["BatchQKApplyRotaryPosIdsCosSinCacheHeadParallelismKernel"]
    read = _fi.rope_bytes(8192, 32, 8, 128, per_token_extra=8 + 4 * 128) / 2 + 8192 * (8 + 4 * 128) / 2
    assert rope["dram_read_mb"] * 1e6 == pytest.approx(read, rel=0.03)


# ------------------------------------------------------------------ plan_info, grids

def test_decode_plan_info_layouts():
    d = _fi.decode_plan_info([128, 0, 64, 128, 256, 384, 512, 77, 0, 1])
    assert d["layout"].startswith("decode") and d["padded_batch_size"] == 128 and d["split_kv"] is True
    p = _fi.decode_plan_info(list(range(14)) + [0])
    assert p["cta_tile_q"] == 3 and p["split_kv"] is False and p["kv_chunk_size_ptr_offset"] == 9
    f = _fi.decode_plan_info([0] * 8 + [1])
    assert f["layout"].startswith("prefill fa3") and "split_kv" not in f


def test_plan_info_of_another_layout_fails_loudly():
    with pytest.raises(_fi.PlanInfoError, match="has 11 entries"):
        _fi.decode_plan_info(list(range(11)))


def test_chunk_size_read_from_the_pinned_buffer():
    buf = bytes(100) + (1024).to_bytes(4, "little") + bytes(8)
    assert _fi.read_i32(buf, 100) == 1024
    d = _fi.decode_plan_info([128, 0, 0, 0, 0, 0, 0, 100, 0, 1], pinned=buf)
    assert d["kv_chunk_tokens"] == 1024
    with pytest.raises(_fi.PlanInfoError, match="outside"):
        _fi.read_i32(buf, len(buf) - 2)


def test_grid_dims_from_ncu(ncu_rows):
    # b32 x kv4096 decode: grid (padded_batch_size, kv heads) = 32 requests x 4 KV chunks, 8 kv heads
    assert _fi.grid_dims(ncu_rows["BatchDecodeWithPagedKVCacheKernel"]["grid"]) == (128, 8, 1)
    assert _fi.grid_dims(ncu_rows["BatchPrefillWithPagedKVCacheKernel"]["grid"]) == (128, 1, 8)
    assert _fi.grid_dims("") is None and _fi.grid_dims(None) is None


def test_page_table():
    indptr, last = _fi.page_table([1, 16, 17, 100], 16)
    assert indptr == [0, 1, 2, 4, 11] and last == [1, 16, 1, 4]
    with pytest.raises(ValueError, match="at least one KV token"):
        _fi.page_table([0], 16)


# ------------------------------------------------------------------ kernels per call from a real trace

def test_kernels_in_ranges_on_a_real_sglang_step(fixture_path):
    ev = trace.read_chrome_trace(fixture_path(TRACE))
    rows = _fi.kernels_in_ranges(ev, r"^step\[")
    assert set(rows["label"]) == {"step[EXTEND bs=1 toks=11]"} and (rows["call"] == 0).all()
    kern = rows[rows["gpu_kind"] == "kernel"]
    counts = kern["kernel"].value_counts()
    # kernels launched before the step range began are not counted in it
    assert len(kern) == len(trace.kernels(ev)) - 3
    copies = rows[rows["gpu_kind"] == "memcpy"]
    assert len(copies) == 12 and copies["kernel"].str.startswith("Memcpy ").all()   # the step's own copies
    assert "compute_position_kernel" not in counts and "write_req_to_token_pool_triton" not in counts
    # each paged prefill that split its KV is followed by its merge kernel
    assert counts["BatchPrefillWithPagedKVCacheKernel"] == counts["PersistentVariableLengthMergeStatesKernel"] == 2
    s = _fi.calls_summary(rows).iloc[0]
    assert s["calls"] == 1 and s["kernels_per_call"] == len(kern) and s["copies_per_call"] == 12
    assert s["merge_kernel"] and s["fill_kernel"] and 0 < s["merge_share_pct"] < 100
    assert s["kernels"].split(" + ")[0] == kern.sort_values("ts_us")["kernel"].iloc[0]
    assert "Memcpy HtoD (Pinned -> Device)" in s["copies"] and "Memcpy" not in s["kernels"]


def test_no_matching_range_fails_loudly(fixture_path):
    ev = trace.read_chrome_trace(fixture_path(TRACE))
    with pytest.raises(trace.TraceError, match="no user range"):
        _fi.kernels_in_ranges(ev, r"^decode ")


def test_split_label():
    assert _fi.split_label("decode cuda b=32 kv=4096 #2") == ("decode cuda b=32 kv=4096", 2)
    assert _fi.split_label("step[EXTEND bs=1 toks=11]") == ("step[EXTEND bs=1 toks=11]", 0)


# ------------------------------------------------------------------ JIT cache

def test_ninja_log_last_entry_wins(fixture_path):
    nl = _fi.parse_ninja_log(fixture_path("ninja_log_v5_two_objects_rebuilt.txt").read_text())
    assert sorted(nl["output"]) == ["a.o", "b.o", "mod.so"]
    a = nl.set_index("output").loc["a.o"]
    assert a["start_ms"] == 1 and a["seconds"] == pytest.approx(0.034)   # the rebuild, not the first build
    assert (nl["seconds"] >= 0).all()


def test_ninja_log_bad_input_fails_loudly(fixture_path):
    with pytest.raises(_fi.NinjaLogError, match="ninja log"):
        _fi.parse_ninja_log(fixture_path(NCU_FULL).read_text()[:2000])
    text = fixture_path("ninja_log_v5_two_objects_rebuilt.txt").read_text()
    with pytest.raises(_fi.NinjaLogError, match="line 3"):
        _fi.parse_ninja_log(text[:text.index("\n", 20) + 12])              # cut in the middle of a line


def test_jit_modules_lists_a_cache_folder(tmp_path, fixture_path):
    mod = tmp_path / "cached_ops" / "norm"
    mod.mkdir(parents=True)
    (mod / "norm.so").write_bytes(b"\0" * 2_000_000)
    (mod / "a.cuda.o").write_bytes(b"x")
    (mod / "b.o").write_bytes(b"x")
    (mod / ".ninja_log").write_text(fixture_path("ninja_log_v5_two_objects_rebuilt.txt").read_text())
    (tmp_path / "cached_ops" / "tmp").mkdir()                             # lock folder: not a module
    (tmp_path / "cached_ops" / "half_built").mkdir()
    rows = {r["module"]: r for r in _fi.jit_modules(tmp_path / "cached_ops")}
    assert set(rows) == {"norm", "half_built"}
    assert rows["norm"]["compiled"] and rows["norm"]["so_mb"] == 2.0 and rows["norm"]["objects"] == 2
    assert rows["norm"]["nvcc_sum_s"] == pytest.approx(0.9, abs=0.05)      # a.o (rebuilt) + b.o
    assert not rows["half_built"]["compiled"]
    assert _fi.jit_modules(tmp_path / "missing") == []


def test_short_module_names():
    assert _fi.short_module("batch_prefill_with_kv_cache_dtype_q_bf16_f16qk_False_sm90") == "batch_prefill_sm90 (fa3)"
    assert _fi.short_module("batch_decode_with_kv_cache_dtype_q_bf16") == "batch_decode"
    assert _fi.short_module("norm") == "norm"


# ------------------------------------------------------------------ the scripts: kernel regexes, sweep sizes, --help

def test_kernel_regexes_match_real_ncu_names(fixture_path):
    names = list(ncu.read_raw(fixture_path(NCU_FULL))["Kernel Name"])
    m02, m03 = load_script("02_profile_prefill"), load_script("03_profile_decode")
    assert [n for n in names if re.search(m03.KERNELS, n)] == names[:1] + names[1:2]  # decode (+ tc = prefill kernel)
    assert [n for n in names if re.search(m02.KERNELS, n)] == names[1:2]
    rope = ncu.short_name(names[4])
    assert re.search(_fi.ROPE_APIS["apply_rope_with_cos_sin_cache_inplace"][2], rope)
    assert not re.search(_fi.ROPE_APIS["apply_llama31_rope_pos_ids"][2], rope)


def test_quick_sweeps_stay_small():
    m02, m03, m05 = load_script("02_profile_prefill"), load_script("03_profile_decode"), load_script("05_profile_rope")
    p3 = m03.plan_points(m03.parse_args(["--quick"]))
    assert len(p3) == 18 and {p["model"] for p in p3} == {"llama-3.1-8b"}
    assert len(m03.plan_points(m03.parse_args([]))) == 2 * 2 * 6 * 7
    assert len(m02.plan_points(m02.parse_args(["--quick"]), ["fa2", "fa3"])) == 12
    one = m03.plan_points(m03.parse_args(["--variants", "cuda", "--batches", "32", "--kv-lens", "4096", "--quick"]))
    assert one == [{"model": "llama-3.1-8b", "variant": "cuda", "batch": 32, "kv_len": 4096}]
    assert len(m05.plan_points(m05.parse_args(["--quick"]))) == 4 * len(m05.VARIANTS)
    with pytest.raises(SystemExit):
        m03.plan_points(m03.parse_args(["--variants", "cuda,gpu"]))


@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("[0-9][0-9]_*.py")))
def test_help_runs_without_gpu_packages(script):
    out = subprocess.run([sys.executable, str(SCRIPTS / script), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Run" in out.stdout and "--quick" in out.stdout


@pytest.mark.parametrize("script", ["06_full_pipeline.sh", "ncu_profile.sh"])
def test_shell_wrappers_help(script):
    out = subprocess.run(["bash", str(SCRIPTS / script), "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "Usage" in out.stdout
    bad = subprocess.run(["bash", str(SCRIPTS / script), "--no-such-flag"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "unknown option" in bad.stderr


class _Recorder:
    """Stands in for a results.Run: keeps what observe()/headline() were given."""

    def __init__(self):
        self.obs, self.head = [], {}

    def observe(self, *a):
        self.obs.append(a)

    def headline(self, **k):
        self.head.update(k)


def _fake_bgt(calls):
    """A stand-in for bench_gpu_time: CUPTI mode 0.110 ms, spaced graph 0.100 (n per replay) / 0.118
    (1 per replay), back-to-back graph 0.105, events 0.120 (made-up numbers; the logic is tested)."""
    def bgt(fn, input_args=(), **kw):
        calls.append(kw)
        fn(*input_args)
        if kw.get("enable_cupti"):
            return [0.110, 0.111, 0.109]
        if kw.get("sleep_after_run"):
            return [0.118] if kw["num_iters_within_graph"] == 1 else [0.100, 0.101, 0.099]
        return [0.105] if kw.get("use_cuda_graph") else [0.120]
    return bgt


class _T:
    def __init__(self, ms):
        self.median_ms = ms


def _wb(default_ms, write_ms):
    """A stand-in for common.timing.bench: ``default_ms`` with its default flush, ``write_ms`` with flush='write'."""
    return lambda fn, **kw: (fn(), _T(write_ms if kw.get("flush") == "write" else default_ms))[1]


def test_cross_check_compares_cupti_with_cupti_at_the_same_flush(monkeypatch):
    """With cupti-python the reference is bench_gpu_time's CUPTI mode in a CUDA graph, compared with the
    workbook's number at FlashInfer's write-only flush; the default-vs-default ratio and the spaced modes'
    launch overhead are kept beside it."""
    monkeypatch.setattr(_fi, "cupti_python", lambda: None)
    calls, seen = [], []
    out = _fi.cross_check(_fake_bgt(calls), lambda a, b: seen.append((a, b)), (1, 2), _wb(0.102, 0.1122))
    assert out["reference"] == "cupti_graph" and out["reference_ms"] == 0.110
    assert out["workbook_compared"] == "workbook_write_flush_ms"
    assert abs(out["ratio"] - 1.02) < 1e-9 and abs(out["ratio_default"] - 0.102 / 0.110) < 1e-9
    assert calls[-2:] == [dict(enable_cupti=True, use_cuda_graph=True)] * 2       # the first session is kept aside
    assert out["bgt_cupti_graph_first_ms"] == 0.110
    assert calls[0]["num_iters_within_graph"] == 10 and calls[0]["sleep_after_run"]          # 0.102 ms -> 10 per replay
    assert calls[1]["num_iters_within_graph"] == 1 and calls[1]["sleep_after_run"]           # + one call per replay
    # per replay: spaced_1 = k + L, spaced_10 = k + L/10  ->  L = (0.118 - 0.100) * 10 / 9 ms = 20 us
    assert abs(out["spaced_replay_overhead_us"] - 20.0) < 1e-6
    assert all(s == (1, 2) for s in seen)
    calls.clear()
    long = _fi.cross_check(_fake_bgt(calls), lambda a, b: None, (1, 2), _wb(3.0, 3.0))     # 3 ms: 1 per replay
    assert "bgt_graph_spaced_1_ms" not in long and "spaced_replay_overhead_us" not in long
    assert calls[0]["num_iters_within_graph"] == 1

    r = _Recorder()
    _fi.observe_cross_check(r, [dict(out, label="x")], lambda x: x["label"])
    expected, observed, verdict, _ = r.obs[0]
    assert verdict == "confirmed" and abs(r.head["bench_gpu_time_max_deviation_pct"] - 2.0) < 1e-6
    assert "x: 1.020" in observed and "x: 0.927" in observed and "20 us per replay of 10" in observed
    _fi.observe_cross_check(r, [dict(out, ratio=0.95, label="y")], lambda x: x["label"])
    assert r.obs[1][2] == "refuted"
    line = _fi.cross_check_line([dict(out, label="x")], lambda x: x["label"])
    assert "x 1.020" in line and "clean-L2 default: x 0.927" in line


def test_cross_check_without_cupti_python_falls_back_to_the_spaced_graph(monkeypatch):
    """Without cupti-python bench_gpu_time would silently time with events: the reference is then its
    spaced graph mode, compared with the workbook's default number, and the row says so."""
    monkeypatch.setattr(_fi, "cupti_python", lambda: "cupti-python unavailable")
    calls = []
    out = _fi.cross_check(_fake_bgt(calls), lambda a, b: None, (1, 2), _wb(0.102, 0.1122))
    assert not any(c.get("enable_cupti") for c in calls) and "bgt_cupti_graph_ms" not in out
    assert out["reference"] == "graph_spaced" and out["workbook_compared"] == "workbook_ms"
    assert abs(out["ratio"] - 1.02) < 1e-9
    r = _Recorder()
    _fi.observe_cross_check(r, [dict(out, label="x")], lambda x: x["label"])
    assert "graph_spaced" in r.obs[0][1] and r.obs[0][2] == "confirmed"
    assert "graph_spaced mode" in _fi.cross_check_line([dict(out, label="x")], lambda x: x["label"])


# fi_cross_check_decode_h200.csv: cross_check.csv of the real `03_profile_decode.py --quick --ncu` run on
# one H200 at commit 63d8e4f (FlashInfer 0.6.15.post1, cupti-python 13.0.1 present for the CUPTI column).
def test_cross_check_verdict_on_the_real_h200_rows(fixture_path):
    pd = pytest.importorskip("pandas")
    rows = pd.read_csv(fixture_path("fi_cross_check_decode_h200.csv")).to_dict("records")
    assert {r["reference"] for r in rows} == {"graph_spaced"} and len(rows) == 3

    r = _Recorder()
    _fi.observe_cross_check(r, rows, lambda x: f"{x['variant']} b{x['batch']} kv{x['kv_len']}")
    expected, observed, verdict, evidence = r.obs[0]
    assert verdict == "confirmed" and r.head["bench_gpu_time_max_deviation_pct"] < 3
    assert "cuda b256 kv32768" in observed and "MHz" in observed      # the back-to-back mode and its clock are shown
    worst_default = max(abs(x["workbook_ms"] / x["bgt_graph_ms"] - 1) for x in rows)
    assert worst_default > 0.03     # the sustained default mode is the one that disagreed; the record keeps it


# fi_cross_check_decode_h200_b2e5.csv: cross_check.csv of the real `06_full_pipeline.sh --quick --ncu --nsys`
# run at commit c631eb8 on another H200 (UUID GPU-b2e50433...), where tensor-core decode b32 x kv 4096 read
# 0.965 of the spaced reference (0.966 and 0.968 in two more runs that day on the same GPU).
def test_cross_check_verdict_refutes_on_the_h200_where_one_point_missed(fixture_path):
    pd = pytest.importorskip("pandas")
    rows = pd.read_csv(fixture_path("fi_cross_check_decode_h200_b2e5.csv")).to_dict("records")

    r = _Recorder()
    _fi.observe_cross_check(r, rows, lambda x: f"{x['variant']} b{x['batch']} kv{x['kv_len']}")
    expected, observed, verdict, evidence = r.obs[0]
    assert verdict == "refuted" and 3 < r.head["bench_gpu_time_max_deviation_pct"] < 4
    assert "tc b32 kv4096: 0.965" in observed
    within = [abs(x["ratio"] - 1) <= 0.03 for x in rows]
    assert within.count(True) == 2 and not within[1]          # only the tensor-core point misses
    tc = rows[1]
    assert abs(tc["workbook_ms"] / tc["bgt_graph_ms"] - 1) < 0.01   # ... and agrees with the back-to-back mode


# fi_cross_check_decode_h200_b7d6.csv: cross_check.csv of the real `06_full_pipeline.sh --quick --ncu --nsys` run
# at commit b7d68da on one H200 (GPU-5028283b...), the like-for-like reference (bench_gpu_time CUPTI in a CUDA graph,
# its second session) with cupti-python 13.0.1.
def test_cross_check_like_for_like_on_the_real_h200_rows(fixture_path):
    pd = pytest.importorskip("pandas")
    rows = pd.read_csv(fixture_path("fi_cross_check_decode_h200_b7d6.csv")).to_dict("records")
    assert {r["reference"] for r in rows} == {"cupti_graph"}
    assert {r["workbook_compared"] for r in rows} == {"workbook_write_flush_ms"}

    r = _Recorder()
    _fi.observe_cross_check(r, rows, lambda x: f"{x['variant']} b{x['batch']} kv{x['kv_len']}")
    expected, observed, verdict, evidence = r.obs[0]
    assert verdict == "confirmed" and r.head["bench_gpu_time_max_deviation_pct"] < 3
    # each tool's default disagrees on the tensor-core point (the dirty L2 lines FlashInfer's flush leaves)
    tc = next(x for x in rows if x["variant"] == "tc")
    assert tc["ratio_default"] < 0.97 and "tc b32 kv4096: 0.934" in observed
    assert "us per replay of 10" in observed     # the spaced mode's launch from idle is shown
    # the first CUPTI session's reading is kept, and it exceeds bench_gpu_time's own event bracket
    assert all(x["bgt_cupti_graph_first_ms"] > x["bgt_events_ms"] for x in rows)
