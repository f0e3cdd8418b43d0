"""One server for several pipeline steps (issue #22): common.run.pipeline's shared services with the SGLang
provider (_sglang.SharedServer) and the scripts' side (_sglang.server), on the stand-in server.

A fake system in tmp_path declares ``SERVERS = {"default": Service("_sglang:SharedServer", ...)}`` -- the
real provider, given the stand-in tests/sglang_fake_server.py as its launcher -- and steps that run
``exp.py WHAT``: a stand-in experiment that asks _sglang.server() for a server with the shared server's
flags (or, with WHAT=other, one more flag), prints which server it got, sends a request, then does WHAT
(ok, fail, kill the server, leave a request running, sleep). Each case checks by pid which server each
step used and that no server outlives the run; the guards were each broken once on purpose and seen to
fail (see the commit that added this file). Held services (issue #38: Service(held=True), 02's LPM and 03's
Triton servers) are launched when the run begins and held by the real gate (_sgl_gate, which the stand-in
server runs as SGLang does) until their row: their cases check, from the servers' own logs, that no held
server did its GPU part of the start before its row.
"""
from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.capture import procs
from kit import write_fake_system

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "sglang" / "scripts"
FAKE = Path(__file__).resolve().parent / "sglang_fake_server.py"
SYS = "fakesys"
FLAGS = ["--load-format", "dummy", "--enable-metrics", "--log-level", "info", "--max-total-tokens", "32768"]

EXP = f'''
import os, signal, sys, threading, time
from pathlib import Path
sys.path.insert(0, {str(SCRIPTS)!r})
import _sglang as sg
from common.base.checks import run_main
from common.run.results import Run

def main(argv=None):
    what = sys.argv[1]
    fl = {FLAGS!r} + (["--schedule-policy", "lpm"] if what == "other" else [])
    with Run(Path(__file__).with_name(f"exp_{{what}}.py"), {{"what": what}}, quiet=True) as run:
        with sg.server(run, "dummy-model", fl, quick=True, own_why="another policy, on purpose",
                       launcher=[sys.executable, {str(FAKE)!r}, "--spawn-child"], start_timeout=30, stop_timeout=3) as srv:
            pid = srv.shared["pid"] if srv.shared else srv.group.pid
            print(f"USED {{what}} {{'shared' if srv.shared else 'own'}} {{pid}}", flush=True)
            srv.generate(input_ids=[1, 2, 3], sampling_params={{"max_new_tokens": 2}})
            if what == "wait":
                time.sleep(2)
            if what == "fail":
                raise RuntimeError("the experiment failed, on purpose")
            if what == "kill":
                os.kill(pid, signal.SIGKILL)
            if what == "busy":                       # a request left running by a step that dies
                threading.Thread(target=lambda: srv.generate(input_ids=[1], sampling_params={{
                    "max_new_tokens": 1, "fake_running_s": 20}}), daemon=True).start()
                time.sleep(0.5)
                os._exit(1)
            if what == "sleep":
                Path(__file__).with_name("sleeping.tmp").write_text(str(os.getpid()))
                Path(__file__).with_name("sleeping.tmp").replace(Path(__file__).with_name("sleeping"))
                time.sleep(60)
    print(f"ENDED {{what}} {{time.time():.3f}}", flush=True)
    return 0

run_main(main)
'''


