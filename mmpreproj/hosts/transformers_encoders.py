"""transformers encoder and encoder-decoder stacks: T5 and Whisper (self-attention), ModernBERT.

T5 / mT5: each block is a list of sublayers; `layer.0` normalises and calls `SelfAttention(layer_norm(h),
mask=..., position_bias=...)` -> (out, position_bias, weights). The pre-projection sits on the self-attention
of the encoder and the decoder; the decoder's cross-attention (`layer.1.EncDecAttention`) is left alone, as
its keys and values are the encoder's output, not a norm's. `T5EncoderModel` has the encoder part only.

Whisper: encoder and decoder layers call `self_attn(hidden_states=self_attn_layer_norm(h), ...)` ->
(out, weights); the decoder's `encoder_attn` (cross-attention) is left alone, as T5's. `WhisperEncoder`
alone has the encoder part only (its `layers`).

ModernBERT: `attn(attn_norm(h), position_embeddings=..., ...)` -> (out, weights); layer 0's `attn_norm` is
an `nn.Identity` (the embeddings end in a norm), so its attention reads the embedding norm's output.
"""

from __future__ import annotations

from .paths import INPUT_EMBEDDINGS
from .registry import register_host
from .spec import HostSpec, PartSpec
from .transformers_decoders import HF_CALL


def _t5_part(name: str) -> PartSpec:
    return PartSpec(
        name,
        blocks=(f"{name}.block",),
        attention="layer.0.SelfAttention",
        norm="layer.0.layer_norm",
        call=HF_CALL,
        optional=True,
    )


ENCODER_ROWS = [
    register_host(
        HostSpec(
            name="t5",
            description="transformers T5 / mT5 (encoder and decoder self-attention; cross-attention untouched)",
            model_types=("t5", "mt5"),
            parts=(_t5_part("encoder"), _t5_part("decoder")),
            embeddings=INPUT_EMBEDDINGS,
            lora_targets=("q", "k", "v", "o"),
            checkpointing="transformers",
            output_heads=("lm_head",),
        )
    ),
    register_host(
        HostSpec(
            name="modernbert",
            description="transformers ModernBERT encoders",
            model_types=("modernbert",),
            parts=(
                PartSpec(
                    "language", blocks=("model.layers", "layers"), attention="attn", norm="attn_norm", call=HF_CALL
                ),
            ),
            embeddings=INPUT_EMBEDDINGS,
            lora_targets=("Wqkv", "Wo"),
            checkpointing="transformers",
        )
    ),
]


def _whisper_part(name: str, optional: bool = False) -> PartSpec:
    return PartSpec(
        name,
        blocks=(f"model.{name}.layers", f"{name}.layers", "layers"),
        attention="self_attn",
        norm="self_attn_layer_norm",
        call=HF_CALL,
        optional=optional,
    )


ENCODER_ROWS.append(
    register_host(
        HostSpec(
            name="whisper",
            description="transformers Whisper (encoder and decoder self-attention; cross-attention untouched)",
            model_types=("whisper",),
            parts=(_whisper_part("encoder", optional=True), _whisper_part("decoder", optional=True)),
            # the encoder's stream starts at its first convolution (a frozen base under reentrant checkpointing)
            embeddings="model.encoder.conv1|encoder.conv1|conv1",
            lora_targets=("q_proj", "k_proj", "v_proj", "out_proj"),
            checkpointing="transformers",
            output_heads=("proj_out",),
        )
    )
)
