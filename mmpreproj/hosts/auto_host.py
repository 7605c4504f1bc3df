"""The host of the one call, `inject(model, config)` with no host: a row that claims the model by type; else the
trace (`trace.py`, unchecked: the injection itself checks the seams) on an example input (the caller's, or one
the model builds, `example_input.py`).

- A row matched by type is used as is (its own `check` refuses what it must).
- A row matched by structure (`hosts/structure.py`) is confirmed by the trace when an input can be had: a trace
  that refuses (post-norm, a multiplier between norm and attention) refuses the call with its reason; a trace
  that finds other attention modules than the row's (a linear attention the row leaves out) is injected instead;
  a trace that saw only part of the model (a vision tower a text input does not run) and agrees there keeps the row.
  So the one call, `trace_seams` and the forced row agree on which seams a model has.
- No row: the traced description is injected when it is exact, with one log line saying so; else the refusal
  says why, names the modules, and says what to write.
- A saved description no row writes (an adapter of a described host) is confirmed by the same trace at load
  (`check_described`): each attention it names must be a traced seam after its norm.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from .example_input import example_input as build_example_input
from .registry import HOSTS, HostSpec, _no_row, refuse_no_attention
from .spec import HostError, resolve_sites
from .structure import match_structure
from .trace import TraceError, trace_description

log = logging.getLogger("mmpreproj.inject")


def split_input(example_input: Any) -> tuple[tuple, dict]:
    """(args, kwargs) of an `example_input=`: a dict of keywords, a tuple/list of positionals, or one tensor."""
    if isinstance(example_input, dict):
        return (), example_input
    return (tuple(example_input) if isinstance(example_input, (tuple, list)) else (example_input,)), {}


def _attentions(model: nn.Module, spec: HostSpec) -> list[int] | None:
    """The attention modules `spec` wraps on `model`, one entry per site (two parts over one module: twice)."""
    try:
        return sorted(id(s.attention) for s in resolve_sites(model, spec))
    except (HostError, ValueError):
        return None


def one_call_host(model: nn.Module, example_input: Any = None) -> tuple[dict | None, Any]:
    """(the traced description to inject, or None where the row `find_host` gives decides; the example input
    to run after injecting: the caller's or the one built here, None when none could be built). ValueError with
    the reason when neither a row nor the trace describes `model`."""
    for spec in HOSTS.values():
        if spec.matches_model(model):
            return None, example_input
    refuse_no_attention(model)
    found = match_structure(model, HOSTS.values())
    x = example_input if example_input is not None else build_example_input(model)
    if x is None:
        if found.spec is not None:
            return None, None
        raise ValueError(_no_row(model, found) + "; to have it traced, pass example_input= (one forward's input)")
    args, kwargs = split_input(x)
    try:
        traced = trace_description(model, args, kwargs, partial=found.spec is not None)
    except TraceError as e:
        what = (
            "it is laid out as a host row, but the trace on an example input refuses its seams"
            if found.spec is not None
            else "no host row claims it, and the trace on an example input refuses it"
        )
        raise ValueError(f"mmpreproj cannot inject {type(model).__name__}: {what}: {e}") from None
    except Exception as e:  # the model could not run the input built for it
        if found.spec is not None and example_input is None:
            return None, None
        which, advice = (
            ("example_input=", "Pass a batch its forward takes (model(**batch))")
            if example_input is not None
            else ("the example input built for it", "Pass example_input= (one forward's input)")
        )
        raise ValueError(
            f"{_no_row(model, found)}; tracing it failed: the forward on {which} raised {type(e).__name__}: {e}. "
            f"{advice}"
        ) from None
    if found.spec is not None:
        row, seen = _attentions(model, found.spec), _attentions(model, HostSpec.from_dict(traced))
        if row == seen or (traced.get("left_out") and row is not None and seen is not None and set(seen) <= set(row)):
            return (
                None,
                x,
            )  # the trace agrees; where it saw part of the model (a tower the input does not run), no less
        if traced.get("left_out"):
            raise ValueError(
                f"mmpreproj cannot inject {type(model).__name__}: it is laid out as a host row, but "
                "the trace on an example input finds other attention modules "
                f"and leaves some out ({', '.join(list(traced['left_out'])[:4])}); pass example_input= "
                "reaching every tower, or host="
            )
    log.info(
        "mmpreproj: no host row describes %s; injecting the seams traced on an example input (%s)",
        type(model).__name__,
        ", ".join(f"{p['blocks']}.*.{p['attention']}" for p in traced["parts"]),
    )
    return traced, x


def check_described(model: nn.Module, spec: HostSpec, example_input: Any = None) -> None:
    """HostError unless every site of `spec` (a described host, read from an adapter file) whose norm runs on the
    example input is a seam the trace finds there: an attention-like module fed that norm's output. A description
    naming the MLP as the attention would otherwise wrap it silently (the seam check at the first forward compares
    values, and two norms at their init give equal ones). Nothing is said when no input can be had, the model
    cannot run it, or the trace refuses the model (the seam check at the first forward stays)."""
    x = example_input if example_input is not None else build_example_input(model)
    if x is None:
        return
    try:
        sites = [s for s in resolve_sites(model, spec) if s.norm is not None]  # `unchecked_seam` parts: no norm
    except (HostError, ValueError):
        return  # the plan names what does not fit
    ran: set[int] = set()
    hooks = [s.norm.register_forward_hook(lambda m, a, o: ran.add(id(m))) for s in sites]
    args, kwargs = split_input(x)
    try:
        traced = trace_description(model, args, kwargs, partial=True)
        seams = {(id(s.attention), id(s.norm)) for s in resolve_sites(model, HostSpec.from_dict(traced))}
    except Exception:
        return
    finally:
        for h in hooks:
            h.remove()
    for s in sites:
        if id(s.norm) in ran and (id(s.attention), id(s.norm)) not in seams:
            found = ", ".join(f"{p['blocks']}.*.{p['attention']} after {p['norm']}" for p in traced["parts"])
            raise HostError(
                f"saved with a host description whose part {s.part!r} wraps {type(s.attention).__name__} "
                f"{s.attr!r} of block {s.part_index} after norm {s.norm_path!r}, but the trace on an example input "
                f"finds no attention fed by that norm there (its seams: {found or 'none'}); the description does "
                "not fit this model, nothing was loaded"
            )


def check_forced(model: nn.Module, name: str, example_input: Any = None) -> None:
    """Refuse a forced row (`host=name`) on a model whose trace finds its seams post-norm, or a multiplier between
    norm and attention (MiniMax forced to `mistral`): the forced row and the trace agree. Nothing is said when no
    input can be had or the model cannot run it (the seam check at the first forward stays)."""
    x = example_input if example_input is not None else build_example_input(model)
    if x is None:
        return
    args, kwargs = split_input(x)
    try:
        trace_description(model, args, kwargs, partial=True)
    except TraceError as e:
        if "post-norm" in str(e) or "a multiplier between norm and attention" in str(e):
            raise ValueError(f"host {name!r} does not fit {type(model).__name__}: {e}") from None
    except Exception:
        return
