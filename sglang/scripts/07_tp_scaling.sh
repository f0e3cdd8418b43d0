#!/usr/bin/env bash
# 07 · Tensor-parallel scaling on one node (2-4 GPUs): latency, throughput, all-reduce share.
#
# Llama-3.1-8B at TP = 1, 2, 4 and Llama-3.1-70B at TP = 2, 4, dummy weights, one SGLang server per
# configuration; per TP size: batch-1 TTFT/ITL, a traced decode window (all-reduce vs compute per
# step, custom all-reduce vs NCCL kernels), throughput at --request-rate inf; then the largest TP
# again with --disable-custom-all-reduce. Records `nvidia-smi topo -m` and NUMA. On fewer GPUs
# than a configuration needs it says so and runs what fits; nothing fitting is a one-line error;
# a rank that dies ends that configuration (the server's process group is always stopped).
# sglang/scripts/_tp_scaling.py does the work.
#
# NVLink multicast stays off on the lent machines: the three variables below are exported, and
# --enable-nccl-nvls / --enable-symm-mem are never passed (common.serving refuses them).
#
# Usage:
#   ./sglang/scripts/07_tp_scaling.sh --quick          # 8B at TP 1, 2 (2 GPUs), ~4 min
#   ./sglang/scripts/07_tp_scaling.sh                  # 8B TP 1/2/4 + 70B TP 2/4 (4 GPUs)
#   ./sglang/scripts/07_tp_scaling.sh --configs 'llama-3.1-70b:2,4'
#   ./sglang/scripts/07_tp_scaling.sh --configs 'llama-3.1-8b:2' --merge OLD   # add to an earlier run's rows
#   ./sglang/scripts/07_tp_scaling.sh --help
# Writes sglang/results/07_tp_scaling/ (tp_runs.csv, allreduce_kernels.csv, topology.txt,
# tp_scaling.png, story.txt, summary.json).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-python3}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^set -euo pipefail/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  echo
  exec "$PY" "$ROOT/sglang/scripts/_tp_scaling.py" --help
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  N=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  echo "07_tp_scaling: ${N} GPU(s) visible; configurations that need more are skipped (and said so)."
fi
exec "$PY" "$ROOT/sglang/scripts/_tp_scaling.py" "$@"
