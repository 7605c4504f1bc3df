"""The injected modules' sizes at a trainable budget: the one formula `PreProjConfig.for_budget` and the budget
study (`train/sizes.py`) use.

Per attention block (d = width, L blocks), with u = round(B / (2 d L)) units of 2*d*L weights each:
- skip alone: the rank-u skip's 2 u d per block; unreachable at u >= d (the full d x d skip is cheaper);
- pre-projection alone: inner width w = u (expansion w / d, a bottleneck below 1);
- both: the units split evenly, w = round(u / 2), skip rank u - w.
"""

from __future__ import annotations

import math
from typing import Any


def expansion_for_width(width: int, dim: int) -> float:
    """An expansion e with int(e * dim) == width (width / dim, nudged up where float rounding would cut it)."""
    e = width / dim
    while int(e * dim) < width:
        e = math.nextafter(e, math.inf)
    return e


def preproj_sizes(
    budget: int, *, dim: int, layers: int, preproj: bool = True, skip: bool = True
) -> dict[str, Any] | None:
    """{"expansion", "skip_rank"} (those of the modules asked for) at about `budget` trainable weights; None
    where the skip's rank would reach `dim`."""
    if not (preproj or skip):
        raise ValueError("preproj_sizes: ask for the pre-projection, the skip or both")
    units = max(1, round(budget / (2 * dim * layers)))
    if not preproj:
        return None if units >= dim else {"skip_rank": units}
    if not skip:
        return {"expansion": expansion_for_width(units, dim)}
    width = max(1, round(units / 2))
    rank = max(1, units - width)
    return None if rank >= dim else {"expansion": expansion_for_width(width, dim), "skip_rank": rank}
