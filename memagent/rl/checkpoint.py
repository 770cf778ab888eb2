"""Checkpoints that resume *exactly*: trainable weights, optimizer, scheduler, RNG, step, data position.

Why each piece: weights alone would restart Adam's moments (a visible jump in the curves); the step
and scheduler keep the learning-rate schedule in place; the per-rank data cursors make the next batch
the one that would have come; RNG states make sampling continue identically (the trainer also reseeds
from (seed, step, rank) at every step, so even a different torch build cannot drift the sampling).
Only trainable tensors are saved for LoRA (the adapter), the whole state for a full fine-tune.
A checkpoint is written to a temporary folder and renamed, so a crash never leaves half of one.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import torch


def trainable_state(model) -> dict[str, torch.Tensor]:
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if k in names}


def rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(directory: str | Path, model, optimizer, scheduler, trainer_state: dict, config: dict,
         full: tuple[dict, dict] | None = None) -> Path:
    """`full`: (model, optimizer) states gathered from FSDP shards (rl/dist.full_state); None: local ones."""
    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if full is not None:
        names = {n for n, p in model.named_parameters() if p.requires_grad}
        torch.save({k: v for k, v in full[0].items() if k in names}, tmp / "weights.pt")
        torch.save(full[1], tmp / "optimizer.pt")
    else:
        torch.save(trainable_state(model), tmp / "weights.pt")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=1))
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    old = directory.with_name(directory.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if directory.exists():
        os.replace(directory, old)
    os.replace(tmp, directory)
    shutil.rmtree(old, ignore_errors=True)
    return directory


def exists(directory: str | Path) -> bool:
    return (Path(directory) / "trainer_state.json").is_file()


def load(directory: str | Path, model, optimizer, scheduler) -> dict:
    directory = Path(directory)
    weights = torch.load(directory / "weights.pt", map_location="cpu")
    missing = set(weights) - set(model.state_dict())
    if missing:
        raise ValueError(f"checkpoint {directory} does not fit this model (e.g. {sorted(missing)[0]}); "
                         "was it written with other use_peft/lora settings?")
    optim_state = torch.load(directory / "optimizer.pt", map_location="cpu", weights_only=False)
    from . import dist

    if dist.fsdp_on():  # full tensors in the files, shards in the model: FSDP cuts them up
        dist.load_full_state(model, optimizer, weights, optim_state)
    else:
        model.load_state_dict(weights, strict=False)
        optimizer.load_state_dict(optim_state)
    scheduler.load_state_dict(torch.load(directory / "scheduler.pt", weights_only=False))
    set_rng_state(torch.load(directory / "rng.pt", weights_only=False))
    return json.loads((directory / "trainer_state.json").read_text())
