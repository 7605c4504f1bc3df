"""Which gradient-checkpointing switch a host family has, and whether it may be reentrant (`HostSpec.checkpointing`).

With every base weight frozen, a block's input does not require grad, and *reentrant* checkpointing would
give the injected weights no gradient; inject's hook on the embeddings then makes their output require grad
(`reentrant_checkpointing` says when). Each family switches checkpointing its own way:

- "transformers": a module's `gradient_checkpointing` (train mode only), counted as reentrant whichever
  checkpoint function it was given: which one is a private attribute, so the hook is on whenever checkpointing
  is, as transformers' and peft's own input-grad hooks are (off for non-reentrant, a step would save 1.6% in fp32
  and 0.8% under bf16 autocast: `bench/bench_checkpoint_hook.py`);
- "timm": `grad_checkpointing`, reentrant as `timm.layers.use_reentrant_ckpt()` says (timm < 1.0.13, which has
  none: reentrant, torch's default there);
- "open_clip": `grad_checkpointing`, never reentrant;
- "any" (a described host, whose family nothing names): every switch above by the module's package, and
  any other `gradient_checkpointing`/`grad_checkpointing` flag that is on counts as reentrant (the safe side).
"""

from __future__ import annotations

import sys

from torch import nn

CHECKPOINTING = ("transformers", "timm", "open_clip", "any")


def _transformers(m: nn.Module) -> bool | None:
    return True if getattr(m, "gradient_checkpointing", False) is True and m.training else None


def _timm(m: nn.Module) -> bool | None:
    if getattr(m, "grad_checkpointing", False) is True:
        # timm >= 1.0.13 says; before, its `checkpoint` calls took torch's default: reentrant
        use_reentrant = getattr(sys.modules.get("timm.layers"), "use_reentrant_ckpt", None)
        return bool(use_reentrant()) if use_reentrant is not None else True
    return None


def _open_clip(m: nn.Module) -> bool | None:
    return False if getattr(m, "grad_checkpointing", False) is True else None


def _any(m: nn.Module) -> bool | None:
    found = _transformers(m)
    if found is not None or getattr(m, "grad_checkpointing", False) is not True:
        return found
    family = type(m).__module__.split(".")[0]
    return _timm(m) if family == "timm" else _open_clip(m) if family == "open_clip" else True


_SWITCHES = {"transformers": _transformers, "timm": _timm, "open_clip": _open_clip, "any": _any}


def checkpointing_on(model: nn.Module) -> bool:
    """Whether some module of `model` checkpoints its blocks now, by any family's switch (transformers': in train
    mode only; timm's and open_clip's: whenever set)."""
    return any(_any(m) is not None for m in model.modules())


def reentrant_checkpointing(model: nn.Module, mode: str) -> bool:
    """True when some module of `model` is (or, for transformers' switch, may be) checkpointed reentrantly, read
    with `mode`'s switch."""
    if mode not in _SWITCHES:
        raise ValueError(f"checkpointing mode {mode!r}; allowed values: {list(CHECKPOINTING)}")
    switch = _SWITCHES[mode]
    return any(switch(m) for m in model.modules())
