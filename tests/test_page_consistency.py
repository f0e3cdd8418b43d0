"""Pages that agree with themselves: across every report page, the checks that a reader would otherwise do by hand.

(a) one value per quantity: a block shown on two pages shows the same body; one run gives one hypothesis one
    observation and one verdict, and one value per ceiling (DRAM read/mixed/copy/write, bf16), on every page; a
    hand-written sentence that names a hypothesis (H-xx) with a verdict word agrees with that hypothesis' rows; a
    page's runs header lists only the runs of the blocks it holds (report.runs_header on the page's own blocks);
(b) every stated bound agrees with the counters shown with it: each generated bound (common.judge.bounds.bound_why:
    "memory-bound: DRAM SOL 80%, SM SOL 73%, tensor 0%; top stall ...") is what bound() gives for those figures
    within their rounding; each "waiting on saturated DRAM" / "the pipe at work" note names a share at or above
    common.tables.kernels.SATURATED; a confirmed (refuted) hypothesis that claims a bound shows only (no) bounds
    of that kind in its observed cell;
(c) every claim of a final report (a list item or a table row of its hand-written part) cites a section by a link
    whose anchor exists, and every link to a page's section on any page resolves;
and the prose keeps the project's history out (no commit hash outside a code span, no "earlier run"): provenance
belongs in the run lines. Each check returns what it finds, so test_each_check_fails_on_a_seeded_contradiction can
seed one contradiction of each kind into copies of the committed pages and see it found."""
import itertools
import posixpath
import re
from pathlib import Path

import pytest

from common import SYSTEMS
from common.judge import bounds, noise, verdicts
from common.render import glossary, report
from common.tables.kernels import SATURATED
from test_page_text import prose, sentences

ROOT = Path(__file__).resolve().parents[1]
ALL = {str(p.relative_to(ROOT)): p for p in
       [p for s in SYSTEMS for p in sorted((ROOT / s / "reports").glob("*.md"))]
       + [ROOT / "CROSS-SYSTEM.md", ROOT / "GLOSSARY.md"]}
PROSE_PAGES = [k for k in ALL if not k.endswith("plan.md")]      # plan.md keeps the plan's words as written

BLOCK = report.BLOCK
RUN = report.RUN_LINE
VERDICT = re.compile(r"\*\*(confirmed|refuted|inconclusive|not run)\*\*")
CEILINGS = [  # (pattern, kinds of its groups): the ceilings a block names, in the words common.capture.ceilings writes
    (re.compile(r"measured DRAM (read|mixed|copy|write) ceiling (\d[\d.,]*) TB/s"), None),
    (re.compile(r"measured bf16 tensor ceiling (\d[\d.,]*) TFLOP/s"), ("bf16",)),
    (re.compile(r"DRAM read ceiling \d[\d.,]* TB/s, bf16 (\d[\d.,]*) TFLOP/s"), ("bf16",)),
    (re.compile(r"ceilings: DRAM read (\d[\d.]*) · mixed (\d[\d.]*) · copy (\d[\d.]*) · write (\d[\d.]*) TB/s"),
     ("read", "mixed", "copy", "write")),
]
BOUND = re.compile(r"(?P<cls>memory-latency-bound|memory-bound|compute-bound \(tensor cores\)|compute-bound|latency-bound)"
                   r"[:(]\s*DRAM SOL (?P<dram>\d+)%, SM SOL (?P<sm>\d+)%(?:, tensor (?P<tc>\d+)%)?"
                   r"(?:; top stall (?P<stall>\w+))?")
SATURATED_NOTE = re.compile(r"DRAM runs at (?P<v>[\d.]+)% of its ceiling: waiting on saturated DRAM"
                            r"|the tensor pipe is (?P<t>[\d.]+)% busy: these stalls are the pipe at work")
STREAM_NOTE = re.compile(r"at (?P<v>[\d.]+)% of the DRAM read ceiling, (?P<side>at or above|below) the (?P<s>[\d.]+)% "
                         r"that counts as saturated")
CLAIM_FAMILY = [("memory", re.compile(r"\b(?:memory|DRAM|HBM|bandwidth)[- ](?:latency[- ])?bound", re.I)),
                ("latency", re.compile(r"\blatency[- ]bound", re.I)),
                ("compute", re.compile(r"\b(?:compute|tensor[- ]core|tensor|SM)[- ]bound", re.I))]
