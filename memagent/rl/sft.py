"""`memagent sft --config FILE`: the supervised warm start before Multi-Conv DAPO.

Why a warm start: on a 2-core CPU, RL from an untrained 135M model gets almost no signal: its sampled
reads are nearly all wrong on documents with look-alike facts, so most groups have equal rewards and are
dropped. Here the model imitates the notes a program writes with full knowledge of where the evidence is
(rl/notes_data.py: every evidence sentence seen so far, verbatim), and the final answer in \\boxed{}.
The prompts are rendered by the same `Reader` inference uses, so the model learns the exact conversations
it will see; the loss is the mean cross-entropy over response tokens (prompt tokens are not trained).
`sft_first_token_weight` > 1 weighs each response's first token more: in a memory update that token
decides keep or drop (the empty marker's "(" against the start of a kept sentence), and it is one token
among dozens, so unweighted it barely moves the loss. A final answer's first token is always the start
of `\\boxed{`, learned at once, so the extra weight there costs nothing. The logged `loss` stays the
unweighted mean, comparable across runs.

Which turns of a document are trained: every update whose chunk holds new evidence, one update that
must keep the notes unchanged (evidence already found, only distractors or filler here), one update
that must leave the notes empty (nothing found yet), and the final answer. Copy turns are cheap to learn;
training all of them would spend most of the budget on the easiest behaviour.

Outputs, like `memagent train`: output_dir/metrics.jsonl, checkpoint/ (exact resume: rerun the same
command), final/ (the LoRA adapter, save_pretrained format).
"""
from __future__ import annotations

import json
import math
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

from .config import ConfigError, TrainConfig, load_config, overrides_from_args


def add_parser(subparsers) -> None:
    from .trainer import add_config_command

    add_config_command(subparsers, "sft", "supervised warm start on program-written notes (before RL)",
                       __doc__.split("\n\n")[0], main)


def conversations(sample, reader, empty: str, rng: random.Random) -> list[tuple[list[dict], str]]:
    """(messages, target text) for the turns of one document that are trained (see the docstring)."""
    from .notes_data import oracle_answer, oracle_memories

    mems = oracle_memories(sample, empty)
    before = [empty] + mems[:-1]
    evidence, keep, blank = [], [], []
    for i, chunk in enumerate(sample.chunks):
        st = replace(reader.start(sample.question), memory=before[i])
        turn = (reader.update_request(st, chunk).messages, mems[i])
        (evidence if mems[i] != before[i] else keep if before[i] != empty else blank).append(turn)
    out = evidence + rng.sample(keep, min(1, len(keep))) + rng.sample(blank, min(1, len(blank)))
    st = replace(reader.start(sample.question), memory=mems[-1])
    out.append((reader.final_request(st).messages, oracle_answer(sample)))
    return out


def encode(hf_tok, messages: list[dict], target: str, search=None) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids): the prompt exactly as the embedded backend builds it (specials.chat_ids,
    control tokens defused), then the target + end of turn. `search`: specials.pattern, built once."""
    from ..specials import chat_ids

    prompt = chat_ids(hf_tok, messages, search)
    return prompt, hf_tok.encode(target, add_special_tokens=False) + [end_of_turn_id(hf_tok)]


def end_of_turn_id(hf_tok) -> int:
    """The id that ends an assistant turn: ChatML's <|im_end|> where the vocabulary has it, else EOS."""
    eos = hf_tok.convert_tokens_to_ids("<|im_end|>")
    return hf_tok.eos_token_id if eos is None or eos == hf_tok.unk_token_id else eos


def response_loss(logits, target, first_weight: float, norm: float):
    """(weighted loss share of one response, its per-token cross-entropy): sum over the response's tokens
    of weight x cross-entropy, divided by `norm` (the weights' sum over the whole batch), the first token
    weighing `first_weight` and the rest 1. Summed over a batch's responses this is the weighted mean."""
    import torch

    per_token = torch.nn.functional.cross_entropy(logits.float(), target, reduction="none")
    weights = torch.ones_like(per_token)
    weights[0] = first_weight
    return (per_token * weights).sum() / norm, per_token


