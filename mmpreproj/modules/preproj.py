"""The pre-projection: a residual SiLU bottleneck between a block's norm and its Q/K/V projections."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .compute import COMPUTE_DTYPES, WeightCasts, check_width, plain_float32, resolve_compute_dtype

ACTIVATIONS: dict[str, type[nn.Module]] = {"silu": nn.SiLU, "gelu": nn.GELU, "relu": nn.ReLU}
PREPROJ_INITS = ("paper", "identity")


def _check_choice(field: str, value: str, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{field}={value!r} is not supported; allowed values: {sorted(allowed)}")


class PreProjection(nn.Module):
    """`x~ = x + W_down · act(W_up · x)`, bias-free, inner width `int(expansion * dim)`.

    Position-agnostic: it acts on each token alone, so it can sit ahead of any positional encoder.

    Args:
        dim: model width d.
        expansion: inner width is `int(expansion * dim)` (paper: 1.25).
        activation: one of `ACTIVATIONS` (paper: "silu").
        init: "paper" draws both weights from N(0, 0.01) (near-identity); "identity" zeroes
            `W_down`, so the module is exactly the identity at start and still trains.
        compute_dtype: "input" computes in the input's dtype (or autocast's), like a host linear layer, and
            returns `x~` in that dtype; "float32" casts the input to the weights' dtype and back (the
            earlier behaviour). Either way the weights stay float32 (the master copy the optimizer updates).

    In training the activation is recomputed in backward (`_Bottleneck`): per token it saves `x^` and
    `W_up·x^`, not the activation's output as well.
    """

    def __init__(
        self,
        dim: int,
        expansion: float = 1.25,
        activation: str = "silu",
        init: str = "paper",
        *,
        compute_dtype: str = "input",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        _check_choice("activation", activation, ACTIVATIONS)
        _check_choice("init", init, PREPROJ_INITS)
        _check_choice("compute_dtype", compute_dtype, COMPUTE_DTYPES)
        check_width(dim)
        finite = isinstance(expansion, (int, float)) and not isinstance(expansion, bool) and math.isfinite(expansion)
        if not finite or int(expansion * dim) < 1:
            raise ValueError(
                f"expansion={expansion!r}; must be a finite number with an inner width int(expansion * {dim}) >= 1"
            )
        self.dim = dim
        self.inner_dim = int(expansion * dim)
        self.activation_name = activation
        self.compute_dtype = compute_dtype
        self.casts = WeightCasts()
        factory = {"device": device, "dtype": dtype or torch.float32}
        self.up = nn.Linear(dim, self.inner_dim, bias=False, **factory)
        self.act = ACTIVATIONS[activation]()
        self.down = nn.Linear(self.inner_dim, dim, bias=False, **factory)
        self.reset_parameters(init)

    @staticmethod
    def num_params(dim: int, expansion: float = 1.25) -> int:
        """The weights of one pre-projection of width `dim`: `W_up` and `W_down`, 2 * d * int(expansion * d)
        (the one place this count is written; `estimate`, the budget sizing and `train.methods` call it)."""
        return 2 * dim * int(expansion * dim)

    @torch.no_grad()
    def reset_parameters(self, init: str = "paper") -> None:
        """Re-draw the weights with the given init ("paper" or "identity")."""
        _check_choice("init", init, PREPROJ_INITS)
        nn.init.normal_(self.up.weight, std=0.01)
        if init == "paper":
            nn.init.normal_(self.down.weight, std=0.01)
        else:
            nn.init.zeros_(self.down.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (..., d) -> (..., d)
        w_up, w_down = self.up.weight, self.down.weight
        if plain_float32(x, w_up):  # fp32 decode / inference: the lines below compute exactly this
            return x + F.linear(self.act(F.linear(x, w_up)), w_down)
        if self.compute_dtype == "float32":  # the earlier behaviour, rounding included
            h = x.to(w_up.dtype) if not torch.is_autocast_enabled(x.device.type) else x
            return (h + self._delta(h, w_up, w_down)).to(x.dtype)
        dtype = resolve_compute_dtype(self.compute_dtype, x, w_up)
        h = x.to(dtype)
        if torch.is_grad_enabled() and (x.requires_grad or w_up.requires_grad or w_down.requires_grad):
            delta = self._delta(h, self.casts(w_up, dtype, "up"), self.casts(w_down, dtype, "down"))
        else:  # no graph (inference, generate): kept casts, prepacked where that is faster (`WeightCasts.linear`)
            casts = self.casts
            delta = casts.linear(self.act(casts.linear(h, w_up, "up")), w_down, "down")
            if x.dtype == dtype:  # the line below without its two no-op casts (decode pays per op)
                return x + delta
        return (x + delta.to(x.dtype)).to(dtype)  # x^ + delta rounded once, into the dtype computed in

    def _apply(self, fn, *args, **kwargs):
        self.casts.clear()  # `.to()`, `.cuda()`, `.float()`: new weights, possibly at a freed address
        return super()._apply(fn, *args, **kwargs)

    def _delta(self, h: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
        needs_grad = h.requires_grad or w_up.requires_grad or w_down.requires_grad
        if torch.is_grad_enabled() and needs_grad and type(self.act) in _ACT_BACKWARD:
            fn = _Bottleneck if torch.compiler.is_compiling() else _BottleneckJvp
            return fn.apply(h, w_up, w_down, self.act)[0]
        return F.linear(self.act(F.linear(h, w_up)), w_down)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, inner_dim={self.inner_dim}, activation={self.activation_name!r}, "
            f"compute_dtype={self.compute_dtype!r}"
        )


class _Bottleneck(torch.autograd.Function):
    """`W_down · act(W_up · x)` saving `x` and `u = W_up · x` for backward; `act(u)` is recomputed there.

    Autograd alone would also keep `act(u)` (for `W_down`'s gradient): 1.25 d more values per token. The
    weights come in already cast to the compute dtype (autograd casts, so their gradients reach fp32). Where the
    backward itself is differentiated (`create_graph=True`: double backward, gradient penalties; torch.func's
    `jacrev`, `hessian`) `act'(u)` is written in plain differentiable ops (`_ACT_DERIVATIVE`), else aten's fused
    backward kernels; the forward is split from `setup_context` (and `_BottleneckJvp` adds forward mode), so
    torch.func's transforms (`grad`, `vmap`, `jacrev`, `jacfwd`, `hessian`) run it.
    """

    generate_vmap_rule = True  # every op below has a batching rule

    @staticmethod
    def forward(
        x: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, act: nn.Module
    ) -> tuple[torch.Tensor, torch.Tensor]:
        u = F.linear(x, w_up)  # (..., inner)
        return F.linear(act(u), w_down), u  # (..., d), and u for `setup_context` to keep (callers drop it)

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: tuple[torch.Tensor, torch.Tensor]) -> None:
        x, w_up, w_down, act = inputs
        ctx.act = act
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(x, w_up, w_down, output[1])

    @staticmethod
    def backward(ctx, grad: torch.Tensor, _grad_u: torch.Tensor | None):
        x, w_up, w_down, u = ctx.saved_tensors
        grad_s = grad @ w_down.to(grad.dtype)  # (..., inner)
        if torch.is_grad_enabled():  # this backward is differentiated: u again from x (the kept one has no graph)
            u = F.linear(x, w_up)
            grad_u = _ACT_DERIVATIVE[type(ctx.act)](ctx.act, grad_s, u)
        else:
            grad_u = _ACT_BACKWARD[type(ctx.act)](ctx.act, grad_s, u)
        grad_x = grad_u @ w_up.to(grad.dtype) if ctx.needs_input_grad[0] else None
        grad_up = _flat(grad_u).T @ _flat(x).to(grad.dtype) if ctx.needs_input_grad[1] else None
        grad_down = _flat(grad).T @ _flat(ctx.act(u)).to(grad.dtype) if ctx.needs_input_grad[2] else None
        return grad_x, grad_up, grad_down, None


class _BottleneckJvp(_Bottleneck):
    """`_Bottleneck` with forward mode (`torch.func.jvp`, `jacfwd`, `hessian`); torch.compile cannot trace a custom
    `jvp`, so a traced forward uses `_Bottleneck`."""

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: tuple[torch.Tensor, torch.Tensor]) -> None:
        _Bottleneck.setup_context(ctx, inputs, output)
        ctx.save_for_forward(*inputs[:3], output[1])

    @staticmethod
    def jvp(ctx, x_t: torch.Tensor | None, up_t: torch.Tensor | None, down_t: torch.Tensor | None, _act_t: None):
        """Forward mode: d out = W_down' act(u) + W_down (act'(u) du), du = W_up' x + W_up x'."""
        x, w_up, w_down, u = ctx.saved_tensors
        terms = []
        du = [F.linear(t, w) for t, w in ((x_t, w_up), (x, up_t)) if t is not None and w is not None]
        if du:  # (..., inner)
            terms.append(F.linear(_ACT_DERIVATIVE[type(ctx.act)](ctx.act, sum(du), u), w_down))
        if down_t is not None:
            terms.append(F.linear(ctx.act(u), down_t))
        return (sum(terms) if terms else None), None


# d act(u) / du applied to a gradient, as autograd computes it (aten ops: traceable by torch.compile)
_ACT_BACKWARD = {
    nn.SiLU: lambda act, g, u: torch.ops.aten.silu_backward(g, u),
    nn.GELU: lambda act, g, u: torch.ops.aten.gelu_backward(g, u, approximate=act.approximate),
    nn.ReLU: lambda act, g, u: torch.ops.aten.threshold_backward(g, u, 0),
}


def _opmath(t: torch.Tensor) -> torch.Tensor:
    """bf16/fp16 in float, as aten's backward kernels compute them; float and double as they are."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


