"""Properties every rotary encoder must have: relative scores, fp32 angles, a correct cache, no state."""

from collections.abc import Callable

import pytest
import torch
from torch import nn

from mmpreproj.rope import MultimodalRoPE, RoPE1D, RoPE2D, RoPE3D, RotaryEncoder, RotaryLike

D = 32
ENCODERS: dict[str, Callable[[], RotaryEncoder]] = {
    "1d_half_partial": lambda: RoPE1D(D, rotary_fraction=0.5),
    "1d_interleaved": lambda: RoPE1D(D, pairing="interleaved", theta=5e5),
    "2d": lambda: RoPE2D(D),
    "2d_half": lambda: RoPE2D(D, pairing="half"),
    "3d": lambda: RoPE3D(D),
    "mrope": lambda: MultimodalRoPE(D, sections=(4, 6, 6)),
    "mrope_partial": lambda: MultimodalRoPE(D, sections=(2, 3, 3), rotary_fraction=0.5),
}


@pytest.fixture(params=list(ENCODERS), ids=list(ENCODERS))
def make(request) -> Callable[[], RotaryEncoder]:
    return ENCODERS[request.param]


def _pos(a: int, n: int, b: int = 1, high: int = 60, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, high, (b, n, a), generator=torch.Generator().manual_seed(seed))  # (B, N, A)


def _qk(n: int, b: int = 1, dtype: torch.dtype = torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 2, n, D, generator=g).to(dtype), torch.randn(b, 2, n, D, generator=g).to(dtype)


def _scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q @ k.transpose(-1, -2)  # (B, H, N, N)


def _rotated_like_cos_sin(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pairing: str) -> torch.Tensor:
    """x (B, H, N, r) turned by cos/sin (B, N, r) laid out for `pairing`: x * cos + partner * [-s | s] per pair."""
    cos, sin = cos[:, None], sin[:, None]
    if pairing == "half":
        a, b = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-b, a), dim=-1) * sin
    a, b = x[..., 0::2], x[..., 1::2]
    return x * cos + torch.stack((-b, a), dim=-1).flatten(-2) * sin


def _assert_rotary_like(rope) -> None:
    """The call convention of mmpreproj.rope.base, checked by behaviour rather than by attribute names."""
    assert isinstance(rope, RotaryLike)
    a, r = rope.num_axes, rope.rotary_dim
    assert isinstance(a, int) and a >= 1 and isinstance(r, int) and 0 < r <= D and r % 2 == 0
    b, p, n = 2, 3, 7  # batch, prefix tokens, rotated tokens
    g = torch.Generator().manual_seed(5)
    q = torch.randn(b, 4, p + n, D, generator=g)
    k = torch.randn(b, 2, p + n, D, generator=g)  # fewer key heads, as in grouped-query attention
    pos = torch.randint(1, 60, (b, n, a), generator=g)  # no zero coordinates: every pair turns
    for dtype in (torch.float32, torch.bfloat16):
        qd, kd = q.to(dtype), k.to(dtype)
        out = rope(qd, kd, pos, num_prefix_tokens=p)
        assert isinstance(out, tuple) and len(out) == 2
        q2, k2 = out
        assert q2.shape == qd.shape and k2.shape == kd.shape and q2.dtype == k2.dtype == dtype
        # prefix tokens are returned bit-identical; channels past rotary_dim pass through
        assert torch.equal(q2[:, :, :p], qd[:, :, :p]) and torch.equal(k2[:, :, :p], kd[:, :, :p])
        assert torch.equal(q2[..., r:], qd[..., r:]) and torch.equal(k2[..., r:], kd[..., r:])
        # a rotation: every head vector keeps its norm (to the output dtype's rounding) ...
        tol = 1e-5 if dtype == torch.float32 else 2**-7
        for x, x2 in ((qd, q2), (kd, k2)):
            torch.testing.assert_close(x2.float().norm(dim=-1), x.float().norm(dim=-1), rtol=tol, atol=tol)
            # ... and not the identity: every rotated token moved
            moved = (x2[:, :, p:, :r].float() - x[:, :, p:, :r].float()).norm(dim=-1)
            assert (moved > 1e-2 * x[:, :, p:, :r].float().norm(dim=-1)).all()
    # the rotation is the one cos_sin describes: float32 (B, N, r) tables with cos^2 + sin^2 = 1, applied per pair
    cos, sin = rope.cos_sin(pos)
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == sin.shape == (b, n, r)
    torch.testing.assert_close(cos**2 + sin**2, torch.ones_like(cos))
    q2, k2 = rope(q, k, pos, num_prefix_tokens=p)
    for x, x2 in ((q, q2), (k, k2)):
        got = x2[:, :, p:, :r]
        candidates = [_rotated_like_cos_sin(x[:, :, p:, :r], cos, sin, pr) for pr in ("half", "interleaved")]
        assert any(torch.allclose(got, want, rtol=1e-5, atol=1e-5) for want in candidates)
    # the same position gives the same rotation at any batch row, and position 0 is no rotation at all
    zero = torch.zeros(n, a, dtype=torch.long)
    q0, k0 = rope(q, k, zero, num_prefix_tokens=p)
    torch.testing.assert_close(q0, q, rtol=0, atol=1e-6)
    torch.testing.assert_close(k0, k, rtol=0, atol=1e-6)


