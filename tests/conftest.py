import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see memagent/__init__.py
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# CI must not be random: with CI=true (set by .ci/run) hypothesis runs a derandomised profile (examples
# derived from each test's source, no example database), so a run fails or passes the same way every
# time; locally the default profile keeps exploring at random. Examples random runs found are kept as
# explicit @example cases next to their properties, so CI checks them too.
from hypothesis import HealthCheck, settings as _hyp_settings  # noqa: E402

_hyp_settings.register_profile("ci", derandomize=True, database=None, print_blob=True,
                               suppress_health_check=[HealthCheck.too_slow])
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    _hyp_settings.load_profile("ci")


@pytest.fixture(scope="session")
def report_samples(smol_tokenizer):
    """report_samples(shape, seed): a notes task drawing only `shape` (report or roster: whole documents
    about one organisation) over 1-2 chunks of 512, as DAPO rounds 24 and 25 drew them, and its first 80
    samples."""
    from memagent.rl.notes_data import NotesTask

    def draw(shape: str, seed: int, n: int = 80):
        t = NotesTask(smol_tokenizer, chunk_tokens=512, max_chunks=2, min_chunks=1, memory_tokens=64, seed=seed,
                      qa_share=0.0, prose_share=1.0, prose_shapes=(shape,), early_share=0.45, late_share=0.45)
        return t, [t.sample(i) for i in range(n)]
    return draw


@pytest.fixture(scope="session")
def smol_tokenizer():
    """SmolLM2's real tokenizer (byte-level BPE), converted once from the packaged GGUF and cached."""
    from memagent import models
    from memagent.tokenizer import HFTokenizer

    return HFTokenizer.from_file(models.tokenizer_path("smollm2-135m"))


@pytest.fixture(scope="session")
def essays():
    import importlib.resources as r
    import json

    return json.loads((r.files("long_context_eval") / "data/synthetic/json/PaulGrahamEssays.json").read_text())["text"]
