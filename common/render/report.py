"""`make reports`: refresh the machine-written blocks of <system>/reports/*.md from results.

A report is hand-written Markdown with blocks that this module owns:

    <!-- auto:03_profile_decode/story -->
    <!-- run: 1x NVIDIA H200 · torch 2.11.0+cu130, flashinfer-python 0.6.15.post1 · commit 6ca9eea · 2026-11-21 -->
    ...replaced on every refresh...
    <!-- /auto -->

Block keys: ``<stem>/story`` (folded to 120 characters a line; ``story:TITLE|TITLE~N``: only the top-level
branches whose label starts with a TITLE, down to level N), ``/observations``, ``/findings`` (the sentences the run
wrote from its figures: common.run.results.Run.finding), ``/provenance``, ``/headline``, ``/errors``,
``/table:<name>`` (results/<stem>/<name>.csv; ``table:<name>[col1,col2]`` keeps those columns),
``/figure:<name>`` (results/<stem>/<name>.png, copied to reports/figures/<stem>-<name>.png),
``index`` (INDEX.md: every numbered script with its last run), ``glossary/<section>`` (GLOSSARY.md at the
top of the repository: the words the reports use, written from the code that computes them, common.render.glossary),
``cross/<shape>`` (CROSS-SYSTEM.md at the top: one shape's kernels in the three systems, common.render.crossview),
``reference`` (a final page: this run against the reference run, common.render.reference) and ``runs`` (one per
page, near its top: the runs behind the page's blocks, one row per GPU · stack · commit · date, computed from the
hidden ``<!-- run: ... -->`` lines every block rendered from runs begins with).

A run's pages are one machine's:
- the refresh renders for the machine (GPU count and model) of the newest usable run in results/; a run on another
  machine is one line (``skipped <summary>: its run on ... is not this refresh's machine``) and none of its figures is
  shown, unless asked for (``make reports ACCEPT_MIXED=1``: then a page mixing machines says so in one bold line);
- every page of a system with a run on that machine is that machine's, whole: a block this run did not measure says
  so in one line naming the command that measures it (the pipeline's steps as data: ``hints``), never another run's
  figures beside this one's; a system with no run there keeps its pages as committed (the reference run);
- a fresh clone (no results/) leaves every page as committed, byte for byte.

Reports only move forward:
- blocks are refreshed only from finished, successful runs (``"status": "ok"``) of summary schema
  ``store.SCHEMA`` with provenance; a summary that is malformed, of an older schema or without provenance, or a table
  CSV that is not text, gives one line ``skipped <path>: <what is wrong>``; the rest of the refresh goes on;
- every block of every page is rendered in memory first; files (pages, figures) are written to temp
  files only when all rendered, and renamed into place only when all are written. An unexpected
  error, a full disk or a read-only file leaves every file as it was, one line, exit code 1;
- a page whose markers do not pair up (an opening marker without its closing one, a stray closing
  marker) is refused whole: one line naming the file and the line, no file written (a block would
  otherwise swallow the hand-written text after it).

Tables are read with the stdlib csv module (no pandas needed to run this).

    python -m common report                   # all systems
    python -m common report --system flashinfer
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from common import REPO_ROOT, SYSTEMS
from common.base.story import fmt, fold, section
from common.capture.gpu import provenance_line
from common.capture.gpu import machine_of
from common.capture.store import failed_dir, read_summary, recover, SUMMARY
from common.render import crossview, glossary, reference
from common.render.markdown import _md_row, _num, md_table, read_table, run_line, Skip

BLOCK = re.compile(r"(<!-- auto:(?P<key>[^\s>]+) -->\n)(?P<body>.*?)(<!-- /auto -->)", re.S)
MARKER = re.compile(r"<!-- (?:auto:(?P<key>[^\s>]+)|/auto) -->")
RUN_LINE = re.compile(r"^<!-- run: (?P<run>.*?) -->$", re.M)
GLOSSARY = "GLOSSARY.md"           # the one glossary page (repository root), its blocks from common.render.glossary
CROSS = "CROSS-SYSTEM.md"          # the same shapes in the three systems (repository root), common.render.crossview
ACCEPT_MIXED = "ACCEPT_MIXED"      # =1: also use runs of another machine (GPU count and model) than the newest run's


@dataclass
class Outcome:
    refreshed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)       # "file: key (why)"
    skipped: list[str] = field(default_factory=list)    # "skipped <path>: <what is wrong>"
    mixed: list[str] = field(default_factory=list)      # one line per page that mixes machines
    files_written: list[str] = field(default_factory=list)


class RenderError(Exception):
    """The refresh stopped -- an unexpected error while rendering a block, or a file that could not be
    written (disk full, read-only) -- and nothing was written."""


# ---------------------------------------------------------------- markdown tables


# ---------------------------------------------------------------- reading results


def needs_gpus(hints: dict | None, stem: str) -> int:
    """GPUs a stem needs (its step's min_gpus, common.run.steps.measure_hints), 1 when not said."""
    return int(((hints or {}).get(stem) or {}).get("gpus") or 1)


def gpu_count(machine: str | None) -> int:
    """The GPU count of a machine as machine_of names it ('4x NVIDIA H200' -> 4)."""
    m = re.match(r"(\d+)x ", machine or "")
    return int(m.group(1)) if m else 0


def refresh_machine(systems, root: Path, hints: dict | None = None) -> str | None:
    """The machine this refresh renders pages for: that of the newest usable run in the systems' results/ (by its
    date), or None when there is none (a fresh clone: every page stays as committed, the reference run). Runs of
    stems that need several GPUs (``hints``: {system: {stem: {"gpus": n}}}) choose it only when no other run is
    there: a multi-GPU experiment run on a bigger machine does not take the pages of the one-GPU runs away."""
    newest, multi = None, None
    for system in systems:
        for p in (root / system / "results").glob(f"*/{SUMMARY}"):
            if p.parent.name.startswith("."):
                continue
            s, _ = read_summary(p)
            if s is not None:
                key = (str(s["provenance"].get("date_utc")), machine_of(s["provenance"]))
                if needs_gpus((hints or {}).get(system), p.parent.name) > 1:
                    multi = max(multi or key, key)
                else:
                    newest = max(newest or key, key)
    newest = newest or multi
    return newest[1] if newest else None


class Renderer:
    """Renders the block keys of one system from its results folder for one machine (nothing is written here:
    figure copies wait in ``self.copies`` until every page has rendered). ``machine``: the refresh's machine
    (refresh_machine): a run on another one is skipped with a line, unless ACCEPT_MIXED=1. ``hints``: {stem: {"run":
    the command that measures the stem, "ncu"/"nsys"/"all": what to add for the parts a --quick run leaves out}},
    the pipeline's steps as data (common.run.steps.measure_hints), for the line of a block this run did not measure."""

    def __init__(self, system_dir: Path, root: Path = REPO_ROOT, machine: str | None = None, hints: dict | None = None):
        self.root = root
        self.sys_dir = system_dir
        self.results = system_dir / "results"
        self.reports = system_dir / "reports"
        self.machine = machine
        self.hints = hints or {}
        self.skipped: dict[str, str] = {}          # path -> what is wrong (one line each)
        self.copies: dict[Path, Path] = {}         # reports/figures/<stem>-<name>.png -> source
        self.accept_mixed = os.environ.get(ACCEPT_MIXED, "") not in ("", "0")
        self.elsewhere: dict[str, str] = {}        # stem -> the bigger machine its run is from (it needs more GPUs)
        self._cache: dict = {}

    def _rel(self, p: Path) -> str:
        try:
            return str(p.relative_to(self.root))
        except ValueError:
            return str(p)

    def _skip(self, p: Path, why: str) -> tuple[None, str]:
        self.skipped.setdefault(self._rel(p), why)
        return None, f"skipped: {why}"

    def _dir(self, stem: str) -> Path:
        return self.results / stem

    def summary(self, stem: str) -> dict | None:
        """The summary of a finished, successful run on this refresh's machine, or None (a bad one is noted in
        skipped)."""
        if stem not in self._cache:
            self._cache[stem] = self._load(stem)
        return self._cache[stem]

    def _load(self, stem: str) -> dict | None:
        recover(self._dir(stem))
        p = self._dir(stem) / SUMMARY
        if not p.is_file():
            return None
        s, why = read_summary(p)
        theirs = machine_of(s["provenance"]) if s is not None else None
        need = needs_gpus(self.hints, stem)
        if s is not None and self.machine and theirs != self.machine and need > 1 and \
                gpu_count(self.machine) < need <= gpu_count(theirs):
            self.elsewhere[stem] = theirs       # this machine cannot run it: its run on a bigger one, said so
        elif s is not None and self.machine and not self.accept_mixed and theirs != self.machine:
            why = (f"its run on {machine_of(s['provenance'])} is not this refresh's machine ({self.machine}, that of the "
                   f"newest run): a page shows one machine's runs (`make reports {ACCEPT_MIXED}=1` puts them beside)")
            s = None
        if why:
            self._skip(p, why)
        return s

    def stems(self) -> list[str]:
        """The stems of this system's results/ (hidden folders aside)."""
        return sorted(p.parent.name for p in self.results.glob(f"*/{SUMMARY}") if not p.parent.name.startswith("."))

    def any_run(self) -> bool:
        """Whether this system has a usable run on the refresh's machine: its pages are then that machine's."""
        return any(self.summary(stem) is not None for stem in self.stems())

    def not_measured(self, key: str, why: str) -> str:
        """The one line of a block this run did not measure, with the command that measures it."""
        stem, _, what = key.partition("/")
        h = self.hints.get(stem) or {}
        s = self.summary(stem)
        if s is None:
            how = h.get("run") or f"python {self.sys_dir.name}/scripts/{stem}.py --quick"
            what_missing = f"no run of {stem}"
        else:
            args = s.get("args") or {}
            extra = [h[k] for k in ("ncu", "nsys") if h.get(k) and not args.get(k)]
            if args.get("quick") and h.get("all"):
                extra.append(h["all"])
            how = " or ".join(f"`{x}`" for x in extra) if extra else f"`{h.get('run') or stem}`"
            what_missing = f"{stem}'s run has no {what.split(':', 1)[-1] or what} ({why})"
            return f"_Not measured in this run on {self.machine or machine_of(s['provenance'])}: {what_missing}; {how} measures it._\n"
        return f"_Not measured in this run on {self.machine}: {what_missing}; `{how}` measures it._\n"

    def render(self, key: str, old: str = "") -> tuple[str | None, str]:
        """(new body or None, reason when None). ``old``: the block's current body."""
        if key == "index":
            return self.index(old)
        if "/" not in key:
            return None, f"unknown block key {key!r}"
        stem, what = key.split("/", 1)
        s = self.summary(stem)
        if s is None:
            why = self.skipped.get(self._rel(self._dir(stem) / SUMMARY))
            return None, (f"skipped: {why}" if why else
                          f"no finished run in {self._rel(self._dir(stem))}")
        body, why = self._body(stem, what, s)
        need = needs_gpus(self.hints, stem)
        line = run_line(s["provenance"])
        if need > 1:                  # the page's runs header tells a bigger machine's run from a mix by this
            line = line.replace(" -->", f" · needs {need} GPUs -->")
        return (None, why) if body is None else (line + "\n" + body, "")

    def _body(self, stem: str, what: str, s: dict) -> tuple[str | None, str]:
        if what == "story" or what.startswith("story:"):
            if not s.get("story"):
                return None, "run has no story"
            text = fold(s["story"].rstrip())
            if what.startswith("story:"):     # story:TITLE|TITLE~DEPTH: those top-level branches, that deep
                sel, _, depth = what.split(":", 1)[1].partition("~")
                try:
                    text = section(text, [t.strip() for t in sel.split("|")], int(depth) if depth else None)
                except (KeyError, ValueError) as e:
                    return None, f"story selection {what!r}: {e}"
            return f"```text\n{text}\n```\n", ""
        if what == "provenance":
            return f"_Run: {provenance_line(s['provenance'])}_\n", ""
        if what == "headline":
            h = s.get("headline") or {}
            if not h:
                return None, "run has no headline figures"
            return "\n".join(f"- **{k}**: {fmt(_num(v))}" for k, v in h.items()) + "\n", ""
        if what == "findings":
            found = s.get("findings") or []
            if not found:
                return None, "run recorded no findings"
            return "\n".join(f"- {f}" for f in found) + "\n", ""
        if what == "observations":
            obs = s.get("observations") or []
            if not obs:
                return None, "run recorded no observations"
            rows = [{"expected (hypothesis)": o["expected"], "observed": o["observed"],
                     "verdict": f"**{o['verdict']}**", "evidence": o.get("evidence", "")} for o in obs]
            return md_table(rows, max_rows=100) + "\n", ""
        if what == "errors":
            errs = s.get("point_errors") or []
            return (md_table(errs) + "\n") if errs else "_No sweep point failed in the last run._\n", ""
        if what.startswith("table:"):
            return self._table(stem, what.split(":", 1)[1])
        if what.startswith("figure:"):
            name = what.split(":", 1)[1]
            p = self._dir(stem) / f"{name}.png"
            if not p.is_file():
                return None, f"{p.name} missing"
            self.copies[self.reports / "figures" / f"{stem}-{name}.png"] = p
            return f"![{stem} {name}](figures/{stem}-{name}.png)\n", ""
        return None, f"unknown block kind {what!r}"

    def _table(self, stem: str, name: str) -> tuple[str | None, str]:
        cols = None
        if name.endswith("]") and "[" in name:  # table:NAME[col1,col2,...] keeps those columns
            name, cols = name[:-1].split("[", 1)
            cols = [c for c in cols.split(",") if c]
        p = self._dir(stem) / f"{name}.csv"
        if not p.is_file():
            return None, f"{p.name} missing"
        try:
            t = read_table(p)
        except Skip as e:
            return self._skip(p, str(e))
        if t is None:
            return "_(the run wrote an empty table)_\n", ""
        columns, rows = t
        if cols:
            missing = [c for c in cols if c not in columns]
            if missing:
                return None, f"{p.name} has no column(s) {missing}"
            columns = cols
        if not rows:
            return "_(no rows)_\n", ""
        return md_table(rows, columns, more=f" in `{self._rel(p)}`") + "\n", ""

    def index(self, old: str = "") -> tuple[str | None, str]:
        """Every numbered script with its last successful run on this machine; with none here at all, the committed
        rows stay; else a script without a run here says so."""
        cols = ["script", "last run", "status", "GPU", "headline"]
        kept = {line.split(" | ", 1)[0]: line for line in old.splitlines() if line.startswith("| [`")}
        scripts = sorted(p for p in (self.sys_dir / "scripts").glob("[0-9][0-9]_*") if p.suffix in (".py", ".sh"))
        lines, any_run = [], False
        for sc in scripts:
            cell = f"[`{sc.name}`](../scripts/{sc.name})"
            s = self.summary(sc.stem)
            if s is None and f"| {cell}" in kept and not self.any_run():
                lines.append(kept[f"| {cell}"])
                continue
            n_failed = self._n_failed(sc.stem)
            any_run |= s is not None
            s = s or {}
            head = s.get("headline") or {}
            lines.append(_md_row({
                "script": cell,
                "last run": s.get("provenance", {}).get("date_utc", "-"),
                "status": s.get("status", f"not run on {self.machine}" if self.machine else "not run")
                          + (f" ({n_failed} failed kept)" if n_failed else ""),
                "GPU": s.get("provenance", {}).get("gpu", "-"),
                "headline": "; ".join(f"{k}={fmt(_num(v))}" for k, v in list(head.items())[:3]) or "-",
            }, cols))
        if not any_run:
            return None, "no results in this clone"
        head = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
        return "\n".join(head + lines) + "\n", ""

    def _n_failed(self, stem: str) -> int:
        d = failed_dir(self.results / stem)
        return sum(1 for p in d.iterdir() if not p.name.startswith(".")) if d.is_dir() else 0


def _run_lines(body: str) -> list[str]:
    """The runs a block was rendered from: the hidden run lines it begins with."""
    out = []
    for line in body.splitlines():
        m = RUN_LINE.match(line)
        if not m:
            break
        out.append(m.group("run"))
    return out


def _fields(run: str) -> list[str]:
    """GPU, stack, commit, date of a run line's text ('1x NVIDIA H200 · torch ... · commit abc · 2026-11-23')."""
    return (run.split(" · ") + ["?"] * 4)[:4]


def _stem_of(key: str) -> str | None:
    """The stem whose run a block key renders from (None: runs, index, glossary/, cross/, reference)."""
    stem = key.split("/", 1)[0] if "/" in key else None
    return None if stem in (None, "glossary", "cross", "reference") else stem


NEEDS = re.compile(r" · needs (\d+) GPUs$")    # the end of a run line of a stem that needs several GPUs


def runs_header(blocks: list[tuple[str, str]]) -> tuple[str | None, str | None]:
    """(body of the page's ``runs`` block, the one-line warning when the page mixes machines), from the hidden run
    lines of the page's blocks ``[(key, body), ...]``. (None, None): no block carries a run line. A run line that ends
    " · needs N GPUs" (a stem whose step needs several, Renderer.render) on a machine with more GPUs than every
    other run's machine has is said in one bold line of its own, not counted as a mix."""
    runs: dict[str, list[str]] = {}
    unmeasured = 0
    for key, body in blocks:
        if key in ("runs", "index") or _stem_of(key) is None:
            continue
        found = _run_lines(body)
        unmeasured += not found
        for run in found:
            stems = runs.setdefault(run, [])
            if key.split("/", 1)[0] not in stems:
                stems.append(key.split("/", 1)[0])
    if not runs:
        return None, None
    rows = []
    for run, stems in runs.items():
        m = NEEDS.search(run)
        gpu, stack, commit, date = _fields(NEEDS.sub("", run))
        rows.append({"GPU": gpu, "stack": stack, "commit": commit.removeprefix("commit "), "date": date,
                     "results of": ", ".join(stems), "needs": int(m.group(1)) if m else 1})
    need = lambda r: r["needs"]  # noqa: E731
    own = list(dict.fromkeys(r["GPU"] for r in rows if need(r) <= 1))
    big = [r for r in rows if need(r) > 1 and own and r["GPU"] not in own
           and all(gpu_count(m) < need(r) for m in own)]
    counted = list(dict.fromkeys(r["GPU"] for r in rows if r not in big))
    mixed = (f"This page mixes runs from {len(counted)} machines: {'; '.join(counted)}" if len(counted) > 1 else None)
    out = [f"**{mixed}; compare their figures with care.**\n"] if mixed else []
    if big:
        stems = ", ".join(st for r in big for st in r["results of"].split(", "))
        where = "; ".join(f"{r['GPU']}, {r['date']}" for r in big)
        mine = f" ({own[0]})" if len(own) == 1 else ""
        out.append(f"**{stems}: {where} — {'it needs' if len(big) == 1 else 'they need'} more GPUs than this page's "
                   f"machine{mine} has; the rest of the page is that machine's.**\n")
    out.append("Runs behind this page (from the run line each block below carries):\n")
    out.append(md_table([{k: v for k, v in r.items() if k != "needs"} for r in rows], max_rows=100))
    if unmeasured:
        out.append(f"\n_{unmeasured} block(s) carry no run: this run did not measure them (each says which command does)._")
    return "\n".join(out) + "\n", mixed


def check_markers(text: str, label: str) -> None:
    """RenderError naming the file and line of the first marker out of place: an opening marker inside a
    block (its own closing marker missing), a closing marker outside one, a block never closed. Such a
    page is refused whole: a block would otherwise swallow the hand-written text after it."""
    opened = None                                   # (line, key) of the block we are in
    for m in MARKER.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        if m.group("key") and opened:
            raise RenderError(f"{label} line {opened[0]}: <!-- auto:{opened[1]} --> has no closing <!-- /auto --> "
                              f"before the next block opens (line {line})")
        if not m.group("key") and not opened:
            raise RenderError(f"{label} line {line}: <!-- /auto --> closes no block")
        opened = (line, m.group("key")) if m.group("key") else None
    if opened:
        raise RenderError(f"{label} line {opened[0]}: <!-- auto:{opened[1]} --> has no closing <!-- /auto -->")


def render_page(text: str, r: Renderer, label: str, out: Outcome, root: Path = REPO_ROOT,
                machine: str | None = None) -> str:
    """The page ``text`` with every block rendered; raises RenderError. The pages of a system with a run on the refresh's
    machine are that machine's pages, whole: each block this run did not measure says so in one line (with the command
    that measures it) instead of keeping another run's figures. A system without one keeps every block as it is (the
    reference run, as committed); so does a page outside the systems when no system has a run."""
    check_markers(text, label)
    matches = list(BLOCK.finditer(text))
    switched = r.any_run() if r is not None else machine is not None
    bodies: list[str] = []
    for m in matches:
        key, old = m.group("key"), m.group("body")
        if key == "runs":
            bodies.append(old)
            continue
        try:
            if key.startswith("glossary/"):
                body, why = glossary.render(key.split("/", 1)[1]), ""
            elif key.startswith("cross/"):            # the three systems side by side (common.render.crossview)
                body, why = crossview.render(key.split("/", 1)[1], root, machine)
                if body is None and switched and not why.startswith("unknown shape"):
                    body, why = (f"_Not measured in this run on {machine}: {why}; each system's "
                                 "`06_full_pipeline.sh --quick --ncu` measures it._\n"), ""
            elif r is None:
                body, why = None, "a page outside the systems holds glossary and cross/ blocks only"
            elif key == "reference":
                body, why = reference.render(r.sys_dir.name, root, [r.summary(s) for s in r.stems()
                                                                    if s not in r.elsewhere])
            else:
                body, why = r.render(key, old)
                if body is None and switched and _stem_of(key):
                    body, why = r.not_measured(key, why), ""
        except Exception as e:  # an unexpected error: the whole refresh stops, nothing written
            first = str(e).splitlines()[0][:200] if str(e) else ""
            raise RenderError(f"{label}: block {key}: {e.__class__.__name__}: {first}") from e
        if body is None:
            out.kept.append(f"{label}: {key} ({why})")
            body = old
        else:
            out.refreshed.append(f"{label}: {key}")
        bodies.append(body)
    header, mixed = runs_header([(m.group("key"), b) for m, b in zip(matches, bodies)])
    has_header = False
    for i, m in enumerate(matches):
        if m.group("key") == "runs":
            has_header = True
            if header is None and not switched:
                out.kept.append(f"{label}: runs (no block on this page carries a run line)")
            elif header is None:
                bodies[i] = f"_No block on this page shows a run's figures (this run: {machine})._\n"
                out.refreshed.append(f"{label}: runs")
            else:
                bodies[i] = header
                out.refreshed.append(f"{label}: runs")
    if mixed:
        out.mixed.append(f"{label}: {mixed}" + ("" if has_header else
                         " (the page has no auto:runs header to say so; each block's provenance names its run)"))
    parts, pos = [], 0
    for m, body in zip(matches, bodies):
        parts += [text[pos:m.start()], m.group(1), body, m.group(4)]
        pos = m.end()
    return "".join(parts) + text[pos:]


def _stage(path: Path, data: bytes) -> Path:
    """Write ``data`` to a temp file beside ``path`` (renamed over it once every file is staged)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def refresh(systems=SYSTEMS, root: Path = REPO_ROOT, echo=print, hints: dict | None = None) -> Outcome:
    """Render every page of ``systems`` for one machine (refresh_machine: that of the newest run), then write the
    changed ones (all or nothing; RenderError). ``hints``: {system: {stem: ...}} (Renderer)."""
    out = Outcome()
    pages: list[tuple[Path, str]] = []
    renderers = []
    machine = refresh_machine(systems, root, hints)
    for system in systems:
        rdir = root / system / "reports"
        if not rdir.is_dir():
            continue
        r = Renderer(root / system, root, machine, (hints or {}).get(system))
        renderers.append(r)
        for md in sorted(rdir.glob("*.md")):
            text = md.read_text()
            new = render_page(text, r, f"{system}/reports/{md.name}", out, root, machine)
            if new != text:
                pages.append((md, new))
        out.skipped += [f"skipped {p}: {why}" for p, why in r.skipped.items()]
        other = r.results / "other-gpu"
        if other.is_dir():
            out.skipped.append(f"skipped {r._rel(other)}: not read any more; to compare two machines, make one run "
                               "the reference (python -m common reference --write) and refresh the other")
    for name in (GLOSSARY, CROSS):                   # the pages at the top: the glossary (from the code) and
        gl = root / name                             # the three systems side by side (from their results)
        if gl.is_file():
            text = gl.read_text()
            new = render_page(text, None, name, out, root, machine)
            if new != text:
                pages.append((gl, new))
    staged: list[tuple[Path, Path]] = []            # all rendered: every byte goes to temp files first,
    where = root                                     # so a full disk or a read-only file changes nothing
    try:
        for r in renderers:
            for dst, src in r.copies.items():
                where = dst
                data = src.read_bytes()
                if not dst.exists() or dst.read_bytes() != data:
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    staged.append((_stage(dst, data), dst))
        for md, new in pages:
            where = md
            staged.append((_stage(md, new.encode()), md))
    except OSError as e:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        rel = where.relative_to(root) if where.is_relative_to(root) else where
        raise RenderError(f"cannot write {rel}: {f'[Errno {e.errno}] {e.strerror}' if e.strerror else e}") from e
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, dst in staged:                          # then renames only
        os.replace(tmp, dst)
        if dst.suffix == ".md":
            out.files_written.append(str(dst.relative_to(root)))
    return out


def main(argv=None, hints=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m common report",
                                description="Refresh the auto blocks of <system>/reports/*.md from results/.")
    p.add_argument("--system", choices=SYSTEMS, action="append", help="only this system (repeatable)")
    p.add_argument("--quiet", action="store_true", help="print only problems and the totals")
    a = p.parse_args(argv)
    try:
        o = refresh(a.system or SYSTEMS, hints=hints() if callable(hints) else hints)
    except RenderError as e:
        print(f"[failed] reports not refreshed, no file written: {e}")
        return 1
    for line in o.skipped + [f"{m}" for m in o.mixed]:
        print(line)
    if not a.quiet:
        for f in o.files_written:
            print(f"updated {f}")
        if o.kept:
            print(f"\n{len(o.kept)} block(s) kept as committed (nothing newer to put there):")
            for k in o.kept:
                print(f"  - {k}")
    print(f"\nreports: {len(o.refreshed)} block(s) refreshed from results, {len(o.kept)} kept, "
          f"{len(o.skipped)} results file(s) skipped, {len(o.files_written)} file(s) changed")
    return 0
