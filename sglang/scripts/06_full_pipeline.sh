#!/usr/bin/env bash
# 06 · The SGLang track in order: 00 01 02 03 08 (+04 with --nsys, 05 with --ncu, 07 with --all on >= 2 GPUs).
#
# Usage:
#   ./sglang/scripts/06_full_pipeline.sh [--quick | --all] [--ncu] [--nsys] [--only STEP,...]
#                                        [--no-warmup] [--dry-run]
#   --quick      (default) every script with --quick, one GPU
#   --all        every script's full run; 07_tp_scaling too when >= 2 GPUs are visible
#   --ncu        adds the Nsight Compute passes: 05_ncu_attention and the counters phase of 08
#   --nsys       adds the timeline step 04_nsys_profile (Nsight Systems, else the torch profiler)
#   --only S,..  only these steps (names as --dry-run prints them); the other rows are kept from the last run
#   --no-warmup  no JIT warm-up (python -m common jit builds the FlashInfer modules an SGLang server
#                compiles during its CUDA-graph capture: batch_prefill fa2 and sm90, cascade, norm)
#   --dry-run    print the steps, their commands and the ETA; run nothing
# With --quick one SGLang server per configuration (_sglang.SharedServer): server:default for 01, 02, 03, 08,
# server:lpm for 02's LPM pass, server:triton for 03's Triton variant; all three launched when the run begins,
# held after their imports (no GPU work) until their rows, stopped after their last step, on failure or Ctrl-C.
# The runner is common/run/pipeline.py (the same for every system); the steps are declared in
# sglang/scripts/_steps.py. Progress lines carry the elapsed time and an ETA from the last run's
# step times (steps.csv). Writes sglang/results/06_full_pipeline/ (steps.csv, warmup.csv, server_starts.csv,
# logs/<step>.log, summary.json) and refreshes the reports only when every step ended ok.
# Exit 0 ok, 1 failed or partial, 2 bad usage or what every step needs missing (one line), 130 interrupted.
# Python: $PYTHON (default python3).
# Examples:
#   ./sglang/scripts/06_full_pipeline.sh --quick
#   ./sglang/scripts/06_full_pipeline.sh --all
#   ./sglang/scripts/06_full_pipeline.sh --only 04_nsys_profile,05_ncu_attention
set -euo pipefail
export PIPELINE_COMMAND="$0 $*"   # the provenance of summary.json
exec bash "$(dirname "${BASH_SOURCE[0]}")/../../common/run/pipeline.sh" "${BASH_SOURCE[0]}" sglang "$@"
