"""Every shipped training config loads, and every file it names is where it says.

Why: a recipe is a chain of configs (each DAPO round starts from the adapter the previous one made and
replays reads kept in benchmarks/results/), run hours apart. A typo in a key, a bad value or a kept
file that moved shows up here in a second instead of after an hour of sampling.
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from memagent.rl.config import TrainConfig, load_config, read_config_file

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.*"))
# read raw, not validated: a broken config must fail its own case below, not the whole module's collection
OUTPUTS = {Path(read_config_file(p).get("output_dir", TrainConfig.output_dir)).as_posix() for p in CONFIGS}


def test_there_are_configs():
    assert len(CONFIGS) >= 10


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_loads_and_its_inputs_exist(path):
    c = load_config(path)  # unknown keys and bad values are ConfigErrors
    for f in list(c.first_step_rollouts) + list(c.rft_rollouts):
        assert (ROOT / f).is_file(), f"{path.name}: stored reads {f} are not in the repo"
    if c.init_adapter:
        a = Path(c.init_adapter)
        # either a folder in the repo, or RUN/final of a config in configs/ that builds it first
        built = a.name == "final" and a.parent.as_posix() in OUTPUTS
        assert built or (ROOT / a / "adapter_model.safetensors").is_file(), \
            f"{path.name}: init_adapter {a} is neither in the repo nor made by another config"


def _stored_reads(collect: Path) -> Path | None:
    """Where a DAPO round's reads were kept: configs/notes-qwen0.5b-dapoNN-collect.toml ->
    benchmarks/results/dapoNN_notes_0.5b/rollouts.jsonl.gz."""
    m = re.fullmatch(r"notes-qwen0\.5b-dapo(\d+)-collect\.toml", collect.name)
    store = m and ROOT / "benchmarks" / "results" / f"dapo{m.group(1)}_notes_0.5b" / "rollouts.jsonl.gz"
    return store if store and store.is_file() else None


def _task(c: TrainConfig):
    """The training task a config draws from, with its model's own tokenizer (as `memagent train` builds it)."""
    from memagent import models
    from memagent.rl.data import make_task
    from memagent.tokenizer import HFTokenizer

    return make_task(c, HFTokenizer.from_file(models.tokenizer_path(c.model)))


COLLECTS = [p for p in CONFIGS if _stored_reads(p)]


def test_every_kept_round_has_its_collect_config():
    assert len(COLLECTS) >= 20


@pytest.mark.parametrize("path", COLLECTS, ids=lambda p: p.name)
def test_collect_config_draws_the_questions_its_kept_reads_were_asked(path):
    """A generator change must not move the documents of an earlier round's seed: its reads are kept, and
    its collect config is how anyone rebuilds them (and the round after it)."""
    c = load_config(path)
    task = _task(c)
    asked = {}
    for line in gzip.open(_stored_reads(path), "rt"):
        r = json.loads(line)
        asked.setdefault(r["sample_id"], (r["question"], tuple(r["answers"])))
    for sid, (question, answers) in asked.items():
        s = task.sample(int(sid.rsplit("-", 1)[1]))
        assert (s.id, s.question, tuple(s.answers)) == (sid, question, answers), f"{path.name}: {sid} moved"


def test_gpu_mixture_config_draws_every_shape_it_names():
    """configs/notes-qwen0.5b-mix-gpu.toml exists to train every shape at once (one round per shape traded
    one for another on CPU): a share or shape list edited into it must not silently drop one."""
    from collections import Counter

    c = load_config(ROOT / "configs" / "notes-qwen0.5b-mix-gpu.toml")
    task = _task(c)
    drawn = [task.sample(i) for i in range(240)]
    kinds = Counter(s.meta["kind"] for s in drawn)
    want = {"needle", "qa"} | {f"prose-{shape}" for shape in c.notes_prose_shapes}
    assert set(kinds) == want, kinds
    assert all(kinds[k] >= 4 for k in want), kinds
    assert {len(s.chunks) for s in drawn} == set(range(1, c.num_chunks + 1))
    worded = [s for s in drawn if s.meta["kind"].startswith("prose") and len(s.answers) == 2]
    assert len(worded) >= 4 and all(not any(ch.isdigit() for ch in s.answers[0]) for s in worded)
