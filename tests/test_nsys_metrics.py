"""common.nsys.GpuMetrics: the GPU's own counters sampled over a served timeline (nsys --gpu-metrics-devices)."""
from common import nsys


def test_without_nsys_nothing_is_sampled_and_it_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(nsys, "find", lambda: None)
    with nsys.GpuMetrics(tmp_path) as gm:
        pass
    assert gm.rows is None and gm.t0 is None and "nsys is not usable" in gm.why
    assert not any(tmp_path.iterdir())                         # nothing started, nothing written
