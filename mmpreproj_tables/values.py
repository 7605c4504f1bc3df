"""The numbers the command and the library check alike, each rule written once: the ranges of `TrainConfig`'s
numeric fields (`TRAIN_BOUNDS`), learning-rate, budget and seed lists, and block indices.

Standard library only: the command refuses a value out of range before torch loads (`mmpreproj_cli/checks.py`), and the
library reads the same rules (`train/config.py`, `experiments/sweep.py`, `budget.py`, `reproduce.py`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .tables import MAX_EXPANSION

SEED_END = 2**32  # seeds are in [0, 2**32): numpy's and torch's seeding take 32-bit values


@dataclass(frozen=True)
class Bound:
    """A number's range, `low` <= value (< when `low_open`) and value <= `high` (< when `high_open`), and
    `says`, the range in words ("a positive int")."""

    says: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: float) -> bool:
        """Whether `value` is finite and inside the range."""
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)


# TrainConfig field -> its range (train/config.py checks them; the command checks the flags of the same names)
TRAIN_BOUNDS: dict[str, Bound] = {
    "num_lines": Bound("a positive int", 1),
    "steps": Bound("a positive int", 1),
    "batch_size": Bound("a positive int", 1),
    "grad_accum": Bound("a positive int", 1),
    "max_len": Bound("an int >= 2", 2),
    "min_chars": Bound("an int >= 0", 0),
    "seed": Bound("an int in [0, 2**32)", 0, SEED_END, high_open=True),
    "lr": Bound("a finite number > 0", 0, low_open=True),
    "min_lr_ratio": Bound("in [0, 1]", 0, 1),
    "weight_decay": Bound(">= 0", 0),
    "adam_eps": Bound("> 0", 0, low_open=True),
    "save_every": Bound(">= 0 (0 = no checkpoints)", 0),
    "lora_r": Bound("a positive int", 1),
    "lora_alpha": Bound("a positive int", 1),
    "expansion": Bound(f"a finite number in (0, {MAX_EXPANSION}]", 0, MAX_EXPANSION, low_open=True),
    "skip_rank": Bound("an int >= 1", 1),
}


def warmup_bound(steps: int) -> Bound:
    """The range of `warmup_steps` in a run of `steps` optimizer steps."""
    return Bound(f"in [0, steps={steps}]", 0, steps)


# --- comma-separated lists ---

LRS_HINT = "pass distinct finite numbers > 0, e.g. 1e-5,1e-4,1e-3"


def split_items(text: str, label: str, hint: str) -> list[str]:
    """The comma-separated items of `text`, stripped ([] when there is none: "", " ", ","; the caller names what is
    missing); ValueError naming `label` for an empty item among others ("a,,b", ",a", "a,"), never dropped unseen."""
    items = [s.strip() for s in text.split(",")]
    if not any(items):
        return []
    if not all(items):
        raise ValueError(f"{label}: an empty item (two commas in a row, or one at an end); {hint}")
    return items


def _label(flag: str, text: object) -> str:
    return f"{flag} {text!r}" if flag.startswith("--") else f"{flag}={text!r}"


def parse_lrs(text: str, *, flag: str = "lrs") -> list[float]:
    """ "1e-5,1e-3" -> [1e-05, 0.001]; each a finite number > 0, all distinct (`check_lrs`). `flag` names the
    option in the error ("--lrs" from the command line)."""
    label = _label(flag, text)
    lrs = []
    for s in split_items(text, label, LRS_HINT):
        try:
            lrs.append(float(s))
        except ValueError:
            raise ValueError(f"{label}: {s!r} is not a number; {LRS_HINT}") from None
    return check_lrs(lrs, label)


def check_lrs(lrs: Sequence[float], label: str = "lrs") -> list[float]:
    """`lrs` as floats, or ValueError naming the first one that is not a finite number > 0 (`TRAIN_BOUNDS["lr"]`)
    or is repeated (two LRs equal to 6 digits share a point's folder, `lr-{lr:g}`)."""
    out: list[float] = []
    for lr in lrs:
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not TRAIN_BOUNDS["lr"].holds(lr):
            raise ValueError(f"{label}: {lr!r} is not {TRAIN_BOUNDS['lr'].says}; {LRS_HINT}")
        if f"{lr:g}" in {f"{x:g}" for x in out}:
            raise ValueError(f"{label}: {lr:g} is named twice; {LRS_HINT}")
        out.append(float(lr))
    if not out:
        raise ValueError(f"{label}: no learning rate given; {LRS_HINT}")
    return out


def parse_budgets(text: str | Sequence[float], *, flag: str = "budgets") -> list[float]:
    """ "0.01,0.1" -> [0.01, 0.1]: distinct fractions of the base's parameters in (0, 1]."""
    hint = "pass fractions in (0, 1], e.g. 0.01,0.1"
    items = split_items(text, _label(flag, text), hint) if isinstance(text, str) else list(text)
    out: list[float] = []
    for s in items:
        try:
            b = float(s)
        except (TypeError, ValueError):
            raise ValueError(f"{flag}: {s!r} is not a number; pass fractions in (0, 1], e.g. 0.01,0.1") from None
        if not (math.isfinite(b) and 0 < b <= 1) or b in out:
            raise ValueError(
                f"{flag}: {s!r} is {'repeated' if b in out else 'not in (0, 1]'}; "
                "pass distinct fractions of the base's parameters, e.g. 0.01,0.1"
            )
        out.append(b)
    if not out:
        raise ValueError(f"{flag}: no budget given; pass fractions in (0, 1], e.g. 0.01,0.1")
    return out


def parse_seeds(text: str | int | Sequence[int] | None, default: int, *, flag: str = "seeds") -> list[int]:
    """ "3" -> the preset's seed and the next two; "0,3,7" -> those seeds; None -> [default].

    Every seed is checked before any arm trains: integers in [0, 2**32), distinct; a count K >= 1. `flag` names
    the option in the error ("--seeds" from the command line)."""
    if text is None:
        return [default]
    label = _label(flag, text)
    hint = "pass K (a count >= 1: the preset's seed and the next K-1) or distinct integers >= 0 such as 0,3,7"

    def integer(s: object) -> int:
        if isinstance(s, int) and not isinstance(s, bool):
            return s
        if isinstance(s, str) and s.strip().removeprefix("-").isdecimal():
            return int(s)
        raise ValueError(f"{label}: {s!r} is not an integer; {hint}")

    if isinstance(text, str) and "," not in text:
        text = integer(text.strip())
    if isinstance(text, int) and not isinstance(text, bool):  # a count K
        if text < 1:
            raise ValueError(f"{label}: a count must be >= 1; {hint}")
        seeds = [default + i for i in range(text)]
    elif isinstance(text, (str, Sequence)):
        items = split_items(text, label, hint) if isinstance(text, str) else list(text)
        seeds = [integer(s) for s in items]
        if not seeds:
            raise ValueError(f"{label}: no seed given; {hint}")
    else:
        raise ValueError(f"{label}: not a count or a list of seeds; {hint}")
    bad = [s for s in seeds if not TRAIN_BOUNDS["seed"].holds(s)]
    if bad:
        raise ValueError(f"{label}: seed {bad[0]} is out of range [0, 2**32); {hint}")
    twice = [s for i, s in enumerate(seeds) if s in seeds[:i]]
    if twice:
        raise ValueError(f"{label}: seed {twice[0]} is named twice; {hint}")
    return seeds
