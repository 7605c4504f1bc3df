"""The trainer's own exceptions: each says in one line what went wrong and what to do."""

from __future__ import annotations


class CheckpointWriteError(OSError):
    """A checkpoint or the final adapter could not be written (disk full, permissions, ...); the message names
    the file or folder, why, and what was kept."""


class ModelUnavailableError(RuntimeError):
    """A model or tokenizer cannot be loaded (hub id offline, wrong local path)."""


class NonFiniteLossError(FloatingPointError):
    """The loss (or gradient norm) became NaN/inf; the run stopped before the optimizer step.

    Attributes:
        step: the optimizer step (1-based) whose loss was not finite.
        value: the offending loss or gradient norm.
        checkpoint: path of the last good checkpoint, or None if none was written.
    """

    def __init__(self, step: int, what: str, value: float, checkpoint: str | None) -> None:
        kept = f"last good checkpoint kept at {checkpoint}" if checkpoint else "no checkpoint was written yet"
        super().__init__(
            f"{what} is {value} at step {step}; training stopped before the optimizer step ({kept}). "
            "Try a lower lr, precision='fp32', or check the data."
        )
        self.step = step
        self.what = what
        self.value = value
        self.checkpoint = checkpoint
