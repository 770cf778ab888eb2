"""The trained model: a transformers causal LM (optionally with LoRA) and its log-prob forward.

Rows are (prompt ids, response ids) exactly as sampled. A micro-batch is left-padded so that every
row's response ends at the last position; then only the last R+1 positions need logits
(`logits_to_keep`), which keeps the [tokens, vocab] tensor small for short memory updates behind long
prompts. Log-probs are taken from logits / temperature, the distribution the rollout sampled from.

Reference model for the KL term: with LoRA it is the same weights with the adapter switched off (no
extra memory); for a full fine-tune a frozen copy is kept (2x weights) and only when beta > 0.
"""
from __future__ import annotations

import copy
import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(spec: str) -> torch.device:
    import os

    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cpu")
    if spec == "cuda" and "LOCAL_RANK" in os.environ:
        return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return torch.device(spec)


def load_policy(path: str | Path, config, device: torch.device):
    """(model, hf_tokenizer). The model is in train mode with only the trainable parameters requiring grad."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[config.dtype]).to(device)
    if config.use_peft:
        from peft import LoraConfig, get_peft_model

        extra = {}
        if config.lora_last_layers:
            # Adapters only in the top layers: the lower layers need no backward pass at all, which on a
            # CPU roughly halves the update for short responses behind long prompts.
            n = model.config.num_hidden_layers
            extra["layers_to_transform"] = list(range(max(0, n - config.lora_last_layers), n))
        lcfg = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                          target_modules=list(config.lora_target_modules), task_type="CAUSAL_LM", **extra)
        model = get_peft_model(model, lcfg)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        if config.use_peft:
            model.enable_input_require_grads()
    model.train()
    return model, tok


class Reference:
    """log-probs under the reference policy (the model as it was before training)."""

    def __init__(self, model, use_peft: bool):
        self.model, self.use_peft = model, use_peft
        self.frozen = None
        if not use_peft:
            self.frozen = copy.deepcopy(model).eval()
            for p in self.frozen.parameters():
                p.requires_grad_(False)

    def context(self):
        if self.use_peft:
            return self.model.disable_adapter()
        return contextlib.nullcontext()

    @property
    def module(self):
        return self.model if self.use_peft else self.frozen


@dataclass
class MicroBatch:
    rows: list  # advantage.Row
    input_ids: torch.Tensor  # [B, L] left-padded
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor  # [B, R] response ids, right-aligned
    response_mask: torch.Tensor  # [B, R] 1 on real response tokens


def micro_batches(rows: list, max_tokens: int, pad_id: int, device) -> list[MicroBatch]:
    """Greedy packing in the given order: a batch grows while (rows x longest row) <= max_tokens."""
    batches, cur, longest = [], [], 0
    for r in rows:
        n = len(r.prompt_ids) + len(r.response_ids)
        if cur and max(longest, n) * (len(cur) + 1) > max_tokens:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(r)
        longest = max(longest, n)
    if cur:
        batches.append(cur)
    return [_collate(b, pad_id, device) for b in batches]


def _collate(rows: list, pad_id: int, device) -> MicroBatch:
    L = max(len(r.prompt_ids) + len(r.response_ids) for r in rows)
    R = max(max(len(r.response_ids) for r in rows), 1)
    ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), L), dtype=torch.long)
    targets = torch.full((len(rows), R), pad_id, dtype=torch.long)
    rmask = torch.zeros((len(rows), R), dtype=torch.float32)
    for i, r in enumerate(rows):
        seq = list(r.prompt_ids) + list(r.response_ids)
        ids[i, L - len(seq):] = torch.tensor(seq, dtype=torch.long)
        mask[i, L - len(seq):] = 1
        n = len(r.response_ids)
        if n:
            targets[i, R - n:] = torch.tensor(r.response_ids, dtype=torch.long)
            rmask[i, R - n:] = 1.0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return MicroBatch(rows, ids.to(device), mask.to(device), pos.to(device), targets.to(device), rmask.to(device))


def token_logprobs(model, mb: MicroBatch, temperature: float = 1.0,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[B, R] log-probs of the response tokens (right-aligned; garbage where response_mask is 0)."""
    R = mb.targets.shape[1]
    out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids,
                logits_to_keep=R + 1, use_cache=False)
    logits = out.logits[:, -(R + 1):-1, :].float()
    if temperature and temperature != 1.0:
        logits = logits / temperature
    logp_all = F.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, mb.targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def pad_right_aligned(values: list[list[float] | None], R: int, device) -> torch.Tensor:
    out = torch.zeros((len(values), R), dtype=torch.float32)
    for i, v in enumerate(values):
        if v:
            out[i, R - len(v):] = torch.tensor(v, dtype=torch.float32)
    return out.to(device)
