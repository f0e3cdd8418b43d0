"""common.tables.ncu_pass, the one ncu pass of FlashInfer's and mini-SGLang's sweeps: the child's arguments and loop,
and the parent's table on real ncu output: tests/fixtures/ncu_raw_l2_resident_vs_dram_h100_cache-all.csv (an H100
probe, a marker kernel before each of its 10 points: RMSNorm and fused add+RMSNorm on 256 and 65,536 tokens,
act_and_mul on 32 and 8,192, a decode GEMV on a 4096-row weight twice (split-K: two kernels) and a 28,672-row one twice).
"""
import contextlib
import gc
import sys
import types
import weakref
from pathlib import Path

import pytest

from common.capture import ncu, ranges
from common.tables import kernels, ncu_pass

POINTS = ([{"op": op, "tokens": t} for t in (256, 65536) for op in ("rmsnorm", "fused_add_rmsnorm")]
          + [{"op": "silu_and_mul", "tokens": t} for t in (32, 8192)]
          + [{"op": "gemv", "weight_rows": n, "rep": r} for n in (4096, 28672) for r in (0, 1)])


def test_the_childs_arguments():
    argv = ["--quick", "--ncu", "--nsys", "--out", "/tmp/x", "--batches", "32", "--out=/y", "--variants", "cuda"]
    assert ncu_pass.own_argv(argv) == ["--quick", "--batches", "32", "--variants", "cuda"] and ncu_pass.own_argv([]) == []
    a = types.SimpleNamespace(quick=True, rows=["2048", "256"], model="llama-3.1-8b", prompt_len=512, ncu=False, tokens=None)
    assert ncu_pass.argv_of(a, ("quick", "rows", "model", "prompt_len", "ncu", "tokens")) == \
        ["--quick", "--rows", "2048,256", "--model", "llama-3.1-8b", "--prompt-len", "512"]
    assert ncu_pass.target_cmd("x.py", ["-q"], "--nsys-target") == [sys.executable, str(Path("x.py").resolve()),
                                                                    "--nsys-target", "-q"]


@pytest.fixture
def calls(monkeypatch):
    """What the loop does to torch, in order: the marker kernel, synchronize, empty_cache (and what the test adds)."""
    out = []
    cuda = types.SimpleNamespace(_sleep=lambda n: out.append("mark"), synchronize=lambda: out.append("sync"),
                                 empty_cache=lambda: out.append("empty_cache"))
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(ranges, "nvtx_range", lambda name: contextlib.nullcontext())
    return out


def test_the_child_marks_each_point_and_drops_its_buffers_before_the_next(calls, capsys):
    """FlashInfer's children: an 'ncu-target: point i/n' line before each marker (in CSV mode ncu writes nothing until
    the application ends: this line is a long profile's heartbeat); a point's buffers (its closure holds them as well
    as keep) gone and handed back to the driver before the next point allocates (memory torch keeps cached is still
    allocated for ncu, which saves and restores it around every replay pass: the largest decode KV cache is 34 GB); a
    failed point is one [ERROR] line and the next point keeps its own index."""
    alive = []

    class Buf:
        pass

    def make(p):
        gc.collect()
        calls.append(("make", p, [r() is not None for r in alive]))
        if p == 1:
            raise RuntimeError("out of memory")
        buf = Buf()
        alive.append(weakref.ref(buf))
        return (lambda: calls.append(("run", p, id(buf)))), {"t": buf}
    assert ncu_pass.run_points(sys.modules["torch"], [0, 1, 2], make, lambda p: f"point {p}") == 0
    said = capsys.readouterr()
    assert [ln for ln in said.out.splitlines() if ln.startswith("ncu-target")] == [
        "ncu-target: point 1/3: point 0", "ncu-target: point 2/3: point 1", "ncu-target: point 3/3: point 2"]
    assert said.err.splitlines() == ["[ERROR] 1 -> RuntimeError: out of memory"]
    assert [c for c in calls if c[0] == "make"] == [("make", 0, []), ("make", 1, [False]), ("make", 2, [False])]
    assert [c if isinstance(c, str) else c[0] for c in calls] == ["mark", "make", "run", "sync", "empty_cache"] + \
        ["mark", "make", "empty_cache"] + ["mark", "make", "run", "sync", "empty_cache"]


