"""The mean of LoRA adapters (rl/adapter_mean.py) is exact: its weight change is the mean of theirs."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from memagent.rl.adapter_mean import AdapterMeanError, main, mean_adapter

KEY = "base_model.model.model.layers.0.self_attn.q_proj.lora_{}.weight"


def _adapter(folder, seed, r=4, alpha=8, layers=(0,), targets=("q_proj", "v_proj")):
    g = torch.Generator().manual_seed(seed)
    folder.mkdir()
    save_file({KEY.format("A"): torch.randn(r, 6, generator=g), KEY.format("B"): torch.randn(5, r, generator=g)},
              folder / "adapter_model.safetensors")
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": list(targets),
         "layers_to_transform": list(layers), "use_rslora": False, "use_dora": False}))
    return folder


def _delta(folder):
    w, cfg = load_file(folder / "adapter_model.safetensors"), json.loads((folder / "adapter_config.json").read_text())
    return cfg["lora_alpha"] / cfg["r"] * w[KEY.format("B")] @ w[KEY.format("A")]


def test_the_mean_adapter_changes_the_weight_by_the_mean_of_the_changes(tmp_path):
    ins = [_adapter(tmp_path / f"a{i}", seed=i, targets=("q_proj", "v_proj")[::1 - 2 * (i % 2)]) for i in range(3)]
    out = mean_adapter(ins, tmp_path / "mean")
    want = sum(_delta(f) for f in ins) / 3
    assert torch.allclose(_delta(out), want, atol=1e-5)
    assert not torch.allclose(_delta(out), _delta(ins[0]), atol=1e-2)  # it is not just the first
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert (cfg["r"], cfg["lora_alpha"]) == (12, 24)


def test_adapters_that_mean_different_things_are_refused_with_a_clear_error(tmp_path, capsys):
    a = _adapter(tmp_path / "a", seed=0)
    b = _adapter(tmp_path / "b", seed=1, alpha=16)
    with pytest.raises(AdapterMeanError, match="lora_alpha"):
        mean_adapter([a, b], tmp_path / "m")
    with pytest.raises(AdapterMeanError, match="target_modules"):
        mean_adapter([a, _adapter(tmp_path / "c", seed=2, targets=("q_proj",))], tmp_path / "m")
    patterned = _adapter(tmp_path / "d", seed=3)  # a per-module rank on the second adapter only
    cfg = json.loads((patterned / "adapter_config.json").read_text())
    (patterned / "adapter_config.json").write_text(json.dumps(dict(cfg, rank_pattern={"q_proj": 8})))
    with pytest.raises(AdapterMeanError, match="plain LoRA"):
        mean_adapter([a, patterned], tmp_path / "m")
    with pytest.raises(AdapterMeanError, match="at least two"):
        mean_adapter([a], tmp_path / "m")
    assert main([str(tmp_path / "m"), str(a), str(tmp_path / "missing")]) == 1
    assert "not a PEFT adapter folder" in capsys.readouterr().err
