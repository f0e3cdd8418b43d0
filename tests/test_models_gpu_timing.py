"""Model presets, the device table, provenance, the timing maths and the one-line errors."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.base import checks
from common.capture import ceilings, gpu, models, probes, timing

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("preset,params_b", [("llama-3.1-8b", 8.03), ("llama-3.1-70b", 70.55),
                                              ("qwen2.5-7b", 7.62)])
def test_presets_are_the_published_architectures(preset, params_b):
    """Parameter counts implied by the configs match the models' published sizes."""
    assert models.param_count(preset) / 1e9 == pytest.approx(params_b, abs=0.01)


def test_kv_bytes_per_token():
    # Llama-3.1-8B: 2 (K,V) x 32 layers x 8 kv heads x 128 x 2 bytes = 128 KiB per token
    assert models.kv_bytes_per_token("llama-3.1-8b") == 131072


def test_model_dir_and_synthetic_tokenizer(tmp_path):
    d = models.write_model_dir("tiny-llama", tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["num_key_value_heads"] == 2 and cfg["head_dim"] == 128
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    ids = tok.encode("You are a helpful assistant.").ids
    assert ids[0] == 128000 and len(ids) == 1 + len("You are a helpful assistant.")
    assert tok.decode(ids) == "You are a helpful assistant."
    assert tok.get_vocab_size() == cfg["vocab_size"]
    mtime = (d / "tokenizer.json").stat().st_mtime_ns
    models.write_model_dir("tiny-llama", tmp_path / "m")                 # identical dir is reused
    assert (d / "tokenizer.json").stat().st_mtime_ns == mtime
    with pytest.raises(KeyError, match="unknown model preset"):
        models.config("llama-9")


@pytest.mark.parametrize("name,model", [("NVIDIA H200", "H200 SXM"), ("NVIDIA H100 80GB HBM3", "H100 SXM"),
                                        ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
                                        ("NVIDIA A100-PCIE-40GB", "A100 40GB PCIe"), ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
                                        ("NVIDIA L40S", "L40S"), ("NVIDIA B200", "B200"), ("NVIDIA H200 NVL", "H200 NVL")])
def test_device_table(name, model):
    assert gpu.device_spec(name)["model"] == model
    assert gpu.device_spec("Radeon") is None


def test_topology_parser_real_format():
    # `nvidia-smi topo -m` as printed on the H200 machine (tabs and ANSI underline kept)
    one = "\x1b[4m\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\nGPU0\t X \t0-15\t0\t\tN/A\n\nLegend:\n"
    t = gpu.parse_topo(one)
    assert t["gpus"] == ["GPU0"] and t["links"] == {} and t["numa"] == {"GPU0": "0"}
    two = ("\x1b[4m\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
           "GPU0\t X \tNV18\t0-31\t0\t\tN/A\nGPU1\tNV18\t X \t0-31\t0\t\tN/A\n")
    assert gpu.parse_topo(two)["links"] == {"GPU0-GPU1": "NV18", "GPU1-GPU0": "NV18"}


def test_snapshot_without_gpu_is_complete():
    s = gpu.snapshot(argv=["x.py", "--quick"])
    assert s["command"] == "x.py --quick" and "commit" in s["git"]
    line = gpu.provenance_line(s)
    assert "commit" in line and "`x.py --quick`" in line
    # the CUDA field: torch's runtime when torch was imported, else the toolkit's nvcc (real 04 run: no torch)
    assert "CUDA 13.0 ·" in gpu.provenance_line({"cuda_runtime": "13.0", "nvcc": "12.8"})
    assert "CUDA 13.0 (nvcc) ·" in gpu.provenance_line({"nvcc": "13.0"})
    assert "CUDA ? ·" in gpu.provenance_line({})
    re_ = gpu.provenance_line({"gpu": "NVIDIA H200", "reanalysed": {"git": {"commit": "abc1234"}, "command": "x.py --reanalyse d"}})
    assert "NVIDIA H200" in re_ and "re-analysed (no GPU)" in re_ and "abc1234" in re_


def test_commit_from_environment(monkeypatch):
    monkeypatch.setenv("HANDS_ON_GIT_COMMIT", "abc123-dirty")
    assert gpu.snapshot()["git"] == {"commit": "abc123", "dirty": True, "source": "HANDS_ON_GIT_COMMIT"}


def test_timing_statistics_and_rates():
    t = timing.Timing(samples_ms=[1.0, 2.0, 3.0, 4.0, 100.0], method="events", cold_l2=True)
    assert t.median_ms == 3.0 and t.quantile_ms(0.5) == 3.0 and t.min_ms == 1.0
    assert t.quantile_ms(0.9) == pytest.approx(61.6)
    assert t.to_dict()["n"] == 5 and "samples_ms" not in t.to_dict()
    assert timing.Timing(samples_ms=[2.5], method="events", cold_l2=False).quantile_ms(0.9) == 2.5
    r = timing.rates(0.2, bytes=800e6, flops=2e9, peaks={"dram_tb_s": 4.0, "bf16_tflops": 800, "l2_mb": 50.0})
    assert r["eff_tb_s"] == pytest.approx(4.0) and r["eff_pct"] == pytest.approx(100)     # 800 MB = 16 x L2
    assert r["tflop_s"] == pytest.approx(10) and r["flop_per_byte"] == pytest.approx(2.5)
    assert r["pct_bf16_ceiling"] == pytest.approx(1.25)
    assert "above_ceiling" not in r and "note" not in r           # exactly 100% is not above
    with pytest.raises(ValueError):
        timing.bench(lambda: None, method="stopwatch")


def test_timing_quantile_is_the_one_in_stats():
    """Timing uses common.base.stats.quantile (one percentile function in the workbook)."""
    from common.base import stats
    samples = [5.0, 1.0, 4.0, 2.0, 3.0, 9.0, 7.0]
    t = timing.Timing(samples_ms=samples, method="events", cold_l2=False)
    for q in (0.0, 0.1, 0.5, 0.9, 1.0):
        assert t.quantile_ms(q) == stats.quantile(sorted(samples), q)
    assert t.quantile_ms(0.9) == stats.percentiles(samples, qs=(90,))["p90"]


def test_rates_above_ceiling_is_flagged_not_clipped():
    """4.34 TB/s against a 4.25 TB/s measured ceiling (mini-SGLang decode on an H200): 102%, kept and flagged."""
    pk = {"dram_tb_s": 4.25, "dram_read_tb_s": 4.25, "bf16_tflops": 741.0, "source": "measured", "l2_mb": 60.0,
          "sources": {"dram_read_tb_s": "measured", "bf16_tflops": "measured"},
          "method": {"dram_read_tb_s": "fastest read probe: torch x.sum()",
                     "bf16_tflops": "best of 16 GEMM shapes: 8192x8192x8192 nt"}}
    r = timing.rates(1.0, bytes=4.34e9, peaks=pk, mix="read")
    assert r["eff_pct"] == pytest.approx(102.1, abs=0.05)                # never clipped
    assert r["above_ceiling"] is True
    assert "measured DRAM read ceiling 4.25 TB/s" in r["note"] and "2.1% above" in r["note"]
    assert "torch x.sum()" in r["note"] and "under-measures" in r["note"]
    r = timing.rates(1.0, flops=784e9, peaks=pk)                          # SGLang eager prefill GEMM vs 741
    assert r["above_ceiling"] is True and "bf16 tensor ceiling 741 TFLOP/s" in r["note"]
    assert r["pct_bf16_ceiling"] == pytest.approx(105.8, abs=0.05)
    r = timing.rates(1.0, bytes=5.0e9, flops=800e9, peaks=pk, mix="read")  # both above: both named
    assert r["note"].count("above it") == 2
    r = timing.rates(1.0, bytes=4.0e9, peaks=pk, mix="read")
    assert "above_ceiling" not in r and r["eff_pct"] < 100
    r = timing.rates(1.0, bytes=5.0e9, peaks={"dram_tb_s": 4.8, "source": "datasheet", "l2_mb": 60.0})
    assert r["above_ceiling"] and "datasheet DRAM copy ceiling" in r["note"]


def test_effective_bandwidth_of_a_small_working_set_is_never_a_dram_percent():
    """A call that moves less than 4 x L2 gets effective TB/s only: its bytes may never leave L2."""
    pk = {"dram_tb_s": 3.30, "dram_copy_tb_s": 3.02, "l2_mb": 50.0}
    r = timing.rates(0.001, bytes=8.4e6, peaks=pk)                       # 8.4 MB in 1 us: 8.4 TB/s
    assert r["eff_tb_s"] == pytest.approx(8.4) and math.isnan(r["eff_pct"]) and r["l2_resident"]
    assert "working set 8.4 MB < 4 x L2 (50 MiB)" in r["eff_pct_why"] and "above_ceiling" not in r
    r = timing.rates(0.1, bytes=180e6, peaks=pk)                          # 180 MB < 200 MB: still no %
    assert math.isnan(r["eff_pct"]) and not r["l2_resident"]
    r = timing.rates(0.1, bytes=180e6, peaks=pk, working_set=1e9)         # the caller knows it streams 1 GB
    assert r["eff_pct"] == pytest.approx(100 * 1.8 / 3.02)
    r = timing.rates(1.0, bytes=5e9, peaks={"dram_tb_s": 4.0})             # no L2 size: no %
    assert math.isnan(r["eff_pct"]) and "L2 size unknown" in r["eff_pct_why"]


# ------------------------------------------------------------------ measured ceilings (no GPU needed)

H200 = {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-1a2b3c4d-0000-1111-2222-333344445555",
        "memory_gb": 150.0, "driver": "580.159.04"}
H200_B = {**H200, "index": 1, "uuid": "GPU-99999999-0000-1111-2222-333344445555"}
MACHINE = "NVIDIA H200-driver580.159.04-sm?-mem?"      # ceilings.machine_key of H200 (no max clocks given here)


def _fake_set(uuid=H200["uuid"], dram=(4.31, 4.05, 4.12), gemm=(781.2, 757.5), nvlink=None, mode="quick"):
    """A ceilings set as measure_ceilings writes it (numbers of the shape an H200 gives)."""
    probes = [{"name": n, "kind": k, "bytes": b, "buffer_bytes": 1 << 30, "tb_s": v, "ms": b / v / 1e9,
               "method": f"{n}: bytes = ..."} for (n, k, b), v in
              zip([("triton write BLOCK=16384 warps=8", "write", 1 << 30), ("torch x.sum()", "read", 1 << 30),
                   ("torch copy_", "copy", 2 << 30)], dram)]
    shapes = [{"m": m, "n": m, "k": m, "layout": "nt", "tflops": v, "ms": 2 * m ** 3 / v / 1e9}
              for m, v in zip((8192, 4096), gemm)]
    c = {"version": ceilings.CEILINGS_VERSION, "gpu": "NVIDIA H200", "machine": MACHINE, "uuid": uuid, "mode": mode,
         "date_utc": "2026-11-24T10:00:00Z", "datasheet": gpu.device_spec("NVIDIA H200"),
         "dram": {"tb_s": max(dram), "best": probes[0]["name"], "method": "best of probes", "probes": probes,
                  "kinds": {p["kind"]: {"tb_s": p["tb_s"], "best": p["name"]} for p in probes}, "notes": []},
         "bf16": {"tflops": max(gemm), "best": {"m": 8192, "n": 8192, "k": 8192, "layout": "nt"},
                  "method": "best GEMM shape", "shapes": shapes, "notes": []},
         "nvlink": nvlink or {"note": "one GPU visible: no all-reduce sweep"}}
    return c


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    """One visible H200 (from 'NVML'), an empty cache, and torch made unimportable: whatever reads the
    cache must not need torch (nor CUDA)."""
    monkeypatch.setenv("HANDS_ON_CACHE", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpu, "_gpus_nvml", lambda: [dict(H200)])
    monkeypatch.setitem(sys.modules, "torch", None)      # `import torch` now raises ImportError
    return tmp_path


def _two_gpus(monkeypatch):
    monkeypatch.setattr(gpu, "_gpus_nvml", lambda: [dict(H200), dict(H200_B)])


def test_ceilings_record_is_the_machines(fake_gpus, monkeypatch):
    """One record per machine: both H200s of a machine share it (every run there divides by the same figures); a
    new driver or other clocks is another machine; a record of another probe version is never used."""
    _two_gpus(monkeypatch)
    c = _fake_set()
    path = ceilings.save_ceilings(c)
    assert path == fake_gpus / "ceilings" / "NVIDIA_H200-driver580.159.04-sm_-mem_.json"
    assert ceilings.machine_key(0) == ceilings.machine_key(1) == MACHINE
    assert ceilings.load_ceilings(0) == c == ceilings.load_ceilings(1)
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        assert ceilings.load_ceilings(0) is None                           # no GPU visible
    finally:
        del os.environ["CUDA_VISIBLE_DEVICES"]
    monkeypatch.setattr(gpu, "_gpus_nvml", lambda: [{**H200, "driver": "590.1"}])
    assert ceilings.machine_key(0) != MACHINE and ceilings.load_ceilings(0) is None      # a new driver: measure again
    monkeypatch.setattr(gpu, "_gpus_nvml", lambda: [dict(H200)])
    old = _fake_set()
    old["version"] = ceilings.CEILINGS_VERSION - 1
    ceilings.save_ceilings(old)
    assert ceilings.load_ceilings(0) is None


def test_peaks_reads_the_cache_without_torch(fake_gpus):
    ceilings.save_ceilings(_fake_set())
    p = ceilings.peaks(0)                                                  # measure=True, but the cache has it
    assert p["source"] == "measured" and p["gpu"] == "NVIDIA H200" and p["uuid"] == H200["uuid"]
    assert p["dram_tb_s"] == 4.31 and p["bf16_tflops"] == 781.2       # the best probe / shape, not one copy
    assert p["datasheet"]["dram_tb_s"] == 4.8 and p["datasheet"]["bf16_tflops"] == 989
    assert p["measured"]["dram_tb_s"] == 4.31 and p["measured"]["date_utc"] == "2026-11-24T10:00:00Z"
    assert p["method"]["dram_tb_s"] == "fastest of 3 probes: triton write BLOCK=16384 warps=8"
    assert (p["dram_read_tb_s"], p["dram_write_tb_s"], p["dram_copy_tb_s"]) == (4.05, 4.31, 4.12)   # one per kind
    assert p["dram_mixed_tb_s"] == 4.31 and p["sources"]["dram_mixed_tb_s"] == "measured (fastest probe)"   # none of that kind
    assert p["method"]["dram_read_tb_s"] == "fastest read probe: torch x.sum()"
    assert "8192x8192x8192 nt" in p["method"]["bf16_tflops"]
    # one GPU's set has no all-reduce sweep: the NVLink figure is the datasheet's per direction, and says so
    assert p["nvlink_busbw_gb_s"] == 450 and p["sources"]["nvlink_busbw_gb_s"] == "datasheet"
    assert ceilings.cached_peaks(0)["dram_tb_s"] == 4.31 and ceilings.cached_peaks(1) is None   # no GPU 1 visible


def test_peaks_with_two_gpus_measures_the_missing_nvlink(fake_gpus, monkeypatch):
    """Two GPUs visible, no all-reduce entry yet: peaks() asks the child process to add it."""
    _two_gpus(monkeypatch)
    ceilings.save_ceilings(_fake_set())
    nv = {"busbw_gb_s": 361.5, "gpus": 2, "best_bytes": 1 << 30, "sizes": [{"bytes": 1 << 30, "busbw_gb_s": 361.5}],
          "method": "all-reduce"}
    asked = []

    def child(device, quick=True, echo=print):
        asked.append((device, quick))
        c = _fake_set(nvlink=nv)
        ceilings.save_ceilings(c)
        return c
    monkeypatch.setattr(ceilings, "_measure_in_child", child)
    p = ceilings.peaks(0)
    assert asked == [(0, True)]
    assert p["nvlink_busbw_gb_s"] == 361.5 and p["sources"]["nvlink_busbw_gb_s"] == "measured"
    assert "on 2 GPUs" in p["method"]["nvlink_busbw_gb_s"]
    ceilings.peaks(0)
    assert len(asked) == 1                                            # cached now: not asked again


def test_peaks_datasheet_fallback(fake_gpus, monkeypatch):
    monkeypatch.setattr(ceilings, "_measure_in_child", lambda *a, **k: pytest.fail("measure=False must not measure"))
    p = ceilings.peaks(0, measure=False)
    assert p["source"] == "datasheet" and p["gpu"] == "NVIDIA H200"
    assert (p["dram_tb_s"], p["bf16_tflops"], p["nvlink_busbw_gb_s"]) == (4.8, 989, 450)
    assert "measured" not in p and p["ceilings"] is None
    assert ceilings.cached_peaks(0) is None
    monkeypatch.setattr(gpu, "_gpus_nvml", lambda: [])
    monkeypatch.setattr(gpu, "_gpus_smi", lambda: [])
    p = ceilings.peaks(0, measure=False)                                   # no driver, no cache
    assert p["source"] == "unknown" and p["dram_tb_s"] is None


def test_ceilings_table_rows(fake_gpus):
    nv = {"busbw_gb_s": 361.5, "gpus": 2, "best_bytes": 1 << 30, "links": ["NV18"],
          "sizes": [{"bytes": 1 << 30, "busbw_gb_s": 361.5}], "method": "all-reduce sweep"}
    c = _fake_set(nvlink=nv)
    rows = ceilings.ceilings_table(c)
    assert [r["ceiling"] for r in rows] == (["DRAM read", "DRAM copy", "DRAM write"] + ["bf16 tensor throughput"] * 2
                                            + ["NVLink all-reduce busbw"])
    assert set(rows[0]) == {"ceiling", "probe", "measured", "unit", "datasheet", "pct_of_datasheet", "is_ceiling", "method"}
    dram = rows[:3]
    assert [r["measured"] for r in dram] == [4.05, 4.12, 4.31]        # read, copy, write: each kind's fastest probe
    assert [r["is_ceiling"] for r in dram] == ["yes", "yes", "yes"]
    assert dram[2]["probe"] == "triton write BLOCK=16384 warps=8 (1 GiB)" and dram[2]["unit"] == "TB/s"
    assert dram[2]["datasheet"] == 4.8 and dram[2]["pct_of_datasheet"] == pytest.approx(89.79, abs=0.01)
    assert rows[3]["probe"] == "GEMM 8192x8192x8192 nt" and rows[3]["is_ceiling"] == "yes"
    assert rows[3]["pct_of_datasheet"] == pytest.approx(100 * 781.2 / 989)
    assert rows[5]["measured"] == 361.5 and rows[5]["datasheet"] == 450 and "NV18" in rows[5]["probe"]
    # a peaks() dict gives the same rows; one GPU: the NVLink row says why there is no number
    ceilings.save_ceilings(_fake_set())
    rows1 = ceilings.ceilings_table(ceilings.peaks(0, measure=False))
    assert rows1[-1]["measured"] is None and "one GPU" in rows1[-1]["method"]
    assert len(ceilings.ceilings_table(c, top_gemm=1)) == 5
    # no measurement at all: the datasheet rows, each saying so
    ds = ceilings.ceilings_table(ceilings.as_peaks(None, name="NVIDIA H100 80GB HBM3"))
    assert [r["datasheet"] for r in ds] == [3.35, 989, 450] and all(r["measured"] is None for r in ds)
    assert all("datasheet only" in r["method"] for r in ds)


def test_nvlink_busbw_arithmetic():
    """nccl-tests: algbw = bytes / time; busbw = algbw x 2(n-1)/n."""
    gib = 1 << 30
    assert probes.busbw_gb_s(gib, 0.01, 8) == pytest.approx(gib / 0.01 / 1e9 * 14 / 8)
    assert probes.busbw_gb_s(gib, 0.01, 2) == pytest.approx(gib / 0.01 / 1e9)          # n=2: busbw == algbw
    assert probes.busbw_gb_s(gib, 0.01, 1) == 0.0                                         # one rank moves nothing
    assert probes.busbw_gb_s(gib, 0.0, 4) != probes.busbw_gb_s(gib, 0.0, 4)                 # NaN, not a division error
    sizes = probes.nvlink_sizes(quick=False)
    assert sizes[0] == 1 << 20 and sizes[-1] == gib and len(sizes) == 11
    assert probes.nvlink_sizes(quick=True)[-1] == gib and len(probes.nvlink_sizes(quick=True)) == 4
    assert probes._calls_for(1 << 20) == 200 and probes._calls_for(gib) == 2


def test_gemm_sweep_shapes():
    quick, full = probes.gemm_shapes(True), probes.gemm_shapes(False)
    assert 20 <= len(quick) <= 24 and 60 <= len(full) <= 100
    # the model shapes of an 8,192-token Llama-3.1-8B prefill (QKV, O, gate-up, down) are in the quick set
    assert {(8192, 6144, 4096, "nt"), (8192, 4096, 4096, "nt"), (8192, 28672, 4096, "nt"), (8192, 4096, 14336, "nt")} <= set(quick)
    assert len(set(full)) == len(full) and set(quick) <= set(full)
    assert (8192, 8192, 8192, "nn") in quick and (8192, 8192, 8192, "nt") in quick
    assert all(2048 <= min(s[:3]) and max(s[:3]) <= 28672 for s in full)


def test_ceilings_cli_show_needs_no_torch(tmp_path):
    """`python -m common ceilings show` and `python -m common ceilings --help` run without torch or a GPU."""
    env = {**os.environ, "HANDS_ON_CACHE": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    (tmp_path / "ceilings").mkdir()
    (tmp_path / "ceilings" / f"{H200['uuid']}.json").write_text(json.dumps(_fake_set()))
    out = subprocess.run([sys.executable, "-m", "common", "ceilings", "show"], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "NVIDIA H200" in out.stdout and "triton write" in out.stdout and "781" in out.stdout
    h = subprocess.run([sys.executable, "-m", "common", "ceilings", "--help"], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    assert h.returncode == 0 and "measure" in h.stdout, h.stderr


def test_cpu_timer():
    t = timing.bench_cpu(lambda: sum(range(1000)), reps=50)
    assert len(t.samples_ms) == 50 and t.method == "cpu" and t.median_ms > 0


def test_common_imports_no_gpu_package():
    code = ("import sys; import common.capture.timing, common.capture.gpu, common.capture.ceilings, common.capture.probes, common.capture.clocks, "
            "common.capture.ncu, common.tables.trace, common.run.results, "
            "common.render.report, common.capture.models, common.base.story, common.capture.ranges, common.render.plots, common.capture.nsys, common.base.checks; "
            "print(sorted(m for m in ('torch', 'flashinfer', 'sglang', 'minisgl') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_setup_errors_are_one_line(tmp_path):
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from common.base.checks import require_module, run_main\n"
            "def main(argv=None):\n    require_module('no_such_pkg_xyz', 'pip install no-such-pkg')\n"
            "run_main(main)\n") % str(ROOT)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == checks.EXIT_SETUP
    assert p.stderr.strip().count("\n") == 0 and "pip install no-such-pkg" in p.stderr and "Traceback" not in p.stderr


def test_ncu_permission_error_is_a_setup_error(tmp_path, monkeypatch):
    """A fake ncu that prints NVIDIA's permission error: the workbook says how to fix it."""
    from common.capture import ncu
    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\necho '==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access "
                    "NVIDIA GPU Performance Counters on the target device 0.'\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("NCU", str(fake))
    with pytest.raises(checks.SetupError, match="NVreg_RestrictProfilingToAdminUsers"):
        ncu.profile(["python", "-c", "pass"], tmp_path / "out")
    monkeypatch.setenv("NCU", str(tmp_path / "missing-ncu"))
    with pytest.raises(checks.SetupError, match="not on PATH"):
        ncu.profile(["python", "-c", "pass"], tmp_path / "out")


def test_measure_ceilings_caches_upgrades_and_adds_nvlink(fake_gpus, monkeypatch, capsys):
    """The orchestration of measure_ceilings with the probes stubbed and a fake torch module: measured
    once and kept; a full request does not replace the machine's record (only --refresh does); ≥ 2 GPUs add the
    all-reduce sweep once."""
    import contextlib
    import types
    fake = types.ModuleType("torch")
    fake.__version__ = "2.11.0+cu130"
    fake.version = types.SimpleNamespace(cuda="13.0")
    n_gpus = {"n": 1}
    fake.cuda = types.SimpleNamespace(
        is_available=lambda: True, device_count=lambda: n_gpus["n"], device=lambda d: contextlib.nullcontext(),
        get_device_properties=lambda d: types.SimpleNamespace(name="NVIDIA H200", uuid="1a2b3c4d-0000-1111-2222-333344445555",
                                                              multi_processor_count=132, L2_cache_size=60 << 20))
    monkeypatch.setitem(sys.modules, "torch", fake)
    ran = []
    monkeypatch.setattr(probes, "measure_dram", lambda t, d, q, log, sampler=None: ran.append(("dram", q)) or
                        _fake_set()["dram"])
    monkeypatch.setattr(probes, "measure_gemm", lambda t, d, q, log, sampler=None: ran.append(("gemm", q)) or
                        _fake_set()["bf16"])
    monkeypatch.setattr(probes, "measure_nvlink", lambda n, q, log: ran.append(("nvlink", n)) or
                        {"busbw_gb_s": 361.5, "gpus": n, "best_bytes": 1 << 30, "sizes": [], "method": "m"})
    c = probes.measure_ceilings(0, quick=True, log=lambda *a: None)
    assert ran == [("dram", True), ("gemm", True)] and c["mode"] == "quick" and c["uuid"] == H200["uuid"]
    assert c["version"] == ceilings.CEILINGS_VERSION and c["datasheet"]["model"] == "H200 SXM"
    assert ceilings.load_ceilings(0) == c
    assert probes.measure_ceilings(0, quick=True, log=lambda *a: None) == c and len(ran) == 2     # cached
    assert probes.measure_ceilings(0, quick=False, log=lambda *a: None) == c and len(ran) == 2    # no upgrade
    full = probes.measure_ceilings(0, quick=False, refresh=True, log=lambda *a: None)             # on request
    assert ran[2:] == [("dram", False), ("gemm", False)] and full["mode"] == "full"
    assert probes.measure_ceilings(0, quick=True, log=lambda *a: None)["mode"] == "full" and len(ran) == 4
    n_gpus["n"] = 2
    _two_gpus(monkeypatch)
    with_nv = probes.measure_ceilings(0, quick=True, log=lambda *a: None)
    assert ran[4:] == [("nvlink", 2)] and with_nv["nvlink"]["busbw_gb_s"] == 361.5 and with_nv["mode"] == "full"
    probes.measure_ceilings(0, quick=True, log=lambda *a: None)
    assert len(ran) == 5                                                                        # cached now
    probes.measure_ceilings(0, quick=True, refresh=True, nvlink=False, log=lambda *a: None)
    assert ran[5:] == [("dram", True), ("gemm", True)]
    # the CLI: measure (from the cache here) and print the table; --json-out gets the same set
    out = fake_gpus / "out.json"
    assert probes.ceilings_main(["measure", "--quick", "--no-nvlink", "--json-out", str(out)]) == 0
    assert json.loads(out.read_text())["uuid"] == H200["uuid"]
    printed = capsys.readouterr().out
    assert "DRAM read" in printed and "DRAM copy" in printed and "methods:" in printed and "TB/s" in printed


def test_peaks_never_replaces_the_machines_record(fake_gpus, monkeypatch):
    """A run that asks for the full set on a machine whose record is a quick one divides by the record: every page
    of every run on the machine states the same ceilings (the full set is measured on request only)."""
    ceilings.save_ceilings(_fake_set(mode="quick"))
    monkeypatch.setattr(ceilings, "_measure_in_child", lambda *a, **k: pytest.fail("the record must not be replaced"))
    assert ceilings.peaks(0)["measured"]["mode"] == "quick"
    assert ceilings.peaks(0, quick=False)["measured"]["mode"] == "quick"


def test_measuring_child_runs_without_a_profilers_injection():
    """Under ncu/nsys the child that measures the ceilings must not be profiled (nor slowed down)."""
    env, notes = ceilings.measure_env({"CUDA_INJECTION64_PATH": "/opt/nsight/libToolsInjection64.so", "PATH": "/usr/bin",
                                  "LD_PRELOAD": "/opt/nsight-compute/libTreeLauncherPlaceholder.so /usr/lib/libjemalloc.so",
                                  "PYTHONPATH": "/x"})
    assert "CUDA_INJECTION64_PATH" not in env and env["LD_PRELOAD"] == "/usr/lib/libjemalloc.so"
    assert env["PATH"] == "/usr/bin" and env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/x"]
    assert len(notes) == 2
    env, notes = ceilings.measure_env({"LD_PRELOAD": "/opt/nsys/libToolsInjectionProxy64.so"})
    assert "LD_PRELOAD" not in env and notes


def test_peaks_measures_in_a_child_process_that_reports_failure(fake_gpus, monkeypatch):
    """No cache and no GPU for the child (CUDA_VISIBLE_DEVICES=""; on a CPU box torch is missing too): the
    child stops with a one-line setup error (exit 2), raised here as a SetupError with that line."""
    from common.base.checks import SetupError
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(SetupError, match=r"\(while measuring this GPU's ceilings; log .*measure-.*\.log\)$"):
        ceilings.peaks(0)
    assert list((fake_gpus / "ceilings").glob("measure-*.log"))


def test_ceiling_names_the_denominator():
    pk = {"gpu": "NVIDIA H200", "dram_tb_s": 4.28, "bf16_tflops": 712.0, "source": "measured",
          "sources": {"dram_tb_s": "measured"}, "method": {"dram_tb_s": "best of 4 probes: triton read"}}
    assert ceilings.ceiling_text(pk) == ("the measured DRAM (fastest stream) ceiling 4.28 TB/s (best of 4 probes: "
                                         "triton read) of NVIDIA H200")
    assert ceilings.ceiling_text(pk, "bf16_tflops").startswith("the measured bf16 tensor ceiling 712 TFLOP/s")
    assert ceilings.ceiling_text({"gpu": None}) == "no DRAM (fastest stream) ceiling of this GPU"
    assert ceilings.ceiling_text(pk, short=True) == "the measured DRAM (fastest stream) ceiling 4.28 TB/s"
    pk2 = {**pk, "dram_read_tb_s": 3.16, "sources": {"dram_read_tb_s": "measured"}}
    assert ceilings.ceiling_text(pk2, "dram_read_tb_s", short=True) == "the measured DRAM read ceiling 3.16 TB/s"


def test_dram_ceiling_matches_the_traffic():
    """A kernel is divided by the DRAM ceiling of its traffic, by the share of its bytes that are writes."""
    pk = {"dram_tb_s": 3.30, "dram_read_tb_s": 3.16, "dram_write_tb_s": 3.30, "dram_copy_tb_s": 3.02,
          "dram_mixed_tb_s": 3.08}
    assert ceilings.dram_for(pk, 235e6, 2.4e6) == (3.16, "read")        # a decode GEMM: the weights stream in
    assert ceilings.dram_for(pk, 537e6, 537e6) == (3.02, "copy")        # RMSNorm on 512 MB: read + write
    assert ceilings.dram_for(pk, 470e6, 239e6) == (3.08, "mixed")       # act_and_mul: gate and up in, one out
    assert ceilings.dram_for(pk, 0.0, 1e6) == (3.30, "write")
    assert ceilings.dram_for(pk, None, None) == (3.02, "copy")          # unknown: the lowest of the three
    assert ceilings.dram_for({"dram_tb_s": 4.7}, 1e6, 0) == (4.7, "read")   # a record from before the kinds


def test_the_l2_size_is_mib_when_a_working_set_is_compared_with_it():
    """l2_mb is what CUDA reports, in MiB (60 on an H200 = 62.9e6 bytes). A working set of 245e6 bytes is above
    4 x 60e6 but below 4 x 60 MiB (251.7e6): still partly servable from L2, so no DRAM % (it was one when the
    size was read as 1e6-byte MB)."""
    from common.capture import timing
    pk = {"dram_tb_s": 4.7, "dram_read_tb_s": 4.6, "dram_copy_tb_s": 4.28, "l2_mb": 60.0}
    assert ceilings.l2_bytes(pk) == 60 * 2**20 and ceilings.l2_bytes({}) is None
    near = timing.rates(0.1, bytes=245e6, peaks=pk, mix="read")
    assert math.isnan(near["eff_pct"]) and "MiB" in near["eff_pct_why"]
    far = timing.rates(0.1, bytes=260e6, peaks=pk, mix="read")
    assert far["eff_pct"] == pytest.approx(100 * far["eff_tb_s"] / 4.6)
    assert timing.l2_multiple(60 * 2**20, pk) == 1.0


def test_a_refreshed_report_does_not_make_the_checkout_dirty(tmp_path, monkeypatch):
    """The commit a run records: the reports a pipeline refreshes are its output, so a run after them still names a
    clean commit (in `make quick` every run after FlashInfer's pipeline read 'dirty'); a changed script does not."""
    def git(*a):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t", *a], check=True,
                       capture_output=True)
    for f in ("common/x.py", "sglang/reports/analysis.md", "CROSS-SYSTEM.md"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("a\n")
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "c")
    monkeypatch.delenv("HANDS_ON_GIT_COMMIT", raising=False)
    monkeypatch.setattr(gpu, "REPO_ROOT", tmp_path)
    (tmp_path / "sglang/reports/analysis.md").write_text("refreshed\n")
    (tmp_path / "CROSS-SYSTEM.md").write_text("refreshed\n")
    (tmp_path / "untracked.txt").write_text("x\n")
    assert gpu._git()["dirty"] is False
    (tmp_path / "common/x.py").write_text("changed\n")
    assert gpu._git()["dirty"] is True

