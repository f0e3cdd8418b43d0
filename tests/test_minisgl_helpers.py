"""CPU tests of mini-sglang/scripts/_msgl.py: byte/FLOP formulas, launch geometry, bus bandwidth,
kernel order from real traces, radix workloads, and the multi-rank runner.

Fixtures (real tool output, H200):
  torch_profiler_trace_flashinfer_rmsnorm_matmul_h200.json  shared; see fixtures/README.md
  torch_trace_sglang_extend_step_h200_cut160.json  the SGLang server's /start_profile trace
      (Llama-3.1-8B shape, dummy weights; shared/fixtures/torch_profiler_trace_sglang_server_llama8b_dummy_h200_trimmed.json)
      cut to its first 160 kernels: every cuda_runtime/cuda_driver event up to the launch of the
      160th kernel, the GPU events with those correlation ids (CUDA-graph replays share one),
      the two user_annotation ranges and the metadata rows; events themselves unchanged.
  ncu_raw_fullset_flashinfer_5kernels_h200.csv  shared; see fixtures/README.md
"""
import json
import math
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "mini-sglang" / "scripts"))
import _msgl as m  # noqa: E402
from common.trace import TraceError  # noqa: E402

FIX = Path(__file__).resolve().parent / "fixtures"
MATMUL_TRACE = FIX / "torch_profiler_trace_flashinfer_rmsnorm_matmul_h200.json"
SGL_TRACE = FIX / "torch_trace_sglang_extend_step_h200_cut160.json"


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


# ------------------------------------------------------------------ bytes and FLOPs
def test_index_bytes_plain_and_masked():
    b = m.index_bytes(64, 8192, 4)
    assert b == {"read": 64 * 8192 + 256, "write": 64 * 8192, "total": 2 * 64 * 8192 + 256}
    half = m.index_bytes(64, 8192, 8, tokens_in=32)        # masked: foreign rows are only written
    assert half["read"] == 32 * 8192 + 64 * 8 and half["write"] == 64 * 8192


def test_store_bytes():
    b = m.store_bytes(8192, 2048, 4)
    assert b["read"] == 2 * 8192 * 2048 + 8192 * 4
    assert b["write"] == 2 * 8192 * 2048


def test_vocab_shard_covers_the_vocab_exactly():
    assert m.vocab_shard(128256, 2, 0) == (0, 64128)
    assert m.vocab_shard(128256, 2, 1) == (64128, 64128)
    for v, n in ((10, 3), (128256, 8), (151936, 4), (5, 8)):
        parts = [m.vocab_shard(v, n, r) for r in range(n)]
        covered = [i for s, l in parts for i in range(s, s + l)]
        assert covered == list(range(v))
    with pytest.raises(ValueError):
        m.vocab_shard(100, 2, 2)


def _brute_flops(q_lens, kv_lens, hq, d):
    total = 0
    for q, kv in zip(q_lens, kv_lens):
        p = kv - q
        for i in range(q):
            total += 4 * hq * d * (p + i + 1)
    return total


def test_prefill_flops_match_a_brute_force_count():
    for q, kv in (([7], [7]), ([5, 3], [9, 3]), ([1], [4096])):
        assert m.prefill_attn_flops(q, kv, 32, 128) == _brute_flops(q, kv, 32, 128)
    with pytest.raises(ValueError):
        m.prefill_attn_flops([10], [5], 32, 128)


def test_decode_bytes():
    # batch 32 x kv 4096, Llama-3.1-8B heads: K+V rows dominate
    b = m.decode_attn_bytes([4096] * 32, 32, 8, 128)
    kv = 32 * 4096 * 2 * 8 * 128 * 2
    assert b == kv + 32 * 4096 * 4 + 32 * 2 * 32 * 128 * 2


def test_bus_bandwidth_nccl_convention():
    alg, bus = m.bus_bandwidth(1e9, 0.01, 2)
    assert alg == pytest.approx(100.0) and bus == pytest.approx(100.0)
    assert m.bus_bandwidth(1e9, 0.01, 4)[1] == pytest.approx(150.0)
    assert m.bus_bandwidth(1e9, 0.01, 8)[1] == pytest.approx(175.0)
    assert m.bus_bandwidth(1e9, 0.01, 4, op="all_gather")[1] == pytest.approx(75.0)
    with pytest.raises(ValueError):
        m.bus_bandwidth(1e9, 0.0, 2)


# ------------------------------------------------------------------ traces
def test_launches_by_range_on_aten_ops():
    rows = m.launches_by_range(MATMUL_TRACE, r"^aten::mm$")
    assert len(rows) == 6
    for i in range(3):
        mine = [r for r in rows if r["range_index"] == i]
        assert [r["kind"] for r in mine] == ["memset", "kernel"]
        k = mine[1]
        assert k["short"].startswith("nvjet_sm90") and k["grid"] == "2x66x1" and k["block"] == "384x1x1"
        assert m.threads_launched(k["grid"], k["block"]) == 2 * 66 * 384
    # FlashInfer kernels are launched outside any aten op: they belong to no aten::mm range
    assert not any("RMSNorm" in r["name"] for r in rows)


