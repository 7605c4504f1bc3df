"""One arm of an experiment (a method, a seed, a learning rate): train on a copy of the base, evaluate,
record the result in `arm_dir/eval.json`, and read it back instead of recomputing when it is already there.

    row, items, reused = run_arm(arm_dir, key, compute)

Every step of every experiment is recorded as `{"key", "row", "items"}` (`write_record`) and read back only under
the same key (`read_record`); `runner.ArmRunner` is the arm the experiments run.

`key` holds every setting the numbers depend on (the training config less the fields that do not change
them, the evaluation settings); a saved result whose key differs is recomputed, so changing a setting never
silently mixes old and new numbers. An arm killed mid-training resumes from its `checkpoint.pt`.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from torch import nn

from ..analysis import skip_norms
from ..eval import evaluate
from ..method.estimate import trainable_report
from ..train import train
from ..train.checkpoint import CHECKPOINT_NAME
from ..train.config import RESUME_FREE_FIELDS, SIZE_DEFAULTS, TrainConfig
from ..train.runlog import write_json

ARM_FILE = "eval.json"


def arm_key(cfg: TrainConfig | None, eval_settings: dict[str, Any]) -> dict[str, Any]:
    """What an arm's numbers depend on: the training config (less bookkeeping fields) and the evaluation."""
    train_part = None
    if cfg is not None:  # a size field at its default is left out: arms saved before the field existed still match
        train_part = {
            k: v
            for k, v in cfg.to_dict().items()
            if k not in RESUME_FREE_FIELDS | {"library_version"} and not (k in SIZE_DEFAULTS and v == SIZE_DEFAULTS[k])
        }
    return json.loads(json.dumps({"train": train_part, "eval": eval_settings}, default=str))


def read_record(path: str | Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The saved `{"key", "row", "items", ...}` at `path` when its key is `key`, else None (missing or torn)."""
    try:
        saved = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError):  # garbage (not UTF-8, nested too deeply): computed again
        return None
    return saved if isinstance(saved, dict) and saved.get("key") == key else None


def write_record(path: str | Path, key: dict[str, Any], row: dict[str, Any], items: dict[str, Any], **extra) -> None:
    """Write a finished step's `{"key", "row", "items", ...}`, what `read_record` reads back under `key`."""
    write_json(path, {"key": key, "row": row, "items": items, **extra})


def read_arm(arm_dir: str | Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The saved `{"row", "items"}` of a finished arm with this `key`, else None."""
    return read_record(Path(arm_dir) / ARM_FILE, key)


def finished_arm(arm_dir: str | Path, key: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], bool] | None:
    """(row, per-item scores, True) of a finished arm with this `key`, read back; None when it has not finished."""
    saved = read_arm(arm_dir, key)
    return None if saved is None else (saved["row"], saved.get("items", {}), True)


def run_arm(
    arm_dir: str | Path, key: dict[str, Any], compute: Callable[[bool], tuple[dict[str, Any], dict[str, Any]]]
) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """(row, per-item scores, reused): read back when finished with the same key, else `compute(fresh)`.

    `fresh` is True when the folder holds a result for other settings (the run must start over rather than
    resume). After computing, the row is written and the arm's `checkpoint.pt` removed (the adapter stays).
    """
    arm_dir = Path(arm_dir)
    done = finished_arm(arm_dir, key)
    if done is not None:
        return done
    fresh = (arm_dir / ARM_FILE).is_file()
    row, items = compute(fresh)
    arm_dir.mkdir(parents=True, exist_ok=True)
    write_record(arm_dir / ARM_FILE, key, row, items)
    (arm_dir / CHECKPOINT_NAME).unlink(missing_ok=True)
    return row, items, False


def eval_arm(
    model: nn.Module, tokenizer, settings: dict[str, Any], *, data_source: str, protocol: str, progress: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Evaluate; returns (flat metrics `{"task.metric": value}`, per-item scores `{task: {key: list}}`)."""
    t0 = time.time()
    res = evaluate(
        model,
        tokenizer,
        settings["tasks"],
        protocol=protocol,
        limit=settings["limit"],
        data_source=data_source,
        ppl_split=settings["ppl_split"],
        progress=progress,
        per_item=True,
    )
    flat, items = {}, {}
    for task, metrics in res.items():
        for k, v in metrics.items():
            if isinstance(v, list):
                items.setdefault(task, {})[k] = v
            else:
                flat[f"{task}.{k}"] = v
    flat["eval_seconds"] = time.time() - t0
    return flat, items


def train_arm(cfg: TrainConfig, base: nn.Module, tokenizer, *, fresh: bool) -> tuple[nn.Module, dict[str, Any]]:
    """Train `cfg` on a deep copy of `base` (resuming a checkpoint in `cfg.out` unless `fresh`, or unless the run
    stopped before its first checkpoint: then it starts over); writes the run folder's `loss_curve.png`. Returns
    the trained model and a row of training facts."""
    fresh = fresh or not (Path(cfg.out) / CHECKPOINT_NAME).is_file()
    cfg = cfg.replace(resume=not fresh, overwrite=fresh)
    t0 = time.time()
    result = train(cfg, model=copy.deepcopy(base), tokenizer=tokenizer)
    model = result.model
    row: dict[str, Any] = {
        "method": cfg.method,
        "seed": cfg.seed,
        "lr": cfg.lr,
        "params": trainable_report(model).trainable,
        "train_loss": result.final_loss,
        "train_loss_mean10": result.metrics.get("final_loss_mean10"),
        "train_seconds": result.metrics.get("train_seconds"),
        "train_wall_seconds": time.time() - t0,
    }
    sn = skip_norms(model)
    if sn:
        row["skip_norms"] = list(sn.values())
    return model, row


def compute_seconds(rows: Iterable[dict[str, Any]]) -> float:
    """The rows' own train + eval wall seconds, summed (what each report calls the compute)."""
    return sum(arm_seconds(r) for r in rows)


def arm_seconds(row: dict[str, Any]) -> float:
    """One row's train + eval wall seconds."""
    return (row.get("train_wall_seconds") or 0) + (row.get("eval_seconds") or 0)
