"""Host architectures: the table and one file per model family (importing a file adds its row)."""

from . import gpt_neox  # noqa: F401  (registers the row)
from .registry import HOSTS, HostSpec, find_host, get_host, register_host

__all__ = ["HOSTS", "HostSpec", "find_host", "get_host", "register_host"]
