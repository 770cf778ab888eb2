"""The training loop: rollout -> reward -> filter -> advantages -> rows -> clipped PG update.

A step, on every data-parallel rank:
1. draw this rank's share of `questions_per_step` questions and read each document G times with the
   policy itself (the embedded backend shares the model object, so there is no weight sync);
2. score the final answers; with dynamic sampling drop groups whose rewards are all equal and read new
   questions until the quota is met or `max_resample_rounds` extra rounds are spent;
3. advantages per trajectory inside its group, expanded to one row per conversation;
4. loss weights from *global* counts, `num_iterations` x `num_mini_batches` optimizer steps, gradients
   summed over ranks; the LR schedule advances once per step (tied to logical rollouts, never to the
   number of rows, which depends on how many chunks the documents had);
5. metrics line, optional checkpoint.
A non-finite loss or gradient skips the optimizer step (weights untouched) with a one-line message;
`max_nonfinite_steps` such steps in a row stop the run.
"""
from __future__ import annotations

import asyncio
import math
import random
import sys
import time
import warnings
from pathlib import Path

import torch

from .. import models
from ..prompts import load_template
from ..reader import Reader, ReaderConfig
from ..tokenizer import HFTokenizer
from . import checkpoint, dist
from . import metrics as metrics_io
from .advantage import (assign_weights, expand_to_rows, filter_groups, group_advantages, normalise_mini_batches,
                        update_advantages, weight_totals)
from .config import TrainConfig
from .data import make_task
from .loss import policy_loss
from .policy import Reference, load_policy, micro_batches, pad_right_aligned, resolve_device, token_logprobs
from .rollout import request_seed, rollout, score_trajectories


class TrainError(RuntimeError):
    pass


# Mean |torch - sampler| log-prob per token above which first_step_rollouts are refused. The llama.cpp Q4
# engine and torch fp32 differ by 0.0014-0.005 nats on the same adapter (rft_notes_0.5b/logprob_gap.json;
# the first reads of configs/notes-qwen0.5b-dapo.toml); the untrained base differs from those reads by 0.925.
FIRST_STEP_MAX_GAP = 0.05


def dropout_off(model) -> list:
    """Switch every active Dropout to eval and return them (to switch back). Why not model.eval(): HF's
    gradient checkpointing is active in train mode only."""
    active = [m for m in model.modules() if isinstance(m, torch.nn.Dropout) and m.training]
    for m in active:
        m.eval()
    return active


def sampler_abs_diff(logp, mb) -> tuple[float, float]:
    """(sum of |logp - the sampler's log-prob| over mb's response tokens, their count)."""
    sampled = pad_right_aligned([r.sampler_logprobs for r in mb.rows], logp.shape[1], logp.device)
    return float(((logp.detach() - sampled).abs() * mb.response_mask).sum()), float(mb.response_mask.sum())


