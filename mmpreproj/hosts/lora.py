"""The LoRA baselines' host facts, read off the row and the real model (not assumed from GPT-NeoX).

A row names the modules peft's LoRA targets inside its attention (`HostSpec.lora_targets`: `q_proj`,
`c_attn`, `query_key_value`...). Here they are resolved on a model: only the modules *inside the row's
attention modules* of its default parts count (GPT-2's `c_proj` is also the MLP's output projection; a
Llama's GQA `k_proj`/`v_proj` are narrower than `q_proj`). LoRA of rank r on a module with a 2-D weight adds
`r * (in + out)` parameters (`lora_A`: r x in, `lora_B`: out x r; a transformers `Conv1D` stores its weight
as in x out, the sum is the same), so the count for a rank is r times `lora_params_per_rank`:

    GPT-NeoX  (d, L):               query_key_value d->3d, dense d->d       = 6d per block
    Llama GQA (d, q = h*hd, kv):    q d->q, k d->kv, v d->kv, o q->d        = 2(d+q) + 2(d+kv) per block
    GPT-2     (d, L):               attn.c_attn d->3d, attn.c_proj d->d     = 6d per block (not mlp.c_proj)
"""

from __future__ import annotations

from torch import nn

from .spec import HostError, HostSpec, Site, resolve_sites


def lora_sites(model: nn.Module, spec: HostSpec) -> list[Site]:
    """The sites of the row's default parts (every part when the row names none), as `inject` picks them."""
    sites = resolve_sites(model, spec)
    present = list(dict.fromkeys(s.part for s in sites))
    wanted = [p for p in (spec.default_parts or present) if p in present] or present
    return [s for s in sites if s.part in wanted]


def _base(attention: nn.Module) -> nn.Module:
    """The host attention itself, also when `inject` has wrapped it (its preproj/skip are not LoRA targets)."""
    get = getattr(attention, "get_base_layer", None)
    return get() if callable(get) else attention


def lora_modules(model: nn.Module, spec: HostSpec) -> dict[str, nn.Module]:
    """{full module name: module} of every LoRA target of `spec` on `model`, in module order.

    HostError when the row names no targets or none of them exists inside its attention modules.
    """
    if not spec.lora_targets:
        raise HostError(f"host {spec.name!r} names no LoRA target modules (HostSpec.lora_targets)")
    wanted = set(spec.lora_targets)
    found: set[int] = set()
    for site in lora_sites(model, spec):
        for name, module in _base(site.attention).named_modules():
            if name and name.rsplit(".", 1)[-1] in wanted:
                found.add(id(module))
    out = {name: m for name, m in model.named_modules() if id(m) in found}
    if not out:
        raise HostError(f"host {spec.name!r}: none of its LoRA targets {list(spec.lora_targets)} is in its attention")
    return out


def _rank_params(name: str, module: nn.Module) -> int:
    weight = getattr(module, "weight", None)
    if weight is None or weight.dim() != 2:
        raise HostError(f"LoRA target {name!r} ({type(module).__name__}) has no 2-D weight; cannot count its LoRA")
    return int(weight.shape[0] + weight.shape[1])  # in + out, whichever way the weight is stored


def lora_params_per_rank(model: nn.Module, spec: HostSpec) -> int:
    """LoRA parameters per unit of rank over all of the row's targets: sum of (in + out) features."""
    return sum(_rank_params(n, m) for n, m in lora_modules(model, spec).items())


def _peft_matches(key: str, targets: list[str]) -> bool:
    """peft's rule for a list of `target_modules`: the name, or a dotted suffix of it, is in the list."""
    return key in targets or any(key.endswith(f".{t}") for t in targets)


def peft_target_modules(model: nn.Module, spec: HostSpec) -> list[str]:
    """The `target_modules` to give peft so that LoRA lands exactly on `lora_modules`.

    The row's short names when peft would match exactly those modules with them (GPT-NeoX, Llama), else
    the full module names (GPT-2: the short `c_proj` would also match the MLP's projection).
    """
    exact = lora_modules(model, spec)
    short = list(spec.lora_targets)
    matched = {n for n, _ in model.named_modules() if n and _peft_matches(n, short)}
    if matched == set(exact):
        return short
    return list(exact)
