"""Families no row names, built tiny from their transformers config class in code (never downloaded): the
config's defaults shrunk to 2 layers, width 32-64, a small vocabulary; random weights, eval mode."""

from __future__ import annotations

import inspect

import torch
import transformers as tf

VOCAB = 97
_SMALL = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    d_model=32,
    d_ff=64,
    d_kv=8,
    num_layers=2,
    num_heads=4,
    n_embd=32,
    n_layer=2,
    n_head=4,
    n_positions=64,
    ffn_dim=64,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    moe_intermediate_size=32,
    num_experts=4,
    num_local_experts=4,
    num_experts_per_tok=2,
    n_routed_experts=4,
    shared_expert_intermediate_size=32,
    image_size=32,
    patch_size=8,
    num_decoder_layers=2,
    max_source_positions=16,
    max_target_positions=16,
    num_mel_bins=16,
)


def _signature(cls: type) -> set[str]:
    return {n for c in cls.__mro__ if "__init__" in vars(c) for n in inspect.signature(c.__init__).parameters}


def small(cls: type, **overrides) -> tf.PretrainedConfig:
    """`cls(...)` with every size field its constructor takes set to a tiny value (sub-configs too), then
    `overrides`."""
    names = _signature(cls)
    kw = {k: v for k, v in _SMALL.items() if k in names}
    default = cls()
    for name in ("text_config", "vision_config", "audio_config", "qformer_config", "encoder_config"):
        sub = getattr(default, name, None)
        if name in names and isinstance(sub, tf.PretrainedConfig) and name not in overrides:
            kw[name] = small(type(sub)).to_dict()
    if "pad_token_id" in names and "pad_token_id" not in overrides:
        kw["pad_token_id"] = 0
    kw.update(overrides)
    return cls(**kw)


def build(cls_name: str, model_cls: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """`transformers.<model_cls>` from `transformers.<cls_name>Config()` shrunk (and `overrides`)."""
    config = small(getattr(tf, f"{cls_name}Config"), **overrides)
    torch.manual_seed(seed)
    return getattr(tf, model_cls)(config).eval()
