"""common.tables.ncu_pass, the one ncu pass of FlashInfer's and mini-SGLang's sweeps: the child's loop and arguments,
and the parent's table on real Nsight Compute output.

tests/fixtures/ncu_raw_l2_resident_vs_dram_h100_cache-all.csv (tests/fixtures/README.md): a probe run on an H100
under ncu with the caches flushed before each pass, a marker kernel (torch.cuda._sleep) before each of its 10 points:
RMSNorm and fused add+RMSNorm on 256 and 65,536 tokens x 4096, act_and_mul on 32 and 8,192 tokens, a decode GEMV
against a 4096 x 4096 weight twice (cuBLAS splits K: two kernels a point) and a 28,672 x 4096 weight twice.
"""
import contextlib
import gc
import sys
import types
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest

from common.capture import ncu, ranges
from common.tables import kernels, ncu_pass

RAW = "ncu_raw_l2_resident_vs_dram_h100_cache-all.csv"
H100 = {"dram_tb_s": 3.30, "dram_read_tb_s": 3.16, "dram_write_tb_s": 3.30, "dram_copy_tb_s": 3.02,
        "dram_mixed_tb_s": 3.08, "l2_mb": 50.0, "bf16_tflops": 804.0}      # as in tests/test_kernels.py
POINTS = ([{"op": op, "tokens": t} for t in (256, 65536) for op in ("rmsnorm", "fused_add_rmsnorm")]
          + [{"op": "silu_and_mul", "tokens": t} for t in (32, 8192)]
          + [{"op": "gemv", "weight_rows": n, "rep": r} for n in (4096, 28672) for r in (0, 1)])


# ------------------------------------------------------------------ the child: its arguments and its loop

def test_own_argv_drops_what_would_recurse_or_move_the_results():
    argv = ["--quick", "--ncu", "--nsys", "--out", "/tmp/x", "--batches", "32", "--out=/y", "--variants", "cuda"]
    assert ncu_pass.own_argv(argv) == ["--quick", "--batches", "32", "--variants", "cuda"]
    assert ncu_pass.own_argv([]) == []


def test_argv_of_rebuilds_the_childs_points():
    a = SimpleNamespace(quick=True, rows=["2048", "256"], model="llama-3.1-8b", prompt_len=512, ncu=False, tokens=None)
    assert ncu_pass.argv_of(a, ("quick", "rows", "model", "prompt_len", "ncu", "tokens")) == \
        ["--quick", "--rows", "2048,256", "--model", "llama-3.1-8b", "--prompt-len", "512"]
    assert ncu_pass.target_cmd("x.py", ["--quick"], "--nsys-target") == [sys.executable, str(Path("x.py").resolve()),
                                                                         "--nsys-target", "--quick"]


@pytest.fixture
def fake_torch(monkeypatch):
    """torch as the loop sees it, each call it makes appended to ``calls``: the marker kernel, synchronize, empty_cache."""
    calls = []
    cuda = types.SimpleNamespace(_sleep=lambda n: calls.append("mark"), synchronize=lambda: calls.append("sync"),
                                 empty_cache=lambda: calls.append("empty_cache"))
    fake = types.SimpleNamespace(cuda=cuda, calls=calls)
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(ranges, "nvtx_range", lambda name: contextlib.nullcontext())
    return fake


def test_the_child_says_each_point_and_drops_its_buffers_before_the_next(fake_torch, capsys):
    """FlashInfer's children: one 'ncu-target: point i/n' line per point before its marker kernel (in CSV mode ncu
    writes nothing until the application ends, so this line is what a long profile's heartbeat shows), and a point's
    buffers (held by its closure as well as by keep) are gone, and handed back to the driver, before the next point
    allocates its own: the sweep's largest decode KV cache is 34 GB, and memory torch keeps cached is still allocated
    for ncu, which saves and restores it around every replay pass (in host memory when an 80 GB H100 has no room
    left beside the parent's). A point that fails is one [ERROR] line; the next point still gets its own index."""
    calls = fake_torch.calls

    class Buf:
        pass
    alive = []

    def make(p):
        gc.collect()
        calls.append(("make", p["n"], [r() is not None for r in alive]))
        if p["n"] == 1:
            raise RuntimeError("out of memory")
        buf = Buf()
        alive.append(weakref.ref(buf))
        return (lambda: calls.append(("run", p["n"], id(buf)))), {"t": buf}
    assert ncu_pass.run_points(fake_torch, [{"n": 0}, {"n": 1}, {"n": 2}], make, lambda p: f"point {p['n']}") == 0
    said = capsys.readouterr()
    assert [ln for ln in said.out.splitlines() if ln.startswith("ncu-target")] == [
        "ncu-target: point 1/3: point 0", "ncu-target: point 2/3: point 1", "ncu-target: point 3/3: point 2"]
    assert said.err.splitlines() == ["[ERROR] {'n': 1} -> RuntimeError: out of memory"]
    assert [c[:3] for c in calls if c[0] == "make"] == [("make", 0, []), ("make", 1, [False]), ("make", 2, [False])]
    # and handed back to the driver: a cached block is still allocated for ncu's save/restore
    assert [c if isinstance(c, str) else c[0] for c in calls] == [
        "mark", "make", "run", "sync", "empty_cache", "mark", "make", "empty_cache", "mark", "make", "run", "sync",
        "empty_cache"]


