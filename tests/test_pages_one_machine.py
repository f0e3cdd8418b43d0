"""Your GPU, your pages, on real runs: the pages rendered from one fresh H100's `make quick`
(tests/fixtures/results_h100_make_quick.tar.xz: every summary.json of that run and the tables the pages show; made
on 2026-11-28 at a3b1727, as tests/fixtures/README.md says) and from one fresh H200's (results_h200_make_quick.tar.xz,
the same files of the same day's run at e32f167 plus this session's changes) are each that machine's alone; the
H200's final pages compare with the committed H100 reference and give each changed verdict its measured reasons; relabelled to a GPU model the
workbook has no margins and no reference for, the pages say what they lack; and every sentence a run generated
(its findings) states figures that its own story, verdicts or headline show."""
import json
import re
import shutil
import tarfile
from pathlib import Path

import pytest

from common import SYSTEMS
from common.render import report
from common.run.steps import measure_hints
from common.tables import kernels

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "results_h100_make_quick.tar.xz"
FIXTURE_H200 = ROOT / "tests" / "fixtures" / "results_h200_make_quick.tar.xz"
H100 = "1x NVIDIA H100 80GB HBM3"
H200 = "1x NVIDIA H200"
A100 = "NVIDIA A100-SXM4-80GB"
NUM = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")


