"""The inference matmuls of the injected modules (`WeightCasts.linear`): prepacked oneDNN bf16 weights on CPU give
exactly `F.linear`'s output, are made once per weight, and are never used where they do not apply."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmpreproj.modules import ContentSkip, PreProjection, onednn
from mmpreproj.modules.compute import WeightCasts

needs_bf16_onednn = pytest.mark.skipif(not onednn._bf16_kernels(), reason="this CPU has no oneDNN bf16 kernels")


@needs_bf16_onednn
@pytest.mark.parametrize("rows", [1, 2, 7, 16, 31, onednn.MAX_ROWS])
@pytest.mark.parametrize("shape", [(80, 64), (960, 768), (768, 960), (2304, 768), (64, 4096)])
def test_packed_linear_is_bit_identical_to_f_linear(rows, shape):
    torch.manual_seed(0)
    w = (torch.randn(*shape) * 0.02).bfloat16()
    x = torch.randn(1, rows, shape[1]).bfloat16()
    assert onednn.usable(x, w)
    assert torch.equal(onednn.linear(x, onednn.pack(w)), F.linear(x, w))


@pytest.mark.parametrize("rows", [onednn.MAX_ROWS + 1, 128])
def test_more_rows_than_the_packed_kernel_matches_take_f_linear(rows):
    """Above `MAX_ROWS` oneDNN's packed kernel rounds otherwise on an AMX CPU (a prefill): `F.linear` runs there."""
    torch.manual_seed(0)
    casts, w = WeightCasts(), nn.Parameter(torch.randn(960, 768) * 0.02)  # a module's parameter: kept
    x = torch.randn(1, rows, 768).bfloat16()
    assert not onednn.usable(x, w.bfloat16())
    with torch.no_grad():
        assert torch.equal(casts.linear(x, w), F.linear(x, w.bfloat16()))
    assert {k[2] for k in casts._casts} == {"cast"}


def test_usable_only_where_f_linear_takes_onednn():
    w = torch.randn(16, 16).bfloat16()
    assert not onednn.usable(torch.randn(1, 16).bfloat16(), w)  # 16**3 multiply-adds: ATen's own kernel
    assert not onednn.usable(torch.randn(4, 16), w.float())  # fp32: MKL, not oneDNN
    assert not onednn.usable(torch.randn(4, 16).half(), w.half())
    with torch.backends.mkldnn.flags(enabled=False):
        assert not onednn.usable(torch.randn(4, 16).bfloat16(), w)


@needs_bf16_onednn
def test_modules_in_bf16_inference_use_packed_weights_made_once_and_match_the_reference():
    torch.manual_seed(0)
    pp, skip = PreProjection(64), ContentSkip(64, init_std=0.05)
    x = torch.randn(2, 5, 64).bfloat16()
    with torch.no_grad():
        y, s = pp(x), skip(x)
        want = x + F.linear(F.silu(F.linear(x, pp.up.weight.bfloat16())), pp.down.weight.bfloat16())
        assert torch.equal(y, want) and torch.equal(s, F.linear(x, skip.weight.bfloat16()))
        layouts = {k[2] for m in (pp, skip) for k in m.casts._casts}
        assert layouts == {"packed"}  # in place of the plain casts, not beside them
        kept = {k: id(t) for k, (_, _, t) in pp.casts._casts.items()}
        pp(x)
        assert {k: id(t) for k, (_, _, t) in pp.casts._casts.items()} == kept  # reused
        pp.up.weight.mul_(2)  # an in-place update makes a new packed copy
        assert not torch.equal(pp(x), y)
        torch.testing.assert_close(
            pp(x),
            x + F.linear(F.silu(F.linear(x, pp.up.weight.bfloat16())), pp.down.weight.bfloat16()),
            rtol=0,
            atol=0,
        )


def test_a_gradient_still_goes_through_f_linear_and_reaches_the_fp32_weights():
    pp = PreProjection(64)
    x = torch.randn(3, 64).bfloat16()
    pp(x).float().sum().backward()
    assert pp.up.weight.grad is not None and pp.up.weight.grad.dtype == torch.float32
    assert not pp.casts._casts  # nothing kept from a training forward


def test_weight_casts_linear_falls_back_to_f_linear_off_the_packed_path():
    casts, w = WeightCasts(), nn.Parameter(torch.randn(24, 16))
    x = torch.randn(3, 16)
    with torch.no_grad():
        assert torch.equal(casts.linear(x, w), F.linear(x, w))  # fp32: the weight itself, nothing kept
        assert not casts._casts
        xh = x.half()
        assert torch.equal(casts.linear(xh, w), F.linear(xh, w.half()))
        assert {k[2] for k in casts._casts} == {"cast"}


def test_jit_trace_of_bf16_modules_traces_the_plain_cast_and_follows_the_weights():
    """A tracer gets the plain cast (a packed weight is opaque to it; the kept one would be baked in)."""
    torch.manual_seed(0)
    model = nn.Sequential(PreProjection(64), ContentSkip(64, init_std=0.05))
    x = torch.randn(1, 2, 64).bfloat16()  # 2 rows: the packed path where oneDNN has bf16 kernels
    with torch.no_grad():
        eager = model(x)  # casts kept
        traced = torch.jit.trace(model, (x,), check_trace=False)
        assert torch.equal(traced(x), eager)
        model[0].up.weight.mul_(2)
        assert torch.equal(traced(x), model(x)) and not torch.equal(traced(x), eager)