H_ID = re.compile(r"\bH-\d{2}\b")
LINK = re.compile(r"\]\((?P<path>[^)\s#]*)(?:#(?P<anchor>[^)\s]+))?\)")
HASH = re.compile(r"\b(?:commit|at|before|since|after|of) [0-9a-f]{7,40}\b"        # a hash, digits only or not
                  r"|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
PAST = re.compile(r"\b(?:an? |the )?(?:earlier|older|former) (?:runs?|commits?|versions? of (?:this|the) page)\b"
                  r"|\bused to\b|\bno longer\b|\bbefore (?:the |this )?(?:fix|change|rewrite)\b", re.I)


# ---------------------------------------------------------------- reading a page

def blocks(text: str) -> list[tuple[str, str, str | None]]:
    """(key, body, run) of every block; run: the first run line the body carries (None: none)."""
    return [(m["key"], m["body"], r["run"] if (r := RUN.match(m["body"])) else None) for m in BLOCK.finditer(text)]


def cells(row: str) -> list[str]:
    """The cells of a Markdown table row (escaped pipes kept inside their cell)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def verdict_rows(body: str) -> list[tuple[str, str, str]]:
    """(expected, observed, verdict) of every verdict row in a block body."""
    out = []
    for line in body.splitlines():
        if line.startswith("|") and (m := VERDICT.search(line)):
            c = cells(line)
            if len(c) >= 3:
                out.append((re.sub(r"\s+", " ", c[0]), c[1], m.group(1)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (letters, digits, _ and - kept), spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings (code blocks aside; a repeated heading gets -1, -2, ...)."""
    out, seen, fenced = set(), {}, False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6}\s+(.*)", line)):
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def _num(s: str) -> float:
    return float(s.replace(",", ""))


# ---------------------------------------------------------------- (a) one value per quantity

def one_value(pages: dict[str, str]) -> list[str]:
    """Quantities of one run shown with two values: a block key with two bodies, a hypothesis of one run with two
    observations or verdicts, a ceiling of one run with two values."""
    out = []
    by_key: dict = {}
    rows: dict = {}
    ceil: dict = {}
    for label, text in pages.items():
        system = label.split("/")[0] if "/" in label else ""       # a block key names a stem of its page's system
        for key, body, run in blocks(text):
            if key not in ("runs", "index", "reference"):
                by_key.setdefault(f"{system}/{key}".lstrip("/"), {}).setdefault(body, []).append(label)
            if run is None:
                continue
            for expected, observed, verdict in verdict_rows(body):
                rows.setdefault((run, system, key.split("/")[0], expected), {}).setdefault(
                    (observed, verdict), []).append(label)
            if len(RUN.findall(body)) == 1:             # one machine's block: its ceilings are that run's
                for pat, kinds in CEILINGS:
                    for m in pat.finditer(body):
                        named = zip(kinds, m.groups()) if kinds else [(m.group(1), m.group(2))]
                        for kind, v in named:
                            ceil.setdefault((run, kind), {}).setdefault(_num(v), []).append(f"{label} {key}")
    out += [f"block {k} shows {len(b)} different bodies: on " + "; ".join(", ".join(v) for v in b.values())
            for k, b in by_key.items() if len(b) > 1]
    out += [f"{stem} of run {run[:50]}…: '{exp[:70]}' reads " + " and ".join(f"{v} ({', '.join(p)})"
                                                                        for (_o, v), p in seen.items())
            for (run, _s, stem, exp), seen in rows.items() if len(seen) > 1]
    out += [f"run {run[:60]}…: the {kind} ceiling is " + " and ".join(f"{v:g} ({', '.join(sorted(set(p)))})"
                                                                       for v, p in vals.items())
            for (run, kind), vals in ceil.items() if len(vals) > 1]
    return out


def prose_verdicts(pages: dict[str, str]) -> list[str]:
    """Hand-written sentences that name a hypothesis (H-xx) with a verdict word its rows on the system's pages do not
    give it."""
    out = []
    for system in SYSTEMS:
        mine = {k: t for k, t in pages.items() if k.startswith(f"{system}/")}
        given: dict = {}
        for text in mine.values():
            for _key, body, _run in blocks(text):
                for expected, _obs, verdict in verdict_rows(body):
                    for h in H_ID.findall(expected.split(" — ", 1)[-1]):
                        given.setdefault(h, set()).add(verdict)
        for label, text in mine.items():
            if label.endswith("plan.md"):
                continue
            for s in sentences(prose(text)):
                words = set(re.findall(r"\b(confirmed|refuted|inconclusive)\b", s))
                for h in H_ID.findall(s):
                    if words and h in given and not words & given[h]:
                        out.append(f"{label}: '{s[:90]}' calls {h} {'/'.join(sorted(words))}; its rows: "
                                   f"{'/'.join(sorted(given[h]))}")
    return out


