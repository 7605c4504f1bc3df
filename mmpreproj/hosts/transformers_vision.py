"""transformers vision and vision-language models: towers and decoders as parts of one row.

Qwen2-VL / Qwen2.5-VL / Qwen3-VL: the vision blocks call `attn(norm1(x), cu_seqlens=..., position_embeddings=...)`
and get a tensor; the pre-projection sits ahead of the tower's 2D RoPE (applied inside attention). The
decoder layers are the Qwen2 layout, ahead of M-RoPE. Both are token-wise, so Qwen2.5-VL's window
permutation and Qwen3-VL's deepstack features are untouched. Default parts for a VLM: both ("vision",
"language"): the paper adds the modules to every attention block, and the mixed use case is a
pre-projection ahead of each modality's RoPE; `PreProjConfig(parts=["language"])` gives LLaVA-style
language-only tuning. `modules_to_save=["projector"]` trains the vision-language merger too (Qwen3-VL:
the main merger; the deepstack mergers stay frozen).

CLIP / SigLIP (whole models or one tower): `self_attn(hidden_states=layer_norm1(x), ...)` -> (out, weights). A
tower on its own (`CLIPVisionModel`, `CLIPModel.vision_model`, `SiglipTextModel`) has its own row (`clip_vision`, ...):
its blocks sit at `encoder.layers`, and its model type says which tower it is.
ViT / DINOv2: `attention(layernorm_before(x) | norm1(x), ...)` -> (out, weights); VideoMAE and ViViT have
the ViT layout and are recognised by structure (`structure.py`).
TimeSformer: two seams per layer, two parts over the same blocks: "spatial" `attention(layernorm_before(x))`
and, with divided space-time attention, "temporal" `temporal_attention(temporal_layernorm(x))` (the layers
that have it, `PartSpec.contains`); the reshapes between them are token-wise, so each x~ is exact.
Swin: `attention(windows(layernorm_before(x)), mask)` -> (out, weights): the layer pads the normed tokens
with zeros, shifts them and cuts windows before attention, so attention never receives the norm's output
as a tensor and the identity seam check cannot apply: the row names no `norm` (`unchecked_seam`, set in
code, silently) and reads the width from `layernorm_before`. The result is still exact: pre-projection and
skip act on each token alone, and the pre-projection is bias-free with act(0) = 0, so it maps a zero pad
token to zero, and pre-projecting the windows equals windowing the pre-projected tokens; the skip on pad
tokens is cropped with them (`tests/test_host_encoders.py` checks what the attention receives by hand).
Stages of different widths get modules of their width. SwinV2 (post-norm) is refused with the reason.
"""

from __future__ import annotations

from torch import nn

from .paths import INPUT_EMBEDDINGS
from .registry import register_host
from .spec import AttentionCall, HostError, HostSpec, PartSpec
from .transformers_decoders import HF_CALL, QKVO, hf_decoder_part

TENSOR_CALL = AttentionCall(inputs=((0, "hidden_states"),), output_index=None)
CLIP_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj")  # a CLIP / SigLIP encoder layer's attention


def _encoder_part(name: str, *blocks: str, attention: str = "self_attn", norm: str = "layer_norm1") -> PartSpec:
    return PartSpec(name, blocks=blocks, attention=attention, norm=norm, call=HF_CALL, optional=True)


def _qwen_vl(name: str, model_types: tuple[str, ...]) -> HostSpec:
    return register_host(
        HostSpec(
            name=name,
            description=f"transformers {name} vision-language models (vision tower + language model)",
            model_types=model_types,
            parts=(
                PartSpec(
                    "vision",
                    blocks=("model.visual.blocks", "visual.blocks"),
                    attention="attn",
                    norm="norm1",
                    call=TENSOR_CALL,
                ),
                hf_decoder_part(("model.language_model.layers", "language_model.layers")),
            ),
            embeddings=INPUT_EMBEDDINGS,
            lora_targets=QKVO + ("qkv", "proj"),  # the decoder's q/k/v/o_proj, the vision attention's qkv/proj
            checkpointing="transformers",
            output_heads=("lm_head",),
            trainable_modules={"projector": "model.visual.merger"},
        )
    )


def _dual(name: str, model_types: tuple[str, ...]) -> HostSpec:
    return register_host(
        HostSpec(
            name=name,
            description=f"transformers {name} contrastive models and their towers",
            model_types=model_types,
            parts=(
                _encoder_part("vision", "vision_model.encoder.layers"),
                _encoder_part("text", "text_model.encoder.layers"),
            ),
            lora_targets=CLIP_LORA_TARGETS,
            checkpointing="transformers",
        )
    )


