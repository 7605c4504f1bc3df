"""Resumable training state in one file, written atomically (temp file in the same folder + `os.replace`).

`checkpoint.pt` holds the trainable weights (by parameter name), the optimizer and scheduler states, the
RNG states of every rank (torch CPU/CUDA, python `random`, numpy: the run's own streams, `rng.seeded_rng`),
the data position and counters, and the config. It is loaded with `torch.load(weights_only=True)`: numpy's
RNG keys are stored as a tensor.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..method.convert import named_model_keys
from ..method.layer import PreProjAttention
from ..util.io import atomic_write, remove_stale_temps
from ..version import __version__
from .errors import CheckpointWriteError

CHECKPOINT_NAME = "checkpoint.pt"
"""The trainer's resumable checkpoint file in a run folder (`--resume` continues from it)."""
CHECKPOINT_FORMAT = 1


def capture_rng() -> dict[str, Any]:
    """The RNG states of this process: torch CPU (and CUDA), python `random`, numpy."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put back what `capture_rng` returned. The CUDA states only where CUDA is initialised: setting them
    on an uninitialised CUDA would queue them for its later initialisation, outside the run (`rng.seeded_rng`
    saves and restores CUDA's generators only for a run on CUDA or an already initialised CUDA)."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """{name: tensor} of the trainable parameters, detached, on CPU."""
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}


@torch.no_grad()
def load_trainable_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy saved trainable weights into `model`; names, shapes and dtypes must match exactly."""
    state = checked_trainable_state(model, state)
    for n, p in model.named_parameters():
        if p.requires_grad:
            p.copy_(state[n])


def checked_trainable_state(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` keyed as `model`'s trainable parameters (an older layout's injected keys renamed), once its names,
    shapes and dtypes are those of the parameters (the full shapes of sharded ones); ValueError otherwise."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if set(state) != set(params):  # injected weights saved before adapters were keyed by name (0.4)
        wrappers = [(n, m) for n, m in model.named_modules() if isinstance(m, PreProjAttention)]
        state = named_model_keys(state, wrappers)
    missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
    if missing or unexpected:
        raise ValueError(
            f"checkpoint does not match the model's trainable parameters: missing {missing[:3]}, "
            f"unexpected {unexpected[:3]} (different method or model?)"
        )
    for n, p in params.items():
        if state[n].shape != p.shape or state[n].dtype != p.dtype:
            raise ValueError(
                f"checkpoint tensor {n} is {tuple(state[n].shape)} {state[n].dtype}, the model has "
                f"{tuple(p.shape)} {p.dtype}"
            )
    return state


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """`torch.save(state)` to `path` atomically: a crash leaves the previous checkpoint intact.
    The temp files of killed earlier writes are removed first (one writer per run folder: `runlock`). A
    failed write raises `CheckpointWriteError` naming the file and the reason.
    """
    path = Path(path)
    payload = {"format": CHECKPOINT_FORMAT, "library_version": __version__, **state}
    try:
        remove_stale_temps(path)
        return atomic_write(path, lambda f: torch.save(payload, f))
    except (OSError, RuntimeError) as err:
        why = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        raise CheckpointWriteError(
            f"cannot write checkpoint {path}: {type(err).__name__}: {why} (the previous checkpoint, if any, is kept)"
        ) from err


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by `save_checkpoint` (CPU tensors; one-line errors for corrupt files)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ValueError(f"corrupt checkpoint {path}: {type(err).__name__}: {str(err)[:200]}") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a mmpreproj training checkpoint (format {CHECKPOINT_FORMAT})")
    return state
