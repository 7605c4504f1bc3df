"""Which dtype the injected modules compute in, and their weights cast to it (fp32 master weights).

The injected weights stay float32, the copy the optimizer updates. With `compute_dtype="input"` the modules
compute like one of the host's own linear layers: in the dtype of the activations they receive, or in the
autocast dtype when autocast is on, so a bf16 host pays bf16 matmuls only. `"float32"` is the earlier
behaviour: inputs are cast to the weights' dtype (autocast, when on, still decides the matmul dtype).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import onednn

COMPUTE_DTYPES = ("input", "float32")


def resolve_compute_dtype(mode: str, x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype a module computes in for input `x`: autocast's when on, else `x`'s ("input") or the weight's."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype if mode == "input" else weight.dtype


def plain_float32(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a module computes `F.linear(x, weight)` as is, with no graph to build: input and weight float32, no
    autocast, grad off (`generate`, `torch.no_grad`). Every compute mode gives that path there; the check is the
    decode step's whole per-module cost (each skipped call is paid per block per token)."""
    return (
        x.dtype is torch.float32
        and weight.dtype is torch.float32
        and not torch.is_grad_enabled()
        and not torch.is_autocast_enabled("cpu" if x.is_cpu else x.device.type)
    )


class WeightCasts:
    """A module's weights in a compute dtype.

    While a gradient is needed the cast is an autograd op, so gradients land in the fp32 parameters and no
    stale copy is ever used in training; such a forward also drops every kept cast, since an optimizer step
    follows it (fused optimizers update in place without bumping version counters; an fp32 training forward,
    which casts nothing, drops them too), and while a weight holds a gradient (after a backward, before
    `zero_grad`) none is kept. Otherwise (inference, `generate`) each of the module's own parameters is cast once
    per dtype and kept in a slot of its name, tied to that very tensor and to its storage, in-place version and
    device: `load_state_dict`/`load_adapter` (in-place copies, `torch.utils.swap_tensors`) and foreach/for-loop
    optimizer steps make a new cast, and the modules drop their casts on `.to()`. Any other tensor in a weight's
    place (torch.func's `functional_call` and transforms, a parametrization's computed weight) is cast on every
    call, never kept. A write torch does not version (through `.data`, a numpy array sharing the memory, a fused
    step on gradients set by hand and cleared before the next forward) is not seen, as autograd does not see it:
    `.to()` (any, even to the device the model is on) drops the casts. While torch.compile, torch.export or
    `torch.jit.trace` traces, the cast is a traced op (nothing kept, no guard per weight). A plain attribute, never
    in a state dict.
    """

    def __init__(self) -> None:
        # (name, dtype, layout) -> (the weight; its storage/version/device/shape when made; the copy): a weight
        # replaced (`assign=True`, a new Parameter) takes its slot over, so the cache holds the weights in use only
        self._casts: dict[tuple[str, torch.dtype, str], tuple[torch.Tensor, tuple, torch.Tensor]] = {}

    def clear(self) -> None:
        self._casts.clear()

    def __call__(self, weight: torch.Tensor, dtype: torch.dtype, name: str = "weight") -> torch.Tensor:
        """`weight` in `dtype`: kept under the module's `name` for it (one slot per name, dtype and layout)."""
        if torch.is_grad_enabled() and weight.requires_grad:  # a training forward, whatever the dtypes: a step follows
            self._casts.clear()
            return weight.to(dtype)
        if weight.dtype == dtype:
            return weight
        if torch.compiler.is_compiling() or torch.jit.is_tracing() or not self._keeps(weight):
            return weight.to(dtype)  # traced (torch.compile, export, jit.trace): one op of the graph, nothing kept
        return self._kept(weight, dtype, name)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, name: str = "weight") -> torch.Tensor:
        """`F.linear(x, weight cast to x.dtype)` where no graph is needed (the caller checks). bf16 on a CPU with
        oneDNN bf16 kernels goes through a copy prepacked once (`modules.onednn`: bit-identical, about twice as
        fast at batch-1 decode, where oneDNN otherwise reorders the weight on every call), kept in place of
        the plain cast; anything else uses the kept cast (`__call__`) and `F.linear`."""
        if onednn.usable(x, weight) and self._keeps(weight):
            return onednn.linear(x, self._kept(weight, x.dtype, name, "packed"))
        return F.linear(x, self(weight, x.dtype, name))

    def _keeps(self, weight: torch.Tensor) -> bool:
        """`keeps(weight)`, and no gradient waiting on it: between a backward and the optimizer step that may follow
        (a fused step updates in place without versioning) nothing is kept, and what was kept is dropped."""
        if not keeps(weight):
            return False
        if weight.grad is not None:
            self._casts.clear()
            return False
        return True

    def _kept(self, weight: torch.Tensor, dtype: torch.dtype, name: str, layout: str = "cast") -> torch.Tensor:
        """The weight in `dtype` and `layout` ("cast": as is; "packed": `onednn.pack`), made once and kept in the slot
        of `name` until the weight changes (another tensor, or its storage, in-place version, device or shape)."""
        key = (weight.data_ptr(), weight._version, weight.device, weight.shape)
        slot = (name, dtype, layout)
        hit = self._casts.get(slot)
        if hit is None or hit[0] is not weight or hit[1] != key:  # the same tensor, unchanged
            with torch.inference_mode(False), torch.no_grad():  # a normal tensor, usable outside inference mode
                cast = weight.detach().to(dtype)
                hit = (weight, key, onednn.pack(cast) if layout == "packed" else cast)
            self._casts[slot] = hit
        return hit[2]

    def __deepcopy__(self, memo: dict) -> WeightCasts:
        return WeightCasts()  # a copy's weights are new tensors: nothing cached applies to them

    def __getstate__(self) -> dict:
        return {"_casts": {}}  # pickling a module (torch.save) never carries casts


def keeps(weight: torch.Tensor) -> bool:
    """Whether a cast of `weight` may be kept: a module's own parameter (a tensor subclass's too, as torch tells
    them). A plain tensor in its place (torch.func's `functional_call`, a transform's wrapped tensor, a
    parametrization's computed weight) is new on every call, its address and id reused: cast each time."""
    return type(weight) is nn.Parameter or getattr(weight, "_is_param", False)  # `isinstance` costs a Python call


def check_width(dim: int) -> None:
    """A module's width d: an int > 0 (ValueError naming `dim`)."""
    if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
        raise ValueError(f"dim={dim!r}; must be an int > 0 (the width of the hidden states)")
