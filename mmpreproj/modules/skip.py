"""The content skip: a linear path from the pre-projected input straight to the block output."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .compute import COMPUTE_DTYPES, WeightCasts, check_width, plain_float32, resolve_compute_dtype


class ContentSkip(nn.Module):
    """`W_skip · x~`, a bias-free linear map added to the block output beside attention.

    Full (`rank=None`, the paper's): `W_skip` is one d x d matrix (`proj.weight`), `d*d` weights.
    Low-rank (`rank=r`): `W_skip = B A` with A = `down.weight` (r x d) and B = `up.weight` (d x r), `2*r*d` weights.

    Init: full, `W_skip` ~ N(0, init_std). Low-rank, B ~ N(0, init_std) and A ~ N(0, 1/sqrt(r)), so the
    entries of B A have std init_std as the full matrix's do; `init_std=0` zeroes B, an exact zero map (the
    host's output unchanged) in which B gets a gradient at once and A from the first step that moves B.

    Args:
        dim: model width d.
        init_std: the init's std (paper: 1e-4); 0 gives an exact zero map.
        rank: None for the full d x d matrix, or r >= 1 for `B A` (r < d saves weights).
        compute_dtype: as `PreProjection`: "input" computes in (and returns) the input's dtype, or autocast's;
            "float32" computes in the weight's dtype and returns the input's. The weights stay float32.
    """

    def __init__(
        self,
        dim: int,
        init_std: float = 1e-4,
        *,
        rank: int | None = None,
        compute_dtype: str = "input",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        check_width(dim)
        _check_init_std(init_std)
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= dim):
            raise ValueError(f"rank={rank!r}; must be None (the full d x d matrix) or an int in 1..dim={dim}")
        if compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(
                f"compute_dtype={compute_dtype!r} is not supported; allowed values: {list(COMPUTE_DTYPES)}"
            )
        self.dim = dim
        self.rank = rank
        self.compute_dtype = compute_dtype
        self.casts = WeightCasts()
        factory = {"device": device, "dtype": dtype or torch.float32}
        if rank is None:
            self.proj = nn.Linear(dim, dim, bias=False, **factory)
        else:
            self.down = nn.Linear(dim, rank, bias=False, **factory)  # A: (r, d)
            self.up = nn.Linear(rank, dim, bias=False, **factory)  # B: (d, r)
        self.reset_parameters(init_std)

    @staticmethod
    def num_params(dim: int, rank: int | None = None) -> int:
        """The weights of one content skip of width `dim`: `d*d` for the full `W_skip`, `2*r*d` at rank r (the
        one place this count is written; `estimate`, the budget sizing and `train.methods` call it)."""
        return dim * dim if rank is None else 2 * rank * dim

    @torch.no_grad()
    def reset_parameters(self, init_std: float = 1e-4) -> None:
        """Re-draw the weights (see the class docstring); init_std 0 gives an exact zero map."""
        _check_init_std(init_std)
        last = self.proj if self.rank is None else self.up
        if self.rank is not None:
            nn.init.normal_(self.down.weight, std=1.0 / math.sqrt(self.rank))
        if init_std == 0:
            nn.init.zeros_(last.weight)
        else:
            nn.init.normal_(last.weight, std=init_std)

    @property
    def weight(self) -> torch.Tensor:
        """The effective d x d `W_skip` (B A for a low-rank skip, computed; `proj.weight` itself otherwise)."""
        return self.proj.weight if self.rank is None else self.up.weight @ self.down.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (..., d) -> (..., d)
        if self.rank is None:
            w = self.proj.weight
            if plain_float32(x, w):  # fp32 decode / inference: the lines below compute exactly this
                return F.linear(x, w)
            ws = {"proj": w}
        else:  # (r, d) then (d, r): (..., d) -> (..., r) -> (..., d)
            ws = {"down": self.down.weight, "up": self.up.weight}
        first = next(iter(ws.values()))
        if self.compute_dtype == "float32":  # the earlier behaviour
            h = x.to(first.dtype) if not torch.is_autocast_enabled(x.device.type) else x
            for w in ws.values():
                h = F.linear(h, w)
            return h.to(x.dtype)
        dtype = resolve_compute_dtype(self.compute_dtype, x, first)
        h = x.to(dtype)
        graph = torch.is_grad_enabled() and (x.requires_grad or any(w.requires_grad for w in ws.values()))
        for name, w in ws.items():
            # a graph: cast for this call; no graph: the kept cast, prepacked where faster (`WeightCasts.linear`)
            h = F.linear(h, self.casts(w, dtype, name)) if graph else self.casts.linear(h, w, name)
        return h

    def _apply(self, fn, *args, **kwargs):
        self.casts.clear()  # `.to()`, `.cuda()`, `.float()`: new weights, possibly at a freed address
        return super()._apply(fn, *args, **kwargs)

    def extra_repr(self) -> str:
        rank = "" if self.rank is None else f", rank={self.rank}"
        return f"dim={self.dim}{rank}, compute_dtype={self.compute_dtype!r}"


def _check_init_std(init_std: float) -> None:
    if isinstance(init_std, bool) or not isinstance(init_std, (int, float)) or not 0 <= init_std < math.inf:
        raise ValueError(f"init_std={init_std!r}; must be a finite number >= 0")
