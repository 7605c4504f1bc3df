"""The premises of the tuner-layer decision (ARCHITECTURE.md, issue 45 item 3), rechecked on the installed peft by
`bench/tuner_layer_choice.py` (run as a script: it registers two toy methods with peft, which stays out of this
process): with the wrapper as peft's tuner layer (A) every peft.functional call works as for LoRA and LoRA stacks
when it goes in first; with tuner-layer slots reaching their wrapper (B) peft's `delete_adapter(prefix=...)` skips
them (peft's prefix rule), whatever the slots do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.procs import HANG_GUARD_S

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "tuner_layer_choice.py"
FUNCTIONAL = {
    "set_adapter": "switches",
    "set_requires_grad": "works",
    "set_peft_model_state_dict": "round trip exact",
    "delete_adapter": "deletes",
}


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> dict[str, dict[str, str]]:
    out = tmp_path_factory.mktemp("choice") / "rows.json"
    subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)], check=True, capture_output=True, timeout=HANG_GUARD_S
    )
    return json.loads(out.read_text())["rows"]


@pytest.mark.slow
def test_the_wrapper_as_tuner_layer_serves_peft_functional_api_as_lora(rows):
    for route in ("inplace", "peftmodel"):
        lora, ours = rows[f"LoRA (reference) / {route}"], rows[f"A: wrapper is the tuner layer / {route}"]
        for call, want in FUNCTIONAL.items():
            assert lora[call] == want, (route, call, lora[call])  # the reference does it
            assert ours[call] == want, (route, call, ours[call])
        assert ours["get_peft_model_state_dict"] == "6 of 6 tensors"


@pytest.mark.slow
def test_slots_as_tuner_layers_lose_peft_delete_adapter(rows):
    for route in ("inplace", "peftmodel"):
        assert rows[f"B: slots reach their wrapper / {route}"]["delete_adapter"].startswith("no effect")


@pytest.mark.slow
def test_lora_stacks_on_the_tuner_layer_wrapper_only_when_it_goes_in_first(rows):
    a = rows["A: wrapper is the tuner layer / with LoRA"]
    assert a["ours then LoRA"].startswith("NoMatchingPeftModuleError")  # peft skips what a tuner layer holds
    assert a["LoRA then ours"] == "ours at 2 of 2 attentions; both run"
    assert a["ours off, then LoRA's unload()"] == "0 LoRA, 0 of ours tensors left; base restored"
