"""A host row as data: where a model's attention blocks are and how each block calls its attention.

A `HostSpec` is a list of `PartSpec`s (a decoder; a vision tower and a language model; two CLIP towers).
Every field of a part is JSON-able: attribute paths such as `model.layers` and `self_attn`, the name of the
pre-attention norm, and the attention's call convention (`AttentionCall`: which argument carries the
normed input, where the output sits). `resolve_sites(model, spec)` turns a row into concrete injection
`Site`s; `HostSpec.describe(model)` writes the resolved description that an adapter file keeps, so that
`load_adapter` (and a user describing an unknown model) needs no code:

    {"name": "llama", "parts": [{"name": "language", "blocks": "model.layers", "attention": "self_attn",
      "norm": "input_layernorm", "call": {"inputs": [[0, "hidden_states"]], "output_index": 0}}],
     "embeddings": "@input_embeddings"}

Paths are data (`paths.py`): dotted attribute names, an integer component indexes a list (`layers.0.attn`),
nothing is ever called and no name starting with `_` is followed; `@input_embeddings` is the keyword for the
model's `get_input_embeddings()`. A `blocks` path may also be `*:ClassName`, every submodule of that class in
module order; a part's `contains` keeps only the blocks that have that path (Bamba's attention layers).
Every path of a description is checked for its form before it meets a model. Only built-in
rows carry code: `matches` (which models a row claims) and `check` (a refusal with its reason).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .checkpointing import CHECKPOINTING
from .paths import HostError, check_path, get_path


@dataclass(frozen=True)
class AttentionCall:
    """How a host block calls its attention module.

    Args:
        inputs: the (position, keyword) of each argument that carries the normed input `x^`
            (one for self-attention; query/key/value for `nn.MultiheadAttention`).
        output_index: index of the output tensor in a tuple result, or None when attention returns a tensor.
    """

    inputs: tuple[tuple[int, str], ...] = ((0, "hidden_states"),)
    output_index: int | None = 0


def call_to_dict(call: AttentionCall) -> dict:
    return {"inputs": [list(i) for i in call.inputs], "output_index": call.output_index}


def call_from_dict(d: Any, where: str = "call") -> AttentionCall:
    """An `AttentionCall` from its JSON form, every field checked."""
    if not isinstance(d, dict) or set(d) - {"inputs", "output_index"}:
        raise HostError(f"{where} must be an object with keys 'inputs' and 'output_index', got {d!r}")
    inputs = d.get("inputs", [[0, "hidden_states"]])
    ok = (
        isinstance(inputs, (list, tuple))
        and inputs
        and all(
            isinstance(i, (list, tuple)) and len(i) == 2 and type(i[0]) is int and i[0] >= 0 and isinstance(i[1], str)
            for i in inputs
        )
    )
    if not ok:
        raise HostError(
            f"{where}.inputs must be a non-empty list of [position, keyword] pairs, e.g. [[0, 'hidden_states']], "
            f"got {inputs!r}"
        )
    out = d.get("output_index", 0)
    if out is not None and (type(out) is not int or out < 0):
        raise HostError(f"{where}.output_index must be null (attention returns a tensor) or an int >= 0, got {out!r}")
    return AttentionCall(inputs=tuple((int(p), str(k)) for p, k in inputs), output_index=out)


@dataclass(frozen=True)
class PartSpec:
    """One group of attention blocks: a decoder, a vision tower, a text tower.

    Args:
        name: the part's name, used in `PreProjConfig(parts=...)` and the adapter file ("language", "vision").
        blocks: candidate paths from the model to its list of blocks; the first that resolves is used
            (`("model.layers", "layers")` serves `LlamaForCausalLM` and `LlamaModel`). `*:Block` = every
            submodule of class `Block`.
        attention: path from a block to the attention module that receives the pre-attention norm's output.
        norm: path from a block to that norm, or None (only with `unchecked_seam`). When given, the first
            forward checks that the attention really receives this norm's output and fails loudly if not.
        call: how the block calls its attention (`AttentionCall`).
        width: path from a block to its width (an int, a Linear's `in_features`, a tensor's last dim);
            None = the norm's weight, else the attention's first Linear.
        block_types: class names a block (or a base class of it) must have; empty = any.
        optional: a part that may be absent (CLIPModel has both towers, CLIPVisionModel only one).
        contains: a path every block of the part has; blocks of the list without it are not the part's
            (a hybrid stack whose attention and Mamba layers share one class, Bamba: `"contains": "self_attn"`).
            The part's blocks are then numbered 0.. among those that have it.
        unchecked_seam: the explicit opt-in that `norm` is None: nothing checks that the attention receives
            a pre-attention norm's output (on a post-norm host such as BERT it would pre-project the residual
            stream). A part with `norm=None` and no opt-in is refused. Built-in rows set it in code, silently;
            a described part (`from_dict`, a user's or an adapter file's) warns when it uses it, and the
            opt-in is saved with the description.
        skip_to: path from a block to a module around the attention whose output the content skip joins, when
            that module applies weights of its own to the attention's output before the residual add (the pre-LN
            BERTs: `attention` = norm, `self`, then `output.dense` + the residual): the skip then joins after
            them, `x + W_o attn_out + W_skip x~` as the paper writes it. Its output is a tensor or a tuple whose
            item 0 is the block's hidden states. None (the default): the skip joins the attention's own output.
    """

    name: str
    blocks: tuple[str, ...]
    attention: str = "self_attn"
    norm: str | None = None
    call: AttentionCall = field(default_factory=AttentionCall)
    width: str | None = None
    block_types: tuple[str, ...] = ()
    optional: bool = False
    unchecked_seam: bool = False
    contains: str | None = None
    skip_to: str | None = None

    def __post_init__(self) -> None:
        if self.norm is None and not self.unchecked_seam:
            raise HostError(_NO_NORM.format(where=f"part {self.name!r}"))
        if self.skip_to is not None and not self.attention.startswith(f"{self.skip_to}."):
            raise HostError(
                f"part {self.name!r}: skip_to={self.skip_to!r} must be a module around the attention "
                f"{self.attention!r} (a prefix of its path, e.g. {self.attention.rpartition('.')[0] or 'none'!r})"
            )

    def to_dict(self) -> dict:
        extra = {"unchecked_seam": True} if self.unchecked_seam else {}
        if self.contains is not None:
            extra["contains"] = self.contains
        if self.skip_to is not None:
            extra["skip_to"] = self.skip_to
        return {
            "name": self.name,
            "blocks": self.blocks[0] if len(self.blocks) == 1 else list(self.blocks),
            "attention": self.attention,
            "norm": self.norm,
            "call": call_to_dict(self.call),
            "width": self.width,
            "block_types": list(self.block_types),
            **extra,
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "part") -> PartSpec:
        """A part from its JSON form; every field is checked and named in the error."""
        if not isinstance(d, dict):
            raise HostError(f"{where} must be an object, got {type(d).__name__}")
        allowed = {
            "name",
            "blocks",
            "attention",
            "norm",
            "call",
            "width",
            "block_types",
            "num_blocks",
            "unchecked_seam",
            "contains",
            "skip_to",
        }
        unknown = sorted(set(d) - allowed)
        if unknown:
            raise HostError(f"{where} has unknown keys {unknown}; allowed: {sorted(allowed)}")
        for key in ("name", "blocks", "attention"):
            if key not in d:
                raise HostError(f"{where} needs {key!r} (e.g. {_EXAMPLE_PART[key]!r})")
        blocks = d["blocks"]
        blocks = (blocks,) if isinstance(blocks, str) else blocks
        if not isinstance(blocks, (list, tuple)) or not blocks or not all(isinstance(b, str) and b for b in blocks):
            raise HostError(
                f"{where}.blocks must be a path such as 'model.layers' (or a list of them), got {blocks!r}"
            )
        for key in ("name", "attention"):
            if not isinstance(d[key], str) or not d[key]:
                raise HostError(f"{where}.{key} must be a non-empty string, got {d[key]!r}")
        for key in ("norm", "width", "contains", "skip_to"):
            if d.get(key) is not None and (not isinstance(d[key], str) or not d[key]):
                raise HostError(f"{where}.{key} must be a path string or null, got {d[key]!r}")
        for i, b in enumerate(blocks):
            if b.startswith("*:"):
                if not b[2:].isidentifier():
                    raise HostError(f"{where}.blocks[{i}]={b!r}: '*:' must be followed by a class name")
            else:
                check_path(b, f"{where}.blocks")
        for key in ("attention", "norm", "width", "contains", "skip_to"):
            if d.get(key) is not None:
                check_path(d[key], f"{where}.{key}")
        types = d.get("block_types", [])
        if not isinstance(types, (list, tuple)) or not all(isinstance(t, str) for t in types):
            raise HostError(f"{where}.block_types must be a list of class names, got {types!r}")
        call = call_from_dict(d.get("call", {"inputs": [[0, "hidden_states"]], "output_index": 0}), f"{where}.call")
        unchecked = d.get("unchecked_seam", False)
        if type(unchecked) is not bool:
            raise HostError(f"{where}.unchecked_seam must be true or false, got {unchecked!r}")
        if d.get("norm") is None:
            if not unchecked:
                raise HostError(_NO_NORM.format(where=where))
            warnings.warn(
                f"{where} ({d['name']!r}) has norm: null with unchecked_seam: true: nothing checks that its attention "
                "receives a pre-attention norm's output; on a post-norm block the pre-projection would act on the "
                "residual stream. Name the norm to have the seam checked",
                UserWarning,
                stacklevel=3,
            )
        return cls(
            name=d["name"],
            blocks=tuple(blocks),
            attention=d["attention"],
            norm=d.get("norm"),
            call=call,
            width=d.get("width"),
            block_types=tuple(types),
            unchecked_seam=unchecked,
            contains=d.get("contains"),
            skip_to=d.get("skip_to"),
        )


_NO_NORM = (
    "{where} has norm: null, which turns the norm -> attention seam check off (on a post-norm block such as "
    "BERT's the pre-projection would act on the residual stream): name the pre-attention norm in 'norm' "
    "(e.g. 'input_layernorm'), or opt in explicitly with \"unchecked_seam\": true in the part"
)

_EXAMPLE_PART = {"name": "language", "blocks": "model.layers", "attention": "self_attn"}


@dataclass
class Site:
    """One place to inject: a block and its attention module, resolved on a real model."""

    part: str
    index: int  # index over all blocks of all resolved parts, in part order (the adapter's block index)
    part_index: int  # index within its part
    block: nn.Module
    parent: nn.Module  # the module that holds the attention as attribute `attr`
    attr: str
    attention: nn.Module
    norm: nn.Module | None
    norm_path: str | None
    width: int
    call: AttentionCall
    skip_to: nn.Module | None = None  # the module whose output the skip joins (`PartSpec.skip_to`); None: attention's


@dataclass(frozen=True)
class HostSpec:
    """One host family: its parts plus what built-in rows know in code.

    Args:
        name: short id saved in adapter files ("gpt_neox", "llama", "qwen2_vl", ...).
        description: what the row covers (shown in errors).
        parts: the attention-block groups, in the adapter's block order.
        matches: True if a model belongs to this row (built-in rows; a described host is used as given).
        check: raises HostError with the reason when a matching model must be refused (post-norm...).
        embeddings: path to the module whose output starts the residual stream (a frozen base under
            reentrant gradient checkpointing needs it), `@input_embeddings` (the model's
            `get_input_embeddings()`) or None; alternatives are separated by "|", each a plain path.
        default_parts: parts injected when the config names none (None = all).
        lora_targets: module names peft's LoRA targets in this family's attention (the LoRA baselines).
        trainable_modules: named base modules a config may keep trainable (`{"projector": "model.visual.merger"}`).
        model_types: `config.model_type` values matched when `matches` is not given.
        checkpointing: the family's gradient-checkpointing switch (`checkpointing.CHECKPOINTING`:
            "transformers", "timm", "open_clip"; "any" = read every known switch, the safe side).
        output_heads: attribute names of the linear layers that produce the model's output (`lm_head`,
            GPT-NeoX's `embed_out`), kept float when the base is quantized (`integrations.quantized`).
        described: a host described in data (`from_dict`), not a built-in row: every path it names must
            resolve (its `embeddings` too).
    """

    name: str
    description: str
    parts: tuple[PartSpec, ...]
    matches: Callable[[nn.Module], bool] | None = None
    check: Callable[[nn.Module], None] | None = None
    embeddings: str | None = None
    default_parts: tuple[str, ...] | None = None
    lora_targets: tuple[str, ...] = ()
    trainable_modules: dict[str, str] = field(default_factory=dict)
    model_types: tuple[str, ...] = ()
    described: bool = False
    checkpointing: str = "any"
    output_heads: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.checkpointing not in CHECKPOINTING:
            raise HostError(
                f"host {self.name!r}: checkpointing={self.checkpointing!r}; allowed: {list(CHECKPOINTING)}"
            )

    def matches_model(self, model: nn.Module) -> bool:
        if self.matches is not None:
            return bool(self.matches(model))
        return getattr(getattr(model, "config", None), "model_type", None) in self.model_types

    def input_embeddings(self, model: nn.Module) -> nn.Module | None:
        for path in (self.embeddings or "").split("|"):
            try:
                emb = get_path(model, path) if path else None
            except HostError:
                continue
            if isinstance(emb, nn.Module):
                return emb
        return None

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """Every block of every part, in adapter order."""
        return [s.block for s in resolve_sites(model, self)]

    def part_names(self) -> list[str]:
        return [p.name for p in self.parts]

    def describe(self, model: nn.Module) -> dict:
        """The resolved, JSON-able description of this row on `model` (what an adapter file keeps)."""
        parts = []
        for part, blocks_path, n in _resolved_parts(model, self):
            d = part.to_dict()
            d["blocks"] = blocks_path
            d["num_blocks"] = n
            parts.append(d)
        return {"name": self.name, "parts": parts, "embeddings": self.embeddings}

    @classmethod
    def from_dict(cls, d: Any) -> HostSpec:
        """A host described in data (a user's unknown model, or the description saved with an adapter)."""
        if not isinstance(d, dict):
            raise HostError(f"a host description must be an object with 'name' and 'parts', got {type(d).__name__}")
        unknown = sorted(
            set(d) - {"name", "parts", "embeddings", "description", "left_out"}
        )  # left_out: a trace's note
        if unknown:
            raise HostError(f"host description has unknown keys {unknown}; allowed: name, parts, embeddings")
        name = d.get("name", "custom")
        if not isinstance(name, str) or not name:
            raise HostError(f"host description 'name' must be a non-empty string, got {name!r}")
        parts = d.get("parts")
        if not isinstance(parts, list) or not parts:
            raise HostError(
                "host description 'parts' must be a non-empty list, e.g. [{'name': 'language', "
                "'blocks': 'model.layers', 'attention': 'self_attn', 'norm': 'input_layernorm'}]"
            )
        specs = tuple(PartSpec.from_dict(p, f"parts[{i}]") for i, p in enumerate(parts))
        names = [p.name for p in specs]
        if len(set(names)) != len(names):
            raise HostError(f"host description has duplicate part names: {names}")
        emb = d.get("embeddings")
        if emb is not None:
            if not isinstance(emb, str):
                raise HostError(f"host description 'embeddings' must be a path string or null, got {emb!r}")
            emb = "|".join(check_path(p, "host description 'embeddings'", keywords=True) for p in emb.split("|"))
        description = d.get("description", f"described host {name!r}")
        if not isinstance(description, str):
            raise HostError(f"host description 'description' must be a string, got {type(description).__name__}")
        return cls(
            name=name, description=description, parts=specs, matches=lambda model: True, embeddings=emb, described=True
        )


def _block_list(model: nn.Module, path: str) -> list[nn.Module]:
    if path.startswith("*:"):
        cls_name = path[2:]
        return [m for m in model.modules() if _has_class(m, (cls_name,))]
    found = get_path(model, path)
    if isinstance(found, (nn.ModuleList, nn.Sequential, list, tuple)):
        blocks = list(found)
        if not all(isinstance(b, nn.Module) for b in blocks):
            raise HostError(f"path {path!r} holds items that are not modules")
        return blocks
    raise HostError(f"path {path!r} is a {type(found).__name__}, not a list of blocks (nn.ModuleList)")


def _part_blocks(model: nn.Module, path: str, part: PartSpec) -> list[tuple[int, nn.Module]]:
    """(index in the list, block) for every block of `part` under `path` (those with `part.contains`)."""
    blocks = list(enumerate(_block_list(model, path)))
    if part.contains is None:
        return blocks
    out = []
    for i, block in blocks:
        try:
            get_path(block, part.contains)
        except HostError:
            continue
        out.append((i, block))
    return out


def _has_class(obj: object, names: tuple[str, ...]) -> bool:
    return any(c.__name__ in names for c in type(obj).__mro__)


def _first_path(model: nn.Module, paths: tuple[str, ...]) -> str | None:
    for p in paths:
        try:
            if p.startswith("*:"):
                if _block_list(model, p):
                    return p
            else:
                get_path(model, p)
                return p
        except HostError:
            continue
    return None


def _resolved_parts(model: nn.Module, spec: HostSpec) -> list[tuple[PartSpec, str, int]]:
    """(part, its resolved blocks path, number of blocks) for every part present in `model`."""
    out = []
    for part in spec.parts:
        path = _first_path(model, part.blocks)
        if path is None:
            if part.optional:
                continue
            raise HostError(
                f"host {spec.name!r}, part {part.name!r}: none of the block paths {list(part.blocks)} exists "
                f"in {type(model).__name__}"
            )
        n = len(_part_blocks(model, path, part))
        if n == 0 and not part.optional:
            what = f" with {part.contains!r}" if part.contains else ""
            raise HostError(f"host {spec.name!r}, part {part.name!r}: {path!r} holds no blocks{what}")
        if n:
            out.append((part, path, n))
    if not out:
        raise HostError(f"host {spec.name!r}: {type(model).__name__} has none of its parts {spec.part_names()}")
    return out


def _width(block: nn.Module, attention: nn.Module, norm: nn.Module | None, part: PartSpec, where: str) -> int:
    if part.width is not None:
        value = get_path(block, part.width)
    elif norm is not None and isinstance(getattr(norm, "weight", None), torch.Tensor):
        value = norm.weight
    else:
        value = next((m for m in attention.modules() if isinstance(m, nn.Linear)), None)
        if value is None:
            value = getattr(attention, "embed_dim", None)
    if isinstance(value, bool):
        value = None
    if isinstance(value, int):
        return value
    if isinstance(value, nn.Linear):
        return value.in_features
    if isinstance(value, torch.Tensor) and value.dim() >= 1:
        return int(value.shape[-1])
    raise HostError(f"{where}: cannot tell the width; set the part's 'width' to a path such as 'self_attn.q_proj'")


def resolve_sites(model: nn.Module, spec: HostSpec) -> list[Site]:
    """Every injection site of `spec` on `model`, in adapter order; HostError naming what does not fit."""
    if spec.check is not None:
        spec.check(model)
    if spec.described and spec.embeddings and spec.input_embeddings(model) is None:
        raise HostError(
            f"host {spec.name!r}: embeddings={spec.embeddings!r} names no module of "
            f"{type(model).__name__}; give a path to the module that starts the residual stream, or null"
        )
    sites: list[Site] = []
    for part, path, _ in _resolved_parts(model, spec):
        for j, (i, block) in enumerate(_part_blocks(model, path, part)):
            where = f"host {spec.name!r}, part {part.name!r}, block {j} ({path}.{i})"
            if part.block_types and not _has_class(block, part.block_types):
                raise HostError(
                    f"{where} is a {type(block).__name__}; this row supports {list(part.block_types)} "
                    "(a pre-norm block whose attention receives the norm's output)"
                )
            parent_path, _, attr = part.attention.rpartition(".")
            try:
                parent = get_path(block, parent_path)
                attention = get_path(parent, attr)
            except HostError as e:
                raise HostError(f"{where}: no attention module at {part.attention!r} ({e})") from None
            if not isinstance(attention, nn.Module):
                raise HostError(f"{where}: {part.attention!r} is a {type(attention).__name__}, not a module")
            norm = None
            if part.norm is not None:
                try:
                    norm = get_path(block, part.norm)
                except HostError as e:
                    raise HostError(f"{where}: no pre-attention norm at {part.norm!r} ({e})") from None
                if not isinstance(norm, nn.Module):
                    raise HostError(f"{where}: {part.norm!r} is a {type(norm).__name__}, not a module")
            width = _width(block, attention, norm, part, where)
            skip_to = get_path(block, part.skip_to) if part.skip_to is not None else None
            sites.append(
                Site(
                    part.name,
                    len(sites),
                    j,
                    block,
                    parent,
                    attr,
                    attention,
                    norm,
                    part.norm,
                    width,
                    part.call,
                    skip_to,
                )
            )
    return sites
