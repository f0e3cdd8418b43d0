"""common.tables.flops: the napkin math of every kernel class, checked against brute force and real runs."""
import json

import pytest

from common.capture import models, ncu  # noqa: E402
from common.tables import flops, kernels  # noqa: E402

PROBE = "flashinfer_probe_results_h200.jsonl"          # FlashInfer probe on one H200 (tests/fixtures/README.md)
NCU_FULL = "ncu_raw_fullset_flashinfer_5kernels_h200.csv"


def _probe(fixture_path, op):
    return next(json.loads(l) for l in fixture_path(PROBE).read_text().splitlines() if f'"{op}"' in l)


def _brute_pairs(q, kv):
    return sum(1 for i in range(q) for j in range(kv) if j <= kv - q + i)


def test_causal_pairs_bottom_right():
    assert flops.causal_pairs(4, 4) == 1 + 2 + 3 + 4
    assert flops.causal_pairs(2, 5) == 4 + 5           # 2 new tokens on 5 keys see 4 and 5 keys
    for q, kv in ((7, 19), (1, 4096), (5, 5), (0, 9)):
        assert flops.causal_pairs(q, kv) == _brute_pairs(q, kv)
    with pytest.raises(ValueError, match="qo_len <= kv_len"):
        flops.causal_pairs(10, 9)
    with pytest.raises(ValueError, match="one entry per request"):
        flops.prefill_flops([1, 2], [3], 32, 128)


def test_prefill_flops_reproduce_the_h200_probe(fixture_path):
    rec = _probe(fixture_path, "batch_prefill_paged_fa2")      # 8 x 512 new tokens on 4096 KV, 32 q heads
    f = flops.prefill_flops([512] * 8, [4096] * 8, 32, 128)
    assert f / (rec["ms"] * 1e-3) / 1e12 == pytest.approx(rec["TFLOP_s"], rel=2e-3)
    assert flops.prefill_flops([512] * 8, [4096] * 8, 32, 128, causal=False) > f


def test_decode_bytes_reproduce_the_h200_probe(fixture_path):
    rec = _probe(fixture_path, "batch_decode_paged")
    kv = [4096] * 32
    kv_bytes = flops.decode_bytes(kv, 32, 8, 128) - 2 * 32 * 32 * 128 * 2       # minus q read + o written
    assert kv_bytes == 32 * 4096 * 2 * 8 * 128 * 2
    assert kv_bytes / (rec["ms"] * 1e-3) / 1e9 == pytest.approx(rec["GB_s"], rel=2e-3)
    assert flops.decode_flops(kv, 32, 128) == 4 * 32 * 128 * sum(kv)
    assert flops.intensity(flops.decode_flops(kv, 32, 128), kv_bytes) == pytest.approx(32 / 8)   # GQA group
    # mini-SGLang's page size 1 costs one int32 index per key
    assert flops.decode_bytes(kv, 32, 8, 128, index_bytes_per_token=4) - flops.decode_bytes(kv, 32, 8, 128) == 4 * sum(kv)


def test_formulas_against_what_ncu_read_from_dram(fixture_path):
    s = kernels.summarize(ncu.read_raw(fixture_path(NCU_FULL)))
    rows = {k: r for k, r in zip(s["kernel"], s.to_dict("records"))}
    read = flops.decode_bytes([4096] * 32, 32, 8, 128) - 32 * 32 * 128 * 2
    assert rows["BatchDecodeWithPagedKVCacheKernel"]["dram_read_mb"] * 1e6 == pytest.approx(read, rel=0.01)
    read = flops.prefill_bytes([512] * 8, [4096] * 8, 32, 8, 128) - 8 * 512 * 32 * 128 * 2
    assert rows["BatchPrefillWithPagedKVCacheKernel"]["dram_read_mb"] * 1e6 == pytest.approx(read, rel=0.03)


def test_dense_and_elementwise_classes():
    assert flops.gemm_flops(512, 6144, 4096) == 2 * 512 * 6144 * 4096
    assert flops.gemm_bytes(1, 4096, 4096) == (4096 + 4096 * 4096 + 4096) * 2       # the weight dominates
    assert flops.rmsnorm_bytes(8192, 4096) == 2 * 8192 * 4096 * 2 + 4096 * 2
    # fusing the add saves one read and one write of tokens x hidden... and a second read: 5 -> 4 passes
    t, h = 8192, 4096
    assert flops.add_then_rmsnorm_bytes(t, h) - flops.fused_add_rmsnorm_bytes(t, h) == t * h * 2
    assert flops.silu_and_mul_bytes(10, 100) == 3 * 10 * 100 * 2
    assert flops.rope_bytes(8192, 32, 8, 128) == 2 * 8192 * 40 * 128 * 2


def test_kv_cache_kernels_split_reads_and_writes():
    b = flops.index_bytes(64, 8192, 4)
    assert b == {"read": 64 * 8192 + 256, "write": 64 * 8192, "total": 2 * 64 * 8192 + 256}
    half = flops.index_bytes(64, 8192, 8, tokens_in=32)
    assert half["read"] == 32 * 8192 + 64 * 8 and half["write"] == 64 * 8192
    s = flops.store_bytes(8192, 2048, 4)
    assert s["read"] == 2 * 8192 * 2048 + 8192 * 4 and s["write"] == 2 * 8192 * 2048


def test_bus_bandwidth_nccl_convention():
    alg, bus = flops.bus_bandwidth(1e9, 0.01, 2)
    assert alg == pytest.approx(100.0) and bus == pytest.approx(100.0)
    assert flops.bus_bandwidth(1e9, 0.01, 4)[1] == pytest.approx(150.0)
    assert flops.bus_bandwidth(1e9, 0.01, 8)[1] == pytest.approx(175.0)
    assert flops.bus_bandwidth(1e9, 0.01, 4, op="all_gather")[1] == pytest.approx(75.0)
    with pytest.raises(ValueError):
        flops.bus_bandwidth(1e9, 0.0, 2)


def test_layer_work_of_llama_8b():
    cfg = models.config("llama-3.1-8b")
    dec = flops.layer_work(cfg, tokens=32, kv_lens=[4096] * 32)
    # weights of one layer read once by its four GEMMs: 4096*(6144 + 4096 + 28672 + 14336) bf16 values
    w = 4096 * (6144 + 4096 + 2 * 14336 + 14336) * 2
    gemm_bytes = sum(dec[c]["bytes"] for c in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"))
    assert w < gemm_bytes < w * 1.03                                            # + activations in and out
    assert dec["attention"]["bytes"] == flops.decode_bytes([4096] * 32, 32, 8, 128)
    pre = flops.layer_work(cfg, tokens=512, kv_lens=[512], qo_lens=[512])
    assert pre["attention"]["flops"] == flops.prefill_flops([512], [512], 32, 128)
    assert pre["lm_head"]["flops"] == flops.gemm_flops(1, 128256, 4096)           # logits of the last token only
    tp2 = flops.layer_work(cfg, tokens=32, kv_lens=[4096] * 32, tp=2)
    assert tp2["gate_up_proj"]["flops"] * 2 == dec["gate_up_proj"]["flops"]
    with pytest.raises(ValueError, match="qo_lens"):
        flops.layer_work(cfg, tokens=10, kv_lens=[512], qo_lens=[512])
