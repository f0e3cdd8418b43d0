"""SGLang 07 on real multi-GPU runs (tests/fixtures/results_sglang_07_tp_h200_2and4gpu.tar.xz: the tables, topology
and summary of `07_tp_scaling.py --quick` on 2 of the 4 H200s of one host, merging the rows of
`07_tp_scaling.py --configs 'llama-3.1-8b:4;llama-3.1-70b:2,4'` run just before on all 4, 2026-11-28, as
tests/fixtures/README.md says): re-analysed on the CPU, the verdicts, the explanations and the rows' machines come back;
and the pages of a one-GPU run show that run on its bigger machine, said so, while a machine that could run it
does not take it."""
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from common import SYSTEMS
from common.render import report
from common.run.steps import measure_hints
from test_pages_one_machine import world as pages_world

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
    """The pages beside the H100 run (test_pages_one_machine.world; ``gpus``: its runs relabelled to that GPU count)
    and this fixture's 07 run."""
    root = pages_world(tmp_path, relabel={"gpu_count": gpus} if gpus else None)
    unpack(root / "sglang" / "results")
    return root


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


class _Events(list):
    pass


def _overlap_world(monkeypatch, fail=(), budget=None):
    """07's measure_all with its servers, gates and measurement replaced by recorders (no GPU, no SGLang): the
    order of what happens to each configuration's server."""
    import importlib.util
    import types
    spec = importlib.util.spec_from_file_location("sgl07", ROOT / "sglang" / "scripts" / "07_tp_scaling.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    ev = _Events()

    class Srv:
        def __init__(self, tag, held):
            self.tag, self.held, self.startup_s, self.start_timeout = tag, held, 1.0, 10.0

        def launch(self):
            ev.append(f"launch {self.tag}{' (held)' if self.held else ''}")

        def start(self):
            ev.append(f"start {self.tag}")

        def wait_ready(self):
            ev.append(f"ready {self.tag}")

        def stop(self):
            ev.append(f"stop {self.tag}")

    class Gate:
        def __init__(self, folder):
            self.folder = Path(folder)

        def env(self):
            return {}

        def release(self, srv):
            ev.append(f"release {srv.tag}")

        def verify(self, srv):
            return 0.5

    def server_for(args, run, preset, tp, no_car, gate=None):
        return Srv(m.names(preset, tp, no_car)[1], gate is not None), "model"

    clock = [1000.0]                              # a configuration takes 200 s of this clock

    def measure(srv, tp, run, prof, quick, key, hidden):
        ev.append(f"measure {srv.tag}")
        clock[0] += 200.0
        if srv.tag in fail:
            raise RuntimeError("a rank died")
        return {"ttft_first_ms": 1.0, "ttft_b1_ms": 1.0, "itl_b1_ms": 1.0, "decode_step_gpu_ms": 1.0,
                "allreduce_share_pct": 0.0, "allreduce_kernels": "-", "output_throughput": 1.0}, {}
    monkeypatch.setattr(m, "server_for", server_for)
    monkeypatch.setattr(m, "measure", measure)
    monkeypatch.setattr(m, "time", types.SimpleNamespace(time=lambda: clock[0], sleep=lambda s: None))
    monkeypatch.setattr(m.sg, "Gate", Gate)
    monkeypatch.setattr(m.sg, "model_shape", lambda d: {"config": {"hidden_size": 4096}})
    errors, notes = [], []
    run = types.SimpleNamespace(dir=Path("/nonexistent"), log=lambda *a: None, note=notes.append,
                                point_error=lambda k, e: errors.append((k, str(e))))
    args = types.SimpleNamespace(no_overlap=False, port=None, time_budget=budget, quick=True)
    return m, ev, run, args, errors, notes


def test_07_launches_the_next_server_held_and_releases_it_only_after_the_last_one_stopped(monkeypatch):
    m, ev, run, args, errors, _ = _overlap_world(monkeypatch, fail=("llama-3.1-8b_tp2",))
    plan = [("llama-3.1-8b", 1, False), ("llama-3.1-8b", 2, False), ("llama-3.1-8b", 2, True)]
    runs, _ = m.measure_all(args, plan, run)
    assert ev == ["start llama-3.1-8b_tp1", "launch llama-3.1-8b_tp2 (held)", "measure llama-3.1-8b_tp1",
                  "stop llama-3.1-8b_tp1", "release llama-3.1-8b_tp2", "ready llama-3.1-8b_tp2",
                  "launch llama-3.1-8b_tp2_nccl (held)", "measure llama-3.1-8b_tp2", "stop llama-3.1-8b_tp2",
                  "release llama-3.1-8b_tp2_nccl", "ready llama-3.1-8b_tp2_nccl", "measure llama-3.1-8b_tp2_nccl",
                  "stop llama-3.1-8b_tp2_nccl"]
    # the failed configuration is one point error; its server stopped; the next one still ran, after its release
    assert [e[0]["tp"] for e in errors] == [2] and len(runs) == 2 and runs[1]["held_s"] == 0.5


def test_07_drops_a_held_server_whose_configuration_is_skipped(monkeypatch):
    m, ev, run, args, errors, notes = _overlap_world(monkeypatch, budget=3)
    plan = [("llama-3.1-8b", 1, False), ("llama-3.1-8b", 2, False)]
    m.measure_all(args, plan, run)               # 3 minutes: the first fits the first guess (120 s), the second not
    assert "launch llama-3.1-8b_tp2 (held)" in ev and ev[-1] == "stop llama-3.1-8b_tp2"
    assert not any(e.startswith(("release", "ready", "measure")) and "tp2" in e for e in ev)
    assert any("skipped, the --time-budget" in n for n in notes) and errors == []
