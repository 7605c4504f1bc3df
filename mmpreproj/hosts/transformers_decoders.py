"""transformers decoder-only language models: one row per family, all of the form

    h = h + attn(x~) + W_skip·x~ ;  x~ = PreProj(norm(h))          (the MLP branch is untouched)

Every row below is data (`PartSpec`): where the layers are, which attribute is the attention fed by the
pre-attention norm, and how the layer calls it. transformers 5.x layers call
`self_attn(hidden_states=..., position_embeddings=(cos, sin), cache=..., ...)` and unpack `(out, weights)`;
the wrapper swaps `hidden_states` for `x~` and adds the skip to output 0, so the model's own RoPE (applied
inside attention to Q/K projected from `x~`) and its KV cache are untouched.

Gemma 2/3: the layer applies `post_attention_layernorm` to the attention output before the residual add.
The skip joins the attention output *before* that norm (the wrapper adds it to output 0), so the norm
rescales `attn_out + W_skip·x~` as one branch: the same choice as timm's LayerScale and open_clip's `ls_1`
(whatever the block does to the attention branch applies to the skip), and the one that keeps the skip on
the scale the base's residual stream expects. `tests/test_host_transformers.py` pins it with a hand-computed
Gemma 2 layer.

GPT-J (and Cohere, parallel residual): the MLP reads the same normed input as attention; it keeps seeing
the un-projected `x^`, since only the attention's argument is replaced.

Falcon has two rows, one per pre-attention norm name: `input_layernorm` (Falcon-7B's parallel layout, the
sequential one, and the new architecture with one norm) and `ln_attn` (the new architecture with two norms,
Falcon-40B). Bamba's attention layers share their class with its Mamba layers: the part keeps the blocks that
have `self_attn` (`PartSpec.contains`).

Refused with the reason: OLMo 2, OLMo 3, EXAONE 4 (post-norm: attention receives the raw residual stream, its norm
runs after attention) and OPT with `do_layer_norm_before=False` (OPT-350m).
"""

from __future__ import annotations

from functools import partial

from torch import nn

from .paths import INPUT_EMBEDDINGS
from .registry import register_host
from .spec import AttentionCall, HostError, HostSpec, PartSpec

HF_CALL = AttentionCall(inputs=((0, "hidden_states"),), output_index=0)  # self_attn(hidden_states=...) -> (out, w)
QKVO = ("q_proj", "k_proj", "v_proj", "o_proj")
# where a transformers decoder keeps its layers: `*ForCausalLM.model.layers`, the bare `*Model.layers`, and
# `transformer.layers` in the question-answering heads of Llama, Qwen2 and others (`*ForQuestionAnswering`)
HF_DECODER_BLOCKS = ("model.layers", "layers", "transformer.layers")


def hf_decoder_part(
    blocks: tuple[str, ...] = HF_DECODER_BLOCKS,
    attention: str = "self_attn",
    norm: str = "input_layernorm",
    name: str = "language",
) -> PartSpec:
    """A transformers decoder stack (its layers at one of `HF_DECODER_BLOCKS`)."""
    return PartSpec(name, blocks=blocks, attention=attention, norm=norm, call=HF_CALL)


def _row(name: str, model_types: tuple[str, ...], part: PartSpec, lora: tuple[str, ...] = QKVO, **kw) -> HostSpec:
    return register_host(
        HostSpec(
            name=name,
            description=f"transformers {name} decoders ({', '.join(model_types)})",
            model_types=model_types,
            parts=(part,),
            embeddings=INPUT_EMBEDDINGS,
            lora_targets=lora,
            checkpointing="transformers",
            output_heads=("lm_head",),
            **kw,
        )
    )


def _refuse_post_norm(family: str):
    def check(model: nn.Module) -> None:
        raise HostError(
            f"{family} is post-norm: its attention receives the raw residual stream and its norm runs after "
            "attention, so there is no normed input for the pre-projection to sit on. Not supported"
        )

    return check


def _check_opt(model: nn.Module) -> None:
    if not getattr(model.config, "do_layer_norm_before", True):
        raise HostError(
            "OPT with do_layer_norm_before=False (e.g. OPT-350m) normalises after attention, so attention "
            "never receives a norm's output; only pre-norm OPT models are supported"
        )


