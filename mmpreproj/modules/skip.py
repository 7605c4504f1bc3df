"""The content skip: a linear path from the pre-projected input straight to the block output."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .compute import COMPUTE_DTYPES, WeightCasts, resolve_compute_dtype

__all__ = ["ContentSkip"]


class ContentSkip(nn.Module):
    """`W_skip · x~`, a bias-free d x d linear map added to the block output beside attention.

    Args:
        dim: model width d.
        init_std: `W_skip` ~ N(0, init_std) (paper: 1e-4); 0 gives an exact zero map.
        compute_dtype: as `PreProjection`: "input" computes in (and returns) the input's dtype, or autocast's;
            "float32" computes in the weight's dtype and returns the input's. The weight stays float32.
    """

    def __init__(
        self,
        dim: int,
        init_std: float = 1e-4,
        *,
        compute_dtype: str = "input",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        if init_std < 0:
            raise ValueError(f"init_std must be >= 0, got {init_std}")
        if compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype={compute_dtype!r} is not supported; allowed values: {list(COMPUTE_DTYPES)}")
        self.dim = dim
        self.compute_dtype = compute_dtype
        self.casts = WeightCasts()
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
        w = self.proj.weight
        if self.compute_dtype == "float32":  # the earlier behaviour
            h = x.to(w.dtype) if not torch.is_autocast_enabled(x.device.type) else x
            return self.proj(h).to(x.dtype)
        dtype = resolve_compute_dtype(self.compute_dtype, x, w)
        if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
            return F.linear(x.to(dtype), self.casts(w, dtype))
        return self.casts.linear(x.to(dtype), w)  # no graph: kept cast, prepacked where faster

    def _apply(self, fn, *args, **kwargs):
        self.casts.clear()  # `.to()`, `.cuda()`, `.float()`: new weights, possibly at a freed address
        return super()._apply(fn, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, compute_dtype={self.compute_dtype!r}"
