"""Checks against the model before any loader injects: an adapter's `injection` record, and what transformers'
`model.load_adapter(DIR)` is about to load.

The record: the blocks, their paths (in the record's order), the block count, the widths and the
`modules_to_save` paths must be what the config resolves to on this model. A file whose `injection.modules` were
reordered would otherwise move weights between blocks; one saved with other `layers` or sizes would half-load.

    check_record(model, plan, record, where, by_path=False)  # mmpreproj.load_adapter (by block index)
    check_record_fits(model, config)  # peft and transformers loaders (by path), before `inject`
    check_added_record(model, config, record, where, by_path=...)  # an adapter added beside a loaded one

transformers builds the config with peft's generic `PeftConfig.from_pretrained` (no folder reaches
`PreProjConfig.from_pretrained`), injects through our tuner, and only then reads the weights by their keys, with
no hook of ours after it. So the tuner, planning the injection, finds that call on the stack (by its code object,
never by a name) and reads its arguments, the folder or the state dict given, to run the checks
`PreProjConfig.from_pretrained` runs on a folder (`config.check_folder_weights`): a bad folder is refused before
anything changes. A hub id is not checked here (transformers downloads the weights after injecting), as peft's.

    check_transformers_load(config)   # in the tuner's `_prepare_model`, for a config read from a file
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..hosts.spec import HostSpec
from .config import PreProjConfig, check_folder_weights, check_saved_weights
from .convert import model_keys
from .file_check import HEAD_SHAPES_KEY
from .model_card import base_model_type
from .plan import Plan, config_host, plan_injection
from .state import injected_owner, refuse_meta_parameters
from .state_dict import rekeyed_by_block, saved_module_tensors, wrapper_tensors


def check_record(model: nn.Module, plan: Plan, record: dict[str, Any], where: str, *, by_path: bool) -> None:
    """ValueError naming the first field of `record` (an `injection` record or a description) that differs from
    what `plan` resolved on the model; fields an older file lacks are not compared.

    `by_path`: the loader finds each weight by its module path (peft's, transformers'), so the record's paths
    must be the model's, in order. Otherwise (`mmpreproj.load_adapter`, by block index) the paths may differ
    (a `features_only` net, another wrapping), but a path the model has must sit at the same block."""
    _check_sites(plan.state, record, where, by_path=by_path)
    _check_config_host(plan.state.config.host, record, where)
    warn_other_base(model, record, where)
    shapes = record.get("tensor_shapes")
    if isinstance(shapes, dict):  # written since issue 31: the config's sizes on this model must give them
        expected, shapes = planned_tensors(model, plan, shapes, record, by_path=by_path)
        have = {k: list(v.shape) for k, v in expected.items()}
        if have != shapes:
            diff = sorted(k for k in set(have) | set(shapes) if have.get(k) != shapes.get(k))
            raise ValueError(
                f"{where}: injection.tensor_shapes differs from what its config (expansion, skip_rank, "
                f"layers, modules_to_save) gives on this model at {diff[:3]}: saved "
                f"{[shapes.get(k) for k in diff[:3]]}, expected {[have.get(k) for k in diff[:3]]}; "
                "nothing was loaded"
            )


def warn_other_base(model: nn.Module, record: dict[str, Any], where: str) -> None:
    """UserWarning when the record's `base_model_type` is not `model`'s: the weights fit by shape (a Qwen2-VL
    adapter on Qwen2.5-VL), but were trained on another architecture. transformers warns the same way for a config
    of another `model_type`; the load goes on, as peft's would. Files written before the field (<= 0.5.0) have
    none and are not compared."""
    saved, have = record.get("base_model_type"), base_model_type(model)
    if isinstance(saved, str) and have is not None and saved != have:
        warnings.warn(
            f"{where}: the adapter was saved on a {saved!r} model, and this model is a {have!r}: its weights fit "
            "by shape, but they were trained on another architecture; load it onto the base it was trained on",
            UserWarning,
            stacklevel=2,
        )


def _check_config_host(host: Any, record: dict[str, Any], where: str) -> None:
    """The config's `host` (what the user asked for; the record's description is what loads) must not contradict the
    record: a row name is the record's `host`, a description is not empty."""
    saved = record.get("host")
    if (isinstance(host, str) and isinstance(saved, str) and host != saved) or host == {}:
        raise ValueError(
            f"{where}: config.host={host!r:.60}, but its injection.host={saved!r:.60} (the row the adapter was "
            "injected with); nothing was loaded"
        )


def planned_tensors(model: nn.Module, plan: Plan, tensors: dict, record: dict, *, by_path: bool) -> tuple[dict, dict]:
    """(the tensors `plan` gives on `model`, `tensors` saved with `record` keyed the same way: older block-index keys
    converted and, unless `by_path`, the record's paths, maybe another wrapping's, matched by block index)."""
    pairs = list(zip(plan.state.modules, (w for _, w in plan.placements)))
    expected = {**wrapper_tensors(pairs), **saved_module_tensors(model, plan.state.modules_to_save)}
    tensors = model_keys(tensors, pairs, plan.state.modules_to_save)
    if not by_path:
        tensors = rekeyed_by_block(tensors, record.get("layers"), record.get("modules"), pairs)
    return expected, tensors


