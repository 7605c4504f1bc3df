"""Host architectures: the table and one file per model family (importing a file adds its row)."""

from . import gpt_neox, native  # noqa: F401  (each import registers its row)
# timm_vit / open_clip never import timm or open_clip (an optional extra): they look classes up in
# sys.modules, as a model can only be an instance of a library that is already imported.
from . import open_clip, timm_vit  # noqa: F401
from .registry import HOSTS, HostSpec, find_host, get_host, register_host

__all__ = ["HOSTS", "HostSpec", "find_host", "get_host", "register_host"]
