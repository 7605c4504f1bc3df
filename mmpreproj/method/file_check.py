"""What a PREPROJ folder's files must hold, checked from the files alone (no model), and the digest of its
weights.

The weights file: the tensors its `adapter_config.json` says were saved, each of the shape the config's sizes give
at the recorded width, floating point and finite; nothing else but the heads peft keeps for a classification task
(`PEFT_HEAD_TASKS`), floating point and, since their shapes are recorded (`injection.head_shapes`), each as
recorded. `PreProjConfig.from_pretrained` runs it before peft injects anything, so `PeftModel.from_pretrained`
and `AutoPeftModel*` refuse a bad folder with the base untouched.

    check_file_tensors(config, tensors, weights_file)   # ValueError naming the file and the tensor
    refuse_links(folder, names, where)                  # before a writer that writes in place follows one

The digest, so a save cut short is refused on load. peft's `PeftModel.save_pretrained` (which a plain
`transformers.Trainer` calls for every checkpoint) writes `adapter_model.safetensors` first and
`adapter_config.json` second, each in place: a kill between the two leaves the new weights beside the previous
save's config, and a kill inside the first leaves a torn file. Every writer puts `injection["weights_digest"]`
into the config: the tuner (of the weights it hands peft to write, in the config peft writes last) and
`mmpreproj.save_adapter`. `PreProjConfig.from_pretrained` (what `PeftModel.from_pretrained`,
`PeftModel.load_adapter` of a new name and `AutoPeftModel*` call) and `mmpreproj.load_adapter` compare it with the
weights beside it; transformers' `model.load_adapter` is checked before it injects (`load_check.py`). A mismatch is
refused with the file named; nothing is loaded. Not covered: `PeftModel.load_adapter` into a name already loaded
(the Trainer's resume and best-model load) reads the weights without the config (`docs/peft-guide.md`: what each
loader checks).

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
import os
import re
from collections.abc import Mapping
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import torch

from ..modules.preproj import PreProjection
from ..modules.skip import ContentSkip

# what transformers' `save_pretrained` writes into a model folder (config and generation config in place)
BASE_FILES = ("config.json", "generation_config.json", "model*.safetensors", "model.safetensors.index.json", "*.bin")

PEFT_PREFIX = "base_model.model."  # what peft puts before a module path in its files (the one definition)
ADAPTER_TYPE = "mmpreproj"  # the `adapter_type` tag of the descriptions (files: peft_type "PREPROJ", method/files.py)

# peft's task classes that wrap the head modules named in `modules_to_save` in their own `ModulesToSaveWrapper`
# after the tuner is built (`PeftModelForSequenceClassification` adds "classifier" and "score", ...): under them
# those modules are peft's, saved and loaded by peft beside the tuner's weights, as with LoRA
PEFT_HEAD_TASKS = ("SEQ_CLS", "TOKEN_CLS", "QUESTION_ANS")


def peft_head_names(config: Any) -> list[str]:
    """The `modules_to_save` names peft's task class wraps itself under `config`'s task type (`PEFT_HEAD_TASKS`),
    else none."""
    if getattr(config, "task_type", None) not in PEFT_HEAD_TASKS or not config.modules_to_save:
        return []
    return list(config.modules_to_save)


def peft_head_keys(config: Any, keys: Any) -> set[str]:
    """The file keys among `keys` that peft wrote for the head modules it wraps (`peft_head_names`): a key whose
    module path has a component so named that the injection record does not hold as its own."""
    names = peft_head_names(config)
    if not names:
        return set()
    owned = (config.injection or {}).get("modules_to_save") or {}
    heads = [n for n in names if isinstance(n, str) and n not in owned]
    return {k for k in keys if any(f".{n}." in f".{k.removeprefix(PEFT_PREFIX)}" for n in heads)}


def expected_slot_shapes(config: Any, dim: int) -> dict[str, tuple[int, ...]]:
    """{"preproj.up.weight": shape, ...}: the slot weights (each under its slot's name,
    `PreProjAttention.adapter_layer_names`) `config` gives at width `dim`, built on the meta
    device (nothing allocated); the sizes are checked first (`PreProjConfig.check_sizes`)."""
    config.check_sizes(dim)
    meta = torch.device("meta")
    slots = {}
    if config.preproj:
        slots["preproj"] = PreProjection(dim, config.expansion, config.activation, "paper", device=meta)
    if config.skip:
        slots["preproj_skip"] = ContentSkip(dim, 0.0, rank=config.skip_rank, device=meta)
    return {f"{slot}.{k}": tuple(v.shape) for slot, m in slots.items() for k, v in m.state_dict().items()}


def record_sites(record: dict, where: str) -> list[str]:
    """The injection record's `modules`; ValueError naming `where` unless its `layers` and `modules` are aligned
    lists of block indices and paths (strings from the file: nothing is resolved against a model here)."""
    layers, modules = record.get("layers"), record.get("modules")
    if not (
        isinstance(layers, list)
        and isinstance(modules, list)
        and len(layers) == len(modules)
        and all(type(i) is int for i in layers)
        and all(isinstance(m, str) for m in modules)
    ):
        raise ValueError(
            f"{where}: 'injection' needs 'layers' (block indices) and 'modules' (their paths), aligned lists "
            f"(written by the tuner); got layers={layers!r:.60}, modules={modules!r:.60}"
        )
    return modules


def check_file_tensors(config: Any, tensors: dict[str, torch.Tensor], weights_file: str | Path) -> None:
    """ValueError unless `tensors` (read from `weights_file`, peft keys) are exactly the weights `config`
    (a `PreProjConfig` with its `injection` record) describes: every injected block's slot weights at its
    width, floating point and finite, plus the `modules_to_save` modules' finite tensors."""
    where = f"adapter weights {weights_file}"
    record = config.injection or {}
    _check_tags(config, record, where)
    modules, widths = record_sites(record, where), record.get("hidden_size")
    if type(widths) is int:
        widths = [widths] * len(modules)
    if not (
        isinstance(widths, list) and len(widths) == len(modules) and all(type(w) is int and w > 0 for w in widths)
    ):
        raise ValueError(
            f"{where}: its config's injection.hidden_size={record.get('hidden_size')!r:.60} is neither "
            "a width > 0 nor one per injected block"
        )
    expected: dict[str, tuple[int, ...]] = {}
    for path, dim in zip(modules, widths):
        for key, shape in expected_slot_shapes(config, dim).items():
            expected[f"{path}.{key}"] = shape
    saved = record.get("modules_to_save") or {}
    saved_paths = [p for p in saved.values() if isinstance(p, str)] if isinstance(saved, dict) else []
    peft_heads = peft_head_keys(config, tensors)  # peft's own: floating point, as `head_shapes` records them
    head_shapes = _head_shapes(record, where)
    for key, value in tensors.items():
        bare = key.removeprefix(PEFT_PREFIX)
        if key in peft_heads:
            if not value.is_floating_point():
                raise ValueError(
                    f"{where}: tensor {key} has dtype {value.dtype}; the head peft saves for task_type "
                    f"{config.task_type} is floating point"
                )
            if head_shapes is not None and bare in head_shapes and list(value.shape) != head_shapes[bare]:
                raise ValueError(
                    f"{where}: head tensor {key} has shape {tuple(value.shape)}, but its config's "
                    f"injection.head_shapes records {tuple(head_shapes[bare])}"
                )
        elif bare in expected:
            if not value.is_floating_point():
                raise ValueError(f"{where}: tensor {key} has dtype {value.dtype}; injected weights are floating point")
            if tuple(value.shape) != expected[bare]:
                raise ValueError(
                    f"{where}: tensor {key} has shape {tuple(value.shape)}, but its config "
                    f"(expansion={config.expansion}, skip_rank={config.skip_rank}) gives {expected[bare]}"
                )
        elif not any(bare.startswith(f"{p}.") for p in saved_paths):
            raise ValueError(f"{where}: tensor {key} belongs to no injected block nor saved module its config names")
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            bad = int((~torch.isfinite(value)).sum())
            raise ValueError(f"{where}: tensor {key} holds {bad} non-finite value(s) (nan/inf) of {value.numel()}")
    missing = sorted(set(expected) - {k.removeprefix(PEFT_PREFIX) for k in tensors})
    if missing:
        raise ValueError(f"{where}: missing {len(missing)} tensor(s) its config describes, e.g. {missing[:3]}")
    recorded = _shape_table(record, "tensor_shapes", where)
    if getattr(config, "format_version", 0) >= 3 and recorded is not None:  # today's keys: every tensor recorded
        _check_recorded_shapes(tensors, peft_heads, recorded, where)
    if head_shapes is not None:
        have = {k.removeprefix(PEFT_PREFIX) for k in peft_heads}
        lacking, extra = sorted(set(head_shapes) - have), sorted(have - set(head_shapes))
        if lacking or extra:
            raise ValueError(
                f"{where}: the head tensors peft saves for task_type {config.task_type} are not the ones its config's "
                f"injection.head_shapes records: missing {lacking[:3]}, unexpected {extra[:3]}"
            )


