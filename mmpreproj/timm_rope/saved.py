"""`add_rope` positions as JSON saved beside an adapter, and the check / restore when the adapter is loaded.

An adapter trained on a model with `add_rope` positions reproduces its outputs only on a model with the
same positions, so `save_adapter` writes `describe_rope(model)` as the "rope" entry of `adapter_config.json`
and `load_adapter` calls `rope_for_load` before it changes anything:

    saved  | the model             | load_adapter
    none   | no add_rope           | loads
    none   | has add_rope          | refuses: remove_rope(model) first
    rope   | the same add_rope     | loads
    rope   | other add_rope        | refuses, naming both
    rope   | no add_rope           | restores it (RoPE2D + GridPositions: the default and `rope_from_timm`'s),
           |                       | or refuses with the call to make (a custom encoder or positions function)
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from torch import nn

from ..rope import RoPE2D
from .add import _check, _kind, add_rope
from .grid import GridPositions


def _encoder(rope: nn.Module) -> dict[str, Any]:
    if type(rope) is RoPE2D:
        return {"class": "RoPE2D", "head_dim": rope.head_dim, "theta": float(rope.theta), "pairing": rope.pairing}
    return {"class": f"{type(rope).__module__}.{type(rope).__qualname__}", "custom": True}


def _positions(positions: Callable) -> dict[str, Any]:
    if type(positions) is GridPositions:
        ref = list(positions.ref_shape) if positions.ref_shape is not None else None
        return {"class": "GridPositions", "ref_shape": ref, "offset": float(positions.offset), "xy": positions.xy}
    kind = type(positions)  # a function names itself, any other callable its class
    module = getattr(positions, "__module__", None) or kind.__module__
    return {"class": f"{module}.{getattr(positions, '__qualname__', kind.__qualname__)}", "custom": True}


def describe_rope(model: nn.Module) -> dict[str, Any] | None:
    """The JSON-able description of `model`'s `add_rope` positions, or None without them."""
    state = getattr(model, "mmpreproj_rope", None)
    if state is None:
        return None
    desc = {"kind": state.kind, "rope": _encoder(state.rope), "positions": _positions(state.positions),
            "abs_pos_removed": state.pos_embed is not None}  # fmt: skip
    return json.loads(json.dumps(desc))  # tuples -> lists, as a reloaded file has them


def _check_saved_values(rope_d: dict, pos_d: dict, model: nn.Module, where: str) -> None:
    """Each saved value has its type and range (the file is data: a huge head_dim must not allocate)."""
    head_dims = {getattr(b.attn, "head_dim", None) for b in getattr(model, "blocks", [])}
    ref = pos_d.get("ref_shape")
    rules = [
        (
            "rope.head_dim",
            rope_d.get("head_dim"),
            type(rope_d.get("head_dim")) is int and rope_d["head_dim"] in head_dims,
            f"the model's head_dim {sorted(h for h in head_dims if h is not None)}",
        ),
        ("rope.theta", rope_d.get("theta"), _finite(rope_d.get("theta")) and rope_d["theta"] > 0, "a number > 0"),
        (
            "rope.pairing",
            rope_d.get("pairing"),
            rope_d.get("pairing") in ("interleaved", "half"),
            "'interleaved' or 'half'",
        ),
        (
            "positions.ref_shape",
            ref,
            ref is None
            or (isinstance(ref, list) and len(ref) == 2 and all(type(v) is int and 0 < v <= 1 << 16 for v in ref)),
            "null or two ints in 1..65536",
        ),
        ("positions.offset", pos_d.get("offset"), _finite(pos_d.get("offset")), "a finite number"),
        ("positions.xy", pos_d.get("xy"), type(pos_d.get("xy")) is bool, "true or false"),
    ]
    for name, value, ok, rule in rules:
        if not ok:
            raise ValueError(f"{where}: corrupt 'rope' entry: {name}={value!r}; must be {rule}")


def _finite(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def rope_for_load(model: nn.Module, saved: dict[str, Any] | None, where: str) -> Callable[[], None] | None:
    """Check `model`'s positions against the `saved` description (see the module docstring), changing nothing.

    Returns None when they agree, or the `add_rope` call that restores the saved positions (to run once the
    adapter is in); raises ValueError naming what to do otherwise. `where` names the adapter in the errors.
    """
    have = describe_rope(model)
    if saved is None:
        if have is not None:
            raise ValueError(f"{where} was saved from a model without add_rope positions, this model has them; "
                             "call mmpreproj.timm_rope.remove_rope(model) first")  # fmt: skip
        return None
    if (
        not isinstance(saved, dict)
        or not {"kind", "rope", "positions", "abs_pos_removed"} <= set(saved)
        or not (
            isinstance(saved["rope"], dict)
            and isinstance(saved["positions"], dict)
            and type(saved["abs_pos_removed"]) is bool
            and saved["kind"] in ("vit", "eva")
        )
    ):
        raise ValueError(f"{where}: corrupt 'rope' entry {str(saved)[:200]}")
    if have is not None:
        if have != saved:
            raise ValueError(f"{where} was saved with add_rope positions {saved}, this model has {have}")
        return None
    rope_d, pos_d = saved["rope"], saved["positions"]
    if rope_d.get("class") != "RoPE2D" or pos_d.get("class") != "GridPositions":
        raise ValueError(
            f"{where} was saved from a model with add_rope(rope={rope_d['class']}, positions={pos_d['class']}), "
            "which the file cannot rebuild: call mmpreproj.timm_rope.add_rope(model, rope, positions=..., "
            f"keep_abs_pos={not saved['abs_pos_removed']}) with the same ones first, then load_adapter"
        )
    kind = _kind(model)
    if kind != saved["kind"]:
        raise ValueError(f"{where} was saved with add_rope on a timm {saved['kind']!r} model, this one is {kind!r}")
    _check_saved_values(rope_d, pos_d, model, where)
    rope = RoPE2D(rope_d["head_dim"], theta=float(rope_d["theta"]), pairing=rope_d["pairing"])
    ref = pos_d["ref_shape"]
    positions = GridPositions(tuple(ref) if ref is not None else None, float(pos_d["offset"]), pos_d["xy"])
    _check(model, kind, rope)  # every reason add_rope would refuse, before the adapter goes in
    keep = not saved["abs_pos_removed"]

    def restore() -> None:
        add_rope(model, rope, positions=positions, keep_abs_pos=keep)

    return restore
