"""The trained model: a transformers causal LM (optionally with LoRA) and its log-prob forward.

Rows are (prompt ids, response ids) exactly as sampled. A micro-batch is left-padded so that every
row's response ends at the last position; then only the R positions that predict a response token need
logits (`logits_to_keep`), which keeps the [tokens, vocab] tensor small for short memory updates behind
long prompts. Log-probs are taken from logits / temperature, the distribution the rollout sampled from.

Reference model for the KL term: with LoRA it is the same weights with the adapter switched off (no
extra memory); for a full fine-tune a frozen copy is kept (2x weights) and only when beta > 0.
"""
from __future__ import annotations

import copy
import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch

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
        if getattr(config, "init_adapter", ""):
            from peft import PeftModel

            # a later stage continues an earlier one's adapter (its own r/targets win over the config's)
            model = PeftModel.from_pretrained(model, str(config.init_adapter), is_trainable=True)
        else:
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


class _SelectedLogProb(torch.autograd.Function):
    """log p(target) (and optionally the entropy) from [..., V] logits at `temperature`, hand-differentiated.

    Why not log_softmax + gather: over a large vocabulary autograd then keeps a [N, V] log-softmax, and its
    backward allocates and zero-fills a [N, V] tensor for the gather, scatters into it and runs
    log_softmax's own backward (another exp pass); the entropy for the logs costs a further exp and a
    [N, V] product. On a CPU every fresh [N, V] tensor also costs its page faults, about as much as the
    arithmetic. Here one softmax is computed and kept (the memory log_softmax kept), the entropy is taken
    from it in small row blocks, and the backward overwrites the kept softmax with the gradient in place:
    d logp_t / d z = onehot(t) - p, times 1/temperature. Numbers: benchmarks/bench_trainer_vs_trl.py."""

    @staticmethod
    def forward(ctx, logits, targets, temperature, with_entropy):
        z = logits / temperature if temperature != 1.0 else logits
        top = z.amax(-1, keepdim=True)
        p = (z - top).exp_()
        total = p.sum(-1, keepdim=True)
        p.div_(total)
        lse = (top + total.log()).squeeze(-1)
        logp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
        entropy = torch.zeros_like(lse)
        if with_entropy:  # H = lse - sum_v p_v z_v, in blocks of rows so no [N, V] product is allocated
            pf, zf, dot = p.reshape(-1, p.shape[-1]), z.reshape(-1, z.shape[-1]), entropy.view(-1)
            for i in range(0, pf.shape[0], 32):
                dot[i:i + 32] = (pf[i:i + 32] * zf[i:i + 32]).sum(-1)
            entropy = lse - entropy
        ctx.save_for_backward(p, targets)
        ctx.temperature, ctx.used = temperature, False
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        if ctx.used:  # the kept softmax was overwritten by the first backward
            raise RuntimeError("selected_logprobs supports one backward pass (no retain_graph)")
        ctx.used = True
        p, targets = ctx.saved_tensors
        if grad_logp is None:
            return None, None, None, None
        grad = p.mul_((-grad_logp).unsqueeze(-1))
        grad.scatter_add_(-1, targets.unsqueeze(-1), grad_logp.unsqueeze(-1))
        if ctx.temperature != 1.0:
            grad.div_(ctx.temperature)
        return grad, None, None, None


def selected_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                      with_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(targets), entropy) of logits [..., V] at `temperature`. The entropy carries no gradient and
    is zeros when `with_entropy` is False. Differentiable once (the backward reuses the kept softmax)."""
    t = float(temperature) if temperature else 1.0
    return _SelectedLogProb.apply(logits.float(), targets, t, with_entropy)


def token_logprobs(model, mb: MicroBatch, temperature: float = 1.0,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[B, R] log-probs of the response tokens (right-aligned; garbage where response_mask is 0).

    Logits are computed only at the R positions that predict a response token (`logits_to_keep` given as
    their indices), so no [B, R+1, V] tensor is sliced (a slice would cost a zero-fill and a copy of the
    whole tensor in the backward)."""
    R, L = mb.targets.shape[1], mb.input_ids.shape[1]
    keep = torch.arange(L - R - 1, L - 1, device=mb.input_ids.device)
    out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids,
                logits_to_keep=keep, use_cache=False)
    logp, entropy = selected_logprobs(out.logits, mb.targets, temperature, with_entropy)
    return logp, (entropy if with_entropy else None)


def pad_right_aligned(values: list[list[float] | None], R: int, device) -> torch.Tensor:
    out = torch.zeros((len(values), R), dtype=torch.float32)
    for i, v in enumerate(values):
        if v:
            out[i, R - len(v):] = torch.tensor(v, dtype=torch.float32)
    return out.to(device)