def _check_tags(config: Any, record: dict, where: str) -> None:
    """The record's `adapter_type` and `method` tags (where written) are this method's and its config's."""
    if record.get("adapter_type", ADAPTER_TYPE) != ADAPTER_TYPE:
        raise ValueError(
            f"{where}: its config's injection.adapter_type={record['adapter_type']!r:.60}; a PREPROJ adapter's is "
            f"{ADAPTER_TYPE!r}"
        )
    method = record.get("method")
    if method is not None and method != config.method:
        raise ValueError(
            f"{where}: its config's injection.method={method!r:.60}, but its preproj={config.preproj} and "
            f"skip={config.skip} make it {config.method!r}"
        )


def _check_recorded_shapes(
    tensors: dict[str, torch.Tensor], heads: set[str], shapes: dict[str, list[int]], where: str
) -> None:
    """Ours (every tensor but peft's heads) are the ones `injection.tensor_shapes` records, each of its recorded
    shape and floating point: a `modules_to_save` tensor edited, dropped or added is refused here, before any loader
    injects (the record itself is checked against the model in `load_check.py`)."""
    have = {k.removeprefix(PEFT_PREFIX): v for k, v in tensors.items() if k not in heads}
    lacking, extra = sorted(set(shapes) - set(have)), sorted(set(have) - set(shapes))
    if lacking or extra:
        raise ValueError(
            f"{where}: its tensors are not the ones its config's injection.tensor_shapes records: missing "
            f"{lacking[:3]}, unexpected {extra[:3]}"
        )
    for key, value in have.items():
        if not value.is_floating_point():
            raise ValueError(f"{where}: tensor {key} has dtype {value.dtype}; saved weights are floating point")
        if list(value.shape) != shapes[key]:
            raise ValueError(
                f"{where}: tensor {key} has shape {tuple(value.shape)}, but its config's injection.tensor_shapes "
                f"records {tuple(shapes[key])}"
            )


