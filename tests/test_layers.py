"""The house's rules, checked on its code: common/ in floors that import only downward (.importlinter, checked by
import-linter), no import cycle inside a floor, none among a system's script modules, and each SGLang helper module
importable on its own. Every rule is also shown to fail: on a copy of common/ with one upward import or one cycle
seeded, and on a made-up scripts folder whose modules import each other."""
import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from common import SYSTEMS

ROOT = Path(__file__).resolve().parents[1]


def lint(root: Path) -> subprocess.CompletedProcess:
    """import-linter over ``root``/common with ``root``/.importlinter (no cache: the copy changes between calls)."""
    code = "import sys; from importlinter.cli import lint_imports_command as c; sys.argv = ['lint-imports', '--no-cache']; c()"
    return subprocess.run([sys.executable, "-c", code], cwd=root, env={"PYTHONPATH": str(root), "PATH": ""},
                          capture_output=True, text=True, timeout=120)


def test_common_keeps_its_floors_and_has_no_cycle():
    r = lint(ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "2 kept, 0 broken" in r.stdout


@pytest.fixture
def copy(tmp_path):
    shutil.copytree(ROOT / "common", tmp_path / "common", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    return tmp_path


def test_an_upward_import_breaks_the_floors(copy):
    story = copy / "common" / "base" / "story.py"
    story.write_text(story.read_text() + "\n\ndef _seeded():\n    from common.run.results import Run  # upward\n")
    r = lint(copy)
    assert r.returncode == 1, r.stdout[-2000:]
    assert "common/ is built in floors: run > render > judge > tables > capture > base BROKEN" in r.stdout
    assert "common.base.story -> common.run.results" in r.stdout          # the line at fault, named


def test_a_cycle_inside_a_floor_breaks_the_contract(copy):
    gpu = copy / "common" / "capture" / "gpu.py"                  # procs -> ... ; gpu -> procs -> gpu
    gpu.write_text(gpu.read_text() + "\n\ndef _seeded():\n    from common.capture import procs\n")
    procs = copy / "common" / "capture" / "procs.py"
    procs.write_text(procs.read_text() + "\n\ndef _seeded():\n    from common.capture import gpu\n")
    r = lint(copy)
    assert r.returncode == 1 and "no import cycle between the modules of a package BROKEN" in r.stdout


# ------------------------------------------------------------------ a system's script modules

def local_imports(folder: Path) -> dict[str, set[str]]:
    """{module: the modules of ``folder`` it imports} over every .py file there, imports inside functions included."""
    mods = {p.stem for p in folder.glob("*.py")}
    out: dict[str, set[str]] = {}
    for p in folder.glob("*.py"):
        uses = set()
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.Import):
                uses |= {a.name.split(".")[0] for a in n.names}
            elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                uses.add(n.module.split(".")[0])
        out[p.stem] = (uses & mods) - {p.stem}
    return out


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules in order), or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m):
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        state[m] = 2
        path.pop()
        return None
    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


@pytest.mark.parametrize("system", SYSTEMS)
def test_no_import_cycle_among_a_systems_scripts(system):
    assert cycle(local_imports(ROOT / system / "scripts")) is None


def test_the_cycle_finder_finds_one(tmp_path):
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from c import x\n")
    (tmp_path / "c.py").write_text("from a import *\n")
    assert cycle(local_imports(tmp_path)) == ["a", "b", "c", "a"]


@pytest.mark.parametrize("module", sorted(p.stem for p in (ROOT / "sglang" / "scripts").glob("_sgl*.py")))
def test_each_sglang_helper_imports_on_its_own(module):
    """A fresh interpreter imports one helper module first (before Python had any of the others)."""
    code = f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'sglang' / 'scripts')!r}]; import {module}"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
