"""inject / unload / save_adapter / load_adapter: put the modules into a host model and take them out.

Every call validates first and mutates last, so a failed call leaves the model exactly as it was.
The injection's bookkeeping lives on the model itself (`model.mmpreproj_state`), never in globals.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn
from torch.utils.hooks import RemovableHandle

from .config import PreProjConfig
from .hosts import HostSpec, find_host, get_host
from .io import atomic_write
from .modules import ContentSkip, PreProjAttention, PreProjection
from .version import __version__

__all__ = [
    "ADAPTER_CONFIG_NAME",
    "ADAPTER_WEIGHTS_NAME",
    "InjectionState",
    "adapter_state_dict",
    "adapter_disabled",
    "injected_modules",
    "inject",
    "is_injected",
    "load_adapter",
    "save_adapter",
    "set_fused",
    "unload",
]

ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
ADAPTER_CONFIG_NAME = "adapter_config.json"


@dataclass
class InjectionState:
    """What `inject` did to a model, kept on the model as `model.mmpreproj_state`."""

    config: PreProjConfig
    host: str
    layers: list[int]
    num_blocks: int
    hidden_size: int | list[int]  # one width, or one per injected block when they differ (e.g. CLIP towers)
    frozen: list[nn.Parameter] = field(default_factory=list, repr=False)
    input_grad_hook: RemovableHandle | None = field(default=None, repr=False)

    def describe(self) -> dict:
        """The JSON-able description saved beside adapter weights."""
        return {
            "config": self.config.to_dict(),
            "host": self.host,
            "layers": self.layers,
            "num_blocks": self.num_blocks,
            "hidden_size": self.hidden_size,
            "library_version": __version__,
        }


@dataclass
class _Plan:
    """Wrappers built for a model, not yet placed in it."""

    spec: HostSpec
    state: InjectionState
    placements: list[tuple[nn.Module, PreProjAttention]]  # (block, wrapper)


def injected_modules(model: nn.Module) -> list[PreProjAttention]:
    """The wrappers in `model`, in block order."""
    found = [m for m in model.modules() if isinstance(m, PreProjAttention)]
    return sorted(found, key=lambda m: m.block_index)


def is_injected(model: nn.Module) -> bool:
    return hasattr(model, "mmpreproj_state") or bool(injected_modules(model))


def _device_of(module: nn.Module) -> torch.device:
    p = next(module.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _plan(model: nn.Module, config: PreProjConfig, host: str | None) -> _Plan:
    """Validate everything and build the wrappers; the model is not touched."""
    if not isinstance(config, PreProjConfig):
        raise TypeError(f"config must be a PreProjConfig, got {type(config).__name__}")
    if is_injected(model):
        raise RuntimeError("this model already has mmpreproj modules injected; call mmpreproj.unload(model) first")
    spec = get_host(host) if host is not None else find_host(model)
    blocks = spec.blocks(model)
    if not blocks:
        raise ValueError(f"host {spec.name!r}: the model has no attention blocks")
    layers = config.resolve_layers(len(blocks))
    widths = [spec.hidden_size(model, blocks[i]) for i in layers]
    placements = []
    for i, dim in zip(layers, widths):
        block = blocks[i]
        attn = getattr(block, spec.attention, None)
        if not isinstance(attn, nn.Module):
            raise ValueError(f"host {spec.name!r}: block {i} has no attention module at .{spec.attention}")
        device = _device_of(block)
        preproj = (
            PreProjection(dim, config.expansion, config.activation, config.init,
                          compute_dtype=config.compute_dtype, device=device)
            if config.preproj
            else None
        )
        skip = (ContentSkip(dim, config.skip_init_std, compute_dtype=config.compute_dtype, device=device)
                if config.skip else None)
        fused = spec.fused_forward if config.fuse_qkv_skip else None
        if config.fuse_qkv_skip and fused is None:
            raise ValueError(f"PreProjConfig.fuse_qkv_skip=True, but host {spec.name!r} has no fused path; "
                             f"hosts with one: {[s.name for s in _hosts_with_fused()]}")
        placements.append((block, PreProjAttention(attn, spec.call, preproj, skip, block_index=i, fused_forward=fused)))
    width: int | list[int] = widths[0] if len(set(widths)) == 1 else widths
    state = InjectionState(config, spec.name, layers, len(blocks), width)
    return _Plan(spec, state, placements)


def _hosts_with_fused() -> list[HostSpec]:
    from .hosts import HOSTS

    return [s for s in HOSTS.values() if s.fused_forward is not None]


def set_fused(model: nn.Module, enabled: bool) -> nn.Module:
    """Switch the one-matmul Q/K/V + skip fast path on or off for an injected model."""
    state: InjectionState | None = getattr(model, "mmpreproj_state", None)
    if state is None:
        raise RuntimeError("set_fused: this model has no mmpreproj modules (call mmpreproj.inject first)")
    fused = get_host(state.host).fused_forward
    if enabled and fused is None:
        raise ValueError(f"host {state.host!r} has no fused path; hosts with one: {[s.name for s in _hosts_with_fused()]}")
    for w in injected_modules(model):
        w.fused_forward = fused if enabled else None
    state.config.fuse_qkv_skip = enabled
    return model


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
        state.input_grad_hook = emb.register_forward_hook(partial(_make_output_require_grad, model))


def _make_output_require_grad(model: nn.Module, module: nn.Module, args: tuple, output: torch.Tensor) -> None:
    """Forward hook: `output.requires_grad_()` when some block of `model` is checkpointed reentrantly.

    Switches read: transformers' `gradient_checkpointing` with its `use_reentrant` keyword; timm's
    `grad_checkpointing` with `timm.layers.use_reentrant_ckpt()`; open_clip's (always non-reentrant). Any
    other `gradient_checkpointing`/`grad_checkpointing` flag that is on counts as reentrant (the safe side).
    """
    import sys

    if not (torch.is_grad_enabled() and isinstance(output, torch.Tensor) and output.is_floating_point()):
        return
    if output.requires_grad:
        return
    for m in model.modules():
        if getattr(m, "gradient_checkpointing", False) is True and m.training:  # transformers (train mode only)
            keywords = getattr(getattr(m, "_gradient_checkpointing_func", None), "keywords", None) or {}
            reentrant = keywords.get("use_reentrant", True)
        elif getattr(m, "grad_checkpointing", False) is True:  # timm, open_clip
            family = type(m).__module__.split(".")[0]
            if family == "timm" and "timm.layers" in sys.modules:
                reentrant = sys.modules["timm.layers"].use_reentrant_ckpt()
            else:
                reentrant = family != "open_clip"
        else:
            continue
        if reentrant:
            output.requires_grad_(True)
            return


def _adapter_params(wrapper: PreProjAttention) -> list[nn.Parameter]:
    return [p for m in (wrapper.preproj, wrapper.skip) if m is not None for p in m.parameters()]


def _apply(model: nn.Module, plan: _Plan) -> nn.Module:
    attr = plan.spec.attention
    done = []
    try:
        for block, wrapper in plan.placements:
            setattr(block, attr, wrapper)
            done.append((block, wrapper))
        model.mmpreproj_state = plan.state
        if plan.state.config.freeze_base:
            _freeze_base(model, plan.state, plan.spec)
    except BaseException:
        for block, wrapper in done:
            setattr(block, attr, wrapper.base_layer)
        for p in plan.state.frozen:
            p.requires_grad_(True)
        if hasattr(model, "mmpreproj_state"):
            del model.mmpreproj_state
        raise
    return model


def inject(model: nn.Module, config: PreProjConfig | None = None, *, host: str | None = None) -> nn.Module:
    """Add the pre-projection and/or content skip to every selected attention block of `model`, in place.

    Args:
        model: a supported host (see `mmpreproj.hosts.HOSTS`).
        config: what to inject (default `PreProjConfig()`: pre-projection + skip, paper init, base frozen).
        host: force a table row by name instead of detecting it.

    Returns the same model object. Injected weights are float32 on the device of their block.
    """
    return _apply(model, _plan(model, config or PreProjConfig(), host))


def unload(model: nn.Module) -> nn.Module:
    """Remove every injected module, restoring the original attention modules and `requires_grad` flags."""
    if not is_injected(model):
        raise RuntimeError("this model has no mmpreproj modules to unload")
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, PreProjAttention):
                setattr(parent, name, child.base_layer)
    state: InjectionState | None = getattr(model, "mmpreproj_state", None)
    if state is not None:
        for p in state.frozen:
            p.requires_grad_(True)
        if state.input_grad_hook is not None:
            state.input_grad_hook.remove()
        del model.mmpreproj_state
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


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Only the injected weights, keyed `blocks.{i}.preproj.up.weight` etc. by host block index.

    Weights sharded by FSDP2 (DTensors) are gathered into full tensors: a collective, so on a sharded
    model every rank must call this.
    """
    out = {}
    for w in injected_modules(model):
        for part in ("preproj", "skip"):
            module = getattr(w, part)
            if module is not None:
                for k, v in module.state_dict().items():
                    full = v.full_tensor() if hasattr(v, "full_tensor") else v  # FSDP2 DTensor -> full tensor
                    out[f"blocks.{w.block_index}.{part}.{k}"] = full
    return out


