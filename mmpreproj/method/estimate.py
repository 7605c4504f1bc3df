"""What a `PreProjConfig` costs: `estimate` on a named model shape, before any model is loaded, and
`trainable_report`, how many parameters an injected model holds and how many will train.

    print(mmpreproj.estimate(PreProjConfig(skip_rank=16, expansion=1 / 16), "llama-3-8b"))
    # llama-3-8b (32/32 blocks, d=4096): 71,303,168 trainable (pre-projection 67,108,864 + skip 4,194,304),
    # 0.888% of the base's ~8,030M; 1.14 GB as fp32 weights + gradients + AdamW

Per block: pre-projection 2*d*int(expansion*d), skip d*d (full) or 2*r*d (`skip_rank=r`). Memory is what
training holds per trainable weight: fp32 weight, fp32 gradient and AdamW's two fp32 moments, 16 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

from torch import nn

from ..modules import ContentSkip, PreProjection
from .config import PreProjConfig, check_layer_parts
from .layer import PreProjAttention

TRAIN_BYTES_PER_PARAM = 16  # fp32 weight 4 + fp32 gradient 4 + AdamW exp_avg 4 + exp_avg_sq 4


@dataclass(frozen=True)
class ModelShape:
    """A decoder's injection shape: blocks, width, and the base's own parameter count (published, rounded)."""

    layers: int
    dim: int
    base_params: int


SHAPES: MappingProxyType[str, ModelShape] = MappingProxyType(
    {
        "mini-pythia": ModelShape(4, 256, 7_353_856),  # assets/mini-pythia, counted
        "pythia-160m": ModelShape(12, 768, 162_000_000),
        "pythia-410m": ModelShape(24, 1024, 405_000_000),
        "llama-3.2-1b": ModelShape(16, 2048, 1_236_000_000),
        "llama-3-8b": ModelShape(32, 4096, 8_030_000_000),
    }
)


@dataclass(frozen=True)
class Estimate:
    """Trainable weights of a config on a shape, per slot, and the bytes training holds for them."""

    shape: str
    layers: int
    dim: int
    blocks: int  # blocks the config injects into
    preproj: int
    skip: int
    base_params: int

    @property
    def params(self) -> int:
        return self.preproj + self.skip

    @property
    def train_bytes(self) -> int:
        """fp32 weights + gradients + AdamW moments (16 bytes per trainable weight)."""
        return self.params * TRAIN_BYTES_PER_PARAM

    @property
    def percent(self) -> float:
        """Trainable weights as a percentage of the base's parameters."""
        return 100.0 * self.params / self.base_params

    def __str__(self) -> str:
        return (
            f"{self.shape} ({self.blocks}/{self.layers} blocks, d={self.dim}): {self.params:,} trainable "
            f"(pre-projection {self.preproj:,} + skip {self.skip:,}), {self.percent:.3g}% of the base's "
            f"~{self.base_params / 1e6:,.0f}M; {_bytes(self.train_bytes)} as fp32 weights + gradients + AdamW"
        )


def _bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def estimate(config: PreProjConfig, shape: str) -> Estimate:
    """The trainable count and training memory of `config` on the named `shape` (one of `SHAPES`).

    `config.layers` selects blocks as at inject time (a per-part dict is read for "language"); these shapes are
    text decoders of one part, so `parts` may be None or ["language"], and a per-part `layers` may name only
    "language" (another part is refused, as `inject` would).
    """
    if not isinstance(config, PreProjConfig):
        raise ValueError(f"estimate(config=...) takes a PreProjConfig, got {type(config).__name__}")
    if shape not in SHAPES:
        raise ValueError(f"estimate(shape={shape!r}); allowed values: {list(SHAPES)}")
    if config.parts not in (None, ["language"]):
        raise ValueError(
            f"estimate: PreProjConfig.parts={config.parts!r}, but {shape!r} is a text decoder of one part; allowed "
            "values: None or ['language']"
        )
    check_layer_parts(config, ["language"])
    s = SHAPES[shape]
    d = s.dim
    config.check_sizes(d)  # the ranges inject checks at this width (an inner width or skip rank it would refuse)
    blocks = len(config.resolve_layers(s.layers, "language"))
    preproj = PreProjection.num_params(d, config.expansion) if config.preproj and config.inner_width(d) else 0
    skip = ContentSkip.num_params(d, config.skip_rank) if config.skip else 0
    return Estimate(shape, s.layers, d, blocks, preproj * blocks, skip * blocks, s.base_params)


@dataclass(frozen=True)
class TrainableReport:
    """Parameter counts of a (possibly injected) model."""

    preproj: int
    skip: int
    trainable: int
    total: int
    parts: dict[str, int] = field(default_factory=dict)  # injected parameters per host part ("vision", ...)

    @property
    def injected(self) -> int:
        return self.preproj + self.skip

    @property
    def percent(self) -> float:
        return 100.0 * self.trainable / self.total if self.total else 0.0

    def __str__(self) -> str:
        return (
            f"trainable params: {self.trainable:,} || all params: {self.total:,} || "
            f"trainable%: {self.percent:.4f} || injected: pre-projection {self.preproj:,} + skip {self.skip:,}"
            + (" (" + ", ".join(f"{k} {v:,}" for k, v in self.parts.items()) + ")" if len(self.parts) > 1 else "")
        )


def trainable_report(model: nn.Module) -> TrainableReport:
    """Count injected (pre-projection, skip), trainable and total parameters (shared weights once)."""
    preproj = skip = 0
    parts: dict[str, int] = {}
    for w in model.modules():
        if isinstance(w, PreProjAttention):
            pre, skip_ = w.slots()  # the active adapter's
            a = sum(p.numel() for p in pre.parameters()) if pre is not None else 0
            b = sum(p.numel() for p in skip_.parameters()) if skip_ is not None else 0
            preproj, skip = preproj + a, skip + b
            parts[w.part] = parts.get(w.part, 0) + a + b
    params = list(model.parameters())  # nn.Module.parameters() already yields a shared weight once
    return TrainableReport(
        preproj=preproj,
        skip=skip,
        trainable=sum(p.numel() for p in params if p.requires_grad),
        total=sum(p.numel() for p in params),
        parts=parts,
    )
