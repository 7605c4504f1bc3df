"""Size knobs: a rank-r content skip (W_skip = B A), a bottleneck pre-projection (expansion < 1), their counts,
their reload, and `estimate` on named shapes."""

from __future__ import annotations

import json

import pytest
import torch

import mmpreproj
from mmpreproj import ContentSkip, PreProjConfig, estimate
from mmpreproj.analysis import skip_norms, skip_norms_from_adapter
from tests.helpers.zoo import tiny_neox


def test_low_rank_skip_is_b_times_a():
    torch.manual_seed(0)
    skip = ContentSkip(16, 0.1, rank=3)
    assert skip.down.weight.shape == (3, 16) and skip.up.weight.shape == (16, 3)  # A: r x d, B: d x r
    x = torch.randn(2, 5, 16)
    want = x @ (skip.up.weight @ skip.down.weight).T  # (2, 5, d)
    torch.testing.assert_close(skip(x), want)
    torch.testing.assert_close(skip.weight, skip.up.weight @ skip.down.weight)
    assert sum(p.numel() for p in skip.parameters()) == 2 * 3 * 16


def test_low_rank_init_matches_the_full_skips_entry_scale():
    # B ~ N(0, s), A ~ N(0, 1/sqrt(r)): Var((BA)_ij) = r * s^2 / r = s^2; a d=256 matrix has 65,536 entries, so
    # the sample std is within a few percent of s (std error of a std ~ 1/sqrt(2n) for near-normal entries)
    torch.manual_seed(0)
    s = 0.02
    w = ContentSkip(256, s, rank=64).weight.detach()
    assert abs(w.std().item() / s - 1) < 0.05
    full = ContentSkip(256, s).weight.detach()
    assert abs(full.std().item() / s - 1) < 0.05


@pytest.mark.parametrize("rank", [None, 4])
def test_zero_init_is_exact_identity_of_the_host(rank, tokens):
    base = tiny_neox()
    want = base(tokens).logits.detach()
    model = tiny_neox()
    mmpreproj.inject(model, PreProjConfig(init="identity", skip_init_std=0.0, skip_rank=rank))
    torch.testing.assert_close(model(tokens).logits, want, atol=0, rtol=0)
    if rank is not None:
        w = mmpreproj.injected_modules(model)[0].slots()[1]
        assert torch.count_nonzero(w.up.weight) == 0 and torch.count_nonzero(w.down.weight) > 0  # B = 0, A drawn


def test_gradients_reach_a_and_b(tokens):
    model = tiny_neox()
    mmpreproj.inject(model, PreProjConfig(preproj=False, skip_rank=2, skip_init_std=0.05))
    model(tokens, labels=tokens).loss.backward()
    for i, w in enumerate(mmpreproj.injected_modules(model)):
        for name in ("down", "up"):
            g = getattr(w.slots()[1], name).weight.grad
            assert g is not None and g.abs().sum() > 0, f"block {i}: no gradient for skip.{name}"
    # at zero init only B has a gradient; one step on B gives A one too
    model = tiny_neox()
    mmpreproj.inject(model, PreProjConfig(preproj=False, skip_rank=2, skip_init_std=0.0))
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model(tokens, labels=tokens).loss.backward()
    skip = mmpreproj.injected_modules(model)[0].slots()[1]
    assert skip.down.weight.grad.abs().sum() == 0 and skip.up.weight.grad.abs().sum() > 0
    opt.step()
    opt.zero_grad()
    model(tokens, labels=tokens).loss.backward()
    assert skip.down.weight.grad.abs().sum() > 0


def test_save_load_round_trip_of_a_rank_r_skip_and_a_bottleneck(tmp_path, tokens):
    model = tiny_neox()
    mmpreproj.inject(model, PreProjConfig(expansion=1 / 16, skip_rank=3, skip_init_std=0.05))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.01 * torch.randn_like(p))
    want = model(tokens).logits.detach()
    norms = skip_norms(model)
    path = mmpreproj.save_adapter(model, tmp_path / "adapter")
    saved = json.loads((path / "adapter_config.json").read_text())  # peft's flat config
    assert saved["peft_type"] == "PREPROJ" and saved["skip_rank"] == 3 and saved["expansion"] == 1 / 16
    from safetensors.torch import load_file

    shapes = {k: tuple(v.shape) for k, v in load_file(str(path / "adapter_model.safetensors")).items()}
    block0 = "base_model.model.gpt_neox.layers.0.attention"  # peft's key of block 0's wrapper
    assert shapes[f"{block0}.preproj_skip.down.weight"] == (3, 32)
    assert shapes[f"{block0}.preproj_skip.up.weight"] == (32, 3)
    assert shapes[f"{block0}.preproj.up.weight"] == (2, 32)  # int(32 / 16) = 2
    fresh = tiny_neox()
    torch.manual_seed(77)
    mmpreproj.load_adapter(fresh, path)
    torch.testing.assert_close(fresh(tokens).logits, want, atol=0, rtol=0)
    assert mmpreproj.injected_modules(fresh)[0].slots()[1].rank == 3
    got = skip_norms_from_adapter(path)
    assert got.keys() == norms.keys() and all(got[k] == pytest.approx(norms[k], rel=1e-6) for k in norms)