def make_scheduler(optimizer, config: TrainConfig):
    warm, total = max(0, config.warmup_steps), max(1, config.max_steps)

    def factor(step: int) -> float:
        if warm and step < warm:
            return (step + 1) / warm
        if config.lr_scheduler_type == "constant_with_warmup":
            return 1.0
        frac = min(1.0, (step - warm) / max(1, total - warm))
        if config.lr_scheduler_type == "linear":
            return 1.0 - frac
        return 0.5 * (1.0 + math.cos(math.pi * frac))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class Trainer:
    """Everything is injectable (model, tokenizers, task, backend) so tests can use a tiny model."""

    def __init__(self, config: TrainConfig, *, model=None, hf_tokenizer=None, tokenizer=None, task=None,
                 backend=None, template=None, log=None):
        self.config = c = config
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        if c.torch_threads:
            torch.set_num_threads(c.torch_threads)
        self.device = resolve_device(c.device) if model is None else next(model.parameters()).device
        self.rank, self.world = dist.init(self.device)
        if self.device.type == "cuda":  # fp32 master weights, TF32 matmuls: fast and lr-1e-6-safe
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        torch.manual_seed(c.seed)
        if model is None:
            path = models.hf_dir(c.model)
            model, hf_tokenizer = load_policy(path, c, self.device)
            tokenizer = tokenizer or HFTokenizer.from_file(Path(path) / "tokenizer.json")
        self.model, self.hf_tokenizer = model, hf_tokenizer
        dist.broadcast_params(self.model)
        if c.fsdp:  # shard weights, grads and Adam state over the ranks instead of replicating them (rl/dist.py)
            if c.beta > 0 and not c.use_peft:
                raise TrainError("fsdp with beta > 0 needs use_peft (the frozen full reference copy is not sharded)")
            self.model = dist.shard(self.model)
        self.tokenizer = tokenizer
        self.template = template or load_template(c.template)
        self.reader = Reader(self.template, tokenizer, ReaderConfig(
            memory_tokens=c.memory_tokens, answer_tokens=c.answer_tokens, temperature=c.temperature,
            top_p=c.top_p, return_tokens=True))
        self.task = task or make_task(c, tokenizer)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if not self.params:
            raise TrainError("the model has no trainable parameters")
        self.optimizer = torch.optim.AdamW(self.params, lr=c.learning_rate, betas=(c.adam_beta1, c.adam_beta2),
                                           weight_decay=c.weight_decay)
        self.scheduler = make_scheduler(self.optimizer, c)
        self.reference = Reference(self.model, c.use_peft) if c.beta > 0 else None
        self.out = Path(c.output_dir)
        if self.rank == 0:
            self.out.mkdir(parents=True, exist_ok=True)
        if backend is None:
            backend = self._make_backend()
        self.backend = backend
        pad = getattr(hf_tokenizer, "pad_token_id", None)
        self.pad_id = pad if pad is not None else (getattr(hf_tokenizer, "eos_token_id", None) or 0)
        self.step = 0
        self.cursor = 0  # this rank's position in its share of the question stream
        self.nonfinite = 0
        if c.resume and checkpoint.exists(self.out / "checkpoint"):
            self.load(self.out / "checkpoint")

    def _make_backend(self):
        c = self.config
        if c.backend == "embedded":
            from ..backends.embedded import EmbeddedBackend

            return EmbeddedBackend(self.model, self.hf_tokenizer, name=f"policy:{c.model}",
                                   max_batch=c.rollout_max_batch, threads=c.torch_threads or None)
        from .remote import make_remote_backend

        backend, self.sync = make_remote_backend(c, self.model, self.out / "adapters")  # one server or a pool
        return backend

    # ---- data ---------------------------------------------------------------------------------------

    def local_quota(self) -> int:
        q, r = divmod(self.config.questions_per_step, self.world)
        return q + (1 if self.rank < r else 0)

    def next_samples(self, n: int) -> list:
        # rank r owns indices r, r+W, r+2W, ...: disjoint shares, no communication
        out = [self.task.sample(self.cursor * self.world + self.rank + i * self.world) for i in range(n)]
        self.cursor += n
        return out

    # ---- one step -----------------------------------------------------------------------------------

    def collect(self):
        """(trajectories to train on, every trajectory sampled this step, dropped groups, rounds)."""
        c = self.config
        if c.first_step_rollouts and self.step == 0:
            return self.first_step()
        need, kept, everything, dropped, rounds, group_base = self.local_quota(), [], [], 0, 0, 0
        max_rounds = 1 + (c.max_resample_rounds if c.dynamic_sampling else 0)
        while need > 0 and rounds < max_rounds:
            samples = self.next_samples(need)
            trajs = asyncio.run(rollout(self.backend, self.reader, samples, c.num_generations,
                                        seed=c.seed, step=self.step, group_offset=group_base))
            group_base += len(samples)
            score_trajectories(trajs, c)
            everything += trajs
            rounds += 1
            if not c.dynamic_sampling:
                kept += trajs
                break
            good, d = filter_groups(trajs, update_signal=self.update_signal(trajs))
            dropped += d
            groups = sorted({t.group for t in good})[:need]
            kept += [t for t in good if t.group in set(groups)]
            need -= len(groups)
        return kept, everything, dropped, rounds

    def first_step(self):
        """Step 1's rollout batch: the reads in `first_step_rollouts` (memagent rft's phase 1), every group.

        Why: on 2 CPU cores the reads are most of a step's cost, and rft has paid for hundreds of them,
        the wrong ones included, which its fine-tune throws away. At step 0 the model is the policy that
        sampled them, so this is the update a fresh batch would give (old log-probs recomputed here; with
        num_mini_batches > 1 the later mini-batches are off-policy against them, as in the release).
        Reads of another policy would make the ratio meaningless, so the sampler's log-probs must agree
        with this model's (FIRST_STEP_MAX_GAP) or the run stops before any update."""
        from .rft import load_collections, read_trajectory

        c = self.config
        reads = load_collections(c.first_step_rollouts, "first_step_rollouts", "file")
        keys = sorted({r["group"] for r in reads})
        mine = {k: j for j, k in enumerate(keys) if j % self.world == self.rank}  # disjoint shares of groups
        trajs = [read_trajectory(r, mine[r["group"]], c) for r in reads if r["group"] in mine]
        gap = self.sampler_gap(trajs[:4])
        if gap is None or gap > FIRST_STEP_MAX_GAP:
            raise TrainError(f"first_step_rollouts: the reads' sampling log-probs differ from this model's by "
                             f"{'an unknown amount (none stored)' if gap is None else f'{gap:.3f} nats a token'}; "
                             f"they must come from init_adapter's policy at this temperature ({c.temperature})")
        self.log(f"memagent train: step 1 reads {len(trajs)} stored reads of {len(mine)} questions "
                 f"(log-prob gap {gap:.4f} nats a token)")
        if not c.dynamic_sampling:
            return trajs, trajs, 0, 0
        kept, dropped = filter_groups(trajs, update_signal=self.update_signal(trajs))
        return kept, trajs, dropped, 0

    def update_signal(self, trajs) -> list[list[float]] | None:
        """Each update's own advantage term (update_reward x update_advantages), or None when it is off."""
        c = self.config
        if not c.update_reward:
            return None
        try:
            terms = update_advantages(trajs, c.scale_rewards)
        except ValueError as e:
            raise TrainError(str(e)) from None
        return [[c.update_reward * x for x in u] for u in terms]

    def sampler_gap(self, trajs) -> float | None:
        """Mean |this model's log-prob - the sampler's| per response token over these reads, all ranks."""
        rows = [r for r in expand_to_rows(trajs, [0.0] * len(trajs), False) if r.sampler_logprobs and r.response_ids]
        total = {"diff": 0.0, "tokens": 0.0}
        dropouts = dropout_off(self.model)
        with torch.no_grad():
            for mb in micro_batches(rows, self.config.max_tokens_per_microbatch, self.pad_id, self.device):
                diff, tokens = sampler_abs_diff(token_logprobs(self.model, mb, self.config.temperature)[0], mb)
                total["diff"] += diff
                total["tokens"] += tokens
        for m in dropouts:
            m.train()
        total = dist.sum_floats(total)
        return total["diff"] / total["tokens"] if total["tokens"] else None

    def update(self, trajs) -> dict:
        """One RL update on these (already scored) trajectories. Returns metric sums/means."""
        c = self.config
        rewards = [t.reward for t in trajs]
        batch_std = None
        if c.scale_rewards == "batch":
            s = dist.sum_floats({"n": len(rewards), "s": sum(rewards), "q": sum(r * r for r in rewards)})
            mean = s["s"] / max(s["n"], 1)
            batch_std = math.sqrt(max(s["q"] / max(s["n"], 1) - mean * mean, 0) * s["n"] / max(s["n"] - 1, 1))
        advs = group_advantages(rewards, [t.group for t in trajs], c.scale_rewards, batch_std=batch_std)
        signal = self.update_signal(trajs)
        rows = expand_to_rows(trajs, advs, c.mask_truncated_completions, signal)
        totals = dist.sum_floats(weight_totals(rows))
        stats = {"rows": len(rows), "active_rows": sum(r.active for r in rows), "skipped": 0}
        if signal is not None:
            stats["update_signal_rows"] = sum(abs(x) > 0 for u in signal for x in u)
        if totals["tokens"] == 0:
            self._advance_schedule()
            return stats | {"note": "no trainable tokens"}
        cap = max(c.memory_tokens, c.answer_tokens)
        assign_weights(rows, c.loss_type, c.trajectory_weight, cap, totals)
        active = [r for r in rows if r.active]
        order = random.Random(request_seed(c.seed, self.step, self.rank, "shuffle"))
        order.shuffle(active)
        M = c.num_mini_batches
        parts = [sorted(active[i::M], key=lambda r: len(r.prompt_ids) + len(r.response_ids)) for i in range(M)]
        scale = normalise_mini_batches(parts, c.mini_batch_norm, c.loss_type, c.trajectory_weight, cap, dist.sum_floats)
        minibatches = [micro_batches(p, c.max_tokens_per_microbatch, self.pad_id, self.device) for p in parts]
        minibatches = dist.pad_microbatches(minibatches, rows)  # FSDP: the same number of forwards on every rank
        t0 = time.time()
        ref_lp, old_lp = {}, {}
        # Dropout off for the old, reference *and* current log-probs: with LoRA dropout active two forwards
        # of the same weights differ, so the ratio would not be 1 at lr 0 and clipping would fire on noise.
        dropouts = dropout_off(self.model)
        with torch.no_grad():
            for mbs in minibatches:
                for mb in mbs:
                    if self.reference is not None:
                        with self.reference.context():
                            ref_lp[id(mb)] = token_logprobs(self.reference.module, mb, c.temperature)[0]
                    if c.num_iterations * M > 1:
                        old_lp[id(mb)] = token_logprobs(self.model, mb, c.temperature)[0]
        sums = {"tokens": 0.0, "clipped_low": 0.0, "clipped_high": 0.0, "kl_sum": 0.0, "ratio_sum": 0.0,
                "entropy_sum": 0.0, "mismatch_sum": 0.0, "mismatch_tokens": 0.0, "forward_tokens": 0.0}
        losses, norms = [], []
        for it in range(c.num_iterations):
            for mbs in minibatches:
                self.optimizer.zero_grad(set_to_none=True)
                local_loss, ok = 0.0, True
                for mb in mbs:
                    logp, ent = token_logprobs(self.model, mb, c.temperature, with_entropy=(it == 0))
                    w = torch.tensor([r.weight * scale for r in mb.rows], device=self.device).unsqueeze(-1) * mb.response_mask
                    adv = torch.tensor([r.advantage for r in mb.rows], device=self.device)
                    old = old_lp.get(id(mb), logp.detach())
                    loss, st = policy_loss(logp, old, adv, w, c.epsilon, c.eps_high, ref_lp.get(id(mb)), c.beta,
                                           c.kl_estimator, clip_ratio_c=c.clip_ratio_c)
                    if not torch.isfinite(loss):
                        ok = False
                        if not dist.fsdp_on():
                            break
                        loss = loss.nan_to_num(0.0, 0.0, 0.0) * 0.0  # FSDP: every rank still runs its backward
                    loss.backward()
                    local_loss += float(loss.detach())
                    if it == 0:
                        for k in ("tokens", "clipped_low", "clipped_high", "kl_sum", "ratio_sum"):
                            sums[k] += st[k]
                        sums["entropy_sum"] += float((ent * mb.response_mask).sum())
                        sums["forward_tokens"] += float(mb.attention_mask.sum())
                        if all(r.sampler_logprobs for r in mb.rows):
                            diff, tokens = sampler_abs_diff(logp, mb)
                            sums["mismatch_sum"] += diff
                            sums["mismatch_tokens"] += tokens
                dist.sum_grads(self.params)
                # the clipping norm doubles as the finiteness check (a NaN/inf anywhere makes it non-finite),
                # which saves a separate pass over every gradient
                grads = [p.grad for p in self.params if p.grad is not None]
                norm = dist.grad_norm(grads)
                grads_ok = bool(torch.isfinite(norm))
                flag = dist.sum_floats({"bad": float(not (ok and grads_ok))})["bad"]
                if flag:
                    self.optimizer.zero_grad(set_to_none=True)
                    self.nonfinite += 1
                    stats["skipped"] += 1
                    self.log(f"memagent train: step {self.step}: non-finite loss or gradient; update skipped, "
                             f"weights unchanged ({self.nonfinite} in a row)")
                    if self.nonfinite >= c.max_nonfinite_steps:
                        raise TrainError(f"{self.nonfinite} non-finite updates in a row at step {self.step}; "
                                         "stopping (lower learning_rate, check rewards, or use float32)")
                    continue
                self.nonfinite = 0
                dist.clip_grads(self.params, c.max_grad_norm, norm)
                norms.append(float(norm))
                self.optimizer.step()
                # each rank holds its share of the globally normalised loss: the logged loss is their sum
                losses.append(dist.sum_floats({"loss": local_loss})["loss"])
        for m in dropouts:
            m.train()
        self._advance_schedule()
        g = dist.sum_floats(sums)
        n = max(g["tokens"], 1.0)
        stats.update({
            "loss": sum(losses) / len(losses) if losses else float("nan"),
            "grad_norm": sum(norms) / len(norms) if norms else float("nan"),
            "clip_frac_low": g["clipped_low"] / n, "clip_frac_high": g["clipped_high"] / n,
            "clip_frac": (g["clipped_low"] + g["clipped_high"]) / n, "kl": g["kl_sum"] / n if c.beta else None,
            "ratio_mean": g["ratio_sum"] / n, "entropy": g["entropy_sum"] / n,
            "logprob_mismatch": g["mismatch_sum"] / g["mismatch_tokens"] if g["mismatch_tokens"] else None,
            "train_tokens": g["forward_tokens"], "update_s": time.time() - t0,
        })
        return stats

    def _advance_schedule(self) -> None:
        # once per RL step even when every update was skipped: the schedule follows logical steps
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*")
            self.scheduler.step()

    def train_step(self) -> dict:
        c = self.config
        seed = request_seed(c.seed, self.step, self.rank)
        random.seed(seed)
        torch.manual_seed(seed)
        t0 = time.time()
        if c.backend == "openai":  # the server must sample from the current weights
            self.backend.model = asyncio.run(self.sync.push(self.model, self.step))
        with dist.gathered(self.model):  # FSDP: full weights for the whole rollout; no-op otherwise
            kept, everything, dropped, rounds = self.collect()
        rollout_s = time.time() - t0
        gen_tokens = sum(len(cv.response_ids) for t in everything for cv in t.conversations)
        mem = [len(cv.response_ids) for t in everything for cv in t.conversations if cv.kind == "update"]
        ans = [len(cv.response_ids) for t in everything for cv in t.conversations if cv.kind == "final"]
        trunc = sum(t.truncated for t in everything)
        nconv = sum(len(t.conversations) for t in everything)
        up = self.update(kept)
        g = dist.sum_floats({"reward": sum(t.reward for t in everything), "correct": sum(t.correct for t in everything),
                             "n": len(everything), "kept": len({t.group for t in kept}), "dropped": dropped,
                             "gen_tokens": gen_tokens, "mem": sum(mem), "n_mem": len(mem), "ans": sum(ans),
                             "n_ans": len(ans), "trunc": trunc, "nconv": nconv, "rollout_s": rollout_s,
                             "rounds": rounds})
        self.step += 1
        rec = {
            "step": self.step, "reward": g["reward"] / max(g["n"], 1), "accuracy": g["correct"] / max(g["n"], 1),
            "trajectories": int(g["n"]), "groups_kept": int(g["kept"]), "groups_dropped": int(g["dropped"]),
            "rollout_rounds": g["rounds"] / self.world, "memory_len": g["mem"] / max(g["n_mem"], 1),
            "answer_len": g["ans"] / max(g["n_ans"], 1), "truncated_frac": g["trunc"] / max(g["nconv"], 1),
            "lr": self.scheduler.get_last_lr()[0], "rollout_s": rollout_s,
            "gen_tokens_per_s": gen_tokens / max(rollout_s, 1e-9),
            "train_tokens_per_s": up.get("train_tokens", 0.0) / max(up.get("update_s", 0.0), 1e-9) if "update_s" in up else None,
            "time": time.time(),
        } | {k: v for k, v in up.items() if k not in ("train_tokens",)}
        if self.rank == 0:
            metrics_io.append(self.out / "metrics.jsonl", rec)
        if c.save_steps and self.step % c.save_steps == 0:
            self.save()
        return rec

    # ---- checkpoints --------------------------------------------------------------------------------

    def save(self, directory: str | Path | None = None) -> Path:
        directory = Path(directory or self.out / "checkpoint")
        cursors = dist.gather_objects(self.cursor)
        state = {"step": self.step, "cursors": cursors, "world": self.world, "nonfinite": self.nonfinite}
        full = dist.full_state(self.model, self.optimizer)  # FSDP: gathered to rank 0; every rank takes part
        if self.rank == 0:
            checkpoint.save(directory, self.model, self.optimizer, self.scheduler, state, self.config.to_dict(),
                            full=full)
        dist.barrier()
        return directory

    def load(self, directory: str | Path) -> None:
        state = checkpoint.load(directory, self.model, self.optimizer, self.scheduler)
        if state["world"] != self.world:
            raise TrainError(f"checkpoint was written by {state['world']} ranks, this run has {self.world}; "
                             "resume with the same number of processes")
        self.step, self.cursor, self.nonfinite = state["step"], state["cursors"][self.rank], state["nonfinite"]
        dist.broadcast_params(self.model)
        self.log(f"memagent train: resumed from {directory} at step {self.step}")

    def save_final(self) -> Path | None:
        full = dist.full_state(self.model, self.optimizer)  # FSDP: every rank takes part in the gather
        if self.rank != 0:
            return None
        out = self.out / "final"
        self.model.save_pretrained(str(out), **({"state_dict": full[0]} if full else {}))
        if self.hf_tokenizer is not None and hasattr(self.hf_tokenizer, "save_pretrained"):
            self.hf_tokenizer.save_pretrained(str(out))
        return out

    def plot(self) -> Path | None:
        if self.rank != 0:
            return None
        png = self.out / "curves.png"
        metrics_io.plot(metrics_io.read(self.out / "metrics.jsonl"), png)
        return png

    async def aclose(self):
        await self.backend.aclose()


