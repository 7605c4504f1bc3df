"""Activation checkpointing checks shared by the host test modules."""

from __future__ import annotations

import torch

import mmpreproj
from tests.helpers.host_contract import HostCase, injected_params


def check_checkpointing(case: HostCase, reentrant: bool) -> None:
    """transformers' own gradient checkpointing with the base frozen: same injected gradients as without."""

    def grads(checkpointing: bool) -> dict[str, torch.Tensor]:
        model = case.build()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        mmpreproj.inject(model).train()
        out = case.forward(model, case.inputs())
        sum(o.square().mean() for o in (out if isinstance(out, tuple) else (out,))).backward()
        return {n: p.grad for n, p in injected_params(model).items()}

    plain, ckpt = grads(False), grads(True)
    for n, g in ckpt.items():
        assert g is not None and g.abs().sum() > 0, f"no gradient for {n} under checkpointing"
        torch.testing.assert_close(g, plain[n], atol=1e-6, rtol=1e-4)
