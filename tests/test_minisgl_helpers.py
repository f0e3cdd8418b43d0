"""CPU tests of mini-sglang/scripts/_msgl.py: mini-SGLang's own facts (launch geometry, template arguments, vocab
shards, coalescing from ncu rows, radix workloads, the multi-rank runner) and the little the scripts add on top of
common/ (facts as verdicts, the ceiling premise, calls inside ranges of the common event table).

Fixtures (real tool output, H200):
  torch_profiler_trace_flashinfer_rmsnorm_matmul_h200.json  shared; see fixtures/README.md
  torch_trace_sglang_extend_step_h200_cut160.json  the SGLang server's /start_profile trace
      (Llama-3.1-8B shape, dummy weights; shared/fixtures/torch_profiler_trace_sglang_server_llama8b_dummy_h200_trimmed.json)
      cut to its first 160 kernels: every cuda_runtime/cuda_driver event up to the launch of the
      160th kernel, the GPU events with those correlation ids (CUDA-graph replays share one),
      the two user_annotation ranges and the metadata rows; events themselves unchanged.
  ncu_raw_fullset_flashinfer_5kernels_h200.csv  shared; see fixtures/README.md
The byte and FLOP formulas the scripts use live in common/tables/flops.py (tests/test_flops.py); the range -> kernel
join and the layer assignment in common/tables/trace.py (tests/test_trace.py).
"""
import math
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "mini-sglang" / "scripts"))
import _msgl as m  # noqa: E402
from common.capture import timing  # noqa: E402
from common.tables import trace  # noqa: E402
from common.judge.verdicts import Hypothesis  # noqa: E402
from common.run.results import Run  # noqa: E402

FIX = Path(__file__).resolve().parent / "fixtures"
MATMUL_TRACE = FIX / "torch_profiler_trace_flashinfer_rmsnorm_matmul_h200.json"
SGL_TRACE = FIX / "torch_trace_sglang_extend_step_h200_cut160.json"


@pytest.fixture
def run(tmp_path):
    r = Run(ROOT / "mini-sglang" / "scripts" / "01_test_kernels.py", {}, out=tmp_path / "run", quiet=True)
    yield r
    r.finish()


# ------------------------------------------------------------------ launch geometry
def test_index_launch_llama8b_row():
    g = m.index_launch(64, 4096 * 2)
    assert g["num_splits"] == 4 and g["bytes_per_warp"] == 2048 and g["lane_bytes"] == 16
    assert g["steps_per_warp"] == 4 and g["block"] == 128
    assert g["grid"] == 64 and g["warps"] == 256          # one 128-thread block per token
    assert m.index_launch(1, 8192)["grid"] == 1


