"""The seam check under module hooks that replace tensors (DeepSpeed ZeRO-3, a user's forward hook): the
attention may receive another tensor object for the norm's output. Same memory or equal values pass; other
values, or a norm that has not run, are still refused (the ZeRO-3 engine itself: test_sharded_zero3.py)."""

from __future__ import annotations

import pytest
import torch

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj.method.layer import SeamError, same_tensor
from tests.helpers.zoo import tiny_neox


class _PassOn(torch.autograd.Function):
    """What ZeRO-3's module hooks do to every output: the same memory under a new tensor object."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.detach()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


HOOKS = {
    "a copy": lambda m, args, out: out.clone(),
    "zero3-like detached view": lambda m, args, out: _PassOn.apply(out),
}


def _ids() -> torch.Tensor:
    return torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))


def _injected() -> torch.nn.Module:
    return mmpreproj.inject(tiny_neox(), PreProjConfig(skip_init_std=0.05))


@pytest.mark.parametrize("hook", list(HOOKS))
def test_a_norm_hook_returning_the_same_values_in_a_new_tensor_passes(hook):
    want = _injected()(input_ids=_ids()).logits
    model = _injected()
    for layer in model.gpt_neox.layers:
        layer.input_layernorm.register_forward_hook(HOOKS[hook])
    out = model(input_ids=_ids()).logits  # checked at this first call: no SeamError
    assert torch.equal(out, want)
    out.sum().backward()  # the graph runs through the replaced tensors
    assert all(w.seam_check is None for w in mmpreproj.injected_modules(model))  # checked once, then gone
    assert all(len(layer.input_layernorm._forward_hooks) == 1 for layer in model.gpt_neox.layers)  # the user's


def test_a_norm_hook_returning_other_values_is_still_refused():
    model = _injected()
    model.gpt_neox.layers[1].input_layernorm.register_forward_hook(lambda m, args, out: out * 1.5)
    with pytest.raises(
        SeamError, match=r"block 1.*does not receive the output of 'input_layernorm' \(it received another tensor\)"
    ):
        model(input_ids=_ids())


def test_a_description_naming_the_wrong_norm_is_still_refused():
    part = {
        "name": "language",
        "blocks": "gpt_neox.layers",
        "attention": "attention",
        "norm": "post_attention_layernorm",
    }
    model = mmpreproj.inject(tiny_neox(), PreProjConfig(), host={"name": "neox", "parts": [part]})
    # parallel residual: post_attention_layernorm runs after attention has been called
    with pytest.raises(SeamError, match=r"'post_attention_layernorm' \(the norm has not run before attention\)"):
        model(input_ids=_ids())


def test_same_tensor_compares_memory_then_values():
    x = torch.randn(3, 4)
    assert same_tensor(x, x) and same_tensor(x, x.detach()) and same_tensor(x, x.clone())
    assert not same_tensor(x, x + 1e-6)  # values differ: refused, however close
    assert not same_tensor(x, x.reshape(4, 3)) and not same_tensor(x, x.double()) and not same_tensor(x, (x,))
    sq = torch.randn(4, 4)
    assert not same_tensor(sq, sq.t())  # same memory, another layout: other values
    sym = sq + sq.t()
    assert same_tensor(sym, sym.t())  # ... unless the values are equal
