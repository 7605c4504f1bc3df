"""Named presets as `TrainConfig`s: the table itself is plain data in `mmpreproj_tables/tables.py` (`PRESETS`, with
the paper's protocol and why each CPU preset is sized as it is), so `mmpreproj --help` lists them without
loading torch."""

from __future__ import annotations

from typing import Any

from mmpreproj_tables.tables import PRESETS, TRAINS_ON_VALIDATION

from .config import TrainConfig


def ppl_split_for(preset: str) -> str:
    """The WikiText split a preset's line PPL is measured on: "test" when it trains on validation lines."""
    return "test" if preset in TRAINS_ON_VALIDATION else "validation"


def get_preset(name: str, **overrides: Any) -> TrainConfig:
    """The preset `name` as a validated `TrainConfig`, with `overrides` applied (e.g. method, out)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; allowed values: {sorted(PRESETS)}")
    return TrainConfig(**{**PRESETS[name], "preset": name, **overrides})
