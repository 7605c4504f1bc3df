"""GPT-NeoX / Pythia (transformers): `attention(input_layernorm(h))`, both residual layouts.

Sequential:  h = h + attn(x~) + W_skip·x~ ;  h = h + mlp(ln2(h))
Parallel:    h = h + attn(x~) + W_skip·x~ + mlp(ln2(h))     (the MLP never sees x~)
The skip is added to the attention output, so it passes `post_attention_dropout` with it
(Pythia's hidden_dropout is 0).
"""

from __future__ import annotations

from .paths import INPUT_EMBEDDINGS
from .registry import register_host
from .spec import AttentionCall, HostSpec, PartSpec

GPT_NEOX = register_host(
    HostSpec(
        name="gpt_neox",
        description="transformers GPT-NeoX / Pythia models",
        model_types=("gpt_neox",),
        parts=(
            PartSpec(
                "language",
                blocks=("gpt_neox.layers", "layers"),  # *ForCausalLM / *ForSequenceClassification, GPTNeoXModel
                attention="attention",
                norm="input_layernorm",
                call=AttentionCall(inputs=((0, "hidden_states"),), output_index=0),
            ),
        ),
        embeddings=INPUT_EMBEDDINGS,
        lora_targets=("query_key_value", "dense"),  # `dense` is the attention output projection
        checkpointing="transformers",
        output_heads=("embed_out", "lm_head"),  # transformers 4.x named the head embed_out, 5.x lm_head
    )
)
