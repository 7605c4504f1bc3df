"""transformers `TrainerCallback`s the trainer tests use."""

from __future__ import annotations

from transformers import TrainerCallback


class StopAfterSave(TrainerCallback):
    """Ends training right after the checkpoint of step `at` is written: a kill at the worst moment."""

    def __init__(self, at: int):
        self.at = at

    def on_save(self, args, state, control, **kwargs):
        if state.global_step >= self.at:
            control.should_training_stop = True
