#!/usr/bin/env bash
# 06 · The SGLang track in order: 00 -> 05 (and 07 with --all on >= 2 GPUs), then the reports.
#
# Usage:
#   ./sglang/scripts/06_full_pipeline.sh [--quick]   # default: 00-05 in quick mode, one GPU;
#                                                    # 536 s on one H200 (2026-11-21, warm JIT caches)
#   ./sglang/scripts/06_full_pipeline.sh --all       # every script's full run; 07 too when >= 2 GPUs
#   ./sglang/scripts/06_full_pipeline.sh --nsys      # only the Nsight Systems step (04)
#   ./sglang/scripts/06_full_pipeline.sh --ncu       # only the Nsight Compute step (05)
#                                                    # (--nsys --ncu: both; combine with --all for full runs)
#   ./sglang/scripts/06_full_pipeline.sh --help
# Keeps going when a step fails, prints a summary table (script, status, seconds), then refreshes
# the report blocks (python -m common.report --system sglang). Exit 1 if any step failed.
# Extra variables: PYTHON (interpreter, default python3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-python3}"
S="$ROOT/sglang/scripts"
MODE=quick; ONLY_NSYS=0; ONLY_NCU=0
export PIPELINE_COMMAND="$0 $*"   # the provenance of summary.json
for a in "$@"; do
  case "$a" in
    --quick) MODE=quick ;;
    --all) MODE=all ;;
    --nsys) ONLY_NSYS=1 ;;
    --ncu) ONLY_NCU=1 ;;
    -h|--help) sed -n '2,/^set -euo pipefail/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "06_full_pipeline.sh: unknown flag '$a' (see --help)" >&2; exit 2 ;;
  esac
done
Q=(); [[ "$MODE" == quick ]] && Q=(--quick)
STEPS=()
if [[ $ONLY_NSYS == 0 && $ONLY_NCU == 0 ]]; then
  STEPS+=("00_check_env.py" "01_baseline_perf.py" "02_radix_cache_analysis.py" "03_backend_comparison.py"
          "04_nsys_profile.sh" "05_ncu_attention.sh")
  if [[ "$MODE" == all ]]; then
    NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    if [[ "${NGPU:-0}" -ge 2 ]]; then STEPS+=("07_tp_scaling.sh"); else
      echo "06: 07_tp_scaling.sh skipped (${NGPU:-0} GPU visible; it needs >= 2)"; fi
  fi
else
  [[ $ONLY_NSYS == 1 ]] && STEPS+=("04_nsys_profile.sh")
  [[ $ONLY_NCU == 1 ]] && STEPS+=("05_ncu_attention.sh")
fi

cd "$ROOT"
NAMES=(); STATUS=(); SECS=(); FAILED=0; T_ALL=$SECONDS
for i in "${!STEPS[@]}"; do
  st="${STEPS[$i]}"
  echo; echo "================ [$((i + 1))/${#STEPS[@]}] $st ${Q[*]:-} ($(date +%H:%M:%S)) ================"
  t0=$SECONDS
  if [[ "$st" == *.py ]]; then cmd=("$PY" "$S/$st" "${Q[@]}"); else cmd=("$S/$st" "${Q[@]}"); fi
  set +e
  "${cmd[@]}"
  rc=$?
  set -e
  case $rc in
    0) s=ok ;;
    2) s="setup-error (rc 2)"; FAILED=1 ;;
    130) s="interrupted"; FAILED=1 ;;
    *) s="failed (rc $rc)"; FAILED=1 ;;
  esac
  NAMES+=("$st"); STATUS+=("$s"); SECS+=($((SECONDS - t0)))
  echo "---------------- $st: $s after $((SECONDS - t0)) s (total $((SECONDS - T_ALL)) s)"
  [[ $rc == 130 ]] && break
done

echo; echo "SGLang pipeline ($MODE) summary"
printf '%-30s %-22s %8s\n' script status seconds
printf '%-30s %-22s %8s\n' ------------------------------ ---------------------- --------
for i in "${!NAMES[@]}"; do printf '%-30s %-22s %8s\n' "${NAMES[$i]}" "${STATUS[$i]}" "${SECS[$i]}"; done
printf '%-30s %-22s %8s\n' total "" "$((SECONDS - T_ALL))"
# the pipeline's own record: sglang/results/06_full_pipeline/ (steps.csv, story.txt, summary.json)
ROWS=""; for i in "${!NAMES[@]}"; do ROWS+="${NAMES[$i]}"$'\t'"${STATUS[$i]}"$'\t'"${SECS[$i]}"$'\n'; done
STEPS_TSV="$ROWS" MODE="$MODE" "$PY" - <<'PYEOF' || echo "06: could not write results/06_full_pipeline"
import os, sys
sys.path.insert(0, os.getcwd())
from common import story
from common.results import Run
rows = [dict(zip(("script", "status", "seconds"), l.split("\t"))) for l in os.environ["STEPS_TSV"].splitlines() if l]
for r in rows:
    r["seconds"] = int(r["seconds"])
with Run("sglang/scripts/06_full_pipeline.sh", {"mode": os.environ["MODE"]}, quiet=True,
         command=os.environ.get("PIPELINE_COMMAND")) as run:
    run.table("steps", rows)
    run.headline(steps=len(rows), failed=sum(r["status"] != "ok" for r in rows), total_s=sum(r["seconds"] for r in rows))
    run.story(f"SGLANG PIPELINE ({os.environ['MODE']})\n" + story.table(rows, ["script", "status", "seconds"]))
PYEOF
echo
"$PY" -m common.report --system sglang || echo "06: report refresh failed (results are still in sglang/results/)"
exit $FAILED
