"""`trace_description`: find a model's (pre-attention norm -> attention) seams by running one forward.

Hooks record every norm-like module's output and every attention-like module's input; a seam is an
attention whose first input (positional, or `hidden_states=` / `x=` / `query=`) *is* a norm's output, both
inside the same block: the innermost numbered module that holds both (`model.layers.3`; LongCat-Flash's two
attentions of a layer, `self_attn.0` after `input_layernorm.0`, are two seams of `model.layers.3`), lifted
out of a list of mixed sublayers (T5's `block.3.layer`: `layer.0.SelfAttention`). Every argument slot of
that call holding the same tensor, by position or keyword, goes into `call.inputs` (query, key and value of
`nn.MultiheadAttention(y, y, y)`), so the attention reads `x~` wherever it read `x^`. A block with several
seams (a TimeSformer block's temporal and spatial attention) gives one part per seam over the same blocks.
A part applies only to the blocks where its path is a seam: in a hybrid stack (attention and Mamba or
recurrent layers in one list) the part gets `contains`, a path only those blocks have. The public call,
`mmpreproj.method.trace_seams` (`method/plan.py`), then injects at identity init into a copy and confirms that every
tensor the model returns is unchanged (`check=True`). The
probe forwards run in eval mode (dropout off), each from the same RNG state, so neither a train-mode model
nor random masking affects the answer, and the model and the caller's RNG are left as they were.

Never silently wrong, never silently partial. Refused with the reason: a post-norm seam (the norm's output
is also the residual stream: `_residual_stream` perturbs it for every reader but the block's submodules, and
a model output that moves means a plain tensor op read it; or the attention takes it as its `residual`
argument, BLOOM's `apply_residual_connection_post_layernorm`), a hybrid stack whose kinds no path tells
apart, and every attention-like module the description leaves out, each named with why (not run by the
example input, its input is no norm's output: cross-attention, a resampler, post-norm, a multiplier between
norm and attention). `partial=True` accepts such a description; the modules are then listed under its
`left_out`. Attention pooling heads (a learned probe attends, no norm in front) are listed, never refused.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..util.probing import probing
from .paths import HostError, get_path
from .spec import _block_list

# verify(model, description, args, kwargs, rng): raises TraceError when `description` does not reproduce `model`
Verify = Callable[[nn.Module, dict, tuple, dict, torch.Tensor], None]

_INPUT_KEYS = ("hidden_states", "x", "query", "input")
DESCRIBE_BY_HAND = (
    "describe the host by hand: inject(model, host={'name': ..., 'parts': [{'name': ..., 'blocks': ..., "
    "'attention': ..., 'norm': ...}]}) (see mmpreproj.hosts.spec)"
)


class TraceError(ValueError):
    """The trace found no exact description; the message says why and names the modules."""


def _is_norm(name: str, module: nn.Module) -> bool:
    """A norm: torch's, or a class named for one whose weights are vectors only (a class named for its model,
    `RobertaPreLayerNormAttention` or `...Embeddings`, holds matrices: no norm)."""
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
        return True
    return "norm" in type(module).__name__.lower() and all(p.dim() <= 1 for p in module.parameters())


def _is_attention(name: str, module: nn.Module) -> bool:
    kind = type(module).__name__.lower()
    leaf = name.rsplit(".", 1)[-1].lower()
    if kind.endswith(("layer", "block")) and "attention" not in leaf and "attn" not in leaf:
        return False  # a decoder layer named for its attention (JambaAttentionDecoderLayer) holds one
    return ("attention" in kind or "attn" in kind or "attn" in leaf or "attention" in leaf) and any(
        p.dim() == 2
        for p in module.parameters()  # has projections (Linear, Conv1D, in_proj_weight)
    )


def _is_pool(module: nn.Module) -> bool:
    return "Pool" in type(module).__name__


def _first_input(args: tuple, kwargs: dict) -> torch.Tensor | None:
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    for key in _INPUT_KEYS:
        if isinstance(kwargs.get(key), torch.Tensor):
            return kwargs[key]
    return None


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


def _numbered(path: str) -> list[int]:
    """Indices of the numbered components of a dotted path."""
    return [i for i, c in enumerate(path.split(".")) if c.isdigit()]


def _block_of(model: nn.Module, attn: str, norm: str) -> tuple[str, str] | None:
    """(blocks path, block path): the innermost numbered module holding both `attn` and `norm`, lifted out of a
    list whose items are of mixed classes (T5's `layer`: self-attention, cross-attention, feed-forward)."""
    a, n = attn.split("."), norm.split(".")
    cuts = [i for i in _numbered(attn) if a[: i + 1] == n[: i + 1] and len(n) > i + 1 and len(a) > i + 1]
    for i in reversed(cuts):
        blocks = ".".join(a[:i])
        try:
            items = _block_list(model, blocks)
        except HostError:
            continue
        if len({type(b) for b in items}) == 1 or i == cuts[0]:
            return blocks, ".".join(a[: i + 1])
    return None


def _flat(out: Any) -> list[torch.Tensor]:
    """Every floating tensor of a (nested) model output: a tensor, a tuple/list, a dict or ModelOutput."""
    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    return []


def same_outputs(a: list[torch.Tensor], b: list[torch.Tensor], atol: float) -> bool:
    return len(a) == len(b) and all(
        x.shape == y.shape and torch.allclose(x.float(), y.float(), atol=atol, rtol=1e-5, equal_nan=True)
        for x, y in zip(a, b)
    )


def trace_description(
    model: nn.Module, args: tuple, kwargs: dict, *, partial: bool = False, verify: Verify | None = None
) -> dict:
    """The host description of `model` found by running `model(*args, **kwargs)` once (no gradients); the
    public call is `mmpreproj.method.trace_seams`, whose check (`verify`: the description injected at identity
    init into a copy must reproduce the model) is the tuner's.

    Raises `TraceError` (a ValueError) naming the modules and the reason when no exact description is found:
    no seam, a post-norm seam, a hybrid stack no path tells apart, or attention modules left out (unless
    `partial`: they are then listed under the description's `left_out`, module name -> reason). The forwards
    run in eval mode from one RNG state: the caller's RNG and the model's train/eval flags are left as they were.
    """
    with probing(model):
        rng = torch.random.get_rng_state()
        return _trace(model, args, kwargs, verify, partial, rng)


def _trace(
    model: nn.Module, args: tuple, kwargs: dict, verify: Verify | None, partial: bool, rng: torch.Tensor
) -> dict:
    what = type(model).__name__
    named = dict(model.named_modules())
    calls, handles = _hook_calls(named)
    ref = probe_outputs(model, handles, args, kwargs, rng)
    seams = {n: c for n, c in calls.items() if c["norm"] is not None}
    parts, left = _seam_parts(model, named, seams, what)
    _leave_out_the_rest(named, parts, left, calls, seams)
    if not parts:
        raise TraceError(
            f"trace_seams: no attention module of {what} received a norm's output inside a numbered block"
            f"{_listed(left)}; {DESCRIBE_BY_HAND}"
        )
    for part in parts.values():
        _restrict_to_seams(model, part, what)
    for part in parts.values():
        _refuse_post_norm(model, args, kwargs, ref, named, part, what, rng)
        _skip_after_parent(named, part)
    for part in parts.values():  # output layout: tuple -> index 0, tensor -> null
        _set_output_index(model, args, kwargs, named, part, what, rng)
    description = {"name": "traced", "parts": list(parts.values())}
    missing = {n: why for n, why in left.items() if not why.startswith("attention pooling head")}
    if missing and not partial:
        raise TraceError(
            f"trace_seams: the seams found in {what} leave {len(missing)} attention module(s) out{_listed(missing)}. "
            "Run an example input that reaches every tower, or pass partial=True to trace_seams to take the "
            f"description without them, or {DESCRIBE_BY_HAND}"
        )
    if verify is not None:
        verify(model, description, args, kwargs, rng)
    if left:
        description["left_out"] = left
    return description


def _hook_calls(named: dict[str, nn.Module]) -> tuple[dict[str, dict], list]:
    """Hooks that record, during the next forward, every norm's output and what each attention-like module's
    first call received: ({attention name: its call}, the hook handles)."""
    norms: dict[int, tuple[torch.Tensor, str]] = {}  # id(output) -> (output kept alive, norm name)
    calls: dict[str, dict] = {}  # attention name -> what its first call received
    handles = []
    for name, module in named.items():
        if _is_norm(name, module):

            def record(m, a, out, name=name):
                if isinstance(out, torch.Tensor):
                    norms[id(out)] = (out, name)

            handles.append(module.register_forward_hook(record))
        elif name and _is_attention(name, module):

            def seen(m, a, kw, name=name):
                if name in calls:
                    return
                x = _first_input(a, kw)
                hit = norms.get(id(x)) if x is not None else None
                if hit is not None and hit[0] is x:
                    calls[name] = {"norm": hit[1], "slots": _slots_of(x, m, a, kw), "shape": tuple(x.shape)}
                else:
                    calls[name] = {
                        "norm": None,
                        "x": x,
                        "keys": [k for k, v in kw.items() if isinstance(v, torch.Tensor)],
                        "multiplied": _multiplied(x, name, norms),
                    }

            handles.append(module.register_forward_pre_hook(seen, with_kwargs=True))
    return calls, handles


def _seam_parts(
    model: nn.Module, named: dict[str, nn.Module], seams: dict[str, dict], what: str
) -> tuple[dict[tuple, dict], dict[str, str]]:
    """The parts the seams make, keyed (blocks, attention, norm), each with its `_seams`; and the seams left
    out (a norm outside the block), name -> reason. A post-norm seam (the normed input as `residual`) is refused."""
    left: dict[str, str] = {}
    parts: dict[tuple, dict] = {}
    for attn_name, seam in seams.items():
        if any(attn_name.startswith(outer + ".") and other["norm"] == seam["norm"] for outer, other in seams.items()):
            continue  # inside an attention fed the same norm (GPT-2's attn.c_attn): the outer one is the seam
        if any(inner.startswith(attn_name + ".") and other["norm"] != seam["norm"] for inner, other in seams.items()):
            continue  # holds its own norm -> attention seam (RoBERTa-PreLayerNorm's attention.LayerNorm -> .self)
        split = _block_of(model, attn_name, seam["norm"])
        if split is None:
            left[attn_name] = _why_left_out(named[attn_name], {"outside": seam["norm"]}, None)
            continue
        if any(k[1] == "residual" or "residual" in k[1] for k in seam["slots"]):
            raise TraceError(
                f"trace_seams: the seam {seam['norm']!r} -> {attn_name!r} of {what} is post-norm: the attention takes "
                "the norm's output also as its residual argument (the residual stream is the normed input, as with "
                "BLOOM's apply_residual_connection_post_layernorm=True); mmpreproj pre-projects only pre-norm seams"
            )
        blocks, block = split
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
                "_seams": [],
            }
        parts[key]["_seams"].append((block, attn_name, seam["norm"], seam["shape"]))
    return parts, left


