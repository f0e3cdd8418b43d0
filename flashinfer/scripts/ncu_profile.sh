#!/usr/bin/env bash
# ncu_profile.sh — run a command under Nsight Compute and print the workbook's per-kernel hardware table.
#
# Usage:
#   ./flashinfer/scripts/ncu_profile.sh [--name NAME | --out DIR] [--kernel REGEX] [--skip N] [--count N]
#       [--set NAME] [--nvtx-include RANGE] [--clock-control none|base] [--cache-control none|all]
#       [--timeout S] -- COMMAND...
#   --name NAME   results in flashinfer/results/ncu_profile/NAME/ (default ncu-<time>); --out DIR: in DIR
#   the other options are those of `python -m common ncu profile` (its --help): a kernel-name regex, launches
#   to skip / profile, an ncu section set (default: the summary metrics of common.tables.kernels.SUMMARY_METRICS), an
#   NVTX range ('decode cuda b=32 kv=4096'), clocks as in un-profiled runs (none, the default) or ncu's base,
#   caches as the application left them (none, the default) or flushed before each pass (all: what the
#   scripts' cold-L2 timing measures; the pipeline's passes use it)
# Examples (the numbered scripts' hidden --ncu-target mode runs each sweep point once, a marker kernel between):
#   ./flashinfer/scripts/ncu_profile.sh --name decode --kernel 'BatchDecode|MergeStates' --set full --count 2 -- \
#       python flashinfer/scripts/03_profile_decode.py --ncu-target --quick --variants cuda
#   ./flashinfer/scripts/ncu_profile.sh --name norm --kernel RMSNormKernel --count 2 -- \
#       python flashinfer/scripts/04_profile_rmsnorm.py --ncu-target --quick
# Writes DIR/ncu.csv (--csv --page raw), DIR/ncu_log.txt, DIR/ncu_app_stdout.txt and DIR/kernels.csv
# (common.tables.kernels.summarize). Needs ncu on PATH and permission to read the GPU counters. Python: $PYTHON.
set -euo pipefail
if [[ " $* " == *" -h "* || " $* " == *" --help "* ]] && [[ " $* " != *" -- "* ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="$ROOT/flashinfer/results/ncu_profile/ncu-$(date +%Y%m%d-%H%M%S)"
ARGS=()
while [[ $# -gt 0 && "$1" != "--" ]]; do
  case "$1" in
    --name) OUT="$ROOT/flashinfer/results/ncu_profile/${2:?--name needs a value}"; shift 2 ;;
    --out) OUT="${2:?--out needs a folder}"; [[ "$OUT" == /* ]] || OUT="$PWD/$OUT"; shift 2 ;;  # relative to here
    *) ARGS+=("$1"); shift ;;
  esac
done
cd "$ROOT"
exec "${PYTHON:-python3}" -m common ncu profile --out "$OUT" ${ARGS[@]+"${ARGS[@]}"} "$@"
