"""The run folder's text files: JSON written atomically, and the per-step JSONL log.

out/
  adapter/            the trained weights (ours; peft's for LoRA; preproj_lora: peft's, ours in adapter/preproj/)
  train_config.json   the TrainConfig, with the library version
  metrics.json        summary: steps, losses, tokens, time, parameter counts
  log.jsonl           one line per optimizer step: step, loss, lr, grad_norm, tokens, tokens_per_s, elapsed_s
  checkpoint.pt       resumable state (see checkpoint.py)
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any

from ..util.io import atomic_write

CONFIG_NAME = "train_config.json"
METRICS_NAME = "metrics.json"
LOG_NAME = "log.jsonl"


def _finite(x: Any) -> Any:
    return x if not isinstance(x, float) or math.isfinite(x) else str(x)  # JSON has no NaN/inf


def write_json(path: str | Path, obj: dict[str, Any]) -> Path:
    """Write `obj` as indented JSON via a temp file and `os.replace`."""
    path = Path(path)
    text = json.dumps({k: _finite(v) for k, v in obj.items()}, indent=2, sort_keys=True) + "\n"
    atomic_write(path, lambda f: Path(f).write_text(text))
    return path


class StepLog:
    """Appends one JSON object per line to `log.jsonl`; `enabled=False` (ranks > 0) writes nothing.

    `truncate_after(step)` drops records past `step`, so a resumed run's log has each step exactly once.
    """

    def __init__(self, path: str | Path, enabled: bool = True) -> None:
        self.path = Path(path)
        self.enabled = enabled
        self.records: list[dict[str, Any]] = []

    def truncate_after(self, step: int) -> None:
        if not self.enabled or not self.path.is_file():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):  # a torn last line from a crash is dropped
                rec = json.loads(line)
                if rec.get("step", 0) <= step:
                    kept.append(rec)
        self.records = kept
        text = "".join(json.dumps(r) + "\n" for r in kept)
        atomic_write(self.path, lambda f: Path(f).write_text(text, encoding="utf-8"))  # a crash keeps the old log

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        if self.enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(json.dumps({k: _finite(v) for k, v in record.items()}) + "\n")
