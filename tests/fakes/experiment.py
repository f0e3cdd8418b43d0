"""A numbered-script stand-in for the fault tests (tests/test_faults.py): the same skeleton as every
experiment -- common.base.checks.run_main around a main() that writes a common.run.results.Run, optionally with
a (fake) SGLang server from sglang/scripts/_sglang.py -- with the fault chosen on the command line.

    python tests/fakes/experiment.py --out DIR [--files a.csv,b.txt] [--fail MSG] [--import MODULE]
        [--server [--server-arg=--die-after=0.3 ...] [--port N]] [--ready] [--hold S] [--inject FAULT]

--files      files this run writes (besides log.txt and summary.json); their content names the run (--tag)
--big MB     also write big.bin of MB megabytes first (a run's large files: traces, a recording's copies)
--fail MSG   raise RuntimeError(MSG) once the files are written (an experiment that fails)
--import M   ``import M`` inside main (a package that may be missing)
--server     start tests/sglang_fake_server.py through _sglang.Server (its own process group, a port the
             OS chose unless --port, the default pidfile under $HANDS_ON_CACHE/servers/experiment/)
--ready      print ``READY <server pid> <port>`` (or ``READY 0 0``) once running, then --hold seconds
--gate       08's counters server: the fake server with a gated scheduler (--gated-scheduler), launched with
             an _sgl_gate.Gate held by this run; --hold seconds of "measurements" (READY printed before them),
             then gate.release(srv), srv.wait_ready(), gate.verify(srv) as 08_execution_story.py does
--inject F   enospc-table (ENOSPC writing a table), enospc-finish (ENOSPC writing summary.json),
             eio-replace (EIO on the final rename), die-between-renames (os._exit(137) between the
             two renames of finish, as a SIGKILL there would), eperm-previous (EPERM moving the old run
             to .previous/, as for an immutable folder), fixed-stamp (every time stamp the same),
             gate-unloaded (--gate without the plugin on the server's PYTHONPATH: SGLang would not load it),
             failed-budget-3mb (store.KEEP_FAILED_BYTES = 3 MiB: the failed records' byte bound, small)
Every wait is bounded; the fake server exits on its own after 120 s.
"""
import argparse
import errno
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from common.base.checks import run_main  # noqa: E402
from common.capture import store  # noqa: E402
from common.run import results  # noqa: E402

FAKE_SERVER = REPO / "tests" / "sglang_fake_server.py"


def inject(fault: str) -> None:
    """Replace one file-system call of common.run.results by one that fails the way ``fault`` says."""
    real_write, real_rename = store.write_json_atomic, os.rename
    if fault == "enospc-table":
        def write_csv(p, rows):
            raise OSError(errno.ENOSPC, "No space left on device")
        store._write_csv = write_csv
        sys.modules["pandas"] = None          # Run.table then writes through _write_csv
    elif fault == "enospc-finish":
        def write_json(p, data):
            if ".partial-" in str(p) and Path(p).name == "summary.json":
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_write(p, data)
        store.write_json_atomic = write_json
    elif fault in ("eio-replace", "die-between-renames"):
        def rename(src, dst):
            if Path(src).name.startswith(".partial-") and not Path(dst).parent.name.startswith("."):
                if fault == "die-between-renames":
                    os._exit(137)
                raise OSError(errno.EIO, "Input/output error")
            return real_rename(src, dst)
        store.os.rename = rename
    elif fault == "eperm-previous":          # the old run cannot be moved (chattr +i)
        def rename(src, dst):
            if Path(dst).parent.name == ".previous" and not Path(src).name.startswith("."):
                raise OSError(errno.EPERM, "Operation not permitted")
            return real_rename(src, dst)
        store.os.rename = rename
    elif fault == "fixed-stamp":              # every time stamp the same: runs at once collide on names
        store._stamp = lambda: "20260101-000000-000000"
    elif fault == "failed-budget-3mb":
        store.KEEP_FAILED_BYTES = 3 * 2**20
    elif fault and fault != "gate-unloaded":
        raise SystemExit(f"unknown --inject {fault!r}")


def gated(run, a) -> None:
    """08's counters server, held by its gate while the run "measures" (--hold), then released and verified."""
    sys.path.insert(0, str(REPO / "sglang" / "scripts"))
    import _sglang as sg
    gate = sg.Gate(run.dir / "gate")
    env = gate.env()
    if a.inject == "gate-unloaded":
        env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    srv = sg.Server("dummy-model", ["--gated-scheduler"], log_path=run.path("server.log"), port=a.port, env=env,
                    start_timeout=a.start_timeout, stop_timeout=3, launcher=[sys.executable, str(FAKE_SERVER)],
                    echo=run.log, name="server[gated]")
    try:
        srv.launch()
        if a.ready:
            print(f"READY {srv.group.pid} {srv.port}", flush=True)
        time.sleep(a.hold)                          # the stories' measurements, while the server is held
        gate.release(srv)
        srv.wait_ready()
        run.log(f"server held {gate.verify(srv):.1f} s by its gate")
        srv.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})
    finally:
        srv.stop()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="experiment.py")
    p.add_argument("--out", required=True)
    p.add_argument("--tag", default="run")
    p.add_argument("--files", default="table.csv")
    p.add_argument("--big", type=float, default=0)
    p.add_argument("--fail", default=None)
    p.add_argument("--import", dest="module", default=None)
    p.add_argument("--server", action="store_true")
    p.add_argument("--server-arg", action="append", default=[])
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--start-timeout", type=float, default=30)
    p.add_argument("--ready", action="store_true")
    p.add_argument("--hold", type=float, default=0)
    p.add_argument("--gate", action="store_true")
    p.add_argument("--inject", default="")
    a = p.parse_args(argv)
    inject(a.inject)
    with results.Run(__file__, vars(a), out=a.out, quiet=True) as run:
        if a.module:
            __import__(a.module)
        if a.big:
            run.path("big.bin").write_bytes(os.urandom(int(a.big * 2**20)))
        for name in filter(None, a.files.split(",")):
            if name.endswith(".csv"):
                run.table(name[:-4], [{"run": a.tag, "value": 1}])
            else:
                run.path(name).write_text(f"{a.tag}\n")
        run.headline(tag=a.tag)
        if a.fail:
            raise RuntimeError(a.fail)
        if a.gate:
            gated(run, a)
        elif a.server:
            sys.path.insert(0, str(REPO / "sglang" / "scripts"))
            import _sglang as sg
            flags = [x for arg in a.server_arg for x in arg.split("=", 1)]
            with sg.Server("dummy-model", flags, log_path=run.path("server.log"), port=a.port, start_timeout=a.start_timeout,
                           stop_timeout=3, launcher=[sys.executable, str(FAKE_SERVER)], echo=run.log) as srv:
                srv.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})   # the server answers
                if a.ready:
                    print(f"READY {srv.group.pid} {srv.port}", flush=True)
                time.sleep(a.hold)
        elif a.ready:
            print("READY 0 0", flush=True)
            time.sleep(a.hold)
    return 0


if __name__ == "__main__":
    run_main(main)
