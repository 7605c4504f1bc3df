"""A digest of an adapter's weights in its `adapter_config.json`, so a save cut short is refused on load.

peft's `PeftModel.save_pretrained` (which a plain `transformers.Trainer` calls for every checkpoint) writes
`adapter_model.safetensors` first and `adapter_config.json` second, each in place: a kill between the two
leaves the new weights beside the previous save's config, and a kill inside the first leaves a torn file.
Every writer puts `injection["weights_digest"]` into the config: the tuner (of the weights it hands peft to
write, in the config peft writes last) and `mmpreproj.save_adapter`. `PreProjConfig.from_pretrained` (what
`PeftModel.from_pretrained`, `PeftModel.load_adapter` of a new name and `AutoPeftModel*` call) and
`mmpreproj.load_adapter` compare it with the weights beside it. A mismatch is refused with the file named;
nothing is loaded. Not covered: `PeftModel.load_adapter` into a name already loaded (the Trainer's resume and
best-model load) reads the weights without the config, and transformers' `model.load_adapter` builds the
config with peft's generic `PeftConfig.from_pretrained`, which hands our hooks no folder: neither has a
digest to compare against (`docs/peft-guide.md`: what each loader checks).

The digest covers each tensor's key name, dtype, shape and bytes: two same-shaped tensors swapped between
keys give another digest. Names are taken without peft's `base_model.model.` prefix, so a file written
through a `PeftModel` and one written from the bare injected model agree.
Folders written before names were covered carry a `blake2b:` digest of values only, still checked as such;
folders with no digest at all (mmpreproj <= 0.3's `save_adapter`) load, and the reason is logged once.

    digest = weights_digest(tensors)               # "blake2b-named:<32 hex>"
    check_weights_digest(digest, load_file(f), f)  # ValueError when they differ
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping
from pathlib import Path

import torch

from .file_check import PEFT_PREFIX

logger = logging.getLogger(__name__)

DIGEST_KEY = "weights_digest"  # its key in the `injection` record
_NAMED = "blake2b-named:"  # names, dtypes, shapes and values (every writer since names were covered)
_VALUES = "blake2b:"  # dtypes, shapes and values only (folders written before)
_FORM = re.compile(r"(blake2b|blake2b-named):[0-9a-f]{32}")
_said_no_digest = False  # a folder without a digest is reported once per process


def _tensor_hash(t: torch.Tensor, name: str | None = None) -> bytes:
    t = t.detach().to("cpu").contiguous()
    h = hashlib.blake2b(digest_size=16)
    if name is not None:
        h.update(f"{len(name)}:{name}|".encode())
    h.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # the raw bytes, any dtype (bf16 too)
    return h.digest()


def _combine(parts: list[bytes]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in sorted(parts):
        h.update(part)
    return h.hexdigest()


def weights_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """ "blake2b-named:<hex>" of the tensors' key names (less peft's `base_model.model.`), dtypes, shapes and
    values, independent of their order."""
    return _NAMED + _combine([_tensor_hash(t, k.removeprefix(PEFT_PREFIX)) for k, t in tensors.items()])


def values_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """The older "blake2b:<hex>", of values, dtypes and shapes only (what folders written before carry)."""
    return _VALUES + _combine([_tensor_hash(t) for t in tensors.values()])


def check_weights_digest(digest: object, tensors: Mapping[str, torch.Tensor], weights_file: str | Path) -> None:
    """ValueError when `digest` (the config's `injection.weights_digest`) does not match `tensors` (read from
    `weights_file`, keyed as in the file). None (a folder written before every writer recorded one) passes,
    and is reported once."""
    global _said_no_digest
    weights_file = Path(weights_file)
    config_file = weights_file.with_name("adapter_config.json")
    if digest is None:
        if not _said_no_digest:
            _said_no_digest = True
            logger.warning(
                "%s records no injection.%s (written before every writer recorded one): a save cut "
                "short cannot be told from a whole one there; save the adapter again to add it "
                "(said once)",
                config_file,
                DIGEST_KEY,
            )
        return
    if not (isinstance(digest, str) and _FORM.fullmatch(digest)):
        raise ValueError(
            f"corrupt adapter config {config_file}: injection.{DIGEST_KEY}={digest!r:.80}; "
            "expected 'blake2b-named:' (or 'blake2b:') and 32 hex digits (written by the tuner)"
        )
    have = weights_digest(tensors) if digest.startswith(_NAMED) else values_digest(tensors)
    if have != digest:
        raise ValueError(
            f"{weights_file} does not hold the weights {config_file} was saved with (its injection.{DIGEST_KEY} "
            "differs: a tensor's name, shape, dtype or values): the weights were replaced but the config was "
            "not, as when a save_pretrained is cut short between its two files; nothing was loaded. Load an "
            "earlier complete checkpoint, or save again"
        )
