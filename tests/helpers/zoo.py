"""The tiny-host zoo: small transformers models built from configs in code (never downloaded), random
weights, eval mode, and the inputs and forward calls the tests run them with."""

from __future__ import annotations

from functools import partial

import torch
import transformers as tf

VOCAB = 97  # the vocabulary of every zoo decoder (the VLMs add their special tokens above it)


def tiny_neox(parallel: bool = True, seed: int = 0, **overrides) -> tf.GPTNeoXForCausalLM:
    """A 2-block GPT-NeoX with Pythia's layout (partial rotary), random weights, eval mode."""
    kw = dict(
        vocab_size=128,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        rotary_pct=0.25,
        max_position_embeddings=128,
        use_parallel_residual=parallel,
        tie_word_embeddings=False,
    )
    kw.update(overrides)
    torch.manual_seed(seed)
    model = tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(**kw)).eval()
    return model


def llama_like(cfg_cls, model_cls, width=64, depth=2, seed=0, **extra):
    """A decoder with Llama's config fields (`cfg_cls`, `model_cls`: the transformers classes)."""
    torch.manual_seed(seed)
    cfg = cfg_cls(
        vocab_size=VOCAB,
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=depth,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **extra,
    )
    return model_cls(cfg).eval()


def gpt2(width=64, depth=2, seed=0):
    torch.manual_seed(seed)
    return tf.GPT2LMHeadModel(
        tf.GPT2Config(vocab_size=VOCAB, n_embd=width, n_layer=depth, n_head=4, n_positions=64)
    ).eval()


def _gptj(width=64, depth=2, seed=0):
    torch.manual_seed(seed)
    return tf.GPTJForCausalLM(
        tf.GPTJConfig(vocab_size=VOCAB, n_embd=width, n_layer=depth, n_head=4, rotary_dim=8, n_positions=64)
    ).eval()


def opt(width=64, depth=2, seed=0, before=True):
    """OPT; `before=False` is its post-norm layout (refused)."""
    torch.manual_seed(seed)
    return tf.OPTForCausalLM(
        tf.OPTConfig(
            vocab_size=VOCAB,
            hidden_size=width,
            ffn_dim=2 * width,
            num_hidden_layers=depth,
            num_attention_heads=4,
            word_embed_proj_dim=width,
            max_position_embeddings=64,
            do_layer_norm_before=before,
        )
    ).eval()


def _neox(width=64, depth=2, seed=0, parallel=True):
    torch.manual_seed(seed)
    return tf.GPTNeoXForCausalLM(
        tf.GPTNeoXConfig(
            vocab_size=VOCAB,
            hidden_size=width,
            num_hidden_layers=depth,
            num_attention_heads=4,
            intermediate_size=2 * width,
            rotary_pct=0.25,
            max_position_embeddings=64,
            use_parallel_residual=parallel,
            tie_word_embeddings=False,
        )
    ).eval()


BUILDERS = {  # one decoder per transformers row (`mmpreproj/hosts/transformers_decoders.py`)
    "gpt_neox_parallel": _neox,  # Pythia's layout
    "gpt_neox": partial(_neox, parallel=False),
    "llama": partial(llama_like, tf.LlamaConfig, tf.LlamaForCausalLM),
    "mistral": partial(llama_like, tf.MistralConfig, tf.MistralForCausalLM),
    "qwen2": partial(llama_like, tf.Qwen2Config, tf.Qwen2ForCausalLM),
    "qwen3": partial(llama_like, tf.Qwen3Config, tf.Qwen3ForCausalLM, head_dim=16),
    "qwen3_moe": partial(
        llama_like,
        tf.Qwen3MoeConfig,
        tf.Qwen3MoeForCausalLM,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
    ),
    "gemma": partial(llama_like, tf.GemmaConfig, tf.GemmaForCausalLM, head_dim=16),
    "gemma2": partial(llama_like, tf.Gemma2Config, tf.Gemma2ForCausalLM, head_dim=16),
    "gemma3_text": partial(llama_like, tf.Gemma3TextConfig, tf.Gemma3ForCausalLM, head_dim=16),
    "phi3": partial(llama_like, tf.Phi3Config, tf.Phi3ForCausalLM, pad_token_id=0),
    "granite": partial(llama_like, tf.GraniteConfig, tf.GraniteForCausalLM),
    "stablelm": partial(llama_like, tf.StableLmConfig, tf.StableLmForCausalLM),
    "stablelm_parallel": partial(llama_like, tf.StableLmConfig, tf.StableLmForCausalLM, use_parallel_residual=True),
    "cohere": partial(llama_like, tf.CohereConfig, tf.CohereForCausalLM),
    "gpt2": gpt2,
    "gptj": _gptj,
    "opt": opt,
}


def tokens(batch=2, length=7, seed=1) -> tuple[torch.Tensor]:
    """Decoder inputs: `(input_ids,)` over the zoo vocabulary (no token 0, the padding id)."""
    return (torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed)),)


def logits(model, inputs):
    return model(*inputs).logits


def qwen2_vl(width=64, depth=2, seed=0, cls_name="Qwen2VL"):
    """Qwen2-VL (or `cls_name="Qwen2_5_VL"`): vision tower + merger + M-RoPE language model."""
    torch.manual_seed(seed)
    cfg = getattr(tf, f"{cls_name}Config")(
        text_config=dict(
            vocab_size=VOCAB + 3,
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=depth,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]},
        ),
        vision_config=dict(
            depth=depth,
            embed_dim=width,
            hidden_size=width,
            num_heads=4,
            mlp_ratio=2,
            patch_size=4,
            temporal_patch_size=2,
            spatial_merge_size=2,
            in_channels=3,
            out_hidden_size=width,
            intermediate_size=2 * width,
            window_size=8,
            fullatt_block_indexes=[depth - 1],
        ),
        image_token_id=VOCAB + 2,
        video_token_id=VOCAB + 1,
        vision_start_token_id=VOCAB,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return getattr(tf, f"{cls_name}ForConditionalGeneration")(cfg).eval()


def vl_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(input_ids, pixel_values, image_grid_thw)` for `qwen2_vl`: one image, then text."""
    g = torch.Generator().manual_seed(2)
    pixels = torch.randn(16, 3 * 2 * 4 * 4, generator=g)  # one 16x16 image: a 4x4 grid of 4px patches, 2 frames
    ids = torch.cat([torch.tensor([VOCAB]), torch.full((4,), VOCAB + 2), torch.randint(3, VOCAB, (5,), generator=g)])
    return ids[None], pixels, torch.tensor([[1, 4, 4]])


def vl_forward(model, inputs):
    ids, pixels, grid = inputs
    types = (ids == VOCAB + 2).long()  # 1 marks image tokens, as the processor returns it
    return model(input_ids=ids, pixel_values=pixels, image_grid_thw=grid, mm_token_type_ids=types).logits
