"""The reports as committed keep the workbook's promises: no "% of a ceiling" above 100 (that would mean
the ceiling probe is wrong), each verdict row in one file of its system and one verdict per hypothesis, no
"not run yet" block and no empty section, every page says which runs it shows and links the glossary, no
project history on a page, code blocks no wider than 120 characters, each analysis.md opening with its
joined story, and all reports together short enough to read (<= 3,000 lines with the glossary and the
cross-system page). The checks run on the files as committed (CPU only).

Each rule is a small function that returns the offending places, so the guard can be shown to fail on a
made-up bad report (test_each_guard_fails_on_a_bad_report)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ("flashinfer", "mini-sglang", "sglang")
MAX_LINES = 3000
WIDTH = 120
EXTRA = [ROOT / "GLOSSARY.md", ROOT / "CROSS-SYSTEM.md"]      # pages outside the systems, counted too
# words of how the project was made, not of what a page shows
HISTORY = re.compile(r"\b(?:after )?the move\b|\bissues? #?\d+|\(\d{1,2}\.\d\)|\bcommitted\b|\bthis round\b|\bround \d"
                     r"|\blent machines?\b|\boffline node\b|What changed against|Same science|\bprevious run\b"
                     r"|\bnow 0\d\b", re.I)     # PLAN.md's own chapters are "Session N": not a history word here
# the stem whose story opens each analysis.md (the joined tree: request / forward / kernels with counters)
STORY_FIRST = {"sglang": ("08_execution_story",), "mini-sglang": ("08_forward_timeline",),
               "flashinfer": ("02_profile_prefill", "03_profile_decode")}
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


def history(text: str) -> list[str]:
    return sorted({m.group(0) for m in HISTORY.finditer(text)})


def hand_written(text: str) -> str:
    """A page without the bodies of its machine-written blocks (those are checked where they are written: the
    hypotheses each script declares, test_no_project_history_in_declared_hypotheses)."""
    return BLOCK.sub(lambda m: f"<!-- auto:{m.group('key')} --><!-- /auto -->", text)


def declared_hypotheses(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of every line of the hypotheses a script declares (common.judge.verdicts.declare): the text a
    run writes into the observations blocks."""
    s = path.read_text()
    out = []
    for m in re.finditer(r'declare\(f?"""(.*?)"""', s, re.S):
        first = s[:m.start()].count("\n") + 1
        out += [(first + i, ln) for i, ln in enumerate(m.group(1).split("\n"))]
    return out


def wide_code_lines(text: str, width: int = WIDTH) -> list[str]:
    """Lines inside ``` fences longer than ``width`` characters (they scroll sideways on a code host)."""
    out, fenced = [], False
    for ln in text.splitlines():
        if ln.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced and len(ln) > width:
            out.append(ln[:60])
    return out


def links_glossary(text: str, head: int = 20) -> bool:
    return "GLOSSARY.md" in "\n".join(text.splitlines()[:head])


def two_verdicts(texts: list[str]) -> dict:
    """Hypotheses (the expected-cell of a verdict row) given different verdicts in one system's pages."""
    seen: dict = {}
    for t in texts:
        for m in VERDICT_ROW.finditer(t):
            seen.setdefault(re.sub(r"\s+", " ", m.group("expected")).strip(), set()).add(m.group(2))
    return {k[:80]: sorted(v) for k, v in seen.items() if len(v) > 1}


def first_block_stem(text: str) -> str | None:
    """The stem of the first block on a page that shows a run's content (runs headers and provenance aside)."""
    for m in BLOCK.finditer(text):
        key = m.group("key")
        if "/" in key and not key.endswith(("/provenance", "/headline")):
            return key.split("/", 1)[0]
    return None


# a measured figure in prose: a number with a unit (the plan's expectations live in plan.md, not checked here)
FIGURE = re.compile(r"(?<![\w.\-/])(\d[\d,]*(?:\.\d+)?)\s?(?:ms|µs|us|ns|s|%|TB/s|GB/s|TFLOP/s|MHz|MB|GB|KB|×|x)"
                    r"(?![\w/])")
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")
CITES_RUN = re.compile(r"results/")     # a paragraph that names a run folder takes its figures from that run


