"""The mean of several LoRA adapters of one base, as one adapter (a "model soup" of DAPO rounds).

Why: since round 17 every one-step DAPO round from the default has traded held-out questions (about ten
lost and ten gained of 96, docs/notes-model.md), each round moving different documents. If those moves
are partly noise of one step on a few mixed groups, the mean of the rounds' weight changes keeps what
they share and shrinks what they do not, at no training cost.

Why not average the A and B matrices: a LoRA's change to a weight is scale * B @ A, and the mean of
products is not the product of means. The mean of N adapters is exactly one adapter of rank N * r: A
stacks the N A's, B places the N B's side by side divided by N, and lora_alpha grows with the rank so
that the scale alpha / r stays the same. So the soup is exact, and llama.cpp runs it like any adapter.

    python -m memagent.rl.adapter_mean OUT_DIR ADAPTER_DIR ADAPTER_DIR [...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

# keys that must agree for the stacked adapter to mean what the inputs mean
_SAME = ("r", "lora_alpha", "target_modules", "layers_to_transform", "use_rslora", "use_dora", "fan_in_fan_out")


class AdapterMeanError(ValueError):
    pass


def mean_adapter(folders: list[str | Path], out: str | Path) -> Path:
    """Write the exact mean of the adapters in `folders` (PEFT LoRA folders) to `out`; returns `out`."""
    import torch
    from safetensors.torch import load_file, save_file

    if len(folders) < 2:
        raise AdapterMeanError("give at least two adapters to average")
    configs, weights = [], []
    for f in map(Path, folders):
        cfg, st = f / "adapter_config.json", f / "adapter_model.safetensors"
        if not cfg.is_file() or not st.is_file():
            raise AdapterMeanError(f"{f} is not a PEFT adapter folder (adapter_config.json and "
                                   f"adapter_model.safetensors)")
        configs.append(json.loads(cfg.read_text()))
        weights.append(load_file(st))
    for key in _SAME:
        # PEFT writes target_modules from a set, so its order differs between runs of one recipe
        values = {json.dumps(sorted(v) if key == "target_modules" and isinstance(v, list) else v, sort_keys=True)
                  for v in (c.get(key) for c in configs)}
        if len(values) > 1:
            raise AdapterMeanError(f"the adapters differ in {key}: {sorted(values)}")
    if any(c.get("use_dora") or c.get("rank_pattern") or c.get("alpha_pattern") for c in configs):
        raise AdapterMeanError("only plain LoRA with one rank and alpha can be averaged this way")
    keys = set(weights[0])
    if any(set(w) != keys for w in weights):
        raise AdapterMeanError("the adapters train different weights")
    n = len(weights)
    merged = {}
    for k in sorted(keys):
        if ".lora_A." in k:
            merged[k] = torch.cat([w[k] for w in weights], dim=0).contiguous()
        elif ".lora_B." in k:
            merged[k] = (torch.cat([w[k] for w in weights], dim=1) / n).contiguous()
        else:
            raise AdapterMeanError(f"unexpected tensor {k} (only lora_A / lora_B are averaged)")
    cfg = dict(configs[0], r=configs[0]["r"] * n, lora_alpha=configs[0]["lora_alpha"] * n)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(merged, out / "adapter_model.safetensors")
    (out / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
    (out / "SOURCES.txt").write_text("mean of:\n" + "".join(f"{Path(f)}\n" for f in folders))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    try:
        out = mean_adapter(argv[1:], argv[0])
    except AdapterMeanError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote the mean of {len(argv) - 1} adapters to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
