"""One matmul for Q/K/V and the content skip: both read `x~`, so `[W_qkv; W_skip] · x~` serves both.

The concatenated weight is rebuilt on every call while autograd needs it (training), and cached for
inference, keyed on the tensors' identities and in-place versions so optimizer steps or `load_state_dict`
invalidate it. The cache is a plain attribute (never in a state dict) and carries no activations.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["QKVSkipWeights", "qkv_and_skip"]


class QKVSkipWeights:
    """Builds `cat([W_qkv; W_skip])` and `cat([b_qkv; 0])` in the host's dtype, caching it when no grad is needed."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._weight: torch.Tensor | None = None
        self._bias: torch.Tensor | None = None

    @staticmethod
    def _build(qkv: nn.Linear, skip_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        w = qkv.weight
        weight = torch.cat([w, skip_weight.to(w.dtype)], dim=0)  # (3d + d, d)
        bias = None
        if qkv.bias is not None:
            bias = torch.cat([qkv.bias, qkv.bias.new_zeros(skip_weight.shape[0])])
        return weight, bias

    def get(self, qkv: nn.Linear, skip_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        tensors = [qkv.weight, skip_weight] + ([qkv.bias] if qkv.bias is not None else [])
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return self._build(qkv, skip_weight)
        key = tuple((id(t), t._version, t.dtype, t.device) for t in tensors)
        if key != self._key:
            with torch.no_grad():
                self._weight, self._bias = self._build(qkv, skip_weight)
            self._key = key
        return self._weight, self._bias


def qkv_and_skip(
    x: torch.Tensor, qkv: nn.Linear, skip_weight: torch.Tensor, cache: QKVSkipWeights
) -> tuple[torch.Tensor, torch.Tensor]:
    """x: (..., d) -> (qkv (..., 3d), skip (..., d)) from one matmul, in the host's dtype."""
    weight, bias = cache.get(qkv, skip_weight)
    y = F.linear(x.to(weight.dtype), weight, bias)  # (..., 4d)
    n_qkv = qkv.out_features
    return y[..., :n_qkv], y[..., n_qkv:]
