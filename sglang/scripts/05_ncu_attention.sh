#!/usr/bin/env bash
# 05 · Nsight Compute on SGLang's attention kernels, inside a serving process (CUDA graphs on,
# ncu --graph-profiling node).
#
# Usage:
#   ./sglang/scripts/05_ncu_attention.sh --quick                  # flashinfer, ~2 min
#   ./sglang/scripts/05_ncu_attention.sh                          # flashinfer + triton, longer shapes
#   ./sglang/scripts/05_ncu_attention.sh --quick --set full       # every ncu section (slower)
# Needs ncu on PATH (or NCU=/path/to/ncu) and permission to read GPU counters.
# Runs sglang/scripts/05_ncu_attention.py with the same flags (its --help, below, has every flag).
# Python: $PYTHON (default python3). Writes sglang/results/05_ncu_attention/.
set -euo pipefail
[[ " $* " == *" --help "* || " $* " == *" -h "* ]] && sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
exec "${PYTHON:-python3}" "${BASH_SOURCE[0]%.sh}.py" "$@"
