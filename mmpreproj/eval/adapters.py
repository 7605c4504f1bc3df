"""Several adapters of one base scored in one process: the base is loaded once, each adapter is put on,
evaluated and taken off again (which restores the base exactly), then the next.

    results = evaluate_adapters(base, tok, ["runs/a", "runs/b"], tasks=["ppl"], limit=50)
    print(adapters_table(results))      # one row per adapter
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from ..method.apply import unload
from ..method.load import load_adapter
from ..method.state import is_injected
from .evaluate import evaluate


def take_off_adapters(model: nn.Module) -> nn.Module:
    """The base again: peft's LoRA layers removed (not merged), then the mmpreproj modules unloaded."""
    if hasattr(model, "peft_config") and hasattr(model, "unload") and hasattr(model, "get_base_model"):
        model = model.unload()  # peft: the base model, its LoRA layers replaced by the originals
    if is_injected(model):
        unload(model)
    return model


def evaluate_adapters(
    model: nn.Module,
    tokenizer: Any,
    adapters: Sequence[str | Path],
    *,
    load: Callable[[nn.Module, str | Path], nn.Module] | None = None,
    **evaluate_kwargs: Any,
) -> dict[str, dict[str, dict[str, Any]]]:
    """{adapter (as given): `evaluate(...)` of the base with that adapter} for each adapter in turn.

    `load(model, adapter)` puts one on (default `mmpreproj.load_adapter`: any trained folder, ours or
    peft's); between adapters it is taken off with `take_off_adapters`. The base
    must come in without adapters and leaves without them, also when an evaluation fails.
    """
    if load is None:
        load = load_adapter
    names = [str(a) for a in adapters]
    if len(set(names)) != len(names):
        raise ValueError(f"adapters: {names} names one adapter twice")
    if is_injected(model) or hasattr(model, "peft_config"):
        raise ValueError("evaluate_adapters: pass the base without adapters (each one is loaded in turn)")
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for name in names:
        with_adapter = load(model, name)
        try:
            results[name] = evaluate(with_adapter, tokenizer, **evaluate_kwargs)
        finally:
            model = take_off_adapters(with_adapter)
    return results


def adapters_table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    """A markdown table: one row per adapter, one column per (task, metric) whose value is a float (the counts
    `evaluate` also returns, such as `rows`, `tokens` and `correct`, are left out)."""
    columns: list[tuple[str, str]] = []
    for res in results.values():
        for task, metrics in res.items():
            for k, v in metrics.items():
                if isinstance(v, float) and (task, k) not in columns:
                    columns.append((task, k))
    head = "| adapter | " + " | ".join(f"{t} {k}" for t, k in columns) + " |"
    rule = "|---|" + "---|" * len(columns)
    rows = []
    for name, res in results.items():
        cells = []
        for t, k in columns:
            v = res.get(t, {}).get(k)
            cells.append(f"{v:.4g}" if isinstance(v, float) else "-")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join([head, rule, *rows])
