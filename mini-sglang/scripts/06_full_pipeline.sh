#!/usr/bin/env bash
# 06 · The whole mini-SGLang track in order (00 01 02 03 04 05 07 08), then the reports.
#
# Usage:
#   ./mini-sglang/scripts/06_full_pipeline.sh [--quick | --all] [--ncu] [--nsys] [--only STEP,...]
#                                             [--no-warmup] [--dry-run]
#   --quick      (default) every script with --quick
#   --all        every script's full experiment (02-04 include their ncu passes there)
#   --ncu        adds the ncu passes of 02, 03 and 04 to --quick
#   --nsys       08_forward_timeline also runs its eager case under Nsight Systems (its
#                torch-profiler timeline where nsys is not usable)
#   --only S,..  only these steps (names as --dry-run prints them); the other rows are kept from the last run
#   --no-warmup  no JIT warm-up (python -m common jit builds the tvm-ffi and FlashInfer modules first)
#   --dry-run    print the steps, their commands and the ETA; run nothing
# 05_profile_comm needs 2 GPUs for its measurement and says so ([skip]) on one. The runner is
# common/run/pipeline.py (the same for every system); the steps are declared in
# mini-sglang/scripts/_steps.py. Progress lines carry the elapsed time and an ETA from the last run's
# step times (steps.csv). Writes mini-sglang/results/06_full_pipeline/ (steps.csv, warmup.csv,
# logs/<step>.log, summary.json) and refreshes the reports only when every step ended ok.
# Exit 0 ok, 1 failed or partial, 2 bad usage or what every step needs missing (one line), 130 interrupted.
# Python: $PYTHON (default python3).
# Examples:
#   ./mini-sglang/scripts/06_full_pipeline.sh --quick
#   ./mini-sglang/scripts/06_full_pipeline.sh --quick --ncu --nsys
#   ./mini-sglang/scripts/06_full_pipeline.sh --only 02_profile_index,03_profile_store --ncu
set -euo pipefail
export PIPELINE_COMMAND="$0 $*"   # the provenance of summary.json
exec bash "$(dirname "${BASH_SOURCE[0]}")/../../common/run/pipeline.sh" "${BASH_SOURCE[0]}" mini-sglang "$@"
