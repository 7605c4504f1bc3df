"""`trainable_report`: how many parameters were injected and how many will train."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from ..modules import PreProjAttention


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
