"""The injected modules: pre-projection, content skip, and the attention wrapper that joins them."""

from .base_wrapper import BaseLayerWrapper
from .block import Block, KVCache, Mlp, SelfAttention
from .preproj import ACTIVATIONS, PREPROJ_INITS, PreProjection
from .skip import ContentSkip
from .wrapper import AttentionCall, PreProjAttention

__all__ = [
    "ACTIVATIONS",
    "PREPROJ_INITS",
    "AttentionCall",
    "BaseLayerWrapper",
    "Block",
    "ContentSkip",
    "KVCache",
    "Mlp",
    "PreProjAttention",
    "PreProjection",
    "SelfAttention",
]