def test_launches_by_range_follows_cuda_graph_replays_and_finds_the_layer():
    rows = m.launches_by_range(SGL_TRACE, r"^step\[")
    names = [r["short"] for r in rows if r["kind"] == "kernel"]
    assert len(names) == 165
    # kernels replayed from a CUDA graph share the launch's correlation id: all must be there
    assert names.count("FusedAddRMSNormKernel") >= 10
    period, block, start = m.kernel_period(names, anchor="RMSNorm")
    assert period == 18
    assert block[0] == "FusedAddRMSNormKernel"
    assert block.count("store_kvcache") == 1 and block.count("BatchPrefillWithPagedKVCacheKernel") == 1
    assert [r["order"] for r in rows[:5]] == [0, 1, 2, 3, 4]


def test_kernel_period_needs_repeats():
    assert m.kernel_period(["a", "b", "c", "d", "e", "f"]) == (None, [], None)
    p, block, _ = m.kernel_period(list("xy") + list("abcd") * 5)
    assert p == 4 and sorted(block) == list("abcd")


def test_bad_traces_fail_loudly(tmp_path):
    with pytest.raises(TraceError):
        m.launches_by_range(FIX / "bad_torch_trace_empty.json", ".")
    cut = tmp_path / "cut.json"
    cut.write_text(MATMUL_TRACE.read_text()[:20000])          # a trace cut while it was written
    with pytest.raises(TraceError):
        m.launches_by_range(cut, ".")
    cpu_only = tmp_path / "cpu_only.json"
    ev = [e for e in json.loads(MATMUL_TRACE.read_text())["traceEvents"] if e.get("cat") == "cpu_op"]
    cpu_only.write_text(json.dumps({"traceEvents": ev}))
    with pytest.raises(TraceError, match="no GPU events"):
        m.launches_by_range(cpu_only, ".")


def test_ncu_coalescing_on_a_real_full_set_csv():
    from common.ncu import read_raw
    df = read_raw(FIX / "ncu_raw_fullset_flashinfer_5kernels_h200.csv")
    rows = df.to_dict("records")
    norm = [r for r in rows if "RMSNormKernel" in r["Kernel Name"]]
    assert len(norm) == 2
    for r in norm:   # 16-B vector loads: 32 lanes x 16 B = 512 B = 16 sectors per request
        assert m.ncu_coalescing(r)["ld_sectors_per_request"] == pytest.approx(16.0)
    assert math.isnan(m.ncu_coalescing({})["st_sectors_per_request"])


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


def test_run_ranks_collects_results(tmp_path):
    res = m.run_ranks(_ok_target, 2, (10,), tmp_path, timeout_s=60)
    assert [r["value"] for r in res] == [10, 11] and res[0]["port"] == res[1]["port"]


def test_run_ranks_stops_everyone_when_one_rank_dies(tmp_path):
    t0 = time.time()
    with pytest.raises(RuntimeError, match="rank 1 of 2 failed: ValueError: rank one broke on purpose"):
        m.run_ranks(_fail_target, 2, (), tmp_path, timeout_s=60)
    assert time.time() - t0 < 25                               # rank 0 was terminated, not waited for


def test_run_ranks_times_out(tmp_path):
    with pytest.raises(RuntimeError, match="did not finish within 2 s"):
        m.run_ranks(_fail_target, 1, (), tmp_path, timeout_s=2)


def test_runtime_calls_in_ranges():
    assert m.runtime_calls_in_ranges(MATMUL_TRACE, r"^aten::mm$", r"^cudaMemsetAsync$") == [("aten::mm", 1)] * 3
    # the SGLang extend step replays a piecewise CUDA graph: graph launches inside the step range
    (name, n), = m.runtime_calls_in_ranges(SGL_TRACE, r"^step\[", r"^cudaGraphLaunch$")
    assert name.startswith("step[EXTEND") and n >= 8


def test_short_error_picks_the_build_error_line():
    log = ("Error building extension 'minisgl__pynccl_0123':\n[1/2] nvcc -c pynccl.cu\n[2/2] c++ pynccl.o -lnccl -o x.so\n"
           "/usr/bin/ld: cannot find -lnccl: No such file or directory\ncollect2: error: ld returned 1 exit status\n")
    line = m.short_error(log)
    assert line.startswith("/usr/bin/ld: cannot find -lnccl")
    assert "LIBRARY_PATH" in line
    assert m.short_error("ValueError: plain\nmore") == "ValueError: plain"
    assert m.short_error("") == ""
