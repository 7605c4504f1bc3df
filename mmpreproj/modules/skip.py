"""The content skip: a linear path from the pre-projected input straight to the block output."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ContentSkip"]


class ContentSkip(nn.Module):
    """`W_skip · x~`, a bias-free d x d linear map added to the block output beside attention.

    Args:
        dim: model width d.
        init_std: `W_skip` ~ N(0, init_std) (paper: 1e-4); 0 gives an exact zero map.

    Like `PreProjection`, weights keep their own dtype (float32 by default) and the output is
    returned in the input's dtype.
    """

    def __init__(
        self,
        dim: int,
        init_std: float = 1e-4,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        if init_std < 0:
            raise ValueError(f"init_std must be >= 0, got {init_std}")
        self.dim = dim
        self.proj = nn.Linear(dim, dim, bias=False, device=device, dtype=dtype or torch.float32)
        self.reset_parameters(init_std)

    @torch.no_grad()
    def reset_parameters(self, init_std: float = 1e-4) -> None:
        """Re-draw `W_skip` from N(0, init_std), or zero it when init_std is 0."""
        if init_std == 0:
            nn.init.zeros_(self.proj.weight)
        else:
            nn.init.normal_(self.proj.weight, std=init_std)

    @property
    def weight(self) -> torch.Tensor:
        return self.proj.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (..., d) -> (..., d)
        h = x.to(self.proj.weight.dtype) if not torch.is_autocast_enabled(x.device.type) else x
        return self.proj(h).to(x.dtype)
