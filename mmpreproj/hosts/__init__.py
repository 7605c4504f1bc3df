"""Host architectures: the table and one file per model family (importing a file adds its row)."""

# Each import registers its rows. timm_vit / open_clip never import timm or open_clip (an optional
# extra): they look classes up in sys.modules, as a model is only an instance of an imported library.
from . import (  # noqa: F401
    gpt_neox,
    native,
    open_clip,
    timm_variants,
    timm_vit,
    timm_windows,
    transformers_decoders,
    transformers_encoders,
    transformers_vision,
    transformers_vlm,
)
from .registry import HOSTS, HostSpec, find_host, get_host, register_host

__all__ = ["HOSTS", "HostSpec", "find_host", "get_host", "register_host"]