def check_record_fits(model: nn.Module, config: PreProjConfig) -> None:
    """Plan `config` on `model` (on a forked RNG, nothing applied) and compare it with `config.injection`."""
    with torch.random.fork_rng(devices=[]):
        plan = plan_injection(model, config, config_host(model, config))
    check_record(model, plan, config.injection or {}, "adapter config", by_path=True)
    _check_head_shapes(model, config.injection or {}, "adapter config")


def _check_head_shapes(model: nn.Module, record: dict[str, Any], where: str) -> None:
    """The shapes of the heads peft saves (`injection.head_shapes`, file keys less peft's prefix) against the
    model's own tensors of those names, before peft wraps them (another `num_labels`: refused here)."""
    shapes = record.get(HEAD_SHAPES_KEY)
    if not isinstance(shapes, dict):  # a file without heads, or from before the record (its form: file_check)
        return
    have = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    for key, shape in shapes.items():
        got = list(have[key].shape) if key in have else None
        if got != shape:
            what = f"this model's is {got}" if got is not None else "this model has no such tensor"
            raise ValueError(
                f"{where}: injection.{HEAD_SHAPES_KEY} records head tensor {key!r} of shape {shape}, but {what} "
                "(a head for another number of labels?); nothing was loaded"
            )


def check_added_record(
    model: nn.Module, config: PreProjConfig, record: dict[str, Any], where: str, *, by_path: bool
) -> None:
    """An adapter added beside the loaded ones (peft's `load_adapter` of a new name, `mmpreproj.load_adapter(...,
    adapter_name=)`) checked as the first one is, against the injection already in `model`: its record (`record`:
    the config's `injection`, or a description) names the same parts, blocks, count, widths, `modules_to_save` and,
    `by_path`, module paths in the same order (by block index: the same host and host paths, and a path the model
    has sits at the same block); its config injects the same slots, and its `layers` select the blocks the record
    names. The one check of an added adapter's sites: a failed one leaves the model as it was."""
    owner, state = injected_owner(model, "load_adapter")
    _check_sites(state, record, where, by_path=by_path, added=True)
    warn_other_base(owner, record, where)
    for slot in ("preproj", "skip"):  # an added adapter fills the slots the injection has, no more, no fewer
        saved, have = getattr(config, slot), getattr(state.config, slot)
        if saved != have:
            raise ValueError(f"{where}: config.{slot}={saved!r} but {ADDED} {have!r}; {SAME_SITES}")
    layers, count = record.get("layers"), record.get("num_blocks")
    parts = record.get("parts")
    if isinstance(config.layers, list) and isinstance(layers, list) and type(count) is int:
        if isinstance(parts, list) and len(parts) > 1:  # a list indexes the selected parts' blocks: not compared
            return
        try:
            selected = config.resolve_layers(count)
        except ValueError as e:
            raise ValueError(f"{where}: {e}; nothing was loaded") from None
        if selected != layers:
            raise ValueError(
                f"{where}: config.layers={config.layers!r:.80} selects blocks {selected!r:.80} of {count}, but its "
                f"injection.layers={layers!r:.80}: the config and the weights are not one save; nothing was loaded"
            )


ADDED = "the adapter already injected in this model has"
SAME_SITES = "an added adapter sits on the same sites; nothing was loaded"


def _check_sites(state: Any, record: dict[str, Any], where: str, *, by_path: bool, added: bool = False) -> None:
    """The record's parts, block count, widths and blocks (and, `by_path`, module paths and `modules_to_save`;
    `added` by block index, the host, host paths and `modules_to_save` names) against `state` (a planned or an injected
    `InjectionState`); a path the model has must sit at the same block either way. A field an older record lacks
    is not compared (the weight keys and shapes still are)."""
    _check_form(record, where)
    saved_parts = [p.get("name") for p in record.get("parts") or [] if isinstance(p, dict)]
    have = {
        "parts": (saved_parts or None, [p["name"] for p in state.parts]),
        "num_blocks": (record.get("num_blocks"), state.num_blocks),
        "hidden_size": (record.get("hidden_size"), state.hidden_size),
        "layers": (record.get("layers"), state.layers),
    }
    saved_mts = record.get("modules_to_save") or {}
    if by_path:
        have["host"] = (record.get("host"), state.host)
        have["modules"] = (record.get("modules"), state.modules)
        have["modules_to_save"] = (saved_mts if "modules_to_save" in record else None, state.modules_to_save)
    elif added:  # by block index: the names (the paths may be another wrapping's)
        have["modules_to_save"] = (sorted(saved_mts), sorted(state.modules_to_save))
    if added and not by_path:  # by path, the module paths themselves are compared above
        have["host"] = (record.get("host"), state.host)
        described = record.get("host_description")
        if isinstance(described, dict) and described.get("parts"):  # the same paths, read in their saved form
            have["host_description"] = (_paths_of(described), _paths_of(state.host_description))
    against = ADDED if added else "its config resolves to"
    tail = SAME_SITES if added else "nothing was loaded"
    for name, (saved, value) in have.items():
        if saved is not None and saved != value:
            raise ValueError(f"{where}: injection.{name}={saved!r:.120} but {against} {value!r:.120}; {tail}")
    _check_order(state, record, where)


