"""The call convention shared by every rotary encoder, and its float32 cos/sin cache.

    q2, k2 = rope(q, k, pos, num_prefix_tokens=0)

q, k: (B, H, N, D) (k may have fewer heads, as in grouped-query attention).
pos:  per-token coordinates of the N - num_prefix_tokens rotated tokens, (N, A) or (B, N, A), A = rope.num_axes;
      one-axis encoders also take (N,) or (B, N). Integer or float32/float64; float16/bfloat16 positions are
      rejected (bfloat16 holds only 769 of the integers 0-4095, so neighbouring tokens would share a position).
num_prefix_tokens: the first tokens (class/register tokens, a text prefix) are returned bit-identical.

cos/sin are computed in float32 with autocast disabled, cached per (positions content, device), rebuilt when
either changes, and kept as plain attributes, so they never enter a state dict and are never cast by
`module.to(dtype)`. The rotation runs in float32; outputs have the input dtype.

Axis legend: b - batch, h - heads, n - tokens, a - position axes, f - rotated pairs (rotary_dim / 2).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from .apply import apply_rotary, check_pairing, expand_pairs

_LOW_PRECISION = (torch.float16, torch.bfloat16)


@runtime_checkable
class RotaryLike(Protocol):
    """Anything a block can take as "its rope": the call convention of the module docstring."""

    num_axes: int
    rotary_dim: int

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, num_prefix_tokens: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def cos_sin(
        self, pos: torch.Tensor, device: torch.device | str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


def _no_autocast(device_type: str) -> contextlib.AbstractContextManager:
    """Autocast switched off for device_type; a no-op where autocast does not exist (e.g. "meta")."""
    try:
        return torch.autocast(device_type, enabled=False)
    except RuntimeError:
        return contextlib.nullcontext()


def _version(t: torch.Tensor) -> int | None:
    """t's in-place edit counter; None for inference tensors, which do not track one."""
    return None if t.is_inference() else t._version


@dataclass
class _TableCache:
    """The last positions seen and their (cos, sin) tables, each (B, N, f) float32 on `device`."""

    ref: torch.Tensor  # the caller's positions object, for a cheap identity hit
    version: int | None  # ref._version when cached (in-place edits bump it); None: no identity hits
    pos: torch.Tensor  # (B, N, A) copy on `device`, compared with torch.equal on a miss of the identity
    device: torch.device
    cos: torch.Tensor
    sin: torch.Tensor