def _silu_derivative(act: nn.Module, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    uf = _opmath(u)  # in aten's order (`silu_backward`)
    s = 1 / (1 + torch.exp(-uf))
    return (_opmath(g) * s * (1 + uf * (1 - s))).to(g.dtype)


def _gelu_derivative(act: nn.GELU, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    uf, gf = _opmath(u), _opmath(g)
    if act.approximate == "tanh":
        k = math.sqrt(2 / math.pi)
        t = torch.tanh(k * (uf + 0.044715 * uf**3))
        return (gf * (0.5 * (1 + t) + 0.5 * uf * (1 - t * t) * k * (1 + 3 * 0.044715 * uf * uf))).to(g.dtype)
    cdf = 0.5 * (1 + torch.erf(uf / math.sqrt(2)))
    return (gf * (cdf + uf * torch.exp(-0.5 * uf * uf) / math.sqrt(2 * math.pi))).to(g.dtype)


# the same derivatives in plain differentiable ops (a backward that is itself differentiated, forward mode)
_ACT_DERIVATIVE = {
    nn.SiLU: _silu_derivative,
    nn.GELU: _gelu_derivative,
    nn.ReLU: lambda act, g, u: g * (u > 0).to(g.dtype),
}


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])  # (..., n) -> (tokens, n)
