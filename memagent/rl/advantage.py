"""Trajectory-level advantages, DAPO's group filter, and the expansion to training rows with weights.

Order matters and is fixed here: rewards -> advantages per trajectory inside its group (G trajectories of
one question) -> *then* expansion to rows, one row per conversation, each carrying its trajectory's
advantage on every response token. Expanding first would let a document with more chunks count several
times in the group mean (the mistake other ports made).

Loss weights are also decided here, as one explicit per-token weight `w` per row, so that the loss is
simply sum(w * per_token_loss) over every token of the *global* batch. The normaliser is a pair of
settings:

`loss_type` (how tokens are averaged)   x   `trajectory_weight` (what counts as one unit)
  dapo:    mean over tokens                 tokens: all rows of the batch pooled (the original MemAgent/verl
  grpo:    mean per conversation, then               token-mean: a trajectory with more chunks has more
           mean over conversations                   tokens and weighs more)
  dr_grpo: sum / (rows x cap), cap =        equal:  each trajectory has total weight 1/N_traj, spread
           max completion length                     over its own tokens by the rule on the left

With `trajectory_weight="equal"` (default): dapo gives a token of trajectory j the weight
1/(N_traj * T_j) (T_j = its active tokens), grpo gives 1/(N_traj * C_j * n_i) (C_j its active
conversations, n_i the conversation's tokens), dr_grpo gives 1/(N_traj * C_j * cap). With "tokens":
dapo 1/N_tokens, grpo 1/(N_conv * n_i), dr_grpo 1/(N_conv * cap). Counts are over active (unmasked)
units and are global across data-parallel ranks (the trainer all-reduces `weight_totals` first).
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from ..tasks.scoring import holds_answers
from .rollout import Trajectory


@dataclass
class Row:
    prompt_ids: list[int]
    response_ids: list[int]
    sampler_logprobs: list[float] | None
    advantage: float
    trajectory: int  # index into the step's trajectory list (unique per rank; only used for grouping)
    kind: str
    finished: bool
    active: bool = True  # False: contributes nothing (masked overlong turn, or empty response)
    weight: float = 0.0  # per response token, filled by assign_weights

    @property
    def num_response(self) -> int:
        return len(self.response_ids)


def _std(xs: list[float]) -> float:
    """Unbiased (n-1) standard deviation, as torch.std (what TRL divides by)."""
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def group_advantages(rewards: list[float], groups: list[int], scale: str = "none",
                     eps: float = 1e-4, batch_std: float | None = None) -> list[float]:
    """A_i = R_i - mean(R of i's group), optionally divided by (std + eps).

    scale="none" is the released MemAgent recipe (`grpo_use_adv=False`, also Dr. GRPO); "group" divides
    by the group's std (GRPO/TRL default); "batch" by the std of all rewards in the batch (`batch_std`
    lets a data-parallel trainer pass the global one)."""
    by_group: dict[int, list[float]] = defaultdict(list)
    for r, g in zip(rewards, groups):
        by_group[g].append(r)
    means = {g: sum(v) / len(v) for g, v in by_group.items()}
    adv = [r - means[g] for r, g in zip(rewards, groups)]
    if scale == "group":
        stds = {g: _std(v) for g, v in by_group.items()}
        adv = [a / (stds[g] + eps) for a, g in zip(adv, groups)]
    elif scale == "batch":
        s = _std(list(rewards)) if batch_std is None else batch_std
        adv = [a / (s + eps) for a in adv]
    elif scale != "none":
        raise ValueError(f"scale_rewards must be none, group or batch, got {scale!r}")
    return adv


def update_advantages(trajs: list[Trajectory], scale: str = "none", eps: float = 1e-4) -> list[list[float]]:
    """A per-update signal (TrainConfig.update_reward; off by default, the seed scores the answer only).

    Why: a read that found the fact and lost it at a later update ends wrong, and the final reward then
    blames every update of that read alike, the one that found the fact too. Stored reads show this is
    the common failure (benchmarks/reads_where_lost.py), so each update is also scored on its own output:
    h = 1 when the notes it wrote hold a gold answer (`holds_answers`, the reward's sub_em test).

    Centred per (group, chunk index): the G reads of a question see the same chunk t, so they are the
    baseline for one another. Only updates that *could* hold the gold are compared: those whose previous
    notes held it, and, when the chunk brings it (some read of the group holds it at t without having held
    it before), all of them. An update with neither had nothing to keep and gets 0, so a read that missed
    the evidence earlier is not blamed again for each later chunk. scale "group"/"batch" divide by that
    cell's std (not the batch's: the cells are what is compared). Returns one list per trajectory, one value
    per update turn; a read without its notes after every update (stored before they were kept) is refused,
    since the signal would be silently 0 for it."""
    for t in trajs:
        updates = sum(c.kind == "update" for c in t.conversations)
        if len(t.memories) != updates:
            raise ValueError(f"read {t.sample_id}/{t.generation} has {len(t.memories)} notes for {updates} updates; "
                             "update_reward needs the notes each update wrote")
    held = [[holds_answers(m, t.answers, t.match) for m in t.memories] for t in trajs]
    cells: dict[tuple[int, int], list[int]] = defaultdict(list)
    for j, t in enumerate(trajs):
        for i in range(len(held[j])):
            cells[(t.group, i)].append(j)
    out = [[0.0] * len(h) for h in held]
    for (g, i), js in cells.items():
        before = {j: i > 0 and held[j][i - 1] for j in js}
        brings = any(held[j][i] and not before[j] for j in js)
        able = [j for j in js if brings or before[j]]
        if len(able) < 2:
            continue
        hs = [float(held[j][i]) for j in able]
        m = sum(hs) / len(hs)
        d = (_std(hs) + eps) if scale in ("group", "batch") else 1.0
        for j, h in zip(able, hs):
            out[j][i] = (h - m) / d
    return out


def filter_groups(trajs: list[Trajectory], tol: float = 1e-9,
                  update_signal: list[list[float]] | None = None) -> tuple[list[Trajectory], int]:
    """DAPO dynamic sampling: drop every group whose rewards are all equal (it has zero advantage, so it
    would only dilute the batch). With a per-update signal (update_advantages) a group is also kept when
    any of its updates has one. Returns the kept trajectories and the number of dropped groups."""
    by_group: dict[int, list[int]] = defaultdict(list)
    for j, t in enumerate(trajs):
        by_group[t.group].append(j)
    kept, dropped = [], 0
    for g, js in by_group.items():
        rs = [trajs[j].reward for j in js]
        signal = update_signal is not None and any(abs(x) > tol for j in js for x in update_signal[j])
        if max(rs) - min(rs) > tol or signal:
            kept.extend(trajs[j] for j in js)
        else:
            dropped += 1
    return kept, dropped


def expand_to_rows(trajs: list[Trajectory], advantages: list[float],
                   mask_truncated_completions: bool = True,
                   update_advs: list[list[float]] | None = None) -> list[Row]:
    """One row per conversation; every row of trajectory j carries advantages[j], and its i-th update row
    also update_advs[j][i] when a per-update signal is on (already weighted by update_reward)."""
    rows = []
    for j, (t, a) in enumerate(zip(trajs, advantages)):
        u = 0
        for c in t.conversations:
            extra = 0.0
            if c.kind == "update":
                if update_advs is not None and u < len(update_advs[j]):
                    extra = update_advs[j][u]
                u += 1
            active = len(c.response_ids) > 0 and not (mask_truncated_completions and not c.finished)
            rows.append(Row(prompt_ids=c.prompt_ids, response_ids=c.response_ids, sampler_logprobs=c.logprobs,
                            advantage=a + extra, trajectory=j, kind=c.kind, finished=c.finished, active=active))
    return rows


def weight_totals(rows: list[Row]) -> dict[str, float]:
    """Local counts that set the normaliser; a data-parallel trainer sums them over ranks."""
    active = [r for r in rows if r.active]
    return {"tokens": float(sum(r.num_response for r in active)), "conversations": float(len(active)),
            "trajectories": float(len({r.trajectory for r in active}))}


def assign_weights(rows: list[Row], loss_type: str, trajectory_weight: str, completion_cap: int,
                   totals: dict[str, float] | None = None) -> None:
    """Fill `row.weight` (the weight of each of its response tokens); see the module docstring."""
    totals = totals or weight_totals(rows)
    per_traj_tokens: dict[int, int] = defaultdict(int)
    per_traj_convs: dict[int, int] = defaultdict(int)
    for r in rows:
        if r.active:
            per_traj_tokens[r.trajectory] += r.num_response
            per_traj_convs[r.trajectory] += 1
    for r in rows:
        if not r.active:
            r.weight = 0.0
            continue
        if trajectory_weight == "tokens":
            if loss_type == "dapo":
                r.weight = 1.0 / totals["tokens"]
            elif loss_type == "grpo":
                r.weight = 1.0 / (totals["conversations"] * r.num_response)
            elif loss_type == "dr_grpo":
                r.weight = 1.0 / (totals["conversations"] * completion_cap)
            else:
                raise ValueError(f"unknown loss_type {loss_type!r}")
        elif trajectory_weight == "equal":
            n_traj = totals["trajectories"]
            if loss_type == "dapo":
                r.weight = 1.0 / (n_traj * per_traj_tokens[r.trajectory])
            elif loss_type == "grpo":
                r.weight = 1.0 / (n_traj * per_traj_convs[r.trajectory] * r.num_response)
            elif loss_type == "dr_grpo":
                r.weight = 1.0 / (n_traj * per_traj_convs[r.trajectory] * completion_cap)
            else:
                raise ValueError(f"unknown loss_type {loss_type!r}")
        else:
            raise ValueError(f"unknown trajectory_weight {trajectory_weight!r}")


def normalise_mini_batches(parts: list[list[Row]], mode: str, loss_type: str, trajectory_weight: str,
                           completion_cap: int, reduce=lambda d: d) -> float:
    """Weights for M mini-batches (one optimizer step each); returns the factor the loss is scaled by.

    "batch": the weights assigned over the whole batch stay; each of the M steps is scaled by M, so the
    M losses add up to the batch loss. "mini_batch" (the release): each mini-batch is re-weighted as its
    own token-mean (counts summed over ranks by `reduce`), scale 1."""
    if mode == "batch" or len(parts) == 1:
        return float(len(parts))
    if mode != "mini_batch":
        raise ValueError(f"unknown mini_batch_norm {mode!r}")
    for part in parts:
        assign_weights(part, loss_type, trajectory_weight, completion_cap, reduce(weight_totals(part)))
    return 1.0