def _tower(name: str, model_types: tuple[str, ...], part: str) -> HostSpec:
    """One tower of a CLIP-style model on its own (`CLIPVisionModel`, `SiglipTextModel`, `CLIPModel.vision_model`):
    its blocks at `encoder.layers`, or under `{part}_model.` (`CLIPVisionModelWithProjection`)."""
    return register_host(
        HostSpec(
            name=name,
            description=f"transformers {name.replace('_', ' ')} tower on its own",
            model_types=model_types,
            parts=(_encoder_part(part, f"{part}_model.encoder.layers", "encoder.layers"),),
            lora_targets=CLIP_LORA_TARGETS,
            checkpointing="transformers",
        )
    )


def _vit(name: str, classes: str, norm: str) -> HostSpec:
    """A transformers ViT-style encoder: `attention(norm(x))` per layer (`layers`, or `encoder.layer` before 5.x)."""
    paths = (f"{name}.layers", "layers", f"{name}.encoder.layer", "encoder.layer")
    return register_host(
        HostSpec(
            name=name,
            description=f"transformers {classes}",
            model_types=(name,),
            parts=(_encoder_part("vision", *paths, attention="attention", norm=norm),),
            lora_targets=QKVO,
            checkpointing="transformers",
        )
    )


def _refuse_swinv2(model: nn.Module) -> None:
    raise HostError(
        "Swin V2 is post-norm (res-post-norm): its attention receives the raw residual stream and "
        "layernorm_before runs after attention, so there is no normed input for the pre-projection to sit on. "
        "Not supported"
    )


VISION_ROWS = [
    _qwen_vl("qwen2_vl", ("qwen2_vl",)),
    _qwen_vl("qwen2_5_vl", ("qwen2_5_vl",)),
    _qwen_vl("qwen3_vl", ("qwen3_vl",)),
    _dual("clip", ("clip",)),
    _tower("clip_vision", ("clip_vision_model",), "vision"),
    _tower("clip_text", ("clip_text_model",), "text"),
    _dual("siglip", ("siglip",)),
    _tower("siglip_vision", ("siglip_vision_model",), "vision"),
    _tower("siglip_text", ("siglip_text_model",), "text"),
    _vit("vit", "ViTModel / ViTForImageClassification", "layernorm_before"),
    _vit("dinov2", "Dinov2Model", "norm1"),
    register_host(
        HostSpec(
            name="timesformer",
            description="transformers TimeSformer (spatial attention; temporal attention too when divided)",
            model_types=("timesformer",),
            parts=(
                _encoder_part(
                    "spatial",
                    "timesformer.encoder.layer",
                    "encoder.layer",
                    attention="attention",
                    norm="layernorm_before",
                ),
                PartSpec(
                    "temporal",
                    blocks=("timesformer.encoder.layer", "encoder.layer"),
                    attention="temporal_attention",
                    norm="temporal_layernorm",
                    call=HF_CALL,
                    optional=True,
                    contains="temporal_attention",
                ),
            ),
            lora_targets=("qkv",),
            checkpointing="transformers",
        )
    ),
    register_host(
        HostSpec(
            name="pixtral",
            description="transformers PixtralVisionModel (Mistral3's tower alone; 2D RoPE inside attention)",
            model_types=("pixtral",),
            parts=(
                PartSpec(
                    "vision",
                    blocks=("transformer.layers",),
                    attention="attention",
                    norm="attention_norm",
                    call=HF_CALL,
                ),
            ),
            lora_targets=QKVO,
            checkpointing="transformers",
        )
    ),
    register_host(
        HostSpec(
            name="swinv2",
            description="transformers Swin V2: refused (res-post-norm: its norms run after attention)",
            model_types=("swinv2",),
            parts=(
                PartSpec(
                    "vision", blocks=("*:Swinv2Layer",), attention="attention", norm="layernorm_before", call=HF_CALL
                ),
            ),
            check=_refuse_swinv2,
        )
    ),
    register_host(
        HostSpec(
            name="swin",
            description="transformers Swin (window attention; the seam is not identity-checked, see the module doc)",
            model_types=("swin",),
            parts=(
                PartSpec(
                    "vision",
                    blocks=("*:SwinLayer",),
                    attention="attention",
                    norm=None,
                    call=HF_CALL,
                    width="layernorm_before.weight",
                    unchecked_seam=True,
                ),
            ),
            lora_targets=("query", "key", "value"),
            checkpointing="transformers",
        )
    ),
]
