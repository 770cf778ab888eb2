"""`memagent train --config FILE [--any-config-key VALUE ...]`: Multi-Conv DAPO from the command line.

This module stays free of torch at import time (the CLI imports it to register the subcommand); the
loop itself is memagent.rl.engine. Data parallel: `torchrun --nproc_per_node=N -m memagent train ...`
(gloo on CPU, nccl on CUDA); every rank reads the same config.

Outputs in `output_dir`: metrics.jsonl (one line per step), curves.png, checkpoint/ (exact resume: rerun
the same command), final/ (the trained model or LoRA adapter, save_pretrained format).
"""
from __future__ import annotations

import sys

from .config import ConfigError, TrainConfig, add_config_flags, load_config, overrides_from_args


def add_config_command(subparsers, name: str, help: str, description: str, func) -> None:
    """A subcommand configured by one TrainConfig file plus a flag per key (`train`, `sft`)."""
    p = subparsers.add_parser(name, help=help, description=description)
    p.add_argument("--config", default=None, help="TOML/YAML/JSON file with TrainConfig keys (flags override it; "
                                                  "default: none, every key then takes its default)")
    add_config_flags(p)
    p.set_defaults(func=func)


def add_parser(subparsers) -> None:
    add_config_command(subparsers, "train", "train the memory agent with Multi-Conv DAPO (RL)",
                       __doc__.split("\n\n")[0], main)


def train_steps(trainer, show: bool = True, on_step=None) -> dict:
    """Step `trainer` up to its config's max_steps under a progress bar; `on_step(record)` sees every
    step's metrics. Shared by `memagent train` and benchmarks/train_demo.py. Returns the last record."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    last: dict = {}
    with Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                  TimeElapsedColumn(), TimeRemainingColumn(), disable=not show, transient=False) as bar:
        task = bar.add_task("", total=trainer.config.max_steps, completed=trainer.step)
        while trainer.step < trainer.config.max_steps:
            last = trainer.train_step()
            bar.update(task, completed=trainer.step,
                       description=f"reward {last['reward']:.2f} kept {last['groups_kept']} "
                                   f"loss {last.get('loss', float('nan')):.4f}")
            if on_step:
                on_step(last)
    return last


def run(config: TrainConfig, trainer_kwargs: dict | None = None) -> dict:
    """Train for config.max_steps (resuming if a checkpoint exists); returns the last metrics record."""
    import asyncio

    from . import dist
    from .engine import Trainer

    config.require_steps("memagent train")
    trainer = Trainer(config, **(trainer_kwargs or {}))
    last: dict = {}
    try:
        last = train_steps(trainer, show=config.progress and trainer.rank == 0)
        trainer.save()
        trainer.save_final()
        trainer.plot()
    finally:
        asyncio.run(trainer.aclose())
        dist.finish()
    return last


def main(args) -> int:
    try:
        config = load_config(getattr(args, "config", None), overrides_from_args(args))
        config.require_steps("memagent train")  # here too, so a bad config exits 2
    except ConfigError as e:
        print(f"memagent train: error: {e}", file=sys.stderr)
        return 2
    from .engine import TrainError

    try:
        last = run(config)
    except (TrainError, ConfigError, FileNotFoundError) as e:
        print(f"memagent train: error: {e}", file=sys.stderr)
        return 1
    if last:
        print(f"memagent train: step {last['step']} reward {last['reward']:.3f} -> {config.output_dir}")
    return 0
