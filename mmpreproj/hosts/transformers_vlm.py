"""transformers VLMs built from a vision encoder and a decoder: LLaVA, Idefics3, SmolVLM.

    LlavaForConditionalGeneration.model   vision_tower (CLIP/SigLIP VisionModel) -> multi_modal_projector
        -> language_model
    Idefics3/SmolVLMForConditionalGeneration.model   vision_model (SigLIP-like) -> connector -> text_model

    Mistral3ForConditionalGeneration.model   vision_tower (PixtralVisionModel) -> multi_modal_projector
        -> language_model

    Qwen2AudioForConditionalGeneration.model   audio_tower (Whisper-style encoder) -> multi_modal_projector
        -> language_model
        (its audio layers call `self_attn(hidden_states=self_attn_layer_norm(x))` -> (out, weights), as Whisper's)

LLaVA-NeXT, LLaVA-OneVision, Gemma 3 (multimodal) and PaliGemma have LLaVA's layout and are recognised by
structure (`structure.py`). Pixtral's layers call `attention(hidden_states=attention_norm(x),
position_embeddings=...)` -> (out, weights): the pre-projection sits ahead of its 2D RoPE.

Both parts are data (`PartSpec`), and both call conventions are transformers' usual one (`HF_CALL`):
- "vision": the tower's encoder layers, `self_attn(hidden_states=layer_norm1(x), ...)` -> (out, weights),
  exactly as the CLIP / SigLIP rows (`transformers_vision.py`); the towers have learned absolute positions,
  so the pre-projection sits on the normed input of attention and nothing else moves.
- "language": the language model's decoder layers, `self_attn(hidden_states=input_layernorm(h),
  position_embeddings=(cos, sin), ...)` -> (out, weights), as the Llama row: ahead of the decoder's RoPE.
  Any language model with that layout fits (`check` names the ones the table knows and refuses the rest).

Default parts: both, as for Qwen2-VL: the paper adds the modules to every attention block, and one adapter
should serve the whole model; `PreProjConfig(parts=["language"])` gives LLaVA-recipe tuning (tower frozen,
only the language model adapted). `modules_to_save=["projector"]` trains the vision-language projector too
(LLaVA's `multi_modal_projector`, Idefics3/SmolVLM's `connector`), saved in the adapter, restored on unload.

LLaVA reads the tower's hidden states at `config.vision_feature_layer` (-2 by default): tower blocks after
it never reach the language model, so modules injected there get no gradient. Select the blocks that feed
it, e.g. `layers={"vision": list(range(n - 1))}` for -2 on an n-block tower. Idefics3/SmolVLM use the
tower's last layer (after `post_layernorm`), so every block counts.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from .paths import INPUT_EMBEDDINGS
from .registry import DESCRIBE_HINT, register_host
from .spec import HostError, HostSpec, PartSpec
from .transformers_decoders import DECODER_ROWS, HF_CALL, QKVO, hf_decoder_part

VISION_TOWERS = ("clip_vision_model", "siglip_vision_model")  # the encoder layout `layer_norm1 -> self_attn`
# decoders whose layers are `input_layernorm -> self_attn(hidden_states=...)` under `.layers`, refused by none
LANGUAGE_MODELS = tuple(
    t
    for row in DECODER_ROWS
    if row.check is None and row.parts[0].norm == "input_layernorm" and row.parts[0].attention == "self_attn"
    for t in row.model_types
)


def _sub_type(model: nn.Module, key: str) -> str | None:
    return getattr(getattr(getattr(model, "config", None), key, None), "model_type", None)


def _check(family: str, towers: tuple[str, ...] | None) -> Callable[[nn.Module], None]:
    """Refuse a tower or language model whose layer layout the row's parts do not describe."""

    def check(model: nn.Module) -> None:
        text = _sub_type(model, "text_config")
        if text is not None and text not in LANGUAGE_MODELS:
            raise HostError(
                f"{family} with a {text!r} language model: this row knows language models laid out as "
                f"input_layernorm -> self_attn ({', '.join(LANGUAGE_MODELS)}). Or {DESCRIBE_HINT}"
            )
        vision = _sub_type(model, "vision_config")
        if towers is not None and vision is not None and vision not in towers:
            raise HostError(
                f"{family} with a {vision!r} vision tower: this row knows {list(towers)} "
                f"(layer_norm1 -> self_attn). Or {DESCRIBE_HINT}"
            )

    return check


def _encoder_part(*blocks: str) -> PartSpec:
    return PartSpec("vision", blocks=blocks, attention="self_attn", norm="layer_norm1", call=HF_CALL)


def _vlm(name: str, family: str, vision: PartSpec, language: PartSpec, projector: str, towers=None) -> HostSpec:
    return register_host(
        HostSpec(
            name=name,
            description=f"transformers {family} (vision tower + language model)",
            model_types=(name,),
            parts=(vision, language),
            check=_check(family, towers),
            embeddings=INPUT_EMBEDDINGS,
            # the language model's q/k/v/o_proj, the tower's q/k/v/out_proj
            lora_targets=QKVO + ("out_proj",),
            trainable_modules={"projector": projector},
            checkpointing="transformers",
            output_heads=("lm_head",),
        )
    )


VLM_ROWS = [
    _vlm(
        "llava",
        "LLaVA",
        _encoder_part(
            "model.vision_tower.encoder.layers",  # transformers 5.x CLIP/SigLIP VisionModel
            "vision_tower.encoder.layers",
            "model.vision_tower.vision_model.encoder.layers",  # 4.x: VisionModel.vision_model
            "vision_tower.vision_model.encoder.layers",
        ),
        hf_decoder_part(("model.language_model.layers", "language_model.layers")),
        "model.multi_modal_projector",
        towers=VISION_TOWERS,
    ),
    *(
        _vlm(
            name,
            family,
            _encoder_part("model.vision_model.encoder.layers", "vision_model.encoder.layers"),
            hf_decoder_part(("model.text_model.layers", "text_model.layers")),
            "model.connector",
        )
        for name, family in (("idefics3", "Idefics3"), ("smolvlm", "SmolVLM"))
    ),
    _vlm(
        "mistral3",
        "Mistral3 (Pixtral vision tower with 2D RoPE)",
        PartSpec(
            "vision",
            blocks=("model.vision_tower.transformer.layers", "vision_tower.transformer.layers"),
            attention="attention",
            norm="attention_norm",
            call=HF_CALL,
        ),
        hf_decoder_part(("model.language_model.layers", "language_model.layers")),
        "model.multi_modal_projector",
        towers=("pixtral",),
    ),
    _vlm(
        "qwen2_audio",
        "Qwen2-Audio (Whisper-style audio tower + Qwen2)",
        PartSpec(
            "audio",
            blocks=("model.audio_tower.layers", "audio_tower.layers"),
            attention="self_attn",
            norm="self_attn_layer_norm",
            call=HF_CALL,
        ),
        hf_decoder_part(("model.language_model.layers", "language_model.layers")),
        "model.multi_modal_projector",
    ),
]
