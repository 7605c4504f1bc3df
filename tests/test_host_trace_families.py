"""Issue 30: the one call on families no row names, and a tracer that is never silently wrong or partial.

Each family is built tiny from its transformers config class in code (`tests/helpers/trace_zoo.py`)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import mmpreproj
from mmpreproj.hosts import HOSTS
from mmpreproj.hosts.example_input import example_input
from mmpreproj.method import trace_seams
from tests.helpers.host_contract import IDENTITY, flat, one_call_contract
from tests.helpers.snapshots import assert_same_snapshot, snapshot
from tests.helpers.trace_zoo import build

FAMILIES = {  # name -> (config class prefix, model class, overrides); none of them claimed by a row's type
    "recurrent_gemma": (
        "RecurrentGemma",
        "RecurrentGemmaForCausalLM",
        dict(
            block_types=["recurrent", "recurrent", "attention"],
            num_hidden_layers=3,
            lru_width=32,
            attention_window_size=16,
        ),
    ),
    "nemotron_h": (
        "NemotronH",
        "NemotronHForCausalLM",
        dict(
            layers_block_type=["mamba", "attention", "mlp"],
            mamba_num_heads=4,
            mamba_head_dim=8,
            ssm_state_size=8,
            n_groups=1,
        ),
    ),
    "qwen3_next": (
        "Qwen3Next",
        "Qwen3NextForCausalLM",
        dict(
            layer_types=["linear_attention", "full_attention"],
            linear_num_value_heads=4,
            linear_num_key_heads=2,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
        ),
    ),
    "xglm": ("XGLM", "XGLMForCausalLM", {}),
    "jetmoe": ("JetMoe", "JetMoeForCausalLM", dict(kv_channels=8)),
    "esm": ("Esm", "EsmModel", dict(vocab_size=33, pad_token_id=1, position_embedding_type="rotary")),
    "mpt": ("Mpt", "MptForCausalLM", dict(d_model=32, n_heads=4, n_layers=2, expansion_ratio=2)),
    "aimv2": ("Aimv2", "Aimv2Model", {}),
    # its norm sits inside the attention module (attention.LayerNorm -> attention.self), and class names carry
    # "LayerNorm" (RobertaPreLayerNormAttention): refused as "not run" before, the attention taken for a norm
    "roberta_prelayernorm": ("RobertaPreLayerNorm", "RobertaPreLayerNormModel", {}),
    # a VLM decoder: the example input holds one image and as many image tokens as `get_image_features` makes of it,
    # so the trace reaches the vision tower (text only before: the tower was "not run" and the call refused)
    "internvl": ("InternVL", "InternVLForConditionalGeneration", dict(image_token_id=90)),
    "pvt_v2": (
        "PvtV2",
        "PvtV2Model",
        dict(
            hidden_sizes=[16, 32],
            num_encoder_blocks=2,
            depths=[1, 1],
            num_attention_heads=[1, 2],
            sr_ratios=[2, 1],
            patch_sizes=[7, 3],
            strides=[4, 2],
            mlp_ratios=[2, 2],
        ),
    ),
}
TRACED = list(FAMILIES)
DECODERS = {"recurrent_gemma", "nemotron_h", "qwen3_next", "xglm", "jetmoe", "mpt"}


def _model(name: str) -> nn.Module:
    c, m, o = FAMILIES[name]
    return build(c, m, **o)


def _wrapped(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, mmpreproj.PreProjAttention)]


# --- never silently wrong ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,kind", [("recurrent_gemma", "RecurrentGemmaAttention"), ("nemotron_h", "NemotronHAttention")]
)
def test_a_hybrid_stack_gets_its_attention_blocks_only(name, kind):
    model = _model(name)
    (part,) = trace_seams(model, **example_input(model))["parts"]
    assert part.get("contains"), part  # the recurrent / Mamba / MLP layers share the attention's path
    mmpreproj.inject(model, IDENTITY)
    wrapped = [m for m in model.modules() if isinstance(m, mmpreproj.PreProjAttention)]
    assert len(wrapped) == 1 and type(wrapped[0].base_layer).__name__ == kind


def test_bloom_with_the_residual_after_the_norm_is_refused_as_post_norm():
    model = build("Bloom", "BloomForCausalLM", apply_residual_connection_post_layernorm=True)
    with pytest.raises(ValueError, match=r"post-norm: the attention takes the norm's output also as its residual"):
        trace_seams(model, **example_input(model))
    before = snapshot(model)
    with pytest.raises(ValueError, match="post-norm"):
        mmpreproj.inject(model, IDENTITY)
    assert_same_snapshot(snapshot(model), before)


def test_minimax_is_refused_as_post_norm_by_every_route():
    model = build("MiniMax", "MiniMaxForCausalLM", layer_types=["linear_attention", "full_attention"])
    with pytest.raises(ValueError, match="post-norm"):
        trace_seams(model, **example_input(model))
    with pytest.raises(ValueError, match="post-norm"):
        mmpreproj.inject(model, IDENTITY)
    with pytest.raises(ValueError, match="host 'mistral' does not fit MiniMaxForCausalLM: .*post-norm"):
        mmpreproj.inject(model, IDENTITY, host="mistral")
    assert not mmpreproj.is_injected(model)


def test_falcon_h1_is_refused_at_inject_naming_the_multiplier():
    model = build(
        "FalconH1",
        "FalconH1ForCausalLM",
        mamba_d_ssm=32,
        mamba_n_heads=4,
        mamba_d_head=8,
        mamba_d_state=8,
        mamba_n_groups=1,
    )
    before = snapshot(model)
    with pytest.raises(ValueError, match="a multiplier between norm and attention"):
        mmpreproj.inject(model, IDENTITY)
    assert_same_snapshot(snapshot(model), before)


# --- never silently partial; clear reasons --------------------------------------------------------------------


def test_a_tower_the_example_input_does_not_run_is_named():
    model = build("VideoLlava", "VideoLlavaForConditionalGeneration")
    with pytest.raises(ValueError, match=r"leave \d+ attention module\(s\) out .*video_tower.*not run by the example"):
        trace_seams(model, **example_input(model))
    partial = trace_seams(model, partial=True, **example_input(model))
    assert any("video_tower" in n for n in partial["left_out"])


def test_qwen3_next_linear_attention_is_described_not_left_out():
    model = _model("qwen3_next")
    parts = trace_seams(model, **example_input(model))["parts"]
    assert sorted(p["attention"] for p in parts) == ["linear_attn", "self_attn"]
    mmpreproj.inject(model, IDENTITY)
    assert sorted(n.rsplit(".", 1)[-1] for n in _wrapped(model)) == ["linear_attn", "self_attn"]


def test_clip_model_trace_compares_every_returned_tensor():
    model = build("CLIP", "CLIPModel")
    parts = trace_seams(model, **example_input(model))["parts"]  # no logits / last_hidden_state: was refused
    assert {p["blocks"] for p in parts} == {"vision_model.encoder.layers", "text_model.encoder.layers"}


def test_siglip2_trace_compares_every_returned_tensor():
    model = build("Siglip2", "Siglip2Model")
    x = example_input(model)
    assert {"input_ids", "pixel_values", "spatial_shapes"} <= set(x)
    description = trace_seams(model, **x)  # was "does not reproduce the model": no logits to compare
    assert {p["blocks"] for p in description["parts"]} == {"vision_model.encoder.layers", "text_model.encoder.layers"}
    assert list(description["left_out"]) == ["vision_model.head"]  # the pooling head is listed, not refused


def test_t5_nested_block_lists_are_traced():
    model = build("T5", "T5Model")
    parts = trace_seams(model, **example_input(model))["parts"]
    assert {(p["blocks"], p["attention"]) for p in parts} == {
        ("encoder.block", "layer.0.SelfAttention"),
        ("decoder.block", "layer.0.SelfAttention"),
        ("decoder.block", "layer.1.EncDecAttention"),
    }


def test_errors_name_no_row_the_user_did_not_write():
    model = _model("xglm")  # laid out as the Whisper row's two parts over one list: was "overlapping parts"
    mmpreproj.inject(model, IDENTITY)
    assert model.mmpreproj_state.host == "traced"
    flex = build("FlexOlmo", "FlexOlmoForCausalLM")
    with pytest.raises(ValueError, match="post-norm") as e:
        mmpreproj.inject(flex, IDENTITY)
    assert "no host row for" not in str(e.value) and "whisper" not in str(e.value)


def test_a_vlm_decoder_is_traced_through_both_towers():
    """The example input of a VLM decoder holds an image and its placeholder tokens, one per image feature, so the
    trace describes the vision tower beside the language model instead of naming it as not run."""
    model = _model("internvl")
    x = example_input(model)
    tokens = int((x["input_ids"] == model.config.image_token_id).sum())
    assert "pixel_values" in x and tokens == model.get_image_features(x["pixel_values"]).pooler_output[0].shape[0]
    parts = trace_seams(model, **x)["parts"]
    assert sorted(p["blocks"] for p in parts) == ["model.language_model.layers", "model.vision_tower.encoder.layer"]


# --- the one call, through the contract -----------------------------------------------------------------------


@pytest.mark.parametrize("name", TRACED)
def test_one_call_traces_and_keeps_the_contract(name, tmp_path, caplog):
    model = _model(name)
    assert not any(h.matches_model(model) for h in HOSTS.values())
    with caplog.at_level(logging.INFO, logger="mmpreproj.inject"):
        mmpreproj.inject(model, IDENTITY)
    assert model.mmpreproj_state.host == "traced" or name == "qwen3_next"
    assert "traced on an example input" in caplog.text
    one_call_contract(lambda: _model(name), example_input(model), name in DECODERS, tmp_path)


def test_get_peft_model_traces_too(tmp_path):
    peft = pytest.importorskip("peft")
    model = _model("jetmoe")
    x = example_input(model)
    ref = flat(model(**x))
    wrapped = peft.get_peft_model(model, mmpreproj.PreProjConfig(init="identity", skip_init_std=0))
    torch.testing.assert_close(flat(wrapped(**x)), ref, atol=1e-5, rtol=0)
    assert _wrapped(wrapped) and model.mmpreproj_state.host == "traced"


BROAD = {  # families no row claims by type, laid out as a row (structure, confirmed by the trace) or traced
    "vit_mae": ("ViTMAE", "ViTMAEModel", {}),
    "ernie4_5": ("Ernie4_5", "Ernie4_5ForCausalLM", {}),
    "glm4": ("Glm4", "Glm4ForCausalLM", {}),
    "helium": ("Helium", "HeliumForCausalLM", {}),
    "smollm3": ("SmolLM3", "SmolLM3ForCausalLM", {}),
    "arcee": ("Arcee", "ArceeForCausalLM", {}),
    "phimoe": ("Phimoe", "PhimoeForCausalLM", {}),
    "qwen2_moe": ("Qwen2Moe", "Qwen2MoeForCausalLM", {}),
    "starcoder2": ("Starcoder2", "Starcoder2ForCausalLM", {}),
    "persimmon": ("Persimmon", "PersimmonForCausalLM", {}),
    "gpt_bigcode": ("GPTBigCode", "GPTBigCodeForCausalLM", {}),
    "nemotron": ("Nemotron", "NemotronForCausalLM", {}),
    "olmo": ("Olmo", "OlmoForCausalLM", {}),
    "olmoe": ("Olmoe", "OlmoeForCausalLM", {}),
    "cohere2": ("Cohere2", "Cohere2ForCausalLM", {}),
    "glm": ("Glm", "GlmForCausalLM", {}),
    "jamba": (
        "Jamba",
        "JambaForCausalLM",
        dict(
            attn_layer_period=2,
            attn_layer_offset=1,
            expert_layer_period=2,
            expert_layer_offset=1,
            mamba_d_state=8,
            mamba_expand=2,
        ),
    ),
    "dinov2_reg": ("Dinov2WithRegisters", "Dinov2WithRegistersModel", {}),
    "beit": ("Beit", "BeitModel", {}),
    "data2vec_vision": ("Data2VecVision", "Data2VecVisionModel", {}),
    "vit_msn": ("ViTMSN", "ViTMSNModel", {}),
    "owlv2": ("Owlv2", "Owlv2Model", {}),
    "moshi": ("Moshi", "MoshiForCausalLM", {}),
    "granitemoe": ("GraniteMoe", "GraniteMoeForCausalLM", {}),
    "granitemoeshared": ("GraniteMoeShared", "GraniteMoeSharedForCausalLM", {}),
    "bitnet": ("BitNet", "BitNetForCausalLM", {}),
    "diffllama": ("DiffLlama", "DiffLlamaForCausalLM", {}),
    "hunyuan_dense": ("HunYuanDenseV1", "HunYuanDenseV1ForCausalLM", {}),
    "seed_oss": ("SeedOss", "SeedOssForCausalLM", {}),
    "ministral": ("Ministral", "MinistralForCausalLM", {}),
    "vaultgemma": ("VaultGemma", "VaultGemmaForCausalLM", {}),
    "cwm": ("Cwm", "CwmForCausalLM", {}),
    "doge": ("Doge", "DogeForCausalLM", {}),
    "glm4_moe": ("Glm4Moe", "Glm4MoeForCausalLM", {}),
    "gpt_oss": ("GptOss", "GptOssForCausalLM", {}),
    "ernie4_5_moe": ("Ernie4_5_Moe", "Ernie4_5_MoeForCausalLM", {}),
    "ijepa": ("IJepa", "IJepaModel", {}),
    "deit": ("DeiT", "DeiTModel", {}),
    "dpt": ("DPT", "DPTModel", {}),
    "biogpt": ("BioGpt", "BioGptForCausalLM", {}),
    "gpt_neo": ("GPTNeo", "GPTNeoForCausalLM", dict(attention_types=[[["global", "local"], 1]])),
    "xlm_roberta_xl": ("XLMRobertaXL", "XLMRobertaXLModel", {}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BROAD))
def test_one_call_over_families_no_row_names(name, tmp_path):
    c, m, o = BROAD[name]
    model = build(c, m, **o)
    assert not any(h.matches_model(model) for h in HOSTS.values())
    one_call_contract(lambda: build(c, m, **o), example_input(model), m.endswith("CausalLM"), tmp_path)


class _Attention(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.q, self.kv = nn.Linear(d, d), nn.Linear(d, 2 * d)

    def forward(self, hidden_states=None, latents=None, context=None):
        q = self.q(hidden_states if hidden_states is not None else latents)
        k, v = self.kv(hidden_states if hidden_states is not None else context).chunk(2, -1)
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.attn = nn.LayerNorm(16), _Attention()

    def forward(self, x):
        return x + self.attn(hidden_states=self.norm(x))


class _Resampled(nn.Module):
    """Pre-norm blocks, then an Idefics2-like resampler whose attention is called with `latents=`/`context=`."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(2))
        self.latents = nn.Parameter(torch.randn(1, 3, 16))
        self.resampler_attn = _Attention()

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.resampler_attn(latents=self.latents.expand(len(x), -1, -1), context=x)


