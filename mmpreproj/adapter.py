"""inject / unload / save_adapter / load_adapter: put the modules into a host model and take them out.

Every call validates first and mutates last, so a failed call leaves the model exactly as it was.
The injection's bookkeeping lives on the model itself (`model.mmpreproj_state`), never in globals.
"""

from __future__ import annotations

import contextlib
import json
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn
from torch.utils.hooks import RemovableHandle

from .adapter_files import committed_files, write_files
from .hosts import HostSpec
from .hosts.checkpointing import reentrant_checkpointing
from .hosts.paths import check_path
from .hosts.registry import as_host, forced_mismatch, host_for_adapter
from .hosts.spec import HostError, Site, get_path, resolve_sites
from .modules import ContentSkip, PreProjAttention, PreProjection
from .modules.seam import SeamCheck
from .modules.wrapper import InFlight
from .pretrained import (
    BASE_SAVE_TOKEN,
    PRETRAINED_ADAPTER_DIR,
    check_saved_pair,
    config_save_token,
    install_save_pretrained,
    remove_save_pretrained,
)
from .timm_rope.saved import describe_rope, rope_for_load
from .tuner.config import PreProjConfig
from .tuner.digest import DIGEST_KEY, check_weights_digest
from .tuner.keys import (
    block_keys_from_peft,
    block_keys_to_peft,
    description_from_peft_config,
    is_legacy_description,
    peft_config_from_description,
)
from .unwrap import STATE_ATTR, injected_owner, injected_owners, refuse_meta_parameters
from .version import __version__

__all__ = [
    "ADAPTER_CONFIG_NAME",
    "ADAPTER_TYPE",
    "ADAPTER_WEIGHTS_NAME",
    "InjectionState",
    "adapter_state_dict",
    "adapter_disabled",
    "adapter_folder",
    "adapter_key",
    "injected_modules",
    "inject",
    "is_injected",
    "load_adapter",
    "parse_adapter_key",
    "save_adapter",
    "set_adapter_state_dict",
    "unload",
]

ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_TYPE = "mmpreproj"  # the `adapter_type` tag of the descriptions (files: peft_type "PREPROJ", tuner/keys.py)


@dataclass
class InjectionState:
    """What `inject` did to a model, kept on the model as `model.mmpreproj_state`."""

    config: PreProjConfig
    host: str
    layers: list[int]
    num_blocks: int
    hidden_size: int | list[int]  # one width, or one per injected block when they differ (e.g. CLIP towers)
    host_description: dict = field(default_factory=dict)  # the resolved row (spec.py), so reload needs no code
    parts: list[dict] = field(default_factory=list)  # per part: name, first block index, blocks, injected layers
    modules_to_save: dict[str, str] = field(default_factory=dict)  # name -> attribute path of a trained base module
    base_model_name_or_path: str | None = None  # the host's hub id or folder when it was loaded from one (peft's key)
    modules: list[str] = field(default_factory=list)  # each injected wrapper's path in the model, aligned with layers
    saved_originals: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)  # restored by unload
    frozen: list[nn.Parameter] = field(default_factory=list, repr=False)  # what inject froze (unload thaws)
    thawed: list[nn.Parameter] = field(default_factory=list, repr=False)  # frozen before, made trainable by inject
    input_grad_hook: RemovableHandle | None = field(default=None, repr=False)
    # several adapters on one base (named_adapters.py): the active one runs, the others wait, frozen
    active_adapter: str = "default"
    adapter_configs: dict[str, PreProjConfig] = field(default_factory=dict)  # every loaded name -> its config
    stored_modules: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict, repr=False)  # inactive
    # name -> its modules_to_save values, keyed as in the file (`modules.{name}.{param}`)

    def __post_init__(self) -> None:
        self.adapter_configs.setdefault(self.active_adapter, self.config)

    def describe(self) -> dict:
        """The JSON-able description saved beside adapter weights."""
        return {
            "adapter_type": ADAPTER_TYPE,  # with `method`: what the folder holds, so nothing guesses from its shape
            "method": self.config.method,
            "base_model_name_or_path": self.base_model_name_or_path,
            "config": self.config.to_dict(),
            "host": self.host,
            "host_description": self.host_description,
            "parts": self.parts,
            "layers": self.layers,
            "modules": self.modules,
            "num_blocks": self.num_blocks,
            "hidden_size": self.hidden_size,
            "modules_to_save": self.modules_to_save,
            "library_version": __version__,
        }


@dataclass
class _Plan:
    """Wrappers built for a model, not yet placed in it."""

    spec: HostSpec
    state: InjectionState
    placements: list[tuple[Site, PreProjAttention]]  # (site, wrapper)
    seams: list[tuple[PreProjAttention, nn.Module, nn.Module, str, str]] = field(default_factory=list)


def injected_modules(model: nn.Module) -> list[PreProjAttention]:
    """The wrappers in `model`, in block order."""
    found = [m for m in model.modules() if isinstance(m, PreProjAttention)]
    return sorted(found, key=lambda m: m.block_index)


def is_injected(model: nn.Module) -> bool:
    return hasattr(model, "mmpreproj_state") or bool(injected_modules(model))