def save_adapter(
    model: nn.Module, path: str | Path, *, state_dict: dict[str, torch.Tensor] | None = None
) -> Path:
    """Write only the injected weights (`adapter_model.safetensors`) and `adapter_config.json` to `path`.

    `state_dict` is what to write (default `adapter_state_dict(model)`): pass the one every rank gathered
    from a sharded model when only one rank writes. Each file is written to a temporary name and renamed,
    so a crash never leaves a torn file.
    """
    state: InjectionState | None = getattr(model, "mmpreproj_state", None)
    if state is None:
        raise RuntimeError("save_adapter: this model has no mmpreproj modules (call mmpreproj.inject first)")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if state_dict is None:
        state_dict = adapter_state_dict(model)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
    meta = {"format": "pt", "mmpreproj_version": __version__}
    atomic_write(path / ADAPTER_WEIGHTS_NAME, lambda f: save_file(tensors, f, metadata=meta))
    text = json.dumps(state.describe(), indent=2, sort_keys=True) + "\n"
    atomic_write(path / ADAPTER_CONFIG_NAME, lambda f: Path(f).write_text(text))
    return path


def read_adapter(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """Read and parse an adapter folder: (description, tensors). Clear errors for missing/corrupt files."""
    path = Path(path)
    cfg_file, weights_file = path / ADAPTER_CONFIG_NAME, path / ADAPTER_WEIGHTS_NAME
    for f in (cfg_file, weights_file):
        if not f.is_file():
            raise FileNotFoundError(f"adapter file missing: {f}")
    try:
        desc = json.loads(cfg_file.read_text())
        if not isinstance(desc, dict) or "config" not in desc:
            raise ValueError("no 'config' key")
    except (json.JSONDecodeError, ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"corrupt adapter config {cfg_file}: {e}") from None
    try:
        tensors = load_file(str(weights_file))
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"corrupt adapter weights {weights_file}: {e}") from None
    return desc, tensors


