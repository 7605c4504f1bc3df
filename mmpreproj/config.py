"""`PreProjConfig`: what to inject and how, validated up front and saved as JSON beside an adapter."""

from __future__ import annotations

from dataclasses import dataclass, field

from .jsonconfig import JsonConfig
from .modules.compute import COMPUTE_DTYPES
from .modules.preproj import ACTIVATIONS, PREPROJ_INITS
from .version import __version__

__all__ = ["PreProjConfig"]


@dataclass
class PreProjConfig(JsonConfig):
    """Configuration of the injected modules.

    Args:
        preproj: add the pre-projection `x~ = x^ + W_down·act(W_up·x^)` before Q/K/V.
        skip: add the content skip `W_skip·x~` beside the attention output.
        expansion: pre-projection inner width as a multiple of d (paper: 1.25).
        activation: pre-projection activation, one of "silu", "gelu", "relu".
        init: pre-projection init, "paper" (N(0, 0.01) both) or "identity" (`W_down` = 0).
        skip_init_std: std of the `W_skip` init (paper: 1e-4; 0 = exact zero).
        layers: block indices to inject into (None = every block; negative indices count from the end).
        freeze_base: freeze every parameter of the host so only injected weights train.
        fuse_qkv_skip: compute Q/K/V and the skip in one matmul where the host has a fast path
            (GPT-NeoX, native blocks); same outputs up to float rounding.
        compute_dtype: "input" (fp32 weights computing in the host's/autocast's dtype) or "float32".
    """

    preproj: bool = True
    skip: bool = True
    expansion: float = 1.25
    activation: str = "silu"
    init: str = "paper"
    skip_init_std: float = 1e-4
    layers: list[int] | None = None
    freeze_base: bool = True
    fuse_qkv_skip: bool = False
    compute_dtype: str = "input"
    library_version: str = field(default=__version__, compare=False)

    def __post_init__(self) -> None:
        if not (self.preproj or self.skip):
            raise ValueError("PreProjConfig: at least one of preproj=True or skip=True is required")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"PreProjConfig.activation={self.activation!r}; allowed values: {sorted(ACTIVATIONS)}"
            )
        if self.init not in PREPROJ_INITS:
            raise ValueError(f"PreProjConfig.init={self.init!r}; allowed values: {list(PREPROJ_INITS)}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(
                f"PreProjConfig.compute_dtype={self.compute_dtype!r}; allowed values: {list(COMPUTE_DTYPES)}"
            )
        if not self.expansion > 0:
            raise ValueError(f"PreProjConfig.expansion must be > 0, got {self.expansion}")
        if self.skip_init_std < 0:
            raise ValueError(f"PreProjConfig.skip_init_std must be >= 0, got {self.skip_init_std}")
        if self.layers is not None:
            if isinstance(self.layers, int) or not all(isinstance(i, int) for i in self.layers):
                raise ValueError(f"PreProjConfig.layers must be None or a list of ints, got {self.layers!r}")
            if len(set(self.layers)) != len(self.layers):
                raise ValueError(f"PreProjConfig.layers has duplicates: {self.layers}")
            self.layers = list(self.layers)

    def resolve_layers(self, num_blocks: int) -> list[int]:
        """The sorted, non-negative block indices this config selects in a host of `num_blocks` blocks."""
        if self.layers is None:
            return list(range(num_blocks))
        out = []
        for i in self.layers:
            j = i + num_blocks if i < 0 else i
            if not 0 <= j < num_blocks:
                raise ValueError(
                    f"PreProjConfig.layers contains {i}, but the model has {num_blocks} blocks "
                    f"(allowed: -{num_blocks}..{num_blocks - 1})"
                )
            out.append(j)
        if len(set(out)) != len(out):
            raise ValueError(f"PreProjConfig.layers selects a block twice: {self.layers}")
        return sorted(out)
