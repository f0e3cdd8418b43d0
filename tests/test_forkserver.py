"""common.run.forkserver: the pipeline's Python steps forked from one process that imported the heavy modules once.

A step must behave as ``python script.py ...`` would: exit code, output in its log, environment, working directory,
argv, sys.path[0] (its scripts folder), atexit handlers and non-daemon threads, its own process group (stopped as a
tree), and CUDA never initialised before the fork. These run on CPU with stand-in preloads (a module the test
writes), so that each check can fail: the "forked" check fails when steps run as fresh processes (shown below).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.capture import procs
from common.run import forkserver
from common.run.forkserver import ForkGroup, ForkServer, step_script

REPO = Path(__file__).resolve().parents[1]

PRELOAD_SRC = "import os\nLOADED_BY = os.getpid()\n"
THREADS_SRC = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"

STEP_SRC = r'''
import atexit, json, os, sys, threading, time
import helper                                    # a module beside the script: sys.path[0] is its folder
out = {"argv": sys.argv[1:], "cwd": os.getcwd(), "env": os.environ.get("FS_TEST"), "name": __name__,
       "helper": helper.X, "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
       "preloaded": "fs_preload" in sys.modules, "extras": sorted(m for m in sys.modules if m.startswith("fs_x"))}
if "fs_preload" in sys.modules:
    out["loaded_by"] = sys.modules["fs_preload"].LOADED_BY
atexit.register(lambda: print("atexit ran", flush=True))
def late():
    time.sleep(0.3)
    print("thread finished", flush=True)
threading.Thread(target=late).start()            # non-daemon: the interpreter waits for it, as python would
print(json.dumps(out), flush=True)
print("to stderr", file=sys.stderr, flush=True)
mode = sys.argv[1] if len(sys.argv) > 1 else ""
if mode == "code":
    sys.exit(3)
if mode == "text":
    sys.exit("a one-line reason")
if mode == "raise":
    raise ValueError("boom")
if mode == "sleep":
    time.sleep(60)
'''


@pytest.fixture()
def world(tmp_path):
    scripts = tmp_path / "sys" / "scripts"
    scripts.mkdir(parents=True)
    (scripts / "NN_step.py").write_text(STEP_SRC)
    (scripts / "helper.py").write_text("X = 42\n")
    pre = tmp_path / "pre"
    pre.mkdir()
    (pre / "fs_preload.py").write_text(PRELOAD_SRC)
    (pre / "fs_threads.py").write_text(THREADS_SRC)
    (pre / "fs_x_ok.py").write_text(PRELOAD_SRC)
    (pre / "fs_x_after.py").write_text(PRELOAD_SRC)
    (pre / "fs_x_threads.py").write_text(THREADS_SRC)
    (pre / "fs_slow.py").write_text(PRELOAD_SRC + "import time\ntime.sleep(4)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(pre)]), "PYTHONUNBUFFERED": "1",
           "HANDS_ON_PRELOAD": "fs_preload,not_a_module_xyz", "HANDS_ON_PRELOAD_EXTRA": ""}
    return tmp_path, scripts / "NN_step.py", env


def _server(tmp_path, env) -> ForkServer:
    return ForkServer(env=env, log=tmp_path / "forkserver.log").start()


def _run(server, script, args, tmp_path, env, name="step"):
    log = tmp_path / f"{name}.log"
    g = ForkGroup(server, [sys.executable, str(script), *args], log, env={**env, "FS_TEST": "yes"}, cwd=tmp_path,
                  name=name, echo=lambda m: None)
    g.start()
    rc = g.wait(60)
    g.stop()
    text = log.read_text()
    info = json.loads(next(line for line in text.splitlines() if line.startswith("{")))
    return rc, text, info


def test_a_forked_step_behaves_as_python_script_would(world):
    tmp_path, script, env = world
    server = _server(tmp_path, env)
    try:
        rc, text, info = _run(server, script, ["a", "--b", "c d"], tmp_path, env)
        assert server.why is None and server.ready["preloaded"] == ["fs_preload"]
        assert server.ready["missing"][0].startswith("not_a_module_xyz")
        assert rc == 0
        assert info["argv"] == ["a", "--b", "c d"] and info["cwd"] == str(tmp_path) and info["env"] == "yes"
        assert info["name"] == "__main__" and info["helper"] == 42
        assert info["pgid"] == info["pid"] == info["sid"]           # its own session and group, as Group gives
        # forked: the preloaded module is there without being imported, loaded by the server (another pid)
        assert info["preloaded"] and info["loaded_by"] == server.proc.pid != info["pid"]
        assert "to stderr" in text and "thread finished" in text and text.rstrip().endswith("atexit ran")
        assert _run(server, script, ["code"], tmp_path, env, "c")[0] == 3
        rc, text, _ = _run(server, script, ["text"], tmp_path, env, "t")
        assert rc == 1 and "a one-line reason" in text
        rc, text, _ = _run(server, script, ["raise"], tmp_path, env, "r")
        assert rc == 1 and "ValueError: boom" in text and "Traceback" in text
    finally:
        server.close()
    assert server.proc is None


def test_the_forked_check_fails_for_a_fresh_process(world):
    """The guard above proves a fork: a fresh python (what steps were before) has not loaded the preload."""
    tmp_path, script, env = world
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60)
    info = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("{")))
    assert out.returncode == 0 and not info["preloaded"]


def test_stopping_a_forked_step_stops_its_tree(world):
    tmp_path, script, env = world
    server = _server(tmp_path, env)
    try:
        log = tmp_path / "s.log"
        g = ForkGroup(server, [sys.executable, str(script), "sleep"], log, env=env, cwd=tmp_path, name="s",
                      echo=lambda m: None, stop_timeout=5)
        g.start()
        deadline = time.time() + 30
        while "{" not in log.read_text() and time.time() < deadline:
            time.sleep(0.1)
        pid = g.pid
        assert procs.alive(pid)
        report = g.stop()
        assert not procs.alive(pid) and report["returncode"] == -signal.SIGTERM and not report["left_over"]
    finally:
        server.close()


def test_a_server_that_cannot_fork_safely_is_not_used(world):
    """A preload that starts a thread (as one that initialised CUDA would be refused): the step runs fresh."""
    tmp_path, script, env = world
    env = {**env, "HANDS_ON_PRELOAD": "fs_preload,fs_threads"}
    server = _server(tmp_path, env)
    try:
        rc, _, info = _run(server, script, [], tmp_path, env)
        assert rc == 0 and not info["preloaded"]                   # a fresh process ran it
        assert server.why and "threads" in server.why
    finally:
        server.close()


def test_which_steps_it_runs():
    assert step_script([sys.executable, "/x/sglang/scripts/01_baseline_perf.py", "--quick"])
    assert not step_script([sys.executable, "-m", "common", "jit"])
    assert not step_script(["bash", "/x/02_ncu.sh"])
    assert not step_script(["/other/python", "/x/01.py"])


def test_a_pipeline_runs_its_steps_through_the_server_and_without_it(tmp_path):
    from kit import write_fake_system
    write_fake_system(tmp_path, "fakesys", ['Step("a", "ok.py")', 'Step("b", "ok.py")'])

    def run(extra):
        return subprocess.run([sys.executable, "-m", "common", "pipeline", "--root", str(tmp_path), "--system",
                               "fakesys", "--no-warmup"], cwd=REPO, capture_output=True, text=True, timeout=120,
                              env={**os.environ, **extra})
    on = run({})
    assert on.returncode == 0, on.stdout + on.stderr
    assert "fork server: not used" not in on.stdout
    logs = tmp_path / "fakesys" / "results" / "06_full_pipeline" / "logs"
    assert (logs / "forkserver.log").exists() and "fork server ready after" in (logs / "forkserver.log").read_text()
    assert not list((tmp_path / "fakesys" / "results").glob(".forkserver-*"))   # started before the run's folder
    off = run({"HANDS_ON_FORKSERVER": "0"})
    assert off.returncode == 0 and not (logs / "forkserver.log").exists()


def test_an_optional_preload_that_is_unsafe_is_dropped_and_the_server_still_forks(world):
    """HANDS_ON_PRELOAD_EXTRA: tried one by one after the base list; one that starts a thread (or initialises CUDA)
    cannot be undone in that process, so the server starts over (exec, same pid and pipes) without it and the ones
    after it, says which in its ready line, and forks the steps with the extras that were safe."""
    tmp_path, script, env = world
    env = {**env, "HANDS_ON_PRELOAD_EXTRA": "fs_x_ok,fs_x_threads,fs_x_after"}
    server = _server(tmp_path, env)
    try:
        rc, _, info = _run(server, script, [], tmp_path, env)
        assert rc == 0 and server.why is None
        assert info["preloaded"] and info["loaded_by"] == server.proc.pid       # forked from the restarted server
        assert info["extras"] == ["fs_x_ok"]
        assert server.ready["preloaded"] == ["fs_preload", "fs_x_ok"]
        assert server.ready["dropped"].startswith("fs_x_threads (") and "threads" in server.ready["dropped"]
    finally:
        server.close()
    ok = _server(tmp_path, {**env, "HANDS_ON_PRELOAD_EXTRA": "fs_x_ok,fs_x_after"})
    try:
        rc, _, info = _run(ok, script, [], tmp_path, env, name="step2")
        assert rc == 0 and info["extras"] == ["fs_x_after", "fs_x_ok"] and "dropped" not in ok.ready
    finally:
        ok.close()


def test_a_step_does_not_wait_for_a_server_still_importing(world, capsys):
    """A warm run's first step came 9-13 s before its fork server had imported torch and the rest (H200,
    2026-11-28): it runs as a fresh process then, and says so; once the server is ready the next step is forked, and
    the server's log says what it preloaded."""
    from common.run.pipeline import run_child
    tmp_path, script, env = world
    env = {**env, "HANDS_ON_PRELOAD": "fs_preload,fs_slow"}
    server = _server(tmp_path, env)
    try:
        assert server.ready_now() is None
        t0 = time.monotonic()
        rc, interrupted = run_child([sys.executable, str(script)], tmp_path / "a.log", tmp_path, env, "a", server)
        took = time.monotonic() - t0
        assert rc == 0 and not interrupted and took < 3.5, took                  # did not wait for the 4 s import
        first = json.loads(next(x for x in (tmp_path / "a.log").read_text().splitlines() if x.startswith("{")))
        assert not first["preloaded"]
        assert "a: runs as a fresh process (the fork server is still importing)" in capsys.readouterr().out
        assert server._wait_ready() is True and server.ready_now() is True
        rc, _ = run_child([sys.executable, str(script)], tmp_path / "b.log", tmp_path, env, "b", server)
        second = json.loads(next(x for x in (tmp_path / "b.log").read_text().splitlines() if x.startswith("{")))
        assert rc == 0 and second["preloaded"] and second["loaded_by"] == server.proc.pid
        said = (tmp_path / "forkserver.log").read_text()
        assert "fork server ready after" in said and "preloaded fs_preload, fs_slow" in said
    finally:
        server.close()

