"""Workload for tests/gpu/test_timing_vs_ncu.py: an elementwise kernel (y = 2x) and bf16 GEMMs.

    python tests/gpu/timing_workload.py --mb 200 20 --gemm 3328 1280 --launches 20

Launches ``--launches`` calls of each size, in order, with a marker kernel before each size (see
common.tables.kernels.split_points). y = 2x is used rather than a copy: a same-dtype copy_ is a cudaMemcpy,
not a kernel. Under ncu each launch gets its own gpu__time_duration.
"""
import argparse

import torch

p = argparse.ArgumentParser()
p.add_argument("--mb", type=float, nargs="+", required=True, help="buffer sizes in MB")
p.add_argument("--gemm", type=int, nargs="*", default=[], help="M=N=K of bf16 GEMMs")
p.add_argument("--launches", type=int, default=20)
a = p.parse_args()
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from common.capture.ncu import mark  # noqa: E402  one marker kernel before each size (common.tables.kernels.split_points)
bufs = []
for mb in a.mb:
    n = int(mb * 1e6) // 2
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    bufs.append((src, torch.empty_like(src)))
gemms = []
for n in a.gemm:
    gemms.append(tuple(torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(3)))
torch.cuda.synchronize()
for src, dst in bufs:
    mark()
    for _ in range(a.launches):
        torch.mul(src, 2.0, out=dst)
for x, y, z in gemms:
    mark()
    for _ in range(a.launches):
        torch.matmul(x, y, out=z)
torch.cuda.synchronize()