class RotaryEncoder(nn.Module):
    """Base class of all rotary encoders; subclasses only choose the spectrum.

    Args:
        head_dim: D, channels per head.
        rotary_dim: r <= D rotated channels (the first r); the rest pass through.
        num_axes: A, coordinates per token.
        pairing: "half" (channel i with i + r/2) or "interleaved" (2i with 2i + 1).
        inv_freq: (r/2,) angular frequency of each rotated pair.
        pair_axis: (r/2,) which position axis drives each pair.

    Pair j turns by `pos[..., pair_axis[j]] * inv_freq[j]` radians.
    """

    def __init__(
        self,
        head_dim: int,
        rotary_dim: int,
        num_axes: int,
        pairing: str,
        inv_freq: torch.Tensor,
        pair_axis: torch.Tensor,
    ) -> None:
        super().__init__()
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
            raise ValueError(f"head_dim={head_dim!r}; must be an int > 0")
        if not 0 < rotary_dim <= head_dim or rotary_dim % 2:
            raise ValueError(f"rotary_dim must be even and in (0, head_dim={head_dim}], got {rotary_dim}")
        check_pairing(pairing)
        if inv_freq.shape != (rotary_dim // 2,) or pair_axis.shape != (rotary_dim // 2,):
            raise ValueError(f"inv_freq and pair_axis must have shape ({rotary_dim // 2},)")
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim
        self.num_axes = num_axes
        self.pairing = pairing
        # Plain attributes, not buffers: never in a state dict, never cast by module.to(dtype).
        self._inv_freq = inv_freq.float()  # (f,)
        self._pair_axis = pair_axis.long()  # (f,)
        self._cache: _TableCache | None = None

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, pairing={self.pairing!r}"

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, num_prefix_tokens: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q and k (B, H, N, D) by the positions of their last N - num_prefix_tokens tokens."""
        if q.ndim != 4 or k.ndim != 4:
            raise ValueError(f"q and k must be (B, H, N, D), got shapes {tuple(q.shape)} and {tuple(k.shape)}")
        if q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
            raise ValueError(f"q and k must share B, N and D, got {tuple(q.shape)} and {tuple(k.shape)}")
        if q.shape[-1] != self.head_dim:
            raise ValueError(f"q and k have head dim {q.shape[-1]}, this encoder has head_dim={self.head_dim}")
        if not (q.is_floating_point() and k.is_floating_point()):  # the rotation would be truncated on the way back
            raise ValueError(f"q and k must be floating point, got {q.dtype} and {k.dtype}")
        n_tokens = q.shape[2]
        if not 0 <= num_prefix_tokens <= n_tokens:
            raise ValueError(f"num_prefix_tokens must be in [0, N={n_tokens}], got {num_prefix_tokens}")
        batched = self._batched(pos, n_tokens - num_prefix_tokens)  # (B or 1, N - P, A)
        if batched.shape[0] not in (1, q.shape[0]):
            raise ValueError(f"pos has batch {batched.shape[0]}, q and k have batch {q.shape[0]}")
        cos, sin = self._tables(pos, batched, q.device)  # (B or 1, N - P, f) float32
        with _no_autocast(q.device.type):
            if num_prefix_tokens == 0:
                return apply_rotary(q, cos, sin, self.pairing), apply_rotary(k, cos, sin, self.pairing)
            p = num_prefix_tokens
            q2 = torch.cat((q[:, :, :p], apply_rotary(q[:, :, p:], cos, sin, self.pairing)), dim=2)
            k2 = torch.cat((k[:, :, :p], apply_rotary(k[:, :, p:], cos, sin, self.pairing)), dim=2)
            return q2, k2

    def cos_sin(
        self, pos: torch.Tensor, device: torch.device | str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 (cos, sin), each (B, N, rotary_dim) ((1, N, rotary_dim) for unbatched pos), laid out for
        this encoder's pairing. For pairing="half" the layout is cos = cat(f, f), identical to transformers'
        `GPTNeoXRotaryEmbedding` / `LlamaRotaryEmbedding` output, so it can be passed as their attention's
        `position_embeddings=(cos, sin)`. A 2-D pos of a one-axis encoder is read as (B, N) here.
        """
        device = torch.device(device) if device is not None else pos.device
        cos, sin = self._tables(pos, self._batched(pos, None), device)  # (B, N, f)
        return expand_pairs(cos, self.pairing), expand_pairs(sin, self.pairing)  # (B, N, r)

    def _batched(self, pos: torch.Tensor, num_tokens: int | None) -> torch.Tensor:
        """Checked positions as (B or 1, N, A); num_tokens (if known) disambiguates one-axis (N, 1) vs (B, N)."""
        if not isinstance(pos, torch.Tensor):
            raise TypeError(f"pos must be a torch.Tensor, got {type(pos).__name__}")
        if pos.dtype in _LOW_PRECISION:
            raise ValueError(
                f"pos must be an integer or float32/float64 tensor, got {pos.dtype} (it cannot hold all "
                "integer positions: bfloat16 rounds 257 to 256)"
            )
        if pos.dtype == torch.bool or pos.is_complex():
            raise ValueError(f"pos must be an integer or float32/float64 tensor, got {pos.dtype}")
        a = self.num_axes
        if a == 1 and pos.ndim == 1:
            pos = pos[None, :, None]  # (N,) -> (1, N, 1)
        elif a == 1 and pos.ndim == 2 and (num_tokens is None or pos.shape[-1] == num_tokens):
            pos = pos[..., None]  # (B, N) -> (B, N, 1)
        elif pos.ndim == 2:
            pos = pos[None]  # (N, A) -> (1, N, A)
        if pos.ndim != 3 or pos.shape[-1] != a:
            allowed = "(N,), (B, N), (N, 1) or (B, N, 1)" if a == 1 else f"(N, {a}) or (B, N, {a})"
            raise ValueError(f"pos must have shape {allowed}, got {tuple(pos.shape)}")
        if num_tokens is not None and pos.shape[1] != num_tokens:
            raise ValueError(f"pos describes {pos.shape[1]} tokens, expected N - num_prefix_tokens = {num_tokens}")
        return pos

    def _tables(self, ref: torch.Tensor, pos: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached float32 (cos, sin) of the pair angles, each (B, N, f), for pos (B, N, A), a view of `ref`."""
        if pos.requires_grad or device.type == "meta":  # learned positions keep their graph; meta has no data
            return self._build(pos, device)
        c = self._cache
        stale_inference = c is not None and c.cos.is_inference() and not torch.is_inference_mode_enabled()
        if c is not None and c.device == device and not stale_inference:
            if c.ref is ref and c.version is not None and c.version == _version(ref) and c.pos.shape == pos.shape:
                return c.cos, c.sin
            pos_dev = pos.to(device)
            if c.pos.shape == pos_dev.shape and c.pos.dtype == pos_dev.dtype and torch.equal(c.pos, pos_dev):
                self._cache = _TableCache(ref, _version(ref), c.pos, device, c.cos, c.sin)
                return c.cos, c.sin
        cos, sin = self._build(pos, device)
        self._cache = _TableCache(ref, _version(ref), pos.detach().to(device, copy=True), device, cos, sin)
        return cos, sin

    def _build(self, pos: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 (cos, sin) (B, N, f) of angles pos[..., pair_axis] * inv_freq, with autocast off."""
        with _no_autocast(device.type):
            inv_freq = self._inv_freq.to(device)  # (f,)
            axis = self._pair_axis.to(device)  # (f,)
            angles = pos.to(device=device, dtype=torch.float32).index_select(-1, axis) * inv_freq  # (B, N, f)
            return angles.cos(), angles.sin()
