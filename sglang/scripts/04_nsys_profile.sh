#!/usr/bin/env bash
# 04 · A system timeline of a serving run: Nsight Systems where it works, else the torch profiler.
#
# Runs one SGLang server (Llama-3.1-8B shapes, dummy weights) under
#   nsys profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --cuda-graph-trace=node
#                --trace-fork-before-exec=true --capture-range=cudaProfilerApi
# with SGLang's scheduler NVTX ranges on; /start_profile {"activities": ["CUDA_PROFILER"]} opens the
# capture around a burst of requests. Where nsys is not usable (common.nsys.find() finds none, or
# its importer misses libdw) the same window is recorded with the torch profiler through
# /start_profile. Either way: kernel table, GPU busy fraction, idle gaps and the scheduler phase
# the CPU was in during each gap (sglang/scripts/_nsys_profile.py does the work).
#
# Usage:
#   ./sglang/scripts/04_nsys_profile.sh --quick        # ~1.5 min with warm JIT caches
#   ./sglang/scripts/04_nsys_profile.sh                # + the same burst with --disable-overlap-schedule
#   ./sglang/scripts/04_nsys_profile.sh --torch        # torch profiler even where nsys works
#   ./sglang/scripts/04_nsys_profile.sh --help         # every flag (model, backend, port, ...)
# Writes sglang/results/04_nsys_profile/ (kernels.csv, gaps.csv, gaps_by_phase.csv, windows.csv,
# the .nsys-rep or the torch trace, server logs, story.txt, summary.json).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-python3}"
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^set -euo pipefail/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  echo
  exec "$PY" "$ROOT/sglang/scripts/_nsys_profile.py" --help
fi
exec "$PY" "$ROOT/sglang/scripts/_nsys_profile.py" "$@"
