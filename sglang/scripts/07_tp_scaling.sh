#!/usr/bin/env bash
# 07 · Tensor-parallel scaling on one node (2-8 GPUs): latency, throughput, all-reduce share.
#
# Usage:
#   ./sglang/scripts/07_tp_scaling.sh --quick          # 8B at TP 1, 2 (2 GPUs), ~4 min
#   ./sglang/scripts/07_tp_scaling.sh                  # 8B TP 1/2/4 + 70B TP 2/4 (what fits)
#   ./sglang/scripts/07_tp_scaling.sh --configs 'llama-3.1-70b:2,4'
#   ./sglang/scripts/07_tp_scaling.sh --configs 'llama-3.1-8b:2' --merge OLD   # add to an earlier run's rows
# NVLink multicast stays off: the policy lives in common.capture.procs.nccl_env (applied to every server).
# Runs sglang/scripts/07_tp_scaling.py with the same flags (its --help, below, has every flag).
# Python: $PYTHON (default python3). Writes sglang/results/07_tp_scaling/.
set -euo pipefail
[[ " $* " == *" --help "* || " $* " == *" -h "* ]] && sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
exec "${PYTHON:-python3}" "${BASH_SOURCE[0]%.sh}.py" "$@"
