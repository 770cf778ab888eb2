#!/usr/bin/env bash
# The main job on a fresh clone: set up, then ask the embedded offline model about a bundled document.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
memagent ask memagent/examples/keeper_log.txt \
  "What is the lowest barometer reading recorded in the ledger?" \
  "What is the name of the relief keeper?" "$@"
