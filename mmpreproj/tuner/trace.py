"""`trace_seams`: find a model's (pre-attention norm -> attention) seams by running one forward.

Hooks record every norm-like module's output and every attention-like module's input; a seam is an
attention whose first input (positional, or `hidden_states=` / `x=` / `query=`) *is* a norm's output, both
inside the same block of a `ModuleList`. Every argument slot of that call holding the same tensor, by
position or keyword, goes into `call.inputs` (query, key and value of `nn.MultiheadAttention(y, y, y)`), so
the attention reads `x~` wherever it read `x^`. A block with several seams (a TimeSformer block's temporal
and spatial attention, each after its own norm) gives one part per seam over the same blocks. Seams are grouped by their block list into parts, giving the
JSON description `inject(model, host=...)` takes. `check=True` injects at identity init into a copy and
confirms the outputs are unchanged. The probe forwards run in eval mode (dropout off) under a forked RNG, so
neither a train-mode model nor the caller's random stream affects the answer, and both are left as they were.

A post-norm seam (BART/Florence2 decoder cross-attention: the norm's output is also the residual stream) is
refused with the reason: `_residual_stream` perturbs the norm's output for every reader but the block's
submodules, and a model output that moves means a plain tensor op (the residual add) read it.
"""

from __future__ import annotations

import copy
import inspect
import weakref
from typing import Any

import torch
from torch import nn

from ..util.probing import probing
from .config import PreProjConfig
from .inject import inject

__all__ = ["trace_seams"]

_INPUT_KEYS = ("hidden_states", "x", "query", "input")


def _is_norm(name: str, module: nn.Module) -> bool:
    return isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or "norm" in type(module).__name__.lower()


def _is_attention(name: str, module: nn.Module) -> bool:
    kind = type(module).__name__.lower()
    leaf = name.rsplit(".", 1)[-1].lower()
    return ("attention" in kind or "attn" in kind or "attn" in leaf or "attention" in leaf) and any(
        p.dim() == 2 for p in module.parameters()  # has projections (Linear, Conv1D, in_proj_weight)
    )


def _first_input(args: tuple, kwargs: dict) -> tuple[torch.Tensor | None, list]:
    if args and isinstance(args[0], torch.Tensor):
        return args[0], [0, _INPUT_KEYS[0]]
    for key in _INPUT_KEYS:
        if isinstance(kwargs.get(key), torch.Tensor):
            return kwargs[key], [0, key]
    return None, []


def _positional_names(module: nn.Module) -> list[str]:
    """The names of `module.forward`'s positional parameters, in order (empty if unknown)."""
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _slots_of(x: torch.Tensor, module: nn.Module, args: tuple, kwargs: dict) -> list[list]:
    """Every [position, keyword] slot of this call that holds `x` itself (query, key and value of
    `nn.MultiheadAttention(y, y, y)`, whether passed by position or by keyword)."""
    names = _positional_names(module)
    beyond = max(len(args), len(names))  # a keyword the signature does not list: a position never passed
    slots = []
    for i, a in enumerate(args):
        if a is x:
            slots.append([i, names[i] if i < len(names) else _INPUT_KEYS[0]])
    for key, a in kwargs.items():
        if a is x:
            slots.append([names.index(key) if key in names else beyond, key])
    return slots


def _split_block(path: str) -> tuple[str, str] | None:
    """'model.layers.3.self_attn' -> ('model.layers', '3') for the innermost numbered component."""
    parts = path.split(".")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i].isdigit():
            return ".".join(parts[:i]), ".".join(parts[: i + 1])
    return None


def trace_seams(model: nn.Module, *args: Any, check: bool = True, **kwargs: Any) -> dict:
    """The host description of `model` found by running `model(*args, **kwargs)` once (no gradients).

    Raises ValueError if no seam is found. With `check`, a deep copy is injected at identity init with
    the description and must reproduce the model's outputs (fp32, 1e-5). The forwards run in eval mode
    under a forked RNG: the caller's RNG and the model's train/eval flags are left as they were.
    """
    with probing(model):
        return _trace(model, args, kwargs, check)