def _device_of(module: nn.Module) -> torch.device:
    p = next(module.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _select(sites: list[Site], spec: HostSpec, config: PreProjConfig) -> tuple[list[str], list[Site]]:
    """The parts the config selects (checked against the model's) and the sites its `layers` pick."""
    present = list(dict.fromkeys(s.part for s in sites))
    wanted = config.parts or [p for p in (spec.default_parts or present) if p in present] or present
    missing = [p for p in wanted if p not in present]
    if missing:
        raise ValueError(f"PreProjConfig.parts names {missing}, but this {spec.name!r} model has parts {present}")
    if isinstance(config.layers, dict):
        unknown = [p for p in config.layers if p not in wanted]
        if unknown:
            raise ValueError(f"PreProjConfig.layers names parts {unknown} that are not injected; injected: {wanted}")
        chosen = []
        for part in wanted:
            mine = [s for s in sites if s.part == part]
            chosen += [mine[i] for i in config.resolve_layers(len(mine), part)]
        return wanted, chosen
    pool = [s for s in sites if s.part in wanted]
    return wanted, [pool[i] for i in config.resolve_layers(len(pool))]


def _modules_to_save(model: nn.Module, spec: HostSpec, names: list[str] | None) -> dict[str, str]:
    """{name: attribute path} of the base modules a config keeps trainable; ValueError naming a bad one."""
    out = {}
    for name in names or []:
        path = spec.trainable_modules.get(name, name)
        try:
            module = get_path(model, path)
        except HostError as e:
            declared = sorted(spec.trainable_modules) or "none"
            raise ValueError(
                f"PreProjConfig.modules_to_save: {name!r} is neither a module host {spec.name!r} names "
                f"(declared: {declared}) nor an attribute path of the model ({e})"
            ) from None
        if not isinstance(module, nn.Module) or not any(True for _ in module.parameters()):
            raise ValueError(f"PreProjConfig.modules_to_save: {name!r} ({path}) is not a module with parameters")
        if _quantized_params(module):
            raise ValueError(f"PreProjConfig.modules_to_save: {name!r} ({path}) holds quantized weights "
                             f"(e.g. {_quantized_params(module)[0][0]!r}), which cannot train; keep it float")
        out[name] = path
    return out


def _plan(model: nn.Module, config: PreProjConfig, host: str | dict | HostSpec | None) -> _Plan:
    """Validate everything and build the wrappers; the model is not touched."""
    if not isinstance(config, PreProjConfig):
        raise TypeError(f"config must be a PreProjConfig, got {type(config).__name__}")
    if is_injected(model):
        raise RuntimeError("this model already has mmpreproj modules injected; call mmpreproj.unload(model) first")
    _refuse_compiled_or_peft(model)
    spec = as_host(model, host)
    try:
        sites = resolve_sites(model, spec)
    except HostError as e:
        if host is None or isinstance(host, dict):
            raise
        raise forced_mismatch(model, spec, e) from None
    _refuse_overlapping_parts(model, spec, sites)
    parts, chosen = _select(sites, spec, config)
    if not chosen:
        raise ValueError(f"PreProjConfig selects no block of {spec.name!r} (parts {parts}, layers {config.layers})")
    placements, seams = [], []
    flight = InFlight()  # shared by the wrappers: graphs awaiting backward (set_adapter refuses a switch then)
    for site in chosen:
        if isinstance(site.attention, PreProjAttention):
            raise RuntimeError(f"block {site.index} already holds a PreProjAttention")
        preproj, skip = new_adapter_modules(site.width, config, _device_of(site.block))
        wrapper = PreProjAttention(
            site.attention, site.call, preproj, skip, block_index=site.index, part=site.part
        )
        wrapper.flight = flight
        wrapper.seam = (f"host {spec.name!r}, block {site.part_index} of part {site.part!r}: norm {site.norm_path!r} -> "
                        f"attention {next(p.attention for p in spec.parts if p.name == site.part)!r}")
        placements.append((site, wrapper))
        if site.norm is not None:
            where = f"host {spec.name!r}, part {site.part!r}, block {site.part_index}"
            seams.append((wrapper, site.block, site.norm, where, site.norm_path))
    widths = [site.width for site, _ in placements]
    width: int | list[int] = widths[0] if len(set(widths)) == 1 else widths
    description = spec.describe(model)
    part_rows = []
    for d in description["parts"]:
        first = next(s.index for s in sites if s.part == d["name"])
        injected = [s.part_index for s, _ in placements if s.part == d["name"]]
        part_rows.append({"name": d["name"], "first_block": first, "num_blocks": d["num_blocks"], "layers": injected})
    names = {id(m): n for n, m in model.named_modules()}
    state = InjectionState(
        config,
        spec.name,
        [s.index for s, _ in placements],
        len(sites),
        width,
        host_description=description,
        parts=part_rows,
        modules_to_save=_modules_to_save(model, spec, config.modules_to_save),
        base_model_name_or_path=_name_or_path(model),
        modules=[f"{names[id(s.parent)]}.{s.attr}".lstrip(".") for s, _ in placements],
    )
    return _Plan(spec, state, placements, seams)


def _peft_layers(model: nn.Module) -> list[str]:
    """Names of the peft adapter layers (LoRA, ...) inside `model` ("" for a `PeftModel` itself); peft is
    looked up in `sys.modules`, never imported."""
    tuners = sys.modules.get("peft.tuners.tuners_utils")
    layer_cls = getattr(tuners, "BaseTunerLayer", None)
    peft_model = getattr(sys.modules.get("peft"), "PeftModel", None)
    if layer_cls is None and peft_model is None:
        return []
    return [n for n, m in model.named_modules() if (layer_cls is not None and isinstance(m, layer_cls))
            or (n == "" and peft_model is not None and isinstance(m, peft_model))]


def _refuse_compiled_or_peft(model: nn.Module) -> None:
    """inject comes before `torch.compile` and before peft: refuse the other order, naming the one that works."""
    compiled = getattr(sys.modules.get("torch._dynamo.eval_frame"), "OptimizedModule", None)
    found = [n for n, m in model.named_modules() if compiled is not None and isinstance(m, compiled)]
    if found:
        what = "the model is" if found[0] == "" else f"its submodule {found[0]!r} is"
        raise RuntimeError(
            f"inject: {what} a torch.compile wrapper (OptimizedModule); inject the model before compiling it: "
            "mmpreproj.inject(model), then model = torch.compile(model)"
        )
    layers = _peft_layers(model)
    if layers:
        what = "the model is a peft PeftModel" if layers[0] == "" else f"the model holds peft layers ({layers[0]!r})"
        raise RuntimeError(
            f"inject: {what}; injecting now would freeze the peft adapter's weights with the base. Inject first, "
            "then add peft: mmpreproj.inject(model), then peft.get_peft_model(model, lora_config) (the order of "
            "method 'preproj_lora', mmpreproj.train.apply_method)"
        )


def _refuse_overlapping_parts(model: nn.Module, spec: HostSpec, sites: list[Site]) -> None:
    """ValueError naming both parts and the module when two sites share an attention module: the second
    wrapper would replace the first one (an adapter that cannot be reloaded, seam hooks left behind). Two
    parts over the same blocks with different attention modules (a block with two norm -> attention seams)
    are fine: each site is its own wrapper with its own adapter block index."""
    seen: dict[int, Site] = {}
    for site in sites:
        module = site.attention
        first = seen.setdefault(id(module), site)
        if first is site:
            continue
        name = next((n for n, m in model.named_modules() if m is module), type(module).__name__)
        raise ValueError(
            f"host {spec.name!r}: part {first.part!r} block {first.part_index} and part {site.part!r} block "
            f"{site.part_index} resolve to the same attention module {name!r}; each attention may belong to one "
            "part only: fix the parts' 'blocks'/'attention' paths so that they do not overlap (nothing was changed)"
        )


def _quantized_params(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Weights stored quantized (torchao subclass, bitsandbytes Params4bit): not a plain tensor nor a DTensor."""
    return [(n, p) for n, p in module.named_parameters() if type(p) not in (torch.Tensor, nn.Parameter)
            and not hasattr(p, "full_tensor")]


def new_adapter_modules(
    dim: int, config: PreProjConfig, device: torch.device
) -> tuple[PreProjection | None, ContentSkip | None]:
    """The (pre-projection, skip) `config` asks for at width `dim` (None where it asks for none), float32."""
    preproj = (
        PreProjection(dim, config.expansion, config.activation, config.init,
                      compute_dtype=config.compute_dtype, device=device)
        if config.preproj
        else None
    )
    skip = (ContentSkip(dim, config.skip_init_std, rank=config.skip_rank, compute_dtype=config.compute_dtype,
                        device=device)
            if config.skip else None)
    return preproj, skip



def _name_or_path(model: nn.Module) -> str | None:
    """transformers' `name_or_path` (hub id or folder the model was loaded from); None when built in code."""
    name = getattr(model, "name_or_path", None) or getattr(getattr(model, "config", None), "_name_or_path", None)
    return str(name) if isinstance(name, (str, Path)) and str(name) else None


def _freeze_base(model: nn.Module, state: InjectionState, spec: HostSpec) -> None:
    injected = {id(p) for w in injected_modules(model) for p in _adapter_params(w)}
    for p in model.parameters():
        if id(p) not in injected and p.requires_grad:
            p.requires_grad_(False)
            state.frozen.append(p)
    # With every base weight frozen, a block's input does not require grad, and reentrant gradient
    # checkpointing would silently give the injected weights no gradient. The hook makes the embedding output
    # require grad, only while reentrant checkpointing is on: otherwise that would cost a backward through
    # the frozen ops ahead of the first injected module (2.7% of a step) for nothing.
    emb = spec.input_embeddings(model)
    if emb is not None:
        from functools import partial

        # a partial, not a closure: deepcopy and pickle carry it over to the copied model
        state.input_grad_hook = emb.register_forward_hook(
            partial(_make_output_require_grad, model, checkpointing=spec.checkpointing))


def _make_output_require_grad(
    model: nn.Module, module: nn.Module, args: tuple, output: torch.Tensor, *, checkpointing: str = "any"
) -> None:
    """Forward hook: `output.requires_grad_()` when some block of `model` is checkpointed reentrantly, read
    with the row's switch (`HostSpec.checkpointing`, `hosts/checkpointing.py`)."""
    if not (torch.is_grad_enabled() and isinstance(output, torch.Tensor) and output.is_floating_point()):
        return
    if not output.requires_grad and reentrant_checkpointing(model, checkpointing):
        output.requires_grad_(True)


def _adapter_params(wrapper: PreProjAttention) -> list[nn.Parameter]:
    return [p for m in (wrapper.preproj, wrapper.skip) if m is not None for p in m.parameters()]


def _apply(model: nn.Module, plan: _Plan) -> nn.Module:
    for _, wrapper in plan.placements:  # an inner width of 0 would inject a no-op and save an empty adapter
        if wrapper.preproj is not None:
            plan.state.config.inner_width(wrapper.preproj.dim)
    done = []
    try:
        for site, wrapper in plan.placements:
            setattr(site.parent, site.attr, wrapper)
            done.append((site, wrapper))
        for wrapper, block, norm, where, norm_path in plan.seams:
            wrapper.seam_check = SeamCheck(block, norm, where, norm_path)
        model.mmpreproj_state = plan.state
        install_save_pretrained(model)
        if plan.state.config.freeze_base:
            _freeze_base(model, plan.state, plan.spec)
        _keep_trainable(model, plan.state)
    except BaseException:
        for site, wrapper in done:
            setattr(site.parent, site.attr, wrapper.base_layer)
            if getattr(wrapper, "seam_check", None) is not None:
                wrapper.seam_check.close()
        for p in plan.state.frozen:
            p.requires_grad_(True)
        for p in plan.state.thawed:
            p.requires_grad_(False)
        if plan.state.input_grad_hook is not None:
            plan.state.input_grad_hook.remove()
        remove_save_pretrained(model)
        if hasattr(model, "mmpreproj_state"):
            del model.mmpreproj_state
        raise
    return model


def _keep_trainable(model: nn.Module, state: InjectionState) -> None:
    """Unfreeze the config's `modules_to_save` and keep a copy of their weights for `unload`."""
    for name, path in state.modules_to_save.items():
        module = get_path(model, path)
        for k, v in module.state_dict().items():
            state.saved_originals[f"{name}.{k}"] = v.detach().clone()
        keep = {id(p) for p in module.parameters()}
        frozen_here = {id(p) for p in state.frozen}
        for p in module.parameters():
            if not p.requires_grad and id(p) not in frozen_here:
                state.thawed.append(p)
            p.requires_grad_(True)
        state.frozen[:] = [p for p in state.frozen if id(p) not in keep]  # identity, not tensor ==


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
        host: None = detect the row; a row name forces that row; a description dict (or `HostSpec`)
            says where the blocks, the pre-attention norm and the attention are (see `mmpreproj.hosts.spec`).
            The description is saved with the adapter, so `load_adapter` needs no code. None reads
            `config.host` (and, on a config read from an adapter file, the host it was saved for).

        example_input: None, or an input to run one forward with right after injecting (a tensor, a tuple of
            positional arguments, or a dict of keyword arguments): under `torch.no_grad`, in eval mode (the
            train/eval flags put back) and on a forked RNG. If it raises (a seam error, an attention that
            cannot take `x~`), the model is unloaded and the error re-raised: a wrong description never
            leaves an injected model behind.

        adapter_name: the name of this first adapter (peft's "default"; `named_adapters` adds more).

    Returns the same model object. Injected weights are float32 on the device of their block.
    peft's spelling of the same call: `peft.inject_adapter_in_model(config, model)`; `peft.get_peft_model`
    wraps the result in a `PeftModel` (`mmpreproj.tuner.PreProjModel`).
    """
    from .named_adapters import check_adapter_name

    config = config or PreProjConfig()
    plan = _plan(model, config, host if host is not None else config_host(model, config))
    plan.state.active_adapter = check_adapter_name(adapter_name)
    plan.state.adapter_configs = {adapter_name: config}
    for _, wrapper in plan.placements:
        wrapper.name_adapter(adapter_name)
    _apply(model, plan)
    if example_input is not None:
        from .hosts.trace import _probing

        args, kwargs = ((), example_input) if isinstance(example_input, dict) else (
            tuple(example_input) if isinstance(example_input, (tuple, list)) else (example_input,), {})
        try:
            with _probing(model), torch.no_grad():
                model(*args, **kwargs)
        except BaseException:
            unload(model)
            raise
    return model


def unload(model: nn.Module) -> nn.Module:
    """Remove every injected module, restoring the original attention modules and `requires_grad` flags.

    `model` may be the injected model or anything that holds it (a peft `PeftModel`, a container module,
    DDP/FSDP, `torch.compile`): every injected model inside is restored. Everything is checked before the
    first change, so a refused call leaves the model as it was.

    Only the flags inject changed are put back: the base weights it froze become trainable again, the
    `modules_to_save` weights it made trainable are frozen again. Under peft (the `preproj_lora` shape: peft
    wrapped the model after inject and froze the base for its own adapter) the base stays frozen, as peft
    wants it: the LoRA model goes on training only its LoRA weights.
    """
    if not is_injected(model):
        raise RuntimeError("this model has no mmpreproj modules to unload")
    swaps = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if isinstance(child, PreProjAttention):
                if not isinstance(child.base_layer, nn.Module):
                    raise RuntimeError(f"unload: the wrapper at .{name} of {type(parent).__name__} lost its base layer")
                swaps.append((parent, name, child.base_layer))
    owners = [owner for _, owner in injected_owners(model)]
    params = list(model.parameters())
    current = {id(p) for p in params}
    for owner in owners:
        state = vars(owner)[STATE_ATTR]
        if not isinstance(state, InjectionState):
            raise TypeError(f"unload: {type(owner).__name__}.{STATE_ATTR} is not an InjectionState; nothing was changed")
        if any(id(p) not in current for p in state.frozen) and any(hasattr(p, "full_tensor") for p in params):
            raise RuntimeError(
                "unload: the model's parameters were replaced by sharded ones after inject (FSDP fully_shard), so "
                "the base's requires_grad flags cannot be restored; nothing was changed. Unload before sharding"
            )
    for parent, name, base in swaps:  # from here on nothing can fail
        wrapper = getattr(parent, name)
        if wrapper.seam_check is not None:
            wrapper.seam_check.close()
        setattr(parent, name, base)
    wrapped_by_peft = _peft_layers(model)[:1] == [""]
    for owner in owners:
        state: InjectionState = vars(owner)[STATE_ATTR]
        _restore_saved_modules(owner, state)
        if not (wrapped_by_peft or _peft_layers(owner)):  # peft froze the base after inject: it stays frozen
            for p in state.frozen:
                if not p.requires_grad:
                    p.requires_grad_(True)
        for p in state.thawed:
            if p.requires_grad:
                p.requires_grad_(False)
        if state.input_grad_hook is not None:
            state.input_grad_hook.remove()
        delattr(owner, STATE_ATTR)
        remove_save_pretrained(owner)
    return model


@contextlib.contextmanager
def adapter_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Run the host without its injected modules inside the block (weights stay in place)."""
    wrappers = injected_modules(model)
    before = [w.adapter_enabled for w in wrappers]
    for w in wrappers:
        w.adapter_enabled = False
    try:
        yield model
    finally:
        for w, flag in zip(wrappers, before):
            w.adapter_enabled = flag


def _restore_saved_modules(model: nn.Module, state: InjectionState) -> None:
    """Put back the weights `modules_to_save` had at inject time (they trained with the adapter)."""
    with torch.no_grad():
        for name, path in state.modules_to_save.items():
            for k, v in get_path(model, path).state_dict(keep_vars=True).items():
                v.copy_(state.saved_originals[f"{name}.{k}"])


def adapter_key(block_index: int | None, module: str, name: str) -> str:
    """The file key of an adapter weight, the one place its format is written:
    `blocks.{i}.{preproj|skip}.{param}` for an injected weight (i = the adapter block index), or, with
    `block_index=None`, `modules.{name}.{param}` for a base module of `modules_to_save`."""
    if block_index is None:
        return f"modules.{module}.{name}"
    return f"blocks.{block_index}.{module}.{name}"


def parse_adapter_key(key: str) -> tuple[int | None, str, str]:
    """`adapter_key`'s inverse: (block index or None for a saved module, module, param); ValueError otherwise."""
    kind, _, rest = key.partition(".")
    first, _, name = rest.partition(".")
    if kind == "blocks" and first.isdigit() and name:
        module, _, param = name.partition(".")
        if param:
            return int(first), module, param
    if kind == "modules" and first and name:
        return None, first, name
    raise ValueError(f"{key!r} is not an adapter key (blocks.<i>.<preproj|skip>.<param> or modules.<name>.<param>)")


def _wrapper_tensors(wrappers: list[PreProjAttention]) -> dict[str, torch.Tensor]:
    return {
        adapter_key(w.block_index, part, k): v
        for w in wrappers
        for part in ("preproj", "skip")
        if getattr(w, part) is not None
        for k, v in getattr(w, part).state_dict().items()
    }


def _saved_module_tensors(model: nn.Module, modules_to_save: dict[str, str]) -> dict[str, torch.Tensor]:
    return {
        adapter_key(None, name, k): v
        for name, path in modules_to_save.items()
        for k, v in get_path(model, path).state_dict().items()
    }


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Only the injected weights, keyed `blocks.{i}.preproj.up.weight` etc. by host block index, plus
    `modules.{name}.{param}` for the config's `modules_to_save`.

    Weights sharded by FSDP2 (DTensors) are gathered into full tensors: a collective, so on a sharded
    model every rank must call this.
    """
    out = _wrapper_tensors(injected_modules(model))
    state: InjectionState | None = getattr(model, "mmpreproj_state", None)
    if state is not None:
        out.update(_saved_module_tensors(model, state.modules_to_save))
    # FSDP2 DTensor -> full tensor
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in out.items()}


def check_tensors_match(expected: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor], what: str) -> None:
    """ValueError starting with `what` unless `tensors` has exactly the keys and shapes of `expected`."""
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{what}: missing {missing[:4]}, unexpected {unexpected[:4]}")
    for k, dst in expected.items():
        got = tensors[k]
        if tuple(got.shape) != tuple(dst.shape):
            raise ValueError(f"{what}: {k} has shape {tuple(got.shape)}, expected {tuple(dst.shape)}")
        # a float weight may come in another float dtype (cast on copy); integers, bools or complex values never
        if got.is_floating_point() != dst.is_floating_point() or (not dst.is_floating_point() and got.dtype != dst.dtype):
            expect = f"a floating-point tensor ({dst.dtype})" if dst.is_floating_point() else str(dst.dtype)
            raise ValueError(f"{what}: {k} has dtype {got.dtype}, expected {expect}")


def set_adapter_state_dict(
    model: nn.Module, tensors: dict[str, torch.Tensor], *, adapter_name: str | None = None
) -> nn.Module:
    """Copy adapter weights (keyed as `adapter_state_dict` keys them) into an already injected `model`.

    The in-place counterpart of `load_adapter` (peft's `set_peft_model_state_dict`): the injection stays,
    only its weights change, so optimizer references and hooks survive (a Trainer's resume). Every key and
    shape is checked, and non-finite values refused, before the first copy: on error nothing changed.
    `adapter_name` writes a stored (inactive) adapter instead of the active one.
    Not for FSDP2-sharded models (their weights are DTensors). Refused while a step is in flight (a forward
    running, or a graph through the adapter awaiting backward: `named_adapters.refuse_in_flight`).
    """
    from .named_adapters import named_adapter, refuse_in_flight

    owner, state = injected_owner(model, "set_adapter_state_dict")
    name, _ = named_adapter(state, adapter_name)
    refuse_in_flight(owner, "set_adapter_state_dict")
    expected = named_adapter_tensors(owner, name)
    check_tensors_match(expected, tensors, "set_adapter_state_dict: the weights do not match this injection")
    _refuse_non_finite(tensors, "set_adapter_state_dict")
    with torch.no_grad():
        for k, dst in expected.items():
            dst.copy_(tensors[k])
    return model


def save_adapter(
    model: nn.Module,
    path: str | Path,
    *,
    state_dict: dict[str, torch.Tensor] | None = None,
    adapter_name: str | None = None,
    readme: bool = False,
    base_save_token: str | None = None,
) -> Path:
    """Write only the injected weights (`adapter_model.safetensors`) and `adapter_config.json` to `path`.

    `state_dict` is what to write (default `adapter_state_dict(model)`): pass the one every rank gathered
    from a sharded model when only one rank writes. Each file is written to a temporary name and renamed,
    so a crash never leaves a torn file, and the two files are replaced together (`adapter_files`): a
    reader sees the old pair or the new one, never a mix. `model` may be wrapped (peft, DDP, a container,
    `torch.compile`). Non-finite weights are refused before anything is written.

    `adapter_name` saves one of several loaded adapters (default: the active one, `named_adapters`);
    `readme=True` also writes a short model card, README.md (`model_card.py`), in the same commit.
    `base_save_token`: the token `save_pretrained` wrote into the base beside this adapter (`pretrained.py`).
    """
    from .model_card import model_card
    from .named_adapters import named_adapter

    owner, state = injected_owner(model, "save_adapter")
    path = Path(path)
    name, _ = named_adapter(state, adapter_name)
    if state_dict is None:
        state_dict = named_adapter_tensors(owner, name)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
    _refuse_non_finite(tensors, f"save_adapter: refusing to write {path}")
    meta = {"format": "pt", "mmpreproj_version": __version__}
    desc = describe_for_save(owner, name, tensors)
    if base_save_token is not None:
        desc[BASE_SAVE_TOKEN] = base_save_token
    text = json.dumps(peft_config_from_description(desc), indent=2, sort_keys=True) + "\n"
    tensors = block_keys_to_peft(tensors, desc, where=f"save_adapter {path}")
    writers = {
        ADAPTER_WEIGHTS_NAME: lambda f: save_file(tensors, f, metadata=meta),
        ADAPTER_CONFIG_NAME: lambda f: Path(f).write_text(text, encoding="utf-8"),
    }
    if readme:
        card = model_card(desc)
        writers["README.md"] = lambda f: Path(f).write_text(card, encoding="utf-8")
    write_files(path, writers)
    return path


def describe_for_save(owner: nn.Module, name: str, tensors: dict[str, torch.Tensor] | None = None) -> dict:
    """The description written beside adapter `name`'s weights: the injection (`InjectionState.describe`),
    the adapter's config, the `add_rope` positions and the model card's fields."""
    from .model_card import card_fields
    from .named_adapters import named_adapter

    state: InjectionState = vars(owner)[STATE_ATTR]
    name, config = named_adapter(state, name)
    desc = state.describe()
    rope = describe_rope(owner)
    if rope is not None:  # add_rope positions: load_adapter restores or checks them
        desc["rope"] = rope
    desc["config"] = config.to_dict()
    tensors = named_adapter_tensors(owner, name) if tensors is None else tensors
    for k, v in card_fields(owner, name, tensors, state).items():
        desc.setdefault(k, v)  # keys another writer already put in describe() win
    return desc


def named_adapter_tensors(owner: nn.Module, name: str) -> dict[str, torch.Tensor]:
    """Adapter `name`'s weights in block-index keys: the active one's (`adapter_state_dict`) or a stored one's."""
    state: InjectionState = vars(owner)[STATE_ATTR]
    return adapter_state_dict(owner) if name == state.active_adapter else _stored_tensors(owner, name)


def trainable_adapter_params(owner: nn.Module) -> list[nn.Parameter]:
    """The active adapter's weights and its `modules_to_save` weights (what trains with the adapter)."""
    state: InjectionState = vars(owner)[STATE_ATTR]
    params = [p for w in injected_modules(owner) for p in _adapter_params(w)]
    params += [p for path in state.modules_to_save.values() for p in get_path(owner, path).parameters()]
    return params


def _stored_tensors(owner: nn.Module, name: str) -> dict[str, torch.Tensor]:
    """A stored (not active) adapter's weights, keyed as `adapter_state_dict` keys the active one's."""
    state: InjectionState = vars(owner)[STATE_ATTR]
    out = {
        adapter_key(w.block_index, part, k): v
        for w in injected_modules(owner)
        for part, module in w.stored_adapters[name].items()
        for k, v in module.state_dict().items()
    }
    out.update(state.stored_modules.get(name, {}))
    return out


def adapter_folder(path: str | Path) -> Path:
    """The folder holding an adapter's files: `path` itself, or the `adapter/` subfolder a
    `save_pretrained` folder (and a training run folder) keeps them in."""
    path = Path(path)
    sub = path / PRETRAINED_ADAPTER_DIR
    if not (path / ADAPTER_CONFIG_NAME).is_file() and (sub / ADAPTER_CONFIG_NAME).is_file():
        return sub
    return path


def _refuse_non_finite(tensors: dict[str, torch.Tensor], what: str) -> None:
    """ValueError naming the first tensor with NaN/inf values, or an injected weight (`blocks.*`) that is not
    floating point (integers, bools, complex: finite garbage where float weights are expected)."""
    for k, v in tensors.items():
        if not v.is_floating_point() and k.startswith("blocks."):
            raise ValueError(f"{what}: tensor {k} has dtype {v.dtype}; injected weights are floating point (float32)")
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            bad = int((~torch.isfinite(v)).sum())
            raise ValueError(f"{what}: tensor {k} holds {bad} non-finite value(s) (nan/inf) of {v.numel()}")


def read_adapter(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """Read and parse an adapter folder: (description, tensors). Clear errors for missing/corrupt files,
    a config that is not an object and weights that are not finite (the tensor is named).

    `path` is an adapter folder or a folder holding one as `adapter/` (`adapter_folder`)."""
    path = adapter_folder(path)
    with committed_files(path, (ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME)) as files:
        cfg_file, weights_file = files[ADAPTER_CONFIG_NAME], files[ADAPTER_WEIGHTS_NAME]
        for f in (cfg_file, weights_file):
            if not f.is_file():
                raise FileNotFoundError(f"adapter file missing: {path / f.name}")
        try:
            desc = json.loads(cfg_file.read_text(encoding="utf-8"))
            peft_layout = isinstance(desc, dict) and not is_legacy_description(desc)
            if peft_layout:
                desc = description_from_peft_config(desc, "peft adapter")
            if isinstance(desc, dict) and desc.get("adapter_type", ADAPTER_TYPE) != ADAPTER_TYPE:
                raise ValueError(f"adapter_type={desc['adapter_type']!r}, expected {ADAPTER_TYPE!r}")
            if not isinstance(desc, dict) or "config" not in desc:
                raise ValueError("no 'config' key")
            if not isinstance(desc["config"], dict):
                raise ValueError(f"'config' must be an object of PreProjConfig fields, got {type(desc['config']).__name__}")
        except (json.JSONDecodeError, ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"corrupt adapter config {path / ADAPTER_CONFIG_NAME}: {e}") from None
        except RecursionError:  # json.loads of a file nested thousands of levels deep
            raise ValueError(f"corrupt adapter config {path / ADAPTER_CONFIG_NAME}: nested too deeply") from None
        try:
            tensors = load_file(str(weights_file))
        except (SafetensorError, OSError, ValueError) as e:
            raise ValueError(f"corrupt adapter weights {path / ADAPTER_WEIGHTS_NAME}: {e}") from None
        check_weights_digest(desc.get(DIGEST_KEY), tensors, path / ADAPTER_WEIGHTS_NAME)  # a PeftModel save cut short
    _refuse_non_finite(tensors, f"adapter weights {path / ADAPTER_WEIGHTS_NAME}")  # named by the file's keys
    if peft_layout:
        tensors = block_keys_from_peft(tensors, desc, f"adapter weights {path / ADAPTER_WEIGHTS_NAME}")
        _refuse_non_finite(tensors, f"adapter weights {path / ADAPTER_WEIGHTS_NAME}")  # dtypes, by block
    return desc, tensors


def _check_saved_paths(desc: dict, path: Path) -> None:
    """Refuse a file whose paths are not data (calls, dunders, private names), before any of them meets a
    model and whichever loader reads it: the description and `modules_to_save` are checked for form."""
    where = f"adapter at {path}"
    described = desc.get("host_description")
    try:
        if isinstance(described, dict) and described.get("parts"):
            with warnings.catch_warnings():  # a form check only: the host in use warns where it is resolved
                warnings.simplefilter("ignore", UserWarning)
                HostSpec.from_dict(described)
        saved = desc.get("modules_to_save") or {}
        if not isinstance(saved, dict):
            raise HostError(f"'modules_to_save' must be an object of name -> path, got {type(saved).__name__}")
        for name, module_path in saved.items():
            check_path(name, "modules_to_save")
            check_path(module_path, f"modules_to_save[{name!r}]")
    except HostError as e:
        raise ValueError(f"{where}: {e}") from None


def config_host(model: nn.Module, config: PreProjConfig) -> str | dict | HostSpec | None:
    """The host a config asks for: the one its `injection` was saved for (a config read from an adapter
    file, checked against `model`), else `config.host` (None = detect the row)."""
    if config.injection is None:
        return config.host
    _check_saved_paths(config.injection, Path("<config>"))
    return _saved_host(model, config.injection, Path(str(config.base_model_name_or_path or "<config>")))


def _saved_host(model: nn.Module, desc: dict, path: Path) -> str | HostSpec:
    """The row (forced, by type or by structure) or described host an adapter was saved for, checked
    against `model` (`hosts.registry.host_for_adapter`)."""
    try:
        return host_for_adapter(model, desc.get("host"), desc.get("host_description"))
    except HostError as e:
        raise ValueError(f"adapter at {path} was {e}") from None


def load_adapter(
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
    when the base beside it comes from another save: `pretrained.check_saved_pair`). The
    adapter file carries the host description (parts, paths, call convention), so a user-described host
    reloads with no code. Raises (leaving `model` untouched) on a missing or corrupt file, another host,
    parts the model does not have, another hidden size or block count, or weights that do not match.

    On a model that is already injected, `adapter_name` adds this adapter beside the loaded ones, frozen
    and inactive (`set_adapter` switches to it; see `named_adapters`); on a plain model it names the
    first adapter (default "default").
    Saved `add_rope` positions are restored on a model without them, or the load is refused with the call
    to make (`mmpreproj.timm_rope.saved`).
    """
    from .named_adapters import add_named_adapter, check_adapter_name

    refuse_meta_parameters(model, "load_adapter")
    if adapter_name is not None:
        check_adapter_name(adapter_name)
    given, path = Path(path), adapter_folder(path)
    desc, tensors = read_adapter(path)
    _check_saved_paths(desc, path)
    if path != given:  # a save_pretrained folder: its base and its adapter must come from one save
        check_saved_pair(config_save_token(given / "config.json"), desc.get(BASE_SAVE_TOKEN), given)
    if adapter_name is not None and is_injected(model):
        return add_named_adapter(model, desc, tensors, adapter_name, path)
    config = PreProjConfig.from_dict(desc["config"])
    if freeze_base is not None:
        config.freeze_base = freeze_base
    host = _saved_host(model, desc, path)
    restore_rope = rope_for_load(model, desc.get("rope"), f"adapter at {path}")  # checks only; runs after _apply
    with torch.random.fork_rng(devices=[]):  # building the modules must not move the caller's RNG
        plan = _plan(model, config, host)
    saved_parts = [p.get("name") for p in desc.get("parts", []) if isinstance(p, dict)]
    have_parts = [p["name"] for p in plan.state.parts]
    if saved_parts and saved_parts != have_parts:
        raise ValueError(f"adapter at {path} was saved for parts {saved_parts}; this model has parts {have_parts}")
    for field_name, saved in (("num_blocks", desc.get("num_blocks")), ("hidden_size", desc.get("hidden_size"))):
        have = getattr(plan.state, field_name)
        if saved != have:
            raise ValueError(f"adapter at {path} has {field_name}={saved}, this model has {field_name}={have}")
    expected = _wrapper_tensors([w for _, w in plan.placements])
    expected.update(_saved_module_tensors(model, plan.state.modules_to_save))
    check_tensors_match(expected, tensors, f"adapter at {path} does not match its config")
    injected = {k: v for k, v in expected.items() if parse_adapter_key(k)[0] is not None}
    with torch.no_grad():
        for k, dst in injected.items():
            dst.copy_(tensors[k])
    if adapter_name is not None:
        plan.state.adapter_configs = {adapter_name: plan.state.config}
        plan.state.active_adapter = adapter_name
    _apply(model, plan)
    if restore_rope is not None:
        restore_rope()
    with torch.no_grad():  # base modules trained with the adapter: written once the originals are kept
        for k, dst in expected.items():
            if parse_adapter_key(k)[0] is None:
                dst.copy_(tensors[k])
    if not is_trainable:
        for p in trainable_adapter_params(model):
            p.requires_grad_(False)
    return model
