"""Sizes at a parameter budget: the rank or width each method gets so its trainable count is about B.

    sizes_for_budget("preproj_skip", 73_500, dim=256, layers=4)   # {"expansion": 0.0703125, "skip_rank": 18}

Per block (d = width, L blocks): lora gets r * per_rank (GPT-NeoX query_key_value + dense: 6 d per block),
r = round(B / per_rank); the injected modules are sized by `method/config.py` (the formula
`PreProjConfig.for_budget` uses too): with u = B / (2 d L) "units", skip rank u, pre-projection width u, or
both split evenly.
"""

from __future__ import annotations

from typing import Any

from mmpreproj_tables.tables import BUDGET_METHODS

from ..method.config import preproj_sizes
from ..modules import ContentSkip, PreProjection
from .methods import METHOD_SPECS

SIZE_FIELDS = ("expansion", "skip_rank", "layers", "parts")  # TrainConfig's sizes of the injected modules


def sizes_for_method(method: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """`overrides` less the size fields `method` has no module for (a sweep or reproduction over several
    methods: `skip_rank` sizes the skip of those with one and leaves LoRA alone)."""
    spec = METHOD_SPECS[method]
    has = {
        "expansion": spec.preproj,
        "skip_rank": spec.skip,
        "layers": spec.preproj or spec.skip,
        "parts": spec.preproj or spec.skip,
    }
    return {k: v for k, v in overrides.items() if k not in has or has[k]}


def sizes_for_budget(
    method: str, budget: int, *, dim: int, layers: int, lora_per_rank: int | None = None
) -> dict[str, Any] | None:
    """TrainConfig size overrides putting `method` at about `budget` trainable weights; None where it cannot
    (a skip whose rank would reach d). `lora_per_rank`: LoRA weights per unit of rank (None = 6 d L)."""
    if method not in BUDGET_METHODS:
        raise ValueError(f"method={method!r}; allowed values: {list(BUDGET_METHODS)}")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget={budget!r}; must be an int >= 1 (trainable weights)")
    if method == "lora":
        return {"lora_r": max(1, round(budget / (lora_per_rank or 6 * dim * layers)))}
    spec = METHOD_SPECS[method]
    return preproj_sizes(budget, dim=dim, layers=layers, preproj=spec.preproj, skip=spec.skip)


def budget_params(
    sizes: dict[str, Any], method: str, *, dim: int, layers: int, lora_per_rank: int | None = None
) -> int:
    """The trainable count `sizes` gives `method` (the formulas of `sizes_for_budget`)."""
    if method == "lora":
        return sizes["lora_r"] * (lora_per_rank or 6 * dim * layers)
    n = PreProjection.num_params(dim, sizes["expansion"]) * layers if "expansion" in sizes else 0
    return n + (ContentSkip.num_params(dim, sizes["skip_rank"]) * layers if "skip_rank" in sizes else 0)