def evaluate(backend, reader_template, tokenizer, samples, memory_tokens: int, answer_tokens: int,
             reward: str = "sub_em", batch: int | None = None, temperature: float = 0.0, top_p: float = 1.0,
             seed: int = 0) -> dict:
    """Read each sample once through the same workflow; accuracy with a 95% interval. With temperature > 0
    every call is seeded from (seed, sample, turn), so a before/after comparison sees the same draws
    wherever the models agree."""
    from .rollout import score

    reader = Reader(reader_template, tokenizer, ReaderConfig(memory_tokens=memory_tokens, answer_tokens=answer_tokens,
                                                             temperature=temperature, top_p=top_p))
    trajs = []
    step = batch or len(samples)
    for i in range(0, len(samples), step):
        trajs += asyncio.run(rollout(backend, reader, samples[i:i + step], 1, seed=seed, keep_tokens=False))
    correct = [score(t.reply, t.answers, reward, t.match) for t in trajs]
    n, k = len(correct), sum(correct)
    p = k / max(n, 1)
    half = 1.96 * math.sqrt(p * (1 - p) / n) if n else 0.0
    return {"n": n, "correct": k, "accuracy": p, "ci95": [max(0.0, p - half), min(1.0, p + half)],
            "examples": [{"id": t.sample_id, "answer": t.answer, "gold": t.answers[0], "memory": t.memories[-1:]}
                         for t in trajs[:3]]}
