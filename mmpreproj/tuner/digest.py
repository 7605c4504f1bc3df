"""A digest of an adapter's weights in its `adapter_config.json`, so a save cut short is refused on load.

peft's `PeftModel.save_pretrained` (which a plain `transformers.Trainer` calls for every checkpoint) writes
`adapter_model.safetensors` first and `adapter_config.json` second, each in place: a kill between the two
leaves the new weights beside the previous save's config, and a kill inside the first leaves a torn file.
The tuner puts `injection["weights_digest"]` (of the weights it hands peft to write) into the config peft
writes last; `PreProjConfig.from_pretrained` (what `PeftModel.from_pretrained`, `PeftModel.load_adapter`
of a new name and `AutoPeftModel*` call) and `mmpreproj.load_adapter` compare it with the weights beside it.
A mismatch is refused with the file named; nothing is loaded. Not covered: `PeftModel.load_adapter` into a
name already loaded (the Trainer's resume and best-model load) reads the weights without the config, so there
is nothing to compare against; the Trainer writes each checkpoint into a new `checkpoint-N` folder.

The digest is of values, dtypes and shapes only, not of key names (peft renames keys on the way to the file),
so the same weights under either key convention give the same digest.

    digest = weights_digest(tensors)               # "blake2b:<32 hex>"
    check_weights_digest(digest, load_file(f), f)  # ValueError when they differ
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path

import torch

__all__ = ["DIGEST_KEY", "check_weights_digest", "weights_digest"]

DIGEST_KEY = "weights_digest"  # its key in the `injection` record
_FORM = re.compile(r"blake2b:[0-9a-f]{32}")


def _tensor_hash(t: torch.Tensor) -> bytes:
    t = t.detach().to("cpu").contiguous()
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # the raw bytes, any dtype (bf16 too)
    return h.digest()


def weights_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """"blake2b:<hex>" of the tensors' values, dtypes and shapes, independent of their names and order."""
    h = hashlib.blake2b(digest_size=16)
    for part in sorted(_tensor_hash(t) for t in tensors.values()):
        h.update(part)
    return f"blake2b:{h.hexdigest()}"


def check_weights_digest(digest: object, tensors: Mapping[str, torch.Tensor], weights_file: str | Path) -> None:
    """ValueError when `digest` (the config's `injection.weights_digest`; None = not recorded, e.g. written by
    `mmpreproj.save_adapter`, whose two files are replaced together) does not match `tensors` (read from
    `weights_file`)."""
    if digest is None:
        return
    weights_file = Path(weights_file)
    config_file = weights_file.with_name("adapter_config.json")
    if not (isinstance(digest, str) and _FORM.fullmatch(digest)):
        raise ValueError(f"corrupt adapter config {config_file}: injection.{DIGEST_KEY}={digest!r:.80}; "
                         "expected 'blake2b:' and 32 hex digits (written by the tuner)")
    if weights_digest(tensors) != digest:
        raise ValueError(
            f"{weights_file} does not hold the weights {config_file} was saved with (its injection.{DIGEST_KEY} "
            "differs): the weights were replaced but the config was not, as when a save_pretrained is cut short "
            "between its two files; nothing was loaded. Load an earlier complete checkpoint, or save again"
        )