def _leave_out_the_rest(
    named: dict[str, nn.Module],
    parts: dict[tuple, dict],
    left: dict[str, str],
    calls: dict[str, dict],
    seams: dict[str, dict],
) -> None:
    """Add to `left` every attention-like module no part covers, with the reason."""
    covered = [s[1] for p in parts.values() for s in p["_seams"]]
    for name, module in named.items():
        if not name or not _is_attention(name, module) or name in left:
            continue
        if any(name == c or name.startswith(c + ".") or c.startswith(name + ".") for c in covered):
            continue
        if any(name.startswith(o + ".") for o in left):
            continue
        left[name] = _why_left_out(module, calls.get(name), seams.get(name))


def _refuse_post_norm(
    model: nn.Module,
    args: tuple,
    kwargs: dict,
    ref: list[torch.Tensor],
    named: dict[str, nn.Module],
    part: dict,
    what: str,
    rng: torch.Tensor,
) -> None:
    """TraceError when the norm's output of the part's first seam is also its block's residual stream."""
    block, attn_name, norm_name, _ = part["_seams"][0]
    if _residual_stream(model, args, kwargs, ref, named[block], named[norm_name], rng):
        raise TraceError(
            f"trace_seams: the seam {norm_name!r} -> {attn_name!r} of {what} is post-norm: the output of "
            f"{norm_name!r} is also the block's residual stream (it reaches the block's output other than as the "
            "input of a module), so pre-projecting it would change what the residual carries; mmpreproj "
            "pre-projects only pre-norm seams (the norm's output feeds modules only)"
        )


