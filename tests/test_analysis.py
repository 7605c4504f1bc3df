"""Skip-norm analysis against direct computations, on every path the wrapper takes (tuple and tensor outputs,
skip-only, pre-projection only, adapter disabled)."""

from __future__ import annotations

import pytest
import torch

import mmpreproj
from mmpreproj.analysis import plot_skip_norms, routing_ratios, skip_norms, skip_norms_from_adapter
from tests.helpers.png_content import assert_draws, colour_mask
from tests.helpers.zoo import tiny_neox


def test_skip_norms_match_weights_and_saved_adapter(tmp_path):
    model = mmpreproj.inject(tiny_neox(), mmpreproj.PreProjConfig(skip_init_std=0.1))
    norms = skip_norms(model)
    for w in mmpreproj.injected_modules(model):
        assert abs(norms[w.block_index] - torch.linalg.matrix_norm(w.slots()[1].proj.weight).item()) < 1e-6
    mmpreproj.save_adapter(model, tmp_path)
    assert skip_norms_from_adapter(tmp_path) == norms


def test_routing_ratio_equals_hand_computation(tokens):
    model = mmpreproj.inject(tiny_neox(), mmpreproj.PreProjConfig(skip_init_std=0.1))
    mask = torch.ones_like(tokens, dtype=torch.bool)
    mask[0, :4] = False
    ratios = routing_ratios(model, [{"input_ids": tokens, "token_mask": mask}], token_mask_key="token_mask")
    # by hand: run each block's pieces on the captured normed input
    layer = model.gpt_neox.layers[0]
    seen = {}
    h = layer.input_layernorm.register_forward_hook(lambda m, a, o: seen.setdefault("x_hat", o))
    with torch.no_grad():
        model(tokens)
        h.remove()
        w = layer.attention
        x_tilde = w.slots()[0](seen["x_hat"])
        emb = model.gpt_neox.rotary_emb(x_tilde, torch.arange(tokens.shape[1])[None])
        S = tokens.shape[1]
        causal = torch.full((1, 1, S, S), float("-inf")).triu(1)
        attn = w.base_layer(x_tilde, attention_mask=causal, position_embeddings=emb)[0]
        skip = w.slots()[1](x_tilde)
    expected = skip.norm(dim=-1)[mask].sum() / attn.norm(dim=-1)[mask].sum()
    assert abs(ratios[0] - expected.item()) < 1e-5 * expected.item()
    assert set(ratios) == {0, 1} and not model.training


def _native(config: mmpreproj.PreProjConfig) -> torch.nn.Module:
    from mmpreproj.modules import Block

    torch.manual_seed(0)
    return mmpreproj.inject(Block(32, 4), config).eval()  # attention returns a tensor (output_index None)


@pytest.mark.parametrize("preproj", [True, False], ids=["preproj_skip", "skip_only"])
def test_routing_ratio_on_a_tensor_output_host_equals_hand_computation(preproj):
    block = _native(mmpreproj.PreProjConfig(preproj=preproj, skip_init_std=0.1))
    x = torch.randn(2, 7, 32)
    ratios = routing_ratios(block, [{"x": x}])
    w = block.attn
    with torch.no_grad():
        x_hat = block.norm1(x)
        x_tilde = w.slots()[0](x_hat) if preproj else x_hat
        attn = w.base_layer(x_tilde)  # the host attention on x~, no skip
        skip = x_tilde @ w.slots()[1].proj.weight.T  # W_skip x~ by hand
    expected = (skip.norm(dim=-1).sum() / attn.norm(dim=-1).sum()).item()
    assert list(ratios) == [0] and ratios[0] == pytest.approx(expected, rel=1e-5)
    assert 0.05 < expected < 5  # a real ratio, not a degenerate 0 or inf
    assert not w._observers  # nothing left registered


def test_routing_ratio_is_read_from_the_wrappers_output_not_from_hooks_on_internals(tokens):
    """The ratio follows what the forward added: scaling the last block's W_skip by 3 triples its ratio and
    leaves the block before it alone; no hook on the host attention module (how it used to be read) is involved."""
    model = mmpreproj.inject(tiny_neox(), mmpreproj.PreProjConfig(skip_init_std=0.01))
    before = routing_ratios(model, [{"input_ids": tokens}])
    last = mmpreproj.injected_modules(model)[-1]
    with torch.no_grad():
        last.slots()[1].proj.weight.mul_(3.0)
    after = routing_ratios(model, [{"input_ids": tokens}])
    assert after == pytest.approx({0: before[0], 1: 3 * before[1]}, rel=1e-5)
    assert not last.base_layer._forward_hooks and not last.slots()[1]._forward_hooks


def test_routing_ratio_refuses_instead_of_returning_nothing(tokens):
    no_skip = mmpreproj.inject(tiny_neox(), mmpreproj.PreProjConfig(skip=False))
    with pytest.raises(ValueError, match="no injected content skip"):
        routing_ratios(no_skip, [{"input_ids": tokens}])
    model = mmpreproj.inject(tiny_neox(), mmpreproj.PreProjConfig(skip_init_std=0.1))
    with mmpreproj.adapter_disabled(model), pytest.raises(RuntimeError, match="no injected block with a skip ran"):
        routing_ratios(model, [{"input_ids": tokens}])
    with pytest.raises(ValueError, match="token mask has shape"):
        routing_ratios(model, [{"input_ids": tokens, "m": torch.ones(1, 3, dtype=torch.bool)}], token_mask_key="m")
    assert not any(w._observers for w in mmpreproj.injected_modules(model))  # removed after an error too


def test_observer_sees_the_two_terms_the_wrapper_adds():
    block = _native(mmpreproj.PreProjConfig(skip_init_std=0.1))
    seen = []
    handle = block.attn.observe(lambda w, attn, skip: seen.append((w, attn + skip)))
    x = torch.randn(1, 5, 32)
    with torch.no_grad():
        out = block.attn(block.norm1(x))
    handle.remove()
    assert len(seen) == 1 and seen[0][0] is block.attn and torch.equal(seen[0][1], out)
    with torch.no_grad():
        block.attn(block.norm1(x))
    assert len(seen) == 1  # removed


def test_plot_writes_png(tmp_path, monkeypatch):
    import mmpreproj.analysis.plot as plot_module

    figures = []
    save = plot_module._save
    monkeypatch.setattr(plot_module, "_save", lambda fig, path: (figures.append(fig), save(fig, path))[1])
    series = {"a": [0.1, 0.2, 0.3], "b": [0.2, 0.2, 0.1]}
    p = plot_skip_norms(series, tmp_path / "fig.png")
    # the figure holds one line per series, with the series' values over layers 0..n-1
    (ax,) = figures[0].axes
    assert [line.get_label() for line in ax.lines] == list(series)
    for line, values in zip(ax.lines, series.values()):
        assert list(line.get_xdata()) == list(range(len(values))) and list(line.get_ydata()) == values
    # ... and the saved PNG shows both lines (C0, C1) drawn across the axes, not a blank or legend-only figure
    img = assert_draws(p, ["C0", "C1"])
    # other data draw other lines: with the series swapped, each colour's pixels move
    swapped = plot_skip_norms(dict(zip(series, reversed(series.values()))), tmp_path / "swapped.png")
    assert (colour_mask(img, "C0") != colour_mask(assert_draws(swapped, ["C0"]), "C0")).sum() > 100
