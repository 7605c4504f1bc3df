"""Data-parallel training under `torchrun` / `accelerate launch`: the same `train()`, one process per device.

When the launcher sets WORLD_SIZE > 1, `init_distributed` joins the process group from the environment
(RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; backend gloo on CPU, nccl on CUDA). `wrap_ddp` wraps the
model in `DistributedDataParallel`, which registers only parameters with `requires_grad`, so with a frozen
base only the injected (or LoRA) weights are all-reduced. Each rank reads its own shard of the data
(`order.ShardedOrder`); only rank 0 writes files and logs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .models import resolve_device

__all__ = ["DistContext", "all_gather_objects", "all_reduce_sum", "barrier", "init_distributed", "shutdown", "wrap_ddp"]


@dataclass
class DistContext:
    """Where this process stands: rank, world size, local rank, device, and whether it opened the group."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    owns_group: bool = False

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip() else default


def init_distributed(device: str = "auto") -> DistContext:
    """A `DistContext` for this process; joins the process group from env vars when WORLD_SIZE > 1."""
    world = _env_int("WORLD_SIZE", 1)
    if dist.is_available() and dist.is_initialized():
        world = dist.get_world_size()
    local_rank = _env_int("LOCAL_RANK", 0)
    dev = resolve_device(device, local_rank)
    if world <= 1:
        return DistContext(device=dev)
    if not dist.is_available():
        raise RuntimeError(f"WORLD_SIZE={world} but this torch build has no torch.distributed")
    owns = False
    if not dist.is_initialized():
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo", init_method="env://")
        owns = True
    return DistContext(dist.get_rank(), dist.get_world_size(), local_rank, dev, owns)


def shutdown(ctx: DistContext) -> None:
    """Leave the process group if `init_distributed` opened it."""
    if ctx.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def wrap_ddp(model: nn.Module, ctx: DistContext) -> nn.Module:
    """`DistributedDataParallel(model)` when distributed (find_unused_parameters=False), else `model`."""
    if not ctx.enabled:
        return model
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids, find_unused_parameters=False)


def all_reduce_sum(x: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Sum of `x` over ranks (in place; `x` itself when not distributed)."""
    if ctx.enabled:
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def all_gather_objects(obj: Any, ctx: DistContext) -> list[Any]:
    """[obj of rank 0, obj of rank 1, ...]; `[obj]` when not distributed."""
    if not ctx.enabled:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        dist.barrier()
