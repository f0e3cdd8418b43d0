#!/usr/bin/env bash
# 06_full_pipeline.sh — the whole FlashInfer track in order, then the reports.
#
# Usage:
#   ./flashinfer/scripts/06_full_pipeline.sh [--quick | --all] [--ncu] [--nsys]
#
#   --quick   (default) every script with --quick: a few points per axis, one cold JIT compile in 07;
#             about 3-4 min on one H100/H200 with a warm FlashInfer JIT cache (a cold cache adds 1-3 min)
#   --all     the full sweeps (8B + 70B layouts, every length; 07 compiles every module cold): ~15-25 min
#   --ncu     pass --ncu to 02-05 (every sweep point once under Nsight Compute -> kernels tables), then run
#             ncu_profile.sh once per kernel class (decode, prefill, norm, rope): 2 launches with the
#             summary metrics in --quick, --set full in --all -> flashinfer/results/ncu_profile/<class>/;
#             adds ~2 min to --quick
#   --nsys    a timeline of one decode sweep and one prefill sweep with Nsight Systems where it is usable
#             (common.nsys.find()); otherwise says so and points at the torch-profiler traces 02/03 write
#             (results/0X_*/trace.json, open in https://ui.perfetto.dev)
#
# Runs 00 01 02 03 04 05 07 in order and keeps going when one fails; prints a table (script, status,
# seconds), writes flashinfer/results/06_full_pipeline/ (steps.csv, one log per step, summary.json),
# then refreshes the reports (python -m common.report --system flashinfer). Exit 1 if any step failed.
# Python: $PYTHON (default python3). Copy-paste:
#   ./flashinfer/scripts/06_full_pipeline.sh --quick
#   ./flashinfer/scripts/06_full_pipeline.sh --quick --ncu --nsys
#   ./flashinfer/scripts/06_full_pipeline.sh --all --ncu
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-python3}"
MODE=quick; NCU=0; NSYS=0
export PIPELINE_COMMAND="$0 $*"   # the provenance of summary.json
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --quick) MODE=quick ;;
    --all) MODE=all ;;
    --ncu) NCU=1 ;;
    --nsys) NSYS=1 ;;
    *) echo "06_full_pipeline.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
cd "$ROOT"
S=flashinfer/scripts
OUT=flashinfer/results/06_full_pipeline
mkdir -p "$OUT"
STEPS_TSV="$OUT/steps.tsv"
printf 'step\tstatus\tseconds\tcommand\n' > "$STEPS_TSV"
Q=(); [[ $MODE == quick ]] && Q=(--quick)
N=(); [[ $NCU == 1 ]] && N=(--ncu)
T0=$(date +%s)
FAILED=0

run_step() {  # run_step NAME COMMAND...: run, log to $OUT/NAME.log, record status and seconds
  local name="$1"; shift
  local t=$(date +%s) rc
  echo
  echo "=== [$(( $(date +%s) - T0 ))s] $name: $*"
  set +e
  "$@" 2>&1 | tee "$OUT/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  local status=ok
  if [[ $rc -ne 0 ]]; then status="failed (rc=$rc)"; FAILED=1; fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$(( $(date +%s) - t ))" "$*" >> "$STEPS_TSV"
  echo "=== $name: $status in $(( $(date +%s) - t )) s"
}

run_step 00_check_env        "$PY" $S/00_check_env.py ${Q[@]+"${Q[@]}"}
run_step 01_test_kernels     "$PY" $S/01_test_kernels.py ${Q[@]+"${Q[@]}"}
run_step 02_profile_prefill  "$PY" $S/02_profile_prefill.py ${Q[@]+"${Q[@]}"} ${N[@]+"${N[@]}"}
run_step 03_profile_decode   "$PY" $S/03_profile_decode.py ${Q[@]+"${Q[@]}"} ${N[@]+"${N[@]}"}
run_step 04_profile_rmsnorm  "$PY" $S/04_profile_rmsnorm.py ${Q[@]+"${Q[@]}"} ${N[@]+"${N[@]}"}
run_step 05_profile_rope     "$PY" $S/05_profile_rope.py ${Q[@]+"${Q[@]}"} ${N[@]+"${N[@]}"}
run_step 07_jit_analysis     "$PY" $S/07_jit_analysis.py ${Q[@]+"${Q[@]}"}

