"""Loading the host model and tokenizer (hub id or local folder), and switching on activation checkpointing."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .errors import ModelUnavailableError
from .sources import resolve_path

__all__ = [
    "check_local_model",
    "corrupt_weights_error",
    "enable_checkpointing",
    "load_model",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "pretrained_source",
    "resolve_device",
    "unavailable_error",
]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def check_local_model(name: str, what: str = "model folder") -> None:
    """FileNotFoundError when `name` is written as a local path (it starts with `/`, `.` or `~`, or has more
    than one `/`, which no hub id `org/name` has) and no such file or folder exists: said at once, instead of
    a hub lookup of a name that cannot be a hub id."""
    if not name.strip():
        raise FileNotFoundError(f"{what}: empty name; pass a hub id or a local folder")
    looks_local = name.startswith(("/", ".", "~")) or name.count("/") > 1 or name.endswith("/") or "\\" in name
    if looks_local and resolve_path(name) is None:
        raise FileNotFoundError(f"{what} not found: {name} (no such file or folder; a hub id looks like org/name)")


def pretrained_source(name: str) -> tuple[str, dict[str, Any]]:
    """(what to pass to from_pretrained, extra kwargs): a local folder as is; a hub id with
    `local_files_only=True` when the Hub cannot be reached, so an offline run fails (or uses the cache) at
    once instead of retrying the network. A name written as a local path that does not exist fails at once
    (`check_local_model`)."""
    check_local_model(name)
    local = resolve_path(name)
    if local is not None:
        return str(local), {}
    from ..data.hub import hub_offline, hub_reachable

    if not (hub_offline() or not hub_reachable()):
        return name, {}
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(try_to_load_from_cache(name, "config.json"), str):
        raise FileNotFoundError(f"the Hub cannot be reached and {name!r} is neither cached nor a local folder")
    return name, {"local_files_only": True}


def unavailable_error(what: str, name: str, err: Exception) -> ModelUnavailableError:
    """The one-line error for a model, tokenizer or processor that cannot be loaded (offline, wrong path)."""
    why = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    return ModelUnavailableError(
        f"cannot load {what} {name!r} (no network, or not a local folder?): {why}; pass a local path with --model PATH"
    )


def load_tokenizer(name: str) -> Any:
    """`AutoTokenizer.from_pretrained(name)` with pad = eos when it has no pad token (as the paper)."""
    from transformers import AutoTokenizer

    check_local_model(name)
    try:
        source, kwargs = pretrained_source(name)
        tok = AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as err:
        raise unavailable_error("tokenizer", name, err) from None
    if tok.pad_token is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(name: str, dtype: str = "float32") -> nn.Module:
    """`AutoModelForCausalLM.from_pretrained(name)` in `dtype` ("float32" or "bfloat16"), on CPU."""
    from transformers import AutoModelForCausalLM

    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r}; allowed values: {sorted(_DTYPES)}")
    check_local_model(name)
    source, kwargs = None, {}
    try:
        source, kwargs = pretrained_source(name)
        return AutoModelForCausalLM.from_pretrained(source, dtype=_DTYPES[dtype], **kwargs)
    except Exception as err:
        broken = corrupt_weights_error(source, err) if source is not None else None
        if broken is not None:
            raise broken from None
        if isinstance(err, (OSError, ValueError)):
            raise unavailable_error("model", name, err) from None
        raise


_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def corrupt_weights_error(source: str, err: Exception) -> ValueError | None:
    """When loading `source` failed with `err`, the one-line error naming the weights file that cannot be read
    (truncated by an interrupted download or copy, or not a weights file at all), or None when every weights
    file of it reads. Read: a local folder's `model*.safetensors` (their headers) and `pytorch_model*.bin`
    (memory-mapped), or a hub id's cached `model.safetensors` / `pytorch_model.bin`."""
    folder = Path(source)
    if folder.is_dir():
        files = sorted(folder.glob("model*.safetensors")) + sorted(folder.glob("pytorch_model*.bin"))
    else:
        from huggingface_hub import try_to_load_from_cache

        try:
            found = [try_to_load_from_cache(source, f) for f in _WEIGHT_FILES]
        except Exception:  # not a valid repo id: nothing cached to look at
            return None
        files = [Path(f) for f in found if isinstance(f, str)]
    for f in files:
        why = _unreadable(f)
        if why is not None:
            return ValueError(
                f"corrupt model weights {f}: {why} (truncated or not a weights file? download or save it again); "
                f"loading failed with {type(err).__name__}"
            )
    return None


def _unreadable(path: Path) -> str | None:
    """Why the weights file `path` cannot be read (its header, and for a zip its directory), or None."""
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), "pt"):
                pass
        else:
            try:
                torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:  # an old non-zip .bin cannot be mapped: read it whole
                if "mmap" not in str(e):
                    raise
                torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors' SafetensorError, torch's RuntimeError/UnpicklingError, OSError
        return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    return None


def load_model_and_tokenizer(config: Any) -> tuple[nn.Module, Any]:
    """The model (in `config.model_dtype`, on `config.device`, eval mode) and tokenizer named by a `TrainConfig`."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    model = load_model(config.model, config.model_dtype).to(resolve_device(config.device, local_rank))
    return model.eval(), load_tokenizer(config.model)


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """"auto" -> cuda:LOCAL_RANK when CUDA is available, else cpu; anything else is used as given."""
    if device == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    return torch.device(device)


def enable_checkpointing(model: nn.Module, reentrant: bool = False) -> None:
    """Switch on activation checkpointing of the host (`transformers` models, or a peft model around one).

    With the whole base frozen, reentrant checkpointing would give the injected weights no gradient unless
    the block inputs require grad; `mmpreproj.inject` registers an input-embedding hook that ensures this.
    """
    host = model.get_base_model() if hasattr(model, "get_base_model") else model
    kwargs = {"use_reentrant": reentrant}
    if hasattr(host, "activation_checkpointing_enable"):  # transformers >= 5.x
        host.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(host, "gradient_checkpointing_enable"):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            host.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ValueError(f"{type(host).__name__} does not support activation checkpointing")
    if reentrant and not hasattr(host, "_require_grads_hook") and hasattr(host, "enable_input_require_grads"):
        host.enable_input_require_grads()  # LoRA-only runs have no mmpreproj hook; older transformers skip this
    if not reentrant and hasattr(host, "disable_input_require_grads"):
        host.disable_input_require_grads()  # transformers 5 adds it always; non-reentrant needs none (2.7%/step)
