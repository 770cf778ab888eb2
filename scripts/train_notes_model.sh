#!/usr/bin/env bash
# The whole recipe of the shipped memory model (memagent-notes-135m), one command, resumable: rerun it
# after a stop and each stage continues from its last checkpoint (a finished stage is skipped).
#   stage 1  memagent sft    --config configs/notes-135m-sft.toml   supervised warm start on program-written notes
#   stage 2  memagent train  --config configs/notes-135m-rl.toml    Multi-Conv DAPO from the stage-1 adapter
#   package  copy the stage-2 adapter into memagent/adapters/notes-135m/ with its sha256 (the registry pins it)
# On this 2-core machine stage 1 took ~55 min and stage 2 ~25 min (README, "The default model").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
memagent sft --config configs/notes-135m-sft.toml "$@"
memagent train --config configs/notes-135m-rl.toml "$@"
python - <<'PY'
import hashlib, shutil
from pathlib import Path
src, dst = Path("runs/notes-135m-rl/final"), Path("memagent/adapters/notes-135m")
dst.mkdir(parents=True, exist_ok=True)
for name in ("adapter_config.json", "adapter_model.safetensors"):
    shutil.copy(src / name, dst / name)
digest = hashlib.sha256((dst / "adapter_model.safetensors").read_bytes()).hexdigest()
(dst / "SHA256").write_text(f"{digest}  adapter_model.safetensors\n")
print(f"packaged {dst} sha256 {digest}")
PY
