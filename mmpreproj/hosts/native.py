"""mmpreproj's own `Block` (modules/block.py): any model built from it, for any modality."""

from __future__ import annotations

from ..modules.block import Block
from .registry import register_host
from .spec import AttentionCall, HostSpec, PartSpec

NATIVE = register_host(
    HostSpec(
        name="mmpreproj_block",
        description="models built from mmpreproj.modules.Block (native ViT / video / decoder stacks)",
        matches=lambda model: isinstance(model, Block) or any(isinstance(m, Block) for m in model.modules()),
        parts=(
            PartSpec(
                "blocks",
                blocks=("*:Block",),  # every Block in module order (a bare Block is its own only block)
                attention="attn",
                norm="norm1",
                call=AttentionCall(inputs=((0, "x"),), output_index=None),
                width="attn.qkv",
            ),
        ),
        lora_targets=("qkv", "proj"),
    )
)
