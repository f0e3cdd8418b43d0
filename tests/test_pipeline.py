"""The one pipeline runner (common/run/pipeline.py) and the JIT warm-up (common/capture/jit.py), on a CPU machine.

The runner is exercised on a fake system written into tmp_path (``--root``): a scripts/_steps.py and tiny
step scripts that exit 0, print [skip], exit 2, exit 1 or sleep; a report stand-in whose bytes must not
change unless every step ended ok. The real systems are checked through their 06_full_pipeline.sh
(--help, --dry-run) and their step declarations. Every subprocess has a timeout; the interrupt tests
check by pid that the step's whole process tree is gone.
"""
from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.base.checks import SetupError
from common.capture import jit, procs
from common.run import pipeline, steps, warmup
from kit import write_fake_system

REPO = Path(__file__).resolve().parents[1]
SYS = "fakesys"

def make_system(tmp_path: Path, steps: list[str]) -> Path:
    """A fake repository root with <root>/fakesys/{scripts,reports}; ``steps`` are Step(...) sources."""
    write_fake_system(tmp_path, SYS, steps)
    return tmp_path


def run_pipeline(root: Path, *args, timeout: float = 120, env: dict | None = None):
    return subprocess.run([sys.executable, "-m", "common", "pipeline", "--root", str(root), "--system", SYS, *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def last_table(root: Path) -> list[dict]:
    rows, _ = steps.previous_table(root, SYS)
    return rows


def report_bytes(root: Path) -> bytes:
    return (root / SYS / "reports" / "r.md").read_bytes()


# ------------------------------------------------------------------ progress, statuses, exit codes, reports

def test_progress_lines_with_an_eta_from_the_previous_steps_csv(tmp_path):
    root = make_system(tmp_path, ['Step("a", "ok.py")', 'Step("b", "ok.py")', 'Step("c", "ok.py")'])
    prev = root / SYS / "results" / "06_full_pipeline"
    prev.mkdir(parents=True)
    (prev / "summary.json").write_text(json.dumps({"script": f"{SYS}/scripts/06_full_pipeline.sh"}))  # a run's folder
    with open(prev / "steps.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "status", "seconds", "kind", "command", "started_utc"])
        w.writerow(["a", "ok", "30", "measure", f"python {SYS}/scripts/ok.py --quick", "2026-01-01T00:00:00Z"])
        w.writerow(["b", "ok (skipped)", "90", "measure", "", "2026-01-01T00:00:30Z"])      # no command: used
        w.writerow(["c", "ok", "50", "measure", f"python {SYS}/scripts/ok.py", "2026-01-01T00:02:00Z"])  # other mode
    out = run_pipeline(root, "--quick")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert "fakesys pipeline --quick: 3 steps, ETA 2m00s + 1 step never timed" in lines
    assert re.search(r"^\[1/3\] a  started  \(elapsed \d+s, ETA 2m00s \+ 1 step never timed\)$", out.stdout, re.M)
    assert re.search(r"^\[2/3\] b  started  \(elapsed \d+s, ETA 1m30s \+ 1 step never timed\)$", out.stdout, re.M)
    assert re.search(r"^\[3/3\] c  started  \(elapsed \d+s, ETA unknown: no earlier timing of these steps\)$",
                     out.stdout, re.M)
    for i, n in enumerate("abc", 1):
        assert re.search(rf"^\[{i}/3\] {n}  ok  in \d+s$", out.stdout, re.M)
    assert "ran --quick" in out.stdout                        # the step's own output is on the console too


def test_statuses_partial_run_exit_1_and_reports_untouched(tmp_path):
    root = make_system(tmp_path, ['Step("ok", "ok.py")', 'Step("skipped", "skip.py")',
                                  'Step("no_gpu", "setup.py")', 'Step("broken", "fail.py")',
                                  'Step("renamed", "not_there.py")', 'Step("after", "ok.py")'])
    before = report_bytes(root)
    out = run_pipeline(root)
    assert out.returncode == 1, out.stdout + out.stderr
    status = {r["step"]: r["status"] for r in last_table(root)}
    assert status == {"ok": "ok", "skipped": "ok (skipped)", "no_gpu": "setup-error", "broken": "failed",
                      "renamed": "missing", "after": "ok"}
    assert re.search(r"^\[3/6\] no_gpu\s+setup-error \(exit 2\)  in \d+s$", out.stdout, re.M)
    assert re.search(r"^\[4/6\] broken\s+failed \(exit 1\)  in \d+s$", out.stdout, re.M)
    assert re.search(rf"^\[5/6\] renamed\s+missing: {SYS}/scripts/not_there.py does not exist$", out.stdout, re.M)
    assert "partial — 3/6 steps ok" in out.stdout
    assert "reports not refreshed: the pipeline ended partial" in out.stdout
    assert report_bytes(root) == before                        # ok.py's results exist, yet nothing was refreshed
    assert (root / SYS / "results" / "ok" / "summary.json").exists()
    summaries = list((root / SYS / "results").rglob("06_full_pipeline/*/summary.json"))
    s = json.loads(summaries[0].read_text())
    assert s["status"] == "partial" and s["headline"]["steps_ok"] == 3 and s["headline"]["steps"] == 6
    assert not (root / SYS / "results" / "06_full_pipeline" / "summary.json").exists()   # never over a good run
    assert "Traceback" not in out.stdout + out.stderr


def test_no_step_ok_is_failed(tmp_path):
    root = make_system(tmp_path, ['Step("a", "setup.py")', 'Step("b", "fail.py")'])
    before = report_bytes(root)
    out = run_pipeline(root)
    assert out.returncode == 1 and "failed — 0/2 steps ok" in out.stdout, out.stdout
    assert report_bytes(root) == before


def test_ok_run_writes_the_record_and_refreshes_the_reports(tmp_path):
    root = make_system(tmp_path, ['Step("a", "ok.py")', 'Step("b", "skip.py")'])
    before = report_bytes(root)
    out = run_pipeline(root, env={"PIPELINE_COMMAND": "./fakesys/scripts/06_full_pipeline.sh --quick"})
    assert out.returncode == 0, out.stdout + out.stderr
    d = root / SYS / "results" / "06_full_pipeline"
    s = json.loads((d / "summary.json").read_text())
    assert s["status"] == "ok"
    assert s["provenance"]["command"] == "./fakesys/scripts/06_full_pipeline.sh --quick"
    assert s["args"] == {"mode": "quick", "ncu": False, "nsys": False, "only": None, "warmup": True}
    assert {"steps_ok", "steps", "total_s", "warmup_s", "measure_s"} <= set(s["headline"])
    assert s["headline"]["steps_ok"] == 2 and "a" in s["story"]
    with open(d / "steps.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:6] == ["step", "status", "seconds", "kind", "command", "started_utc"]
    assert [(r["step"], r["status"], r["kind"]) for r in rows] == [("a", "ok", "measure"), ("b", "ok (skipped)", "measure")]
    assert (d / "logs" / "a.log").read_text().count("ran --quick") == 1
    assert report_bytes(root) != before and "answer" in report_bytes(root).decode()
    assert "hand-written prose" in report_bytes(root).decode()
    assert re.search(r"^reports: \d+ block\(s\) refreshed, 1 file\(s\) changed", out.stdout, re.M)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupt_stops_the_step_group_and_runs_nothing_after(tmp_path, sig):
    root = make_system(tmp_path, ['Step("first", "ok.py")', 'Step("long", "sleep.py")', 'Step("never", "marker.py")'])
    before = report_bytes(root)
    pids_file = root / SYS / "scripts" / "pids.txt"
    p = subprocess.Popen([sys.executable, "-m", "common", "pipeline", "--root", str(root), "--system", SYS],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids: list[int] = []
    try:
        t0 = time.time()
        while not pids_file.exists() and time.time() - t0 < 60 and p.poll() is None:
            time.sleep(0.1)
        assert pids_file.exists(), "the sleeping step never started"
        pids = [int(x) for x in pids_file.read_text().split()]
        p.send_signal(sig)
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 130, out
        assert re.search(r"^\[2/3\] long\s+interrupted  in \d+s$", out, re.M), out
        assert "[3/3]" not in out and not (root / SYS / "scripts" / "marker.txt").exists()
        assert "reports not refreshed" in out and report_bytes(root) == before
        assert procs.wait_gone(pids, 15), f"left behind: {[q for q in pids if procs.alive(q)]}"
        assert {r["step"]: r["status"] for r in last_table(root)} == {"first": "ok", "long": "interrupted"}
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        for q in pids:
            if procs.alive(q):
                os.kill(q, signal.SIGKILL)


# ------------------------------------------------------------------ --only, --dry-run, flags

def test_only_rejects_an_unknown_step_in_one_line(tmp_path):
    root = make_system(tmp_path, ['Step("a", "ok.py")', 'Step("b", "ok.py")'])
    out = run_pipeline(root, "--only", "a,zz")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "python -m common pipeline: --only: unknown step 'zz'; the steps of fakesys: a, b"]
    assert not (root / SYS / "results").exists()


def test_only_carries_the_other_rows_over_from_the_last_run(tmp_path):
    root = make_system(tmp_path, ['Step("a", "ok.py")', 'Step("b", "flaky.py")', 'Step("c", "ok.py")'])
    first = run_pipeline(root)
    assert first.returncode == 1                                      # b failed: partial
    old = {r["step"]: r for r in last_table(root)}
    (root / SYS / "scripts" / "flaky.ok").write_text("")
    time.sleep(1.1)                                                   # a new started_utc for b
    second = run_pipeline(root, "--only", "b")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "1/1 steps ok" in second.stdout and "[2/" not in second.stdout
    d = root / SYS / "results" / "06_full_pipeline"
    with open(d / "steps.csv", newline="") as f:
        rows = {r["step"]: r for r in csv.DictReader(f)}
    assert list(rows) == ["a", "b", "c"]                              # declaration order
    assert rows["a"]["started_utc"] == old["a"]["started_utc"] and rows["a"]["status"] == "ok"
    assert rows["b"]["status"] == "ok" and rows["b"]["started_utc"] != old["b"]["started_utc"]
    assert (d / "logs" / "a.log").exists() and (d / "logs" / "b.log").exists()
    s = json.loads((d / "summary.json").read_text())
    assert s["args"]["only"] == ["b"] and s["headline"]["carried"] == 2 and "(carried over)" in s["story"]


def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path):
    root = make_system(tmp_path, ['Step("m", "marker.py")', 'Step("gone", "missing.py")'])
    out = run_pipeline(root, "--dry-run")
    assert out.returncode == 0, out.stderr
    assert f"python {SYS}/scripts/marker.py --quick" in out.stdout
    assert "(missing: the script does not exist)" in out.stdout and "dry run: nothing was run." in out.stdout
    assert not (root / SYS / "scripts" / "marker.txt").exists() and not (root / SYS / "results").exists()


def test_ncu_nsys_all_and_gpu_count_choose_the_steps(tmp_path):
    root = make_system(tmp_path, [
        'Step("base", "ok.py", ncu=("--ncu",), nsys=("--nsys",), full=("--full",))',
        'Step("ncu_pass", "ok.py", ncu=ONLY, quick=("--q", "{python}", "{scripts}/x.py"))',
        'Step("timeline", "ok.py", nsys=ONLY)',
        'Step("multi", "ok.py", only_all=True, min_gpus=64)',
        'Step("long", "ok.py", only_all=True)'])
    plain = run_pipeline(root, "--dry-run").stdout
    assert "base" in plain and all(n not in plain for n in ("ncu_pass", "timeline", "multi", " long "))
    ncu = run_pipeline(root, "--dry-run", "--ncu").stdout
    assert f"python {SYS}/scripts/ok.py --quick --ncu" in ncu
    assert f"python {SYS}/scripts/ok.py --q python {SYS}/scripts/x.py" in ncu and "timeline" not in ncu
    nsys = run_pipeline(root, "--dry-run", "--nsys", "--all").stdout
    assert f"python {SYS}/scripts/ok.py --full --nsys" in nsys and "timeline" in nsys and "ncu_pass" not in nsys
    assert "note: multi left out: it needs 64 GPUs" in nsys and "long" in nsys
    only = run_pipeline(root, "--dry-run", "--only", "multi,ncu_pass").stdout   # named steps run whatever the flags
    assert "multi" in only and "ncu_pass" in only and "base" not in only


def test_unknown_option_and_conflicting_modes_are_one_line(tmp_path):
    root = make_system(tmp_path, ['Step("a", "ok.py")'])
    for args in (["--bogus"], ["--quick", "--all"]):
        out = run_pipeline(root, *args)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_runs_without_pandas(tmp_path):
    """The runner needs only the standard library and common/: pandas blocked, the record is still written."""
    root = make_system(tmp_path, ['Step("a", "skip.py")'])
    block = tmp_path / "block"
    (block / "pandas").mkdir(parents=True)
    (block / "pandas" / "__init__.py").write_text("raise ImportError('pandas is blocked for this test')\n")
    out = run_pipeline(root, env={"PYTHONPATH": os.pathsep.join([str(block), str(REPO)])})
    assert out.returncode == 0, out.stdout + out.stderr
    assert (root / SYS / "results" / "06_full_pipeline" / "steps.csv").read_text().startswith("step,status")


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed: the warm-up would build")
def test_a_warmup_setup_error_does_not_stop_the_steps(tmp_path):
    root = make_system(tmp_path, ['Step("a", "ok.py", jit=("fi:norm",))', 'Step("b", "ok.py", jit=("msgl:radix",))'])
    out = run_pipeline(root)
    assert out.returncode == 0, out.stdout + out.stderr                # the warm-up does not count
    assert "python -m common jit --system fakesys --modules fi:norm,msgl:radix" in out.stdout
    assert re.search(r"^\[1/3\] jit_warmup\s+setup-error \(exit 2\)", out.stdout, re.M)
    rows = last_table(root)
    assert [(r["step"], r["kind"], r["status"]) for r in rows] == [
        ("jit_warmup", "warmup", "setup-error"), ("a", "measure", "ok"), ("b", "measure", "ok")]
    d = root / SYS / "results" / "06_full_pipeline"
    with open(d / "warmup.csv", newline="") as f:
        assert [(r["module"], r["status"]) for r in csv.DictReader(f)] == [("fi:norm", "setup"), ("msgl:radix", "setup")]
    nowarm = run_pipeline(root, "--no-warmup", "--dry-run").stdout
    assert "jit_warmup" not in nowarm


NEEDS_CHECKS = ("import os\nfrom common.base.checks import SetupError\n"
                "def stack():\n    if os.environ.get('FAKE_STACK') == 'missing':\n"
                "        raise SetupError(\"Python package 'torch' is not importable. Install it: pip install torch\")\n"
                "    if os.environ.get('FAKE_STACK') == 'broken':\n        raise RuntimeError('the check itself broke')\n")


@pytest.mark.parametrize("stack", ["missing", "there", "broken"])
def test_what_every_step_needs_is_checked_once_before_any_step(tmp_path, stack):
    """Issue #38: a pipeline missing a package said so once per step (8 times for FlashInfer). The _steps.py NEEDS
    checks run once, in one child, before any step: missing, their one [setup] line and exit 2, no step run, nothing
    recorded; there, the steps run; a check that breaks otherwise is a note and the steps say for themselves."""
    root = make_system(tmp_path, ['Step("a", "marker.py")', 'Step("b", "setup.py")'])
    sd = root / SYS / "scripts"
    (sd / "_checks.py").write_text(NEEDS_CHECKS)
    (sd / "_steps.py").write_text((sd / "_steps.py").read_text() + 'NEEDS = ("_checks:stack",)\n')
    out = run_pipeline(root, env={"FAKE_STACK": stack})
    ran = (sd / "marker.txt").exists()
    if stack == "missing":
        assert out.returncode == 2 and out.stdout == "", out.stdout + out.stderr
        assert out.stderr.splitlines() == ["[setup] Python package 'torch' is not importable. Install it: pip install "
                                           "torch -- every step of this pipeline needs it: no step was run"]
        assert not ran and not (root / SYS / "results").exists()
        dry = run_pipeline(root, "--dry-run", env={"FAKE_STACK": stack})          # the plan needs no stack
        assert dry.returncode == 0 and "dry run: nothing was run." in dry.stdout and "[setup]" not in dry.stderr
        return
    assert out.returncode == 1 and ran and "partial — 1/2 steps ok" in out.stdout, out.stdout + out.stderr
    assert out.stdout.count("[setup]") + out.stderr.count("[setup]") == 1          # b's own line, once
    note = ("note: the check of what every step needs ended with exit 1 ([failed] RuntimeError: the check itself "
            "broke")
    assert (note in out.stdout) == (stack == "broken")


# ------------------------------------------------------------------ the real systems

@pytest.mark.parametrize("system", ["flashinfer", "mini-sglang", "sglang"])
def test_real_wrappers_help_and_dry_run(system):
    sh = REPO / system / "scripts" / "06_full_pipeline.sh"
    assert len(sh.read_text().splitlines()) <= 40 and 'PIPELINE_COMMAND="$0 $*"' in sh.read_text()
    h = subprocess.run(["bash", str(sh), "--help"], capture_output=True, text=True, timeout=30,
                       env={**os.environ, "PYTHON": "/nonexistent/python"})      # --help needs no Python
    assert h.returncode == 0 and "Usage" in h.stdout and "set -euo" not in h.stdout
    for flag in ("--quick", "--all", "--ncu", "--nsys", "--only", "--no-warmup", "--dry-run"):
        assert flag in h.stdout
    d = subprocess.run(["bash", str(sh), "--dry-run", "--quick"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHON": sys.executable})
    assert d.returncode == 0, d.stderr
    assert d.stdout.startswith(f"{system} pipeline --quick: ") and "dry run: nothing was run." in d.stdout
    assert "jit_warmup" in d.stdout and f"python {system}/scripts/00_check_env.py --quick" in d.stdout
    bad = subprocess.run(["bash", str(sh), "--no-such-flag"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHON": sys.executable})
    assert bad.returncode == 2 and "unknown option" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def _steps(system):
    loaded, notes = steps.load_steps(REPO, system)
    return {s.name: s for s in loaded}, notes


def test_real_step_lists():
    fi, _ = _steps("flashinfer")
    assert list(fi)[:7] == ["00_check_env", "01_test_kernels", "02_profile_prefill", "03_profile_decode",
                            "04_profile_rmsnorm", "05_profile_rope", "07_jit_analysis"]
    chosen, _ = steps.choose(fi.values(), "quick", True, False, None, 1)
    names = [s.name for s, _ in chosen]
    assert {"ncu_decode", "ncu_prefill", "ncu_norm", "ncu_rope"} <= set(names) and "nsys_decode" not in names
    args = dict((s.name, a) for s, a in chosen)
    assert args["02_profile_prefill"] == ["--quick", "--ncu"] and "--count" in args["ncu_decode"]
    full = dict((s.name, a) for s, a in steps.choose(fi.values(), "all", True, False, None, 1)[0])
    assert "--set" in full["ncu_norm"] and full["00_check_env"] == []

    ms, _ = _steps("mini-sglang")
    assert "05_profile_comm" in ms and "08_forward_timeline" in ms and "06_forward_timeline" not in ms
    assert steps.choose(ms.values(), "quick", False, True, None, 1)[0][-1][1][-1] == "--nsys"

    sg, notes = _steps("sglang")
    assert sg["04_nsys_profile"].script == "04_nsys_profile.py" and sg["05_ncu_attention"].script == "05_ncu_attention.py"
    for mode, gpus, has07 in (("quick", 8, False), ("all", 1, False), ("all", 2, True)):
        chosen, left = steps.choose(sg.values(), mode, False, False, None, gpus)
        assert ("07_tp_scaling" in [s.name for s, _ in chosen]) == has07
        assert bool(left) == (mode == "all" and not has07)
        assert "04_nsys_profile" not in [s.name for s, _ in chosen] and "05_ncu_attention" not in [s.name for s, _ in chosen]
    # the same meaning as elsewhere: --nsys adds the timeline step, --ncu the ncu passes (and 08's counters)
    chosen = dict((s.name, a) for s, a in steps.choose(sg.values(), "quick", True, True, None, 1)[0])
    assert {"04_nsys_profile", "05_ncu_attention"} <= set(chosen) and chosen["08_execution_story"] == ["--quick", "--ncu"]


def test_real_steps_name_the_jit_modules_they_load():
    for system in ("flashinfer", "mini-sglang", "sglang"):
        by_name, _ = _steps(system)
        for s in by_name.values():
            assert set(s.jit) | set(s.jit_all) <= set(jit.MODULES), s.name
    fi, _ = _steps("flashinfer")
    assert set(fi["03_profile_decode"].jit) == {"fi:decode", "fi:prefill_fa2"}      # tensor-core decode = fa2 prefill
    assert fi["00_check_env"].jit == ()
    sg, _ = _steps("sglang")
    assert set(sg["01_baseline_perf"].jit) == {"fi:prefill_fa2", "fi:prefill_fa3", "fi:cascade", "fi:norm",
                                               "sgl:activation", "sgl:clamp_position", "sgl:fused_rope",
                                               "sgl:kvcache_2048"}
    needs = warmup.system_modules("mini-sglang")
    assert "08_forward_timeline" in needs["msgl:index_8192_s4"] and needs["msgl:pynccl"] == ["05_profile_comm"]
    chosen, _ = steps.choose(_steps("mini-sglang")[0].values(), "quick", False, False, ["02_profile_index"], 1)
    assert steps.warmup_modules(chosen, "quick") == ["msgl:index_8192_s4"]
    assert "msgl:index_8192_s16" in steps.warmup_modules(chosen, "all")


# ------------------------------------------------------------------ common.capture.jit without torch

def test_jit_catalogue_names_the_uris_the_wrappers_load():
    m = jit.MODULES
    assert m["fi:decode"].uri == ("batch_decode_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_"
                                  "head_dim_qk_128_head_dim_vo_128_posenc_0_use_swa_False_use_logits_cap_False")
    assert m["fi:prefill_fa3"].uri == m["fi:prefill_fa2"].uri + "_sm90"
    assert m["fi:prefill_fa2"].uri.endswith("_f16qk_False") and "dtype_idx_i32" in m["fi:prefill_fa2"].uri
    assert m["msgl:index_8192_s4"].uri == "minisgl__index_8192_4_128_1_false"   # what 00_check_env looks for
    assert m["msgl:store_2048"].uri == "minisgl__store_2048_128_1_false"


def _fake_mods(*names):
    return [jit.Module(f"fake:{n}", "fake", f"fake_{n}", "a test module") for n in names]


def test_a_failing_module_does_not_stop_the_others():
    lines = []

    def fn(m):
        if m.name == "fake:bad":
            raise RuntimeError("Ninja build failed.\nFAILED: x.cuda.o\nx.cu(3): error: identifier \"y\" is undefined")
        if m.name == "fake:old":
            return "cached"
        if m.name == "fake:fa3":
            return ("skipped", "not an sm90a GPU")
        time.sleep(0.05)
        return "built"
    mods = _fake_mods("a", "bad", "old", "fa3", "b")
    res = jit.warm(mods, builders={"fake": lambda ms, done: jit.build_each(ms, done, fn, jobs=3)}, echo=lines.append)
    assert [(r.name, r.status) for r in res] == [("fake:a", "built"), ("fake:bad", "failed"), ("fake:old", "cached"),
                                                ("fake:fa3", "skipped"), ("fake:b", "built")]
    bad = next(r for r in res if r.status == "failed")
    assert bad.detail == 'x.cu(3): error: identifier "y" is undefined'
    assert sorted(lines) == sorted(jit.format_line(r, 8) for r in res) and len(lines) == 5
    assert any(re.fullmatch(r"  fake:a   built \d+\.\d s", line) for line in lines)
    assert "  fake:old cached" in lines and "  fake:fa3 skipped: not an sm90a GPU" in lines
    assert jit.exit_code(res) == 1


def test_a_builder_that_raises_fails_only_its_own_modules():
    def good(ms, done):
        for m in ms:
            done(m.name, "built", 1.25)

    def broken(ms, done):
        done(ms[0].name, "built", 0.5)
        raise RuntimeError("nvcc not found")

    def no_pkg(ms, done):
        raise SetupError("Python package 'flashinfer' is not importable")
    mods = _fake_mods("g1", "g2") + [jit.Module("x:1", "broken", "x1", "t"), jit.Module("x:2", "broken", "x2", "t"),
                                     jit.Module("y:1", "nopkg", "y1", "t"), jit.Module("z:1", "nobuilder", "z1", "t")]
    res = {r.name: r for r in jit.warm(mods, {"fake": good, "broken": broken, "nopkg": no_pkg}, echo=lambda _: None)}
    assert res["fake:g1"].status == res["fake:g2"].status == "built" and res["x:1"].status == "built"
    assert (res["x:2"].status, res["x:2"].detail) == ("failed", "nvcc not found")
    assert res["y:1"].status == "setup" and res["z:1"].status == "failed"
    assert jit.exit_code(list(res.values())) == 2
    total = jit.format_total(list(res.values()), 12.34, 16)
    assert total.startswith("warm-up: 6 module(s) — 3 built, 2 failed, 1 not built (setup) — 12.3 s wall on 16")


def test_jit_csv(tmp_path):
    res = [jit.Result("fi:norm", "flashinfer", "built", 12.345, "", "norm"),
           jit.Result("fi:rope", "flashinfer", "failed", None, "error: x", "rope")]
    jit.write_csv(tmp_path / "w.csv", res)
    with open(tmp_path / "w.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows[0] == {"module": "fi:norm", "kind": "flashinfer", "status": "built", "seconds": "12.3", "uri": "norm",
                       "detail": ""}
    assert rows[1]["status"] == "failed" and rows[1]["seconds"] == ""


def test_jit_cli_on_a_machine_without_a_gpu(tmp_path):
    def jit_cli(*args):
        return subprocess.run([sys.executable, "-m", "common", "jit", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=60)
    h = jit_cli("--help")
    assert h.returncode == 0 and "--list" in h.stdout and "build_jit_specs" in h.stdout
    ls = jit_cli("--list", "--system", "sglang")
    assert ls.returncode == 0 and "fi:cascade" in ls.stdout and "msgl:" not in ls.stdout
    assert "steps: 01_baseline_perf" in ls.stdout
    bad = jit_cli("--modules", "fi:nope")
    assert bad.returncode == 2 and "unknown module 'fi:nope'" in bad.stderr
    if importlib.util.find_spec("torch") is None:
        out = jit_cli("--system", "flashinfer", "--csv", str(tmp_path / "w.csv"))
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert [l for l in out.stderr.splitlines() if l.startswith("[setup]")] == out.stderr.strip().splitlines()
        assert len(out.stderr.strip().splitlines()) == 1
        with open(tmp_path / "w.csv", newline="") as f:
            assert {r["status"] for r in csv.DictReader(f)} == {"setup"}


def test_eta_text_and_durations():
    P = steps.Planned
    assert steps.fmt_s(41) == "41s" and steps.fmt_s(72) == "1m12s" and steps.fmt_s(3725) == "1h02m"
    assert steps.eta_text([P("a", "measure", [], "", None, 30), P("b", "measure", [], "", None, 240)]) == "ETA 4m30s"
    assert steps.eta_text([P("a", "measure", [], "", None, None)]) == "ETA unknown: no earlier timing of these steps"
    assert pipeline.overall(["ok", "ok (skipped)"]) == "ok" and pipeline.overall(["ok", "failed"]) == "partial"
    assert pipeline.overall(["setup-error", "missing"]) == "failed" and pipeline.overall(["ok", "interrupted"]) == "interrupted"


@pytest.mark.skipif(__import__("common.capture.nsys", fromlist=["find"]).find() is not None, reason="nsys is usable here")
def test_an_nsys_step_without_nsys_is_ok_skipped(tmp_path):
    root = make_system(tmp_path, ['Step("timeline", "marker.py", nsys=ONLY, under="nsys")'])
    plan = run_pipeline(root, "--nsys", "--dry-run").stdout
    assert f"python -m common pipeline nsys --out {SYS}/results/nsys_timeline/timeline -- python {SYS}/" in plan
    out = run_pipeline(root, "--nsys")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[skip] Nsight Systems is not usable here" in out.stdout
    assert {r["step"]: r["status"] for r in last_table(root)} == {"timeline": "ok (skipped)"}
    assert not (root / SYS / "scripts" / "marker.txt").exists()


# ------------------------------------------------------------------ the combined JIT build's hand-over, on a toy ninja build

def _toy_modules(root: Path) -> list[tuple[Path, Path]]:
    """Two gcc 'modules' laid out as FlashInfer lays out its JIT folder: absolute output paths, deps = gcc."""
    src = root / "src"
    src.mkdir()
    out = []
    for m in ("a", "b"):
        (src / f"{m}.c").write_text(f'#include "h_{m}.h"\nint f_{m}(void) {{ return X; }}\n')
        (src / f"h_{m}.h").write_text("#define X 1\n")
        d = root / "jit" / m
        d.mkdir(parents=True)
        (d / "build.ninja").write_text(
            "ninja_required_version = 1.3\ncc = gcc\n"
            "rule compile\n  command = $cc -MMD -MF $out.d -I" + str(src) + " -c $in -o $out\n"
            "  depfile = $out.d\n  deps = gcc\n"
            "rule link\n  command = $cc -shared $in -o $out\n"
            f"build {d}/{m}.o: compile {src}/{m}.c\nbuild {d}/{m}.so: link {d}/{m}.o\ndefault {d}/{m}.so\n")
        out.append((d, d / "build.ninja"))
    return out


@pytest.mark.skipif(not (shutil.which("ninja") and shutil.which("gcc")), reason="needs ninja and gcc")
def test_combined_build_hands_its_ninja_logs_to_each_module_folder(tmp_path):
    mods = _toy_modules(tmp_path)
    root = tmp_path / "jit"
    (root / "all.ninja").write_text("ninja_required_version = 1.3\n"
                                    + "".join(f"subninja {f}\n" for _, f in mods))
    subprocess.run(["ninja", "-C", str(root), "-f", str(root / "all.ninja")], check=True, capture_output=True)
    # without the hand-over, a module's own ninja (a wrapper's first call) would rebuild it: the guard sees that
    assert not any(jit.dry_run_clean(d, f) for d, f in mods)
    for d, _ in mods:
        jit.hand_over_logs(root, d)
    assert all(jit.dry_run_clean(d, f) for d, f in mods)
    (tmp_path / "src" / "h_a.h").write_text("#define X 2\n")        # a changed header is still seen
    assert not jit.dry_run_clean(*mods[0]) and jit.dry_run_clean(*mods[1])


def test_the_stamp_key_reads_the_gpu_where_the_rest_of_the_workbook_does(monkeypatch):
    """jit.stamp_key takes the GPU from common.capture.gpu.gpus (the visible GPUs, CUDA_VISIBLE_DEVICES honoured), not
    a query of its own: no GPU, no key; the first visible GPU's model and UUID otherwise."""
    from common.capture import gpu
    monkeypatch.setattr(gpu, "gpus", lambda: [])
    assert jit.stamp_key() is None
    monkeypatch.setattr(gpu, "gpus", lambda: [{"index": 3, "name": "NVIDIA H200", "uuid": "GPU-abc"}])
    assert jit.stamp_key()["gpu"] == "NVIDIA H200, GPU-abc"


def test_a_warm_machine_knows_its_built_modules_without_torch(tmp_path, monkeypatch):
    """The stamp a complete warm-up leaves: the next warm-up with the same GPU and versions says "cached" from the
    files alone; a missing file, another GPU or a module it never built sends it the slow way (None)."""
    monkeypatch.setenv("HANDS_ON_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TVM_FFI_CACHE_DIR", str(tmp_path / "tvm"))
    key = {"gpu": "NVIDIA H200, GPU-1"}
    monkeypatch.setattr(jit, "stamp_key", lambda: dict(key))
    mods = [jit.MODULES["msgl:radix"], jit.MODULES["msgl:store_256"]]
    for m in mods:
        d = tmp_path / "tvm" / f"{m.uri}_abc"
        d.mkdir(parents=True)
        (d / f"{m.uri}.so").write_bytes(b"\x7fELF")
    assert jit.cached_by_stamp(mods) is None                      # no stamp yet
    jit.write_stamp(mods, [jit.Result(m.name, m.kind, "built", 1.0) for m in mods])
    hit = jit.cached_by_stamp(mods)
    assert [r.status for r in hit] == ["cached", "cached"]
    assert jit.cached_by_stamp(mods[:1]) is not None
    assert jit.cached_by_stamp(mods + [jit.MODULES["msgl:store_2048"]]) is None   # never built
    key["gpu"] = "NVIDIA H100 80GB HBM3, GPU-2"
    assert jit.cached_by_stamp(mods) is None                      # another GPU
    key["gpu"] = "NVIDIA H200, GPU-1"
    next((tmp_path / "tvm").glob("minisgl__radix*/*.so")).unlink()
    assert jit.cached_by_stamp(mods) is None                      # a file gone
    # a warm-up with a failed module keeps no stamp for it
    jit.write_stamp(mods, [jit.Result(mods[0].name, "tvm-ffi", "failed", None)])
    assert jit.cached_by_stamp(mods) is None


def test_sglang_jit_modules_are_built_through_sglangs_own_builders_with_a_tp1_llama_servers_arguments(
        monkeypatch, tmp_path):
    """The sgl:* modules call the builder functions SGLang's ops call (stand-ins here record the arguments), with
    the dtypes of a bf16 Llama-3.1-8B server at TP 1; a module whose .so is already in the cache says "cached"."""
    import types
    calls = []
    torch = types.SimpleNamespace(bfloat16="BF16", int64="I64", int32="I32",
                                  cuda=types.SimpleNamespace(is_available=lambda: True))
    stubs = {"torch": torch, "sglang": types.ModuleType("sglang")}
    for mod, fn in (("sglang.kernels.ops.activation.activation", "activation_module"),
                    ("sglang.kernels.ops.attention.clamp_position", "_jit_clamp_position_module"),
                    ("sglang.kernels.ops.attention.rope", "_jit_fused_rope_module"),
                    ("sglang.kernels.ops.kvcache.kvcache", "_jit_kvcache_module")):
        m = types.ModuleType(mod)
        setattr(m, fn, lambda *a, _fn=fn: calls.append((_fn, a)))
        stubs[mod] = m
    for name, m in stubs.items():
        monkeypatch.setitem(sys.modules, name, m)
    monkeypatch.setenv("TVM_FFI_CACHE_DIR", str(tmp_path))
    built = tmp_path / "sgl_kernel_jit_kvcache_2048_2048_true_ab12__arch_sm90a__tvmffi_0.1.11"
    built.mkdir()
    (built / "sgl_kernel_jit_kvcache_2048_2048_true_ab12.so").write_bytes(b"")
    mods = [jit.MODULES[n] for n in ("sgl:activation", "sgl:clamp_position", "sgl:fused_rope", "sgl:kvcache_2048")]
    res = {r.name: r.status for r in jit.warm(mods, echo=lambda *a, **k: None)}
    assert sorted(calls) == sorted([("activation_module", ("BF16",)), ("_jit_clamp_position_module", ("I64",)),
                                    ("_jit_fused_rope_module", (True, 128, "BF16", "BF16")),
                                    ("_jit_kvcache_module", (2048, 2048))])
    assert res == {"sgl:activation": "built", "sgl:clamp_position": "built", "sgl:fused_rope": "built",
                   "sgl:kvcache_2048": "cached"}


def test_bytecode_home_where_torch_has_no_bytecode_and_none_can_be_written(tmp_path, monkeypatch):
    """A lent H200's fresh step compiled 1,944 modules (6.8 s) because torch's install had no bytecode and Python
    wrote none: the run's processes then keep theirs under <cache>/pycache (PYTHONPYCACHEPREFIX), and a child Python
    really writes there. Nothing changes where the bytecode is there, where Python can write it beside the source,
    or when the user chose (PYTHONPYCACHEPREFIX set, HANDS_ON_PYCACHE=0); PYTHONDONTWRITEBYTECODE is unset for the
    children, and said."""
    from common.base import checks
    pkg = tmp_path / "site" / "fakepkg_bc"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("HANDS_ON_CACHE", str(tmp_path / "cache"))
    for v in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE", "HANDS_ON_PYCACHE"):
        monkeypatch.delenv(v, raising=False)
    assert checks.bytecode_home("fakepkg_bc") is None                   # writable: its first import writes it
    real_writes = checks._writes
    monkeypatch.setattr(checks, "_writes", lambda d: False)              # a read-only install
    said = checks.bytecode_home("fakepkg_bc")
    prefix = tmp_path / "cache" / "pycache"
    assert os.environ["PYTHONPYCACHEPREFIX"] == str(prefix) and f"{pkg} cannot be written" in said
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    subprocess.run([sys.executable, "-c", "import fakepkg_bc"], env=env, check=True, timeout=60)
    assert list(prefix.rglob("fakepkg_bc/__init__.*.pyc")) and not (pkg / "__pycache__").exists()
    assert checks.bytecode_home("fakepkg_bc") is None                    # set already: once per run
    monkeypatch.delenv("PYTHONPYCACHEPREFIX")
    monkeypatch.setenv("HANDS_ON_PYCACHE", "0")
    assert checks.bytecode_home("fakepkg_bc") is None and "PYTHONPYCACHEPREFIX" not in os.environ
    monkeypatch.delenv("HANDS_ON_PYCACHE")
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setattr(checks, "_writes", lambda d: True)
    said = checks.bytecode_home("fakepkg_bc")
    assert "PYTHONDONTWRITEBYTECODE is set" in said and "PYTHONDONTWRITEBYTECODE" not in os.environ
    monkeypatch.delenv("PYTHONPYCACHEPREFIX")
    import py_compile
    py_compile.compile(str(pkg / "__init__.py"), cfile=importlib.util.cache_from_source(str(pkg / "__init__.py")))
    monkeypatch.setattr(checks, "_writes", lambda d: False)
    assert checks.bytecode_home("fakepkg_bc") is None                    # its bytecode is there
    assert real_writes(tmp_path) and not real_writes(tmp_path / "no-such-folder")


def test_the_fork_server_starts_before_the_check_and_goes_when_the_run_stops_there(tmp_path, monkeypatch, capsys):
    """Its imports overlap the check of what every step needs (a fresh Python of 5-7 s): it is running when the check
    runs, its log waits in results/.forkserver-<pid>.log, and a run that the check stops leaves neither the server,
    the log nor a results folder it made."""
    root = make_system(tmp_path, ['Step("a", "ok.py")'])
    (root / SYS / "scripts" / "_steps.py").write_text((root / SYS / "scripts" / "_steps.py").read_text()
                                                      + 'NEEDS = ("x:y",)\n')
    seen = {}
    real_start = pipeline.start_forks

    def start(*a, **k):
        seen["forks"] = real_start(*a, **k)
        return seen["forks"]

    def check(_root, _system):
        f = seen.get("forks")
        seen["running_at_check"] = f is not None and f.proc is not None and f.proc.poll() is None
        seen["log"] = Path(f.log) if f is not None else None
        return "[setup] stand-in: missing -- every step of this pipeline needs it: no step was run"
    monkeypatch.setattr(pipeline, "start_forks", start)
    monkeypatch.setattr(pipeline, "preflight", check)
    rc = pipeline.main(["--root", str(root), "--system", SYS, "--no-warmup"])
    assert rc == 2 and seen["running_at_check"]
    assert seen["log"].parent == root / SYS / "results" and seen["log"].name.startswith(".forkserver-")
    assert seen["forks"].proc is None and not seen["log"].exists() and not (root / SYS / "results").exists()
    assert "stand-in: missing" in capsys.readouterr().err
