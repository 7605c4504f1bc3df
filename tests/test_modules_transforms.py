"""The paper's modules under torch's transforms and higher-order autograd, against plain autograd of the same math:
double backward (`create_graph=True`), torch.func's `grad`, per-sample `vmap(grad)`, `jacrev`, `jacfwd`, `hessian`;
and the kept inference casts (`modules.compute.WeightCasts`) with tensors that are not the module's parameters
(`functional_call`, `vmap`, parametrizations), swapped and replaced weights, optimizer steps (fused ones do not
version their writes) and the writes torch does not version (docs/limits.md)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from mmpreproj.modules.preproj import PreProjection
from mmpreproj.modules.skip import ContentSkip


def _preproj(activation: str = "silu", dtype: torch.dtype = torch.float64) -> PreProjection:
    torch.manual_seed(0)
    pp = PreProjection(8, activation=activation).to(dtype)
    with torch.no_grad():
        pp.down.weight.normal_(std=0.3)
    return pp


def _reference(params: dict[str, torch.Tensor], x: torch.Tensor, act: nn.Module) -> torch.Tensor:
    """x + W_down act(W_up x), by plain autograd."""
    return x + F.linear(act(F.linear(x, params["up.weight"])), params["down.weight"])


@pytest.mark.parametrize("activation", ["silu", "gelu", "relu"])
def test_double_backward_equals_plain_autograd(activation):
    pp = _preproj(activation)
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    params = dict(pp.named_parameters())

    def penalty(out: torch.Tensor, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        gs = torch.autograd.grad(out.square().sum(), inputs, create_graph=True)
        return torch.autograd.grad(sum(g.pow(2).sum() for g in gs), inputs)

    got = penalty(pp(x), [x, *params.values()])
    x2 = x.detach().clone().requires_grad_(True)
    want = penalty(_reference(params, x2, pp.act), [x2, *params.values()])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12)


def test_torch_func_grad_and_per_sample_grads_equal_a_loop():
    pp = _preproj()
    params = {k: v.detach() for k, v in pp.named_parameters()}
    xs = torch.randn(4, 5, 8, dtype=torch.float64)

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return functional_call(pp, p, (x,)).square().sum()

    per_sample = vmap(grad(loss), in_dims=(None, 0))(params, xs)
    for i in range(xs.shape[0]):
        want = torch.func.grad(lambda p, x=xs[i]: _reference(p, x, pp.act).square().sum())(params)
        for k in params:
            torch.testing.assert_close(per_sample[k][i], want[k], rtol=1e-9, atol=1e-12)


def _bf16_pair() -> tuple[PreProjection, ContentSkip, torch.Tensor]:
    torch.manual_seed(0)
    pp, skip = PreProjection(32), ContentSkip(32, init_std=0.1)
    with torch.no_grad():
        pp.down.weight.normal_(std=0.3)
    return pp, skip, torch.randn(2, 3, 32).to(torch.bfloat16)


def _exact_bf16(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w.to(torch.bfloat16))


def test_functional_call_with_new_tensors_never_gets_another_calls_cast():
    _, skip, x = _bf16_pair()
    w = skip.proj.weight.detach()
    with torch.no_grad():
        skip(x)  # a cast of the module's own parameter is kept
        for k in range(20):  # new tensors, freed after each call: their ids and addresses come back
            scaled = w * (1 + k / 2)
            out = functional_call(skip, {"proj.weight": scaled}, (x,))
            torch.testing.assert_close(out, _exact_bf16(scaled, x), rtol=0, atol=0)
            del scaled, out
        torch.testing.assert_close(skip(x), _exact_bf16(w, x), rtol=0, atol=0)


def test_vmap_over_stacked_weights_of_a_bf16_input():
    pp, _, x = _bf16_pair()
    stacked = {k: torch.stack([v.detach(), 2 * v.detach()]) for k, v in pp.named_parameters()}
    with torch.no_grad():
        out = vmap(lambda p: functional_call(pp, p, (x,)))(stacked)
        for i in range(2):
            one = functional_call(pp, {k: v[i] for k, v in stacked.items()}, (x,))
            torch.testing.assert_close(out[i], one, rtol=0, atol=0)


def test_a_parametrized_weight_is_cast_on_every_call():
    _, skip, x = _bf16_pair()

    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.k = 1.0

        def forward(self, w: torch.Tensor) -> torch.Tensor:
            return w * self.k

    scale = Scale()
    torch.nn.utils.parametrize.register_parametrization(skip.proj, "weight", scale)
    with torch.no_grad():
        a = skip(x)
        scale.k = 3.0  # the computed weight is a new tensor each call, maybe at the last one's address
        b = skip(x)
    torch.testing.assert_close(b, _exact_bf16(skip.proj.weight, x), rtol=0, atol=0)
    assert not torch.equal(a, b)


def test_a_write_through_data_is_not_seen_until_to_drops_the_casts():
    """docs/limits.md: a write torch does not version keeps the old cast; any `.to()` drops it."""
    _, skip, x = _bf16_pair()
    with torch.no_grad():
        before = skip(x)
        skip.proj.weight.data.mul_(3)
        assert torch.equal(skip(x), before)  # the documented limit
        skip.to("cpu")
        torch.testing.assert_close(skip(x), _exact_bf16(skip.proj.weight, x), rtol=0, atol=0)
        skip.proj.weight.mul_(2)  # a versioned write: seen at once
        torch.testing.assert_close(skip(x), _exact_bf16(skip.proj.weight, x), rtol=0, atol=0)


def test_hooks_run_on_the_modules_not_on_their_weight_holders():
    """docs/limits.md: the inner nn.Linear modules are never called (as nn.MultiheadAttention's out_proj)."""
    pp, skip, x = _bf16_pair()
    ran = []
    for name, m in (("preproj", pp), ("up", pp.up), ("skip", skip), ("proj", skip.proj)):
        m.register_forward_hook(lambda *a, name=name: ran.append(name))
    skip(pp(x.float()))
    assert ran == ["preproj", "skip"]


@pytest.mark.parametrize("activation", ["silu", "gelu", "relu"])
def test_jacrev_jacfwd_and_hessian_equal_plain_autograd(activation):
    pp = _preproj(activation)
    params = {k: v.detach() for k, v in pp.named_parameters()}
    x = torch.randn(8, dtype=torch.float64)
    ours = (lambda v: pp(v), lambda p: functional_call(pp, p, (x,)))
    plain = (lambda v: _reference(params, v, pp.act), lambda p: _reference(p, x, pp.act))
    torch.testing.assert_close(torch.func.jacrev(ours[0])(x), torch.func.jacrev(plain[0])(x), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(torch.func.jacfwd(ours[0])(x), torch.func.jacfwd(plain[0])(x), rtol=1e-12, atol=1e-14)
    for f, g, at in ((ours[0], plain[0], x), (ours[1], plain[1], params)):  # jacfwd over jacrev: the forward mode
        h, r = (torch.func.hessian(lambda a, k=k: k(a).square().sum())(at) for k in (f, g))
        torch.testing.assert_close(h, r, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
def test_an_optimizer_step_after_a_backward_is_seen_by_the_next_inference(fused):
    """A fused step updates in place without versioning: a weight that holds a gradient keeps no cast, and a training
    forward (fp32 too, which casts nothing) drops what was kept."""
    pp, skip, x = _bf16_pair()
    model = nn.Sequential(pp, skip)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=fused, foreach=not fused)
    with torch.no_grad():
        model(x)  # casts kept
    model(x).float().square().sum().backward()
    with torch.no_grad():
        model(x)  # an evaluation between the backward and the step
    opt.step()
    with torch.no_grad():
        torch.testing.assert_close(model(x), copy.deepcopy(model)(x), rtol=0, atol=0)
    opt.zero_grad()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(x.float())  # casts kept under autocast
    model(x.float()).square().sum().backward()  # an fp32 training forward, no autocast
    opt.step()
    opt.zero_grad()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        torch.testing.assert_close(model(x.float()), copy.deepcopy(model)(x.float()), rtol=0, atol=0)


def test_kept_casts_let_the_weights_be_swapped_and_replaced_and_stay_bounded():
    pp, skip, x = _bf16_pair()
    with torch.no_grad():
        pp(x)
        new = nn.Parameter(torch.randn_like(pp.up.weight))
        torch.utils.swap_tensors(pp.up.weight, new)  # refused while a weak reference is held
        torch.testing.assert_close(pp(x), copy.deepcopy(pp)(x), rtol=0, atol=0)
        for _ in range(20):
            pp.up.weight = nn.Parameter(torch.randn_like(pp.up.weight))
            torch.testing.assert_close(pp(x), copy.deepcopy(pp)(x), rtol=0, atol=0)
            p = {k: nn.Parameter(torch.randn_like(v)) for k, v in pp.named_parameters()}
            want = _reference({k: v.to(x.dtype) for k, v in p.items()}, x, pp.act)
            torch.testing.assert_close(functional_call(pp, p, (x,)), want, rtol=0, atol=0)
    assert len(pp.casts._casts) <= 2 * 2  # up and down, in a cast and maybe a prepacked layout
