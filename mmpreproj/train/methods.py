"""The five frozen-probe methods of the paper, applied to a host model, and their trainable-parameter counts.

| method        | what trains                                                      | 160M    | 410M    |
|---------------|------------------------------------------------------------------|---------|---------|
| preproj       | pre-projection (mmpreproj.inject, skip=False)                    | 17.7M   | 62.9M   |
| skip          | content skip only (preproj=False)                                | 7.1M    | 25.2M   |
| preproj_skip  | pre-projection + content skip                                    | 24.8M   | 88.1M   |
| lora          | peft LoRA on query_key_value + dense, r = int(P / (L*2*d*2))     | 26.5M   | 94.4M   |
| preproj_lora  | pre-projection + LoRA r=64, alpha=128 on the same modules        | 21.2M   | 72.4M   |
| lora_matched  | LoRA as `lora`, r = round(preproj_skip params / (6*d*L)) (ours)  | 24.8M   | 88.1M   |

P = 2*d*int(1.25d)*L is the pre-projection's parameter count, so r = 480 (d=768, L=12) and 640 (d=1024, L=24);
LoRA uses alpha = 2r and dropout 0 (peft, as the paper). `lora_matched` is not in the paper: its rank makes
LoRA's trainable count equal pre-proj + skip's within one rank step (r = 448 at 160M, 597 at 410M, 149 on mini).

The table of methods itself (`METHOD_SPECS`, `MethodSpec`, `METHODS`) is plain data in `mmpreproj_tables/tables.py`,
so `mmpreproj train --help` lists the methods without loading torch; this module applies them.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import AutoModelForCausalLM

from mmpreproj_tables.tables import METHOD_SPECS, METHODS, MethodSpec

from ..hosts import find_host
from ..hosts.lora import lora_params_per_rank, peft_target_modules
from ..hosts.shape import host_shape
from ..method.config import PreProjConfig
from ..method.inject import inject
from ..method.stacked import stacked_peft_model
from ..modules import ContentSkip, PreProjection


def check_methods(names: Sequence[str]) -> tuple[str, ...]:
    """`names` as a tuple, or ValueError naming the first unknown or repeated one and the allowed values."""
    if isinstance(names, str):
        raise ValueError(f"methods={names!r}: pass a list of names, e.g. ['preproj_skip', 'lora']")
    names = list(names)
    for i, name in enumerate(names):
        if name not in METHOD_SPECS:
            raise ValueError(f"unknown method {name!r}; allowed values: {list(METHODS)}")
        if name in names[:i]:
            raise ValueError(f"method {name!r} is named twice; each method is one arm")
    return tuple(names)


def _spec(method: str) -> MethodSpec:
    if method not in METHOD_SPECS:
        raise ValueError(f"method={method!r}; allowed values: {list(METHODS)}")
    return METHOD_SPECS[method]


def preproj_params(hidden_size: int, num_layers: int, expansion: float = 1.25) -> int:
    """Pre-projection parameters over all layers: 2 * d * int(expansion * d) * L (`PreProjection.num_params`)."""
    return PreProjection.num_params(hidden_size, expansion) * num_layers


def paper_lora_rank(hidden_size: int, num_layers: int, expansion: float = 1.25) -> int:
    """The paper's LoRA rank: int(preproj_params / (L * 2 * d * 2)) -> 480 at d=768, 640 at d=1024."""
    return int(preproj_params(hidden_size, num_layers, expansion) / (num_layers * 2 * hidden_size * 2))


def matched_lora_rank(
    hidden_size: int, num_layers: int, expansion: float = 1.25, *, per_rank: int | None = None
) -> int:
    """The LoRA rank whose trainable count (r * per_rank) is nearest pre-proj + skip's (`P + d*d*L`).

    `per_rank`: LoRA parameters per unit of rank on the host (`hosts.lora.lora_params_per_rank`); None =
    GPT-NeoX's 6d per block.
    """
    target = preproj_params(hidden_size, num_layers, expansion) + ContentSkip.num_params(hidden_size) * num_layers
    return max(1, round(target / (per_rank or 6 * hidden_size * num_layers)))


_RANK_RULES = {"paper": paper_lora_rank, "matched": matched_lora_rank}


def resolve_lora(
    method: str,
    hidden_size: int,
    num_layers: int,
    r: int | None = None,
    alpha: int | None = None,
    *,
    per_rank: int | None = None,
) -> tuple[int, int]:
    """(rank, alpha) a LoRA method uses: the overrides, else the paper's (r by the rule or 64, alpha = 2r).

    `per_rank`: the host's LoRA parameters per unit of rank (the "matched" rule; None = GPT-NeoX's 6dL).
    """
    spec = _spec(method)
    if not spec.lora:
        raise ValueError(f"method {method!r} has no LoRA")
    if r is None:
        if spec.lora_rank == "matched":
            r = matched_lora_rank(hidden_size, num_layers, per_rank=per_rank)
        else:
            rule = _RANK_RULES.get(spec.lora_rank)  # type: ignore[arg-type]
            r = rule(hidden_size, num_layers) if rule else int(spec.lora_rank)
    return r, 2 * r if alpha is None else alpha


