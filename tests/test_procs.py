"""common.capture.procs: children in their own process group, stopped with their whole tree; free ports; pidfiles."""
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from common.capture import procs

ROOT = Path(__file__).resolve().parents[1]
# a parent that starts a grandchild in ANOTHER session (as a profiler may), then both sleep
TREE = textwrap.dedent("""
    import subprocess, sys, time
    kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    print("kid", kid.pid, flush=True)
    time.sleep(120)
""")


def _kid_pid(log: Path, timeout=20) -> int:
    t0 = time.time()
    while time.time() - t0 < timeout:
        for line in log.read_text().splitlines():
            if line.startswith("kid ") and line.split()[1].isdigit():
                return int(line.split()[1])
        time.sleep(0.05)
    raise AssertionError(f"no kid line in {log.read_text()!r}")


def test_free_port_is_chosen_by_the_os_and_differs():
    ports = {procs.free_port() for _ in range(5)}
    assert len(ports) >= 4 and all(1024 <= p <= 65535 for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert not procs.port_free("127.0.0.1", s.getsockname()[1])


def test_a_lasting_port_is_outside_the_oss_ephemeral_range_and_free(tmp_path):
    """A held server binds its port minutes after it was chosen: a lasting port is one the OS never hands out
    meanwhile (outside ip_local_port_range), and nothing listens on it."""
    lo, hi = procs.ephemeral_range()
    if lo - 10000 < 1000 and 65535 - hi < 1000:
        pytest.skip(f"this machine's ephemeral range {lo}-{hi} leaves no room outside it")
    ports = [procs.free_port(lasting=True) for _ in range(20)]
    assert all(not lo <= p <= hi and 10000 <= p <= 65535 for p in ports), (lo, hi, ports)
    assert all(procs.port_free("127.0.0.1", p) for p in ports) and len(set(ports)) >= 15
    f = tmp_path / "range"
    f.write_text("1024\t65000\n")
    assert procs.ephemeral_range(str(f)) == (1024, 65000)
    assert procs.ephemeral_range(str(tmp_path / "none")) == (32768, 60999)


def test_group_stops_the_whole_tree_even_a_grandchild_in_another_session(tmp_path):
    log = tmp_path / "tree.log"
    with procs.Group([sys.executable, "-c", TREE], log, name="tree") as g:
        kid = _kid_pid(log)
        parent = g.pid
        assert procs.alive(kid) and procs.alive(parent)
    assert not procs.alive(kid) and not procs.alive(parent)
    assert g.stop_report["left_over"] == []


def test_group_is_stopped_on_an_error_inside_the_block(tmp_path):
    log = tmp_path / "tree.log"
    with pytest.raises(ZeroDivisionError):
        with procs.Group([sys.executable, "-c", TREE], log) as g:
            kid = _kid_pid(log)
            1 / 0
    assert not procs.alive(kid) and g.stop_report["left_over"] == []


def test_sigterm_ignored_escalates_to_sigkill(tmp_path):
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('kid 0', flush=True); time.sleep(120)"
    g = procs.Group([sys.executable, "-c", code], tmp_path / "x.log", stop_timeout=1.0).start()
    pid = g.pid
    _kid_pid(tmp_path / "x.log")
    t0 = time.time()
    g.stop()
    assert not procs.alive(pid) and time.time() - t0 < 15


def test_run_tool_timeout_stops_the_group_and_names_the_log(tmp_path):
    log = tmp_path / "tool.log"
    with pytest.raises(procs.ProcError, match="did not finish within 2 s"):
        procs.run_tool([sys.executable, "-c", TREE], log, timeout=2, echo=lambda *a: None)
    assert not procs.alive(_kid_pid(log))
    assert procs.run_tool([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "rc.log", echo=lambda *a: None) == 3


def test_a_pidfile_left_by_a_killed_run_is_found_and_its_group_stopped(tmp_path):
    pidfile = tmp_path / "server.pid"
    # run A starts a server-like child and is then SIGKILLed: its Group never stops the child
    runner = textwrap.dedent(f"""
        import sys, time; sys.path.insert(0, {str(ROOT)!r})
        from common.capture import procs
        g = procs.Group([sys.executable, "-c", {TREE!r}], {str(tmp_path / 'a.log')!r}, pidfile={str(pidfile)!r}).start()
        print("started", g.pid, flush=True); time.sleep(120)
    """)
    a = subprocess.Popen([sys.executable, "-c", runner], stdout=subprocess.PIPE, text=True)
    server = int(a.stdout.readline().split()[1])
    kid = _kid_pid(tmp_path / "a.log")
    a.send_signal(signal.SIGKILL)
    a.wait(10)
    assert procs.alive(server) and pidfile.exists()              # left behind, as after a SIGKILL
    said = []
    stopped = procs.reap_stale(pidfile, echo=said.append)
    assert server in stopped and not procs.alive(server) and not pidfile.exists()
    assert "left behind by a killed run" in said[0]
    procs.stop_tree(kid, term_timeout=2)                          # the other-session grandchild is its own


def test_reap_leaves_a_live_owners_group_alone(tmp_path):
    pidfile = tmp_path / "server.pid"
    with procs.Group([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "x.log", pidfile=pidfile) as g:
        rec = pidfile.read_text()
        assert str(g.pid) in rec and str(os.getpid()) in rec
        # another run (a different owner pid would be alive): simulate by reaping from a child process
        code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from common.capture import procs; print(procs.reap_stale({str(pidfile)!r}))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30).stdout
        assert out.strip() == "[]" and g.alive()
    assert not pidfile.exists()


def test_nccl_policy_is_one_place():
    env, notes = procs.nccl_env({"NCCL_NVLS_ENABLE": "1"})
    assert env == procs.NCCL_OFF and "NCCL_NVLS_ENABLE=1 overridden to 0" in notes[0]
    env, notes = procs.nccl_env({"HANDS_ON_ALLOW_NVLS": "1", "NCCL_NVLS_ENABLE": "1"})
    assert env == {} and "left as they are" in notes[0]
    assert procs.nccl_env({})[1] == []


def test_timed_alone_times_each_part_alone_after_every_setup(tmp_path):
    """The setups (imports) run side by side; each timed part starts after all of them ended and never beside another
    timed part (mini-SGLang 00's fresh-process loads ran beside other processes' torch imports before)."""
    log = tmp_path / "stamps"
    w = f"import time\nwith open({str(log)!r}, 'a') as f: f.write('%s %r\\n' % ({{}}, time.time()))"
    setup = "import time\ntime.sleep(1.0)\n" + w.replace("{}", "'S'")
    timed = w.replace("{}", "'A'") + "\ntime.sleep(0.25)\n" + w.replace("{}", "'B'")
    got = procs.timed_alone(setup, timed, 3)
    stamps = [(k, float(v)) for k, v in (line.split() for line in log.read_text().splitlines())]
    setups = [t for k, t in stamps if k == "S"]
    spans = sorted(zip([t for k, t in stamps if k == "A"], [t for k, t in stamps if k == "B"]))
    assert len(setups) == 3 and len(spans) == 3 and all(g is not None and 0.25 <= g < 1.0 for g in got), (got, stamps)
    assert min(a for a, _b in spans) >= max(setups)                                   # after every setup
    assert all(b1 <= a2 for (_a1, b1), (a2, _b2) in zip(spans, spans[1:]))            # one at a time
    assert max(setups) - min(setups) < 1.0                                             # side by side


def test_timed_alone_says_none_for_a_process_that_fails(tmp_path):
    assert procs.timed_alone("raise SystemExit(3)", "pass", 2) == [None, None]
    assert procs.timed_alone("pass", "raise ValueError('x')", 2) == [None, None]
    assert procs.timed_alone("import time", "time.sleep(5)", 1, timeout=1.0) == [None]