def make_system(tmp_path: Path, steps: list[str], launcher_extra=(), held=(), lpm=False, lpm_launcher=None,
                gpu_gb=None, extra_flags=()) -> Path:
    """A fake system whose SERVERS are 'default' (FLAGS) and, with ``lpm``, 'lpm' (FLAGS + --schedule-policy lpm);
    the names in ``held`` are held services (launched when the run begins, released at their row)."""
    sd = write_fake_system(tmp_path, SYS, [])
    (sd / "scripts" / "exp.py").write_text(EXP.replace(repr(FLAGS), repr(FLAGS + list(extra_flags))))
    launcher = [sys.executable, str(FAKE), "--spawn-child", *launcher_extra]

    def service(name, flags, launch):
        opts = {"model_path": "dummy-model", "flags": flags, "launcher": launch, "start_timeout": 30,
                "stop_timeout": 3, "check_timeout": 1, **({"gpu_gb": gpu_gb} if gpu_gb else {})}
        return f"{name!r}: Service('_sglang:SharedServer', held={name in held}, options={opts!r})"
    servers = [service("default", FLAGS + list(extra_flags), launcher)]
    if lpm:
        servers.append(service("lpm", FLAGS + list(extra_flags) + ["--schedule-policy", "lpm"], lpm_launcher or launcher))
    (sd / "scripts" / "_steps.py").write_text(
        f"import sys\nsys.path.insert(0, {str(SCRIPTS)!r})\n"
        "from common.run.steps import Service, Step\n\n"
        "SERVERS = {" + ", ".join(servers) + "}\n"
        "STEPS = [\n" + "".join(f"    {s},\n" for s in steps) + "]\n")
    return tmp_path


def exp(name: str, what: str, server="default") -> str:
    return f'Step("{name}", "exp.py", quick=("{what}",), full=("{what}",), server={server!r})'