def lora_per_rank(model: nn.Module) -> int | None:
    """LoRA parameters per unit of rank on `model`'s row targets (the registry's error when no row knows it)."""
    return lora_params_per_rank(model, find_host(model))


def apply_method(
    model: nn.Module,
    method: str,
    *,
    lora_r: int | None = None,
    lora_alpha: int | None = None,
    sizes: dict[str, Any] | None = None,
) -> nn.Module:
    """Freeze `model` and add what `method` trains; returns the model to train (a `PeftModel` for LoRA methods).

    `sizes`: `PreProjConfig` size fields for the injected modules (expansion, skip_rank, layers, parts;
    `TrainConfig.preproj_sizes`); None = the paper's sizes.

    For "preproj_lora" peft's LoRA goes in first, in the stacked class (`method/stacked.py`), then the
    pre-projection around the attention modules that hold it; the class's `save_pretrained` alone writes both: the
    LoRA at the folder, ours in `preproj/`.
    """
    spec = _spec(method)
    ours = None
    if spec.preproj or spec.skip:
        ours = PreProjConfig(preproj=spec.preproj, skip=spec.skip, freeze_base=True, **(sizes or {}))
    if not spec.lora:
        return model if ours is None else inject(model, ours)
    r, alpha = resolve_lora(method, *host_shape(model), lora_r, lora_alpha, per_rank=lora_per_rank(model))
    lora = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=lora_targets(model), bias="none")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is deprecated.*", category=FutureWarning)
        if ours is not None:  # saved and loaded as one folder: LoRA at the top, ours in preproj/
            return stacked_peft_model(model, lora, ours)  # LoRA's layers first, ours around the attention
        return get_peft_model(model, lora)


def lora_targets(model: nn.Module) -> list[str]:
    """peft `target_modules` for this host: the row's attention targets (exact names where a short name
    would also hit the MLP, as GPT-2's `c_proj`). No fallback: a model no row knows is the registry's error
    (how to describe it), a row naming no targets `hosts.lora`'s."""
    return peft_target_modules(model, find_host(model))


def count_trainable(model: nn.Module) -> int:
    """Number of parameters with requires_grad (a shared weight counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def expected_trainable(
    method: str,
    hidden_size: int | None = None,
    num_layers: int | None = None,
    *,
    lora_r: int | None = None,
    model: nn.Module | None = None,
) -> int:
    """The count `apply_method` gives, from the formulas alone.

    Pre-projection `2*d*int(1.25*d)` per block, skip `d*d`. LoRA: `r*(in + out)` summed over the host row's target
    modules when `model` is given (read off the real modules: Llama's GQA k/v, GPT-2's Conv1D `c_attn`; d
    and L then come from the model too), else GPT-NeoX's `r*(d + 3*d)` on query_key_value plus `r*(d + d)` on dense.
    """
    spec = _spec(method)
    per_rank = None
    if model is not None:
        hidden_size, num_layers = host_shape(model)
        per_rank = lora_per_rank(model) if spec.lora else None
    if hidden_size is None or num_layers is None:
        raise ValueError("expected_trainable needs hidden_size and num_layers, or model=")
    d, layers = hidden_size, num_layers
    n = preproj_params(d, layers) if spec.preproj else 0
    n += ContentSkip.num_params(d) * layers if spec.skip else 0
    if spec.lora:
        r, _ = resolve_lora(method, d, layers, lora_r, per_rank=per_rank)
        n += r * (per_rank or 6 * d * layers)
    return n


def check_fits(model: nn.Module, configs: Iterable[Any]) -> None:
    """Apply each distinct method and size of `configs` (`TrainConfig`s) to a copy of `model` built on the meta
    device (no memory; `model` untouched): a size it cannot take (`layers` past its blocks, `parts` it lacks) is
    refused before a study runs anything, with `apply_method`'s own error."""
    seen = set()
    for cfg in configs:
        spec = _spec(cfg.method)
        sizes = cfg.preproj_sizes(spec.preproj, spec.skip) if spec.preproj or spec.skip else None
        key = (cfg.method, repr(sizes), cfg.lora_r, cfg.lora_alpha)
        if key not in seen:
            seen.add(key)
            meta = meta_model(model.config)
            apply_method(meta, cfg.method, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha, sizes=sizes)


def meta_model(config: Any) -> nn.Module:
    """A `AutoModelForCausalLM` built from `config` on the meta device (no memory, no download)."""
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def method_param_table(config: Any, methods: tuple[str, ...] = METHODS) -> dict[str, int]:
    """{method: trainable parameters} measured by applying each method to a meta-device model of `config`."""
    return {m: count_trainable(apply_method(meta_model(config), m)) for m in methods}
