"""`PreProjAttention`: peft's tuner layer of the method, wrapping a host's attention module with the
pre-projection and the content skip; and its seam check.

The wrapper replaces the block's attention attribute. It receives the normed input `x^` exactly as the
host's attention would, feeds `x~ = PreProj(x^)` to the original attention, and adds `W_skip · x~` to
the attention output. Whatever the block does with the attention output (dropout, LayerScale,
drop-path, the residual add) therefore applies to `attn_out + W_skip · x~` as a whole, and the MLP
never sees `x~` in a parallel-residual block.

No activations are kept between calls. What the wrapper does keep: the seam check until its first call
(then dropped), the observers a reader registered (`observe`, e.g. `mmpreproj.analysis.routing_ratios`),
and, inside the pre-projection and the skip, each weight cast once to the compute dtype for inference
(`modules.compute.WeightCasts`: a bf16 host would otherwise recast the fp32 weights on every decode step;
on a CPU with oneDNN bf16 kernels the kept copy is prepacked, `modules.onednn`; rebuilt after any in-place
update, never used while a gradient is needed or while torch.compile traces, never in a state dict).

`SeamCheck` verifies once that the attention really receives its block's pre-attention norm output. A host row
(or a user's description) says "block.norm feeds block.attention"; if that is wrong, the pre-projection would act
on some other tensor and nothing would say so. While the block runs, the check holds the norm's output (only
until the check or the block ends) and, on the wrapper's first call inside the block, compares it with the
attention's input (`same_tensor`); a mismatch raises, a match removes the hooks for good. A wrapper called on its
own, outside its block, is not checked. Skipped while `torch.compile` traces (the eager first call, or none,
decides). Not by identity alone: module hooks may hand the attention another tensor object for the norm's output
(DeepSpeed ZeRO-3 returns `detach()`ed views of the same storage, a user's hook may return a copy); those pass
(same storage and layout, or equal values); a norm that has not run, or whose values differ, is still refused.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

import torch
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn
from torch.utils.hooks import RemovableHandle

from ..hosts.checkpointing import checkpointing_on
from ..hosts.spec import AttentionCall
from ..modules.base_wrapper import BaseLayerWrapper
from ..modules.preproj import PreProjection
from ..modules.skip import ContentSkip


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


class SkipJoin:
    """Where the content skip joins when the host description names a module around the attention (`PartSpec.
    skip_to`, the pre-LN BERTs' `attention`, whose `output.dense` projects the attention's output before the
    residual add): the wrapper hands its skip over (`hand`), and a forward hook of that module adds it to the
    module's output (a tensor, or item 0 of a tuple), so the block computes `x + W_o attn_out + W_skip x~`. A
    pre-hook drops a skip left by a call that never reached the module, so nothing joins a later call twice.

    Args:
        module: the module whose output the skip joins (it holds the wrapper).
        where: how to name the site in the error ("host 'traced', part 'language', block 3").
    """

    def __init__(self, module: nn.Module, where: str) -> None:
        self.where = where
        self._skip: torch.Tensor | None = None  # held from the wrapper's return to the module's, within one call
        self._handles = [module.register_forward_pre_hook(self._drop), module.register_forward_hook(self._join)]

    def hand(self, skip: torch.Tensor) -> None:
        self._skip = skip

    def _drop(self, module: nn.Module, args: tuple) -> None:
        self._skip = None

    def _join(self, module: nn.Module, args: tuple, output: Any) -> Any:
        skip, self._skip = self._skip, None
        if skip is None:  # the adapters are off (`adapter_disabled`): the module's output as it is
            return None
        hidden = output if isinstance(output, torch.Tensor) else output[0] if isinstance(output, tuple) else None
        if not isinstance(hidden, torch.Tensor) or hidden.shape != skip.shape:
            got = tuple(hidden.shape) if isinstance(hidden, torch.Tensor) else type(output).__name__
            raise SeamError(
                f"{self.where}: the skip_to module returns {got}, but the skip joins the block's hidden states of "
                f"shape {tuple(skip.shape)}: fix 'skip_to' in the host description"
            )
        return hidden + skip if isinstance(output, torch.Tensor) else (hidden + skip, *output[1:])

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles, self._skip = [], None


MERGE_REFUSED = (
    "the pre-projection x~ = x^ + W_down SiLU(W_up x^) is nonlinear, so it cannot be folded into the host's "
    "Q/K/V weights, and the content skip adds a term beside attention: there is nothing to merge. Keep the "
    "adapter at inference (no K/V-cache cost), or use unload() to get the base model back"
)
ONE_ADAPTER_PER_FORWARD = (
    "PREPROJ runs one adapter per forward: two pre-projections would feed one into the other and two skips would "
    "add up, a model no adapter was trained as. Pass one name, or run a mixed batch (forward(..., "
    "adapter_names=[one name per row]))"
)
TUNER_PREFIX = "preproj"  # peft's prefix of the method: every slot name starts with it (`PreProjModel.prefix`)
BASE_ADAPTER = "__base__"  # in a mixed batch's adapter_names: the row runs through the host alone (peft's name)

# observer(wrapper, attn_out, skip_out): both (..., N, d), the two terms the wrapper adds, before the add
Observer = Callable[["PreProjAttention", torch.Tensor, torch.Tensor], None]


class PreProjAttention(BaseLayerWrapper, BaseTunerLayer):
    """The host's attention, fed `x~` and joined by the content skip: peft's tuner layer of PREPROJ.

    The adapter slots are `adapter_layer_names` ("preproj", "preproj_skip"): one `nn.ModuleDict` each, keyed by
    adapter name (a slot the config leaves out has no entry); `slots(name)` gives one adapter's two modules. The
    active adapter runs; `forward(..., adapter_names=[...])` runs each row of a batch through its own adapter
    ("__base__": none), as peft's mixed batches do. State-dict keys are peft's: `{path}.preproj.{adapter}.up.weight`,
    saved without the adapter name.

    Args:
        base_layer: the original attention module (kept as is; `get_base_layer()` returns it).
        call: how the host calls attention (`AttentionCall`).
        preproj: the pre-projection, or None for a skip-only ablation (then `x~ = x^`).
        skip: the content skip, or None for pre-projection only.
        block_index: index of the host block this wrapper sits in (over all parts, the adapter's index).
        part: the host part the block belongs to ("language", "vision", ...).
        seam_check: verifies on the first call that attention receives the pre-attention norm's output.
        adapter_name: the name of the first adapter (peft's "default").
    """

    adapter_layer_names = ("preproj", "preproj_skip")  # peft's rule: each starts with the prefix
    other_param_names: tuple[str, ...] = ()

    def __init__(
        self,
        base_layer: nn.Module,
        call: AttentionCall,
        preproj: PreProjection | None,
        skip: ContentSkip | None,
        block_index: int,
        part: str = "blocks",
        seam_check: SeamCheck | None = None,
        adapter_name: str = "default",
    ) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.call = call
        self.preproj = nn.ModuleDict()
        self.preproj_skip = nn.ModuleDict()
        self._width: int | None = None  # the block's width d (`adapter_width`), kept when every adapter is deleted
        BaseTunerLayer.set_adapter(self, adapter_name)  # peft's record of what runs (no modules yet: no flag changes)
        self.update_layer(adapter_name, preproj, skip)
        self.merged_adapters = []
        self.block_index = block_index
        self.part = part
        self.seam_check = seam_check
        # set by the injection when it trains modules_to_save in place: the host's modules hold the active adapter's
        # values, the other adapters' and the base's wait aside (a layer alone can neither switch nor mix them)
        self.values_aside = False
        self._output_checked = False  # the first call checks the output the skip goes to (`_check_output`)
        self._ran = False  # until the host attention has run once: inputs checked, its errors reported with the seam
        self.seam: str | None = None  # the seam in words ("norm 'ln_1' -> attention 'attn'"), set by inject
        self.skip_join: SkipJoin | None = None  # set by inject where the skip joins a module around the attention
        self._observers: OrderedDict[int, Observer] = OrderedDict()

    # --- peft's layer interface (`BaseTunerLayer`; merging is refused) ------------------------------------

    def update_layer(self, adapter_name: str, preproj: PreProjection | None, skip: ContentSkip | None) -> None:
        """Add adapter `adapter_name`'s modules (peft's `update_layer`); its width must be this block's."""
        if preproj is None and skip is None:
            raise ValueError("PreProjAttention needs a preproj, a skip, or both")
        if adapter_name in self._get_available_adapters():
            raise ValueError(f"PreProjAttention: adapter {adapter_name!r} is already in this layer")
        widths = {m.dim for m in (preproj, skip) if m is not None} | ({self._width} if self._width else set())
        if len(widths) != 1:
            raise ValueError(f"PreProjAttention: adapter {adapter_name!r} has width(s) {sorted(widths)}, one expected")
        (self._width,) = widths
        if preproj is not None:
            self.preproj[adapter_name] = preproj
        if skip is not None:
            self.preproj_skip[adapter_name] = skip
        self._sync_slots()

    def set_adapter(self, adapter_names: str | list[str], inference_mode: bool = False) -> None:
        """Make the one adapter of `adapter_names` this layer holds the active one; it trains unless
        `inference_mode` (peft's rule). Names it does not hold are another tuner's (a LoRA switching its own
        adapters): with none of ours among them, the layer is left as it is. Refused while `values_aside` (the
        injection's `modules_to_save` hold the active adapter's values: a layer alone cannot move them)."""
        given = [adapter_names] if isinstance(adapter_names, str) else list(adapter_names)
        names = [n for n in given if n in self._get_available_adapters()]
        if self.values_aside and names and names != list(self.active_adapters):
            raise ValueError(
                f"set_adapter({names[0]!r}) on one layer: this injection trains modules_to_save in place, each "
                "adapter's values kept aside while another runs, which a layer alone cannot move; switch the model: "
                "mmpreproj.set_adapter(model, name) or peft_model.set_adapter(name) (nothing was changed)"
            )
        self.activate(given, inference_mode)

    def activate(self, adapter_names: list[str], inference_mode: bool = False) -> None:
        """`set_adapter` without the `values_aside` check (the injection's own switch, which moves the values). An
        empty list is peft's "no active adapter" (`delete_adapter` of the last one): the host then runs alone."""
        names = [n for n in adapter_names if n in self._get_available_adapters()]
        if not adapter_names:
            BaseTunerLayer.set_adapter(self, [], inference_mode=inference_mode)
            self._sync_slots()
            return
        if not names:
            return
        if len(names) != 1:
            raise ValueError(f"set_adapter({names}): {ONE_ADAPTER_PER_FORWARD}")
        BaseTunerLayer.set_adapter(self, names[0], inference_mode=inference_mode)
        self._sync_slots()

    def delete_adapter(self, adapter_name: str) -> None:
        """peft's `delete_adapter`: a deleted active adapter hands over to the first remaining one, and with none
        left the host attention runs alone, as a LoRA layer without adapters (`unload` takes the wrapper off).
        Refused for the last one while `values_aside`: the host's `modules_to_save` hold its values, which a layer
        alone cannot put back (the model's `delete_adapter` does)."""
        if self.values_aside and self._all_available_adapter_names() == [adapter_name]:
            raise ValueError(
                f"delete_adapter({adapter_name!r}) on one layer: it is the last adapter and this injection trains "
                "modules_to_save in place, whose values go back to the base's with it, which a layer alone cannot "
                "do; delete it through the model: mmpreproj.delete_adapter(model, name) or "
                "peft_model.delete_adapter(name) (nothing was changed)"
            )
        BaseTunerLayer.delete_adapter(self, adapter_name)
        self._sync_slots()

    def merge(self, safe_merge: bool = False, adapter_names: list[str] | None = None) -> None:
        raise ValueError(f"merge: {MERGE_REFUSED}")

    def unmerge(self) -> None:
        raise ValueError(f"unmerge: nothing is ever merged ({MERGE_REFUSED})")

    def _move_adapter_to_device_of_base_layer(self, adapter_name: str, device: torch.device | None = None) -> None:
        """Move adapter `adapter_name`'s slot modules to `device`, else to the base layer's device; their dtype stays
        (peft would cast them to the base's: ours keep their own). peft calls it after a `low_cpu_mem_usage=True`
        load, which puts the file's tensors in place of the weights, on the device it loaded them to."""
        base = self.get_base_layer()
        target = torch.device(device) if device is not None else next((t.device for t in base.parameters()), None)
        if target is None or target.type == "meta":
            return
        for slot in self.adapter_layer_names:
            modules = getattr(self, slot)
            if adapter_name in modules:
                modules[adapter_name].to(target)

    def enable_adapters(self, enabled: bool) -> None:
        """Run the adapters (True) or the host attention alone (False). Unlike peft's default, `requires_grad`
        is left as it is: a disabled pass (`adapter_disabled`, peft's `disable_adapter()`) never thaws a frozen
        adapter."""
        flags = [(p, p.requires_grad) for name in self.adapter_layer_names for p in getattr(self, name).parameters()]
        BaseTunerLayer.enable_adapters(self, enabled)  # peft's switch, which also sets requires_grad: put back
        for p, flag in flags:
            p.requires_grad_(flag)
        self._sync_slots()

    def _sync_slots(self) -> None:
        """Keep the active adapter's modules at hand: read once per forward (no name lookups on the decode path)."""
        active = tuple(self.active_adapters)
        self._active_slots = self.slots(active[0]) if len(active) == 1 else (None, None)

    @property
    def adapter_enabled(self) -> bool:
        """Whether the adapters run (peft's `not disable_adapters`)."""
        return not self.disable_adapters

    @adapter_enabled.setter
    def adapter_enabled(self, enabled: bool) -> None:
        self.enable_adapters(enabled)

    def adapter_names(self) -> list[str]:
        """The adapters this layer holds, sorted."""
        return self._all_available_adapter_names()

    def slots(self, adapter_name: str | None = None) -> tuple[PreProjection | None, ContentSkip | None]:
        """(pre-projection, skip) of `adapter_name` (default: the active adapter, or none once every adapter is
        deleted); None for a slot it lacks."""
        if adapter_name is None and not self.active_adapters:
            return None, None
        name = self.active_adapters[0] if adapter_name is None else adapter_name
        pre = self.preproj[name] if name in self.preproj else None  # noqa: SIM401 (ModuleDict has no .get)
        skip = self.preproj_skip[name] if name in self.preproj_skip else None  # noqa: SIM401
        return pre, skip

    @property
    def adapter_width(self) -> int:
        """The width d of the block's hidden states."""
        return self._width

    def observe(self, fn: Observer) -> RemovableHandle:
        """Call `fn(wrapper, attn_out, skip_out)` on every forward that adds the skip; `.remove()` the handle.

        The wrapper hands over the two terms it adds, so a reader needs no hook on the host's internals. Where the
        skip joins a module around the attention (`skip_join`, the pre-LN BERTs) `attn_out` is the wrapped
        attention's own output, before that module's projection `W_o`: in `x + W_o attn_out + W_skip x~`, the
        `attn_out`.
        """
        if not callable(fn):
            raise TypeError(f"observe(fn={fn!r:.60}): fn must be callable as fn(wrapper, attn_out, skip_out)")
        handle = RemovableHandle(self._observers)
        self._observers[handle.id] = fn
        return handle

    def _swap_inputs(
        self, args: tuple, kwargs: dict, pre: Callable[[torch.Tensor], torch.Tensor] | None
    ) -> tuple[tuple, dict, torch.Tensor | None, torch.Tensor | None]:
        """Replace every `x^` argument by `x~ = pre(x^)` (None: `x~ = x^`); return the new args, the first `x^`
        and its `x~` (for the skip)."""
        args = list(args)
        done: dict[int, torch.Tensor] = {}  # id(x^) -> x~, so q = k = v is pre-projected once
        first = first_in = None
        for pos, key in self.call.inputs:
            if pos < len(args):
                container, slot = args, pos
            elif key in kwargs:
                container, slot = kwargs, key
            else:
                continue
            x = container[slot]
            if x is None:
                continue
            if not self._ran and id(x) not in done:  # the slots are static: the first call settles them
                self._check_input(x, pos, key)
            if self.seam_check is not None and first is None:
                self.seam_check.verify(x)
                if self.seam_check.done:  # checked once: no further cost on the hot path
                    self.seam_check = None
            if id(x) not in done:
                done[id(x)] = pre(x) if pre is not None else x
            container[slot] = done[id(x)]
            if first is None:
                first, first_in = done[id(x)], x
        return tuple(args), kwargs, first_in, first

    def _check_input(self, x: Any, pos: int, key: str) -> None:
        """The argument at `call.inputs` entry (pos, key) must be x^: a float tensor (..., N, d) of this block's
        width."""
        width = self.adapter_width
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() >= 2 and x.shape[-1] == width:
            return
        got = (
            f"a {x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else f"a {type(x).__name__}"
        )
        raise TypeError(
            f"PreProjAttention (part {self.part!r}, block {self.block_index}): the host description's call.inputs "
            f"entry [{pos}, {key!r}] gives {got}, not the normed input x^ (a float tensor (..., N, {width})); fix "
            "'call' (inputs: [[position, keyword], ...]) to name the argument that carries the block's hidden states"
        )

    def forward(self, *args: Any, adapter_names: list[str] | None = None, **kwargs: Any) -> Any:
        if self.disable_adapters:
            return self.base_layer(*args, **kwargs)
        if adapter_names is not None:
            pre, skip = self._mixed_batch(adapter_names)
        else:
            pre, skip = self._active_slots
        args, kwargs, x, x_tilde = self._swap_inputs(args, kwargs, pre)
        if x_tilde is None:
            raise RuntimeError(
                f"PreProjAttention (part {self.part!r}, block {self.block_index}) found no attention input among "
                f"call.inputs {[list(i) for i in self.call.inputs]}; the host description's 'call' does not match how "
                "this block calls attention"
            )
        out = self.base_layer(*args, **kwargs) if self._ran else self._first_call(args, kwargs)
        if skip is None:
            return out
        skip = skip(x_tilde)  # (..., N, d), same layout as the attention output
        if not self._output_checked:
            self._check_output(out, skip)
        tensor_out = isinstance(out, torch.Tensor)
        i = self.call.output_index
        attn = out if tensor_out else out[i]
        for fn in self._observers.values():
            fn(self, attn, skip)
        if self.skip_join is not None:  # joins the output of the module around the attention (`SkipJoin`)
            self.skip_join.hand(skip)
            return out
        y = attn + skip
        return y if tensor_out else (*out[:i], y, *out[i + 1 :])

    def _mixed_batch(self, adapter_names: list[str]) -> tuple[Callable | None, Callable | None]:
        """(x -> x~, x~ -> skip) running row b of the batch (dim 0) through adapter `adapter_names[b]`
        ("__base__": the host alone, `x~ = x^` and no skip), as peft's `_mixed_batch_forward` does for LoRA."""
        known = set(self._get_available_adapters())
        unknown = sorted({n for n in adapter_names if n not in known and n != BASE_ADAPTER})
        if unknown:
            raise ValueError(
                f"forward(adapter_names=...): {unknown} are not adapters of this layer "
                f"(loaded: {sorted(known)}, or {BASE_ADAPTER!r} for the base model)"
            )
        # the host's modules_to_save hold the active adapter's values, or the base's once every adapter is deleted
        served = set(self.active_adapters) or {BASE_ADAPTER}
        others = sorted(set(adapter_names) - served) if self.values_aside else []
        if others:
            holder = f"the active adapter {self.active_adapters[0]!r}" if self.active_adapters else "the base"
            raise ValueError(
                f"forward(adapter_names=...): rows of {others} would run through the modules_to_save of {holder} "
                "(this injection trains them in place, one value for the whole batch); run each adapter's rows as "
                "their own batch after set_adapter"
            )
        if getattr(self.base_layer, "batch_first", True) is False:  # nn.MultiheadAttention's (N, B, d) layout
            raise ValueError(
                f"forward(adapter_names=...): the attention of block {self.block_index} "
                f"({type(self.base_layer).__name__}, batch_first=False) takes the batch in dim 1; mixed batches "
                "need it in dim 0: run each adapter's rows as their own batch after set_adapter"
            )
        groups: dict[str, list[int]] = {}
        for row, name in enumerate(adapter_names):
            groups.setdefault(name, []).append(row)

        def rows(slot: nn.ModuleDict, x: torch.Tensor, keep: bool) -> torch.Tensor:
            where = f"the attention of block {self.block_index} (part {self.part!r})"
            if len(groups) == 1:  # one adapter for every row: the whole input through it (a packed one too)
                if x.dim() >= 3 and x.shape[0] != len(adapter_names):
                    raise ValueError(
                        f"forward(adapter_names=...): {len(adapter_names)} names for {x.shape[0]} rows in {where} "
                        f"(dim 0 of its input {tuple(x.shape)}); pass one adapter name per row of the batch"
                    )
                (name,) = groups
                return slot[name](x) if name in slot else (x if keep else torch.zeros_like(x))
            if x.dim() < 3:
                raise ValueError(
                    f"forward(adapter_names=...): {where} takes an input of shape {tuple(x.shape)}, with no batch "
                    "dimension (the patches of every image packed into one sequence, as in Qwen2-VL's vision tower), "
                    "so its rows cannot be told apart: run each adapter's rows as their own batch after set_adapter, "
                    "or inject that part's blocks only where mixed batches are not needed (parts=/layers=)"
                )
            if x.shape[0] != len(adapter_names):
                raise ValueError(
                    f"forward(adapter_names=...): {len(adapter_names)} names for {x.shape[0]} rows in {where} "
                    f"(dim 0 of its input {tuple(x.shape)}); pass one adapter name per row of the batch (a "
                    "vision tower sees one row per image: a mixed batch needs one image per row there)"
                )
            out = x.clone() if keep else torch.zeros_like(x)
            for name, index in groups.items():
                if name in slot:
                    at = torch.tensor(index, device=x.device)
                    out = out.index_copy(0, at, slot[name](x.index_select(0, at)).to(out.dtype))
            return out

        pre = (lambda x: rows(self.preproj, x, keep=True)) if len(self.preproj) else None
        skip = (lambda x: rows(self.preproj_skip, x, keep=False)) if len(self.preproj_skip) else None
        return pre, skip

    def _first_call(self, args: tuple, kwargs: dict) -> Any:
        """The host attention's first call with x~: an error there (an attention that reshapes its input, a
        wrong description) is raised as SeamError naming the part, block and seam. Later calls skip this."""
        if torch.compiler.is_compiling():
            return self.base_layer(*args, **kwargs)
        try:
            out = self.base_layer(*args, **kwargs)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:
            seam = f" ({self.seam})" if self.seam else ""
            raise SeamError(
                f"PreProjAttention (part {self.part!r}, block {self.block_index}){seam}: the host attention failed "
                f"on its first call with the pre-projected input: {type(e).__name__}: {e}. The host description "
                "does not fit this block (see 'attention', 'norm' and 'call'); unload the model "
                "(mmpreproj.unload), fix the description, and pass inject(..., example_input=...) to check it at "
                "inject"
            ) from e
        self._ran = True
        return out

    def _check_output(self, out: Any, skip: torch.Tensor) -> None:
        """On the first call: the output the skip is added to must have the attention input's shape exactly,
        else SeamError naming the index that fits (a wrong `output_index` could otherwise broadcast, e.g. eager
        attention weights (B, H, N, N) when N == d). The index is static, so one passing call settles it."""
        i = self.call.output_index
        try:
            attn = out if isinstance(out, torch.Tensor) else out[i]
        except (IndexError, KeyError, TypeError):  # no item i (or i is None on a tuple)
            attn = None
        if isinstance(attn, torch.Tensor) and attn.shape == skip.shape:
            if not torch.compiler.is_compiling():
                self._output_checked = True
            return
        if isinstance(out, torch.Tensor):
            got, fits = f"returns one tensor of shape {tuple(out.shape)}", []
        else:
            items = list(out) if isinstance(out, (tuple, list)) else []
            picked = items[i] if i is not None and i < len(items) else None
            got = f"returns a {type(out).__name__} of {len(items)} items"
            if i is None:
                got += ", not one tensor"
            elif isinstance(picked, torch.Tensor):
                got += f"; item {i} has shape {tuple(picked.shape)}"
            else:
                got += f"; item {i} is {'missing' if i >= len(items) else type(picked).__name__}"
            fits = [j for j, o in enumerate(items) if isinstance(o, torch.Tensor) and o.shape == skip.shape]
        hint = f"output_index {fits[0]} would fit" if fits else "no output has that shape"
        raise SeamError(
            f"PreProjAttention (part {self.part!r}, block {self.block_index}): with call.output_index={i} the "
            f"attention {got}, but the skip must be added to a tensor of the attention input's shape "
            f"{tuple(skip.shape)}; {hint}: fix 'call.output_index' in the host description"
        )

    def disarm(self) -> None:
        """Take the seam check and the skip join off the host's modules (the wrapper leaves the model)."""
        for attr in ("seam_check", "skip_join"):
            if getattr(self, attr, None) is not None:
                getattr(self, attr).close()
                setattr(self, attr, None)

    def unload_and_optionally_merge_module(
        self, merge: bool = False, safe_merge: bool = False, adapter_names: list[str] | None = None
    ) -> PreProjAttention:
        """peft's unload hook: keep this wrapper (it is ours, not peft's).

        peft's `unload()` / `merge_and_unload()` treat any module with a `base_layer` as one of their tuner
        layers; this method tells them to leave it in place, so they unload (or merge) only the LoRA layers
        inside `base_layer` and `mmpreproj.unload` takes the injection off afterwards.
        """
        return self

    def extra_repr(self) -> str:
        return (
            f"part={self.part!r}, block_index={self.block_index}, "
            f"active_adapter={next(iter(self.active_adapters), None)!r}, adapter_enabled={self.adapter_enabled}"
        )


def beam_copies(kwargs: dict) -> int:
    """How many rows `generate` makes of each prompt for a mixed batch's names: `num_beams` under beam search, else 1,
    as peft counts for LoRA (with sampling and `num_return_sequences`, one name per returned row, as for LoRA)."""
    beams = kwargs.get("num_beams")
    return beams if isinstance(beams, int) and not isinstance(beams, bool) and beams > 1 else 1


def encoder_of(model: nn.Module) -> nn.Module | None:
    """The encoder of an encoder-decoder model (transformers' `get_encoder()`, which returns the model itself where
    there is none), else None: under beam search it runs once per prompt, so it takes the names as passed."""
    get = getattr(model, "get_encoder", None)
    encoder = get() if callable(get) else None
    return encoder if isinstance(encoder, nn.Module) and encoder is not model else None


def hand_mixed_names(
    model: nn.Module, wrappers: Sequence[nn.Module], names: Sequence[str], loaded: Iterable[str], kwargs: dict
) -> tuple[list[str], list[RemovableHandle]]:
    """A mixed batch's `names` handed to `wrappers` as peft hands them to LoRA's layers (`hand_adapter_names`), in
    `generate` too: each repeated `beam_copies(kwargs)` times, and the wrappers of an encoder-decoder's encoder given
    the names as passed (it runs once per prompt). Returns the names the decoder rows get, and the handles."""
    repeat = beam_copies(kwargs)
    rows = [n for n in names for _ in range(repeat)]
    handles = hand_adapter_names(model, wrappers, rows, loaded)
    encoder = encoder_of(model)
    if repeat > 1 and encoder is not None:  # registered after: its names replace the repeated ones there
        inside = {id(m) for m in encoder.modules()}
        handles += hand_adapter_names(model, [w for w in wrappers if id(w) in inside], list(names), loaded)
    return rows, handles


def hand_adapter_names(
    model: nn.Module, wrappers: Iterable[nn.Module], names: Sequence[str], loaded: Iterable[str]
) -> list[RemovableHandle]:
    """A mixed batch's `names` (one per row; `BASE_ADAPTER`: the host alone), checked against the `loaded`
    adapters, handed to each of `wrappers`' forward through a pre-hook, as peft hands them to LoRA's layers;
    the caller removes the handles after the call. Refused while `model` checkpoints its blocks and gradients are
    on: the recompute in backward runs after the call, without the names, so the gradients would be another
    batch's (torch's non-reentrant checkpoint says so; the reentrant one would not)."""
    known = {*loaded, BASE_ADAPTER}
    unknown = sorted({n for n in names if n not in known})
    if unknown:
        raise ValueError(f"forward(adapter_names=...): {unknown} are not loaded adapters ({sorted(known)})")
    if torch.is_grad_enabled() and checkpointing_on(model):
        raise ValueError(
            "forward(adapter_names=...): a mixed-adapter batch with gradient checkpointing on is refused: the blocks "
            "run again in backward, after this call, without the names, so the gradients would be another batch's; "
            "turn checkpointing off for it (model.gradient_checkpointing_disable()), run it under torch.no_grad(), "
            "or run each adapter's rows as their own batch (nothing was changed)"
        )
    hook = partial(_pass_adapter_names, list(names))
    return [w.register_forward_pre_hook(hook, with_kwargs=True) for w in wrappers]


def _pass_adapter_names(names: list[str], module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook: hand a mixed batch's adapter names to the wrapper's forward."""
    return args, {**kwargs, "adapter_names": names}