def runs_headers(pages: dict[str, str]) -> list[str]:
    """Runs headers that list runs no block of their page carries (a header make reports would write otherwise, or,
    where no block carries a run line, a table of runs at all)."""
    out = []
    for label, text in pages.items():
        bl = blocks(text)
        for key, body, _run in bl:
            if key != "runs":
                continue
            want, _mixed = report.runs_header([(k, b) for k, b, _r in bl])
            if want is None and re.search(r"^\| GPU \|", body, re.M):
                out.append(f"{label}: the runs header lists runs, yet no block on the page carries a run line")
            elif want is not None and want != body:
                out.append(f"{label}: the runs header is not the one the page's blocks give")
    return out


# ---------------------------------------------------------------- (b) bounds against their counters

def unfold(text: str) -> str:
    """Text with its line breaks (and a story tree's line prefixes) as single spaces."""
    return re.sub(r"[ \t]*\n[│├└─ \t]*", " ", text)


def _classes(dram: float, sm: float, tc: float | None, stall: str | None) -> set[str]:
    """bound() of every value the rounded figures may stand for (each within half a unit)."""
    out = set()
    for d, s, t in itertools.product(*[(v - 0.49, v, v + 0.49) if v is not None else (None,) for v in (dram, sm, tc)]):
        out.add(bounds.bound({"dram_sol_pct": d, "sm_pct": s, "tensor_pct": t,
                              "top_stalls": f"{stall} 1%" if stall else ""}))
    return out


def bound_disagreements(text: str) -> list[str]:
    """Generated bounds and saturation notes that the figures shown with them do not give (a story's lines unfolded
    first: common.base.story.fold breaks a long bracket across tree lines)."""
    text = unfold(text)
    out = []
    for m in BOUND.finditer(text):
        tc = float(m["tc"]) if m["tc"] is not None else None
        got = _classes(float(m["dram"]), float(m["sm"]), tc, m["stall"])
        if m["cls"] not in got:
            out.append(f"'{m.group(0)}': bound() of these figures is {' or '.join(sorted(got))}")
    for m in SATURATED_NOTE.finditer(text):
        v = float(m["v"] or m["t"])
        if v < SATURATED - 0.05:
            out.append(f"'{m.group(0)}': {v:g}% is below the {SATURATED:g}% called saturated")
    for m in STREAM_NOTE.finditer(text):
        above = float(m["v"]) >= float(m["s"])
        if above != (m["side"] == "at or above"):
            out.append(f"'{m.group(0)}': {m['v']}% is {'at or above' if above else 'below'} {m['s']}%")
    return out


def verdict_bounds(text: str) -> list[str]:
    """Confirmed (refuted) hypotheses that claim a bound of one kind while their observed cell shows bounds of another
    kind (of that kind)."""
    out = []
    fam = {"memory-bound": "memory", "memory-latency-bound": "memory", "latency-bound": "latency"}
    for _key, body, _run in blocks(text):
        for expected, observed, verdict in verdict_rows(body):
            claim = expected.split(" — ", 1)[0]
            want = next((f for f, pat in CLAIM_FAMILY if pat.search(claim)), None)
            shown = {fam.get(m["cls"], "compute") for m in BOUND.finditer(observed)}
            if want is None or not shown or verdict not in ("confirmed", "refuted"):
                continue
            if (shown != {want}) if verdict == "confirmed" else (want in shown):
                out.append(f"'{claim[:70]}' is {verdict}, yet its observed bounds are {', '.join(sorted(shown))}")
    return out


# ---------------------------------------------------------------- (c) claims cite a section; links resolve

def _target(label: str, path: str) -> str:
    """The page a link of page ``label`` points to, as a key of ALL (the same page when ``path`` is empty)."""
    return posixpath.normpath(posixpath.join(posixpath.dirname(label), path)) if path else label