def _skip_after_parent(named: dict[str, nn.Module], part: dict) -> None:
    """Where the norm sits inside the attention's own parent module and that parent has weights besides the two
    (the pre-LN BERTs: `attention.LayerNorm -> attention.self`, then `attention.output.dense` and the residual add),
    the skip joins the parent's output (`skip_to`), after its projection: `x + W_o attn_out + W_skip x~` as the
    paper writes it, not `W_o (attn_out + W_skip x~)`. T5's `layer.0` (norm, attention, dropout) needs none."""
    parent = part["attention"].rpartition(".")[0]
    if not parent or not part["norm"].startswith(parent + "."):
        return
    inner = tuple(path[len(parent) + 1 :] + "." for path in (part["attention"], part["norm"]))  # ("self.", ...)
    attn_name = part["_seams"][0][1]  # the first seam's full name: its parent is the module in question
    if any(not n.startswith(inner) for n, _ in named[attn_name.rpartition(".")[0]].named_parameters()):
        part["skip_to"] = parent


def _set_output_index(
    model: nn.Module, args: tuple, kwargs: dict, named: dict[str, nn.Module], part: dict, what: str, rng: torch.Tensor
) -> None:
    """Drop the part's `_seams` and set its output layout (tuple -> index 0, tensor -> null) from one forward;
    TraceError when the attention's output is not shaped as its input (a class attention)."""
    _, attn_name, _, shape = part.pop("_seams")[0]
    out = {}
    h = named[attn_name].register_forward_hook(lambda m, a, o, out=out: out.setdefault("o", o))
    probe_outputs(model, [h], args, kwargs, rng)
    part["call"]["output_index"] = 0 if isinstance(out.get("o"), tuple) else None
    got = out.get("o")[0] if isinstance(out.get("o"), tuple) else out.get("o")
    if isinstance(got, torch.Tensor) and tuple(got.shape) != shape:
        raise TraceError(
            f"trace_seams: {attn_name!r} of {what} returns shape {tuple(got.shape)} "
            "for an input of shape "
            f"{shape} (a class attention that updates only the class token): the content skip "
            f"cannot be added to its output; {DESCRIBE_BY_HAND}"
        )


