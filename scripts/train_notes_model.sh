#!/usr/bin/env bash
# The whole recipe of the shipped memory model (memagent-notes-135m), one command, resumable: rerun it
# after a stop and each stage continues from its last checkpoint (a finished stage is skipped).
#   stage 1  memagent sft    --config configs/notes-135m-sft.toml   supervised warm start on program-written notes
#   stage 2  memagent train  --config configs/notes-135m-rl.toml    Multi-Conv DAPO from the stage-1 adapter
#   stage 3  memagent sft    --config configs/notes-135m-sft2.toml  supervised again from the stage-2 adapter
#   package  copy the stage-3 adapter into memagent/adapters/notes-135m/ and print its sha256 (pin it in
#            memagent/models.py, NOTES_135M_SHA256)
# On this 2-core machine (shared with other jobs) the stages took 59, 16 and 15 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
memagent sft --config configs/notes-135m-sft.toml "$@"
memagent train --config configs/notes-135m-rl.toml "$@"
memagent sft --config configs/notes-135m-sft2.toml "$@"
python - <<'PY'
import hashlib, shutil
from pathlib import Path
src, dst = Path("runs/notes-135m-sft2/final"), Path("memagent/adapters/notes-135m")
dst.mkdir(parents=True, exist_ok=True)
for name in ("adapter_config.json", "adapter_model.safetensors"):
    shutil.copy(src / name, dst / name)
digest = hashlib.sha256((dst / "adapter_model.safetensors").read_bytes()).hexdigest()
print(f"packaged {dst}; pin NOTES_135M_SHA256 = {digest!r} in memagent/models.py")
PY
