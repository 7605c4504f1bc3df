"""`load_injection`: read one of our adapter folders, check it against the model, inject its modules and copy its
weights; on a model already injected, add it beside the loaded ones (`named.plan_addition`, through peft's loop).
The public loader of any trained folder, `mmpreproj.load_adapter` (`folders/load.py`), hands our part to this."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..timm_rope.saved import rope_for_load
from ..tuner.config import PreProjConfig
from ..tuner.legacy import model_keys
from ..tuner.load_check import check_added_record, check_record
from ..tuner.named import plan_addition
from ..tuner.plan import check_saved_paths, plan_injection, saved_host
from ..tuner.state import check_adapter_name, is_injected
from ..tuner.state_dict import (
    check_tensors_match,
    is_slot_key,
    rekeyed_by_block,
    saved_module_tensors,
    trainable_adapter_params,
    wrapper_tensors,
)
from ..tuner.unwrap import injected_owner, refuse_meta_parameters
from .files import BASE_SAVE_TOKEN, adapter_folder, read_adapter
from .inject import add_planned, apply_plan
from .pretrained_save import check_saved_pair, config_save_token


def load_injection(
    model: nn.Module,
    path: str | Path,
    *,
    is_trainable: bool = False,
    freeze_base: bool | None = None,
    adapter_name: str | None = None,
) -> nn.Module:
    """Inject the modules described in `path` into `model` and load their weights.

    Like peft, loading is for inference by default: the adapter's weights are frozen; `is_trainable=True`
    leaves them (and its `modules_to_save`) trainable, to go on training.

    `path` is an adapter folder, or a `save_pretrained` folder (its `adapter/` subfolder is read, refused
    when the base beside it comes from another save: `pretrained_save.check_saved_pair`). The
    adapter file carries the host description (parts, paths, call convention), so a user-described host
    reloads with no code. Raises (leaving `model` untouched) on a missing or corrupt file, another host,
    parts the model does not have, another hidden size or block count, or weights that do not match.

    On a model that is already injected, `adapter_name` adds this adapter beside the loaded ones, frozen
    and inactive (`set_adapter` switches to it; see `named.py`); on a plain model it names the
    first adapter (default "default").
    Saved `add_rope` positions are restored on a model without them, or the load is refused with the call
    to make (`mmpreproj.timm_rope.saved`).
    """
    refuse_meta_parameters(model, "load_adapter")
    if adapter_name is not None:
        check_adapter_name(adapter_name)
    given, path = Path(path), adapter_folder(path)
    desc, tensors = read_adapter(path)
    check_saved_paths(desc, path)
    if path != given:  # a save_pretrained folder: its base and its adapter must come from one save
        check_saved_pair(config_save_token(given / "config.json"), desc.get(BASE_SAVE_TOKEN), given)
    if adapter_name is not None and is_injected(model):  # checked as the first adapter is (by block index)
        config = PreProjConfig.from_dict(desc["config"])
        check_added_record(model, config, desc, f"adapter at {path}", by_path=False)
        owner, _ = injected_owner(model, "load_adapter")
        return add_planned(model, plan_addition(owner, config, adapter_name, str(path), tensors=tensors))
    config = PreProjConfig.from_dict(desc["config"])
    if freeze_base is not None:
        config.freeze_base = freeze_base
    host = saved_host(model, desc, path)
    restore_rope = rope_for_load(model, desc.get("rope"), f"adapter at {path}")  # checks only; runs after apply_plan
    with torch.random.fork_rng(devices=[]):  # building the modules must not move the caller's RNG
        plan = plan_injection(model, config, host, adapter_name=adapter_name or "default")
    check_record(model, plan, desc, f"adapter at {path}", by_path=False)  # the same sites; no weight moves blocks
    pairs = list(zip(plan.state.modules, (w for _, w in plan.placements)))
    expected = wrapper_tensors(pairs)
    expected.update(saved_module_tensors(model, plan.state.modules_to_save))
    tensors = model_keys(tensors, pairs, plan.state.modules_to_save)  # an older folder's block-index keys
    tensors = rekeyed_by_block(tensors, desc.get("layers"), desc.get("modules"), pairs)  # found by block index
    check_tensors_match(expected, tensors, f"adapter at {path} does not match its config")
    injected = {k: v for k, v in expected.items() if is_slot_key(k)}
    with torch.no_grad():
        for k, dst in injected.items():
            dst.copy_(tensors[k])
    apply_plan(model, plan)
    if restore_rope is not None:
        restore_rope()
    with torch.no_grad():  # base modules trained with the adapter: written once the originals are kept
        for k, dst in expected.items():
            if k not in injected:
                dst.copy_(tensors[k])
    if not is_trainable:
        for p in trainable_adapter_params(model):
            p.requires_grad_(False)
    return model
