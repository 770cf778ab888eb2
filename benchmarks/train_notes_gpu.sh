#!/usr/bin/env bash
# Many on-policy DAPO steps for the default memory model on one GPU, then the cells it is weakest on.
#
# The CPU rounds of docs/notes-model.md are one step each (reads sampled with llama.cpp, one update in
# torch), and each gained on its own training shape what it lost on another. This runs
# configs/notes-qwen0.5b-mix-gpu.toml: round 16's adapter, every shape at once, fresh reads every step
# (20 steps of 32 questions x 8 reads; not yet timed on a GPU), then reads the README demo and the
# multi-key and qa_1 cells with the trained adapter on llama.cpp (CPU), beside round 16's stored rows:
#
#   benchmarks/train_notes_gpu.sh                      # train, then measure
#   benchmarks/train_notes_gpu.sh --max-steps 5        # any `memagent train` flag overrides the config
#   THREADS=16 CELLS=demo,niah_multikey_2@16k benchmarks/train_notes_gpu.sh
#
# Needs the model packages that scripts/setup.sh installs (the 0.5B's GGUF is 491 MB, converted to an HF
# folder once). Writes runs/notes-qwen0.5b-mix-gpu/ (metrics.jsonl, curves.png, final/) and a row
# qwen2.5-coder-0.5b+notes-qwen0.5b-mix-gpu+llama.cpp in benchmarks/results/notes_model.json;
# benchmarks/results/notes_grid_mix_gpu.md lays it beside round 16.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi -L || { echo "train_notes_gpu.sh: no NVIDIA GPU visible (on CPU: memagent train --config configs/notes-qwen0.5b-mix-gpu.toml --device cpu)" >&2; exit 2; }
THREADS="${THREADS:-$(nproc)}"
CELLS="${CELLS:-demo,niah_multikey_1@4k,niah_multikey_2@4k,niah_multikey_1@16k,niah_multikey_2@16k,qa_1@4k}"
memagent train --config configs/notes-qwen0.5b-mix-gpu.toml "$@"
python benchmarks/bench_notes_model.py --engine llama.cpp --models qwen2.5-coder-0.5b \
  --adapter runs/notes-qwen0.5b-mix-gpu/final --cells "$CELLS" --gates off --n 8 --threads "$THREADS"
python benchmarks/notes_grid.py --before qwen2.5-coder-0.5b+notes-qwen0.5b-dapo16+llama.cpp \
  --after qwen2.5-coder-0.5b+notes-qwen0.5b-mix-gpu+llama.cpp \
  --md benchmarks/results/notes_grid_mix_gpu.md --png benchmarks/results/notes_model_mix_gpu.png
