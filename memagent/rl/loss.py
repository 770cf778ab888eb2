"""The token-level clipped policy-gradient loss (DAPO / GRPO family) on padded [rows, tokens] tensors.

    ratio_t  = exp(logp_t - old_logp_t)
    pg_t     = -min(ratio_t * A, clip(ratio_t, 1 - epsilon, 1 + epsilon_high) * A)
    loss     = sum_t w_t * (pg_t + beta * kl_t)

`w_t` already holds the aggregation (token-mean, sequence-mean, constant; per trajectory or pooled; see
advantage.py), so this function has no normalisation choices left and a data-parallel batch is exact:
each rank sums its tokens and gradients are summed across ranks.

KL estimators of KL(policy || reference) from tokens sampled by the policy (Schulman's k1/k2/k3);
k3 = exp(ref - logp) - (ref - logp) - 1 is what verl calls low_var_kl and MemAgent used (coef 0.001),
clamped to [-10, 10] as verl does so one wild token cannot dominate.
"""
from __future__ import annotations

import torch


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    log_ratio = ref_logp - logp
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        log_ratio = log_ratio.clamp(-20.0, 20.0)
        return (log_ratio.exp() - log_ratio - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"unknown kl_estimator {estimator!r}")


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, weights: torch.Tensor,
                epsilon: float = 0.2, epsilon_high: float | None = None, ref_logp: torch.Tensor | None = None,
                beta: float = 0.0, kl_estimator: str = "k3",
                clip_ratio_c: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """logp/old_logp/ref_logp/weights: [rows, T] (weights 0 on padding and masked rows);
    advantages: [rows] (broadcast over tokens). Returns (loss, sums for logging over weighted tokens).

    clip_ratio_c: dual-clip (the release uses 3.0): on a negative advantage the per-token loss is capped
    at -clip_ratio_c * A, so a token whose ratio exploded off-policy cannot push unboundedly."""
    eps_high = epsilon if epsilon_high is None else epsilon_high
    adv = advantages.unsqueeze(-1).to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    clipped = ratio.clamp(1.0 - epsilon, 1.0 + eps_high)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    dual = None
    if clip_ratio_c is not None:
        capped = torch.minimum(per_token, -clip_ratio_c * adv)
        dual = (adv < 0) & (capped < per_token)
        per_token = torch.where(adv < 0, capped, per_token)
    kl = None
    if beta and ref_logp is not None:
        kl = kl_penalty(logp, ref_logp, kl_estimator)
        per_token = per_token + beta * kl
    loss = (per_token * weights).sum()
    with torch.no_grad():
        live = weights > 0
        n = live.sum().item()
        # TRL's definitions: the low clip binds when the ratio fell below 1-eps on a negative advantage,
        # the high clip when it rose above 1+eps_high on a positive one.
        low = ((ratio < 1.0 - epsilon) & (adv < 0) & live).sum().item()
        high = ((ratio > 1.0 + eps_high) & (adv > 0) & live).sum().item()
        stats = {"tokens": n, "clipped_low": low, "clipped_high": high,
                 "kl_sum": float((kl * live).sum()) if kl is not None else 0.0,
                 "ratio_sum": float((ratio * live).sum()),
                 "dual_clipped": int((dual & live).sum().item()) if dual is not None else 0}
    return loss, stats