def world(tmp_path: Path, gpu: str | None = None, reference: bool = True, fixture: Path = FIXTURE,
          relabel: dict | None = None) -> Path:
    """The repository's pages (and its steps, for the 'measures it' lines) beside the fixture's results; ``gpu``:
    every run relabelled to that model; ``relabel``: provenance fields every run gets (e.g. {"gpu_count": 4})."""
    for system in SYSTEMS:
        shutil.copytree(ROOT / system / "reports", tmp_path / system / "reports")
        if not reference:
            (tmp_path / system / "reports" / "reference.json").unlink()
    for name in ("CROSS-SYSTEM.md", "GLOSSARY.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    with tarfile.open(fixture) as tf:
        tf.extractall(tmp_path)
    fields = {**({"gpu": gpu} if gpu else {}), **(relabel or {})}
    if fields:
        for p in tmp_path.glob("*/results/*/summary.json"):
            s = json.loads(p.read_text())
            s["provenance"].update(fields)
            p.write_text(json.dumps(s))
    return tmp_path


def pages(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in [*root.glob("*/reports/*.md"), root / "CROSS-SYSTEM.md"]}


@pytest.mark.parametrize("fixture,gpu", [(FIXTURE, H100), (FIXTURE_H200, H200)], ids=["h100", "h200"])
def test_a_fresh_runs_pages_are_its_machines_alone(tmp_path, fixture, gpu):
    root = world(tmp_path, fixture=fixture)
    out = report.refresh(SYSTEMS, root=root, echo=lambda *a: None, hints=measure_hints(ROOT))
    assert out.mixed == [] and out.skipped == []
    for name, text in pages(root).items():
        assert "mixes runs" not in text, name
        for m in report.BLOCK.finditer(text):
            key, body = m.group("key"), m.group("body")
            if report._stem_of(key):
                assert body.startswith(f"<!-- run: {gpu} · ") or body.startswith(f"_Not measured in this run on {gpu}: "), \
                    (name, key, body[:160])
        runs = re.findall(r"^\| (\dx [^|]+?) \|", text.split("<!-- /auto -->")[0], re.M) if "auto:runs" in text else []
        assert set(runs) <= {gpu}, (name, runs)
    for system in SYSTEMS:
        final = (root / system / "reports" / "final-report.md").read_text()
        if gpu == H100:
            assert "This page is the reference run itself (1x NVIDIA H100 80GB HBM3" in final, system
        else:
            block = final.split("<!-- auto:reference -->")[1].split("<!-- /auto -->")[0]
            assert f"Against the reference run on {H100} (`{system}/reports/reference.json`)" in block, system
            assert f"| GPU | {H200} | {H100} | differs |" in block and "Run-to-run margins: measured on NVIDIA H200." in block


def test_the_h200_run_against_the_h100_reference_names_each_changed_verdict_and_why(tmp_path):
    """The two GPUs' real runs: a decode kernel that the H100 drives to the read-bandwidth bar falls short of it on
    the H200 (whose measured read ceiling is larger); the page gives that ratio as the reason, measured, never a
    hand-written sentence."""
    root = world(tmp_path, fixture=FIXTURE_H200)
    report.refresh(SYSTEMS, root=root, echo=lambda *a: None, hints=measure_hints(ROOT))
    changed = {}
    for system in SYSTEMS:
        final = (root / system / "reports" / "final-report.md").read_text()
        block = final.split("<!-- auto:reference -->")[1].split("<!-- /auto -->")[0]
        n = re.search(r"(\d+) of (\d+) hypotheses judged in both runs changed verdict", block)
        assert n, system
        rows = [r for r in block.splitlines() if r.startswith("| 0")]
        assert len(rows) == int(n.group(1)), system
        for r in rows:
            cells = [c.strip() for c in r.strip("|").split("|")]
            changed[(system, cells[1])] = cells
            assert cells[4] and cells[4] != "unexplained", cells       # every change here has a measured reason
    decode = changed[("flashinfer", "decode-bw")]
    assert decode[2].startswith("**refuted**") and decode[3].startswith("**confirmed**")
    ratio = re.search(r"DRAM read ceiling x([\d.]+) \(([\d.]+) vs ([\d.]+) TB/s\)", decode[4])
    assert ratio and abs(float(ratio.group(1)) - float(ratio.group(2)) / float(ratio.group(3))) < 0.01
    assert not any(system == "sglang" for system, _ in changed)


def test_a_gpu_model_without_margins_or_reference_says_what_it_lacks(tmp_path):
    root = world(tmp_path, gpu=A100, reference=False)
    report.refresh(SYSTEMS, root=root, echo=lambda *a: None, hints=measure_hints(ROOT))
    for system in SYSTEMS:
        final = (root / system / "reports" / "final-report.md").read_text()
        block = final.split("<!-- auto:reference -->")[1].split("<!-- /auto -->")[0]
        assert f"No reference run is committed for {system} ({system}/reports/reference.json)" in block, system
    analysis = (root / "sglang" / "reports" / "analysis.md").read_text()
    verdicts = [m.group("body") for m in report.BLOCK.finditer(analysis) if m.group("key").endswith("/observations")]
    assert verdicts and all(f"1x {A100}" in v for v in verdicts)
    # with the H100 reference there, each final page compares and names the margins it borrowed
    root2 = world(tmp_path / "with", gpu=A100)
    report.refresh(SYSTEMS, root=root2, echo=lambda *a: None, hints=measure_hints(ROOT))
    final = (root2 / "flashinfer" / "reports" / "final-report.md").read_text()
    block = final.split("<!-- auto:reference -->")[1].split("<!-- /auto -->")[0]
    assert f"Against the reference run on {H100} (`flashinfer/reports/reference.json`)" in block
    assert f"| GPU | 1x {A100} | {H100} | differs |" in block
    assert f"Run-to-run margins: none measured on {A100}; each verdict used the largest margin known" in block


def _numbers(text: str) -> set[float]:
    return {float(m.replace(",", "")) for m in NUM.findall(text)}


def stray(sentence: str, pool: set[float]) -> list[float]:
    """The numbers of ``sentence`` that are none of ``pool`` (as written, or rounded: within 5%)."""
    return [x for x in _numbers(sentence) if not any(abs(x - y) <= max(0.05 * abs(x), 0.006) for y in pool)]


@pytest.mark.parametrize("fixture", [FIXTURE, FIXTURE_H200], ids=["h100", "h200"])
def test_every_generated_sentence_states_figures_its_run_shows(tmp_path, fixture):
    """A finding is written from the run's figures: each number in it is one its story, verdicts or headline show
    (as written, or rounded), or a threshold the workbook names (kernels.SATURATED)."""
    root = world(tmp_path, fixture=fixture)
    checked = 0
    for p in sorted(root.glob("*/results/*/summary.json")):
        s = json.loads(p.read_text())
        pool = (_numbers(s.get("story", "")) | _numbers(json.dumps(s.get("observations")))
                | _numbers(json.dumps(s.get("headline"))) | {float(kernels.SATURATED)})
        for sentence in s.get("findings") or []:
            checked += 1
            assert not stray(sentence, pool), f"{p.parent.name}: {stray(sentence, pool)} in '{sentence}'"
    assert checked >= 20                       # the run's scripts wrote findings
    # the check finds a figure the run never showed, and takes a rounded one
    assert stray("a step of 6.41 ms, 123.456 of them, 89% of the ceiling", {6.41, 89.4}) == [123.456]
