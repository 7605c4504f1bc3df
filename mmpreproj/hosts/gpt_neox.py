"""GPT-NeoX / Pythia (transformers): `attention(input_layernorm(h))`, both residual layouts.

Sequential:  h = h + attn(x~) + W_skip·x~ ;  h = h + mlp(ln2(h))
Parallel:    h = h + attn(x~) + W_skip·x~ + mlp(ln2(h))     (the MLP never sees x~)
The skip is added to the attention output, so it passes `post_attention_dropout` with it
(Pythia's hidden_dropout is 0).
"""

from __future__ import annotations

from torch import nn

from ..fused.gpt_neox import neox_fused_forward
from ..modules.wrapper import AttentionCall
from .registry import HostSpec, register_host

__all__ = ["GPT_NEOX"]


def _is_gpt_neox(model: nn.Module) -> bool:
    return getattr(getattr(model, "config", None), "model_type", None) == "gpt_neox"


def _blocks(model: nn.Module) -> list[nn.Module]:
    base = getattr(model, "gpt_neox", model)  # GPTNeoXForCausalLM / ...ForSequenceClassification / GPTNeoXModel
    return list(base.layers)


GPT_NEOX = register_host(
    HostSpec(
        name="gpt_neox",
        description="transformers GPT-NeoX / Pythia models",
        matches=_is_gpt_neox,
        blocks=_blocks,
        attention="attention",
        hidden_size=lambda model, block: model.config.hidden_size,
        call=AttentionCall(inputs=((0, "hidden_states"),), output_index=0),
        input_embeddings=lambda model: model.get_input_embeddings(),
        fused_forward=neox_fused_forward,
    )
)