def _multiplied(x: torch.Tensor | None, name: str, norms: dict) -> str | None:
    """The norm (of the attention's block) whose output `x` is a multiple of: a multiplier between them."""
    if x is None or not x.is_floating_point():
        return None
    for out, norm in list(norms.values())[::-1]:
        if out.shape == x.shape and out is not x and out.abs().sum() > 0:
            scale = (x * out).sum() / (out * out).sum()
            if torch.allclose(x, out * scale, atol=1e-6, rtol=1e-4):
                return f"{norm}' output times {float(scale):.3g}"
    return None


def _why_left_out(module: nn.Module, call: dict | None, seam: dict | None) -> str:
    if _is_pool(module):
        return "attention pooling head (a learned probe attends; no norm in front)"
    if call is None:
        return "not run by the example input (a tower, branch or layer kind this input does not reach)"
    if call.get("outside"):
        return (
            f"its input is the output of {call['outside']!r}, a norm outside its numbered block (post-norm: the "
            "previous block's or the embeddings' norm)"
        )
    if call.get("multiplied"):
        return (
            f"its input is '{call['multiplied']} (a multiplier between norm and attention: the input is not "
            "the norm's output itself, so the pre-projection has no seam to sit on)"
        )
    if call.get("x") is None:
        return (
            f"called without a hidden_states/x/query input (keywords {call.get('keys')}): a resampler or "
            "cross-attention"
        )
    return "its input is no norm's output (post-norm, cross-attention, or a norm not recognised by its class name)"


