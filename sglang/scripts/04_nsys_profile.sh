#!/usr/bin/env bash
# 04 · A system timeline of a serving run: Nsight Systems where it works, else the torch profiler.
#
# Usage:
#   ./sglang/scripts/04_nsys_profile.sh --quick        # ~1.5 min with warm JIT caches
#   ./sglang/scripts/04_nsys_profile.sh                # + the same burst with --disable-overlap-schedule
#   ./sglang/scripts/04_nsys_profile.sh --torch        # torch profiler even where nsys works
#   ./sglang/scripts/04_nsys_profile.sh --reanalyse DIR   # no GPU: redo the analysis of an earlier run
# Runs sglang/scripts/04_nsys_profile.py with the same flags (its --help, below, has every flag).
# Python: $PYTHON (default python3). Writes sglang/results/04_nsys_profile/.
set -euo pipefail
[[ " $* " == *" --help "* || " $* " == *" -h "* ]] && sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
exec "${PYTHON:-python3}" "${BASH_SOURCE[0]%.sh}.py" "$@"
