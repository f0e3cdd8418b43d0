"""`make reports`: refresh the machine-written blocks of <system>/reports/*.md from results.

A report is hand-written Markdown with blocks that this module owns:

    <!-- auto:03_profile_decode/story -->
    <!-- run: 1x NVIDIA H200 · torch 2.11.0+cu130, flashinfer-python 0.6.15.post1 · commit 6ca9eea · 2026-11-21 -->
    ...replaced on every refresh...
    <!-- /auto -->

Block keys: ``<stem>/story`` (folded to 120 characters a line; ``story:TITLE|TITLE~N``: only the top-level
branches whose label starts with a TITLE, down to level N), ``/observations``, ``/provenance``, ``/headline``, ``/errors``,
``/table:<name>`` (results/<stem>/<name>.csv; ``table:<name>[col1,col2]`` keeps those columns),
``/figure:<name>`` (results/<stem>/<name>.png, copied to reports/figures/<stem>-<name>.png),
``index`` (INDEX.md: every numbered script with its last run), ``glossary/<section>`` (GLOSSARY.md at the
top of the repository: the words the reports use, written from the code that computes them, common.render.glossary),
``cross/<shape>`` (CROSS-SYSTEM.md at the top: one shape's kernels in the three systems, common.render.crossview),
``versus/<folder>`` (the verdicts and
machines of the runs in results/<folder>/<stem>/ -- the same experiments on another GPU -- beside
those of results/<stem>/, see :meth:`Renderer.versus`) and ``runs`` (one per page, near its
top: the runs behind the page's blocks, one row per GPU · stack · commit · date, computed from the
hidden ``<!-- run: ... -->`` lines every block rendered from runs begins with; a page mixing GPUs
or stacks says so in one bold line, and `make reports` prints one line for it; blocks that compare with
another GPU on purpose, ``versus/<folder>`` and ``<stem>@<folder>``, are listed but make no mix). A stem written
``<stem>@<folder>`` reads results/<folder>/<stem>/ instead of results/<stem>/ (e.g. the key tables
of the run on the other GPU: ``04_profile_rmsnorm@other-gpu/table:fusion``).

Reports only move forward:
- blocks are refreshed only from finished, successful runs (``"status": "ok"``) of summary schema
  ``results.SCHEMA`` with provenance; a summary that is malformed, of an older schema or without
  provenance, or a table CSV that is not text, gives one line ``skipped <path>: <what is wrong>``
  and its blocks keep their content; the rest of the refresh goes on;
- every block of every page is rendered in memory first; files (pages, figures) are written to temp
  files only when all rendered, and renamed into place only when all are written. An unexpected
  error, a full disk or a read-only file leaves every file as it was, one line, exit code 1;
- a run older (by date) than a block of its stem it would replace, or from another GPU model than the
  other blocks of a page it appears on, is skipped with one line (``skipped <summary>: ...``) and its
  blocks keep their content, unless asked for (``make reports ACCEPT_MIXED=1``, env ACCEPT_MIXED) or
  read from another folder (``<stem>@<folder>``, ``versus/<folder>``: the other GPU's runs);
- a page whose blocks come from runs on different machines (GPU or stack) says so in its runs
  header, and `make reports` prints one line for it; committed blocks without a run line count with
  the machine their stem's provenance block names (pages without a runs header get the line only);
- a block whose results are missing keeps its committed content byte for byte, so a fresh clone
  (no results/) leaves every report as committed, its runs header included;
- a page whose markers do not pair up (an opening marker without its closing one, a stray closing
  marker) is refused whole: one line naming the file and the line, no file written (a block would
  otherwise swallow the hand-written text after it).

Tables are read with the stdlib csv module (no pandas needed to run this).

    python -m common report                   # all systems
    python -m common report --system flashinfer
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from common import REPO_ROOT, SYSTEMS
from common.base.story import fmt, fold, section
from common.capture.gpu import provenance_line
from common.capture.store import failed_dir, recover, SCHEMA, SUMMARY
from common.render import crossview, glossary
from common.render.markdown import _md_row, _num, md_table, read_table, run_line, Skip, STACK

BLOCK = re.compile(r"(<!-- auto:(?P<key>[^\s>]+) -->\n)(?P<body>.*?)(<!-- /auto -->)", re.S)
MARKER = re.compile(r"<!-- (?:auto:(?P<key>[^\s>]+)|/auto) -->")
RUN_LINE = re.compile(r"^<!-- run: (?P<run>.*?) -->$", re.M)
GLOSSARY = "GLOSSARY.md"           # the one glossary page (repository root), its blocks from common.render.glossary
CROSS = "CROSS-SYSTEM.md"          # the same shapes in the three systems (repository root), common.render.crossview
ACCEPT_MIXED = "ACCEPT_MIXED"      # =1: use runs that are older than their blocks or from another GPU model


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


def summary_problem(s) -> str | None:
    """What makes a summary.json unusable for reports, or None when it is a finished, successful run
    of this schema with provenance."""
    if not isinstance(s, dict):
        return f"not a JSON object (a {type(s).__name__})"
    schema = s.get("schema")
    if schema is None:
        return f"no \"schema\" key (an older summary; reports read schema {SCHEMA}): re-run the script"
    if not isinstance(schema, int) or schema < SCHEMA:
        return f"schema {schema!r} is older than {SCHEMA}: re-run the script"
    if schema > SCHEMA:
        return f"schema {schema} is newer than this workbook reads ({SCHEMA}): update the workbook"
    if s.get("status") != "ok":
        return f"status {s.get('status')!r}: only finished, successful runs refresh reports"
    prov = s.get("provenance")
    if not isinstance(prov, dict) or not prov.get("date_utc"):
        return "no provenance (GPU, stack, commit, date)"
    for k, t in (("packages", dict), ("git", dict), ("reanalysed", dict)):
        if prov.get(k) is not None and not isinstance(prov[k], t):
            return f"provenance \"{k}\" is a {type(prov[k]).__name__}, not an object"
    for k, t in (("headline", dict), ("observations", list), ("point_errors", list), ("story", str)):
        if s.get(k) is not None and not isinstance(s[k], t):
            return f"\"{k}\" is a {type(s[k]).__name__}, not a {t.__name__}"
    for i, o in enumerate(s.get("observations") or [], 1):
        if not isinstance(o, dict) or not {"expected", "observed", "verdict"} <= set(o):
            return f"observation {i} lacks expected/observed/verdict"
    if any(not isinstance(e, dict) for e in s.get("point_errors") or []):
        return "a point error is not an object"
    return None


# ---------------------------------------------------------------- rendering

# the ceilings a run divided by: recorded in its provenance (results.Run.finish), or for runs before
# that, the figures 00_check_env of each system put in its headline
_CEILING_KEYS = {"dram_tb_s": ("dram_ceiling_tb_s", "dram_tb_s", "measured_copy_tb_s"),
                 "bf16_tflops": ("bf16_ceiling_tflops", "bf16_tflops", "measured_bf16_tflops")}


def _ceiling(prov: dict, summary: dict, key: str):
    v = (prov.get("ceilings") or {}).get(key)
    if v is None:
        head = summary.get("headline") or {}
        v = next((head[k] for k in _CEILING_KEYS[key] if isinstance(head.get(k), (int, float))), None)
    return v


def _gpu0(prov: dict) -> dict:
    return (prov.get("gpus") or [{}])[0] or {}


_MACHINE = (
    ("GPU", lambda p, s: p.get("gpu")),
    ("GPUs visible", lambda p, s: p.get("gpu_count")),
    ("memory (GB)", lambda p, s: _gpu0(p).get("memory_gb")),
    ("SMs", lambda p, s: p.get("sm_count")),
    ("L2 (MB)", lambda p, s: p.get("l2_mb")),
    ("max SM clock (MHz)", lambda p, s: _gpu0(p).get("max_sm_clock_mhz")),
    ("max memory clock (MHz)", lambda p, s: _gpu0(p).get("max_mem_clock_mhz")),
    ("host CPU", lambda p, s: (p.get("host") or {}).get("cpu_model")),     # CPU-side times follow the host
    ("host CPUs", lambda p, s: (p.get("host") or {}).get("cpus")),
    ("measured DRAM ceiling (TB/s)", lambda p, s: _ceiling(p, s, "dram_tb_s")),
    ("measured bf16 ceiling (TFLOP/s)", lambda p, s: _ceiling(p, s, "bf16_tflops")),
)


def _verdict_cell(o: dict | None) -> str:
    """'**confirmed** 56.5 [56.5, 56.9]' from an observation record; '—' when not judged there."""
    if not o:
        return "—"
    iv = o.get("interval") or {}
    fig = ""
    if isinstance(iv.get("point"), (int, float)):
        fig = f" {fmt(iv['point'])}"
        if isinstance(iv.get("lo"), (int, float)) and isinstance(iv.get("hi"), (int, float)):
            fig += f" [{fmt(iv['lo'])}, {fmt(iv['hi'])}]"
    return f"**{o['verdict']}**{fig}"


class Renderer:
    """Renders the block keys of one system from its results folder (nothing is written here:
    figure copies wait in ``self.copies`` until every page has rendered)."""

    def __init__(self, system_dir: Path, root: Path = REPO_ROOT):
        self.root = root
        self.sys_dir = system_dir
        self.results = system_dir / "results"
        self.reports = system_dir / "reports"
        self.skipped: dict[str, str] = {}          # path -> what is wrong (one line each)
        self.copies: dict[Path, Path] = {}         # reports/figures/<stem>-<name>.png -> source
        self.pages: dict[str, str] = {}            # label -> committed text: what a run may replace (mixed_problem)
        self.accept_mixed = os.environ.get(ACCEPT_MIXED, "") not in ("", "0")
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
        """results/<stem>, or results/<folder>/<name> for a stem written ``<name>@<folder>``."""
        name, _, folder = stem.partition("@")
        return self.results / folder / name if folder else self.results / name

    def summary(self, stem: str) -> dict | None:
        """The summary of a finished, successful schema-2 run, or None (a bad one is noted in skipped)."""
        if stem not in self._cache:
            self._cache[stem] = self._load(stem)
        return self._cache[stem]

    def _load(self, stem: str) -> dict | None:
        recover(self._dir(stem))
        p = self._dir(stem) / SUMMARY
        if not p.is_file():
            return None
        try:
            s = json.loads(p.read_bytes().decode("utf-8"))
        except UnicodeDecodeError:
            self._skip(p, "not text (undecodable bytes)")
            return None
        except ValueError as e:
            self._skip(p, f"not valid JSON ({e})")
            return None
        except OSError as e:
            self._skip(p, f"unreadable ({e.strerror or e})")
            return None
        why = summary_problem(s) or self.mixed_problem(stem, s)
        if why:
            self._skip(p, why)
            return None
        return s

    def mixed_problem(self, stem: str, s: dict) -> str | None:
        """Why run ``s`` of ``stem`` may not replace its blocks on the committed pages: it is older (by date)
        than a block of its stem it would replace, or its GPU model differs from that of the other blocks
        of a page it appears on. None when neither, when asked for (ACCEPT_MIXED=1), and for a run of
        another folder (``<stem>@<folder>``, e.g. the other GPU's runs)."""
        if self.accept_mixed or "@" in stem:
            return None
        gpu, _, _, date = _fields(run_line(s["provenance"]).removeprefix("<!-- run: ").removesuffix(" -->"))
        for label, text in self.pages.items():
            blocks = [(m.group("key"), m.group("body")) for m in BLOCK.finditer(text)]
            if not any(_stem_of(k) == stem for k, _ in blocks):
                continue
            newer = max((_fields(r)[3] for k, b in blocks if _stem_of(k) == stem for r in _run_lines(b)), default="")
            if newer > date:
                return (f"its run ({date}) is older than the blocks it would replace in {label} ({newer}); "
                        f"`make reports {ACCEPT_MIXED}=1` uses it")
            others = _gpu_models([(k, b) for k, b in blocks if _stem_of(k) not in (None, stem)])
            if others and _model(gpu) not in others:
                return (f"its run on {_model(gpu)} would sit beside runs on {', '.join(sorted(others))} in {label}; "
                        f"copy it to results/other-gpu/{stem}/ to compare, or `make reports {ACCEPT_MIXED}=1` uses it")
        return None

    def render(self, key: str, old: str = "") -> tuple[str | None, str]:
        """(new body or None, reason when None). ``old``: the block's current body."""
        if key == "index":
            return self.index(old)
        if key.startswith("versus/"):
            folder, _, every = key.split("/", 1)[1].partition(":")
            return self.versus(folder, every=every == "all")
        if "/" not in key:
            return None, f"unknown block key {key!r}"
        stem, what = key.split("/", 1)
        s = self.summary(stem)
        if s is None:
            why = self.skipped.get(self._rel(self._dir(stem) / SUMMARY))
            return None, (f"skipped: {why}" if why else
                          f"no finished run in {self._rel(self._dir(stem))}")
        body, why = self._body(stem, what, s)
        return (None, why) if body is None else (run_line(s["provenance"]) + "\n" + body, "")

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
            flat = stem.replace("@", "-")
            self.copies[self.reports / "figures" / f"{flat}-{name}.png"] = p
            return f"![{stem} {name}](figures/{flat}-{name}.png)\n", ""
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

    def versus(self, folder: str, every: bool = False) -> tuple[str | None, str]:
        """The experiments run on two GPUs, side by side: the machines (name, memory, SMs, L2, clocks and
        the measured ceilings each run divided by, with their ratio) and the hypotheses whose verdict
        changed, with verdict and interval on each (``every``, key ``versus/<folder>:all``: every judged
        hypothesis, the changed ones marked), and per experiment how many kept their verdict.
        ``folder``: results/<folder>/<stem>/ holds the second GPU's runs. Each side's run lines start the
        block (the page then says it mixes machines)."""
        base = self.results / folder
        stems = sorted(p.name for p in base.iterdir() if (p / SUMMARY).is_file()) if base.is_dir() else []
        pairs = [(st, self.summary(st), self.summary(f"{st}@{folder}")) for st in stems]
        pairs = [(st, a, b) for st, a, b in pairs if a and b]
        if not pairs:
            return None, f"no experiment has a finished run in both results/ and {self._rel(base)}"
        lines = list(dict.fromkeys(run_line(x["provenance"]) for _, a, b in pairs for x in (a, b)))
        env = next(((a, b) for st, a, b in pairs if st.startswith("00_")), pairs[0][1:])
        pa, pb = env[0]["provenance"], env[1]["provenance"]
        ga, gb = pa.get("gpu") or "GPU A", pb.get("gpu") or "GPU B"
        if ga == gb:
            ga, gb = f"{ga} (results/)", f"{gb} ({folder})"
        machine = []
        for label, get in _MACHINE:
            va, vb = get(pa, env[0]), get(pb, env[1])
            if va is None and vb is None:       # runs that predate the field
                continue
            ratio = vb / va if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va else None
            machine.append({"": label, ga: va, gb: vb, f"{gb.split(' (')[0]} / {ga.split(' (')[0]}": ratio})
        rows, changed, judged, kept, one_only = [], 0, 0, [], []
        for st, a, b in pairs:
            oa = {o["hypothesis"]: o for o in a.get("observations") or [] if o.get("hypothesis")}
            ob = {o["hypothesis"]: o for o in b.get("observations") or [] if o.get("hypothesis")}
            n_same = n_both = 0
            for hid in list(oa) + [h for h in ob if h not in oa]:
                va, vb = oa.get(hid), ob.get(hid)
                diff = bool(va and vb and va["verdict"] != vb["verdict"])
                n_both += bool(va and vb)
                n_same += bool(va and vb) and not diff
                if diff or every:
                    rows.append({"experiment": st, "hypothesis": hid, ga: _verdict_cell(va), gb: _verdict_cell(vb),
                                 "changed": "**changed**" if diff else ("" if va and vb else "judged on one only")})
                elif not (va and vb):
                    one_only.append(hid)
            judged += n_both
            changed += n_both - n_same
            kept.append(f"{st} {n_same}/{n_both}")
        out = lines + [md_table(machine, max_rows=100), "",
                       f"{changed} of {judged} hypotheses judged on both GPUs changed verdict "
                       f"(same verdict: {', '.join(kept)}).", ""]
        out.append(md_table(rows, max_rows=200) if rows else "_No verdict changed._")
        if one_only:     # a hypothesis one side's code did not judge: counted, listed in versus/<folder>:all
            out += ["", f"{len(one_only)} hypotheses were judged on one GPU only (the two runs' code differs there; "
                        f"`versus/{folder}:all` lists them)."]
        return "\n".join(out) + "\n", ""

    def index(self, old: str = "") -> tuple[str | None, str]:
        """Every numbered script with its last successful run; a script without a usable run here
        keeps its committed row."""
        cols = ["script", "last run", "status", "GPU", "headline"]
        kept = {line.split(" | ", 1)[0]: line for line in old.splitlines() if line.startswith("| [`")}
        scripts = sorted(p for p in (self.sys_dir / "scripts").glob("[0-9][0-9]_*") if p.suffix in (".py", ".sh"))
        lines, any_run = [], False
        for sc in scripts:
            cell = f"[`{sc.name}`](../scripts/{sc.name})"
            s = self.summary(sc.stem)
            if s is None and f"| {cell}" in kept:
                lines.append(kept[f"| {cell}"])
                continue
            n_failed = self._n_failed(sc.stem)
            any_run |= s is not None
            s = s or {}
            head = s.get("headline") or {}
            lines.append(_md_row({
                "script": cell,
                "last run": s.get("provenance", {}).get("date_utc", "-"),
                "status": s.get("status", "not run") + (f" ({n_failed} failed kept)" if n_failed else ""),
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


# the visible line of a provenance block (common.capture.gpu.provenance_line): "_Run: 1x NVIDIA H200 · driver ... ·
# CUDA ... · torch 2.11.0, flashinfer-python ... · 2026-11-21T16:08:59Z · commit ..."
PROV_RUN = re.compile(r"^_Run: (?P<gpu>.+?) · driver .*? · CUDA .*? · (?P<pkgs>.*?) · \d{4}-", re.M)


def prov_machine(body: str) -> str | None:
    """'1x NVIDIA H200 (torch 2.11.0, ...)' from a provenance block's visible line, or None. Committed
    blocks written before run lines were recorded say their machine only there."""
    m = PROV_RUN.search(body)
    if not m:
        return None
    pk = dict(x.rsplit(" ", 1) for x in m.group("pkgs").split(", ") if " " in x)
    return f"{m.group('gpu')} ({', '.join(f'{k} {pk[k]}' for k in STACK if k in pk) or 'no stack recorded'})"


def _run_lines(body: str) -> list[str]:
    """The runs a block was rendered from: the hidden run lines it begins with (one, or one per side of
    a ``versus`` block)."""
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


def _model(gpu: str) -> str:
    """'4x NVIDIA H200' -> 'NVIDIA H200' (the GPU model, whatever the count)."""
    return re.sub(r"^\d+x ", "", gpu)


def _stem_of(key: str) -> str | None:
    """The stem whose run a block key renders from this system's own results/, or None (runs, index,
    versus/<folder>, a ``<stem>@<folder>`` block of another folder)."""
    stem = key.split("/", 1)[0] if "/" in key else None
    return None if stem is None or stem == "versus" or "@" in stem else stem


def _gpu_models(blocks: list[tuple[str, str]]) -> set[str]:
    """The GPU models the blocks ``[(key, body)]`` were rendered from: their run lines, or for a block
    without one, its stem's committed provenance line."""
    out = {_model(_fields(r)[0]) for _, b in blocks for r in _run_lines(b)}
    out |= {_model(m.split(" (", 1)[0]) for k, b in blocks if k.endswith("/provenance") and not _run_lines(b)
            for m in [prov_machine(b)] if m}
    return out


def _comparison(key: str) -> bool:
    """A block that shows another GPU's runs on purpose: ``versus/<folder>`` or ``<stem>@<folder>/...``."""
    return key.startswith("versus/") or "@" in key.split("/", 1)[0]


def runs_header(blocks: list[tuple[str, str]]) -> tuple[str | None, str | None]:
    """(body of the page's ``runs`` block, the one-line warning when the page mixes machines), from
    the hidden run lines of the page's blocks ``[(key, body), ...]``. (None, None): no run lines.
    A block without a run line counts with the machine its stem's provenance block (also without a
    run line) names, so a new run's blocks beside committed ones from another machine are a mix."""
    runs: dict[str, list[str]] = {}
    own: set[str] = set()          # runs of the page's own blocks (not of a comparison with another GPU)
    earlier = {k.split("/", 1)[0]: prov_machine(b) for k, b in blocks
               if k.endswith("/provenance") and not RUN_LINE.match(b)}
    older: list[str] = []
    unknown = 0
    for key, body in blocks:
        if key in ("runs", "index"):
            continue
        found = _run_lines(body)
        if not found:
            unknown += 1
            if earlier.get(key.split("/", 1)[0]):
                older.append(earlier[key.split("/", 1)[0]])
            continue
        for run in found:
            stems = runs.setdefault(run, [])
            if key.split("/", 1)[0] not in stems:
                stems.append(key.split("/", 1)[0])
            if not _comparison(key):
                own.add(run)
    if not runs:
        return None, None
    rows, compared = [], []
    for run, stems in runs.items():
        gpu, stack, commit, date = (run.split(" · ") + ["?"] * 4)[:4]
        rows.append({"GPU": gpu, "stack": stack, "commit": commit.removeprefix("commit "), "date": date,
                     "results of": ", ".join(stems)})
        if run not in own:
            compared.append(f"{gpu} ({stack})")
    machines = list(dict.fromkeys([f"{r['GPU']} ({r['stack']})" for r, run in zip(rows, runs) if run in own]
                                  + older))
    mixed = (f"This page mixes runs from {len(machines)} machines: {'; '.join(machines)}"
             if len(machines) > 1 else None)
    others = [m for m in dict.fromkeys(compared) if m not in machines]
    out = [f"**{mixed}; compare their figures with care.**\n"] if mixed else []
    out.append("Runs behind this page (from the run line each block below carries):\n")
    out.append(md_table(rows, max_rows=100))
    if others and not machines:
        out.append(f"\n_Every block here compares GPUs on purpose: runs on {'; '.join(others)}._")
    elif others:
        out.append(f"\n_The blocks that compare with another GPU (\"versus\", \"@\" in \"results of\") also show runs on "
                   f"{'; '.join(others)}, on purpose; " + ("the rest of the page is one machine's._" if not mixed else
                                                          "the page's own blocks are the mix above._"))
    if unknown:
        out.append(f"\n_{unknown} block(s) carry no run line (written before runs were recorded)._")
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


def render_page(text: str, r: Renderer, label: str, out: Outcome, root: Path = REPO_ROOT) -> str:
    """The page ``text`` with every block rendered (kept blocks unchanged); raises RenderError."""
    check_markers(text, label)
    matches = list(BLOCK.finditer(text))
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
                body, why = crossview.render(key.split("/", 1)[1], root)
            elif r is None:
                body, why = None, "a page outside the systems holds glossary and cross/ blocks only"
            else:
                body, why = r.render(key, old)
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
            if header is None:
                out.kept.append(f"{label}: runs (no block on this page carries a run line)")
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


def refresh(systems=SYSTEMS, root: Path = REPO_ROOT, echo=print) -> Outcome:
    """Render every page of ``systems``, then write the changed ones (all or nothing; RenderError)."""
    out = Outcome()
    pages: list[tuple[Path, str]] = []
    renderers = []
    for system in systems:
        rdir = root / system / "reports"
        if not rdir.is_dir():
            continue
        r = Renderer(root / system, root)
        renderers.append(r)
        mds = sorted(rdir.glob("*.md"))
        r.pages = {f"{system}/reports/{md.name}": md.read_text() for md in mds}
        for md, (label, text) in zip(mds, r.pages.items()):
            new = render_page(text, r, label, out)
            if new != text:
                pages.append((md, new))
        out.skipped += [f"skipped {p}: {why}" for p, why in r.skipped.items()]
    for name in (GLOSSARY, CROSS):                   # the pages at the top: the glossary (from the code) and
        gl = root / name                             # the three systems side by side (from their results)
        if gl.is_file():
            text = gl.read_text()
            new = render_page(text, None, name, out, root)
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


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m common report",
                                description="Refresh the auto blocks of <system>/reports/*.md from results/.")
    p.add_argument("--system", choices=SYSTEMS, action="append", help="only this system (repeatable)")
    p.add_argument("--quiet", action="store_true", help="print only problems and the totals")
    a = p.parse_args(argv)
    try:
        o = refresh(a.system or SYSTEMS)
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
