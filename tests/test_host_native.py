"""The `mmpreproj_block` row (models built from our own `Block`) through the shared contract.

Two stacks: an encoder (bidirectional, 2D RoPE over a 3x5 patch grid, one class token left unrotated) and a
causal decoder with 1D RoPE. `Block` calls `attn(norm1(x), ...)` and gets a tensor (output_index None).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from mmpreproj import RoPE1D, RoPE2D, grid_positions
from mmpreproj.modules import Block
from tests.helpers.host_contract import HostCase, HostContract

HEADS = 4


class BlockStack(nn.Module):
    """A minimal model of `Block`s; `set_grad_checkpointing` as timm's models have it (non-reentrant)."""

    def __init__(self, width: int, depth: int, rope: nn.Module, causal: bool, num_prefix_tokens: int = 0) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, HEADS, rope=rope, causal=causal) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.num_prefix_tokens = num_prefix_tokens  # leading tokens the rope leaves unrotated (class token)
        self.grad_checkpointing = False

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:  # x: (B, N, d)
            if self.grad_checkpointing:
                x = checkpoint(block, x, pos, self.num_prefix_tokens, use_reentrant=False)
            else:
                x = block(x, pos, self.num_prefix_tokens)
        return self.norm(x)


def _encoder(width=64, depth=2, seed=0):
    torch.manual_seed(seed)
    return BlockStack(width, depth, RoPE2D(width // HEADS), causal=False, num_prefix_tokens=1).eval()


def _decoder(width=64, depth=2, seed=0):
    torch.manual_seed(seed)
    return BlockStack(width, depth, RoPE1D(width // HEADS), causal=True).eval()


def _grid_inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, 1 + 15, 64, generator=g), grid_positions(3, 5)  # class token + 3x5 patches


def _seq_inputs():
    g = torch.Generator().manual_seed(2)
    return torch.randn(2, 9, 64, generator=g), torch.arange(9)


CASES = [
    HostCase("native_encoder_rope2d", "mmpreproj_block", _encoder, _grid_inputs),
    HostCase("native_decoder_rope1d", "mmpreproj_block", _decoder, _seq_inputs),
]


@pytest.fixture(params=CASES, ids=[c.id for c in CASES])
def case(request):
    return request.param


class TestContract(HostContract):
    pass