def load_adapter(model: nn.Module, path: str | Path, *, freeze_base: bool | None = None) -> nn.Module:
    """Inject the modules described in `path` into `model` and load their weights.

    Raises (leaving `model` untouched) on a missing or corrupt file, a different host architecture,
    hidden size or block count, or weights that do not match the config.
    """
    desc, tensors = read_adapter(path)
    config = PreProjConfig.from_dict(desc["config"])
    if freeze_base is not None:
        config.freeze_base = freeze_base
    spec = find_host(model)
    if desc.get("host") != spec.name:
        raise ValueError(f"adapter at {path} was saved for host {desc.get('host')!r}, this model is {spec.name!r}")
    with torch.random.fork_rng(devices=[]):  # building the modules must not move the caller's RNG
        plan = _plan(model, config, spec.name)
    for field_name, saved in (("num_blocks", desc.get("num_blocks")), ("hidden_size", desc.get("hidden_size"))):
        have = getattr(plan.state, field_name)
        if saved != have:
            raise ValueError(f"adapter at {path} has {field_name}={saved}, this model has {field_name}={have}")
    expected = {}
    for _, w in plan.placements:
        for part in ("preproj", "skip"):
            module = getattr(w, part)
            if module is not None:
                for k, v in module.state_dict().items():
                    expected[f"blocks.{w.block_index}.{part}.{k}"] = v
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(f"adapter at {path} does not match its config: missing {missing[:4]}, unexpected {unexpected[:4]}")
    for k, dst in expected.items():
        if tensors[k].shape != dst.shape:
            raise ValueError(f"adapter at {path}: {k} has shape {tuple(tensors[k].shape)}, expected {tuple(dst.shape)}")
    with torch.no_grad():
        for k, dst in expected.items():
            dst.copy_(tensors[k])
    return _apply(model, plan)
