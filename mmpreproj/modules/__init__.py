"""The injected modules: pre-projection, content skip, and the attention wrapper that joins them."""

from .preproj import ACTIVATIONS, PREPROJ_INITS, PreProjection
from .skip import ContentSkip
from .wrapper import AttentionCall, PreProjAttention

__all__ = ["ACTIVATIONS", "PREPROJ_INITS", "AttentionCall", "ContentSkip", "PreProjAttention", "PreProjection"]
