#!/usr/bin/env bash
# The test command (CI calls it through .ci/run): set up, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
python -m pytest -q -p no:cacheprovider "$@"