def broken_links(pages: dict[str, str]) -> list[str]:
    """Links to a section (page.md#anchor) whose page is not a report page or whose anchor is no heading of it."""
    heads = {k: anchors(t) for k, t in pages.items()}
    out = []
    for label, text in pages.items():
        for m in LINK.finditer(BLOCK.sub("", text)):
            path, anchor = m["path"], m["anchor"]
            if anchor is None or (path and not path.endswith(".md")):
                continue
            target = _target(label, path)
            if target in heads and anchor not in heads[target]:
                out.append(f"{label}: ({path}#{anchor}): no such heading in {target}")
    return out


def uncited_claims(label: str, text: str, pages: dict[str, str]) -> list[str]:
    """The list items and table rows of a final report's hand-written part (before its comparison with the reference
    run) that cite no section: no link to page.md#anchor whose heading exists."""
    heads = {k: anchors(t) for k, t in pages.items()}
    part = BLOCK.sub("", text).split("## Against the reference run")[0]
    items, cur, row = [], None, 0           # row: the line's place in its table (1: header, 2: separator)
    for line in part.splitlines():
        row = row + 1 if line.startswith("|") else 0
        if line.startswith("- "):
            cur = [line]
            items.append(cur)
        elif row > 2:
            items.append([line])
            cur = None
        elif cur is not None and line.startswith("  "):
            cur.append(line)
        else:
            cur = None
    out = []
    for it in items:
        claim = " ".join(x.strip() for x in it)
        ok = False
        for m in LINK.finditer(claim):
            if m["anchor"] and m["path"].endswith(".md"):
                target = _target(label, m["path"])
                ok |= m["anchor"] in heads.get(target, set())
        if not ok:
            out.append(f"{label}: '{claim[:100]}' cites no section of the analysis")
    return out


def history(text: str) -> list[str]:
    """Words of the project's history in the hand-written text: a commit hash outside a code span, an earlier run."""
    p = prose(text)
    return sorted({m.group(0) for m in itertools.chain(HASH.finditer(p), PAST.finditer(p))})


# ---------------------------------------------------------------- the committed pages

def committed() -> dict[str, str]:
    return {k: p.read_text() for k, p in ALL.items()}


def test_one_value_per_quantity_on_every_page():
    pages = committed()
    found = one_value(pages) + prose_verdicts(pages) + runs_headers(pages)
    assert not found, "quantities with two values across the pages:\n" + "\n".join(found)


@pytest.mark.parametrize("page", list(ALL))
def test_every_bound_agrees_with_its_counters(page):
    text = ALL[page].read_text()
    found = bound_disagreements(text) + verdict_bounds(text)
    assert not found, f"{page}: bounds that their counters do not give:\n" + "\n".join(found)


@pytest.mark.parametrize("system", SYSTEMS)
def test_every_final_report_claim_cites_a_section(system):
    pages = committed()
    label = f"{system}/reports/final-report.md"
    found = uncited_claims(label, pages[label], pages)
    assert not found, "\n".join(found)


@pytest.mark.parametrize("page", list(ALL))
def test_links_to_a_section_resolve(page):
    pages = committed()
    found = [f for f in broken_links(pages) if f.startswith(f"{page}:")]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("page", PROSE_PAGES)
def test_the_prose_keeps_the_projects_history_out(page):
    found = history(ALL[page].read_text())
    assert not found, f"{page}: project history in the hand-written text (it belongs in the run lines): {found}"


def test_the_glossary_states_the_verdict_rule_with_its_margins():
    """GLOSSARY's verdicts section says how run-to-run margins enter a verdict, per GPU model, and what a model without
    its own margin does, in the words common.judge.verdicts writes (and make reports renders it from that code)."""
    g = glossary.render("verdicts")
    assert g in (ROOT / "GLOSSARY.md").read_text()
    for words in ("run-to-run margin", "borrowed margin", "within the run-to-run noise", *noise.models(),
                  verdicts._margin_source({"borrowed": True, "model": "MODEL", "runs": "RUNS"})):
        assert words in g, words


# ---------------------------------------------------------------- each check, proven on a seeded contradiction

SEED_PAGES = Path(__file__).parent / "fixtures" / "pages_flashinfer_h100"    # frozen: the seeds name their lines