HEAD_SHAPES_KEY = "head_shapes"  # in `injection`: {file key less PEFT_PREFIX: shape} of the heads peft saves


def _head_shapes(record: dict, where: str) -> dict[str, list[int]] | None:
    """The record's `head_shapes` (None in a file written before it), refused unless key -> list of sizes."""
    return _shape_table(record, HEAD_SHAPES_KEY, where)


def _shape_table(record: dict, field: str, where: str) -> dict[str, list[int]] | None:
    """The record's `field` (`tensor_shapes`, `head_shapes`): None when absent, else refused unless key -> shape."""
    shapes = record.get(field)
    if shapes is None:
        return None
    if not (
        isinstance(shapes, dict)
        and all(isinstance(v, list) and all(type(n) is int and n >= 0 for n in v) for v in shapes.values())
    ):
        raise ValueError(f"{where}: its config's injection.{field}={shapes!r:.60} is not key -> shape")
    return shapes


def refuse_links(folder: str | Path, names: tuple[str, ...], where: str) -> None:
    """ValueError naming the first entry of `folder` matching one of `names` (names or glob patterns) that is a
    symlink, before anything is written: a writer that writes in place (transformers' `config.json`) would write
    through it, to wherever it points, out of the folder too."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    for path in sorted(folder.iterdir()):  # a dangling link too (a glob skips it)
        if path.is_symlink() and any(fnmatch(path.name, pattern) for pattern in names):
            raise ValueError(
                f"{where}: {path} is a symlink (to {os.readlink(path)}); a writer would write through it, "
                "out of the folder; remove the link (or save to another folder); nothing was written"
            )


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
