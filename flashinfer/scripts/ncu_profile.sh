#!/usr/bin/env bash
# ncu_profile.sh — run a command under Nsight Compute and get the workbook's per-kernel hardware table.
#
# Usage:
#   ./flashinfer/scripts/ncu_profile.sh [--kernel REGEX] [--skip N] [--count N] [--set NAME]
#       [--name NAME] [--out DIR] [--nvtx-include RANGE] [--clock-control none|base] [--timeout S] -- COMMAND...
#
#   --kernel REGEX      profile only kernels whose name matches (e.g. 'BatchDecode|MergeStates'; default: all)
#   --skip N            skip the first N matching launches (e.g. warm-up calls)
#   --count N           profile at most N matching launches
#   --set NAME          an ncu section set (full, detailed, roofline...); default: the workbook's summary
#                       metric list (common.ncu.SUMMARY_METRICS: time, DRAM, SM, tensor pipe, occupancy and
#                       its limiters, L2 hit rate, warp stalls) — a few replay passes instead of ~40
#   --name NAME         sub-folder name under flashinfer/results/ncu_profile/ (default: ncu-<time>)
#   --out DIR           write into DIR instead
#   --nvtx-include R    only kernels inside NVTX range R (the scripts name ranges like 'decode cuda b=32 kv=4096')
#   --clock-control     none (default: clocks as in un-profiled runs) or base (ncu's locked base clocks)
#   --timeout S         give up after S seconds
#
# Examples (the numbered scripts' hidden --ncu-target mode runs each sweep point once, a marker kernel between):
#   ./flashinfer/scripts/ncu_profile.sh --name decode --kernel 'BatchDecode|MergeStates' --set full --count 2 -- \
#       python flashinfer/scripts/03_profile_decode.py --ncu-target --quick --variants cuda
#   ./flashinfer/scripts/ncu_profile.sh --name prefill --kernel 'BatchPrefillWithPagedKVCacheKernel|PrefillWithKVCacheKernel' \
#       --count 2 -- python flashinfer/scripts/02_profile_prefill.py --ncu-target --quick --models llama-3.1-8b
#   ./flashinfer/scripts/ncu_profile.sh --name norm --kernel RMSNormKernel --count 2 -- \
#       python flashinfer/scripts/04_profile_rmsnorm.py --ncu-target --quick
#   ./flashinfer/scripts/ncu_profile.sh --name rope --kernel Rotary --count 2 -- \
#       python flashinfer/scripts/05_profile_rope.py --ncu-target --quick
#
# The command runs from the repository root. Writes DIR/ncu.csv (ncu --csv --page raw: names row + units row), DIR/ncu_log.txt, DIR/ncu_app_stdout.txt
# and DIR/kernels.csv (common.ncu.summarize), and prints the per-kernel table. The work is done by
# `python -m common.ncu profile` (the same code the scripts' --ncu flag uses). Needs ncu on PATH and
# permission to read the GPU counters (root, or NVreg_RestrictProfilingToAdminUsers=0).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-python3}"
ARGS=()
NAME="ncu-$(date +%Y%m%d-%H%M%S)"
OUT=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --kernel) ARGS+=(--kernel "$2"); shift 2 ;;
    --skip) ARGS+=(--skip "$2"); shift 2 ;;
    --count) ARGS+=(--count "$2"); shift 2 ;;
    --set) ARGS+=(--set "$2"); shift 2 ;;
    --nvtx-include) ARGS+=(--nvtx-include "$2"); shift 2 ;;
    --clock-control) ARGS+=(--clock-control "$2"); shift 2 ;;
    --timeout) ARGS+=(--timeout "$2"); shift 2 ;;
    --name) NAME="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "ncu_profile.sh: unknown option '$1' (the command to profile goes after --; see --help)" >&2; exit 2 ;;
  esac
done
if [[ $# -eq 0 ]]; then
  echo "ncu_profile.sh: give the command to profile after -- (see --help)" >&2
  exit 2
fi
if [[ -n "$OUT" && "$OUT" != /* ]]; then OUT="$PWD/$OUT"; fi   # relative to where you called it from
OUT="${OUT:-$ROOT/flashinfer/results/ncu_profile/$NAME}"
mkdir -p "$OUT"
cd "$ROOT"
echo "ncu_profile.sh: $* -> $OUT"
exec "$PY" -m common.ncu profile --out "$OUT" ${ARGS[@]+"${ARGS[@]}"} -- "$@"
