"""Validate everything and build the wrappers, the model untouched (`plan_injection`): the host row and its
sites, the parts and layers the config selects, `modules_to_save`, and the refusals (a compiled or peft model,
two parts over one attention, quantized weights to train).

`trace_seams`: a model's host description found by one forward (`hosts/trace.py`, the tracing), checked by
injecting it at identity init into a copy: every tensor the model returns must stay as it was (`check=True`).
"""

from __future__ import annotations

import copy
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..hosts import HostSpec
from ..hosts.auto_host import check_described
from ..hosts.paths import check_path
from ..hosts.registry import as_host, forced_mismatch, host_for_adapter
from ..hosts.spec import HostError, Site, get_path, resolve_sites
from ..hosts.trace import DESCRIBE_BY_HAND, TraceError, probe_outputs, same_outputs, trace_description
from ..modules import ContentSkip, PreProjection
from .config import PreProjConfig, select_sites
from .layer import PreProjAttention, SeamCheck, SkipJoin
from .state import InjectionState, check_adapter_name, is_injected


@dataclass
class Plan:
    """Wrappers built for a model, not yet placed in it."""

    spec: HostSpec
    state: InjectionState
    placements: list[tuple[Site, PreProjAttention]]  # (site, wrapper)
    seams: list[tuple[PreProjAttention, nn.Module, nn.Module, str, str]] = field(default_factory=list)
    adapter_name: str = "default"
    joins: list[tuple[PreProjAttention, nn.Module, str]] = field(default_factory=list)  # (wrapper, skip_to, where)

    def arm(self) -> None:
        """Every wrapper placed: arm the seam checks and the skip joins (`SeamCheck`, `SkipJoin`)."""
        for wrapper, block, norm, where, norm_path in self.seams:
            wrapper.seam_check = SeamCheck(block, norm, where, norm_path)
        for wrapper, module, where in self.joins:
            wrapper.skip_join = SkipJoin(module, where)


