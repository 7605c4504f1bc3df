"""Decoders the one call reaches: rows recognised by structure (`mmpreproj/hosts/structure.py`) and the rows
added for families whose layout no other row has, against the real transformers classes built tiny from
configs in code, through the shared contract; plus generation with left padding and the KV cache, forcing a
row and describing a host under a row's name (both reload with no code), the hint's row, hybrid stacks, and
the host facts on the row.

By structure (no row of their own): Mixtral (= Mistral), StarCoder2, Qwen2-MoE (= Qwen2), OLMo, OLMoE,
GPT-BigCode (= GPT-2), Jamba (= Bamba's attention layers). Rows: Phi, DeepSeek-V2/V3, Falcon (both norm names:
three layouts), Bamba and LFM2 (`contains`),
Apertus; OLMo 3 and EXAONE 4 refused (post-norm). Encoders, encoder-decoders, video and audio are in
`test_host_encoders.py`, VLMs in `test_host_structure_vlm.py`. VLMs are in `test_host_structure_vlm.py`.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
import transformers as tf

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj.hosts import HOSTS, find_host
from mmpreproj.hosts.spec import HostSpec
from mmpreproj.hosts.structure import match_structure
from tests.helpers.checkpointing import check_checkpointing
from tests.helpers.host_contract import IDENTITY, HostCase, HostContract, build_once
from tests.helpers.zoo import VOCAB, logits, tokens


def _decoder(cfg_cls, model_cls, width=64, depth=2, seed=0, kv_heads=2, **extra):
    torch.manual_seed(seed)
    cfg = cfg_cls(
        vocab_size=VOCAB,
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=depth,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=64,
        pad_token_id=0,
        **extra,
    )
    return model_cls(cfg).eval()


def _gpt_bigcode(width=64, depth=2, seed=0):
    torch.manual_seed(seed)
    return tf.GPTBigCodeForCausalLM(
        tf.GPTBigCodeConfig(vocab_size=VOCAB, n_embd=width, n_layer=depth, n_head=4, n_positions=64)
    ).eval()


def _falcon(width=64, depth=2, seed=0, **layout):
    torch.manual_seed(seed)
    return tf.FalconForCausalLM(
        tf.FalconConfig(
            vocab_size=VOCAB,
            hidden_size=width,
            num_hidden_layers=depth,
            num_attention_heads=4,
            pad_token_id=0,
            **layout,
        )
    ).eval()


MOE = dict(num_experts_per_tok=2)
MLA = dict(
    kv_heads=4,
    n_routed_experts=4,
    moe_intermediate_size=32,
    kv_lora_rank=16,
    q_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=16,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
    **MOE,
)

# id -> (the row it must resolve to, builder)
DECODERS = {
    "mixtral": ("mistral", partial(_decoder, tf.MixtralConfig, tf.MixtralForCausalLM, num_local_experts=4, **MOE)),
    "starcoder2": ("stablelm", partial(_decoder, tf.Starcoder2Config, tf.Starcoder2ForCausalLM)),
    "qwen2_moe": (
        "qwen2",
        partial(
            _decoder,
            tf.Qwen2MoeConfig,
            tf.Qwen2MoeForCausalLM,
            num_experts=4,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            **MOE,
        ),
    ),
    "olmo": ("llama", partial(_decoder, tf.OlmoConfig, tf.OlmoForCausalLM)),
    "olmoe": ("llama", partial(_decoder, tf.OlmoeConfig, tf.OlmoeForCausalLM, num_experts=4, **MOE)),
    "gpt_bigcode": ("gpt2", _gpt_bigcode),
    "phi": ("phi", partial(_decoder, tf.PhiConfig, tf.PhiForCausalLM, partial_rotary_factor=0.5)),
    "deepseek_v2": ("deepseek_v2", partial(_decoder, tf.DeepseekV2Config, tf.DeepseekV2ForCausalLM, **MLA)),
    "deepseek_v3": ("deepseek_v2", partial(_decoder, tf.DeepseekV3Config, tf.DeepseekV3ForCausalLM, **MLA)),
    "falcon_parallel": ("falcon", _falcon),  # Falcon-7B: input_layernorm feeds attention and MLP
    "falcon_sequential": ("falcon", partial(_falcon, parallel_attn=False)),
    "falcon_new_one_norm": (
        "falcon",
        partial(_falcon, new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1),
    ),
    "falcon_new_two_norms": ("falcon_ln_attn", partial(_falcon, new_decoder_architecture=True, num_kv_heads=2)),
    "bamba": (
        "bamba",
        lambda depth=2, **kw: _decoder(  # layer 0 Mamba, the others attention
            tf.BambaConfig,
            tf.BambaForCausalLM,
            depth=depth,
            attn_layer_indices=list(range(1, depth)),
            mamba_n_heads=4,
            mamba_n_groups=1,
            mamba_d_state=8,
            mamba_chunk_size=8,
            **kw,
        ),
    ),
    "apertus": ("apertus", partial(_decoder, tf.ApertusConfig, tf.ApertusForCausalLM)),  # attention_layernorm
    "lfm2": (
        "lfm2",
        lambda depth=2, **kw: _decoder(  # layer 0 a convolution, the others attention
            tf.Lfm2Config,
            tf.Lfm2ForCausalLM,
            depth=depth,
            layer_types=["conv"] + ["full_attention"] * (depth - 1),
            **kw,
        ),
    ),
    "jamba": (
        "bamba",
        lambda depth=2, **kw: _decoder(  # 2 * depth layers, Mamba / attention in turn
            tf.JambaConfig,
            tf.JambaForCausalLM,
            depth=2 * depth,
            attn_layer_period=2,
            attn_layer_offset=1,
            expert_layer_period=2,
            expert_layer_offset=1,
            num_experts=2,
            mamba_d_state=8,
            mamba_dt_rank=8,
            **kw,
        ),
    ),
}
BUILDERS = {name: build_once(build) for name, (_, build) in DECODERS.items()}


CASES = [HostCase(name, row, BUILDERS[name], tokens, logits) for name, (row, _) in DECODERS.items()]
NO_FLOAT64 = {"mixtral", "qwen2_moe", "olmoe", "deepseek_v2", "deepseek_v3", "jamba"}  # grouped-mm experts: fp32 only


@pytest.fixture(params=CASES, ids=[c.id for c in CASES])
def case(request):
    return request.param


class TestContract(HostContract):
    @pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
    def test_identity_init_matches_untouched_model(self, case, dtype):
        if case.id in NO_FLOAT64 and dtype == torch.float64:
            pytest.skip("transformers' grouped-mm MoE experts have no float64 kernel; fp32 is checked")
        super().test_identity_init_matches_untouched_model(case, dtype)

    def test_gradient_checkpointing(self, case):
        check_checkpointing(case, reentrant=True)


def cache_bytes(model, ids, mask) -> int:
    cache = model(ids, attention_mask=mask, use_cache=True).past_key_values
    # attention layers keep keys/values; Bamba's Mamba layers their conv and recurrent states
    slots = ("keys", "values", "conv_states", "recurrent_states")
    tensors = [
        t for layer in cache.layers for name in slots if isinstance(t := getattr(layer, name, None), torch.Tensor)
    ]
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("name", DECODERS)
def test_generate_with_left_padding_and_cache_equals_base_at_identity(name):
    base, model = BUILDERS[name](), BUILDERS[name]()
    mmpreproj.inject(model, IDENTITY)
    ids = tokens(2, 5)[0]
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0, use_cache=True)
    out = model.generate(ids, **kw)
    assert out.shape[1] == ids.shape[1] + 6
    assert torch.equal(out, base.generate(ids, **kw))
    assert cache_bytes(base, ids, mask) == cache_bytes(model, ids, mask) > 0


@pytest.mark.parametrize("name", ["mixtral", "gpt_bigcode", "falcon_new_two_norms", "deepseek_v2"])
def test_incremental_decoding_equals_full_forward_at_paper_init(name):
    model = mmpreproj.inject(BUILDERS[name](), PreProjConfig(skip_init_std=0.05))
    ids = tokens(1, 9)[0]
    full = model(ids).logits
    out = model(ids[:, :5], use_cache=True)
    step, cache = [out.logits], out.past_key_values
    for t in range(5, 9):
        out = model(ids[:, t : t + 1], past_key_values=cache, use_cache=True)
        step.append(out.logits)
        cache = out.past_key_values
    torch.testing.assert_close(torch.cat(step, 1), full, atol=1e-5, rtol=1e-5)


# --- what by structure means ----------------------------------------------------------------------------


def test_a_structural_match_names_no_row_of_its_own():
    for name in ("mixtral", "olmo", "gpt_bigcode"):
        model = BUILDERS[name]()
        assert not any(row.matches_model(model) for row in HOSTS.values())  # nothing claims it by type


def test_the_saved_description_is_the_resolved_one_and_a_fresh_model_reloads_it(tmp_path):
    model = mmpreproj.inject(BUILDERS["olmo"](), PreProjConfig(skip_init_std=0.05))
    state = model.mmpreproj_state
    assert state.host == "llama"
    assert [(p["blocks"], p["attention"], p["norm"]) for p in state.host_description["parts"]] == [
        ("model.layers", "self_attn", "input_layernorm")
    ]
    out = logits(model, tokens())
    mmpreproj.save_adapter(model, tmp_path)
    fresh = mmpreproj.load_adapter(BUILDERS["olmo"](), tmp_path)
    torch.testing.assert_close(logits(fresh, tokens()), out, atol=0, rtol=0)


def _row(name, norm):
    part = mmpreproj.hosts.spec.PartSpec("language", blocks=("model.layers",), attention="self_attn", norm=norm)
    return HostSpec(name=name, description=name, parts=(part,), model_types=("nothing",))


def test_rows_that_fit_differently_are_a_refusal_naming_both():
    model = BUILDERS["olmo"]()
    one = match_structure(model, [_row("a", "input_layernorm"), _row("b", "input_layernorm")])
    assert one.spec is not None and one.spec.name == "a"  # the same description: one match
    two = match_structure(model, [_row("a", "input_layernorm"), _row("b", "post_attention_layernorm")])
    assert two.spec is None and two.fitting == [["a"], ["b"]]


def test_the_nearest_row_hint_names_a_row_that_injects_when_forced():
    model = BUILDERS["mixtral"]()
    model.model.extra_attention = torch.nn.MultiheadAttention(64, 4, batch_first=True)  # a module no row covers
    with pytest.raises(
        ValueError,
        match="The nearest row is 'mistral': host='mistral' injects its blocks, but it leaves 1 attention module",
    ):
        find_host(model)
    mmpreproj.inject(model, IDENTITY, host="mistral")
    assert len(mmpreproj.injected_modules(model)) == 2


# --- forcing a row, a description under a row's name: both reload -------------------------------------


def _round_trip(build, tmp_path, **inject_kw):
    model = mmpreproj.inject(build(), PreProjConfig(skip_init_std=0.05), **inject_kw)
    with torch.no_grad():
        for w in mmpreproj.injected_modules(model):
            for p in w.slots()[0].parameters():
                p.add_(0.01 * torch.randn_like(p))
    out = logits(model, tokens())
    mmpreproj.save_adapter(model, tmp_path)
    fresh = mmpreproj.load_adapter(build(), tmp_path)
    torch.testing.assert_close(logits(fresh, tokens()), out, atol=0, rtol=0)
    return model, fresh


@pytest.mark.parametrize("host", ["mistral", "qwen2"])
def test_a_forced_row_reloads(host, tmp_path):
    model, fresh = _round_trip(BUILDERS["mixtral"], tmp_path, host=host)
    assert model.mmpreproj_state.host == fresh.mmpreproj_state.host == host


@pytest.mark.parametrize("norm", ["input_layernorm", "post_attention_layernorm"])
def test_a_description_named_as_a_row_reloads(norm, tmp_path):
    # with the row's own layout, and with another one (a wrong seam: inject checks it at the first forward, a load
    # confirms the saved description by the trace before anything changes, issue 45)
    desc = {
        "name": "mistral",
        "parts": [{"name": "language", "blocks": "model.layers", "attention": "self_attn", "norm": norm}],
    }
    if norm == "input_layernorm":
        _, fresh = _round_trip(BUILDERS["mixtral"], tmp_path, host=desc)
        assert fresh.mmpreproj_state.host == "mistral"
        return
    model = mmpreproj.inject(BUILDERS["mixtral"](), host=desc)
    mmpreproj.save_adapter(model, tmp_path)
    with pytest.raises(RuntimeError, match="does not receive the output of 'post_attention_layernorm'"):
        logits(model, tokens())
    base = BUILDERS["mixtral"]()
    with pytest.raises(ValueError, match="after norm 'post_attention_layernorm', but the trace .* finds no attention"):
        mmpreproj.load_adapter(base, tmp_path)
    assert not mmpreproj.is_injected(base)


def test_an_adapter_for_another_model_is_still_refused_untouched(tmp_path):
    mmpreproj.save_adapter(mmpreproj.inject(BUILDERS["mixtral"]()), tmp_path)
    other = BUILDERS["gpt_bigcode"]()
    with pytest.raises(ValueError, match="does not fit GPTBigCodeForCausalLM"):
        mmpreproj.load_adapter(other, tmp_path)
    assert not mmpreproj.is_injected(other)


# --- hybrid stacks: blocks selected by what they contain ----------------------------------------------


def test_bamba_injects_the_attention_layers_only_and_a_description_can_say_so():
    model = BUILDERS["bamba"]()
    assert [hasattr(layer, "self_attn") for layer in model.model.layers] == [False, True]
    desc = {
        "name": "my_hybrid",
        "parts": [
            {
                "name": "language",
                "blocks": "model.layers",
                "attention": "self_attn",
                "norm": "input_layernorm",
                "contains": "self_attn",
            }
        ],
    }
    mmpreproj.inject(model, IDENTITY, host=desc)
    (wrapper,) = mmpreproj.injected_modules(model)
    assert wrapper is model.model.layers[1].self_attn
    assert model.mmpreproj_state.host_description["parts"][0]["contains"] == "self_attn"
    assert model.mmpreproj_state.host_description["parts"][0]["num_blocks"] == 1
    torch.testing.assert_close(logits(model, tokens()), logits(BUILDERS["bamba"](), tokens()), atol=1e-6, rtol=0)
    without = dict(desc["parts"][0])
    del without["contains"]
    with pytest.raises(ValueError, match=r"block 0 \(model.layers.0\): no attention module at 'self_attn'"):
        mmpreproj.inject(BUILDERS["bamba"](), host={"name": "x", "parts": [without]})
    with pytest.raises(ValueError, match="contains"):
        mmpreproj.inject(BUILDERS["bamba"](), host={"name": "x", "parts": [{**without, "contains": "__class__"}]})


# --- host facts live on the row -------------------------------------------------------------------------


def test_every_row_names_its_checkpointing_switch_and_the_switch_is_what_is_read():
    from mmpreproj.hosts.checkpointing import CHECKPOINTING, reentrant_checkpointing

    assert {row.checkpointing for row in HOSTS.values()} <= set(CHECKPOINTING)
    assert HOSTS["llama"].checkpointing == HOSTS["t5"].checkpointing == "transformers"
    assert HOSTS["timm_vit"].checkpointing == "timm" and HOSTS["open_clip"].checkpointing == "open_clip"
    assert find_host(BUILDERS["mixtral"]()).checkpointing == "transformers"  # carried over by structure
    flagged = torch.nn.Sequential(torch.nn.Linear(2, 2))
    flagged[0].grad_checkpointing = True  # a switch of no known package
    assert reentrant_checkpointing(flagged, "any")  # the safe side
    assert not reentrant_checkpointing(flagged, "open_clip")  # open_clip's switch is never reentrant
    assert not reentrant_checkpointing(flagged, "transformers")  # transformers' switch is another attribute
    flagged[0].gradient_checkpointing = True
    assert not reentrant_checkpointing(flagged.eval(), "transformers")  # transformers checkpoints in train mode only
    assert reentrant_checkpointing(flagged.train(), "transformers")  # its variant is private: the safe side
    with pytest.raises(ValueError, match="allowed values"):
        reentrant_checkpointing(flagged, "deepspeed")
    with pytest.raises(ValueError, match="checkpointing='deepspeed'"):
        HostSpec(name="x", description="x", parts=HOSTS["llama"].parts, checkpointing="deepspeed")


def test_output_heads_come_from_the_row():
    from mmpreproj.integrations.quantized import _output_heads

    assert _output_heads(BUILDERS["mixtral"]()) == ("lm_head",)  # by structure, the row's
    assert "lm_head" in HOSTS["gpt_neox"].output_heads and "embed_out" in HOSTS["gpt_neox"].output_heads
    assert _output_heads(torch.nn.Sequential(torch.nn.Linear(2, 2))) == ()  # no row: name it in skip_modules


def test_the_lora_methods_have_no_fallback_host():
    from mmpreproj.train.methods import apply_method, lora_targets

    assert lora_targets(BUILDERS["mixtral"]()) == ["q_proj", "k_proj", "v_proj", "o_proj"]
    unknown = torch.nn.Sequential(torch.nn.Linear(4, 4))  # no attention at all: said first (test_reliability_inject)
    with pytest.raises(ValueError, match="no attention layer in Sequential.*describe it with host="):
        lora_targets(unknown)
    with pytest.raises(ValueError, match="no attention layer in Sequential.*describe it with host="):
        apply_method(unknown, "lora", lora_r=2)


@pytest.mark.parametrize("family", ["Olmo3", "Exaone4"])
def test_post_norm_decoders_are_refused_with_the_reason(family):
    model = _decoder(getattr(tf, f"{family}Config"), getattr(tf, f"{family}ForCausalLM"))
    with pytest.raises(ValueError, match="is post-norm"):
        mmpreproj.inject(model)
    assert not mmpreproj.is_injected(model)


def test_deepseek_mla_projections_read_the_pre_projected_input():
    # fp32: the MoE experts have no float64 kernel; x~ is recomputed by the same module on the same tensor
    model = mmpreproj.inject(BUILDERS["deepseek_v2"](), PreProjConfig(skip_init_std=0.05))
    layer = model.model.layers[0]
    seen: dict = {}
    layer.input_layernorm.register_forward_hook(lambda m, a, out: seen.setdefault("x_hat", out))
    for name in ("q_a_proj", "kv_a_proj_with_mqa"):
        getattr(layer.self_attn.base_layer, name).register_forward_pre_hook(
            lambda m, a, n=name: seen.setdefault(n, a[0])
        )
    model(*tokens())
    x_tilde = layer.self_attn.slots()[0](seen["x_hat"])
    assert not torch.allclose(x_tilde, seen["x_hat"])  # the check below can fail
    for name in ("q_a_proj", "kv_a_proj_with_mqa"):
        torch.testing.assert_close(seen[name], x_tilde, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name, norm", [("phi", "input_layernorm"), ("falcon_parallel", "input_layernorm")])
def test_parallel_layouts_keep_the_mlp_on_the_unprojected_normed_input(name, norm):
    model = mmpreproj.inject(BUILDERS[name]().double(), PreProjConfig(skip_init_std=0.05))
    layer = (model.model.layers if hasattr(model, "model") else model.transformer.h)[0]
    seen: dict = {}
    getattr(layer, norm).register_forward_hook(lambda m, a, out: seen.setdefault("x_hat", out))
    layer.mlp.register_forward_pre_hook(lambda m, a: seen.setdefault("mlp", a[0]))
    model(*tokens())
    torch.testing.assert_close(seen["mlp"], seen["x_hat"], atol=0, rtol=0)