def _listed(left: dict[str, str], most: int = 6) -> str:
    if not left:
        return ""
    items = list(left.items())
    shown = "; ".join(f"{n!r}: {why}" for n, why in items[:most])
    more = f"; and {len(items) - most} more" if len(items) > most else ""
    return f" ({shown}{more})"


def _restrict_to_seams(model: nn.Module, part: dict, what: str) -> None:
    """Give `part` a `contains` path when not every block of its list is one of its seams (a hybrid stack)."""
    items = _block_list(model, part["blocks"])
    seam_ids = {int(s[0].rsplit(".", 1)[1]) for s in part["_seams"]}
    others = [i for i in range(len(items)) if i not in seam_ids]
    if not others:
        return
    attention = part["attention"]
    first = get_path(items[min(seam_ids)], attention)
    candidates = [attention] + [f"{attention}.{c}" for c, _ in first.named_children()]
    for path in candidates:
        if all(_has(items[i], path) for i in seam_ids) and not any(_has(items[i], path) for i in others):
            part["contains"] = path
            return
    raise TraceError(
        f"trace_seams: {what}'s {part['blocks']!r} mixes layer kinds: {attention!r} is an attention seam in blocks "
        f"{sorted(seam_ids)} only, and no path tells those blocks from blocks {others} (a hybrid stack); give the "
        f"part a 'contains' path only its attention blocks have, or {DESCRIBE_BY_HAND}"
    )


def _has(block: nn.Module, path: str) -> bool:
    try:
        get_path(block, path)
    except HostError:
        return False
    return True


def _residual_stream(
    model: nn.Module,
    args: tuple,
    kwargs: dict,
    ref: list[torch.Tensor],
    block: nn.Module,
    norm: nn.Module,
    rng: torch.Tensor,
) -> bool:
    """True if the norm's output is (also) the residual stream: a post-norm seam.

    The rule: in a pre-norm block the norm's output `y` is only ever the input of modules (the attention; in
    a parallel block the MLP too), while in a post-norm block `y` is also added to the sublayer's output as
    the residual (`y + attn(y)`), a plain tensor op. One forward perturbs `y` for every reader and hands
    every submodule of the block the unperturbed `y` back: if the model's output still moves, something
    other than a module read `y`, so `y` carries the residual stream.
    """
    if not ref:
        return False
    clean: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(noisy) -> (noisy kept alive, clean)
    g = torch.Generator().manual_seed(0)

    def perturb(m, a, out):
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            noise = torch.randn(out.shape, generator=g).to(out)
            noisy = out + noise * (out.detach().abs().mean() + 1)
            clean[id(noisy)] = (noisy, out)
            return noisy
        return out

    def restore(m, a, kw):
        def fix(t):
            hit = clean.get(id(t)) if isinstance(t, torch.Tensor) else None
            return hit[1] if hit is not None and hit[0] is t else t

        return tuple(fix(t) for t in a), {k: fix(v) for k, v in kw.items()}

    handles = [norm.register_forward_hook(perturb)]
    handles += [
        m.register_forward_pre_hook(restore, with_kwargs=True)
        for m in block.modules()
        if m is not block and m is not norm
    ]
    got = probe_outputs(model, handles, args, kwargs, rng)
    return not same_outputs(got, ref, 1e-6)


def probe_outputs(model: nn.Module, handles: list, args: tuple, kwargs: dict, rng: torch.Tensor) -> list[torch.Tensor]:
    """One no-grad forward from the RNG state `rng` with the hooks `handles` in place, removed afterwards
    (also on error): every floating tensor it returns."""
    try:
        torch.random.set_rng_state(rng)
        with torch.no_grad():
            return _flat(model(*args, **kwargs))
    finally:
        for h in handles:
            h.remove()
