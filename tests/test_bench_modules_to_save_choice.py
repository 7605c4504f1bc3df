"""The premises of the `modules_to_save` decision (ARCHITECTURE.md, "Decided (issue 45, item 2)"), rechecked on the
installed peft by `bench/modules_to_save_choice.py`'s functions: peft's in-place route wraps the head (other keys,
only the copy trains), a tied head read into a copy alone computes other logits, and our writer refuses a head
peft wrapped."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "modules_to_save_choice.py"


@pytest.fixture(scope="module")
def choice():
    spec = importlib.util.spec_from_file_location("modules_to_save_choice", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_peft_in_place_wraps_the_head_and_trains_a_copy(choice):
    got = choice.peft_in_place()
    assert got["head_type"] == "ModulesToSaveWrapper"
    assert got["head_keys"] == ["lm_head.modules_to_save.default.weight", "lm_head.original_module.weight"]
    assert got["trainable_head_keys"] == ["lm_head.modules_to_save.default.weight"]


def test_a_tied_head_read_into_a_copy_computes_other_logits(choice):
    got = choice.tied_head_read_into_copy()
    assert got["tied_in_place"] is True
    assert got["max_abs_logit_diff"] > 0.1


def test_our_writer_refuses_a_head_peft_wrapped(choice):
    assert choice.our_writer_on_wrapped_head().startswith("refused: save_adapter: 'lm_head' is a module peft wraps")
