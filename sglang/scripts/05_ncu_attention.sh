#!/usr/bin/env bash
# 05 · Nsight Compute on SGLang's attention kernels, inside a serving process.
#
# Starts the SGLang server under
#   ncu --target-processes all --profile-from-start off --clock-control none
#       --kernel-name regex:<the backend's attention kernels> --launch-count <cap>
# with CUDA graphs off (--disable-prefill-cuda-graph --disable-decode-cuda-graph), no warm-up, a
# small KV pool, and the model cut to 2 layers of unchanged shape (--layers 0: all layers).
# SGLang's /start_profile {"activities": ["CUDA_PROFILER"], "num_steps": N} opens the ncu window
# for exactly one prefill step and two decode steps. Result: a per-kernel hardware table
# (time, DRAM TB/s and % of measured peak, SM / tensor-pipe %, occupancy and its limiter) and the
# warp-stall breakdown, prefill vs decode -> sglang/results/05_ncu_attention/ (attention_kernels.csv
# fills the report block 05_ncu_attention/table:attention_kernels). sglang/scripts/_ncu_attention.py
# does the work; common.ncu builds the ncu command and parses its CSV.
#
# Usage:
#   ./sglang/scripts/05_ncu_attention.sh --quick                  # flashinfer, ~2 min
#   ./sglang/scripts/05_ncu_attention.sh                          # flashinfer + triton, longer shapes
#   ./sglang/scripts/05_ncu_attention.sh --quick --set full       # every ncu section (slower)
#   ./sglang/scripts/05_ncu_attention.sh --help                   # every flag
# Needs ncu on PATH (or NCU=/path/to/ncu) and permission to read GPU counters (root or
# NVreg_RestrictProfilingToAdminUsers=0).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-python3}"
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^set -euo pipefail/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  echo
  exec "$PY" "$ROOT/sglang/scripts/_ncu_attention.py" --help
fi
exec "$PY" "$ROOT/sglang/scripts/_ncu_attention.py" "$@"
