"""Model presets, the device table, provenance, the timing maths and the one-line errors."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from common import checks, gpu, models, timing

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
    r = timing.rates(0.2, bytes=800e6, flops=2e9, peaks={"dram_tb_s": 4.0, "bf16_tflops": 800})
    assert r["tb_s"] == pytest.approx(4.0) and r["pct_peak_dram"] == pytest.approx(100)
    assert r["tflop_s"] == pytest.approx(10) and r["flop_per_byte"] == pytest.approx(2.5)
    assert r["pct_peak_tflops"] == pytest.approx(1.25)
    with pytest.raises(ValueError):
        timing.bench(lambda: None, method="stopwatch")


def test_cpu_timer():
    t = timing.bench_cpu(lambda: sum(range(1000)), reps=50)
    assert len(t.samples_ms) == 50 and t.method == "cpu" and t.median_ms > 0


def test_common_imports_no_gpu_package():
    code = ("import sys; import common.timing, common.gpu, common.ncu, common.trace, common.results, "
            "common.report, common.models, common.story, common.ranges, common.plots, common.nsys, common.checks; "
            "print(sorted(m for m in ('torch', 'flashinfer', 'sglang', 'minisgl') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_setup_errors_are_one_line(tmp_path):
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from common.checks import require_module, run_main\n"
            "def main(argv=None):\n    require_module('no_such_pkg_xyz', 'pip install no-such-pkg')\n"
            "run_main(main)\n") % str(ROOT)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == checks.EXIT_SETUP
    assert p.stderr.strip().count("\n") == 0 and "pip install no-such-pkg" in p.stderr and "Traceback" not in p.stderr


def test_ncu_permission_error_is_a_setup_error(tmp_path, monkeypatch):
    """A fake ncu that prints NVIDIA's permission error: the workbook says how to fix it."""
    from common import ncu
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
