"""PreProjection / ContentSkip / PreProjConfig on their own."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.nn.functional as F

from mmpreproj import ContentSkip, PreProjConfig, PreProjection


def test_preprojection_formula_and_shapes():
    torch.manual_seed(0)
    m = PreProjection(16)
    assert m.inner_dim == 20 and m.up.weight.shape == (20, 16) and m.down.weight.shape == (16, 20)
    assert m.up.bias is None and m.down.bias is None
    x = torch.randn(3, 5, 16)
    expected = x + F.silu(x @ m.up.weight.T) @ m.down.weight.T
    torch.testing.assert_close(m(x), expected, atol=1e-6, rtol=0)


def test_paper_init_statistics():
    torch.manual_seed(0)
    m = PreProjection(768)
    for w in (m.up.weight, m.down.weight):
        assert abs(w.std().item() - 0.01) < 5e-4 and abs(w.mean().item()) < 5e-4
    s = ContentSkip(768)
    assert abs(s.weight.std().item() - 1e-4) < 5e-6


def test_identity_init_is_exact_identity_and_still_trainable():
    m = PreProjection(8, init="identity")
    x = torch.randn(4, 8)
    assert torch.equal(m(x), x)
    m(x).sum().backward()
    assert m.down.weight.grad is not None and m.down.weight.grad.abs().sum() > 0


def test_zero_skip_is_exact_zero():
    s = ContentSkip(8, init_std=0)
    assert torch.equal(s(torch.randn(2, 8)), torch.zeros(2, 8))


@pytest.mark.parametrize(
    "kwargs, field",
    [({"activation": "tanh"}, "activation"), ({"init": "xavier"}, "init")],
)
def test_bad_choices_name_the_field_and_allowed_values(kwargs, field):
    with pytest.raises(ValueError, match=field) as e:
        PreProjection(8, **kwargs)
    assert "allowed values" in str(e.value)


def test_weights_stay_fp32_and_output_keeps_input_dtype():
    m = PreProjection(8)
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    assert m(x).dtype == torch.bfloat16 and m.up.weight.dtype == torch.float32
    assert ContentSkip(8)(x).dtype == torch.bfloat16


def test_config_validation():
    with pytest.raises(ValueError, match="at least one"):
        PreProjConfig(preproj=False, skip=False)
    with pytest.raises(ValueError, match="activation"):
        PreProjConfig(activation="tanh")
    with pytest.raises(ValueError, match="init"):
        PreProjConfig(init="zeros")
    with pytest.raises(ValueError, match="layers"):
        PreProjConfig(layers=3)
    with pytest.raises(ValueError, match="layers"):
        PreProjConfig(layers=[0, 5]).resolve_layers(4)
    assert PreProjConfig(layers=[-1, 0]).resolve_layers(4) == [0, 3]


def test_config_json_round_trip_and_tolerant_load(tmp_path):
    cfg = PreProjConfig(skip=False, expansion=2.0, layers=[1, 2], init="identity")
    cfg.to_json(tmp_path / "c.json")
    assert PreProjConfig.from_json(tmp_path / "c.json") == cfg
    data = json.loads((tmp_path / "c.json").read_text())
    assert "library_version" in data
    data["future_option"] = 1
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert PreProjConfig.from_dict(data) == cfg
    assert any("future_option" in str(x.message) for x in w)


def test_wrapper_forwards_plain_attribute_writes_to_the_wrapped_module():
    from torch import nn

    from mmpreproj.hosts.spec import AttentionCall
    from mmpreproj.method.layer import PreProjAttention

    class Attn(nn.Linear):
        def __init__(self):
            super().__init__(8, 8)
            self.fused_attn = True

    base = Attn()
    w = PreProjAttention(base, AttentionCall(((0, "x"),), None), PreProjection(8), ContentSkip(8), 0)
    w.fused_attn = False  # as timm users toggle block.attn.fused_attn
    assert base.fused_attn is False and "fused_attn" not in w.__dict__
    w.adapter_enabled = False  # the wrapper's own attributes stay on the wrapper
    assert w.adapter_enabled is False and not hasattr(base, "adapter_enabled")
    x = torch.randn(2, 8)
    assert torch.equal(w(x), base(x))


@pytest.mark.parametrize("compute_dtype", ["input", "float32"])
@pytest.mark.parametrize(
    "make",
    [
        lambda c: PreProjection(24, compute_dtype=c),
        lambda c: ContentSkip(24, 0.1, compute_dtype=c),
        lambda c: ContentSkip(24, 0.1, rank=4, compute_dtype=c),
    ],
    ids=["preproj", "skip", "skip_r4"],
)
def test_the_fp32_inference_path_computes_what_the_graph_path_does(make, compute_dtype):
    """Under `no_grad` an fp32 module takes its short path (`compute.plain_float32`): bit-identical to the path that
    builds a graph, and never taken under autocast (there the output is in autocast's dtype, as before)."""
    torch.manual_seed(0)
    m, x = make(compute_dtype), torch.randn(2, 5, 24)
    with torch.no_grad():
        short = m(x)
    graph = m(x.clone().requires_grad_(True))
    assert graph.requires_grad and torch.equal(short, graph.detach())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad():
            short = m(x)
        graph = m(x.clone().requires_grad_(True))
    assert short.dtype == graph.dtype == (torch.bfloat16 if compute_dtype == "input" else torch.float32)
    assert torch.equal(short, graph.detach())