def test_a_resampler_called_with_latents_is_named_not_dropped():
    torch.manual_seed(0)
    model, x = _Resampled(), torch.randn(2, 5, 16)
    with pytest.raises(
        ValueError,
        match=r"'resampler_attn': called without a hidden_states/x/query input "
        r"\(keywords \['latents', 'context'\]\): a resampler or cross-attention",
    ):
        trace_seams(model, x)
    partial = trace_seams(model, x, partial=True)
    assert list(partial["left_out"]) == ["resampler_attn"] and len(partial["parts"]) == 1
    before = snapshot(model)
    with pytest.raises(ValueError, match="resampler_attn"):
        mmpreproj.inject(model, IDENTITY, example_input=x)
    assert_same_snapshot(snapshot(model), before)


TIMM = {  # timm models no row matches, traced from an image of their input size
    "pit": ("pit_ti_224", dict(img_size=64)),
    "twins": ("twins_svt_small", dict(embed_dims=(32, 64, 64, 64), depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 2))),
    "convit": ("convit_tiny", dict(img_size=32, embed_dim=48, depth=2, num_heads=4)),
    "coat": ("coat_lite_tiny", dict(embed_dims=(32, 32, 32, 32), serial_depths=(1, 1, 1, 1))),
    "tnt": ("tnt_s_patch16_224", dict(img_size=32, depth=2)),
}


def _timm(name: str) -> nn.Module:
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    arch, kw = TIMM[name]
    return timm.create_model(arch, pretrained=False, **kw).eval()


@pytest.mark.parametrize("name", sorted(TIMM))
def test_one_call_traces_timm_models(name, tmp_path):
    model = _timm(name)
    assert not any(h.matches_model(model) for h in HOSTS.values())
    fresh = one_call_contract(lambda: _timm(name), example_input(model), False, tmp_path)
    assert fresh.mmpreproj_state.host == "traced"


def test_a_class_attention_returning_the_class_token_only_is_refused_with_the_reason():
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("cait_xxs24_224", pretrained=False, img_size=32, depth=2, embed_dim=48).eval()
    before = snapshot(model)
    with pytest.raises(
        ValueError, match=r"blocks_token_only.0.attn' of Cait returns shape \(1, 1, 48\) .*class attention"
    ):
        mmpreproj.inject(model, IDENTITY)
    assert_same_snapshot(snapshot(model), before)
