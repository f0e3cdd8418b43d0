"""The committed reports keep the workbook's promises (issue 16.5/16.7): no "% of a ceiling" above 100
(that would mean the ceiling probe is wrong), each verdict row in one file of its system, no "not run
yet" block and no empty section, every page says which runs it shows, and all reports together stay
short enough to read (<= 6,000 lines). The checks run on the files as committed (CPU only).

Each rule is a small function that returns the offending places, so the guard can be shown to fail on a
made-up bad report (test_each_guard_fails_on_a_bad_report)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ("flashinfer", "mini-sglang", "sglang")
MAX_LINES = 6000
PCT = re.compile(r"(\d{3,}(?:\.\d+)?)\s?% of (?:the )?(?:measured|peak|copy|ceiling|DRAM ceiling|bf16 ceiling)", re.I)
VERDICT_ROW = re.compile(r"^\|(?P<expected>[^|]+)\|.*\*\*(confirmed|refuted|inconclusive)\*\*", re.M)
BLOCK = re.compile(r"<!-- auto:(?P<key>[^\s>]+) -->\n(?P<body>.*?)<!-- /auto -->", re.S)


def pages(system=None):
    return [p for s in ([system] if system else SYSTEMS) for p in sorted((ROOT / s / "reports").glob("*.md"))]


def above_ceiling(text: str) -> list[str]:
    """'% of a ceiling' figures above 100.5 (rounding), e.g. '102% of measured copy'."""
    return [m.group(0) for m in PCT.finditer(text) if float(m.group(1)) > 100.5]


def verdict_rows(text: str) -> list[str]:
    """The expected-cell of every verdict row (a table row with a bold verdict)."""
    return [re.sub(r"\s+", " ", m.group("expected")).strip() for m in VERDICT_ROW.finditer(text)]


def not_run_blocks(text: str) -> list[str]:
    return [m.group("key") for m in BLOCK.finditer(text) if re.search(r"not run yet", m.group("body"), re.I)]


def empty_sections(text: str) -> list[str]:
    """Headings followed by nothing but blank lines before the next heading of the same or a higher
    level (or the end of the file)."""
    lines, out, fenced = text.splitlines(), [], False
    heads = []
    for i, l in enumerate(lines):
        if l.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^(#{1,6})\s+(.*)", l)):
            heads.append((i, len(m.group(1)), m.group(2)))
    for n, (i, level, title) in enumerate(heads):
        nxt = next((j for j, lv, _t in heads[n + 1:] if lv <= level), len(lines))
        sub = next((j for j, lv, _t in heads[n + 1:] if lv > level), None)
        end = sub if sub is not None and sub < nxt else nxt
        if not any(l.strip() for l in lines[i + 1:end]) and (sub is None or sub >= nxt):
            out.append(title)
    return out


def test_no_percent_of_a_ceiling_above_100():
    bad = {str(p.relative_to(ROOT)): above_ceiling(p.read_text()) for p in pages()}
    assert not {k: v for k, v in bad.items() if v}, "a % of a ceiling above 100 means the ceiling probe is wrong"


@pytest.mark.parametrize("system", SYSTEMS)
def test_each_verdict_row_is_in_one_file(system):
    seen: dict = {}
    for p in pages(system):
        for row in set(verdict_rows(p.read_text())):
            seen.setdefault(row, []).append(p.name)
    dup = {r[:80]: f for r, f in seen.items() if len(f) > 1}
    assert not dup, f"verdict rows repeated across {system} reports (keep each table once, link to it): {dup}"


def test_no_not_run_yet_block_and_no_empty_section():
    for p in pages():
        text = p.read_text()
        assert not not_run_blocks(text), f"{p.relative_to(ROOT)} holds 'not run yet' blocks: {not_run_blocks(text)}"
        assert not empty_sections(text), f"{p.relative_to(ROOT)} has empty sections: {empty_sections(text)}"


def test_every_page_with_machine_blocks_lists_its_runs():
    for p in pages():
        text = p.read_text()
        keys = [m.group("key") for m in BLOCK.finditer(text)]
        if any("/" in k for k in keys):
            assert "runs" in keys, f"{p.relative_to(ROOT)}: add a <!-- auto:runs --> block (the runs behind the page)"


def test_reports_stay_readable():
    n = sum(len(p.read_text().splitlines()) for p in pages())
    assert n <= MAX_LINES, f"all reports together are {n} lines (> {MAX_LINES}): move raw listings to results CSVs"


def test_each_guard_fails_on_a_bad_report():
    assert empty_sections("## Code\n\n```bash\n# a comment, not a heading\n```\n") == []
    bad = ("## Decode\n\n| decode is memory-bound | 4.34 TB/s | **confirmed** | x |\n\n## Empty\n\n## Next\n"
           "it streamed 102% of the measured copy bandwidth\n<!-- auto:04_x/story -->\n_not run yet_\n<!-- /auto -->\n")
    assert above_ceiling(bad) == ["102% of the measured"]
    assert verdict_rows(bad) == ["decode is memory-bound"]
    assert not_run_blocks(bad) == ["04_x/story"]
    assert empty_sections(bad) == ["Empty"]
    assert above_ceiling("reached 99.6% of the measured DRAM ceiling; 100.4% of peak") == []
