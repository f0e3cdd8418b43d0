#!/usr/bin/env bash
# ncu_profile.sh — one mini-SGLang kernel family under Nsight Compute, with a per-kernel table.
#
# Usage:
#   ./mini-sglang/scripts/ncu_profile.sh --kernel index|store|attention|comm|REGEX [--set full]
#        [--count N] [--skip N] [--out DIR] -- python <script> [args]
# Examples:
#   ./mini-sglang/scripts/ncu_profile.sh --kernel index --set full -- \
#       python mini-sglang/scripts/02_profile_index.py --ncu-target --quick
#   ./mini-sglang/scripts/ncu_profile.sh --kernel store -- python mini-sglang/scripts/03_profile_store.py --ncu-target --quick
#   ./mini-sglang/scripts/ncu_profile.sh --kernel attention --set full --count 4 -- \
#       python mini-sglang/scripts/04_profile_attention.py --ncu-target --quick
# Kernel names: index -> index_kernel (also masked_index_kernel), store -> store_kv_cache,
# attention -> FlashInfer BatchPrefill/BatchDecode/MergeState (and FA3 'flash'), comm -> nccl.
# Writes DIR (default mini-sglang/results/ncu_<kernel>/): ncu.csv, ncu_log.txt, kernels.csv.
# Clocks are left alone (--clock-control none) so times match un-profiled runs.
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
KERNEL="" SET="" COUNT="" SKIP="" OUTDIR=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --kernel) KERNEL="$2"; shift 2 ;;
    --set) SET="$2"; shift 2 ;;
    --count) COUNT="$2"; shift 2 ;;
    --skip) SKIP="$2"; shift 2 ;;
    --out) OUTDIR="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "unknown option: $1" >&2; usage >&2; exit 2 ;;
  esac
done
[[ -n "$KERNEL" && $# -gt 0 ]] || { usage >&2; exit 2; }

case "$KERNEL" in
  index) RX='index_kernel' ;;
  store) RX='store_kv_cache' ;;
  attention) RX='BatchPrefill|BatchDecode|MergeState|flash|Flash' ;;
  comm) RX='nccl' ;;
  *) RX="$KERNEL" ;;
esac
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUTDIR="${OUTDIR:-$ROOT/mini-sglang/results/ncu_${KERNEL//[^A-Za-z0-9_]/_}}"
ARGS=(profile --out "$OUTDIR" --kernel "$RX" --clock-control none)
[[ -n "$SET" ]] && ARGS+=(--set "$SET")
[[ -n "$COUNT" ]] && ARGS+=(--count "$COUNT")
[[ -n "$SKIP" ]] && ARGS+=(--skip "$SKIP")
cd "$ROOT"
echo "== ncu: kernels matching '$RX' -> $OUTDIR"
exec "${PYTHON:-python3}" -m common.ncu "${ARGS[@]}" -- "$@"