def block_numbers(texts: list[str]) -> set[float]:
    """Every number in the machine-written blocks of these pages (the runs the pages show)."""
    return {float(m.group(0).replace(",", "")) for t in texts for b in BLOCK.finditer(t)
            for m in NUMBER.finditer(b.group("body"))}


def _shown(figure: str, numbers: set[float]) -> bool:
    """The figure is a block number as written or rounded to the figure's own decimals."""
    d = len(figure.split(".")[1]) if "." in figure else 0
    x = float(figure.replace(",", ""))
    return any(abs(round(n, d) - x) < 1e-9 for n in numbers)


def unsourced_figures(text: str, numbers: set[float]) -> list[str]:
    """Figures of the hand-written prose that no block of the system's pages shows: left from an older run when
    the blocks were refreshed, or never measured. A paragraph that cites a results/ folder is exempt."""
    return [m.group(0) for para in re.split(r"\n\s*\n", hand_written(text)) if not CITES_RUN.search(para)
            for m in FIGURE.finditer(para) if not _shown(m.group(1), numbers)]


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
    n = sum(len(p.read_text().splitlines()) for p in pages() + [e for e in EXTRA if e.is_file()])
    assert n <= MAX_LINES, f"all reports together are {n} lines (> {MAX_LINES}): move raw listings to results CSVs"


def test_no_project_history_on_a_page():
    bad = {str(p.relative_to(ROOT)): history(hand_written(p.read_text()))
           for p in pages() + [e for e in EXTRA if e.is_file()]}
    assert not {k: v for k, v in bad.items() if v}, f"project history on the pages: { {k: v for k, v in bad.items() if v} }"


def test_no_project_history_in_declared_hypotheses():
    bad = [f"{p.relative_to(ROOT)}:{n}: {ln.strip()[:80]}" for p in sorted(ROOT.glob("*/scripts/*.py"))
           for n, ln in declared_hypotheses(p) if history(ln)]
    assert not bad, f"hypothesis texts (they land in the reports' verdict tables) with project history: {bad}"


def test_code_blocks_fit_120_characters():
    bad = {str(p.relative_to(ROOT)): len(wide_code_lines(p.read_text())) for p in pages() + EXTRA if p.is_file()}
    assert not {k: v for k, v in bad.items() if v}, f"code-block lines over {WIDTH} characters: {bad}"


def test_every_page_links_the_glossary():
    bad = [str(p.relative_to(ROOT)) for p in pages() + EXTRA[1:] if p.is_file() and not links_glossary(p.read_text())]
    assert not bad, f"link GLOSSARY.md near the top of: {bad}"


@pytest.mark.parametrize("system", SYSTEMS)
def test_each_final_page_compares_with_the_reference_run(system):
    """The final page holds the generated comparison with the reference run (common.render.reference), not
    hand-written sentences about another GPU."""
    text = (ROOT / system / "reports" / "final-report.md").read_text()
    assert "<!-- auto:reference -->" in text, f"{system}/reports/final-report.md: no reference block"
    assert "auto:versus/" not in "\n".join(p.read_text() for p in pages(system))


@pytest.mark.parametrize("system", SYSTEMS)
def test_one_verdict_per_hypothesis(system):
    both = two_verdicts([p.read_text() for p in pages(system)])
    assert not both, f"{system}: the same hypothesis with two verdicts: {both}"


