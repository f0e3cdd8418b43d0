"""What several test files share (imported as ``kit``: pytest puts tests/ on sys.path).

  load_script(path, name)               a script imported as a module, its main() not run
  STEP_SCRIPTS, FAKE_PAGE               stand-in pipeline steps and a report page with one auto block
  write_fake_system(root, name, steps)  <root>/<name>/{scripts,reports} for common.run.pipeline runs
  check_perfetto(events)                a Perfetto JSON trace's events are well formed (SGLang 01's and 08's traces)
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def load_script(path: Path, name: str | None = None):
    """The file at ``path`` imported as a module named ``name`` (default: its stem); ``__main__`` code
    does not run, so a numbered script's main() is only defined."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # a dataclass of the script looks its module up there
    spec.loader.exec_module(mod)
    return mod


STEP_SCRIPTS = {
    # a real results.Run, so that a report block would change if the reports were refreshed
    "ok.py": ("import sys\nfrom common.run.results import Run\nprint('ran', ' '.join(sys.argv[1:]), flush=True)\n"
              "with Run(__file__, {}, quiet=True) as run:\n    run.headline(answer=42)\n"),
    "skip.py": "print('[skip] this needs 2 GPUs; 1 visible')\n",
    "setup.py": "import sys\nprint('[setup] no NVIDIA GPU here', file=sys.stderr)\nsys.exit(2)\n",
    # an experiment that fails: run_main's one line, the traceback in a file, exit 1
    "fail.py": ("from common.base.checks import run_main\n"
                "def main(argv=None):\n    raise RuntimeError('the kernel check failed')\nrun_main(main)\n"),
    "flaky.py": ("import pathlib, sys\n"
                 "sys.exit(0 if pathlib.Path(__file__).with_name('flaky.ok').exists() else 1)\n"),
    # a package a step imports deep inside (argv[1] names it)
    "needs.py": ("import sys\nfrom common.base.checks import run_main\n"
                 "def main(argv=None):\n    __import__(sys.argv[1])\n    return 0\nrun_main(main)\n"),
    # a child in the step's group and a grandchild in its own session: both must go
    "sleep.py": ("import os, pathlib, subprocess, sys, time\n"
                 "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
                 "far = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
                 "p = pathlib.Path(__file__).with_name('pids.txt')\n"
                 "p.with_suffix('.tmp').write_text(f'{os.getpid()} {kid.pid} {far.pid}')\n"
                 "p.with_suffix('.tmp').replace(p)\n"
                 "print('sleeping', flush=True)\ntime.sleep(120)\n"),
    "marker.py": "import pathlib\npathlib.Path(__file__).with_name('marker.txt').write_text('ran')\n",
}
FAKE_PAGE = "# fake report\n\n<!-- auto:ok/headline -->\ncommitted text\n<!-- /auto -->\n\nhand-written prose\n"


def write_fake_system(root: Path, name: str, steps: list[str]) -> Path:
    """<root>/<name>/{scripts,reports}: the stand-in steps, reports/r.md (FAKE_PAGE) and a _steps.py
    listing ``steps`` (Step(...) sources). Returns <root>/<name>."""
    sd = Path(root) / name
    (sd / "scripts").mkdir(parents=True)
    (sd / "reports").mkdir()
    (sd / "reports" / "r.md").write_text(FAKE_PAGE)
    for script, src in STEP_SCRIPTS.items():
        (sd / "scripts" / script).write_text(src)
    (sd / "scripts" / "_steps.py").write_text("from common.run.steps import ONLY, Step\n\nSTEPS = [\n"
                                              + "".join(f"    {s},\n" for s in steps) + "]\n")
    return sd


def _nesting_errors(events) -> list:
    """X events of one (pid, tid) that overlap without nesting: Perfetto's JSON importer cannot place them."""
    bad, by = [], {}
    for e in events:
        if e.get("ph") == "X":
            by.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
    for key, xs in by.items():
        stack = []
        for a, b, n in sorted(xs, key=lambda x: (x[0], -x[1])):
            while stack and a >= stack[-1][1]:
                stack.pop()
            if stack and b > stack[-1][1]:
                bad.append((key, stack[-1][2], n))
            stack.append((a, b, n))
    return bad


def check_perfetto(ev) -> None:
    """A Perfetto JSON trace's events (its traceEvents) as Perfetto's JSON importer needs them: known phases,
    times >= 0, whole-number pids, counters of numbers, instants with a scope, X events that nest."""
    assert ev and all(e["ph"] in ("X", "M", "C", "i") for e in ev)
    for e in ev:
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0 and isinstance(e["pid"], int)
        if e["ph"] == "X":
            assert e["dur"] >= 0
        if e["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values())
        if e["ph"] == "i":
            assert e["s"] in ("g", "p", "t")
    assert _nesting_errors(ev) == []