class SFTRun:
    def __init__(self, config: TrainConfig, log=None):
        import torch

        from .. import models
        from ..prompts import load_template
        from ..reader import Reader, ReaderConfig
        from ..tokenizer import HFTokenizer
        from . import checkpoint
        from .data import make_task
        from .engine import make_scheduler
        from .policy import load_policy, resolve_device

        self.c, self.torch, self.checkpoint = config, torch, checkpoint
        self.log = log or (lambda m: print(m, file=sys.stderr))
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        torch.manual_seed(config.seed)
        path = models.hf_dir(config.model)
        self.device = resolve_device(config.device)
        self.model, self.hf_tok = load_policy(path, config, self.device)
        self.tokenizer = HFTokenizer.from_file(Path(path) / "tokenizer.json")
        self.template = load_template(config.template)
        self.reader = Reader(self.template, self.tokenizer, ReaderConfig(memory_tokens=config.memory_tokens,
                                                                         answer_tokens=config.answer_tokens))
        self.task = make_task(config, self.tokenizer)
        from ..specials import pattern, special_strings

        self.specials = pattern(special_strings(self.hf_tok))
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=config.learning_rate, weight_decay=config.weight_decay,
                                           betas=(config.adam_beta1, config.adam_beta2))
        self.scheduler = make_scheduler(self.optimizer, config)
        self.out = Path(config.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.step, self.cursor = 0, 0
        if config.resume and checkpoint.exists(self.out / "checkpoint"):
            state = checkpoint.load(self.out / "checkpoint", self.model, self.optimizer, self.scheduler)
            self.step, self.cursor = state["step"], state["cursors"][0]
            self.log(f"memagent sft: resumed from {self.out / 'checkpoint'} at step {self.step}")

    def batch(self) -> list[tuple[list[int], list[int]]]:
        """At least `sft_conversations_per_step` conversations, whole documents at a time."""
        rows = []
        while len(rows) < self.c.sft_conversations_per_step:
            sample = self.task.sample(self.cursor)
            rng = random.Random(f"sft:{self.c.seed}:{self.cursor}")
            self.cursor += 1
            rows += [encode(self.hf_tok, m, t, self.specials) for m, t in
                     conversations(sample, self.reader, self.template.empty_memory, rng)]
        return rows

    def response_logits(self, prompt: list[int], resp: list[int]):
        """Logits that predict each response token. Only those positions go through the LM head: with a
        150K-token vocabulary (Qwen) a full-length head would cost more than the whole LoRA backward."""
        ids = self.torch.tensor([prompt + resp[:-1]], device=self.device)
        return self.model(input_ids=ids, logits_to_keep=len(resp)).logits[0]

    def train_step(self) -> dict:
        torch = self.torch
        t0 = time.time()
        rows = self.batch()
        n_resp = sum(len(r) for _, r in rows)
        w_first = self.c.sft_first_token_weight
        norm = n_resp + (w_first - 1) * len(rows)  # the weights' sum: every response has a first token
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total, correct, first_correct = 0.0, 0, 0
        for prompt, resp in rows:  # one row per forward: no padding on a CPU
            logits = self.response_logits(prompt, resp)
            target = torch.tensor(resp, device=self.device)
            loss, per_token = response_loss(logits, target, w_first, norm)
            loss.backward()
            total += float(per_token.detach().sum())
            hits = logits.argmax(-1) == target
            correct += int(hits.sum())
            first_correct += int(hits[0])
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.c.max_grad_norm))
        if math.isfinite(grad_norm):
            self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        rec = {"step": self.step, "loss": total / n_resp, "token_accuracy": correct / n_resp,
               "first_token_accuracy": first_correct / len(rows),
               "conversations": len(rows), "response_tokens": n_resp,
               "tokens": sum(len(p) + len(r) for p, r in rows), "grad_norm": grad_norm,
               "lr": self.scheduler.get_last_lr()[0], "seconds": round(time.time() - t0, 2), "cursor": self.cursor}
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        return rec

    def save(self) -> None:
        self.checkpoint.save(self.out / "checkpoint", self.model, self.optimizer, self.scheduler,
                             {"step": self.step, "cursors": [self.cursor], "world": 1, "nonfinite": 0},
                             self.c.to_dict())

    def save_final(self) -> Path:
        final = self.out / "final"
        self.model.save_pretrained(str(final))
        return final


def train_loop(run_: SFTRun, label: str = "sft") -> dict:
    """Step `run_` to max_steps under a progress bar (a line per step when progress is off), saving every
    save_steps and at the end; `memagent rft` runs the same loop on its own batches."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    config = run_.c
    last: dict = {}
    with Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                  TimeElapsedColumn(), TimeRemainingColumn(), disable=not config.progress) as bar:
        task = bar.add_task("", total=config.max_steps, completed=run_.step)
        while run_.step < config.max_steps:
            last = run_.train_step()
            bar.update(task, completed=run_.step, description=f"loss {last['loss']:.3f} acc {last['token_accuracy']:.2f}")
            if not config.progress:
                print(f"{label} step {last['step']}/{config.max_steps} loss {last['loss']:.4f} "
                      f"acc {last['token_accuracy']:.3f} {last['seconds']}s", file=sys.stderr, flush=True)
            if config.save_steps and run_.step % config.save_steps == 0:
                run_.save()
    run_.save()
    run_.save_final()
    return last


def run(config: TrainConfig) -> dict:
    if config.task != "notes":
        raise ConfigError("memagent sft trains on program-written notes: set task = \"notes\"")
    config.require_steps("memagent sft")
    return train_loop(SFTRun(config))


def main(args) -> int:
    try:
        config = load_config(getattr(args, "config", None), overrides_from_args(args))
        last = run(config)
    except (ConfigError, FileNotFoundError) as e:
        print(f"memagent sft: error: {e}", file=sys.stderr)
        return 2
    if last:
        print(f"memagent sft: step {last['step']} loss {last['loss']:.4f} -> {config.output_dir}/final")
    return 0