@pytest.mark.parametrize(("expansion", "rank"), [(1.25, None), (1 / 16, None), (0.5, 4), (1.25, 1)])
def test_trainable_report_counts_equal_the_formulas(expansion, rank):
    d, blocks = 32, 2
    model = tiny_neox()
    mmpreproj.inject(model, PreProjConfig(expansion=expansion, skip_rank=rank))
    r = mmpreproj.trainable_report(model)
    assert r.preproj == blocks * 2 * d * int(expansion * d)
    assert r.skip == blocks * (d * d if rank is None else 2 * rank * d)
    assert r.trainable == r.injected and f"skip {r.skip:,}" in str(r)


def test_bottleneck_below_one_inner_width_is_checked_against_the_model():
    model = tiny_neox()
    with pytest.raises(ValueError, match="expansion"):
        mmpreproj.inject(model, PreProjConfig(expansion=1 / 64))  # int(32 / 64) = 0
    assert not mmpreproj.is_injected(model)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "8"])
def test_bad_skip_rank_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match="skip_rank"):
        PreProjConfig(skip_rank=bad)
    with pytest.raises(ValueError, match="rank"):
        ContentSkip(8, rank=bad)


def test_skip_rank_without_a_skip_is_refused():
    with pytest.raises(ValueError, match="skip_rank=4 with skip=False"):
        PreProjConfig(skip=False, skip_rank=4)


def test_estimate_by_hand_on_named_shapes():
    # llama-3-8b, the paper's default: 32 * (2 * 4096 * 5120 + 4096^2) = 1,879,048,192; 16 bytes each
    e = estimate(PreProjConfig(), "llama-3-8b")
    assert (e.blocks, e.dim, e.preproj, e.skip) == (32, 4096, 32 * 2 * 4096 * 5120, 32 * 4096**2)
    assert e.params == 1_879_048_192 and e.train_bytes == 16 * 1_879_048_192
    assert "30.1 GB" in str(e) and "llama-3-8b" in str(e)
    # a bottleneck and a rank-16 skip on pythia-160m: 12 * (2 * 768 * 48 + 2 * 16 * 768)
    e = estimate(PreProjConfig(expansion=1 / 16, skip_rank=16), "pythia-160m")
    assert (e.preproj, e.skip) == (12 * 2 * 768 * 48, 12 * 2 * 16 * 768)
    # layers select blocks as at inject time; skip only has no pre-projection
    e = estimate(PreProjConfig(preproj=False, skip_rank=8, layers=[-2, -1]), "llama-3.2-1b")
    assert (e.blocks, e.preproj, e.skip) == (2, 0, 2 * 2 * 8 * 2048)
    assert estimate(PreProjConfig(), "pythia-410m").params == 24 * (2 * 1024 * 1280 + 1024**2)


def test_estimate_agrees_with_an_injected_mini_pythia_built_in_code():
    from transformers import AutoConfig, GPTNeoXForCausalLM

    from mmpreproj.data import asset_path

    with torch.device("meta"):
        model = GPTNeoXForCausalLM(AutoConfig.from_pretrained(str(asset_path("mini-pythia"))))
    assert sum(p.numel() for p in model.parameters()) == estimate(PreProjConfig(), "mini-pythia").base_params
    cfg = PreProjConfig(expansion=0.25, skip_rank=5)
    mmpreproj.inject(model, cfg)
    assert mmpreproj.trainable_report(model).injected == estimate(cfg, "mini-pythia").params


def test_estimate_refuses_unknown_shapes_naming_the_allowed():
    with pytest.raises(ValueError, match="llama-3-8b"):
        estimate(PreProjConfig(), "gpt-5")
    with pytest.raises(ValueError, match="PreProjConfig"):
        estimate({"skip_rank": 4}, "llama-3-8b")


def test_estimate_refuses_sizes_inject_refuses_at_that_width():
    """A skip rank above the width gave a count for a model inject refuses to build (an independent audit's case)."""
    with pytest.raises(ValueError, match=r"skip_rank=300 at hidden size 256; allowed: 1\.\.256"):
        estimate(PreProjConfig(skip_rank=300), "mini-pythia")
    with pytest.raises(ValueError, match=r"skip_rank=5000 at hidden size 4096"):
        estimate(PreProjConfig(skip_rank=5000), "llama-3-8b")
    assert estimate(PreProjConfig(skip_rank=256), "mini-pythia").skip > 0  # the top of the range still counts
