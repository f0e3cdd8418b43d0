#!/usr/bin/env bash
# 06 · The whole FlashInfer track in order (00 01 02 03 04 05 07), then the reports.
#
# Usage:
#   ./flashinfer/scripts/06_full_pipeline.sh [--quick | --all] [--ncu] [--nsys] [--only STEP,...]
#                                            [--no-warmup] [--dry-run]
#   --quick      (default) every script with --quick: a few points per axis
#   --all        the full sweeps (8B + 70B layouts, every length; 07 compiles every module cold)
#   --ncu        adds the ncu passes: --ncu to 02-05, then ncu_profile.sh once per kernel class
#                (decode, prefill, norm, rope -> flashinfer/results/ncu_profile/<class>/)
#   --nsys       adds --nsys to 02 and 03: each re-runs its sweep under Nsight Systems and shows the
#                kernels on a timeline (timeline.csv/.png; the torch-profiler trace where nsys is not usable)
#   --only S,..  only these steps (names as --dry-run prints them); the other rows are kept from the last run
#   --no-warmup  no JIT warm-up (python -m common jit builds the modules the steps load, on all cores, first)
#   --dry-run    print the steps, their commands and the ETA; run nothing
# The runner is common/run/pipeline.py (the same for every system); the steps are declared in
# flashinfer/scripts/_steps.py. Progress lines carry the elapsed time and an ETA from the last run's
# step times (steps.csv). Writes flashinfer/results/06_full_pipeline/ (steps.csv, warmup.csv,
# logs/<step>.log, summary.json) and refreshes the reports only when every step ended ok.
# Exit 0 ok, 1 failed or partial, 2 bad usage or what every step needs missing (one line), 130 interrupted.
# Python: $PYTHON (default python3).
# Examples:
#   ./flashinfer/scripts/06_full_pipeline.sh --quick
#   ./flashinfer/scripts/06_full_pipeline.sh --quick --ncu --nsys
#   ./flashinfer/scripts/06_full_pipeline.sh --only 02_profile_prefill,03_profile_decode --ncu
set -euo pipefail
export PIPELINE_COMMAND="$0 $*"   # the provenance of summary.json
exec bash "$(dirname "${BASH_SOURCE[0]}")/../../common/run/pipeline.sh" "${BASH_SOURCE[0]}" flashinfer "$@"
