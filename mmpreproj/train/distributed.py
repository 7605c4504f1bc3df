"""Data-parallel training under `torchrun` / `accelerate launch`: the same `train()`, one process per device.

When the launcher sets WORLD_SIZE > 1, `init_distributed` joins the process group from the environment
(RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; backend gloo on CPU, nccl on CUDA). `wrap_ddp` wraps the
model in `DistributedDataParallel`, which registers only parameters with `requires_grad`, so with a frozen
base only the injected (or LoRA) weights are all-reduced. Each rank reads its own shard of the data
(`order.ShardedOrder`); only rank 0 writes files and logs.

`wrap_fsdp` (TrainConfig.parallel="fsdp") shards the model in place with FSDP2 (`fully_shard`): one unit
per host block, then the root. FSDP2 shards each parameter on its own (a DTensor), so a unit may mix
frozen base weights and trainable injected/LoRA weights (FSDP1's "uniform requires_grad" error does not
arise), and only parameters with `requires_grad` get gradients reduce-scattered. Sharded weights are
gathered with `DTensor.full_tensor()`, a collective: every rank must take part (`mmpreproj.adapter_state_dict`
and `adapters.gather_run_adapter` do this). A checkpoint holds the trainable weights and the optimizer state as
full tensors keyed by parameter name (`full_trainable_state`, gathered to rank 0, which writes it); a resume
puts them back into every rank's shards (`load_full_trainable_state`), so it continues bit-identically.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..hosts import find_host
from .models import resolve_device


@dataclass
class DistContext:
    """Where this process stands: rank, world size, local rank, device, and whether it opened the group
    (then also the current CUDA device it found, which `shutdown` puts back)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    owns_group: bool = False
    prior_cuda_device: int | None = None

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
    owns, prior = False, None
    if not dist.is_initialized():
        if dev.type == "cuda":
            prior = torch.cuda.current_device()
            torch.cuda.set_device(dev)  # process-wide, for NCCL: `shutdown` puts the caller's back
        try:
            dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo", init_method="env://")
        except BaseException:
            if prior is not None:
                torch.cuda.set_device(prior)
            raise
        owns = True
    return DistContext(dist.get_rank(), dist.get_world_size(), local_rank, dev, owns, prior)


def shutdown(ctx: DistContext) -> None:
    """Leave the process group if `init_distributed` opened it, and put back the current CUDA device it set."""
    if ctx.owns_group and dist.is_initialized():
        dist.destroy_process_group()
    if ctx.prior_cuda_device is not None:
        torch.cuda.set_device(ctx.prior_cuda_device)


def wrap_ddp(model: nn.Module, ctx: DistContext) -> nn.Module:
    """`DistributedDataParallel(model)` when distributed (find_unused_parameters=False), else `model`."""
    if not ctx.enabled:
        return model
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids, find_unused_parameters=False)


def wrap_fsdp(model: nn.Module, ctx: DistContext) -> nn.Module:
    """Shard `model` in place with FSDP2 over all ranks when distributed: each host block, then the root.

    The blocks come from the host table (`mmpreproj.hosts.find_host`), found on the base model of a peft
    model. Returns the same object (its class becomes an `FSDPModule`); `model` itself when not distributed.
    Apply the method and activation checkpointing first.
    """
    if not ctx.enabled:
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    for block in find_host(base).blocks(base):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def full_trainable_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """(trainable weights, optimizer state) of an FSDP2-sharded `model`, as full CPU tensors keyed by parameter
    name, on rank 0; the other ranks get two empty dicts. A collective: every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    return get_state_dict(model, optimizer, options=options)


def load_full_trainable_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, weights: dict[str, torch.Tensor], optim_state: dict
) -> None:
    """Put what `full_trainable_state` returned back into this rank's shards of `model` and `optimizer`; every
    rank passes the whole of it. `weights` must name exactly the trainable parameters (the caller checks)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    options = StateDictOptions(full_state_dict=True, strict=False)  # strict=False: the frozen base is not in it
    set_state_dict(model, optimizer, model_state_dict=weights, optim_state_dict=optim_state, options=options)


@contextlib.contextmanager
def grad_sync(model: nn.Module, ctx: DistContext, sync: bool) -> Iterator[None]:
    """Inside, backward reduces gradients over ranks only when `sync` (accumulate locally otherwise).

    DDP: its `no_sync()` when not `sync`; FSDP2: `set_requires_gradient_sync(sync)`; nothing in one process.
    """
    if not ctx.enabled or sync and not hasattr(model, "set_requires_gradient_sync"):
        yield
    elif hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(sync)
        yield
    else:
        with model.no_sync():
            yield


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
