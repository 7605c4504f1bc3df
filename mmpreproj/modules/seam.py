"""`SeamCheck`: verifies once that an attention module really receives its block's pre-attention norm output.

A host row (or a user's description) says "block.norm feeds block.attention". If that is wrong, the
pre-projection would act on some other tensor and nothing would say so. While the block runs, the check
holds the norm's output (only until the check or the block ends) and, on the wrapper's first call inside
the block, compares it with the attention's input (`same_tensor`); a mismatch raises, a match removes the
hooks for good. A wrapper called on its own, outside its block, is not checked. Skipped while
`torch.compile` traces (the eager first call, or none, decides).

Not by identity alone: module hooks may hand the attention another tensor object for the norm's output.
DeepSpeed ZeRO-3 puts every module's outputs and inputs through an autograd function that returns
`detach()`ed views (same storage), and a user's forward hook may return a copy. Those pass (same storage and
layout, or equal values); a norm that has not run, or whose values differ, is still refused.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class SeamError(RuntimeError):
    """The attention did not receive the output of the norm its host description names."""


def same_tensor(seen: torch.Tensor, x: Any) -> bool:
    """Whether `x` is the norm output `seen` as hooks may pass it on: the object itself, a view of the same memory
    with the same layout (ZeRO-3's `detach()`), or a tensor of equal shape, dtype, device and values (a copy)."""
    if x is seen:
        return True
    if not isinstance(x, torch.Tensor) or (x.shape, x.dtype, x.device) != (seen.shape, seen.dtype, seen.device):
        return False
    if x.data_ptr() == seen.data_ptr() and x.stride() == seen.stride():
        return True
    with torch.no_grad():
        return bool(torch.equal(x, seen))


class SeamCheck:
    """One-shot check of the norm -> attention seam of one block.

    Args:
        block: the block whose forward arms the check.
        norm: the block's pre-attention norm module.
        where: how to name the site in the error ("host 'llama', part 'language', block 3").
        norm_path: the norm's path in the description (named in the error).
    """

    def __init__(self, block: nn.Module, norm: nn.Module, where: str, norm_path: str) -> None:
        self.where, self.norm_path = where, norm_path
        self._last: torch.Tensor | None = None  # the norm's output, held while the block runs
        self.armed = self.done = False
        self._handles = [
            block.register_forward_pre_hook(self._arm),
            block.register_forward_hook(self._disarm),
            norm.register_forward_hook(self._record),
        ]

    def _arm(self, module: nn.Module, args: tuple) -> None:
        if not torch.compiler.is_compiling():
            self.armed, self._last = True, None

    def _disarm(self, module: nn.Module, args: tuple, output: Any) -> None:
        if not torch.compiler.is_compiling():
            self.armed, self._last = False, None

    def _record(self, module: nn.Module, args: tuple, output: Any) -> None:
        if self.armed and isinstance(output, torch.Tensor) and not torch.compiler.is_compiling():
            self._last = output

    def verify(self, x: torch.Tensor) -> None:
        """Raise `SeamError` unless `x` is the tensor the norm returned in this block call (`same_tensor`); after a
        pass, stop."""
        if self.done or not self.armed or torch.compiler.is_compiling():
            return
        seen = self._last
        if seen is None or not same_tensor(seen, x):
            why = "the norm has not run before attention" if seen is None else "it received another tensor"
            raise SeamError(
                f"{self.where}: the attention does not receive the output of {self.norm_path!r} ({why}). "
                "The host description's norm/attention seam does not match this model's forward: the "
                "pre-projection must sit between the pre-attention norm and attention. Fix 'norm'/'attention' "
                "in the description, or unload the model."
            )
        self.close()

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles, self._last, self.done, self.armed = [], None, True, False

    def __deepcopy__(self, memo: dict) -> SeamCheck:
        # A copied model's norm keeps a copy of the hook (bound to this copy through `memo`); the copy
        # checks what the original had not checked yet.
        twin = SeamCheck.__new__(SeamCheck)
        memo[id(self)] = twin
        twin.where, twin.norm_path, twin._last, twin.done, twin.armed, twin._handles = (
            self.where,
            self.norm_path,
            None,
            self.done,
            False,
            [],
        )
        return twin