@pytest.mark.parametrize("hidden,splits,per_warp,lane,steps", [
    (8192, 4, 4096, 16, 8),      # Llama-3.1-70B
    (3584, 2, 3584, 16, 7),      # Qwen2.5-7B: 7168 B is a multiple of 1024, not 2048
    (1024, 4, 512, 16, 1),       # tiny preset
    (64, 1, 128, 4, 1),          # 128-B row: 4-B lanes
])
def test_index_launch_other_rows(hidden, splits, per_warp, lane, steps):
    g = m.index_launch(10, hidden * 2)
    assert (g["num_splits"], g["bytes_per_warp"], g["lane_bytes"], g["steps_per_warp"]) == (splits, per_warp, lane, steps)
    assert g["grid"] == -(-(splits * 10) // 4)


def test_row_the_build_rejects():
    assert m.lane_bytes(200) == 0                          # not a multiple of 128 B
    assert m.index_launch(4, 200)["steps_per_warp"] == 0


@pytest.mark.parametrize("row,lane,steps", [(2048, 16, 4), (1024, 16, 2), (512, 16, 1), (256, 8, 1)])
def test_store_launch(row, lane, steps):
    g = m.store_launch(13, row)
    assert g["lane_bytes"] == lane and g["steps_per_row"] == steps
    assert g["grid"] == 4 and g["launches"] == 1 and g["warps_per_token"] == 1


def test_index_template_arguments():
    # the committed 02 run read "template <128, 1, false, 8192, 4, int>" from the demangled name (analysis.md)
    for name in ("void index_kernel<128u, 1u, false, 8192u, 4u, int>(IndexParams)",
                 "void index_kernel<128, 1, false, 8192, 4, int>(IndexParams)"):
        t = m.index_template(name)
        assert (t["threads"], t["min_blocks"], t["pdl"], t["row_bytes"], t["splits"], t["id_type"]) == \
            (128, 1, "false", 8192, 4, "int")
    assert m.index_template("void store_kv_cache<2048u>(StoreParams)") is None
    assert m.threads_launched("64x1x1", "128x1x1") == 8192 and m.threads_launched(None, "128x1x1") == 0


def test_vocab_shard_covers_the_vocab_exactly():
    assert m.vocab_shard(128256, 2, 0) == (0, 64128)
    assert m.vocab_shard(128256, 2, 1) == (64128, 64128)
    for v, n in ((10, 3), (128256, 8), (151936, 4), (5, 8)):
        parts = [m.vocab_shard(v, n, r) for r in range(n)]
        covered = [i for s, l in parts for i in range(s, s + l)]
        assert covered == list(range(v))
    with pytest.raises(ValueError):
        m.vocab_shard(100, 2, 2)


def test_ncu_coalescing_on_a_real_full_set_csv():
    from common.capture.ncu import read_raw
    df = read_raw(FIX / "ncu_raw_fullset_flashinfer_5kernels_h200.csv")
    norm = [r for r in df.to_dict("records") if "RMSNormKernel" in r["Kernel Name"]]
    assert len(norm) == 2
    for r in norm:   # 16-B vector loads: 32 lanes x 16 B = 512 B = 16 sectors per request
        assert m.ncu_coalescing(r)["ld_sectors_per_request"] == pytest.approx(16.0)
    assert math.isnan(m.ncu_coalescing({})["st_sectors_per_request"])


# ------------------------------------------------------------------ traces: the common join, calls inside ranges
def test_launches_per_aten_op_through_the_common_join():
    """What 01/03 read from their traces: kernels per call with grid x block, via common.tables.trace.kernels_in_ranges."""
    j = trace.kernels_in_ranges(trace.read_chrome_trace(MATMUL_TRACE), r"^aten::mm$", kinds=("cpu_op",),
                                empty_rows=False)
    assert len(j) == 6 and sorted(set(j["range_index"])) == [0, 1, 2]
    for _i, g in j.groupby("range_index"):
        assert list(g["gpu_kind"]) == ["memset", "kernel"]
        k = g.iloc[1]
        assert k["kernel"].startswith("nvjet_sm90") and k["grid"] == "2x66x1" and k["block"] == "384x1x1"
        assert m.threads_launched(k["grid"], k["block"]) == 2 * 66 * 384
    assert not j["full_name"].str.contains("RMSNorm").any()     # launched outside any aten::mm


def test_calls_in_ranges_on_the_common_event_table():
    ev = trace.read_chrome_trace(MATMUL_TRACE)
    assert trace.calls_in_ranges(ev, r"^aten::mm$", r"^cudaMemsetAsync$", kinds=("cpu_op",)) == [("aten::mm", 1)] * 3
    # the SGLang extend step replays a piecewise CUDA graph: graph launches inside the step range
    (name, n), = trace.calls_in_ranges(trace.read_chrome_trace(SGL_TRACE), r"^step\[", r"^cudaGraphLaunch$")
    assert name.startswith("step[EXTEND") and n >= 8
    # ranges inside ranges (08: Layer_i inside a step): none in a graph replay
    assert trace.calls_in_ranges(trace.read_chrome_trace(SGL_TRACE), r"^step\[", r"^Layer_", inner=("user_annotation",)) \
        == [(name, 0)]


# ------------------------------------------------------------------ verdicts: facts and the ceiling premise
H = Hypothesis("x-two-launches", "store makes two launches per call", "launches per traced call", low=2, high=2,
               source="the plan")


def test_a_fact_on_every_observation(run):
    assert m.fact(run, H, [True, True, True], "launches.csv") == "confirmed"
    assert m.fact(run, H, [False] * 3, "launches.csv", detail="[1] per call") == "refuted"
    assert m.fact(run, H, [True, False, True], "launches.csv") == "inconclusive"       # mixed: not decided
    assert m.fact(run, H, [], "launches.csv") == "inconclusive"                        # nothing observed
    assert m.fact(run, H, [True] * 3, "checks.csv", premise="PyNCCL needs two GPUs; 1 visible") == "inconclusive"
    obs = run.summary["observations"]
    assert "holds in 2 of 3" in obs[2]["observed"] and "premise failed: PyNCCL needs two GPUs" in obs[4]["observed"]
    assert obs[0]["expected"].startswith("store makes two launches per call") and "[2, 2]" in obs[0]["expected"]


def test_the_ceiling_premise():
    assert m.within_ceiling([62.6, 99.7, float("nan"), None], "the measured bf16 ceiling") is True
    why = m.within_ceiling([99.6, 102.1], "the measured DRAM read ceiling 4.68 TB/s")
    assert isinstance(why, str) and why.startswith("102% of the measured DRAM read ceiling 4.68 TB/s") and "--refresh" in why
    assert m.within_ceiling is timing.within_ceiling and m.eff_premise is timing.eff_premise     # one home: common


# ------------------------------------------------------------------ radix workloads
def test_shared_prefix_requests():
    reqs = m.shared_prefix_requests(groups=3, per_group=4, prefix_len=50, suffix_len=10, seed=1)
    assert len(reqs) == 12 and all(len(r) == 60 for r in reqs)
    assert all(t < 128000 for r in reqs for t in r)
    for g in range(3):
        grp = reqs[4 * g:4 * g + 4]
        for a in grp[1:]:
            assert m.first_mismatch(grp[0], a) == 50           # share exactly the system prompt
    assert m.first_mismatch(reqs[0], reqs[4]) < 5              # different groups: (almost) nothing
    assert reqs == m.shared_prefix_requests(3, 4, 50, 10, seed=1)
    assert reqs != m.shared_prefix_requests(3, 4, 50, 10, seed=2)


def test_conversation_is_a_path():
    turns = m.conversation(turns=5, turn_len=7, seed=3)
    assert [len(t) for t in turns] == [7, 14, 21, 28, 35]
    for a, b in zip(turns, turns[1:]):
        assert b[:len(a)] == a


def test_first_mismatch():
    assert m.first_mismatch([1, 2, 3], [1, 2, 4]) == 2
    assert m.first_mismatch([1, 2], [1, 2, 3]) == 2
    assert m.first_mismatch([], [1]) == 0
    assert m.first_mismatch([5], [6]) == 0


# ------------------------------------------------------------------ several ranks
def _ok_target(rank, world, port, base):
    return {"rank": rank, "world": world, "value": base + rank, "port": port}


def _fail_target(rank, world, port):
    if rank == 1:
        raise ValueError("rank one broke on purpose")
    time.sleep(30)   # the others would wait forever in a real collective
    return {}


class _SegfaultsWhenFreed:
    """Like mini-SGLang's PyNCCL communicator on the H200 node: freeing it crashes the process."""
    def __del__(self):
        import os
        import signal
        os.kill(os.getpid(), signal.SIGSEGV)


def _drops_a_crashing_object(rank, world, port):
    comm = _SegfaultsWhenFreed()          # freed when the function returns: the crash seen on the GPU node
    return {"rank": rank, "comm": str(type(comm))}


def _keeps_a_crashing_object(rank, world, port):
    import atexit
    import os
    import signal
    m.keep(_SegfaultsWhenFreed())
    atexit.register(lambda: os.kill(os.getpid(), signal.SIGSEGV))   # and a crash in interpreter teardown
    return {"rank": rank}


def test_run_ranks_results_survive_an_object_that_crashes_when_freed(tmp_path):
    with pytest.raises(RuntimeError, match="rank . of 2 failed: exit code -11"):
        m.run_ranks(_drops_a_crashing_object, 2, (), tmp_path, timeout_s=60)
    res = m.run_ranks(_keeps_a_crashing_object, 2, (), tmp_path, timeout_s=60)
    assert [r["rank"] for r in res] == [0, 1]


def test_run_ranks_collects_results_on_an_os_chosen_port(tmp_path):
    res = m.run_ranks(_ok_target, 2, (10,), tmp_path, timeout_s=60)
    assert [r["value"] for r in res] == [10, 11] and res[0]["port"] == res[1]["port"] > 1024


def test_run_ranks_stops_everyone_when_one_rank_dies(tmp_path):
    t0 = time.time()
    with pytest.raises(RuntimeError, match="rank 1 of 2 failed: ValueError: rank one broke on purpose"):
        m.run_ranks(_fail_target, 2, (), tmp_path, timeout_s=60)
    assert time.time() - t0 < 25                               # rank 0 was terminated, not waited for


def test_run_ranks_times_out(tmp_path):
    with pytest.raises(RuntimeError, match="did not finish within 2 s"):
        m.run_ranks(_fail_target, 1, (), tmp_path, timeout_s=2)


def test_short_error_picks_the_build_error_line():
    log = ("Error building extension 'minisgl__pynccl_0123':\n[1/2] nvcc -c pynccl.cu\n[2/2] c++ pynccl.o -lnccl -o x.so\n"
           "/usr/bin/ld: cannot find -lnccl: No such file or directory\ncollect2: error: ld returned 1 exit status\n")
    line = m.short_error(log)
    assert line.startswith("/usr/bin/ld: cannot find -lnccl")
    assert "LIBRARY_PATH" in line
    assert m.short_error("ValueError: plain\nmore") == "ValueError: plain"
    assert m.short_error("") == ""