def test_each_check_fails_on_a_seeded_contradiction():
    """The checks on a frozen copy of FlashInfer's pages (tests/fixtures/pages_flashinfer_h100: the pages as rendered
    from H100 runs with ncu, whose lines the seeds below rewrite), each seeded with one contradiction of its kind."""
    fi = {f"flashinfer/reports/{p.name}": p.read_text() for p in sorted(SEED_PAGES.glob("*.md"))}
    pages = {**committed(), **fi}
    fa, ff = "flashinfer/reports/analysis.md", "flashinfer/reports/final-report.md"
    assert not one_value(fi) and not prose_verdicts(fi) and not runs_headers(fi)
    assert not bound_disagreements(fi[fa]) and not verdict_bounds(fi[fa])
    assert not uncited_claims(ff, fi[ff], pages) and not broken_links(fi) and not history(fi[fa])

    # (a) the same verdict block on a second page with one verdict turned; a ceiling of the same run with another
    # value; a hand-written sentence that gives H-04 a verdict its row does not; a runs header left from other blocks
    obs = next(m for m in BLOCK.finditer(fi[fa]) if m["key"] == "03_profile_decode/observations").group(0)
    other = obs.replace("**confirmed**", "**refuted**", 1)
    seeded = {**fi, "flashinfer/reports/extra.md": other}
    found = one_value(seeded)
    assert any("03_profile_decode/observations shows 2 different bodies" in f for f in found)
    assert any("reads confirmed" in f and "refuted" in f for f in found)
    ceil = fi[fa].replace("measured bf16 tensor ceiling 801 TFLOP/s (best of 22", "measured bf16 tensor ceiling 810 "
                          "TFLOP/s (best of 22", 1)
    assert any("the bf16 ceiling is" in f and "801 (" in f and "810 (" in f for f in one_value({**fi, fa: ceil}))
    told = fi[fa] + "\nThe plan's DRAM bound of **H-04** is refuted here.\n"
    assert any("calls H-04 refuted" in f for f in prose_verdicts({**fi, fa: told}))
    stale = fi[ff].replace("<!-- auto:runs -->\n", "<!-- auto:runs -->\n| GPU | stack |\n|---|---|\n| 1x X | y |\n", 1)
    stale = re.sub(r"<!-- auto:\w+/findings -->\n.*?<!-- /auto -->\n", "", stale, flags=re.S)
    assert runs_headers({ff: stale}) == [f"{ff}: the runs header lists runs, yet no block on the page carries a run line"]

    # (b) a bound word the counters do not give; a saturation note under the threshold; a confirmed bound claim whose
    # observed bound is of another kind
    wrong = fi[fa].replace("[memory-bound: DRAM SOL 80%, SM SOL 73%", "[compute-bound: DRAM SOL 80%, SM SOL 73%", 1)
    assert wrong != fi[fa] and bound_disagreements(wrong) == [
        "'compute-bound: DRAM SOL 80%, SM SOL 73%, tensor 0%; top stall not_selected': bound() of these figures is "
        "memory-bound"]
    assert bound_disagreements("top stall long_scoreboard: DRAM runs at 42.0% of its ceiling: waiting on saturated DRAM")
    assert bound_disagreements("streams its weights at 61.2% of the DRAM read ceiling, at or above the 70% that "
                               "counts as saturated")
    assert not bound_disagreements("latency-bound: DRAM SOL 40%, SM SOL 39%")      # 39.5 rounds either way
    turned = fi[fa].replace("memory-bound: DRAM SOL 79%, SM SOL 72%", "latency-bound: DRAM SOL 39%, SM SOL 22%", 1)
    assert any("CUDA-core decode is DRAM-bound" in f for f in verdict_bounds(turned))

    # (c) a claim without a section to cite; a link to a heading that is not there; history in the prose
    claim = fi[ff].replace("## 2. Leads", "- **RMSNorm is faster fused.** The kernel moves fewer bytes.\n\n## 2. Leads", 1)
    assert uncited_claims(ff, claim, pages) == [f"{ff}: '- **RMSNorm is faster fused.** The kernel moves fewer bytes.' "
                                                "cites no section of the analysis"]
    moved = fi[ff].replace("analysis.md#12-the-merge-kernel-a-closer-look", "analysis.md#12-the-merge", 1)
    assert broken_links({**fi, ff: moved})
    assert history("At commit 7198304 the merge ran; an earlier run showed it, before 1c8479f.\n"
                   "`sgl-project/x@20fcd7f` is fine, and so is 16384.") == [
        "an earlier run", "before 1c8479f", "commit 7198304"]
