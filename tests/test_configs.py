"""Every shipped training config loads, and every file it names is where it says.

Why: a recipe is a chain of configs (each DAPO round starts from the adapter the previous one made and
replays reads kept in benchmarks/results/), run hours apart. A typo in a key, a bad value or a kept
file that moved shows up here in a second instead of after an hour of sampling.
"""
from __future__ import annotations

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
