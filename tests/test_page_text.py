"""Text that holds on any GPU: the hand-written text of every page explains mechanisms; a sentence that states or
interprets a measured figure is generated from the run's own figures (a block: a story, a verdict table, the run's
findings) and sits beside it. So the text outside the blocks names no measured figure (a number with a unit of
time, rate, size or share), no GPU model, and makes no claim a run decides (a bound such as "DRAM-bound", a
comparison such as "faster than") unless it says under which condition it would hold. plan.md is the plan: its
expectations are hypotheses, kept as written. Code spans and code blocks (commands, flags, names) are not prose."""
import re
from pathlib import Path

import pytest

from common import SYSTEMS

ROOT = Path(__file__).resolve().parents[1]
PAGES = [p for s in SYSTEMS for p in sorted((ROOT / s / "reports").glob("*.md")) if p.name != "plan.md"] + \
        [ROOT / "CROSS-SYSTEM.md", ROOT / "GLOSSARY.md"]

# a measured figure: a number with a unit of measurement (time, rate, size, share, ratio)
MEASURED = re.compile(r"(?<![\w.\-/#§])(\d[\d,]*(?:\.\d+)?)\s?(?:ms|µs|us|ns|s|%|TB/s|GB/s|TFLOP/s|FLOP/B|FLOP/byte|"
                      r"MHz|W|MB|GB|KB|MiB|GiB|×|x)(?![\w/])")
GPU_MODEL = re.compile(r"\b(?:[AHBL]\d{2,3}[A-Z]?|GH200|GB200|RTX ?\d{4})\b")
CLAIM = re.compile(r"\b(?:memory|DRAM|compute|latency|issue|tensor|bandwidth|CPU|launch)[- ]bound\b|\bfaster than\b"
                   r"|\bslower than\b", re.I)
CONDITIONAL = re.compile(r"\b(?:when|whenever|if|whether|until|unless|would|could|can|may|might|means|called)\b", re.I)
BLOCK = re.compile(r"<!-- auto:(?P<key>[^\s>]+) -->\n(?P<body>.*?)<!-- /auto -->", re.S)


def prose(text: str) -> str:
    """A page's hand-written text: without its blocks, code blocks, code spans and comments."""
    t = BLOCK.sub("", text)
    t = re.sub(r"```.*?```", "", t, flags=re.S)
    t = re.sub(r"`[^`\n]*`", "", t)
    return re.sub(r"<!--.*?-->", "", t, flags=re.S)


def sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n\s*\n|\n- |\n\|", text) if s.strip()]


def machine_text(text: str) -> list[str]:
    """The sentences of a page's hand-written text that hold for one run's figures only: '<kind>: <sentence>'."""
    out = []
    for s in sentences(prose(text)):
        if MEASURED.search(s):
            out.append(f"figure: {s}")
        elif GPU_MODEL.search(s):
            out.append(f"GPU model: {s}")
        elif CLAIM.search(s) and not CONDITIONAL.search(s):
            out.append(f"claim: {s}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_hand_written_text_holds_on_any_gpu(page):
    bad = machine_text(page.read_text())
    assert not bad, f"{page.relative_to(ROOT)}: {len(bad)} hand-written sentence(s) that only one run's figures " \
                    f"make true (generate them from the run: Run.finding, a story line):\n" + "\n".join(bad[:12])


def test_the_rule_finds_a_figure_a_gpu_and_a_claim_and_leaves_mechanisms_alone():
    page = ("# P\n\nThe merge kernel takes 45.9 µs here.\n\nOn the H100 the kernel stays under its ceiling.\n\n"
            "Decode is DRAM-bound.\n\nA step is memory-bound when it reads more bytes than its FLOPs can hide.\n\n"
            "<!-- auto:03_x/story -->\n12.3 ms on the H200, DRAM-bound\n<!-- /auto -->\n\n"
            "Run `03_profile_decode.py --quick` at batch 32 and KV 4096 tokens.\n")
    assert machine_text(page) == ["figure: The merge kernel takes 45.9 µs here.",
                                  "GPU model: On the H100 the kernel stays under its ceiling.",
                                  "claim: Decode is DRAM-bound."]
