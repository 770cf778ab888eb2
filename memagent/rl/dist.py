"""Data parallelism without a wrapper: every rank rolls out its own questions, gradients are summed.

FSDP (config `fsdp = true`, under torchrun): the same loop, but each rank keeps only a 1/world shard of
the weights, gradients and Adam moments (torch's `fully_shard`, FSDP2), for a model whose training
state does not fit one device. What changes, all in this file:
* `shard()` wraps the model; gradients are reduce-scattered as *sums* (divide factor 1, plain SUM so
  gloo works on CPU), so `sum_grads` has nothing left to do and the maths is the same as DDP's;
* rollouts run inside `gathered()`: the full weights are all-gathered once and kept for the whole
  rollout, so each rank can make as many generation forwards as its own documents need (an FSDP forward
  is otherwise a collective that every rank must make the same number of times);
* the update's forwards/backwards *are* collectives: `pad_microbatches` gives every rank the same
  number of micro-batches (zero-weight copies), and gradient norm and clipping work on local shards
  with one all-reduce (`grad_norm`, `clip_grads`);
* checkpoints hold full (unsharded) tensors, gathered with torch.distributed.checkpoint's state-dict
  helpers (`full_state`, `load_full_state`), so `final/` is an ordinary save_pretrained folder.

Why not DDP: a step runs several forwards per row (reference, old log-probs, the trained one) and a
variable number of micro-batches per rank; DDP's per-forward hooks and its gradient *average* fight
both. Here the loss weights are already normalised by *global* counts (advantage.assign_weights), so the
exact global gradient is simply the sum of the ranks' gradients: one all_reduce per optimizer step.
CPU uses gloo, CUDA uses nccl; launch with `torchrun --nproc_per_node=N -m memagent train ...`.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist


_COMM_DEVICE = "cpu"  # nccl only reduces CUDA tensors; set by init()
_FSDP = False  # set by shard()


def init(device) -> tuple[int, int]:
    """(rank, world); initialises the process group when launched by torchrun."""
    global _COMM_DEVICE
    device = torch.device(device)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    _COMM_DEVICE = str(device) if device.type == "cuda" else "cpu"
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def sum_floats(values: dict[str, float]) -> dict[str, float]:
    if not active():
        return dict(values)
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=_COMM_DEVICE)
    dist.all_reduce(t)
    return {k: float(v) for k, v in zip(keys, t.tolist())}


def sum_grads(params: list[torch.nn.Parameter]) -> None:
    if not active() or _FSDP:  # FSDP's backward already reduce-scattered the summed gradients
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    i = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[i : i + n].view_as(p).clone()
        i += n


def broadcast_params(module: torch.nn.Module) -> None:
    """Rank 0's weights everywhere (random LoRA init, or anything else that differs per process)."""
    if not active() or _FSDP:  # FSDP shards differ per rank by design (and were cut from broadcast weights)
        return
    for t in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(t.data, src=0)


def gather_objects(obj) -> list:
    if not active():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if active():
        dist.barrier()


def finish() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# ---------------------------------------------------------------- FSDP (config: fsdp = true)

def fsdp_on() -> bool:
    return _FSDP


def shard(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2-shard `model` over all ranks (after broadcast_params). One unit for the whole model: the
    models trained here are small enough that per-layer units would only add collectives."""
    global _FSDP
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if not active():
        raise RuntimeError("fsdp = true needs several ranks: launch with torchrun --nproc_per_node=N")
    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    fully_shard(model, mesh=mesh)
    model.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM/AVG
    model.set_gradient_divide_factor(1.0)  # sums, as the loss weights are normalised by global counts
    _FSDP = True
    return model


class gathered:
    """`with gathered(model):` full weights on every rank, kept across forwards (rollouts); no-op without FSDP."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        if _FSDP:
            self.model.unshard()
            self.model.set_reshard_after_forward(False)
        return self.model

    def __exit__(self, *exc):
        if _FSDP:
            self.model.set_reshard_after_forward(True)
            self.model.reshard()


def max_int(value: int) -> int:
    if not active():
        return value
    t = torch.tensor([value], dtype=torch.int64, device=_COMM_DEVICE)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def pad_microbatches(minibatches: list[list], rows: list) -> list[list]:
    """FSDP: every rank gets as many micro-batches per mini-batch as the busiest one, padding with
    copies of a row that weigh nothing (response mask 0). Without FSDP: unchanged."""
    if not _FSDP:
        return minibatches
    import dataclasses

    from .policy import _collate

    out = []
    for mbs in minibatches:
        need = max_int(len(mbs))
        if len(mbs) < need:
            if rows:
                dummy_row = dataclasses.replace(rows[0], advantage=0.0, weight=0.0, sampler_logprobs=None)
            else:  # this rank kept nothing: a one-token stand-in
                from .advantage import Row

                dummy_row = Row(prompt_ids=[0], response_ids=[0], sampler_logprobs=None, advantage=0.0,
                                trajectory=-1, kind="pad", finished=True, active=False, weight=0.0)
            device = mbs[0].input_ids.device if mbs else torch.device(_COMM_DEVICE)
            for _ in range(need - len(mbs)):
                mb = _collate([dummy_row], 0, device)
                mb.response_mask.zero_()
                mbs = mbs + [mb]
        out.append(mbs)
    return out


def grad_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The global 2-norm of the gradients (FSDP: of all ranks' shards together)."""
    if not _FSDP:
        return torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
    local = torch.zeros((), dtype=torch.float64, device=_COMM_DEVICE)
    for g in grads:
        g = g.to_local() if hasattr(g, "to_local") else g
        local += g.detach().double().pow(2).sum().to(local.device)
    dist.all_reduce(local)
    return local.sqrt().float()


def clip_grads(params: list[torch.nn.Parameter], max_norm: float, norm: torch.Tensor) -> None:
    if not _FSDP:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        return
    coef = min(1.0, float(max_norm) / (float(norm) + 1e-6))
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).mul_(coef)


def full_state(model, optimizer) -> tuple[dict, dict] | None:
    """FSDP: (full model state, full optimizer state) on rank 0 (every rank must call it); else None."""
    if not _FSDP:
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    return get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state(model, optimizer, model_state: dict, optim_state: dict) -> None:
    """FSDP: put full (unsharded) states back as this rank's shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state,
                   options=StateDictOptions(full_state_dict=True, strict=False))
