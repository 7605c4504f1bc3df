"""Recognise a model no row claims by its `model_type`: the row whose layout the model has.

Mixtral is laid out as Mistral, Qwen2-MoE as Qwen2, LLaVA-NeXT as LLaVA: a row describes where the blocks,
the pre-attention norm and the attention are, and those facts can be read off any model. A transformers
row (one matched by `model_types`; rows whose `matches` is code, timm and open_clip, identify their classes
themselves) *fits* a model when, on every part the row has:

- one of its block paths resolves, on the model or under its base model (`vivit.encoder.layer` for a
  `VivitForVideoClassification`, where the row says `encoder.layer`), and the row's `check` passes;
- each block's attention and norm paths resolve, the attention is an attention module by class (its name
  holds "Attention"/"Attn", or it is `nn.MultiheadAttention`), the norm a norm ("Norm" in its class
  name), and the attention's `forward` takes the argument the row's call puts `x~` into (`hidden_states`);
- and the parts together cover every attention module of the model (no tower is silently left out;
  attention pooling heads, which attend from a learned probe, are not counted).

The fitting rows are grouped by the sites they resolve to (the same attention and norm modules, the same
call); exactly one group is taken, with its paths as they resolved on this model (a row of the group is
named: the one whose LoRA targets the model has, then whose name shares the longest prefix with the model
type, then the first registered). Several descriptions, or none, are a
refusal that says which rows fitted, or which row comes nearest and injects when forced. The match is
confirmed, as for any row, by the seam check on the first forward (`inject(..., example_input=...)` runs
it at inject time); the resolved description is saved with the adapter, so a reload needs no code.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterable

from torch import nn

from .paths import get_path
from .spec import HostError, HostSpec, Site, _first_path, resolve_sites


@dataclasses.dataclass
class StructureMatch:
    """What the rows say about a model by structure.

    Args:
        spec: the one resolved row (paths as they resolve on the model), or None.
        fitting: the names of the rows whose layout fits, grouped by the sites they resolve to.
        forceable: row names that inject when forced (`host=name`), but fit only in part (why, per row).
    """

    spec: HostSpec | None
    fitting: list[list[str]]
    forceable: dict[str, str]


def _is_attention(module: nn.Module) -> bool:
    """An attention module by class: nn.MultiheadAttention, or "Attention"/"Attn" in a class name that is not
    a layer or block's (Jamba's `JambaAttentionDecoderLayer` holds an attention, it is not one)."""
    if isinstance(module, nn.MultiheadAttention):
        return True
    return any(
        ("Attention" in c.__name__ or "Attn" in c.__name__) and not c.__name__.endswith(("Layer", "Block"))
        for c in type(module).__mro__[:-1]
    )


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.Identity) or any("Norm" in c.__name__ for c in type(module).__mro__[:-1])


def _takes(attention: nn.Module, inputs: Iterable[tuple[int, str]]) -> bool:
    """The attention's forward has a parameter named for every slot the call fills (or takes *args)."""
    try:
        params = list(inspect.signature(type(attention).forward).parameters.values())[1:]  # without self
    except (TypeError, ValueError):
        return False
    names = {p.name for p in params}
    star = any(p.kind is p.VAR_POSITIONAL for p in params)
    return all(key in names or star for _, key in inputs)


def _top_attentions(model: nn.Module) -> dict[int, str]:
    """Every attention module of the model that is not inside another one: id -> its name. Attention
    pooling heads ("Pool" in the class name, SigLIP's `head`) attend from a learned probe, with no
    pre-attention norm to sit behind: they are not counted."""
    found: dict[int, str] = {}
    prefixes: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(p + ".") for p in prefixes):
            continue
        if _is_attention(module):
            if "Pool" not in type(module).__name__:
                found[id(module)] = name
            prefixes.append(name)
    return found


def _prefixed(model: nn.Module, row: HostSpec) -> HostSpec | None:
    """`row` with each part's block path as it resolves on `model` (directly, or under the base model)."""
    prefix = getattr(type(model), "base_model_prefix", "")
    prefix = prefix if isinstance(prefix, str) and prefix.isidentifier() else ""
    parts = []
    for part in row.parts:
        candidates = part.blocks + tuple(f"{prefix}.{p}" for p in part.blocks if prefix and not p.startswith("*:"))
        path = _first_path(model, candidates)
        if path is None:
            if part.optional:
                continue
            return None
        parts.append(dataclasses.replace(part, blocks=(path,), optional=False))
    return dataclasses.replace(row, parts=tuple(parts)) if parts else None


