"""Snapshots of a model, to prove that a failed call left it exactly as it was."""

from __future__ import annotations

import torch
from torch import nn

import mmpreproj


def snapshot(model: nn.Module) -> dict:
    """Everything a failed call must leave as it was: module identities, every tensor, the autograd flags and
    the injection state object."""
    return {
        "modules": [(n, id(m)) for n, m in model.named_modules()],
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "injected": mmpreproj.is_injected(model),
        "mmpreproj_state": id(getattr(model, "mmpreproj_state", None)),
    }


def assert_same_snapshot(a: dict, b: dict) -> None:
    assert a["modules"] == b["modules"]
    assert a["requires_grad"] == b["requires_grad"]
    assert (a["injected"], a["mmpreproj_state"]) == (b["injected"], b["mmpreproj_state"])
    assert a["state"].keys() == b["state"].keys()
    for k in a["state"]:
        assert torch.equal(a["state"][k], b["state"][k]), k


def assert_unchanged(model: nn.Module, before: dict) -> None:
    """`model` is as `before = snapshot(model)` found it."""
    assert_same_snapshot(snapshot(model), before)