def _trace(model: nn.Module, args: tuple, kwargs: dict, check: bool) -> dict:
    norms: dict[int, tuple[weakref.ref, str]] = {}
    seams: dict[str, dict] = {}
    handles = []
    named = dict(model.named_modules())
    for name, module in named.items():
        if _is_norm(name, module):
            def record(m, a, out, name=name):
                if isinstance(out, torch.Tensor):
                    norms[id(out)] = (weakref.ref(out), name)
            handles.append(module.register_forward_hook(record))
        elif name and _is_attention(name, module):
            def seen(m, a, kw, name=name):
                x, slot = _first_input(a, kw)
                hit = norms.get(id(x)) if x is not None else None
                if hit is not None and hit[0]() is x and name not in seams:
                    seams[name] = {"norm": hit[1], "slots": _slots_of(x, m, a, kw)}
            handles.append(module.register_forward_pre_hook(seen, with_kwargs=True))
    ref = _probe(model, handles, args, kwargs)
    parts: dict[str, dict] = {}
    for attn_name, seam in seams.items():
        if any(attn_name.startswith(outer + ".") and other["norm"] == seam["norm"] for outer, other in seams.items()):
            continue  # inside an attention fed the same norm (GPT-2's attn.c_attn): the outer one is the seam
        split = _split_block(attn_name)
        if split is None:
            continue
        blocks, block = split
        if not _split_block(seam["norm"]) or _split_block(seam["norm"])[1] != block:
            continue
        attention, norm = attn_name[len(block) + 1 :], seam["norm"][len(block) + 1 :]
        key = (blocks, attention, norm)  # two seams in one block (temporal + spatial attention): two parts
        if key not in parts:
            base = blocks.replace(".", "_") or "blocks"
            first = not any(k[0] == blocks for k in parts)
            parts[key] = {
                "name": base if first else f"{base}_{attention.replace('.', '_')}",
                "blocks": blocks,
                "attention": attention,
                "norm": norm,
                "call": {"inputs": seam["slots"], "output_index": None},
            }
        part = parts[key]
        part.setdefault("_seam", (named[block], named[seam["norm"]], attn_name, seam["norm"]))
    if not parts:
        raise ValueError(
            f"trace_seams: no attention module of {type(model).__name__} received a norm's output inside a "
            "numbered block; describe the host by hand (see mmpreproj.hosts.spec)"
        )
    for part in parts.values():
        block, norm, attn_name, norm_name = part["_seam"]
        if _residual_stream(model, args, kwargs, ref, block, norm):
            raise ValueError(
                f"trace_seams: the seam {norm_name!r} -> {attn_name!r} of {type(model).__name__} is post-norm: the "
                f"output of {norm_name!r} is also the block's residual stream (it reaches the block's output other "
                "than as the input of a module), so pre-projecting it would change what the residual carries; "
                "mmpreproj pre-projects only pre-norm seams (the norm's output feeds modules only)"
            )
    for part in parts.values():  # output layout: tuple -> index 0, tensor -> null
        probe = named[part.pop("_seam")[2]]
        out = {}
        h = probe.register_forward_hook(lambda m, a, o, out=out: out.setdefault("o", o))
        try:
            with torch.no_grad():
                model(*args, **kwargs)
        finally:
            h.remove()
        part["call"]["output_index"] = 0 if isinstance(out.get("o"), tuple) else None
    description = {"name": "traced", "parts": list(parts.values())}
    if check:
        _check(model, description, args, kwargs)
    return description


def _residual_stream(model: nn.Module, args: tuple, kwargs: dict, ref: torch.Tensor | None, block: nn.Module,
                     norm: nn.Module) -> bool:
    """True if the norm's output is (also) the residual stream: a post-norm seam.

    The rule: in a pre-norm block the norm's output `y` is only ever the input of modules (the attention; in
    a parallel block the MLP too), while in a post-norm block `y` is also added to the sublayer's output as
    the residual (`y + attn(y)`), a plain tensor op. One forward perturbs `y` for every reader and hands
    every submodule of the block the unperturbed `y` back: if the model's output still moves, something
    other than a module read `y`, so `y` carries the residual stream.
    """
    if ref is None:
        return False
    clean: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(noisy) -> (noisy kept alive, clean)

    def perturb(m, a, out):
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            noisy = out + torch.randn_like(out) * (out.detach().abs().mean() + 1)
            clean[id(noisy)] = (noisy, out)
            return noisy
        return out

    def restore(m, a, kw):
        def fix(t):
            hit = clean.get(id(t)) if isinstance(t, torch.Tensor) else None
            return hit[1] if hit is not None and hit[0] is t else t
        return tuple(fix(t) for t in a), {k: fix(v) for k, v in kw.items()}

    handles = [norm.register_forward_hook(perturb)]
    handles += [m.register_forward_pre_hook(restore, with_kwargs=True)
                for m in block.modules() if m is not block and m is not norm]
    got = _probe(model, handles, args, kwargs)
    return got is None or got.shape != ref.shape or not torch.allclose(got.float(), ref.float(), atol=1e-6, rtol=1e-5)


def _probe(model: nn.Module, handles: list, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """One no-grad forward with the hooks `handles` in place, removed afterwards (also on error): its first
    output tensor."""
    try:
        with torch.no_grad():
            return _first_tensor(model(*args, **kwargs))
    finally:
        for h in handles:
            h.remove()


def _check(model: nn.Module, description: dict, args: tuple, kwargs: dict) -> None:
    twin = copy.deepcopy(model)
    with torch.no_grad():
        ref = model(*args, **kwargs)
        inject(twin, PreProjConfig(init="identity", skip_init_std=0.0), host=description)
        got = twin(*args, **kwargs)
    a, b = _first_tensor(ref), _first_tensor(got)
    if a is None or not torch.allclose(a.float(), b.float(), atol=1e-5, rtol=0):
        raise ValueError("trace_seams: the traced description does not reproduce the model at identity init")


def _first_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    for key in ("logits", "last_hidden_state"):
        if isinstance(getattr(out, key, None), torch.Tensor):
            return getattr(out, key)
    if isinstance(out, (tuple, list)) and out:
        return _first_tensor(out[0])
    return None
