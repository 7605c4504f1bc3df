"""Families no row names, built tiny from their transformers config class in code (never downloaded): the
config's defaults shrunk to 2 layers, width 32-64, a small vocabulary; random weights, eval mode."""

from __future__ import annotations

import torch
import transformers as tf

VOCAB = 97
_SMALL = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, max_position_embeddings=64, d_model=32, d_ff=64, d_kv=8, num_layers=2,
    num_heads=4, n_embd=32, n_layer=2, n_head=4, n_positions=64, ffn_dim=64, encoder_layers=2, decoder_layers=2,
    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
    moe_intermediate_size=32, num_experts=4, num_local_experts=4, num_experts_per_tok=2, n_routed_experts=4,
    shared_expert_intermediate_size=32, image_size=32, patch_size=8, num_decoder_layers=2,
    max_source_positions=16, max_target_positions=16, num_mel_bins=16, layer_types=None,
    embed_dim=32, depth=2, mlp_ratio=2.0,
)


def shrink(config: tf.PretrainedConfig, **overrides) -> tf.PretrainedConfig:
    """`config` with every size field it has set to a tiny value (sub-configs too), then `overrides`."""
    for key, value in _SMALL.items():
        if key in config.to_dict() and key != "layer_types":
            setattr(config, key, value)
    if hasattr(config, "layer_types") and isinstance(config.layer_types, list):
        config.layer_types = config.layer_types[: config.num_hidden_layers]
    for name in ("text_config", "vision_config", "audio_config", "qformer_config", "encoder_config"):
        sub = getattr(config, name, None)
        if isinstance(sub, tf.PretrainedConfig):
            shrink(sub)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def build(cls_name: str, model_cls: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """`transformers.<model_cls>` from `transformers.<cls_name>Config()` shrunk (and `overrides`)."""
    config = shrink(getattr(tf, f"{cls_name}Config")(), **overrides)
    torch.manual_seed(seed)
    return getattr(tf, model_cls)(config).eval()
