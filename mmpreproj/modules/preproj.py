"""The pre-projection: a residual SiLU bottleneck between a block's norm and its Q/K/V projections."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["PreProjection", "ACTIVATIONS", "PREPROJ_INITS"]

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

    Weights are kept in their own dtype (float32 by default) whatever the input dtype: the input is
    cast to the weight dtype and the result cast back, so a bf16 host keeps fp32 master weights.
    """

    def __init__(
        self,
        dim: int,
        expansion: float = 1.25,
        activation: str = "silu",
        init: str = "paper",
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        _check_choice("activation", activation, ACTIVATIONS)
        _check_choice("init", init, PREPROJ_INITS)
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        if expansion <= 0:
            raise ValueError(f"expansion must be positive, got {expansion}")
        self.dim = dim
        self.inner_dim = int(expansion * dim)
        self.activation_name = activation
        factory = {"device": device, "dtype": dtype or torch.float32}
        self.up = nn.Linear(dim, self.inner_dim, bias=False, **factory)
        self.act = ACTIVATIONS[activation]()
        self.down = nn.Linear(self.inner_dim, dim, bias=False, **factory)
        self.reset_parameters(init)

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
        h = x.to(self.up.weight.dtype) if not torch.is_autocast_enabled(x.device.type) else x
        h = h + self.down(self.act(self.up(h)))
        return h.to(x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, inner_dim={self.inner_dim}, activation={self.activation_name!r}"
