"""Workload for tests/gpu/test_timing_vs_ncu.py: an elementwise kernel (y = 2x) at two sizes.

    python tests/gpu/timing_workload.py --mb 200 20 --launches 20

Launches ``--launches`` kernels of each size, in order, and nothing else that ncu's kernel
filter ('vectorized_elementwise') matches (a same-dtype copy_ would be a cudaMemcpy, no kernel). Under ncu each launch gets its own gpu__time_duration.
"""
import argparse

import torch

p = argparse.ArgumentParser()
p.add_argument("--mb", type=float, nargs="+", required=True, help="buffer sizes in MB")
p.add_argument("--launches", type=int, default=20)
a = p.parse_args()
bufs = []
for mb in a.mb:
    n = int(mb * 1e6) // 2
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    bufs.append((src, torch.empty_like(src)))
torch.cuda.synchronize()
for src, dst in bufs:
    for _ in range(a.launches):
        torch.mul(src, 2.0, out=dst)
torch.cuda.synchronize()