@pytest.mark.parametrize("system", SYSTEMS)
def test_analysis_opens_with_the_joined_story(system):
    text = (ROOT / system / "reports" / "analysis.md").read_text()
    page = ("<!-- auto:08_s/story -->\n| x | 4.67 ms | 88.93 |\n<!-- /auto -->\nIt takes 4.67 ms, 88.9% of it; 4.74 ms "
            "before.\n\nThe H100 took 2.63 TB/s (`results/other-gpu/03/`).\n")
    assert unsourced_figures(page, block_numbers([page])) == ["4.74 ms"]
    assert first_block_stem(text) in STORY_FIRST[system], \
        f"{system}/reports/analysis.md opens with {first_block_stem(text)}, not its joined story {STORY_FIRST[system]}"
    index = (ROOT / system / "reports" / "INDEX.md").read_text()
    assert "analysis.md" in index and index.find("analysis.md") < min(
        (i for i in (index.find("plan.md"), index.find("experiments.md")) if i >= 0), default=len(index)), \
        f"{system}/reports/INDEX.md: the reading order starts at the story (analysis.md), not the plan"


@pytest.mark.parametrize("system", SYSTEMS)
def test_every_figure_in_the_prose_is_shown_by_a_block(system):
    """A number in prose sits in a machine block: each measured figure of a page's hand-written text is one that a
    block of its system's pages shows (as written or rounded), so refreshed blocks cannot leave stale prose."""
    texts = {p: p.read_text() for p in pages(system) if p.name != "plan.md"}
    numbers = block_numbers(list(texts.values()))
    bad = {str(p.relative_to(ROOT)): f for p, t in texts.items() if (f := unsourced_figures(t, numbers))}
    assert not bad, f"figures in prose that no block shows (stale or unmeasured): {bad}"


def test_every_figure_on_the_cross_system_page_is_shown_by_a_block():
    texts = [p.read_text() for p in pages()] + [(ROOT / "CROSS-SYSTEM.md").read_text()]
    bad = unsourced_figures((ROOT / "CROSS-SYSTEM.md").read_text(), block_numbers(texts))
    assert not bad, f"CROSS-SYSTEM.md: figures in prose that no block shows: {bad}"


def test_each_guard_fails_on_a_bad_report():
    assert empty_sections("## Code\n\n```bash\n# a comment, not a heading\n```\n") == []
    bad = ("## Decode\n\n| decode is memory-bound | 4.34 TB/s | **confirmed** | x |\n\n## Empty\n\n## Next\n"
           "it streamed 102% of the measured copy bandwidth\n<!-- auto:04_x/story -->\n_not run yet_\n<!-- /auto -->\n")
    assert above_ceiling(bad) == ["102% of the measured"]
    assert verdict_rows(bad) == ["decode is memory-bound"]
    assert not_run_blocks(bad) == ["04_x/story"]
    assert empty_sections(bad) == ["Empty"]
    assert above_ceiling("reached 99.6% of the measured DRAM ceiling; 100.4% of peak") == []
    assert history("Same science after the move (issue 13.8); lent machines") == [
        "Same science", "after the move", "issue 13", "lent machines"]
    assert history("the merge kernel takes 42.6 us; call #0 of each; 13.8 ms; PLAN.md Session 1") == []
    assert history(hand_written("<!-- auto:01_a/observations -->\nissue 14 target\n<!-- /auto -->\nok")) == []
    assert history(hand_written("<!-- auto:01_a/observations -->\nx\n<!-- /auto -->\nafter the move")) == ["after the move"]
    lines = [ln for _n, ln in declared_hypotheses(ROOT / "sglang/scripts/08_execution_story.py")]
    assert any("observer budget" in ln for ln in lines) and len(lines) > 20      # the parse reads the declarations
    assert wide_code_lines("```text\n" + "x" * 121 + "\n```\n" + "y" * 200) == ["x" * 60]
    assert not links_glossary("# Title\n\ntext") and links_glossary("# T\nWords: [GLOSSARY](../../GLOSSARY.md)")
    assert two_verdicts([bad, bad.replace("**confirmed**", "**refuted**")]) == {
        "decode is memory-bound": ["confirmed", "refuted"]}
    assert first_block_stem("<!-- auto:runs -->\nx\n<!-- /auto -->\n<!-- auto:01_a/provenance -->\ny\n<!-- /auto -->\n"
                            "<!-- auto:08_s/story:one~2 -->\nz\n<!-- /auto -->\n") == "08_s"