def test_a_warmed_up_child_runs_every_call_before_the_first_marker(fake_torch, capsys):
    """mini-SGLang's children: every call made and run once before the first marker (JIT loads, first touch: ncu gives
    those launches point -1), then each point's marker and its call again; a call that fails in the warm-up stops
    the child before any marker (the parent's ncu pass then fails as one note)."""
    calls = fake_torch.calls
    made = lambda p: ((lambda: calls.append(("run", p))), None)  # noqa: E731
    assert ncu_pass.run_points(fake_torch, ["a", "b"], made, str.upper, warm_up=True) == 0
    assert calls[:3] == [("run", "a"), ("run", "b"), "sync"]
    assert calls[3:] == ["mark", ("run", "a"), "sync", "empty_cache", "mark", ("run", "b"), "sync", "empty_cache"]
    assert "ncu-target: point 2/2: B" in capsys.readouterr().out
    calls.clear()

    def broken():
        raise RuntimeError("the JIT build failed")
    with pytest.raises(RuntimeError, match="JIT build failed"):
        ncu_pass.run_points(fake_torch, ["a"], lambda p: (broken, None), str, warm_up=True)
    assert "mark" not in calls


# ------------------------------------------------------------------ the parent: the child under ncu, one row per launch

@pytest.fixture
def profiled(fixture_path, monkeypatch, tmp_path):
    """profile_points over the real CSV (with ``warm`` launches before the first marker, as a warmed-up child leaves
    them), the ncu command it asked for and the notes it left."""
    import pandas as pd
    seen, notes = {}, []

    def run_pass(warm=(), metrics=None, drop=(), **kw):
        df = ncu.read_raw(fixture_path(RAW))
        df = pd.concat([df.iloc[list(warm)], df], ignore_index=True).drop(columns=list(drop)).copy()
        df.attrs = ncu.read_raw(fixture_path(RAW)).attrs

        def profile(app, out, **k):
            seen.update(app=app, out=out, **k)
            return SimpleNamespace(df=df)
        monkeypatch.setattr(ncu, "profile", profile)
        run = SimpleNamespace(dir=tmp_path, log=print, note=notes.append)
        return ncu_pass.profile_points(run, "x.py", ["--quick"], "Norm|act_and_mul|nvjet|splitK", POINTS, H100,
                                       metrics=metrics, **kw)
    return SimpleNamespace(run=run_pass, seen=seen, notes=notes)


def test_every_launch_carries_the_fields_of_its_point(profiled):
    rows, raw = profiled.run()
    assert len(rows) == len(raw) == 12 and ncu.MARKER_KERNEL not in set(rows["kernel"])
    assert list(rows["point"]) == [0, 1, 2, 3, 4, 5, 6, 6, 7, 7, 8, 9]           # a split-K GEMV point: two kernels
    fused = [r for r in rows.to_dict("records") if r["op"] == "fused_add_rmsnorm"]
    assert [r["kernel"] for r in fused] == ["FusedAddRMSNormKernel"] * 2
    assert fused[0]["tokens"] == 256 and fused[0]["dram_read_mb"] == pytest.approx(4.2, abs=0.05)   # 2 x 2 MB, flushed
    assert fused[1]["tokens"] == 65536 and fused[1]["dram_read_mb"] > 1000                          # 2 x 512 MB
    gemv = rows[rows["op"] == "gemv"]
    assert set(gemv[gemv["weight_rows"] == 28672]["kernel"]) == {"nvjet_sm90_tst_128x8_64x12_2x1_v_bz_TNT"}
    assert (gemv[gemv["weight_rows"] == 28672]["dram_read_mb"] > 230).all()              # 28,672 x 4096 x 2 B = 235 MB
    assert list(gemv[gemv["kernel"] == "splitKreduce_kernel"]["rep"]) == [0, 1]
    assert {"one_cta_per_sm", "stall_note"} <= set(rows.columns)                          # the joined columns
    assert profiled.seen["app"] == [sys.executable, str(Path("x.py").resolve()), "--ncu-target", "--quick"]
    assert profiled.seen["kernel"] == "Norm|act_and_mul|nvjet|splitK|spin_kernel"
    assert (profiled.seen["cache_control"], profiled.seen["timeout"]) == ("all", 900)
    assert profiled.seen["metrics"] == kernels.SUMMARY_METRICS and profiled.notes == []


def test_launches_before_the_first_marker_belong_to_no_point(profiled):
    """A warmed-up child launches every kernel once before the first marker: those rows are left out, and the n-th
    launch of a kernel counts from the first point on (the table of a child without a warm-up)."""
    plain = profiled.run()[0]
    warm, raw = profiled.run(warm=(1, 3, 5))            # RMSNorm, FusedAddRMSNorm, RMSNorm again before the first marker
    assert len(raw) == 12 and (raw["point"] >= 0).all()
    assert warm.drop(columns="id").equals(plain.drop(columns="id"))


def test_the_pass_takes_its_metrics_timeout_and_caches_and_names_what_is_missing(profiled):
    extra = ["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"]
    rows, raw = profiled.run(metrics=extra, timeout=1200, cache_control="none", drop=("dram__bytes_write.sum",))
    assert (profiled.seen["metrics"], profiled.seen["timeout"], profiled.seen["cache_control"]) == (extra, 1200, "none")
    assert "dram__bytes_write.sum" not in raw.columns and rows["dram_write_mb"].isna().all()
    assert profiled.notes == ["the ncu CSV lacks dram__bytes_write.sum: those columns are empty"]