def _is_falcon(model: nn.Module, ln_attn: bool) -> bool:
    """A Falcon model whose layers feed attention from `ln_attn` (`ln_attn=True`) or `input_layernorm`."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "model_type", None) != "falcon":
        return False
    two = bool(cfg.parallel_attn and cfg.new_decoder_architecture and cfg.num_ln_in_parallel_attn in (None, 2))
    return two == ln_attn


DECODER_ROWS = [
    _row("llama", ("llama",), hf_decoder_part()),
    _row("mistral", ("mistral",), hf_decoder_part()),
    _row("qwen2", ("qwen2",), hf_decoder_part()),
    _row("qwen3", ("qwen3",), hf_decoder_part()),
    _row("qwen3_moe", ("qwen3_moe",), hf_decoder_part()),  # attention as Qwen3; the MoE MLP is untouched
    _row("gemma", ("gemma",), hf_decoder_part()),
    _row("gemma2", ("gemma2",), hf_decoder_part()),
    _row("gemma3_text", ("gemma3_text",), hf_decoder_part()),
    _row("phi3", ("phi3",), hf_decoder_part(), lora=("qkv_proj", "o_proj")),
    _row("granite", ("granite",), hf_decoder_part()),
    _row("stablelm", ("stablelm",), hf_decoder_part()),
    _row("cohere", ("cohere",), hf_decoder_part()),
    _row("gpt2", ("gpt2",), hf_decoder_part(("transformer.h", "h"), "attn", "ln_1"), lora=("c_attn", "c_proj")),
    _row("gptj", ("gptj",), hf_decoder_part(("transformer.h", "h"), "attn", "ln_1"), lora=QKVO[:3] + ("out_proj",)),
    _row(
        "opt",
        ("opt",),
        hf_decoder_part(("model.decoder.layers", "decoder.layers"), "self_attn", "self_attn_layer_norm"),
        lora=QKVO[:3] + ("out_proj",),
        check=_check_opt,
    ),
    *(
        _row(name, (name,), hf_decoder_part(norm="post_attention_layernorm"), check=_refuse_post_norm(family))
        for name, family in (("olmo2", "OLMo 2"), ("olmo3", "OLMo 3"), ("exaone4", "EXAONE 4"))
    ),
    # Apertus: Llama's layout under other norm names
    _row("apertus", ("apertus",), hf_decoder_part(norm="attention_layernorm")),
    # LFM2: convolution and attention layers are one class; the attention layers are those with `self_attn`
    _row(
        "lfm2",
        ("lfm2",),
        PartSpec(
            "language",
            blocks=HF_DECODER_BLOCKS,
            attention="self_attn",
            norm="operator_norm",
            call=HF_CALL,
            contains="self_attn",
        ),
        lora=QKVO[:3] + ("out_proj",),
    ),
    # Phi: partial rotary inside attention, attention and MLP in parallel on one normed input (as GPT-J)
    _row("phi", ("phi",), hf_decoder_part(), lora=QKVO[:3] + ("dense",)),
    # DeepSeek-V2/V3 multi-head latent attention: x~ feeds q_a_proj (q_proj without q_lora_rank) and kv_a_proj
    _row(
        "deepseek_v2",
        ("deepseek_v2", "deepseek_v3"),
        hf_decoder_part(),
        lora=("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"),
    ),
    # Bamba: attention and Mamba layers are one class; the attention layers are those with `self_attn`
    _row(
        "bamba",
        ("bamba",),
        PartSpec(
            "language",
            blocks=HF_DECODER_BLOCKS,
            attention="self_attn",
            norm="input_layernorm",
            call=HF_CALL,
            contains="self_attn",
        ),
    ),
    *(
        register_host(
            HostSpec(
                name=name,
                description=f"transformers Falcon decoders, {what}",
                matches=partial(_is_falcon, ln_attn=ln_attn),
                parts=(hf_decoder_part(("transformer.h", "h"), "self_attention", norm),),
                embeddings=INPUT_EMBEDDINGS,
                lora_targets=("query_key_value", "dense"),
                checkpointing="transformers",
                output_heads=("lm_head",),
            )
        )
        for name, what, norm, ln_attn in (
            (
                "falcon",
                "input_layernorm -> self_attention (sequential, parallel, new architecture with one norm)",
                "input_layernorm",
                False,
            ),
            (
                "falcon_ln_attn",
                "new architecture with two norms (ln_attn -> self_attention, ln_mlp -> mlp)",
                "ln_attn",
                True,
            ),
        )
    ),
]