# the record's fields whose form is checked here (the others by the checks that read them): field -> (test, form)
_FORMS = {
    "parts": (lambda v: isinstance(v, list) and all(isinstance(p, dict) for p in v), "a list of part objects"),
    "host": (lambda v: isinstance(v, str), "a host row name"),
    "host_description": (lambda v: isinstance(v, dict), "a host description (an object)"),
    "tensor_shapes": (lambda v: isinstance(v, dict), "key -> shape"),
}


def _check_form(record: dict[str, Any], where: str) -> None:
    """A field of the record that is there (not null) has the form the tuner writes: an edited one is refused, not
    read as absent."""
    for name, (ok, form) in _FORMS.items():
        value = record.get(name)
        if value is not None and not ok(value):
            raise ValueError(f"{where}: injection.{name}={value!r:.60} is not {form}; nothing was loaded")


def _paths_of(description: dict) -> dict:
    """The paths of a saved description in one normal form (old spellings read as today's)."""
    spec = HostSpec.from_dict(description)
    return {"parts": [p.to_dict() for p in spec.parts], "embeddings": spec.embeddings}


def _check_order(state: Any, record: dict[str, Any], where: str) -> None:
    """A module path of the record that the model has must sit at the same block (position) as on the model."""
    saved_paths = record.get("modules")
    if isinstance(saved_paths, list):
        at = {path: i for i, path in enumerate(state.modules)}
        moved = [(i, p) for i, p in enumerate(saved_paths) if p in at and at[p] != i]
        if moved:
            i, p = moved[0]
            raise ValueError(
                f"{where}: injection.modules lists {p!r} at position {i}, but on this model it is "
                f"block {state.layers[at[p]]} (position {at[p]}): the same blocks in another order "
                "would move weights between blocks; nothing was loaded"
            )


def check_transformers_load(config: PreProjConfig, model: nn.Module) -> None:
    """When this injection runs inside transformers' `load_adapter`: ValueError naming the file unless the weights
    it will load (the local folder's, or `adapter_state_dict`) are the ones `config` was saved with (its `injection`
    record: a config without one is refused, its weights could not be checked), and unless `model` has real weights
    (one built on the meta device would drop the loaded ones; an offloaded model, some weights on meta, loads)."""
    call = _load_adapter_call()
    if call is None:
        return
    params = list(model.parameters())
    if params and all(p.is_meta for p in params):  # built on the meta device (an offloaded model has real ones too)
        refuse_meta_parameters(model, "load_adapter")
    state_dict, folder, load_config = (
        call.get("adapter_state_dict"),
        call.get("peft_model_id"),
        call.get("load_config"),
    )
    source = "adapter_state_dict" if state_dict is not None else f"{str(folder)!r}"
    if config.injection is None and (state_dict is not None or (folder is not None and Path(str(folder)).is_dir())):
        raise ValueError(
            f"load_adapter({source}): its PREPROJ config has no 'injection' record (what the tuner writes beside the "
            "weights: blocks, paths, shapes, digest), so the weights cannot be checked before they load; load a "
            "folder a PREPROJ save wrote, with its adapter_config.json as written (nothing was loaded)"
        )
    if state_dict is not None:
        check_saved_weights(config, dict(state_dict), "adapter_state_dict")
        return
    download = getattr(load_config, "download_kwargs", None) or {}
    path = Path(str(folder), download.get("subfolder") or "") if folder is not None else None
    if path is None or not path.is_dir():  # a hub id
        return
    if getattr(load_config, "use_safetensors", None) is False:
        raise ValueError(
            f"load_adapter({str(folder)!r}, use_safetensors=False): a PREPROJ folder's weights are its "
            "adapter_model.safetensors, checked before anything is injected; load without use_safetensors=False "
            "(nothing was loaded)"
        )
    check_folder_weights(config, path)


def _load_adapter_call() -> dict[str, Any] | None:
    """The arguments of the transformers `load_adapter` call on the stack (its `PeftAdapterMixin` method, found by
    its code object; the module looked up in `sys.modules`, never imported), else None."""
    mixin = getattr(sys.modules.get("transformers.integrations.peft"), "PeftAdapterMixin", None)
    code = getattr(getattr(mixin, "load_adapter", None), "__code__", None)
    if code is None:
        return None
    frame = sys._getframe(1)
    try:
        while frame is not None:
            if frame.f_code is code:
                names = ("peft_model_id", "adapter_state_dict", "load_config")
                return {k: frame.f_locals.get(k) for k in names}
            frame = frame.f_back
    finally:
        del frame  # no reference cycle through the frames
    return None