def resolve_row(model: nn.Module, row: HostSpec) -> HostSpec:
    """`row` itself when its parts resolve on `model` as written, else with its block paths under the base
    model (what `host=name` forces); `row` when neither resolves (so the error names the row's paths)."""
    found = [_first_path(model, part.blocks) is not None for part in row.parts]
    if (
        row.matches is not None
        or row.described
        or (any(found) and all(ok or part.optional for ok, part in zip(found, row.parts)))
    ):
        return row
    return _prefixed(model, row) or row


def _why_not(
    model: nn.Module, row: HostSpec, attentions: dict[int, str]
) -> tuple[HostSpec | None, list[Site], str | None]:
    """(`row` resolved on `model`, its sites, None) when it fits; (resolved or None, sites, the reason) when
    it does not. `attentions`: the model's attention modules (`_top_attentions`), all of which must be sites."""
    spec = _prefixed(model, row)
    if spec is None:
        return None, [], "no block path resolves"
    try:
        sites = resolve_sites(model, spec)
    except HostError as e:
        return None, [], str(e)
    for s in sites:
        where = f"part {s.part!r} block {s.part_index}"
        if not _is_attention(s.attention):
            return None, sites, f"{where}: {type(s.attention).__name__} is not an attention module"
        if s.norm is not None and not _is_norm(s.norm):
            return None, sites, f"{where}: {type(s.norm).__name__} is not a norm"
        if not _takes(s.attention, s.call.inputs):
            return (
                None,
                sites,
                f"{where}: {type(s.attention).__name__}.forward takes no {[k for _, k in s.call.inputs]}",
            )
    covered = {id(s.attention) for s in sites}
    left = [n for i, n in attentions.items() if i not in covered]
    if left:
        return spec, sites, f"leaves {len(left)} attention module(s) out, e.g. {left[0]!r}"
    return spec, sites, None


def _same_injection(sites: list[Site]) -> tuple:
    """Two rows that resolve to the same sites (part, attention, norm, call) inject the same way."""
    return tuple((s.part, id(s.attention), id(s.norm), repr(s.call)) for s in sites)


def written_by(row: HostSpec, description: dict) -> bool:
    """True if `description` (saved with an adapter) is what `row` writes on some model: every part is one
    of the row's, with one of its block paths (as written, or under a base model) and the same attention,
    norm, call, width and `contains`."""
    parts = {p.name: p for p in row.parts}
    saved = description.get("parts")
    if not isinstance(saved, list) or not saved:
        return False
    for d in saved:
        part = parts.get(d.get("name")) if isinstance(d, dict) else None
        if part is None:
            return False
        blocks = d.get("blocks")
        if not isinstance(blocks, str) or not any(blocks == b or blocks.endswith("." + b) for b in part.blocks):
            return False
        mine = part.to_dict()
        if any(d.get(k) != mine.get(k) for k in ("attention", "norm", "call", "width", "contains")):
            return False
    return True


def shared_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def match_structure(model: nn.Module, rows: Iterable[HostSpec]) -> StructureMatch:
    """The one row whose layout `model` has (resolved on it), the rows that fit, and those that fit in part."""
    groups: dict[tuple, list[tuple[HostSpec, HostSpec]]] = {}
    forceable: dict[str, str] = {}
    attentions = _top_attentions(model)
    for row in rows:
        if row.matches is not None or row.described:
            continue
        spec, sites, why = _why_not(model, row, attentions)
        if why is None:
            groups.setdefault(_same_injection(sites), []).append((row, spec))
        elif spec is not None:
            forceable[row.name] = why
    fitting = [[row.name for row, _ in g] for g in groups.values()]
    if len(groups) != 1:
        return StructureMatch(None, fitting, forceable)
    (group,) = groups.values()
    model_type = str(getattr(getattr(model, "config", None), "model_type", "") or type(model).__name__.lower())
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}

    def rank(i: int) -> tuple:  # the row whose LoRA targets the model has, then the closest name, then the first
        targets = group[i][0].lora_targets
        return (
            sum(t in names for t in targets) / max(len(targets), 1),
            shared_prefix(group[i][0].name, model_type),
            -i,
        )

    row, spec = group[max(range(len(group)), key=rank)]
    lora = tuple(t for t in row.lora_targets if t in names)
    spec = dataclasses.replace(
        spec,
        description=f"{row.description}; {type(model).__name__} recognised by its structure",
        model_types=(),
        lora_targets=lora,
        trainable_modules={k: v for k, v in row.trainable_modules.items() if _resolves(model, v)},
    )
    return StructureMatch(spec, fitting, forceable)


def _resolves(model: nn.Module, path: str) -> bool:
    try:
        get_path(model, path)
    except HostError:
        return False
    return True
