"""transformers decoder rows (`mmpreproj/hosts/transformers_decoders.py`) against the real classes, built
tiny from configs in code, through the shared contract; plus generation with the KV cache, the Gemma 2
skip placement by hand, and the refusals (OLMo 2, post-norm OPT).

Call conventions: every row here calls `self_attn(hidden_states=..., ...)` by keyword except GPT-2, which
passes the normed input positionally; all return `(out, weights)`. Gemma, StableLM (sequential and parallel)
and Cohere (parallel) share the Llama convention; the parallel ones are also checked for the MLP seeing
the un-projected normed input. VLMs built from these rows are in `test_host_vlm.py`.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
import transformers as tf

import mmpreproj
from mmpreproj import PreProjConfig
from tests.helpers.checkpointing import check_checkpointing
from tests.helpers.host_contract import IDENTITY, HostCase, HostContract
from tests.helpers.snapshots import assert_same_snapshot, snapshot
from tests.helpers.zoo import (
    BUILDERS,
    VOCAB,
    llama_like,
    logits,
    opt,
    qwen2_vl,
    tokens,
    vl_forward,
    vl_inputs,
)

CASES = [HostCase(name, name.removesuffix("_parallel"), b, tokens, logits) for name, b in BUILDERS.items()]


@pytest.fixture(params=CASES, ids=[c.id for c in CASES])
def case(request):
    return request.param


class TestContract(HostContract):
    @pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
    def test_identity_init_matches_untouched_model(self, case, dtype):
        if case.id == "qwen3_moe" and dtype == torch.float64:
            pytest.skip("transformers' grouped-mm MoE experts have no float64 kernel; fp32 is checked")
        super().test_identity_init_matches_untouched_model(case, dtype)

    def test_paper_init_is_close_but_not_equal(self, case):
        # Gemma 2 soft-caps its logits (tanh at 30) and scales embeddings by sqrt(d): the tiny model's logits
        # are compressed to |z| < 0.5, so the paper-init change is measured against 20% instead of 10%.
        model = case.build()
        ref = model(*case.inputs()).logits
        mmpreproj.inject(model, PreProjConfig())
        out = model(*case.inputs()).logits
        assert not torch.equal(out, ref)
        assert (out - ref).abs().max() < (0.2 if case.id == "gemma2" else 0.1) * ref.abs().max()

    def test_gradient_checkpointing(self, case):
        check_checkpointing(case, reentrant=True)


GENERATE = ["llama", "gemma2", "gpt2", "opt"]  # one per call convention / layer layout


@pytest.mark.parametrize("name", GENERATE)
def test_generate_identity_equals_base_and_cache_bytes_equal(name):
    base, model = BUILDERS[name](), BUILDERS[name]()
    mmpreproj.inject(model, IDENTITY)
    ids = tokens(2, 5)[0]
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0, return_dict_in_generate=True)
    a, b = base.generate(ids, **kw), model.generate(ids, **kw)
    assert torch.equal(a.sequences, b.sequences)

    def cache_bytes(model):
        out = model(ids, attention_mask=mask, use_cache=True)
        cache = out.past_key_values
        return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))

    assert cache_bytes(base) == cache_bytes(model) > 0


@pytest.mark.parametrize("name", GENERATE)
def test_incremental_decoding_equals_full_forward_at_paper_init(name):
    model = mmpreproj.inject(BUILDERS[name](), PreProjConfig(skip_init_std=0.05))
    ids = tokens(1, 9)[0]
    full = model(ids).logits
    out = model(ids[:, :5], use_cache=True)
    step = [out.logits]
    cache = out.past_key_values
    for t in range(5, 9):
        out = model(ids[:, t : t + 1], past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        step.append(out.logits)
    torch.testing.assert_close(torch.cat(step, 1), full, atol=1e-5, rtol=1e-5)


def test_gemma2_skip_joins_the_attention_output_before_its_post_attention_norm():
    model = BUILDERS["gemma2"]().double()
    mmpreproj.inject(model, PreProjConfig(skip_init_std=0.05))
    layer = model.model.layers[0]
    wrapper = layer.self_attn
    h = torch.randn(1, 5, 64, dtype=torch.float64)
    pos = torch.arange(5)[None]
    emb = model.model.rotary_emb(h, pos)
    mask = torch.full((1, 1, 5, 5), float("-inf"), dtype=torch.float64).triu(1)
    x_hat = layer.input_layernorm(h)
    x_tilde = wrapper.slots()[0](x_hat)
    attn = wrapper.base_layer(hidden_states=x_tilde, position_embeddings=emb, attention_mask=mask)[0]
    w_skip = wrapper.slots()[1].weight.double()
    mid = h + layer.post_attention_layernorm(attn + x_tilde @ w_skip.T)  # the documented choice
    expected = mid + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(mid)))
    got = layer(h, attention_mask=mask, position_embeddings=emb, position_ids=pos)
    got = got[0] if isinstance(got, tuple) else got
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)


def test_gptj_mlp_keeps_seeing_the_unprojected_normed_input():
    model = BUILDERS["gptj"]().double()
    mmpreproj.inject(model, PreProjConfig(skip_init_std=0.05))
    block = model.transformer.h[0]
    seen = {}
    block.mlp.register_forward_pre_hook(lambda m, args: seen.setdefault("x", args[0]))
    h = torch.randn(1, 4, 64, dtype=torch.float64)
    pos = torch.arange(4)[None]
    block(
        h,
        position_ids=pos,
        position_embeddings=model.transformer.rotary_emb(h, pos) if hasattr(model.transformer, "rotary_emb") else None,
    )
    torch.testing.assert_close(seen["x"], block.ln_1(h))


@pytest.mark.parametrize("name", ["cohere", "stablelm_parallel"])
def test_parallel_residual_mlp_keeps_seeing_the_unprojected_normed_input(name):
    model = mmpreproj.inject(BUILDERS[name]().double(), PreProjConfig(skip_init_std=0.05))
    layer = model.model.layers[0]
    seen = {}

    def keep(key, value):
        seen.setdefault(key, value)  # returns None: a hook that changes nothing

    layer.input_layernorm.register_forward_hook(lambda m, args, out: keep("x_hat", out))
    layer.mlp.register_forward_pre_hook(lambda m, args: keep("mlp", args[0]))
    layer.self_attn.base_layer.register_forward_pre_hook(
        lambda m, args, kwargs: keep("attn", kwargs["hidden_states"]), with_kwargs=True
    )
    model(*tokens())
    torch.testing.assert_close(seen["mlp"], seen["x_hat"], atol=0, rtol=0)
    assert not torch.allclose(seen["attn"], seen["x_hat"])  # attention got x~: the check above can fail


@pytest.mark.parametrize(
    "build, reason",
    [
        (partial(opt, before=False), "do_layer_norm_before=False"),
        (partial(llama_like, tf.Olmo2Config, tf.Olmo2ForCausalLM), "post-norm"),
    ],
    ids=["opt_post_norm", "olmo2"],
)
def test_post_norm_families_are_refused_untouched(build, reason):
    model = build()
    before = snapshot(model)
    with pytest.raises(ValueError, match=reason):
        mmpreproj.inject(model)
    assert_same_snapshot(snapshot(model), before)


def test_a_wrong_description_fails_loudly_on_the_first_call():
    model = BUILDERS["llama"]()
    desc = {
        "name": "mine",
        "parts": [
            {
                "name": "language",
                "blocks": "model.layers",
                "attention": "self_attn",
                "norm": "post_attention_layernorm",
            }
        ],
    }
    mmpreproj.inject(model, host=desc)
    with pytest.raises(RuntimeError, match="does not receive the output of 'post_attention_layernorm'"):
        model(*tokens())


def test_described_host_reloads_with_no_code(tmp_path):
    desc = {
        "name": "my_llama",
        "parts": [{"name": "language", "blocks": "model.layers", "attention": "self_attn", "norm": "input_layernorm"}],
    }
    model = mmpreproj.inject(BUILDERS["llama"](), PreProjConfig(skip_init_std=0.05), host=desc)
    out = model(*tokens()).logits
    mmpreproj.save_adapter(model, tmp_path)
    fresh = mmpreproj.load_adapter(BUILDERS["llama"](seed=3), tmp_path)
    assert fresh.mmpreproj_state.host == "my_llama"
    with torch.no_grad():
        for (n, p), (_, q) in zip(model.named_parameters(), fresh.named_parameters()):
            if ".preproj." not in n and ".preproj_skip." not in n:
                q.copy_(p)
    torch.testing.assert_close(fresh(*tokens()).logits, out, atol=0, rtol=0)


def test_bad_descriptions_name_the_field():
    model = BUILDERS["llama"]()
    before = snapshot(model)
    with pytest.raises(ValueError, match="none of the block paths \\['model.blocks'\\]"):
        mmpreproj.inject(
            model,
            host={
                "name": "x",
                "parts": [{"name": "l", "blocks": "model.blocks", "attention": "a", "norm": "input_layernorm"}],
            },
        )
    with pytest.raises(ValueError, match="needs 'attention'"):
        mmpreproj.inject(model, host={"name": "x", "parts": [{"name": "l", "blocks": "model.layers"}]})
    with pytest.raises(ValueError, match="output_index"):
        mmpreproj.inject(
            model,
            host={
                "name": "x",
                "parts": [
                    {
                        "name": "l",
                        "blocks": "model.layers",
                        "attention": "self_attn",
                        "call": {"inputs": [[0, "hidden_states"]], "output_index": -1},
                    }
                ],
            },
        )
    assert_same_snapshot(snapshot(model), before)


def test_forcing_a_row_that_does_not_fit_is_a_clear_error():
    model = BUILDERS["llama"]()
    with pytest.raises(ValueError, match="host 'gpt2' does not fit LlamaForCausalLM"):
        mmpreproj.inject(model, host="gpt2")


# --- vision and vision-language rows (hosts/transformers_vision.py) ------------------------------------


def _clip(width=64, depth=2, seed=0, family="CLIP"):
    torch.manual_seed(seed)
    common = dict(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=depth, num_attention_heads=4)
    cfg = getattr(tf, f"{family}Config")(
        text_config=dict(vocab_size=VOCAB, max_position_embeddings=16, **common),
        vision_config=dict(image_size=16, patch_size=4, **common),
    )
    return getattr(tf, f"{family}Model")(cfg).eval()


def dual_inputs():
    g = torch.Generator().manual_seed(3)
    return torch.randint(1, VOCAB, (2, 6), generator=g), torch.randn(2, 3, 16, 16, generator=g)


def dual_forward(model, inputs):
    out = model(input_ids=inputs[0], pixel_values=inputs[1])
    return out.text_embeds, out.image_embeds


def _vit(width=64, depth=2, seed=0, family="ViT"):
    torch.manual_seed(seed)
    cfg = getattr(tf, f"{family}Config")(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=depth,
        num_attention_heads=4,
        image_size=16,
        patch_size=4,
    )
    return getattr(tf, f"{family}Model")(cfg).eval()


def image_inputs():
    return (torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(4)),)


def vision_forward(model, inputs):
    return model(pixel_values=inputs[0]).last_hidden_state


VISION_CASES = [
    HostCase("qwen2_vl", "qwen2_vl", qwen2_vl, vl_inputs, vl_forward),
    HostCase("qwen2_5_vl", "qwen2_5_vl", partial(qwen2_vl, cls_name="Qwen2_5_VL"), vl_inputs, vl_forward),
    HostCase("clip", "clip", _clip, dual_inputs, dual_forward),
    HostCase("siglip", "siglip", partial(_clip, family="Siglip"), dual_inputs, dual_forward),
    HostCase("vit", "vit", _vit, image_inputs, vision_forward),
    HostCase("dinov2", "dinov2", partial(_vit, family="Dinov2"), image_inputs, vision_forward),
]


class TestVisionContract(HostContract):
    @pytest.fixture(params=VISION_CASES, ids=[c.id for c in VISION_CASES])
    def case(self, request):
        return request.param

    def test_gradient_checkpointing(self, case):
        check_checkpointing(case, reentrant=False)


def test_vlm_parts_are_selectable_recorded_and_checked_on_load(tmp_path):
    model = mmpreproj.inject(qwen2_vl(), PreProjConfig(parts=["language"], modules_to_save=["projector"]))
    state = model.mmpreproj_state
    assert [p["name"] for p in state.parts] == ["vision", "language"]
    assert {w.part for w in mmpreproj.injected_modules(model)} == {"language"}
    merger = model.model.visual.merger
    assert all(p.requires_grad for p in merger.parameters())
    report = mmpreproj.trainable_report(model)
    assert report.trainable == report.injected + sum(p.numel() for p in merger.parameters())
    assert report.parts == {"language": report.injected}
    both = mmpreproj.trainable_report(mmpreproj.inject(qwen2_vl()))
    assert both.parts == {"vision": 2 * (2 * 64 * 80 + 64 * 64), "language": 2 * (2 * 64 * 80 + 64 * 64)}
    assert "(vision 28,672, language 28,672)" in str(both)
    with torch.no_grad():
        for p in merger.parameters():
            p.add_(0.01)
    out = vl_forward(model, vl_inputs())
    mmpreproj.save_adapter(model, tmp_path)
    fresh = mmpreproj.load_adapter(qwen2_vl(), tmp_path)
    torch.testing.assert_close(vl_forward(fresh, vl_inputs()), out, atol=0, rtol=0)
    mmpreproj.unload(fresh)
    torch.testing.assert_close(vl_forward(fresh, vl_inputs()), vl_forward(qwen2_vl(), vl_inputs()), atol=0, rtol=0)
    with pytest.raises(ValueError, match="parts"):
        mmpreproj.inject(qwen2_vl(), PreProjConfig(parts=["audio"]))
    # the CLIP vision tower alone has no "text" part: an adapter for both towers is refused
    clip = mmpreproj.inject(_clip())
    mmpreproj.save_adapter(clip, tmp_path / "clip")
    vision_only = tf.CLIPVisionModel(_clip().config.vision_config)
    before = snapshot(vision_only)
    with pytest.raises(ValueError, match="parts"):
        mmpreproj.load_adapter(vision_only, tmp_path / "clip")
    assert_same_snapshot(snapshot(vision_only), before)


@pytest.mark.parametrize("name", ["llama", "gpt2", "opt", "gemma2"])
def test_trace_seams_finds_the_description_that_the_row_has(name):
    model = BUILDERS[name]()
    found = mmpreproj.method.trace_seams(model, *tokens())  # check=True: identity injection reproduces the model
    row = mmpreproj.hosts.HOSTS[name].describe(model)["parts"][0]
    (part,) = found["parts"]
    assert (part["blocks"], part["attention"], part["norm"]) == (row["blocks"], row["attention"], row["norm"])
    assert part["call"]["output_index"] == 0
    # the traced description injects and reloads like a row
    mmpreproj.inject(model, PreProjConfig(skip_init_std=0.05), host=found)
    assert len(mmpreproj.injected_modules(model)) == 2


def test_trace_seams_on_a_vlm_finds_both_towers():
    found = mmpreproj.method.trace_seams(
        qwen2_vl(),
        *vl_inputs()[:1],
        pixel_values=vl_inputs()[1],
        image_grid_thw=vl_inputs()[2],
        mm_token_type_ids=(vl_inputs()[0] == VOCAB + 2).long(),
    )
    got = {p["blocks"]: (p["attention"], p["norm"], p["call"]["output_index"]) for p in found["parts"]}
    assert got == {
        "model.visual.blocks": ("attn", "norm1", None),
        "model.language_model.layers": ("self_attn", "input_layernorm", 0),
    }


@pytest.mark.parametrize("family", ["CLIP", "Siglip"])
@pytest.mark.parametrize("tower", ["vision", "text"])
def test_one_tower_on_its_own_injects_as_in_the_whole_model(family, tower):
    """`CLIPVisionModel` / `CLIPModel.vision_model` / `SiglipTextModel` keep their blocks at `encoder.layers`: rows of
    their own (`clip_vision`, ...) claim them (the vision audit found every one refused). The tower alone, injected
    with the whole model's adapter weights, gives the whole model's tower output."""
    whole = mmpreproj.inject(_clip(family=family), PreProjConfig(skip_init_std=0.05))
    alone = getattr(_clip(family=family), f"{tower}_model")  # the same weights (seed 0), a tower module of its own
    assert alone.config.model_type == f"{family.lower()}_{tower}_model"
    base_out = _tower_out(alone, tower)
    mmpreproj.inject(alone, PreProjConfig(skip_init_std=0.05))
    assert mmpreproj.hosts.find_host(alone).name == f"{family.lower()}_{tower}"
    mine = [w for w in mmpreproj.injected_modules(whole) if w.part == tower]
    for w, src in zip(mmpreproj.injected_modules(alone), mine, strict=True):
        for slot, other in zip(w.slots(), src.slots(), strict=True):
            slot.load_state_dict(other.state_dict())
    got = _tower_out(alone, tower)
    assert not torch.allclose(got, base_out, atol=1e-4)  # the adapter acts
    torch.testing.assert_close(got, _tower_out(getattr(whole, f"{tower}_model"), tower), atol=0, rtol=0)
    mmpreproj.unload(alone)
    torch.testing.assert_close(_tower_out(alone, tower), base_out, atol=0, rtol=0)


def _tower_out(model, tower):
    inputs = dual_inputs()
    with torch.no_grad():
        if tower == "text":
            return model(input_ids=inputs[0]).last_hidden_state
        return model(pixel_values=inputs[1]).last_hidden_state
