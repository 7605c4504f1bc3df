"""Loading the host model and tokenizer (hub id or local folder), and switching on activation checkpointing."""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..data.model_source import check_local_model, convert_packaged, corrupt_weights_error, pretrained_source
from ..data.onnx_source import is_onnx_name
from .errors import ModelUnavailableError

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def unavailable_error(what: str, name: str, err: Exception) -> ModelUnavailableError:
    """The one-line error for a model, tokenizer or processor that cannot be loaded (offline, wrong path)."""
    why = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    return ModelUnavailableError(
        f"cannot load {what} {name!r} (no network, or not a local folder?): {why}; pass a local path with --model PATH"
    )


def load_tokenizer(name: str) -> Any:
    """`AutoTokenizer.from_pretrained(name)` with pad = eos when it has no pad token (as the paper)."""
    check_local_model(name)
    try:
        source, kwargs = pretrained_source(name)
        tok = AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as err:
        raise unavailable_error("tokenizer", name, err) from None
    if tok.pad_token is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token
    return tok


def convert_model_files(name: str) -> None:
    """`convert_packaged(name)` (a packaged GGUF / ONNX model into its cached folder), failing as `load_model`
    would: `train` calls it before seeding."""
    try:
        convert_packaged(name)
    except (OSError, ValueError) as err:
        raise unavailable_error("model", name, err) from None


def load_model(name: str, dtype: str = "float32") -> nn.Module:
    """`AutoModelForCausalLM.from_pretrained(name)` in `dtype` ("float32" or "bfloat16"), on CPU."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r}; allowed values: {sorted(_DTYPES)}")
    check_local_model(name)
    if is_onnx_name(name):
        raise ModelUnavailableError(
            f"{name!r} is an image backbone (transformers Dinov2Model), not a causal LM: train it with "
            f"recipes/vision/dinov2_probe.py, or load it with mmpreproj.from_pretrained({name!r}, adapter=False, "
            "model_cls=transformers.Dinov2Model)"
        )
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


def load_model_and_tokenizer(config: Any) -> tuple[nn.Module, Any]:
    """The model (in `config.model_dtype`, on `config.device`, eval mode) and tokenizer named by a `TrainConfig`."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    model = load_model(config.model, config.model_dtype).to(resolve_device(config.device, local_rank))
    return model.eval(), load_tokenizer(config.model)


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """ "auto" -> cuda:LOCAL_RANK when CUDA is available, else cpu; anything else is used as given."""
    if device == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    return torch.device(device)


def check_device_present(device: str) -> None:
    """ValueError naming `TrainConfig.device` when this machine has no device of its type (before anything loads;
    torch would say so only once the model moves there)."""
    kind = torch.device("cpu" if device == "auto" else device).type
    present = {"cuda": torch.cuda.is_available, "mps": torch.backends.mps.is_available}
    if kind in present and not present[kind]():
        raise ValueError(
            f"TrainConfig.device={device!r}: this machine has no {kind} device; allowed here: 'auto', 'cpu'"
        )


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
    if hasattr(host, "enable_input_require_grads"):
        # exactly one hook of transformers', for either variant (5.x adds one itself for text models; the public
        # pair keeps it single): a LoRA run has no mmpreproj hook, and the methods then pay the same backward
        host.disable_input_require_grads()
        host.enable_input_require_grads()