def device_of(module: nn.Module) -> torch.device:
    p = next(module.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


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
            raise ValueError(
                f"PreProjConfig.modules_to_save: {name!r} ({path}) holds quantized weights "
                f"(e.g. {_quantized_params(module)[0][0]!r}), which cannot train; keep it float"
            )
        out[name] = path
    return out


def _refuse_saved_around_attention(saved: dict[str, str], attentions: list[str]) -> None:
    """A `modules_to_save` module may neither be nor hold an attention the adapter wraps, nor sit inside one: the
    wrapper replaces that attention (its values could not be kept aside and put back); ValueError naming it."""
    for name, path in saved.items():
        for attention in attentions:
            if path == attention or attention.startswith(f"{path}.") or path.startswith(f"{attention}."):
                where = "sits inside" if path.startswith(f"{attention}.") else "is or holds"
                raise ValueError(
                    f"PreProjConfig.modules_to_save: {name!r} ({path}) {where} the attention {attention!r} the "
                    "adapter wraps; name modules outside the injected attentions (a head, a norm, an embedding, "
                    "a projector), or leave those blocks out with layers=[...]"
                )


def plan_injection(
    model: nn.Module, config: PreProjConfig, host: str | dict | HostSpec | None, adapter_name: str = "default"
) -> Plan:
    """Validate everything and build the wrappers, holding adapter `adapter_name`; the model is not touched."""
    if not isinstance(config, PreProjConfig):
        raise TypeError(f"config must be a PreProjConfig, got {type(config).__name__}")
    check_adapter_name(adapter_name)
    check_plain_model(model)
    spec = as_host(model, host)
    try:
        sites = resolve_sites(model, spec)
    except HostError as e:
        if host is None or isinstance(host, dict):
            raise
        raise forced_mismatch(model, spec, e) from None
    _refuse_overlapping_parts(model, spec, sites)
    parts, chosen = select_sites(sites, spec, config)
    if not chosen:
        raise ValueError(f"PreProjConfig selects no block of {spec.name!r} (parts {parts}, layers {config.layers})")
    placements, seams, joins = [], [], []
    for site in chosen:
        if isinstance(site.attention, PreProjAttention):
            raise RuntimeError(f"block {site.index} already holds a PreProjAttention")
        preproj, skip = new_adapter_modules(site.width, config, device_of(site.block))
        wrapper = PreProjAttention(
            site.attention, site.call, preproj, skip, block_index=site.index, part=site.part, adapter_name=adapter_name
        )
        wrapper.seam = (
            f"host {spec.name!r}, block {site.part_index} of part {site.part!r}: norm {site.norm_path!r} -> "
            f"attention {next(p.attention for p in spec.parts if p.name == site.part)!r}"
        )
        placements.append((site, wrapper))
        where = f"host {spec.name!r}, part {site.part!r}, block {site.part_index}"
        if site.norm is not None:
            seams.append((wrapper, site.block, site.norm, where, site.norm_path))
        if site.skip_to is not None:
            joins.append((wrapper, site.skip_to, where))
    widths = [site.width for site, _ in placements]
    width: int | list[int] = widths[0] if len(set(widths)) == 1 else widths
    description = spec.describe(model)
    part_rows = []
    for d in description["parts"]:
        first = next(s.index for s in sites if s.part == d["name"])
        injected = [s.part_index for s, _ in placements if s.part == d["name"]]
        part_rows.append({"name": d["name"], "first_block": first, "num_blocks": d["num_blocks"], "layers": injected})
    names = {id(m): n for n, m in model.named_modules()}
    attentions = [f"{names[id(s.parent)]}.{s.attr}".lstrip(".") for s, _ in placements]
    saved = _modules_to_save(model, spec, config.modules_to_save)
    _refuse_saved_around_attention(saved, attentions)
    state = InjectionState(
        config,
        spec.name,
        [s.index for s, _ in placements],
        len(sites),
        width,
        host_description=description,
        parts=part_rows,
        modules_to_save=saved,
        base_model_name_or_path=_name_or_path(model),
        modules=attentions,
        peft_config={adapter_name: config},  # until the tuner hands over peft's own dict
    )
    return Plan(spec, state, placements, seams, adapter_name, joins)


def check_plain_model(model: nn.Module) -> None:
    """RuntimeError when `model` cannot take a first injection: it holds one already, is compiled, or is (or
    holds) a peft model."""
    if is_injected(model):
        raise RuntimeError("this model already has mmpreproj modules injected; call mmpreproj.unload(model) first")
    _refuse_compiled_or_peft(model)


def peft_layers(model: nn.Module) -> list[str]:
    """Names of the peft adapter layers (LoRA, ...) inside `model` ("" for a `PeftModel` itself); peft is
    looked up in `sys.modules`, never imported."""
    tuners = sys.modules.get("peft.tuners.tuners_utils")
    layer_cls = getattr(tuners, "BaseTunerLayer", None)
    peft_model = getattr(sys.modules.get("peft"), "PeftModel", None)
    if layer_cls is None and peft_model is None:
        return []
    return [
        n
        for n, m in model.named_modules()
        if (layer_cls is not None and isinstance(m, layer_cls))
        or (n == "" and peft_model is not None and isinstance(m, peft_model))
    ]


def _refuse_compiled_or_peft(model: nn.Module) -> None:
    """inject comes before `torch.compile`, and goes into the model a `PeftModel` wraps, not the `PeftModel`:
    refuse the other way, naming the one that works."""
    compiled = getattr(sys.modules.get("torch._dynamo.eval_frame"), "OptimizedModule", None)
    found = [n for n, m in model.named_modules() if compiled is not None and isinstance(m, compiled)]
    if found:
        what = "the model is" if found[0] == "" else f"its submodule {found[0]!r} is"
        raise RuntimeError(
            f"inject: {what} a torch.compile wrapper (OptimizedModule); inject the model before compiling it: "
            "mmpreproj.inject(model), then model = torch.compile(model)"
        )
    layers = peft_layers(model)
    if layers and layers[0] == "":
        raise RuntimeError(
            "inject: the model is a peft PeftModel; inject the model it wraps, mmpreproj.inject(peft_model.base_model"
            ".model): its LoRA layers stay inside the attention and keep their requires_grad (the order of method "
            "'preproj_lora', mmpreproj.train.apply_method)"
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
    return [
        (n, p)
        for n, p in module.named_parameters()
        if type(p) not in (torch.Tensor, nn.Parameter) and not hasattr(p, "full_tensor")
    ]


def new_adapter_modules(
    dim: int, config: PreProjConfig, device: torch.device
) -> tuple[PreProjection | None, ContentSkip | None]:
    """The (pre-projection, skip) `config` asks for at width `dim` (None where it asks for none), float32;
    sizes out of range for `dim` are refused before anything is allocated (`PreProjConfig.check_sizes`)."""
    config.check_sizes(dim)
    preproj = (
        PreProjection(
            dim, config.expansion, config.activation, config.init, compute_dtype=config.compute_dtype, device=device
        )
        if config.preproj
        else None
    )
    skip = (
        ContentSkip(
            dim, config.skip_init_std, rank=config.skip_rank, compute_dtype=config.compute_dtype, device=device
        )
        if config.skip
        else None
    )
    return preproj, skip


def _name_or_path(model: nn.Module) -> str | None:
    """transformers' `name_or_path` (hub id or folder the model was loaded from); None when built in code."""
    name = getattr(model, "name_or_path", None) or getattr(getattr(model, "config", None), "name_or_path", None)
    return str(name) if isinstance(name, (str, Path)) and str(name) else None


def config_host(model: nn.Module, config: PreProjConfig) -> str | dict | HostSpec | None:
    """The host a config asks for: the one its `injection` was saved for (a config read from an adapter
    file, checked against `model`), else `config.host` (None = detect the row)."""
    if config.injection is None:
        return config.host
    check_saved_paths(config.injection, Path("<config>"))
    return saved_host(model, config.injection, Path(str(config.base_model_name_or_path or "<config>")))


def saved_host(model: nn.Module, desc: dict, path: Path) -> str | HostSpec:
    """The row (forced, by type or by structure) or described host an adapter was saved for, checked
    against `model` (`hosts.registry.host_for_adapter`); a described host is confirmed by the trace
    (`auto_host.check_described`)."""
    try:
        host = host_for_adapter(model, desc.get("host"), desc.get("host_description"))
        if isinstance(host, HostSpec):
            check_described(model, host)
        return host
    except HostError as e:
        raise ValueError(f"adapter at {path} was {e}") from None


def check_saved_paths(desc: dict, path: Path) -> None:
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


def trace_seams(model: nn.Module, *args: Any, check: bool = True, partial: bool = False, **kwargs: Any) -> dict:
    """The host description of `model` found by running `model(*args, **kwargs)` once (no gradients).

    Raises `TraceError` (a ValueError) naming the modules and the reason when no exact description is found:
    no seam, a post-norm seam, a hybrid stack no path tells apart, or attention modules left out (unless
    `partial`: they are then listed under the description's `left_out`, module name -> reason). With
    `check`, a deep copy injected at identity init with the description must return the same tensors (fp32,
    1e-5). The forwards run in eval mode from one RNG state: the caller's RNG and the model's train/eval
    flags are left as they were.
    """
    return trace_description(model, args, kwargs, partial=partial, verify=_check if check else None)


def _check(model: nn.Module, description: dict, args: tuple, kwargs: dict, rng: torch.Tensor) -> None:
    """A copy injected at identity init with `description` (its seams checked) must return the same tensors."""
    twin = copy.deepcopy(model)
    plan = plan_injection(twin, PreProjConfig(init="identity", skip_init_std=0.0), description)
    for site, wrapper in plan.placements:
        setattr(site.parent, site.attr, wrapper)
    plan.arm()
    ref = probe_outputs(model, [], args, kwargs, rng)
    got = probe_outputs(twin, [], args, kwargs, rng)
    if not same_outputs(got, ref, 1e-5):
        raise TraceError(
            f"trace_seams: the traced description does not reproduce {type(model).__name__} at "
            f"identity init (of the {len(ref)} tensors it returns, some moved); {DESCRIBE_BY_HAND}"
        )
