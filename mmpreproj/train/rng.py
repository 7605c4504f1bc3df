"""The run's own random stream: `train()` seeds the process-wide generators for the run and gives the caller's back.

    with seeded_rng(cfg.seed, device):   # caller's torch / CUDA / random / numpy states saved, all seeded
        ...                              # draws exactly what `seed_everything(cfg.seed)` would give
    # every generator is back where the caller left it, also after an exception

The library never changes process-wide state (ARCHITECTURE.md), yet the run must draw the numbers it always
drew for its seed (adapter init, dropout), and a checkpoint stores and restores those global states. So the
run uses the global generators, but inside `seeded_rng`: seeded on entry, the caller's states put back on
exit. Seeding the globals for good is the caller's explicit choice: `seed_everything`.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed torch (all devices), python `random` and numpy, process-wide and for good: a caller's choice;
    `train()` does not call it (it runs in `seeded_rng`, which draws the same numbers and restores)."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def _uses_cuda(device: torch.device) -> bool:
    """Whether the block's CUDA generators must be seeded and restored: it runs on CUDA, or CUDA is already
    initialised (the states `torch.manual_seed` would seed). An uninitialised CUDA a CPU block never uses is
    left alone: seeding it would queue the seed for its later initialisation, the caller's."""
    return torch.cuda.is_available() and (device.type == "cuda" or torch.cuda.is_initialized())


@contextlib.contextmanager
def kept_rng(device: torch.device | str = "cpu") -> Iterator[None]:
    """Run the block, then put every generator `seeded_rng` would seed back as it was (no seeding): whatever
    the block draws (a model conversion that builds a module, say) touches neither the caller's streams nor
    a run's. Same generators, same caveats as `seeded_rng`."""
    device = torch.device(device)
    cuda, mps = _uses_cuda(device), device.type == "mps"
    saved_cpu = torch.get_rng_state()
    saved_cuda = torch.cuda.get_rng_state_all() if cuda else None  # initialises CUDA (a CUDA run would anyway)
    saved_mps = torch.mps.get_rng_state() if mps else None
    saved_python, saved_numpy = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        torch.set_rng_state(saved_cpu)
        if saved_cuda is not None:
            torch.cuda.set_rng_state_all(saved_cuda)
        if saved_mps is not None:
            torch.mps.set_rng_state(saved_mps)
        random.setstate(saved_python)
        np.random.set_state(saved_numpy)


@contextlib.contextmanager
def seeded_rng(seed: int, device: torch.device | str = "cpu") -> Iterator[None]:
    """Run the block on the RNG stream `seed_everything(seed)` starts, then restore the caller's states.

    On entry: save torch's CPU generator, every CUDA device's (when the block runs on CUDA or CUDA is
    initialised), MPS's (when `device` is MPS), python `random`'s and numpy's global state (`kept_rng`); then
    seed them all with `seed`. On exit, normal or by an exception, put every saved state back, so the caller's
    streams continue as if the block never ran. Not thread-safe: the generators are process-wide (as in any
    seeded code, another thread drawing meanwhile would see the block's stream, and the block its draws).
    """
    device = torch.device(device)
    with kept_rng(device):
        torch.default_generator.manual_seed(seed)  # what torch.manual_seed does, device by device
        if _uses_cuda(device):
            torch.cuda.manual_seed_all(seed)
        if device.type == "mps":
            torch.mps.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        yield