if [[ $NCU == 1 ]]; then
  # one ncu pass per kernel class over the scripts' --ncu-target mode (each sweep point once)
  SET=(--count 2); [[ $MODE == all ]] && SET=(--set full --count 4)
  export PYTHON="$PY"
  run_step ncu_decode  bash $S/ncu_profile.sh --name decode --kernel 'BatchDecode|MergeStates' "${SET[@]}" -- \
    "$PY" $S/03_profile_decode.py --ncu-target --quick --variants cuda
  run_step ncu_prefill bash $S/ncu_profile.sh --name prefill \
    --kernel 'BatchPrefillWithPagedKVCacheKernel|PrefillWithKVCacheKernel|MergeStates' "${SET[@]}" -- \
    "$PY" $S/02_profile_prefill.py --ncu-target --quick --models llama-3.1-8b
  run_step ncu_norm    bash $S/ncu_profile.sh --name norm --kernel 'RMSNormKernel' "${SET[@]}" -- \
    "$PY" $S/04_profile_rmsnorm.py --ncu-target --quick
  run_step ncu_rope    bash $S/ncu_profile.sh --name rope --kernel 'Rotary' "${SET[@]}" -- \
    "$PY" $S/05_profile_rope.py --ncu-target --quick
fi

TIMELINE="none requested"
if [[ $NSYS == 1 ]]; then
  NSYS_EXE="$("$PY" -c 'from common import nsys; print(nsys.find() or "")' 2>/dev/null || true)"
  if [[ -n "$NSYS_EXE" ]]; then
    TIMELINE="nsys ($NSYS_EXE)"
    echo "timeline: Nsight Systems at $NSYS_EXE"
    run_step nsys_timeline "$PY" - <<'EOF'
import sys
from pathlib import Path
from common import nsys, story, trace
out = Path("flashinfer/results/06_full_pipeline/nsys")
for name, script in (("decode", "03_profile_decode.py"), ("prefill", "02_profile_prefill.py")):
    rep = nsys.profile([sys.executable, f"flashinfer/scripts/{script}", "--ncu-target", "--quick"], out, name=name,
                       timeout=600)
    csvs = nsys.stats(rep, ["cuda_gpu_kern_sum", "nvtx_sum"])
    print(f"{name}: {rep}")
    if "cuda_gpu_kern_sum" in csvs:
        k = trace.read_nsys_csv(csvs["cuda_gpu_kern_sum"]).head(8)
        print(story.table(k, ["short", "instances", "total_ns", "avg_ns", "time_pct"]))
EOF
  else
    TIMELINE="torch.profiler (nsys not usable here)"
    echo "timeline: nsys is not usable here (common.nsys.find() found none); the torch-profiler traces written by"
    echo "  02/03 are the timeline: flashinfer/results/02_profile_prefill/trace.json, flashinfer/results/03_profile_decode/trace.json"
    echo "  (open in https://ui.perfetto.dev or chrome://tracing)"
    printf 'timeline\t%s\t0\t%s\n' "ok (torch.profiler fallback)" "see 02/03 trace.json" >> "$STEPS_TSV"
  fi
fi

echo
echo "=== FlashInfer pipeline ($MODE$([[ $NCU == 1 ]] && echo ', ncu')$([[ $NSYS == 1 ]] && echo ', nsys')): $(( $(date +%s) - T0 )) s"
column -t -s $'\t' "$STEPS_TSV" 2>/dev/null || cat "$STEPS_TSV"

# a summary.json for the index (status of every step), then the reports
MODE="$MODE" NCU="$NCU" TIMELINE="$TIMELINE" TOTAL="$(( $(date +%s) - T0 ))" "$PY" - <<'EOF' || true
import os
import pandas as pd
from common import story
from common.results import Run
steps = pd.read_csv("flashinfer/results/06_full_pipeline/steps.tsv", sep="\t")
args = {"mode": os.environ["MODE"], "ncu": os.environ["NCU"] == "1", "timeline": os.environ["TIMELINE"]}
with Run("flashinfer/scripts/06_full_pipeline.sh", args, quiet=True, command=os.environ.get("PIPELINE_COMMAND")) as run:
    run.table("steps", steps)
    ok = int((steps["status"].str.startswith("ok")).sum())
    run.headline(steps_ok=ok, steps=len(steps), total_s=int(os.environ["TOTAL"]))
    run.story(story.tree(f"FLASHINFER PIPELINE --{args['mode']} — {ok}/{len(steps)} steps ok in {os.environ['TOTAL']} s "
                         f"(timeline: {args['timeline']})",
                         [(f"{r.step}: {r.status}, {r.seconds} s", []) for r in steps.itertuples()]))
EOF
"$PY" -m common.report --system flashinfer || echo "report refresh failed (results are kept)"
exit $FAILED