def test_is_rotary_like(make):
    _assert_rotary_like(make())


class _Fake(nn.Module):
    """Has the protocol's attribute names (so isinstance(., RotaryLike) is True) but breaks its behaviour."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.inner, self.how = RoPE1D(D), how
        self.num_axes, self.rotary_dim = 1, D

    def cos_sin(self, pos, device=None):
        return self.inner.cos_sin(pos, device)

    def forward(self, q, k, pos, num_prefix_tokens=0):
        if self.how == "identity":
            return q, k
        if self.how == "scales":  # rotates, then stretches the rotated tokens by 1%
            q2, k2 = self.inner(q, k, pos, num_prefix_tokens)
            p = num_prefix_tokens
            return torch.cat((q2[:, :, :p], 1.01 * q2[:, :, p:]), 2), torch.cat((k2[:, :, :p], 1.01 * k2[:, :, p:]), 2)
        if self.how == "fp32_out":
            return self.inner(q.float(), k.float(), pos, num_prefix_tokens)
        if self.how == "rotates_prefix":
            full = torch.cat((pos.new_ones(*pos.shape[:-2], num_prefix_tokens, 1), pos), dim=-2)
            return self.inner(q, k, full)
        if self.how == "list":
            return list(self.inner(q, k, pos, num_prefix_tokens))
        raise AssertionError(self.how)


@pytest.mark.parametrize("how", ["identity", "scales", "fp32_out", "rotates_prefix", "list"])
def test_rotary_like_check_rejects_impostors(how):
    fake = _Fake(how)
    assert isinstance(fake, RotaryLike)  # the runtime protocol alone cannot tell
    with pytest.raises(AssertionError):
        _assert_rotary_like(fake)


def test_scores_depend_only_on_relative_position(make):
    rope = make()
    a = rope.num_axes
    q, k = _qk(12, b=2)
    pos = _pos(a, 12, b=2)
    shift = torch.tensor([7, 13, 29][:a])  # a different constant per axis
    s0 = _scores(*rope(q, k, pos))
    s1 = _scores(*rope(q, k, pos + shift))
    torch.testing.assert_close(s1, s0, rtol=1e-4, atol=1e-4)
    # ... and they do depend on it: moving one token changes its scores, and rotation is not the identity
    moved = pos.clone()
    moved[:, 3] += 5
    assert not torch.allclose(_scores(*rope(q, k, moved))[..., 3, :], s0[..., 3, :], rtol=1e-3, atol=1e-3)
    assert not torch.allclose(s0, _scores(q, k), rtol=1e-3, atol=1e-3)


def test_bf16_neighbours_at_257_rotate_differently(make):
    rope = make()
    q = torch.randn(1, 1, 1, D).expand(1, 1, 3, D).bfloat16()  # the same vector at three tokens
    pos = torch.tensor([256, 257, 258])[:, None].expand(3, rope.num_axes)  # (N, A)
    q2, _ = rope(q, q, pos)
    assert q2.dtype == torch.bfloat16
    r = rope.rotary_dim
    assert not torch.equal(q2[..., 0, :r], q2[..., 1, :r])  # positions in bf16 would round 257 to 256
    assert not torch.equal(q2[..., 1, :r], q2[..., 2, :r])
    # the rotation is computed in fp32 and rounded once
    assert torch.equal(q2, rope(q.float(), q.float(), pos)[0].bfloat16())


def test_cache_follows_length_dtype_and_positions(make):
    rope = make()
    a = rope.num_axes
    calls = [
        (16, torch.float32, _pos(a, 16, seed=1)),
        (4096, torch.bfloat16, _pos(a, 4096, high=4096, seed=2)),
        (16, torch.float32, _pos(a, 16, seed=3)),  # same shape as the first, new content
        (16, torch.bfloat16, _pos(a, 16, seed=1)),
        (16, torch.float32, _pos(a, 16, seed=1)[0]),  # unbatched (N, A)
    ]
    for n, dtype, pos in calls:
        q, k = _qk(n, dtype=dtype, seed=n)
        got = rope(q, k, pos)
        want = make()(q, k, pos)
        assert got[0].dtype == dtype
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    pos.add_(3)  # an in-place edit of the very same tensor must not hit the cache
    q, k = _qk(16)
    assert torch.equal(rope(q, k, pos)[0], make()(q, k, pos)[0])
    with torch.inference_mode():  # inference tensors have no version counter: compared by content
        pos = _pos(a, 16, seed=4)
        assert torch.equal(rope(q, k, pos)[0], make()(q, k, pos)[0])
        pos.add_(1)
        assert torch.equal(rope(q, k, pos)[0], make()(q, k, pos)[0])


def test_nothing_in_state_dict_and_dtype_casts_are_harmless(make):
    rope = make()
    host = nn.Sequential(nn.Linear(4, 4), rope)
    q, k = _qk(8)
    pos = _pos(rope.num_axes, 8)
    ref = rope(q, k, pos)[0]
    assert rope.state_dict() == {} and set(host.state_dict()) == {"0.weight", "0.bias"}
    assert list(rope.buffers()) == [] and list(rope.parameters()) == []
    host.to(torch.bfloat16)  # must not turn the spectrum into bf16
    assert torch.equal(rope(q, k, pos.clone())[0], ref)


def test_autocast_keeps_fp32_tables(make):
    rope = make()
    q, k = _qk(10)
    pos = _pos(rope.num_axes, 10, high=3000)
    ref = rope(q, k, pos)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cos, sin = make().cos_sin(pos)
        got = make()(q, k, pos)
        got_bf16 = make()(q.bfloat16(), k.bfloat16(), pos)
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == (1, 10, rope.rotary_dim)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    assert got_bf16[0].dtype == torch.bfloat16
    assert torch.equal(got_bf16[0], rope(q.bfloat16(), k.bfloat16(), pos)[0])


def test_prefix_tokens_and_gradients(make):
    rope = make()
    q, k = _qk(9, b=2)
    q.requires_grad_(True)
    pos = _pos(rope.num_axes, 7, b=2)
    with torch.inference_mode():  # a cache built here must not leak inference tensors into autograd
        rope(q.detach()[:, :, 2:], k[:, :, 2:], pos)
    q2, k2 = rope(q, k, pos, num_prefix_tokens=2)
    assert torch.equal(q2[:, :, :2], q[:, :, :2]) and torch.equal(k2[:, :, :2], k[:, :, :2])
    assert torch.equal(q2[:, :, 2:], make()(q[:, :, 2:], k[:, :, 2:], pos)[0])
    (q2 * torch.randn_like(q2)).sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
