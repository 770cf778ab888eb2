"""The embedded default is our trained memory model, and it answers the README demo.

Why a test: `bash scripts/demo.sh` is the first thing a new user runs, and for 33 stops it printed wrong
answers. This reads the bundled document with the real default model, engine and reading settings
(exactly what the demo runs, greedy, so the result is deterministic) and checks both answers against
what the document states. The document is never in the training data
(tests/test_notes_training.py checks the vocabulary). About 30 s on 2 cores.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

from memagent import models

ROOT = Path(__file__).resolve().parents[1]
DEMO = {"What is the lowest barometer reading recorded in the ledger?": "943 millibars",
        "What is the name of the relief keeper?": "Agnes Varley"}


def test_the_default_is_a_trained_pinned_model_on_llamacpp():
    spec = models.get_spec(models.DEFAULT_MODEL)
    assert spec.adapter and spec.base == "qwen2.5-coder-0.5b"  # a trained adapter on a registered base
    assert models.verify_adapter(spec).is_file()  # the shipped file matches its sha256 pin
    assert spec.engine == "llama.cpp" and models.default_engine(None) == "llama.cpp"
    assert (spec.chunk_tokens, spec.memory_tokens, spec.default_template) == (512, 64, "notes")


def test_the_default_answers_the_readme_demo():
    proc = subprocess.run([sys.executable, "-m", "memagent", "ask", str(ROOT / "memagent/examples/keeper_log.txt"),
                           *DEMO, "--json"], capture_output=True, text=True, timeout=900, cwd=ROOT,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    answers = {o["question"]: o["answer"] for o in out}
    assert set(answers) == set(DEMO)
    for question, gold in DEMO.items():
        assert gold.lower() in answers[question].lower(), (question, answers[question], proc.stderr[-1500:])
