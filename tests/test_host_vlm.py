"""VLM rows against the real transformers classes, built tiny from configs in code, through the shared
contract: LLaVA (`hosts/transformers_vlm.py`; CLIP + Llama and SigLIP + Qwen2), Idefics3, SmolVLM, and
Qwen3-VL (`hosts/transformers_vision.py`). Every case runs a real tiny image (`pixel_values`) through the
model's own forward, so both parts see it.

Call conventions: the LLaVA / Idefics3 / SmolVLM vision parts call `self_attn(hidden_states=layer_norm1(x))`
-> (out, weights) as CLIP/SigLIP, their language parts `self_attn(hidden_states=input_layernorm(h),
position_embeddings=...)` -> (out, weights) as Llama; Qwen3-VL's vision blocks call `attn(norm1(x),
cu_seqlens=..., position_embeddings=...)` -> tensor, as Qwen2-VL. Gradient checkpointing runs on LLaVA
(CLIP + Llama, the `HF_CALL` convention in both parts) and Qwen3-VL (the tensor convention); greedy
generation with the KV cache on LLaVA only. The parts checks (select, report, record, refuse, the projector
as `modules_to_save`) run on LLaVA, Idefics3 and Qwen3-VL.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
import transformers as tf

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj.hosts.spec import get_path
from tests.helpers.checkpointing import check_checkpointing
from tests.helpers.host_contract import IDENTITY, HostCase, HostContract, injected_params
from tests.helpers.snapshots import assert_same_snapshot, snapshot

VOCAB = 97
IMAGE = VOCAB + 2  # the image placeholder token
START = VOCAB + 1  # a vision-start / fake-around-image token


def _text(width: int, depth: int, model_type: str = "llama") -> dict:
    return dict(
        model_type=model_type,
        vocab_size=VOCAB + 3,
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=depth,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
    )


def _tower(width: int, depth: int, model_type: str | None = None) -> dict:
    cfg = dict(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=depth,
        num_attention_heads=4,
        image_size=16,
        patch_size=4,
    )
    return cfg if model_type is None else dict(model_type=model_type, **cfg)


def _llava(width=64, depth=2, seed=0, tower="clip_vision_model", text="llama", feature_layer=-1):
    torch.manual_seed(seed)
    cfg = tf.LlavaConfig(
        text_config=_text(width, depth, text),
        vision_config=_tower(width, depth, tower),
        image_token_index=IMAGE,
        image_seq_length=16,
        vision_feature_layer=feature_layer,
        pad_token_id=0,  # SigLIP has no CLS token to drop: LLaVA's "full" strategy keeps 16
        vision_feature_select_strategy="full" if tower.startswith("siglip") else "default",
    )
    return tf.LlavaForConditionalGeneration(cfg).eval()


def _idefics(width=64, depth=2, seed=0, family="Idefics3"):
    torch.manual_seed(seed)
    cfg = getattr(tf, f"{family}Config")(
        text_config=_text(width, depth),
        vision_config=_tower(width, depth),
        scale_factor=2,
        image_token_id=IMAGE,
        pad_token_id=0,
    )
    return getattr(tf, f"{family}ForConditionalGeneration")(cfg).eval()


def _qwen3_vl(width=64, depth=2, seed=0):
    torch.manual_seed(seed)
    cfg = tf.Qwen3VLConfig(
        text_config=dict(
            vocab_size=VOCAB + 3,
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=depth,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 1e4,
                "mrope_section": [2, 3, 3],
                "mrope_interleaved": True,
            },
        ),
        vision_config=dict(
            depth=depth,
            hidden_size=width,
            num_heads=4,
            intermediate_size=2 * width,
            patch_size=4,
            temporal_patch_size=2,
            spatial_merge_size=2,
            out_hidden_size=width,
            num_position_embeddings=16,
            deepstack_visual_indexes=[0],
        ),
        image_token_id=IMAGE,
        video_token_id=VOCAB,
        vision_start_token_id=START,
        pad_token_id=0,
    )
    return tf.Qwen3VLForConditionalGeneration(cfg).eval()


def _ids(n_image: int, g: torch.Generator, batch: int = 1) -> torch.Tensor:
    rows = [
        torch.cat([torch.tensor([START]), torch.full((n_image,), IMAGE), torch.randint(3, VOCAB, (5,), generator=g)])
        for _ in range(batch)
    ]
    return torch.stack(rows)


def llava_inputs():
    g = torch.Generator().manual_seed(2)
    return _ids(16, g, 2), torch.randn(2, 3, 16, 16, generator=g)  # 16x16 images: 4x4 patches, CLS dropped


def llava_forward(model, inputs):
    return model(input_ids=inputs[0], pixel_values=inputs[1]).logits


def idefics_inputs():
    g = torch.Generator().manual_seed(3)
    # one 16x16 image per sample: 16 patches, pixel-shuffled by 2 -> 4 tokens
    return _ids(4, g), torch.randn(1, 1, 3, 16, 16, generator=g)


def qwen3_vl_inputs():
    g = torch.Generator().manual_seed(4)
    return _ids(4, g), torch.randn(16, 3 * 2 * 4 * 4, generator=g), torch.tensor([[1, 4, 4]])


def qwen3_vl_forward(model, inputs):
    ids, pixels, grid = inputs
    types = (ids == IMAGE).long()
    return model(input_ids=ids, pixel_values=pixels, image_grid_thw=grid, mm_token_type_ids=types).logits


CASES = [
    HostCase("llava_clip_llama", "llava", _llava, llava_inputs, llava_forward),
    HostCase(
        "llava_siglip_qwen2",
        "llava",
        partial(_llava, tower="siglip_vision_model", text="qwen2"),
        llava_inputs,
        llava_forward,
    ),
    HostCase("idefics3", "idefics3", _idefics, idefics_inputs, llava_forward),
    HostCase("smolvlm", "smolvlm", partial(_idefics, family="SmolVLM"), idefics_inputs, llava_forward),
    HostCase("qwen3_vl", "qwen3_vl", _qwen3_vl, qwen3_vl_inputs, qwen3_vl_forward),
]
CHECKPOINTING = {"llava_clip_llama", "qwen3_vl"}  # one per call convention (see the module docstring)


@pytest.fixture(params=CASES, ids=[c.id for c in CASES])
def case(request):
    return request.param


class TestContract(HostContract):
    def test_gradient_checkpointing(self, case):
        if case.id not in CHECKPOINTING:
            pytest.skip("same call conventions as llava_clip_llama, checked there")
        check_checkpointing(case, reentrant=False)


# --- parts: select, report, record, refuse ----------------------------------------------------------------

PARTS = {  # build, inputs, forward, the projector's path, the language model's attribute on `.model`
    "llava": (_llava, llava_inputs, llava_forward, "model.multi_modal_projector", "language_model"),
    "idefics3": (_idefics, idefics_inputs, llava_forward, "model.connector", "text_model"),
    "qwen3_vl": (_qwen3_vl, qwen3_vl_inputs, qwen3_vl_forward, "model.visual.merger", "language_model"),
}
PER_BLOCK = 2 * 64 * 80 + 64 * 64  # pre-projection + skip at width 64


@pytest.mark.parametrize("name", PARTS)
@pytest.mark.parametrize("parts", [["vision"], ["language"], ["vision", "language"]], ids="+".join)
def test_parts_inject_report_and_record(name, parts, tmp_path):
    build, inputs, forward, _, _ = PARTS[name]
    model = mmpreproj.inject(build(), PreProjConfig(parts=parts, skip_init_std=0.05))
    assert {w.part for w in mmpreproj.injected_modules(model)} == set(parts)
    report = mmpreproj.trainable_report(model)
    assert report.parts == {p: 2 * PER_BLOCK for p in parts}
    assert report.trainable == report.injected == len(parts) * 2 * PER_BLOCK
    state = model.mmpreproj_state
    assert [p["name"] for p in state.parts] == ["vision", "language"]  # the model's parts, injected or not
    assert {p["name"] for p in state.parts if p["layers"]} == set(parts)
    out = forward(model, inputs())
    mmpreproj.save_adapter(model, tmp_path)
    fresh = mmpreproj.load_adapter(build(seed=5), tmp_path)
    assert {w.part for w in mmpreproj.injected_modules(fresh)} == set(parts)
    for k, v in mmpreproj.adapter_state_dict(model).items():
        assert torch.equal(mmpreproj.adapter_state_dict(fresh)[k], v), k
    # other base weights (seed 5), so the outputs differ: the equality above is not vacuous
    assert not torch.equal(forward(fresh, inputs()), out)


def test_default_parts_are_both():
    model = mmpreproj.inject(_llava())
    assert mmpreproj.trainable_report(model).parts == {"vision": 2 * PER_BLOCK, "language": 2 * PER_BLOCK}


@pytest.mark.parametrize("name", PARTS)
def test_load_into_a_model_lacking_a_part_is_refused_untouched(name, tmp_path):
    build, _, _, _, language = PARTS[name]
    mmpreproj.save_adapter(mmpreproj.inject(build(), PreProjConfig(parts=["vision"])), tmp_path)
    text_only = tf.AutoModel.from_config(build().config.text_config)  # the bare language model, no tower
    before = snapshot(text_only)
    with pytest.raises(ValueError):
        mmpreproj.load_adapter(text_only, tmp_path)
    assert_same_snapshot(snapshot(text_only), before)
    # the same model type with its language model removed
    model = build()
    delattr(model.model, language)
    before = snapshot(model)
    with pytest.raises(ValueError, match="language"):
        mmpreproj.load_adapter(model, tmp_path)
    assert_same_snapshot(snapshot(model), before)


@pytest.mark.parametrize("name", PARTS)
def test_projector_trains_saves_and_is_restored_on_unload(name, tmp_path):
    build, inputs, forward, path, _ = PARTS[name]
    model = build()
    projector = get_path(model, path)
    original = {n: p.detach().clone() for n, p in projector.named_parameters()}
    flags = [p.requires_grad for p in model.parameters()]
    mmpreproj.inject(model, PreProjConfig(modules_to_save=["projector"]))
    n_projector = sum(p.numel() for p in projector.parameters())
    report = mmpreproj.trainable_report(model)
    assert report.trainable == report.injected + n_projector
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for _ in range(2):
        opt.zero_grad()
        forward(model, inputs()).square().mean().backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in projector.parameters())
        opt.step()
    model.eval()
    assert any(not torch.equal(p, original[n]) for n, p in projector.named_parameters())
    out = forward(model, inputs())
    mmpreproj.save_adapter(model, tmp_path)
    fresh = mmpreproj.load_adapter(build(), tmp_path)
    torch.testing.assert_close(forward(fresh, inputs()), out, atol=0, rtol=0)
    mmpreproj.unload(model)
    for n, p in projector.named_parameters():
        assert torch.equal(p, original[n]), n
    assert [p.requires_grad for p in model.parameters()] == flags
    torch.testing.assert_close(forward(model, inputs()), forward(build(), inputs()), atol=0, rtol=0)


def test_llava_feature_layer_minus_two_trains_the_blocks_that_feed_it():
    # vision_feature_layer=-2 (LLaVA's default) reads the hidden states before the tower's last block
    model = _llava(depth=3, feature_layer=-2)
    mmpreproj.inject(model, PreProjConfig(skip_init_std=0.01, layers={"vision": [0, 1]})).train()
    llava_forward(model, llava_inputs()).square().mean().backward()
    for n, p in injected_params(model).items():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient for {n}"
    assert {w.block_index for w in mmpreproj.injected_modules(model)} == {0, 1, 3, 4, 5}


@pytest.mark.parametrize(
    "kw, what",
    [(dict(text="olmo2"), "'olmo2' language model"), (dict(tower="dinov2"), "'dinov2' vision tower")],
    ids=["olmo2", "dinov2"],
)
def test_llava_with_an_unknown_tower_or_language_model_is_refused_untouched(kw, what):
    model = _llava(**kw)
    before = snapshot(model)
    with pytest.raises(ValueError, match=what):
        mmpreproj.inject(model)
    assert_same_snapshot(snapshot(model), before)


def test_llava_generate_at_identity_init_equals_the_untouched_model():
    base, model = _llava(), _llava()
    mmpreproj.inject(model, IDENTITY)
    ids, pixels = llava_inputs()
    kw = dict(pixel_values=pixels, max_new_tokens=5, do_sample=False, pad_token_id=0, use_cache=True)
    out = model.generate(ids, **kw)
    assert out.shape[1] == ids.shape[1] + 5
    assert torch.equal(out, base.generate(ids, **kw))
