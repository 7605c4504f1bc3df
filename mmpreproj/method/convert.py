"""The one reader of older layouts: what mmpreproj wrote before its weights were keyed as the model keys them.

Older writers keyed an adapter's weights by the host's block index, in memory (`adapter_state_dict`) and in the
folders of mmpreproj <= 0.3 (`adapter_type: "mmpreproj"`, a nested `config`), and recorded `tensor_shapes` that way:

    blocks.3.preproj.up.weight          blocks.3.skip.proj.weight          modules.projector.linear_1.weight

The peft-layout folders of mmpreproj 0.4 keyed them by module path, the skip's slot named `skip`:

    gpt_neox.layers.3.attention.skip.proj.weight

Today's key of a weight is its module path as the model's `state_dict()` has it without the adapter name, each
slot named as in `PreProjAttention.adapter_layer_names` (`gpt_neox.layers.3.attention.preproj_skip.proj.weight`,
`multi_modal_projector.linear_1.weight`). `model_keys` maps the old keys onto a model's wrappers (by block index,
or by path for the old slot name) and onto its `modules_to_save` by name; keys already in today's layout pass
unchanged. Nothing here reads a model's modules by a name from a file: the table comes from the model's own
wrappers (or, for a file checked before injection, from the paths its own record lists).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

V = TypeVar("V")
LORA_SUBDIR = "lora"  # train()'s preproj_lora before 0.5: peft's LoRA in a folder below ours
OLD_SLOTS = {"preproj": "preproj", "skip": "preproj_skip"}  # old slot name -> today's (the wrapper's attribute)
SLOT_NAMES = {**OLD_SLOTS, "preproj_skip": "preproj_skip"}  # a slot's name in any layout -> today's


# mmpreproj <= 0.5 built `preproj_lora` with LoRA inside our wrapper, so LoRA's file keyed its weights there:
# `...attention.base_layer.q_proj.lora_A.weight` (a LoRA file holds no base weight of its own, so a `base_layer.`
# segment before a LoRA key is our wrapper's). Read as today's `...attention.q_proj.lora_A.weight` through peft's
# public `load_adapter(key_mapping=...)`; our weights such a file also holds are read from `preproj/` instead.
OLD_STACKED_LORA_KEYS = {r"\.base_layer\.(?=.*lora_)": "."}


def today_lora_key(key: str) -> str:
    """A LoRA file's key as today's (`OLD_STACKED_LORA_KEYS`)."""
    for pattern, replacement in OLD_STACKED_LORA_KEYS.items():
        key = re.sub(pattern, replacement, key, count=1)
    return key


def is_legacy_description(cfg: Mapping[str, Any]) -> bool:
    """Whether an `adapter_config.json` object is mmpreproj's old layout (a nested `config`, no `peft_type`)."""
    return "peft_type" not in cfg and "config" in cfg


def lora_below_ours(top: Path) -> Path:
    """Where train() before 0.5 put `preproj_lora`'s LoRA: peft's folder below ours at `top` (today: peft's LoRA at
    the top and ours in `preproj/`, `stacked.py`)."""
    return top / LORA_SUBDIR


def parse_block_key(key: str) -> tuple[int | None, str, str] | None:
    """(block index or None for a saved module, slot or module name, param) of an old key; None for another key."""
    kind, _, rest = key.partition(".")
    first, _, name = rest.partition(".")
    if kind == "blocks" and first.isdigit() and name:
        slot, _, param = name.partition(".")
        if slot in OLD_SLOTS and param:
            return int(first), slot, param
    if kind == "modules" and first and name:
        return None, first, name
    return None


def is_block_keyed(keys: Iterable[str]) -> bool:
    """Whether every key (at least one) is in the old block-index layout."""
    keys = list(keys)
    return bool(keys) and all(parse_block_key(k) is not None for k in keys)


def model_keys(
    tensors: Mapping[str, V], wrappers: Iterable[tuple[str, Any]], modules_to_save: Mapping[str, str]
) -> dict[str, V]:
    """`tensors` keyed as today (unchanged when they already are): old `blocks.{i}.{slot}.{param}` keys go to the
    wrapper of block i among `wrappers` ((path, wrapper with `block_index`)), old `modules.{name}.{param}` keys to
    the path of `modules_to_save[name]` (the longest name that prefixes the key: a name may hold dots). An old
    key with no such block or name is kept as it is, so the caller's key check names it."""
    wrappers = list(wrappers)
    if not is_block_keyed(tensors):
        return renamed_slots(tensors, [path for path, _ in wrappers])
    blocks = {w.block_index: path for path, w in wrappers}
    out = {}
    for key, value in tensors.items():
        index, slot, param = parse_block_key(key)
        if index is not None:
            out[f"{blocks[index]}.{OLD_SLOTS[slot]}.{param}" if index in blocks else key] = value
            continue
        name = max((n for n in modules_to_save if key.startswith(f"modules.{n}.")), key=len, default=None)
        out[f"{modules_to_save[name]}.{key[len(f'modules.{name}.') :]}" if name is not None else key] = value
    return out


def renamed_slots(tensors: Mapping[str, V], paths: Iterable[str], prefix: str = "") -> dict[str, V]:
    """`tensors` with a slot's old name under a wrapper path (`{prefix}{path}.skip.{param}`) replaced by
    today's (`{prefix}{path}.preproj_skip.{param}`); every other key unchanged."""
    heads = {f"{prefix}{path}.{old}.": f"{prefix}{path}.{new}." for path in paths for old, new in OLD_SLOTS.items()}
    out = {}
    for key, value in tensors.items():
        head = next((h for h in heads if key.startswith(h)), None)
        out[key if head is None else heads[head] + key[len(head) :]] = value
    return out


def named_slot_key(rest: str, wrapper: Any) -> str | None:
    """A key's remainder under an injected wrapper (`wrapper`, a `PreProjAttention`) in today's layout of the
    model's parameters, the adapter name in: the layout before adapters were keyed by name (`preproj.up.weight`,
    `skip.proj.weight`; mmpreproj 0.4's checkpoints and training state) gets the active adapter's name
    (`preproj.default.up.weight`, `preproj_skip.default.proj.weight`); a key already named passes unchanged.
    None when `rest` is not an injected weight's (the wrapped attention's own, e.g. a `skip` it has)."""
    slot, _, param = rest.partition(".")
    new = SLOT_NAMES.get(slot)
    if new is None or not param or (new != slot and hasattr(wrapper.base_layer, slot)):
        return None
    if param.partition(".")[0] in getattr(wrapper, new):
        return rest
    active = wrapper.active_adapters
    return f"{new}.{active[0]}.{param}" if active else None


def named_model_keys(tensors: Mapping[str, V], wrappers: Iterable[tuple[str, Any]]) -> dict[str, V]:
    """`tensors` keyed by the model's parameter names (a training checkpoint's trainable state) with every
    injected weight's key in today's layout (`named_slot_key`); other keys unchanged."""
    heads = {f"{path}.": w for path, w in wrappers}
    out = {}
    for key, value in tensors.items():
        head = max((h for h in heads if key.startswith(h)), key=len, default=None)
        named = named_slot_key(key[len(head) :], heads[head]) if head is not None else None
        out[key if named is None else head + named] = value
    return out
