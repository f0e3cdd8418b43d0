"""SGLang 07 on real multi-GPU runs (tests/fixtures/results_sglang_07_tp_h200_2and4gpu.tar.xz: the tables, topology
and summary of `07_tp_scaling.py --quick` on 2 of the 4 H200s of one host, merging the rows of
`07_tp_scaling.py --configs 'llama-3.1-8b:4;llama-3.1-70b:2,4'` run just before on all 4, 2026-11-28, as
tests/fixtures/README.md says): re-analysed on the CPU, the verdicts, the explanations and the rows' machines come back;
and the pages of a one-GPU run show that run on its bigger machine, said so, while a machine that could run it
does not take it."""
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from common import SYSTEMS
from common.render import report
from common.run.steps import measure_hints

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
TP = FIX / "results_sglang_07_tp_h200_2and4gpu.tar.xz"


def unpack(dst: Path) -> Path:
    with tarfile.open(TP) as tf:
        tf.extractall(dst)
    return dst / "07_tp_scaling"


@pytest.fixture(scope="module")
def again(tmp_path_factory):
    src = unpack(tmp_path_factory.mktemp("tp"))
    out = src.parent / "out"
    r = subprocess.run([sys.executable, str(ROOT / "sglang" / "scripts" / "07_tp_scaling.py"), "--reanalyse", str(src),
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return out, json.loads((out / "summary.json").read_text())


def test_the_verdicts_come_back_from_the_recorded_tables(again):
    out, s = again
    v = {}
    for o in s["observations"]:
        v.setdefault(o.get("hypothesis") or o["expected"][:30], []).append(o)
    # per call, SGLang's custom all-reduce beats NCCL at the decode message (128 KiB) at TP 2 and TP 4
    for tp in (2, 4):
        o = v[f"custom-ar-per-call-decode-llama-3.1-8b-tp{tp}"][0]
        assert o["verdict"] == "confirmed" and "128 KiB" in o["observed"] and "all_reduce_kernel" in o["observed"]
        assert "ncclDevKernel_AllReduce_Sum_bf16_RING_LL" in o["observed"]
    # ... while the batch-1 ITL is not slower with NCCL only on this machine: the plan's claim is refuted
    assert {o["verdict"] for o in v["nccl-only-slower"]} == {"refuted"}
    # the steady batch-1 TTFT falls from TP 2 to 4 for the 70B model, and rises with TP for the 8B one
    ttft = {o["observed"].split(": steady")[0].rsplit("; ", 1)[-1][:12]: o["verdict"] for o in v["ttft-falls-with-tp"]}
    assert ttft == {"llama-3.1-70": "confirmed", "llama-3.1-8b": "refuted"}, ttft
    assert (out / "ttft_parts.png").exists() and (out / "tp_decode_step.png").exists()


def test_the_anomalies_are_explained_from_the_figures_the_story_shows(again):
    _out, s = again
    f = "\n".join(s["findings"])
    # the 8B prefill at TP 2: all-reduce appears and the kernels grow; the batch-16 decode span barely moves
    assert re.search(r"llama-3\.1-8b, TP 1 -> TP 2: the traced steady prefill step's kernels sum to [\d,]+ -> [\d,]+ us.*"
                     r"allreduce 0 -> [\d,]+ us", f)
    assert "the rest of the span the GPU waits" in f
    story = s["story"]
    for part in ("TTFT AT BATCH 1", "STEPS BY KERNEL CLASS", "COLLECTIVES", "HTTP receive: first"):
        assert part in story
    # each row says where it was measured: this run (2 GPUs) or the merged 4-GPU run
    assert "measured 2026-11-28T02:44 on 4x NVIDIA H200" in story and s["provenance"]["gpu_count"] == 2


def world(tmp_path: Path, gpus: int | None = None) -> Path:
    for system in SYSTEMS:
        shutil.copytree(ROOT / system / "reports", tmp_path / system / "reports")
    for name in ("CROSS-SYSTEM.md", "GLOSSARY.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    with tarfile.open(FIX / "results_h100_make_quick.tar.xz") as tf:
        tf.extractall(tmp_path)
    if gpus:
        for p in tmp_path.glob("*/results/*/summary.json"):
            s = json.loads(p.read_text())
            s["provenance"]["gpu_count"] = gpus
            p.write_text(json.dumps(s))
    unpack(tmp_path / "sglang" / "results")
    return tmp_path


def test_a_one_gpu_page_shows_the_multi_gpu_run_said_so(tmp_path):
    root = world(tmp_path)
    out = report.refresh(SYSTEMS, root=root, echo=lambda *a: None, hints=measure_hints(ROOT))
    assert out.mixed == [] and out.skipped == []
    page = (root / "sglang" / "reports" / "analysis.md").read_text()
    assert ("**07_tp_scaling: 2x NVIDIA H200, 2026-11-28 — it needs more GPUs than this page's machine (1x NVIDIA H100 "
            "80GB HBM3) has; the rest of the page is that machine's.**") in page
    blocks = {m.group("key"): m.group("body") for m in report.BLOCK.finditer(page)}
    assert blocks["07_tp_scaling/story:STEPS"].startswith("<!-- run: 2x NVIDIA H200 · ")
    assert blocks["01_baseline_perf/observations"].startswith("<!-- run: 1x NVIDIA H100 80GB HBM3 · ")
    final = (root / "sglang" / "reports" / "final-report.md").read_text()
    assert "This page is the reference run itself (1x NVIDIA H100 80GB HBM3" in final     # not compared with 2x H200


def test_a_machine_that_could_run_it_does_not_take_anothers_run(tmp_path):
    root = world(tmp_path, gpus=4)            # the one-GPU runs relabelled as a 4-GPU machine's: 07 fits there
    out = report.refresh(SYSTEMS, root=root, echo=lambda *a: None, hints=measure_hints(ROOT))
    assert any("07_tp_scaling" in s and "is not this refresh's machine" for s in out.skipped), out.skipped
    page = (root / "sglang" / "reports" / "analysis.md").read_text()
    blocks = {m.group("key"): m.group("body") for m in report.BLOCK.finditer(page)}
    assert blocks["07_tp_scaling/story:STEPS"].startswith("_Not measured in this run on 4x NVIDIA H100 80GB HBM3")
    assert "it needs more GPUs" not in page


def test_the_runs_header_tells_a_bigger_machines_run_from_a_mix():
    one = "<!-- run: 1x NVIDIA H100 80GB HBM3 · torch 2.11.0 · commit abc · 2026-11-28 -->\nx\n"
    two = "<!-- run: 2x NVIDIA H200 · torch 2.11.0 · commit def · 2026-11-28{} -->\ny\n"
    said, mixed = report.runs_header([("01_baseline_perf/story", one), ("07_tp_scaling/story", two.format(" · needs 2 GPUs"))])
    assert mixed is None and "**07_tp_scaling: 2x NVIDIA H200, 2026-11-28 — it needs more GPUs" in said
    assert "needs" not in said.split("Runs behind")[1]                   # the table shows the machine, not the marker
    _, mixed = report.runs_header([("01_baseline_perf/story", one), ("07_tp_scaling/story", two.format(""))])
    assert mixed == "This page mixes runs from 2 machines: 1x NVIDIA H100 80GB HBM3; 2x NVIDIA H200"
    # a machine with as many GPUs as the run needs could have run it itself: a mix
    four = one.replace("1x NVIDIA H100 80GB HBM3", "4x NVIDIA H100 80GB HBM3")
    _, mixed = report.runs_header([("01_baseline_perf/story", four), ("07_tp_scaling/story", two.format(" · needs 2 GPUs"))])
    assert mixed and "2 machines" in mixed


def test_mini_sglang_05_names_the_links_between_the_gpus_it_used():
    """A run on GPUs 2 and 3 of a 4-GPU host records the host's `nvidia-smi topo -m` (real, 4x H200): its story
    names the link between those two only."""
    sys.path.insert(0, str(ROOT / "mini-sglang" / "scripts"))
    import importlib.util
    spec = importlib.util.spec_from_file_location("msgl05", ROOT / "mini-sglang" / "scripts" / "05_profile_comm.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    topo = FIX / "nvidia_smi_topo_4xh200.txt"
    assert m.seen_links(topo, [2], [{"index": 2}, {"index": 3}]) == {"GPU2-GPU3": "NV18", "GPU3-GPU2": "NV18"}
    assert set(m.seen_links(topo, [2, 4], [{"index": i} for i in range(4)])) >= {"GPU0-GPU3", "GPU1-GPU2"}
    assert m.seen_links(topo.parent / "none.txt", [2], [{"index": 0}]) == {}