def test_a_warmed_up_child_runs_every_call_before_the_first_marker(calls):
    """mini-SGLang's children: every call made and run once before the first marker (JIT loads, first touch), then each
    point's marker and its call; a call that fails in the warm-up ends the child before any marker."""
    made = lambda p: ((lambda: calls.append(p)), None)  # noqa: E731
    assert ncu_pass.run_points(sys.modules["torch"], ["a", "b"], made, str.upper, warm_up=True) == 0
    assert calls == ["a", "b", "sync"] + ["mark", "a", "sync", "empty_cache", "mark", "b", "sync", "empty_cache"]
    calls.clear()
    with pytest.raises(ZeroDivisionError):
        ncu_pass.run_points(sys.modules["torch"], ["a"], lambda p: ((lambda: 1 / 0), None), str, warm_up=True)
    assert "mark" not in calls


@pytest.fixture
def profile(fixture_path, monkeypatch, tmp_path):
    """profile_points over the real CSV, with the rows ``warm`` copied before the first marker (a warmed-up child's):
    (rows, raw, the ncu call's arguments, the run's notes)."""
    import pandas as pd
    from test_kernels import H100                  # the ceilings that H100 measured

    def run_pass(warm=(), drop=(), **kw):
        real, seen, notes = ncu.read_raw(fixture_path("ncu_raw_l2_resident_vs_dram_h100_cache-all.csv")), {}, []
        df = pd.concat([real.iloc[list(warm)], real], ignore_index=True).drop(columns=list(drop)).copy()
        df.attrs = real.attrs

        def fake(app, out, **k):
            seen.update(app=app, **k)
            return types.SimpleNamespace(df=df)
        monkeypatch.setattr(ncu, "profile", fake)
        run = types.SimpleNamespace(dir=tmp_path, log=print, note=notes.append)
        return (*ncu_pass.profile_points(run, "x.py", ["-q"], "Norm|act|nvjet|splitK", POINTS, H100, **kw), seen, notes)
    return run_pass


def test_every_launch_carries_the_fields_of_its_point(profile):
    rows, raw, seen, notes = profile()
    assert len(rows) == len(raw) == 12 and ncu.MARKER_KERNEL not in set(rows["kernel"]) and notes == []
    assert list(rows["point"]) == [0, 1, 2, 3, 4, 5, 6, 6, 7, 7, 8, 9]            # a split-K GEMV point: two kernels
    fused = rows[rows["op"] == "fused_add_rmsnorm"]
    assert list(fused["tokens"]) == [256, 65536] and set(fused["kernel"]) == {"FusedAddRMSNormKernel"}
    # 256 tokens x 4096 x 2 B, the input and the residual read once (4.19 MB), plus the 8 KB weight
    assert fused["dram_read_mb"].iloc[0] == pytest.approx(2 * 256 * 4096 * 2 / 1e6 + 4096 * 2 / 1e6, abs=0.05)
    assert fused["dram_read_mb"].iloc[1] > 1000
    big = rows[rows["weight_rows"] == 28672]                                       # 28,672 x 4096 x 2 B = 235 MB
    assert list(big["rep"]) == [0, 1] and (big["dram_read_mb"] > 230).all() and "stall_note" in rows
    assert seen["app"] == [sys.executable, str(Path("x.py").resolve()), "--ncu-target", "-q"]
    assert (seen["kernel"], seen["cache_control"], seen["timeout"]) == ("Norm|act|nvjet|splitK|spin_kernel", "all", 900)
    assert seen["metrics"] == kernels.SUMMARY_METRICS


def test_launches_before_the_first_marker_belong_to_no_point(profile):
    """A warmed-up child's launches before the first marker are left out: the n-th launch of a kernel counts from the
    first point on, as in the table of a child without a warm-up."""
    warm, raw, _, _ = profile(warm=(1, 3, 5))
    assert len(raw) == 12 and (raw["point"] >= 0).all() and warm.drop(columns="id").equals(profile()[0].drop(columns="id"))


def test_the_pass_takes_its_metrics_timeout_and_caches_and_names_what_is_missing(profile):
    rows, raw, seen, notes = profile(metrics=["a.sum"], timeout=1200, cache_control="none", drop=["dram__bytes_write.sum"])
    assert (seen["metrics"], seen["timeout"], seen["cache_control"]) == (["a.sum"], 1200, "none")
    assert rows["dram_write_mb"].isna().all() and notes == ["the ncu CSV lacks dram__bytes_write.sum: those columns are empty"]
