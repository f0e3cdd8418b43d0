#!/usr/bin/env bash
# ncu_profile.sh — one mini-SGLang kernel family under Nsight Compute, with the workbook's per-kernel table.
#
# Usage:
#   ./mini-sglang/scripts/ncu_profile.sh [--kernel index|store|attention|comm|REGEX] [--name NAME | --out DIR]
#       [--set full] [--count N] [--skip N] [--nvtx-include RANGE] [--timeout S] -- python <script> [args]
#   --kernel  a family: index -> index_kernel (and masked_index_kernel), store -> store_kv_cache, attention ->
#             FlashInfer BatchPrefill/BatchDecode/MergeState (and FA3 'flash'), comm -> nccl; or any regex
#   --name    results in mini-sglang/results/ncu_profile/NAME/ (default: the family); --out DIR: in DIR
#   the rest are the options of `python -m common ncu profile`; clocks stay as in un-profiled runs
# Examples (a numbered script's hidden --ncu-target mode runs each point once, a marker kernel between):
#   ./mini-sglang/scripts/ncu_profile.sh --kernel index --set full -- \
#       python mini-sglang/scripts/02_profile_index.py --ncu-target --quick
#   ./mini-sglang/scripts/ncu_profile.sh --kernel store -- python mini-sglang/scripts/03_profile_store.py --ncu-target --quick
#   ./mini-sglang/scripts/ncu_profile.sh --kernel attention --set full --count 4 -- \
#       python mini-sglang/scripts/04_profile_attention.py --ncu-target --quick
# Writes DIR/ncu.csv (--csv --page raw), DIR/ncu_log.txt and DIR/kernels.csv (common.tables.kernels.summarize).
# Needs ncu on PATH and permission to read the GPU counters. Python: $PYTHON (default python3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NAME="" OUT="" ARGS=()
while [[ $# -gt 0 && "$1" != "--" ]]; do
  case "$1" in
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --kernel)
      case "${2:?--kernel needs a family or a regex}" in
        index) RX='index_kernel' ;; store) RX='store_kv_cache' ;; comm) RX='nccl' ;;
        attention) RX='BatchPrefill|BatchDecode|MergeState|flash|Flash' ;; *) RX="$2" ;;
      esac
      NAME="${NAME:-${2//[^A-Za-z0-9_]/_}}"; ARGS+=(--kernel "$RX"); shift 2 ;;
    --name) NAME="${2:?--name needs a value}"; shift 2 ;;
    --out) OUT="${2:?--out needs a folder}"; [[ "$OUT" == /* ]] || OUT="$PWD/$OUT"; shift 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
OUT="${OUT:-$ROOT/mini-sglang/results/ncu_profile/${NAME:-ncu-$(date +%Y%m%d-%H%M%S)}}"
cd "$ROOT"
exec "${PYTHON:-python3}" -m common ncu profile --out "$OUT" ${ARGS[@]+"${ARGS[@]}"} "$@"
