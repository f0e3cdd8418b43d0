#!/usr/bin/env bash
# 06_full_pipeline.sh — the whole mini-SGLang track in order, then the reports.
#
# Usage (from anywhere; paths are resolved from this file):
#   ./mini-sglang/scripts/06_full_pipeline.sh            # = --quick
#   ./mini-sglang/scripts/06_full_pipeline.sh --quick    # every script with --quick: < 5 min on one GPU (warm JIT caches)
#   ./mini-sglang/scripts/06_full_pipeline.sh --all      # every script's full experiment, ncu passes included (~30 min)
#   ./mini-sglang/scripts/06_full_pipeline.sh --quick --ncu    # + the ncu passes of 02, 03 and 04
#   ./mini-sglang/scripts/06_full_pipeline.sh --quick --nsys   # + 06_forward_timeline under Nsight Systems
#                                                              #   (nsys where usable, else its torch-profiler timeline)
# Runs 00_check_env, 01_test_kernels, 02_profile_index, 03_profile_store, 04_profile_attention,
# 05_profile_comm (says so and exits 0 on one GPU), 06_forward_timeline and 07_profile_radix, keeps
# going when one fails, prints a table (script, status, seconds), records it in
# mini-sglang/results/06_full_pipeline/, then `python -m common.report --system mini-sglang`.
# Exit status: 1 if any script failed (setup errors included), else 0. PYTHON overrides python3.
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
MODE=quick NCU=0 NSYS=0
export PIPELINE_COMMAND="$0 $*"   # the provenance of summary.json
for a in "$@"; do
  case "$a" in
    --quick) MODE=quick ;;
    --all) MODE=all ;;
    --ncu) NCU=1 ;;
    --nsys) NSYS=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown option: $a" >&2; usage >&2; exit 2 ;;
  esac
done

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY="${PYTHON:-python3}"
OUT="$ROOT/mini-sglang/results/06_full_pipeline"
mkdir -p "$OUT/logs"
cd "$ROOT"

Q=(); [[ $MODE == quick ]] && Q=(--quick)
N=(); [[ $MODE == quick && $NCU == 1 ]] && N=(--ncu)
S=(); [[ $NSYS == 1 ]] && S=(--nsys)
STEPS=(
  "00_check_env.py ${Q[*]-}"
  "01_test_kernels.py ${Q[*]-}"
  "02_profile_index.py ${Q[*]-} ${N[*]-}"
  "03_profile_store.py ${Q[*]-} ${N[*]-}"
  "04_profile_attention.py ${Q[*]-} ${N[*]-}"
  "05_profile_comm.py ${Q[*]-}"
  "06_forward_timeline.py ${Q[*]-} ${S[*]-}"
  "07_profile_radix.py ${Q[*]-}"
)

T0=$(date +%s)
ROWS=()
FAILED=0
i=0
for step in "${STEPS[@]}"; do
  i=$((i + 1))
  read -r -a cmd <<< "$step"
  name="${cmd[0]%.py}"
  echo "== [$i/${#STEPS[@]}] $PY mini-sglang/scripts/${cmd[*]}   (t=$(( $(date +%s) - T0 ))s)"
  s=$(date +%s)
  set +e
  "$PY" "mini-sglang/scripts/${cmd[0]}" "${cmd[@]:1}" 2>&1 | tee "$OUT/logs/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  secs=$(( $(date +%s) - s ))
  case $rc in
    0) status=ok; grep -q '^\[skip\]' "$OUT/logs/$name.log" && status="ok (skipped: see log)" ;;
    2) status="setup error"; FAILED=$((FAILED + 1)) ;;
    130) status=interrupted; FAILED=$((FAILED + 1)) ;;
    *) status="failed (rc=$rc)"; FAILED=$((FAILED + 1)) ;;
  esac
  ROWS+=("${cmd[*]}|$status|$secs")
done
TOTAL=$(( $(date +%s) - T0 ))

echo
printf '%-44s %-24s %8s\n' script status seconds
printf '%-44s %-24s %8s\n' "--------------------------------------------" "------------------------" "--------"
for r in "${ROWS[@]}"; do
  IFS='|' read -r sc st se <<< "$r"
  printf '%-44s %-24s %8s\n' "$sc" "$st" "$se"
done
printf '%-44s %-24s %8s\n' "total ($MODE)" "$FAILED failed" "$TOTAL"

# record the run like the numbered scripts do (results/06_full_pipeline/summary.json, steps.csv)
printf '%s\n' "${ROWS[@]}" | "$PY" -c '
import os, sys
sys.path.insert(0, sys.argv[1])
from common import story
from common.results import Run
rows = [dict(zip(("script", "status", "seconds"), l.rstrip("\n").split("|"))) for l in sys.stdin if l.strip()]
for r in rows:
    r["seconds"] = int(r["seconds"])
with Run(sys.argv[2], {"mode": sys.argv[3], "ncu": sys.argv[4] == "1", "nsys": sys.argv[5] == "1"}, quiet=True,
         command=os.environ.get("PIPELINE_COMMAND")) as run:
    run.table("steps", rows)
    failed = [r for r in rows if not r["status"].startswith("ok")]
    run.headline(scripts=len(rows), failed=len(failed), total_s=sum(r["seconds"] for r in rows))
    run.story(story.table(rows, ["script", "status", "seconds"]))
' "$ROOT" "$HERE/06_full_pipeline.sh" "$MODE" "$NCU" "$NSYS" || echo "note: could not record the pipeline summary"

echo
echo "== reports: $PY -m common.report --system mini-sglang"
"$PY" -m common.report --system mini-sglang || echo "note: report refresh failed (the results above are kept)"
[[ $FAILED -eq 0 ]] || exit 1
