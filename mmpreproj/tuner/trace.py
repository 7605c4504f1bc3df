"""`trace_seams`: a model's host description found by one forward (`hosts/trace.py`, the tracing), checked by
injecting it at identity init into a copy: every tensor the model returns must stay as it was (`check=True`)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ..hosts.trace import DESCRIBE_BY_HAND, TraceError, probe_outputs, same_outputs, trace_description
from ..modules.seam import SeamCheck
from .config import PreProjConfig
from .plan import plan_injection


def trace_seams(model: nn.Module, *args: Any, check: bool = True, partial: bool = False, **kwargs: Any) -> dict:
    """The host description of `model` found by running `model(*args, **kwargs)` once (no gradients).

    Raises `TraceError` (a ValueError) naming the modules and the reason when no exact description is found:
    no seam, a post-norm seam, a hybrid stack no path tells apart, or attention modules left out (unless
    `partial`: they are then listed under the description's `left_out`, module name -> reason). With
    `check`, a deep copy injected at identity init with the description must return the same tensors (fp32,
    1e-5). The forwards run in eval mode from one RNG state: the caller's RNG and the model's train/eval
    flags are left as they were.
    """
    return trace_description(model, args, kwargs, partial=partial, verify=_check if check else None)


def _check(model: nn.Module, description: dict, args: tuple, kwargs: dict, rng: torch.Tensor) -> None:
    """A copy injected at identity init with `description` (its seams checked) must return the same tensors."""
    twin = copy.deepcopy(model)
    plan = plan_injection(twin, PreProjConfig(init="identity", skip_init_std=0.0), description)
    for site, wrapper in plan.placements:
        setattr(site.parent, site.attr, wrapper)
    for wrapper, block, norm, where, norm_path in plan.seams:
        wrapper.seam_check = SeamCheck(block, norm, where, norm_path)
    ref = probe_outputs(model, [], args, kwargs, rng)
    got = probe_outputs(twin, [], args, kwargs, rng)
    if not same_outputs(got, ref, 1e-5):
        raise TraceError(
            f"trace_seams: the traced description does not reproduce {type(model).__name__} at "
            f"identity init (of the {len(ref)} tensors it returns, some moved); {DESCRIBE_BY_HAND}"
        )
