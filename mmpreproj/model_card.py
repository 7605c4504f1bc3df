"""What an adapter file says about where it belongs (base model, class, name, parameter counts), and the
short peft-style model card (README.md) `save_adapter(..., readme=True)` writes beside the files."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["card_fields", "model_card"]


def base_model_name(model: nn.Module) -> str | None:
    """The base's hub id or folder as transformers recorded it (`name_or_path`), None when unknown."""
    name = getattr(model, "name_or_path", None) or getattr(
        getattr(model, "config", None), "_name_or_path", None
    )
    return str(name) if name else None


def card_fields(model: nn.Module, adapter_name: str, tensors: dict[str, torch.Tensor], state) -> dict:
    """The keys `save_adapter` adds to `adapter_config.json` (beside `InjectionState.describe()`)."""
    injected = sum(v.numel() for k, v in tensors.items() if k.startswith("blocks."))
    return {
        "base_model_name_or_path": base_model_name(model),  # peft's name for the same fact
        "base_model_class": type(model).__name__,
        "adapter_name": adapter_name,
        "trainable_parameters": {
            "injected": injected,
            "modules_to_save": sum(v.numel() for k, v in tensors.items() if k.startswith("modules.")),
        },
    }


def _method(config: dict) -> str:
    kinds = [
        k for k, on in (("pre-projection", config.get("preproj")), ("content skip", config.get("skip"))) if on
    ]
    text = " + ".join(kinds) or "none"
    if config.get("preproj"):
        text += f" (expansion {config.get('expansion')}, activation {config.get('activation')!r})"
    return text


def _count(n: object) -> str:
    return f"{n:,}" if isinstance(n, int) else "?"


def model_card(desc: dict) -> str:
    """A README.md for an adapter folder from its `adapter_config.json` content (read tolerantly)."""
    config = desc.get("config") or {}
    base = desc.get("base_model_name_or_path")
    tag = desc.get("method") or desc.get("adapter_type")
    counts = desc.get("trainable_parameters") or {}
    parts = (
        ", ".join(
            f"{p.get('name')} (blocks {p.get('layers')} of {p.get('num_blocks')})"
            for p in desc.get("parts", [])
            if isinstance(p, dict)
        )
        or "-"
    )
    front = ["---", "library_name: mmpreproj", "tags: [mmpreproj, pre-projection, content-skip]"]
    if base:
        front.insert(1, f"base_model: {base}")
    lines = [
        *front,
        "---",
        "",
        "# mmpreproj adapter",
        "",
        "Position-agnostic pre-projection and content skip for attention (arXiv 2604.10791).",
        "",
        f"- base model: `{base or 'unknown'}` ({desc.get('base_model_class', 'unknown class')})",
        f"- method: {tag + ': ' if tag else ''}{_method(config)}",
        f"- host row: `{desc.get('host')}`; parts: {parts}",
        f"- trainable parameters: {_count(counts.get('injected'))} injected"
        + (
            f" + {_count(counts['modules_to_save'])} in modules_to_save {sorted(desc.get('modules_to_save') or {})}"
            if counts.get("modules_to_save")
            else ""
        ),
        f"- adapter name: `{desc.get('adapter_name', 'default')}`; mmpreproj {desc.get('library_version')}",
        "",
        "## Load",
        "",
        "```python",
        "import mmpreproj",
        "",
        f'model = mmpreproj.from_pretrained("{base or "BASE"}", adapter="THIS_FOLDER")',
        "```",
        "",
    ]
    return "\n".join(lines)
