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


def test_is_rotary_like(make):
    assert isinstance(make(), RotaryLike)


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
