"""A from-scratch character-level Llama and its tokenizer, for CI-speed end-to-end training tests.

Nothing is downloaded: the tokenizer is built with the `tokenizers` library (one token per character of
a tiny alphabet, plus <pad> and <eos>), saved as tokenizer.json with a chat template that simply
concatenates the messages, and the model is a random 2-layer LlamaForCausalLM. Paired with
`data.CharKVTask` and `TINY_TEMPLATE`, a rollout is a few dozen tokens, so a whole RL step takes well
under a second on one CPU core.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..prompts import Template

ALPHABET = "abkx=?|->"
TINY_TEMPLATE = Template(name="tiny", update="{question}|{memory}|{chunk}>", final="{question}|{memory}>",
                         empty_memory="-")


def build_tokenizer(folder: str | Path):
    """(transformers tokenizer, memagent HFTokenizer) sharing one tokenizer.json in `folder`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from ..tokenizer import HFTokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"<pad>": 0, "<eos>": 1} | {ch: i + 2 for i, ch in enumerate(ALPHABET)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")
    hf.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    hf.save_pretrained(str(folder))
    return hf, HFTokenizer.from_file(folder / "tokenizer.json")


def build_model(vocab_size: int = len(ALPHABET) + 2, hidden: int = 64, layers: int = 2, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=512, bos_token_id=None, eos_token_id=1, pad_token_id=0,
                      tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = 1
    model.generation_config.pad_token_id = 0
    return model


def tiny_trainer(folder: str | Path, **overrides):
    """A Trainer on the tiny model and CharKVTask (tests, smoke runs, the torchrun example)."""
    from .config import TrainConfig
    from .data import CharKVTask
    from .engine import Trainer

    folder = Path(folder)
    hf, tok = build_tokenizer(folder / f"tok-{os.environ.get('RANK', '0')}")
    settings = dict(model="tiny", memory_tokens=3, answer_tokens=2, questions_per_step=4, num_generations=4,
                    learning_rate=3e-3, warmup_steps=0, beta=0.0, max_steps=100, output_dir=str(folder / "run"),
                    mask_truncated_completions=False, torch_threads=1, rollout_max_batch=64, progress=False)
    settings.update(overrides)
    model = build_model(seed=settings.pop("model_seed", 0))
    config = TrainConfig(**settings)
    return Trainer(config, model=model, hf_tokenizer=hf, tokenizer=tok, task=CharKVTask(num_chunks=2, seed=config.seed),
                   template=TINY_TEMPLATE)


def run_tiny(folder: str | Path, steps: int, **overrides) -> None:
    """Train `steps` steps and save each rank's parameters to folder/params-RANK.pt."""
    import asyncio

    import torch

    from . import dist

    trainer = tiny_trainer(folder, **overrides)
    for _ in range(steps):
        trainer.train_step()
    full = dist.full_state(trainer.model, trainer.optimizer)  # FSDP: the unsharded weights, on rank 0 only
    if full is None:
        torch.save({k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
                   Path(folder) / f"params-{trainer.rank}.pt")
    elif trainer.rank == 0:
        torch.save({k: v.detach().clone() for k, v in full[0].items()}, Path(folder) / "params-0.pt")
    asyncio.run(trainer.aclose())
    dist.finish()
