"""No adapter switch while a step is in flight (`refuse_in_flight`): a forward of the injected model running on
some thread, or an autograd graph through the active adapter's weights awaiting its backward (`InFlight`)."""

from __future__ import annotations

import gc
import sys
import threading

from torch import nn

from .state import injected_modules

_CALL_CODES = frozenset({nn.Module._call_impl.__code__, nn.Module._wrapped_call_impl.__code__})


def _running_module(owner: nn.Module) -> tuple[str, str] | None:
    """(module name, thread name) of a module of `owner` whose call is on some thread's stack, else None."""
    mine = {id(m): name for name, m in owner.named_modules()}
    threads = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        f = frame
        while f is not None:
            if f.f_code in _CALL_CODES and id(f.f_locals.get("self")) in mine:
                return mine[id(f.f_locals["self"])] or type(owner).__name__, threads.get(ident, str(ident))
            f = f.f_back
    return None


def refuse_in_flight(owner: nn.Module, what: str) -> None:
    """RuntimeError while a forward of the injected `owner` runs (any thread) or a graph through its active
    adapter's weights awaits backward: an adapter switch then would mix adapters or lose the step."""
    running = _running_module(owner)
    if running is not None:
        raise RuntimeError(
            f"{what}: a forward/backward is in flight: {running[0]!r} of the injected model is running (thread "
            f"{running[1]!r}), so blocks before and after the switch would run different adapters; switch "
            "between steps"
        )
    flights = {id(w.flight): w.flight for w in injected_modules(owner) if getattr(w, "flight", None) is not None}
    graphs = sum(f.graphs for f in flights.values())
    if graphs:  # a graph held only by a reference cycle (a dropped exception's frames) is freed first
        gc.collect()
        graphs = sum(f.graphs for f in flights.values())
    if graphs:
        raise RuntimeError(
            f"{what}: a forward/backward is in flight: {graphs} autograd graph(s) built through the active "
            "adapter's weights have not been backwarded yet, so the switch would lose that step; call "
            "backward first (or drop those outputs, or run forwards that need no backward under torch.no_grad())"
        )
