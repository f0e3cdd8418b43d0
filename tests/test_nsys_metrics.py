"""common.capture.nsys.GpuMetrics: the GPU's own counters sampled over a served timeline (nsys --gpu-metrics-devices)."""
from common.capture import nsys


def test_without_nsys_nothing_is_sampled_and_it_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(nsys, "find", lambda: None)
    with nsys.GpuMetrics(tmp_path) as gm:
        pass
    assert gm.rows is None and gm.t0 is None and "nsys is not usable" in gm.why
    assert not any(tmp_path.iterdir())                         # nothing started, nothing written


FAKE_NSYS = """#!/usr/bin/env python3
# stands in for `nsys profile ... APP`: like the real one writing to a file, its own lines ('Collecting data...')
# reach the file only when it exits; it starts APP once sampling begins, and stops it on SIGTERM
import os, signal, subprocess, sys, time
said = b"GPU 0: General Metrics for NVIDIA GH100 (any frequency)\\nCollecting data...\\n"
time.sleep(1.0)
app = subprocess.Popen(sys.argv[sys.argv.index("--gpu-metrics-frequency=10000") + 1:])
def end(*a):
    app.terminate()
    app.wait()
    os.write(1, said + b"Generated: report\\n")
    os._exit(0)
signal.signal(signal.SIGTERM, end)
app.wait()
end()
"""


def test_sampling_is_seen_to_start_when_nsys_keeps_its_output_in_a_buffer(tmp_path, monkeypatch):
    """On the H200 and the H100 (2026-11-25) the real nsys wrote 'Collecting data...' only at its exit (stdout to a
    file is block-buffered), so a wait on that line gave up after 60 s and no counters were sampled. The stand-in
    application it starts is the sign that sampling began."""
    import time
    exe = tmp_path / "nsys"
    exe.write_text(FAKE_NSYS)
    exe.chmod(0o755)
    monkeypatch.setattr(nsys, "find", lambda: str(exe))
    monkeypatch.setattr(nsys, "read_gpu_metrics", lambda p: "rows")
    monkeypatch.setattr(nsys, "export_sqlite", lambda rep: rep)
    t = time.time()
    with nsys.GpuMetrics(tmp_path / "gm", max_s=30) as gm:
        assert gm.t0 is not None and gm.why == ""                  # started, seen without the buffered line
    assert time.time() - t < 20                                    # not the 60 s give-up
    assert gm.rows == "rows" and gm.t1 >= gm.t0
