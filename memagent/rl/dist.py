"""Data parallelism without a wrapper: every rank rolls out its own questions, gradients are summed.

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
    if not active():
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
    if not active():
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
