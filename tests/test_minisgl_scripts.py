"""CPU tests of the mini-SGLang scripts themselves: --help everywhere (no torch here), and the small
pure functions inside the scripts (ncu cell parsing, log-log interpolation, kernel categories,
tvm-ffi cache folder names). Kernel names are taken from real traces (tests/fixtures)."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "mini-sglang" / "scripts"
FIX = Path(__file__).resolve().parent / "fixtures"
PY = sorted(p for p in SCRIPTS.glob("[0-9][0-9]_*.py"))
SH = sorted(SCRIPTS.glob("*.sh"))


def load(stem):
    spec = importlib.util.spec_from_file_location(f"msgl_{stem}", SCRIPTS / f"{stem}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_track_is_complete():
    names = {p.name for p in PY} | {p.name for p in SH}
    for n in ("00_check_env.py", "01_test_kernels.py", "02_profile_index.py", "03_profile_store.py",
              "04_profile_attention.py", "05_profile_comm.py", "06_full_pipeline.sh", "06_forward_timeline.py",
              "07_profile_radix.py", "ncu_profile.sh"):
        assert n in names


@pytest.mark.parametrize("script", PY, ids=lambda p: p.name)
def test_python_help_runs_without_torch(script):
    p = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    title = script.read_text().split('"""')[1].splitlines()[0]
    assert title.startswith(script.name[:2] + " · ")          # the docstring's title line
    assert "--quick" in p.stdout and "Run" in p.stdout          # flags and the copy-paste commands


@pytest.mark.parametrize("script", SH, ids=lambda p: p.name)
def test_shell_help(script):
    p = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "Usage" in p.stdout and "set -euo" not in p.stdout
    bad = subprocess.run(["bash", str(script), "--no-such-flag"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2


def test_ncu_cell_first_dim():
    m = load("02_profile_index")
    assert m.first_dim("(64, 1, 1)") == 64 and m.first_dim("(128, 1, 1)") == 128
    assert m.first_dim("") is None


def test_log_log_interpolation():
    pd = pytest.importorskip("pandas")
    m = load("05_profile_comm")
    df = pd.DataFrame({"bytes": [1024, 4096, 16384], "time_us": [10.0, 10.0, 40.0]})
    assert m.interp_us(df, 4096) == pytest.approx(10.0)
    assert m.interp_us(df, 8192) == pytest.approx(20.0)        # halfway in log(bytes) -> geometric mean
    assert m.interp_us(df, 100) == pytest.approx(10.0)         # clamped below the sweep
    assert m.interp_us(df, 1 << 20) == pytest.approx(40.0)     # and above


def test_kernel_categories_on_real_names():
    m = load("06_forward_timeline")
    import json
    names = {e["name"] for e in json.loads((FIX / "torch_trace_sglang_extend_step_h200_cut160.json").read_text())["traceEvents"]
             if e.get("cat") == "kernel"}
    from common.ncu import short_name
    seen = {short_name(n): m.category(short_name(n)) for n in names}
    assert seen["FusedAddRMSNormKernel"] == "norm"
    assert seen["act_and_mul_kernel"] == "activation" and seen["fused_rope_kernel"] == "rope"
    assert seen["BatchPrefillWithPagedKVCacheKernel"] == "attention" and seen["MergeStateKernel"] == "attention"
    assert seen["splitKreduce_kernel"] == "gemm"
    assert all(v == "gemm" for k, v in seen.items() if k.startswith("nvjet"))
    # mini-SGLang's own kernels and FlashInfer's rope (names as nsys/ncu print them on the H200)
    assert m.category("store_kv_cache") == "store" and m.category("index_kernel") == "embedding"
    assert m.category("BatchQKApplyRotaryPosIdsCosSinCacheHeadParallelismKernel") == "rope"
    assert m.category("vectorized_elementwise_kernel") == "other"


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


def test_store_copies_labels():
    m = load("03_profile_store")
    assert m.copies("store_kv_cache", 2048, 64).startswith("K and V rows of all 64 tokens")
    assert m.copies("index_elementwise_kernel", 2048, 64).startswith("one cache's rows")
    assert m.copies("vectorized_elementwise_kernel", 2048, 64).startswith("a helper")


# msgl_comm_allreduce_4xh200.csv, msgl_comm_copy_overhead_4xh200.csv, msgl_comm_launches_rank0_4xh200.csv:
# allreduce.csv, copy_overhead.csv and launches.csv of the real `05_profile_comm.py --quick --tp 2 4` run on
# 4x H200 (NV18 between every pair, NVLink multicast off), commit 6977385.
def test_05_reanalysis_of_a_real_4gpu_run(tmp_path, fixture_path):
    import json
    import shutil
    import subprocess
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
    bw = next(x for k, x in v.items() if k.startswith("all-reduce reaches"))
    assert bw[0] == "refuted" and "311 GB/s" in bw[1] and "78% of the measured" in bw[1]
    assert s["headline"]["tp_sizes"] == "2,4" and (out / "busbw.png").exists() and s["story"].startswith("ALL-REDUCE")
    est = (out / "forward_estimate.csv").read_text()
    assert "decode bs=1" in est and "prefill 8192" in est
    bad = subprocess.run([sys.executable, str(SCRIPTS / "05_profile_comm.py"), "--reanalyse", str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "no allreduce.csv" in bad.stdout + bad.stderr and "Traceback" not in bad.stderr
