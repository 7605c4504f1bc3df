"""`last_whole_checkpoint`: the newest whole `transformers.Trainer` checkpoint of a PREPROJ run, for
`trainer.train(resume_from_checkpoint=...)`, skipping a torn one (a kill or a full disk mid-save) and saying so.

    ckpt = mmpreproj.last_whole_checkpoint("runs/x")              # None when there is none yet
    trainer.train(resume_from_checkpoint=ckpt)                     # str path, or None = from the start

transformers' own `resume_from_checkpoint=True` takes the highest `checkpoint-N` whatever it holds, and stops
on a torn one; the user then has to find and delete it by hand. Here a checkpoint is whole when its
`trainer_state.json` is a JSON object and its adapter pair reads back (`PreProjConfig.from_pretrained`: the
digest matches the weights, every tensor the config describes is there with its shape). A whole checkpoint
whose weights are non-finite, or one of another method (another `peft_type`, or, with `config=`, another
`method` or sizes) is refused, not skipped: resuming from an older one silently would throw training away.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from .config import PreProjConfig
from .file_check import DIGEST_KEY, check_weights_digest

logger = logging.getLogger(__name__)

_CHECKPOINT = re.compile(r"checkpoint-(\d+)")
_SIZES = ("preproj", "skip", "expansion", "skip_rank", "layers", "parts", "modules_to_save")


def last_whole_checkpoint(output_dir: str | Path, config: PreProjConfig | None = None) -> str | None:
    """The path of the newest `output_dir/checkpoint-N` that is whole, or None when there is none.

    Torn checkpoints (a file missing or unreadable, weights that are not the ones the config was saved with)
    are skipped, each with a warning naming it and why. ValueError for a whole checkpoint that cannot be
    resumed: non-finite weights, another method (`peft_type` not PREPROJ), or, given `config` (the one the
    run trains with), other `method`/sizes than `config`'s."""
    if config is not None and not isinstance(config, PreProjConfig):
        raise TypeError(f"last_whole_checkpoint(config=...): a PreProjConfig or None, got {type(config).__name__}")
    root = Path(output_dir)
    if not root.is_dir():
        return None
    found = sorted(
        ((int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _CHECKPOINT.fullmatch(p.name))),
        reverse=True,
    )
    for _, ckpt in found:
        reason = _torn(ckpt, config)
        if reason is None:
            return str(ckpt)
        logger.warning("last_whole_checkpoint: skipping %s, it is torn (%s)", ckpt, reason)
    return None


def _json_object(path: Path) -> tuple[dict | None, str | None]:
    """(the JSON object in `path`, None) or (None, why it cannot be read as one)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        return None, f"{path.name}: {type(e).__name__}"
    if not isinstance(raw, dict):
        return None, f"{path.name} is not an object"
    return raw, None


def _torn(ckpt: Path, want: PreProjConfig | None) -> str | None:
    """Why `ckpt` is torn (None when whole); raises for a whole one that cannot be resumed."""
    for name in ("trainer_state.json", "adapter_config.json"):  # `raw` is then the adapter config, read last
        raw, why = _json_object(ckpt / name)
        if why is not None:
            return why
    if raw.get("peft_type") != "PREPROJ":
        raise ValueError(
            f"last_whole_checkpoint: {ckpt} holds a {raw.get('peft_type')!r} adapter, not PREPROJ; "
            "resume it with the method that wrote it, or pass another output_dir"
        )
    if not (ckpt / "adapter_model.safetensors").is_file():
        return "adapter_model.safetensors missing"
    try:
        tensors = load_file(str(ckpt / "adapter_model.safetensors"))
        check_weights_digest((raw.get("injection") or {}).get(DIGEST_KEY), tensors, ckpt / "adapter_model.safetensors")
    except (ValueError, OSError, SafetensorError) as e:  # unreadable, or not the weights the config was saved with
        return str(e)[:200]
    bad = sorted(k for k, v in tensors.items() if v.is_floating_point() and not bool(torch.isfinite(v).all()))
    if bad:  # whole (the digest matches), but training diverged: resuming would go on from NaN/inf
        raise ValueError(
            f"last_whole_checkpoint: {ckpt} is whole but cannot be resumed: tensor {bad[0]} holds "
            f"non-finite values ({len(bad)} tensor(s)); resume from an earlier checkpoint by its path"
        )
    try:
        saved = PreProjConfig.from_pretrained(str(ckpt))
    except (ValueError, OSError, SafetensorError) as e:
        return str(e)[:200]
    if want is not None:
        diff = [f for f in _SIZES if getattr(saved, f) != getattr(want, f)]
        if diff:
            raise ValueError(
                f"last_whole_checkpoint: {ckpt} was written by method {saved.method!r} with "
                + ", ".join(f"{f}={getattr(saved, f)!r}" for f in diff)
                + f"; this run trains {want.method!r} with "
                + ", ".join(f"{f}={getattr(want, f)!r}" for f in diff)
            )
    return None
