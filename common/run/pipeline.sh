#!/usr/bin/env bash
# The shared tail of every <system>/scripts/06_full_pipeline.sh (each keeps only its usage header):
#   exec bash common/run/pipeline.sh "${BASH_SOURCE[0]}" <system> "$@"
# --help prints the calling script's header without Python; otherwise the one runner, common/run/pipeline.py,
# runs from the repository root.
set -euo pipefail
caller="$1"; system="$2"; shift 2
for a in "$@"; do
  if [[ "$a" == "-h" || "$a" == "--help" ]]; then
    sed -n '2,/^set -euo pipefail/p' "$caller" | sed '$d; s/^# \{0,1\}//'; exit 0
  fi
done
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
exec "${PYTHON:-python3}" -m common pipeline --system "$system" "$@"
