"""Fast paths: Q/K/V and the content skip in one matmul, per host (equivalence-tested against the plain path)."""

from .gpt_neox import neox_fused_forward
from .native import native_fused_forward
from .qkv_skip import QKVSkipWeights, qkv_and_skip

__all__ = ["QKVSkipWeights", "native_fused_forward", "neox_fused_forward", "qkv_and_skip"]
