"""`mmpreproj.inject`: put the modules into a host model, in place, through peft's injection loop: the tuner
`PreProjModel`, whose hooks take each step of `method/apply.py` (plan, place, finish, freeze), the path of
`peft.inject_adapter_in_model` and `peft.get_peft_model` too. Like `inject_adapter_in_model`, the model keeps no
tuner and gets nothing on its instance but peft's `peft_config` record; its whole-model folder is written by the
function `mmpreproj.save_pretrained(model, DIR)` (`pretrained_save.py`), never by `model.save_pretrained`.

Every call validates first (`method/plan.py`) and mutates last, so a failed call leaves the model exactly as it was.
The injection's bookkeeping lives on the model itself (`model.mmpreproj_state`, `method/state.py`), never in globals.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from mmpreproj_tables.tables import METHOD_SPECS, METHODS

from ..hosts import HostSpec
from .adapters import Addition, peft_record
from .apply import Request
from .config import PreProjConfig
from .model import PreProjModel
from .plan import Plan, check_plain_model
from .state import STATE_ATTR
from .state_dict import set_adapter_trainable

_ABSENT = object()


def inject(
    model: nn.Module,
    config: PreProjConfig | None = None,
    *,
    host: str | dict | HostSpec | None = None,
    example_input: Any = None,
    adapter_name: str = "default",
) -> nn.Module:
    """Add the pre-projection and/or content skip to every selected attention block of `model`, in place.

    Args:
        model: a supported host (see `mmpreproj.hosts.HOSTS`), or any model when `host` describes it.
        config: what to inject (default `PreProjConfig()`: pre-projection + skip, paper init, base frozen).
        host: None = the row that claims the model by type; else the seams traced on an example input (a row
            matched by structure is confirmed by that trace; `hosts/auto_host.py`); a row name forces that row; a
            description dict (or `HostSpec`)
            says where the blocks, the pre-attention norm and the attention are (see `mmpreproj.hosts.spec`).
            The description is saved with the adapter, so `load_adapter` needs no code. None reads
            `config.host` (and, on a config read from an adapter file, the host it was saved for).

        example_input: None, or an input to trace the model with (when no row claims it by type; None = one the
            model builds from its config, `hosts/example_input.py`) and to run one forward with right after
            injecting (a tensor, a tuple of
            positional arguments, or a dict of keyword arguments): under `torch.no_grad`, in eval mode (the
            train/eval flags put back) and on a forked RNG. If it raises (a seam error, an attention that
            cannot take `x~`), the model is put back as it was and the error re-raised: a wrong description never
            leaves an injected model behind.

        adapter_name: the name of this first adapter (peft's "default"; `load_adapter(adapter_name=)` adds more).

    `config` is a `PreProjConfig` object, as peft's `get_peft_model(model, config)` takes one: a method name
    (`inject(model, "preproj_skip")`) is refused with a TypeError naming the config that method stands for
    (`PreProjConfig(preproj=True, skip=True)`), rather than read as one, so a name meant for `host=` (a row
    such as "llama") can never be taken for a method; a model that is not an `nn.Module` (peft's argument order,
    `(config, model)`) is refused likewise.

    Returns the same model object. Injected weights are float32 on the device of their block; they train (and so
    do the config's `modules_to_save`) unless `config.inference_mode`, as peft's `inject_adapter_in_model` leaves
    them. `host=` and a `config.host` naming different rows are refused.
    It runs peft's own injection loop (`BaseTuner.inject_adapter`) through the tuner's hooks
    (`mmpreproj.method.PreProjModel`), as `peft.inject_adapter_in_model(config, model)` does; `peft.get_peft_model`
    wraps the result in a `PeftModel`. Like peft's in-place route, nothing is installed on the instance:
    `model.save_pretrained` stays the class's own, which writes the wrapped keys; save the base and the adapter
    with `mmpreproj.save_pretrained(model, DIR)`. A plain `transformers.Trainer` on an injected model is not
    supported: give it `peft.get_peft_model(model, config)` instead.
    """
    _check_arguments(model, config)
    config = config or PreProjConfig()
    if isinstance(host, str) and isinstance(config.host, str) and host != config.host:
        raise ValueError(
            f"inject(host={host!r}) and its config's host={config.host!r} name different host rows; pass one "
            "(nothing was changed)"
        )
    _through_tuner(model, config, adapter_name, Request(host=host, example_input=example_input))
    if config.inference_mode:  # as peft's inject_adapter_in_model leaves a config in inference mode: frozen
        set_adapter_trainable(model, False)
    return model


def _check_arguments(model: Any, config: Any) -> None:
    """TypeError in one line naming the argument, what it got and what it takes (before anything is touched)."""
    if not isinstance(model, nn.Module):
        swapped = " (peft's order is (config, model); mmpreproj.inject takes (model, config))"
        raise TypeError(
            f"inject(model=...): got {type(model).__name__}; pass a torch.nn.Module"
            + (swapped if isinstance(model, PreProjConfig) else "")
        )
    if config is None or isinstance(config, PreProjConfig):
        return
    got = f"{type(config).__name__} {config!r}" if isinstance(config, str) else type(config).__name__
    raise TypeError(f"inject(config=...): got {got}; pass a mmpreproj.PreProjConfig ({_instead(config)})")


def _instead(config: Any) -> str:
    """What to pass instead of `config`: the config a method name stands for, or where a row name goes."""
    spec = METHOD_SPECS.get(config) if isinstance(config, str) else None
    if spec is not None and spec.lora:
        return f"method {config!r} trains LoRA: peft.LoraConfig with peft.get_peft_model"
    if spec is not None:
        return f"method {config!r} is PreProjConfig(preproj={spec.preproj}, skip={spec.skip}); None = preproj_skip"
    if isinstance(config, str):
        return f"a host row name goes to host=; the method names are {', '.join(METHODS)}"
    if isinstance(config, dict):
        return "its fields as PreProjConfig(**fields); a host description goes to host="
    return "None = the paper's pre-projection + content skip"


def apply_plan(model: nn.Module, plan: Plan) -> nn.Module:
    """Place a plan the caller built and filled (`load.load_injection`: saved weights copied in), through the same
    loop, as `inject` does; on error the model is left as it was."""
    return _through_tuner(model, plan.state.config, plan.adapter_name, Request(plan=plan))


def add_planned(model: nn.Module, addition: Addition) -> nn.Module:
    """Add a further adapter the caller planned and filled (`adapters.plan_addition`: a saved one) to the injected
    model inside `model`, through the same loop; on error no wrapper keeps it. When `model` is a `PeftModel` over
    the injection, or the model carries peft's `peft_config` (peft's `inject_adapter_in_model`), that record gets the
    adapter too. Returns `model`."""
    _through_tuner(addition.owner, addition.config, addition.name, Request(addition=addition))
    record = peft_record(model, addition.owner)
    if record is not None:  # a PeftModel's record of its adapters names the added one too
        record.peft_config[addition.name] = addition.config
    elif isinstance(kept := vars(addition.owner).get("peft_config"), dict):  # peft's in-place route's record
        kept[addition.name] = addition.config
    return model


def _through_tuner(model: nn.Module, config: PreProjConfig, adapter_name: str, request: Request) -> nn.Module:
    """peft's `inject_adapter_in_model(config, model, adapter_name)` with our `request`: the tuner is built over
    `model` and dropped. peft's tuner also gives the model its `peft_config` dict: a first injection keeps it, as
    peft's route does (peft's functions read it; `unload` takes it off), an addition puts back the one already there
    (the tuner's own holds the new adapter alone), a failed call leaves it as it was. A model that cannot take
    a first injection is refused before (an addition goes onto the injected model itself): peft's constructor adds
    the config to a `peft_config` it finds on the model (a `PeftModel`'s own)."""
    if request.addition is None:
        check_plain_model(model)
    kept = vars(model).pop("peft_config", _ABSENT)
    try:
        PreProjModel(model, config, adapter_name, request=request)
    except BaseException:
        vars(model).pop("peft_config", None)
        if kept is not _ABSENT:
            vars(model)["peft_config"] = kept
        raise
    made = vars(model).pop("peft_config", None)
    if kept is not _ABSENT:  # an addition: the record already there (`add_planned` names the new adapter in it)
        vars(model)["peft_config"] = kept
    if request.addition is None and made is not None:  # a first injection keeps peft's record, as peft's route
        model.peft_config = vars(model)[STATE_ATTR].instance_attrs["peft_config"] = made
    return model
