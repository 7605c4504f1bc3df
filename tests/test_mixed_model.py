"""The mixed recipe's MixedModel: the shared pre-projection sits in the decoder only, gradients reach every part,
routing ratios by modality equal a hand computation, the projector merges 2x2 neighbours."""

from __future__ import annotations

import pytest
import torch

import mmpreproj
from mmpreproj.analysis import routing_ratios
from mmpreproj.rope import InterleavedMultimodalRoPE, MultimodalRoPE
from recipes.mixed.tinyvlm import IMAGE, TEXT, MixedSample, NativeDecoder, VisionProjector
from tests.helpers.mixed_models import mixed_samples, tiny_mixed


def test_one_preprojection_per_decoder_block_shared_by_all_modalities():
    model = tiny_mixed(tower_depth=2)  # the tower is a Block stack too: it must stay unwrapped
    wrappers = mmpreproj.injected_modules(model)
    assert len(wrappers) == len(model.decoder.blocks) == 2
    assert all(w is b.attn for w, b in zip(wrappers, model.decoder.blocks))
    assert not mmpreproj.injected_modules(model.tower)
    slots = (".preproj.", ".preproj_skip.")
    assert sum(1 for n, _ in model.named_parameters() if any(s in n for s in slots)) == 2 * 3  # up, down, skip


def test_decoder_layout_chooses_the_mrope():
    assert type(NativeDecoder(8, 32, 1, 2).rope) is MultimodalRoPE
    assert isinstance(NativeDecoder(8, 32, 1, 2, layout="interleaved").rope, InterleavedMultimodalRoPE)


def test_every_parameter_gets_a_gradient():
    model = tiny_mixed().train()
    samples = [MixedSample(s.input_ids, s.images, s.videos, target_ids=[3, 4]) for s in mixed_samples()]
    batch = model.prepare(samples)
    logits, _ = model(**batch.decoder_inputs())
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), batch.labels[:, 1:].flatten())
    loss.backward()
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all(), f"No gradient for {name}"


@torch.no_grad()
def _routing_by_hand(model, batch, mask: torch.Tensor) -> dict[int, float]:
    """sum ||W_skip x~|| / sum ||attn(x~)|| over the masked tokens, from each block's input (no analysis code)."""
    inputs = []
    handles = [b.register_forward_pre_hook(lambda m, a, kw: inputs.append((a[0], kw)), with_kwargs=True)
               for b in model.decoder.blocks]  # fmt: skip
    model(**batch.decoder_inputs())
    for h in handles:
        h.remove()
    out = {}
    for i, (block, (x, kw)) in enumerate(zip(model.decoder.blocks, inputs)):
        w = block.attn
        x_tilde = w.slots()[0](block.norm1(x))  # (B, S, D)
        attn = w.base_layer(x_tilde, pos=kw["pos"], attn_mask=kw["attn_mask"])
        skip = w.slots()[1](x_tilde)
        out[i] = (skip.norm(dim=-1)[mask].sum() / attn.norm(dim=-1)[mask].sum()).item()
    return out


def test_routing_ratios_by_modality_equal_a_hand_computation():
    model = tiny_mixed()
    with torch.no_grad():
        batch = model.prepare(mixed_samples())
    by_mod = {}
    for name, code in (("text", TEXT), ("image", IMAGE)):
        mask = (batch.modality == code) & batch.attention_mask.bool()
        by_mod[name] = routing_ratios(model, [{**batch.decoder_inputs(), "mask": mask}], token_mask_key="mask")
        ref = _routing_by_hand(model, batch, mask)
        assert set(by_mod[name]) == set(ref) == {0, 1}
        for layer, value in ref.items():
            assert by_mod[name][layer] == pytest.approx(value, rel=1e-5), (name, layer)
    assert by_mod["text"] != by_mod["image"]
    # the skip's share scales with W_skip: doubling layer 0's skip doubles its ratio (its attention is unchanged)
    with torch.no_grad():
        model.decoder.blocks[0].attn.slots()[1].proj.weight.mul_(2.0)
    mask = (batch.modality == IMAGE) & batch.attention_mask.bool()
    doubled = routing_ratios(model, [{**batch.decoder_inputs(), "mask": mask}], token_mask_key="mask")
    assert doubled[0] == pytest.approx(2 * by_mod["image"][0], rel=1e-5)


def test_projector_merges_2x2_neighbours():
    proj = VisionProjector(1, 4, merge=2)
    proj.norm = torch.nn.Identity()  # so the merged values can be read
    grid = torch.arange(24.0).reshape(1, 4, 6, 1)  # (B, h, w, C): value = 6 * row + column
    seen = []
    proj.mlp[0].register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    assert proj(grid).shape == (1, 2, 3, 4)
    assert seen[0].shape == (1, 2, 3, 4)  # (B, h/2, w/2, 4C): one group is rows 2i..2i+1, columns 2j..2j+1
    assert seen[0][0, 0, 0].tolist() == [0, 1, 6, 7]  # (0,0) (0,1) (1,0) (1,1)
    assert seen[0][0, 1, 2].tolist() == [16, 17, 22, 23]  # rows 2-3, columns 4-5
    with pytest.raises(ValueError, match="4x5 patch grid cannot be merged 2x2"):
        proj(torch.zeros(1, 4, 5, 1))