def stamps(log: Path, pattern: str) -> list[float]:
    """Epoch seconds of the log lines (SGLang's "[YYYY-mm-dd HH:MM:SS.mmm] ..." stamps) that match ``pattern``."""
    import datetime as dt
    out = []
    for m in re.finditer(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})\] (.*)$", log.read_text(errors="replace"), re.M):
        if re.search(pattern, m[2]):
            out.append(dt.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S.%f").timestamp())
    return out


def ended(out: str) -> dict:
    """{step's WHAT: epoch seconds when it ended}, from the ENDED lines the stand-in experiments print."""
    return {m[0]: float(m[1]) for m in re.findall(r"^ENDED (\w+) ([\d.]+)$", out, re.M)}


def env_for(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HANDS_ON_SHARED_SERVER_", "HANDS_ON_SERVER_STARTS"))}
    return {**env, "HANDS_ON_CACHE": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}


def pipeline(root: Path, *args, timeout: float = 180):
    return subprocess.run([sys.executable, "-m", "common", "pipeline", "--root", str(root), "--system", SYS, *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env_for(root))


def used(out: str) -> dict:
    """{step's WHAT: (shared|own, server pid)} from the USED lines the stand-in experiments print."""
    return {m[0]: (m[1], int(m[2])) for m in re.findall(r"^USED (\w+) (shared|own) (\d+)$", out, re.M)}


def family(pid: int) -> list[int]:
    return [pid, *procs.descendants(pid)]


def shared_pidfiles(root: Path) -> list[Path]:
    return list((root / "cache" / "servers" / "06_full_pipeline").glob("*.pid"))


def rows_of(root: Path, name: str) -> list[dict]:
    d = root / SYS / "results" / "06_full_pipeline"
    p = d / name if d.exists() else next((root / SYS / "results").rglob(f"06_full_pipeline/*/{name}"))
    with open(p, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture
def tracked():
    """Pids a case saw; whatever of them is still alive afterwards is killed (and fails the case)."""
    pids: list[int] = []
    yield pids
    left = [p for p in pids if procs.alive(p)]
    for p in left:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    assert not left, f"left running: {left}"


# ------------------------------------------------------------------ one server, started once, shared by pid

def test_one_server_for_the_steps_that_share_it_and_its_own_for_other_flags(tmp_path, tracked):
    root = make_system(tmp_path, ['Step("first", "ok.py")', exp("a", "ok"), exp("b", "ok2"), exp("c", "other"),
                                  exp("d", "ok3"), 'Step("after", "marker.py")'],
                       launcher_extra=("--sglang-log", "--ready-after", "1"))
    out = pipeline(root)
    assert out.returncode == 0, out.stdout + out.stderr
    u = used(out.stdout)
    tracked += [pid for _how, pid in u.values()]
    assert [u[w][0] for w in ("ok", "ok2", "other", "ok3")] == ["shared", "shared", "own", "shared"]
    shared = u["ok"][1]
    assert u["ok2"][1] == u["ok3"][1] == shared != u["other"][1]           # one server for a, b, d; c its own
    assert out.stdout.count("shared server 'default': starting on port") == 1
    assert re.search(r"^\[2/7\] server:default\s+ok  in \d+s$", out.stdout, re.M)
    assert ("server: starts its own server, not the pipeline's shared 'default': its flags differ from the shared "
            "server's: adds --schedule-policy lpm -- another policy, on purpose") in \
        (root / SYS / "results" / "exp_other" / "log.txt").read_text()
    # stopped after its last step (d), before the step that does not use it
    assert out.stdout.index("server:default: stopped in") < out.stdout.index("[7/7] after")
    assert not any(procs.alive(p) for p in [shared, u["other"][1]]) and not shared_pidfiles(root)
    steps = rows_of(root, "steps.csv")
    assert [(r["step"], r["kind"]) for r in steps] == [("first", "measure"), ("server:default", "server"),
                                                       ("a", "measure"), ("b", "measure"), ("c", "measure"),
                                                       ("d", "measure"), ("after", "measure")]
    assert "python" in steps[1]["command"] and "--max-total-tokens 32768" in steps[1]["command"]
    starts = rows_of(root, "server_starts.csv")
    assert [(r["started_by"], r["server"]) for r in starts] == [("pipeline", "shared server 'default'"),
                                                                ("exp_other", "server")]
    assert float(starts[0]["decode_graphs_s"]) >= 0 and starts[0]["quick_changes"] == "--max-total-tokens 32768"
    s = json.loads((root / SYS / "results" / "06_full_pipeline" / "summary.json").read_text())
    assert s["headline"]["server_starts"] == 1 and s["headline"]["server_s"] > 0
    assert "shared servers" in s["story"].splitlines()[0]
    assert "shared server 'default' start 1:" in s["story"] and "decode_graphs" in s["story"]
    log = (root / SYS / "results" / "06_full_pipeline" / "logs" / "server-default.log").read_text()
    assert "where the" in log and "NOT SGLang's default configuration: --quick sets KV pool 32768 tokens" in log
    for what in ("ok", "ok2", "ok3"):                     # each experiment's run names the server it used
        run_log = (root / SYS / "results" / f"exp_{what}" / "log.txt").read_text()
        assert f"runs on the pipeline's shared server 'default' (pid {shared}," in run_log
        assert "the experiment starts from an empty server" in run_log
        summ = json.loads((root / SYS / "results" / f"exp_{what}" / "summary.json").read_text())
        assert summ["servers"][0]["how"] == "shared" and summ["server_config"]


def test_without_the_mode_each_step_starts_its_own(tmp_path, tracked):
    root = make_system(tmp_path, [exp("a", "ok"), exp("b", "ok2")])
    out = pipeline(root, "--all")
    assert out.returncode == 0, out.stdout + out.stderr
    u = used(out.stdout)
    tracked += [pid for _how, pid in u.values()]
    assert [h for h, _ in u.values()] == ["own", "own"] and "server:default" not in out.stdout
    log = (root / SYS / "results" / "exp_ok" / "log.txt").read_text()
    assert "starts its own server" not in log and "shared" not in log    # nothing was offered: nothing to explain


# ------------------------------------------------------------------ a step that fails, kills it, leaves it busy

def test_a_failing_step_leaves_it_usable_and_a_killed_or_busy_server_is_restarted(tmp_path, tracked):
    root = make_system(tmp_path, [exp("a", "ok"), exp("f", "fail"), exp("b", "ok2"), exp("k", "kill"),
                                  exp("c", "ok3"), exp("x", "busy"), exp("d", "ok4")])
    out = pipeline(root)
    u = used(out.stdout)
    tracked += [pid for _how, pid in u.values()]
    assert out.returncode == 1 and "partial — 5/7 steps ok" in out.stdout, out.stdout + out.stderr
    assert all(how == "shared" for how, _ in u.values()), u
    first, second, third = u["ok"][1], u["ok3"][1], u["ok4"][1]
    assert u["fail"][1] == u["ok2"][1] == u["kill"][1] == first             # the failure left it usable
    assert second != first and u["busy"][1] == second and third != second   # restarted twice
    assert re.search(r"server:default: not usable before c \(its process is gone", out.stdout)
    assert re.search(r"server:default: not usable before d \(.*could not be flushed", out.stdout)
    assert re.search(r"^\[restart\] server:default\s+ok  in \d+s$", out.stdout, re.M)
    steps = rows_of(root, "steps.csv")
    assert [r["step"] for r in steps] == ["server:default", "a", "f", "b", "k", "server:default", "c", "x",
                                          "server:default", "d"]
    assert {r["step"]: r["status"] for r in steps if r["kind"] == "measure"} == {
        "a": "ok", "f": "failed", "b": "ok", "k": "ok", "c": "ok", "x": "failed", "d": "ok"}
    assert not any(procs.alive(p) for p in (first, second, third)) and not shared_pidfiles(root)


# ------------------------------------------------------------------ Ctrl-C, SIGTERM, SIGKILL

def _start_sleeping(root: Path):
    """The pipeline with its shared server up and a step sleeping on it: (Popen, server pid, step pid)."""
    log = open(root / "pipeline.out", "w")
    p = subprocess.Popen([sys.executable, "-m", "common", "pipeline", "--root", str(root), "--system", SYS],
                         cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True, env=env_for(root))
    flag = root / SYS / "scripts" / "sleeping"
    t0 = time.time()
    while not flag.exists() and time.time() - t0 < 60 and p.poll() is None:
        time.sleep(0.1)
    assert flag.exists(), (root / "pipeline.out").read_text()
    while "sleep" not in used((root / "pipeline.out").read_text()) and time.time() - t0 < 60:
        time.sleep(0.1)                                   # the runner relays the step's output every 0.1 s
    return p, used((root / "pipeline.out").read_text())["sleep"][1], int(flag.read_text())


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_stops_the_shared_server(tmp_path, tracked, sig):
    root = make_system(tmp_path, [exp("s", "sleep"), exp("never", "ok")])
    p, server, step = _start_sleeping(root)
    everything = family(server) + family(step)
    tracked += everything
    assert len(family(server)) == 2 and shared_pidfiles(root)           # the server and its child, registered
    p.send_signal(sig)
    p.wait(60)
    out = (root / "pipeline.out").read_text()
    assert p.returncode == 130, out
    assert procs.wait_gone(everything, 15), [q for q in everything if procs.alive(q)]
    assert "server:default: stopped in" in out and "USED ok" not in out and not shared_pidfiles(root)


def test_a_killed_pipelines_server_is_found_and_stopped_by_the_next_run(tmp_path, tracked):
    root = make_system(tmp_path, [exp("s", "sleep"), 'Step("plain", "marker.py")'])
    p, server, step = _start_sleeping(root)
    left = family(server)
    tracked += left + family(step)
    p.kill()                                              # SIGKILL: no handler runs, the server stays
    p.wait(10)
    os.killpg(step, signal.SIGKILL)                       # and the step with it (its own process group)
    time.sleep(0.3)
    assert all(procs.alive(q) for q in left) and len(shared_pidfiles(root)) == 1
    out = pipeline(root, "--only", "plain")               # a run that does not even use the shared server
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(rf"found a process group left behind by a killed run \(\d+-default\.pid: pid {server}, ",
                     out.stdout)
    assert procs.wait_gone(left, 10) and not shared_pidfiles(root)


# ------------------------------------------------------------------ held services: launched first, released at their row

def test_held_servers_import_while_earlier_steps_run_and_touch_the_gpu_only_at_their_row(tmp_path, tracked):
    """Issue #38: 02's LPM and 03's Triton servers each took a whole start inside their steps, ~45 s of it Python
    imports. Held services are launched when the run begins; each is held by the gate after its imports and
    released at its row, once the step before has ended: its GPU part of the start ('Init torch distributed' on)
    comes after that step, the step that needs its flags runs on it, and it is stopped after its last step."""
    root = make_system(tmp_path, [exp("a", "wait"), exp("b", "other", ("default", "lpm")), exp("c", "ok"),
                                  'Step("after", "marker.py")'],
                       launcher_extra=("--sglang-log",), held=("default", "lpm"), lpm=True)
    out = pipeline(root)
    assert out.returncode == 0, out.stdout + out.stderr
    u, t = used(out.stdout), ended(out.stdout)
    tracked += [pid for _how, pid in u.values()]
    assert [u[w][0] for w in ("wait", "other", "ok")] == ["shared", "shared", "shared"]
    assert u["wait"][1] == u["ok"][1] != u["other"][1]                    # 'other' on the held LPM server
    o = out.stdout
    assert re.search(r"^\[launch\] server:lpm\s+held until its row", o, re.M)
    assert max(o.index("[launch] server:default"), o.index("[launch] server:lpm")) < o.index("[1/6] server:default")
    assert "note: server:default, server:lpm: launched when the run begins" in o
    logs = root / SYS / "results" / "06_full_pipeline" / "logs"
    for name, before in (("default", None), ("lpm", "wait")):
        log = logs / f"server-{name}.sglang.log"
        (held,), (freed,) = stamps(log, r"hands-on gate: holding"), stamps(log, r"hands-on gate: released after")
        gpu = stamps(log, r"Init torch distributed begin")[0]
        assert held <= freed <= gpu
        if before:                                      # its GPU work after the step before its row
            assert gpu >= t[before] and freed - held >= 2.0, (gpu, t[before], freed - held)
    assert not (logs / "gate-lpm").exists() and not (logs / "gate-default").exists()   # removed with the server
    assert o.index("server:lpm: stopped in") < o.index("[5/6] c ")                         # after its last step
    assert not any(procs.alive(p) for _h, p in u.values()) and not shared_pidfiles(root)
    steps = rows_of(root, "steps.csv")
    assert [(r["step"], r["kind"]) for r in steps] == [("server:default", "server"), ("a", "measure"),
                                                       ("server:lpm", "server"), ("b", "measure"), ("c", "measure"),
                                                       ("after", "measure")]
    starts = {r["server"]: r for r in rows_of(root, "server_starts.csv")}
    lpm = starts["shared server 'lpm'"]
    assert float(lpm["gate_s"]) >= 2.0 and float(lpm["scheduler_imports_s"]) > 0       # the wait, the imports apart
    assert float(lpm["waited_s"]) < float(lpm["start_s"]) - 2.0
    story = " ".join(json.loads((root / SYS / "results" / "06_full_pipeline" / "summary.json").read_text())["story"]
                     .split())                         # its lines are wrapped
    assert re.search(r"shared server 'lpm' start 1: [\d.]+ s, launched when the run began and held [\d.]+ s at its "
                     r"gate while earlier steps ran; ready [\d.]+ s after its release", story)
    log = (root / SYS / "results" / "exp_other" / "log.txt").read_text()
    assert re.search(r"runs on the pipeline's shared server 'lpm' \(pid \d+, .*, started by the runner in \d+ s, "
                     r"\d+ s of it held at its gate while earlier steps ran", log)


def test_held_servers_that_fit_together_start_at_the_first_row_and_no_step_measures_meanwhile(tmp_path, tracked):
    """Where the GPU holds them all (SharedServer.together_ok: 141 GB here, an H200's), the first
    server row releases every held server and waits for all of them: their GPU parts overlap each other, none
    overlaps a step, and the later server row only confirms. The step that needs LPM still runs on its server."""
    root = make_system(tmp_path, [exp("a", "wait"), exp("b", "other", ("default", "lpm")), exp("c", "ok")],
                       launcher_extra=("--sglang-log",), held=("default", "lpm"), lpm=True, gpu_gb=141,
                       extra_flags=["--mem-fraction-static", "0.8"])
    out = pipeline(root)
    assert out.returncode == 0, out.stdout + out.stderr
    u, t = used(out.stdout), ended(out.stdout)
    tracked += [pid for _how, pid in u.values()]
    assert u["wait"][1] == u["ok"][1] != u["other"][1]
    o = out.stdout
    assert re.search(r"server:default\s+with server:lpm: released together", o)
    assert re.search(r"server:lpm\s+ok, with server:default: ready", o)
    assert o.index("ok, with server:default") < o.index("[2/5] a ")                  # waited for before step a
    assert re.search(r"\[3/5\] server:lpm\s+ok  \(up since server:default's row\)", o)
    assert o.count("shared server 'lpm': starting on port") == 1 and "left behind" not in o    # the held one, once
    logs = root / SYS / "results" / "06_full_pipeline" / "logs"
    first = t["wait"]
    for name in ("default", "lpm"):
        log = logs / f"server-{name}.sglang.log"
        (held,), (freed,) = stamps(log, r"hands-on gate: holding"), stamps(log, r"hands-on gate: released after")
        gpu = stamps(log, r"Init torch distributed begin")[0]
        ready = stamps(log, r"The server is fired up")[0]
        assert held <= freed <= gpu < first and ready < first, (name, gpu, ready, first)   # all before step a ended
    steps = {r["step"]: r for r in rows_of(root, "steps.csv")}
    assert float(steps["server:lpm"]["seconds"]) == 0.0 and steps["server:lpm"]["status"] == "ok"
    starts = {r["server"]: r for r in rows_of(root, "server_starts.csv")}
    assert float(starts["shared server 'lpm'"]["waited_s"]) >= 0                    # its start, recorded as any
    assert not any(procs.alive(p) for _h, p in u.values()) and not shared_pidfiles(root)
    # a GPU that does not hold two (2 x 23 GB over 0.8 x 50 GB): one at a time, as before
    root2 = make_system(tmp_path / "small", [exp("a", "wait"), exp("b", "other", ("default", "lpm"))],
                        launcher_extra=("--sglang-log",), held=("default", "lpm"), lpm=True, gpu_gb=50,
                        extra_flags=["--mem-fraction-static", "0.8"])
    out2 = pipeline(root2)
    assert out2.returncode == 0 and "released together" not in out2.stdout, out2.stdout + out2.stderr
    tracked += [pid for _how, pid in used(out2.stdout).values()]


@pytest.mark.parametrize("how", ["killed-while-held", "cannot-start"])
def test_a_held_server_that_is_gone_at_its_row_is_started_anew_or_its_step_starts_its_own(tmp_path, tracked, how):
    """Killed while held: its row starts it anew (not held) and the step runs on it. A launcher that cannot start
    it at all: its row says so, the step starts a server of its own (as without the pipeline)."""
    bad = [sys.executable, "-c", "import sys; sys.exit(5)"] if how == "cannot-start" else None
    root = make_system(tmp_path, [exp("a", "ok"), exp("b", "other", ("default", "lpm"))], held=("lpm",), lpm=True,
                       lpm_launcher=bad)
    if how == "killed-while-held":           # step a kills the held server by its pidfile, as an OOM killer might
        (root / SYS / "scripts" / "kill_held.py").write_text(
            "import json, os, pathlib, signal, sys\n"
            f"d = pathlib.Path({str(root / 'cache' / 'servers' / '06_full_pipeline')!r})\n"
            "(p,) = d.glob('*-lpm.pid')\nos.killpg(json.loads(p.read_text())['pgid'], signal.SIGKILL)\n")
        sd = root / SYS / "scripts" / "_steps.py"
        sd.write_text(sd.read_text().replace('STEPS = [\n', 'STEPS = [\n    Step("kill", "kill_held.py"),\n'))
    out = pipeline(root)
    u = used(out.stdout)
    tracked += [pid for _how, pid in u.values()]
    if how == "killed-while-held":
        assert out.returncode == 0, out.stdout + out.stderr
        assert re.search(r"shared server 'lpm': gone while held \(exit code -9; log .*\); starting it anew", out.stdout)
        assert re.search(r"^\[\d/\d\] server:lpm\s+ok  in \d+s$", out.stdout, re.M) and u["other"][0] == "shared"
    else:
        assert out.returncode == 0, out.stdout + out.stderr
        assert re.search(r"^\[\d/\d\] server:lpm\s+failed  in \d+s$", out.stdout, re.M)
        assert "server:lpm: could not start (ServerError: shared server 'lpm' exited with code 5" in out.stdout
        assert u["other"][0] == "own"
    assert not any(procs.alive(p) for _h, p in u.values()) and not shared_pidfiles(root)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["ctrl-c", "sigterm", "sigkill"])
def test_a_held_server_goes_with_an_interrupted_pipeline_or_the_next_run(tmp_path, tracked, sig):
    """Ctrl-C or SIGTERM while a held server waits for its row: it is stopped with the run. SIGKILL: the next
    run (of any steps) finds it by its pidfile and stops it."""
    root = make_system(tmp_path, [exp("s", "sleep"), exp("never", "other", ("default", "lpm")),
                                  'Step("plain", "marker.py")'], held=("lpm",), lpm=True)
    p, server, step = _start_sleeping(root)
    (held,) = [json.loads(f.read_text())["pgid"] for f in shared_pidfiles(root) if f.name.endswith("-lpm.pid")]
    everything = family(server) + family(step) + family(held)
    tracked += everything
    assert procs.alive(held) and len(shared_pidfiles(root)) == 2
    if sig == signal.SIGKILL:
        p.kill()
        p.wait(10)
        os.killpg(step, signal.SIGKILL)
        # the held server's gate knows its holder (the runner): it closes, the held scheduler exits before it touches
        # the GPU and the launcher takes its tree down with it (sglang/scripts/_sgl_gate.py fails closed); the next
        # run finds and stops the default server, which no gate held
        assert procs.wait_gone(family(held), 20), "a held server outlived its killed holder"
        out = pipeline(root, "--only", "plain")
        assert out.returncode == 0, out.stdout + out.stderr
        assert re.search(r"found a process group left behind by a killed run \(\d+-default\.pid: pid ", out.stdout)
    else:
        p.send_signal(sig)
        p.wait(60)
        out = (root / "pipeline.out").read_text()
        assert p.returncode == 130 and "server:lpm: stopped in" in out, out       # by the runner, before its row
    assert procs.wait_gone(everything, 15), [q for q in everything if procs.alive(q)]
    assert not shared_pidfiles(root)


def _with_runner(root: Path, system: str) -> None:
    """<root>/<system>/scripts/06_full_pipeline.sh for a fake system (what `python -m common pipelines` runs)."""
    (root / system / "scripts" / "06_full_pipeline.sh").write_text(
        f'#!/usr/bin/env bash\ncd {str(REPO)!r}\nexec {sys.executable!r} -m common pipeline --root {str(root)!r} '
        f'--system {system} "$@"\n')


def test_make_quick_launches_a_later_pipelines_held_servers_at_the_start_and_lets_it_begin_at_its_turn(
        tmp_path, tracked):
    """`python -m common pipelines` (make quick): the SGLang-like pipeline, whose servers are held services, starts
    with the run: its servers import and wait at their gate while the pipeline before it runs, none touches the GPU
    before that pipeline has ended, its output comes after the earlier one's, and its own clock starts at its turn.
    HANDS_ON_EARLY=0: it starts only at its turn."""
    root = make_system(tmp_path, [exp("a", "ok")], launcher_extra=("--sglang-log",), held=("default",))
    write_fake_system(root, "first", ['Step("slow", "slow.py")'])
    (root / "first" / "scripts" / "slow.py").write_text(
        "import time\ntime.sleep(4)\nprint('FIRST_ENDED', time.time(), flush=True)\n")
    for s in ("first", SYS):
        _with_runner(root, s)
    out = subprocess.run([sys.executable, "-m", "common", "pipelines", "--quick", "--root", str(root), "first", SYS],
                         cwd=REPO, capture_output=True, text=True, timeout=180, env=env_for(root))
    assert out.returncode == 0, out.stdout + out.stderr
    o = out.stdout
    tracked += [pid for _how, pid in used(o).values()]
    first_end = float(re.search(r"^FIRST_ENDED ([\d.]+)$", o, re.M)[1])
    assert o.index("first pipeline --quick: ok") < o.index(f"{SYS} pipeline --quick:")     # in order
    assert "waiting for the pipelines before this one to end; its held servers (server:default) import" in o
    log = next((root / SYS / "results").rglob("server-default.sglang.log"))
    (held,), (freed,) = stamps(log, r"hands-on gate: holding"), stamps(log, r"hands-on gate: released after")
    gpu = stamps(log, r"Init torch distributed begin")[0]
    assert held < first_end < freed <= gpu, (held, first_end, freed, gpu)       # launched early, GPU at its turn
    summary = json.loads((root / SYS / "results" / "06_full_pipeline" / "summary.json").read_text())
    assert summary["duration_s"] < 60 and any("after its launch, when the pipelines before it had ended" in n
                                              for n in summary["notes"])
    assert not shared_pidfiles(root)
    late = subprocess.run([sys.executable, "-m", "common", "pipelines", "--quick", "--root", str(root), "first", SYS],
                          cwd=REPO, capture_output=True, text=True, timeout=180,
                          env={**env_for(root), "HANDS_ON_EARLY": "0"})
    assert late.returncode == 0 and "waiting for the pipelines" not in late.stdout, late.stdout + late.stderr
    tracked += [pid for _how, pid in used(late.stdout).values()]


def test_make_quick_starts_a_later_pipeline_without_servers_early_for_its_fork_server(tmp_path):
    """A later pipeline without held services (mini-SGLang's) is started with the run too: its fork server imports
    while the pipeline before it runs (its first step of a warm H200 run had waited 9-13 s for it), and it begins at
    its turn, its clock from then."""
    from kit import write_fake_system
    root = tmp_path / "root"
    write_fake_system(root, "first", ['Step("slow", "slow.py")'])
    (root / "first" / "scripts" / "slow.py").write_text("import time\ntime.sleep(3)\nprint('FIRST_ENDED', flush=True)\n")
    write_fake_system(root, "second", ['Step("a", "ok.py")'])
    for s in ("first", "second"):
        _with_runner(root, s)
    out = subprocess.run([sys.executable, "-m", "common", "pipelines", "--quick", "--root", str(root), "first",
                          "second"], cwd=REPO, capture_output=True, text=True, timeout=180, env=env_for(root))
    assert out.returncode == 0, out.stdout + out.stderr
    o = out.stdout
    assert o.index("FIRST_ENDED") < o.index("second pipeline --quick: ok")
    assert "waiting for the pipelines before this one to end; its fork server imports meanwhile" in o
    summary = json.loads((root / "second" / "results" / "06_full_pipeline" / "summary.json").read_text())
    assert any("after its launch, when the pipelines before it had ended; its fork server imported" in n
               for n in summary["notes"])
    assert summary["duration_s"] < 3                         # its clock started at its turn, not with the run


def test_servers_fit_together_by_their_own_memory_fraction_and_the_gpus_memory():
    """together_ok(n): n x 23 GB (one --quick server's measured footprint) within --mem-fraction-static x GPU memory;
    a server whose flags do not say its fraction is never released together."""
    sys.path.insert(0, str(SCRIPTS))
    from _sgl_shared import SharedServer

    def srv(frac, gb):
        fl = FLAGS + (["--mem-fraction-static", str(frac)] if frac else [])
        return SharedServer("x", model_path="m", flags=fl, gpu_gb=gb)
    assert srv(0.8, 141).together_ok(3) and not srv(0.8, 80).together_ok(3) and srv(0.8, 80).together_ok(2)
    assert not srv(0.4, 141).together_ok(3) and not srv(None, 141).together_ok(2)
