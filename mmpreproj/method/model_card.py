"""What an adapter file says about where it belongs (base model, class, name, parameter counts), and the
peft-style model card (README.md, a `huggingface_hub.ModelCard`) `save_adapter(..., readme=True)` writes beside
the files: `base_model`, `library_name: peft`, the method and its trainable-parameter counts.

Every value the card takes from the adapter's description is data: each YAML header value is a JSON
scalar or list (JSON is YAML, and a quoted string cannot end the header or add a key), and in the Markdown
body a value is one line (`_one_line`), so a base model named "x
---
foo: bar" stays a name.
"""

from __future__ import annotations

import json

from huggingface_hub import ModelCard
from torch import nn


def base_model_name(model: nn.Module) -> str | None:
    """The base's hub id or folder as transformers recorded it (`name_or_path`), None when unknown."""
    name = getattr(model, "name_or_path", None) or getattr(getattr(model, "config", None), "name_or_path", None)
    return str(name) if name else None


def base_model_type(model: nn.Module) -> str | None:
    """transformers' `config.model_type` of the base ("llama", "qwen2_vl"); None for a model without one (timm,
    open_clip, a module built in code)."""
    kind = getattr(getattr(model, "config", None), "model_type", None)
    return kind if isinstance(kind, str) and kind else None


def card_fields(model: nn.Module, adapter_name: str, injected: int, modules_to_save: int) -> dict:
    """The keys `save_adapter` adds to `adapter_config.json` (beside `InjectionState.describe()`): the base, the
    adapter's name and its counts of injected and `modules_to_save` weights."""
    return {
        "base_model_name_or_path": base_model_name(model),  # peft's name for the same fact
        "base_model_class": type(model).__name__,
        "base_model_type": base_model_type(model),  # a loader warns on a model of another type (`load_check`)
        "adapter_name": adapter_name,
        "trainable_parameters": {"injected": injected, "modules_to_save": modules_to_save},
    }


def _method(config: dict) -> str:
    kinds = [k for k, on in (("pre-projection", config.get("preproj")), ("content skip", config.get("skip"))) if on]
    text = " + ".join(kinds) or "none"
    if config.get("preproj"):
        text += f" (expansion {config.get('expansion')}, activation {config.get('activation')!r})"
    return text


def _quoted(text: str) -> str:
    """`text` as a JSON string literal that is also YAML's and stays on one line: JSON's escapes, plus
    `\\uXXXX` / `\\UXXXXXXXX` for every character that is not printable (U+0085, U+2028 and the like break lines
    for some readers). Printable non-ASCII stays as it is (PyYAML cannot read JSON's surrogate pairs)."""
    return "".join(
        c if c.isprintable() else (f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}")
        for c in json.dumps(text, ensure_ascii=False)
    )


def _one_line(value: object) -> str:
    """`value` as text on one line for the Markdown body: control characters escaped as in `_quoted`."""
    return _quoted(str(value))[1:-1]


def _yaml_value(value: object) -> str:
    if isinstance(value, str):
        return _quoted(value)
    if isinstance(value, list):
        return "[" + ", ".join(_yaml_value(v) for v in value) + "]"
    return json.dumps(value)  # numbers, booleans, null


def yaml_header(fields: dict[str, object]) -> list[str]:
    """The card's front matter lines, "---" to "---": each value a JSON literal (strings quoted), so no value
    can end the header or add a key."""
    return ["---", *(f"{key}: {_yaml_value(value)}" for key, value in fields.items()), "---"]


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
    header = {"base_model": base} if base else {}
    header.update(library_name="peft", tags=["mmpreproj", "peft", "preproj", "pre-projection", "content-skip"])
    lines = [
        *yaml_header(header),
        "",
        "# mmpreproj adapter",
        "",
        "Position-agnostic pre-projection and content skip for attention (arXiv 2604.10791).",
        "",
        f"- base model: `{_one_line(base or 'unknown')}` ({_one_line(desc.get('base_model_class', 'unknown class'))})",
        f"- method: {_one_line(tag) + ': ' if tag else ''}{_one_line(_method(config))}",
        f"- host row: `{_one_line(desc.get('host'))}`; parts: {_one_line(parts)}",
        f"- trainable parameters: {_count(counts.get('injected'))} injected"
        + (
            f" + {_count(counts['modules_to_save'])} in modules_to_save {sorted(desc.get('modules_to_save') or {})}"
            if counts.get("modules_to_save")
            else ""
        ),
        f"- adapter name: `{_one_line(desc.get('adapter_name', 'default'))}`; "
        f"mmpreproj {_one_line(desc.get('library_version'))}",
        "",
        "## Load",
        "",
        "```python",
        "import mmpreproj  # registers peft_type PREPROJ with peft; import it before peft reads this folder",
        "",
        f'model = mmpreproj.from_pretrained({_quoted(base or "BASE")}, adapter="THIS_FOLDER")',  # a Python literal
        '# or: peft.PeftModel.from_pretrained(base_model, "THIS_FOLDER")',
        "```",
        "",
    ]
    text = "\n".join(lines)
    ModelCard(text, ignore_metadata_errors=False)  # the Hub's own parser must read the header (raises if not)
    return text  # as written: the Hub's re-dump would fold values and turn U+0085 into a space
