"""Short sequences of peft's adapter calls, ours beside LoRA under the same calls (found by
`bench/lifecycle_audit.py`): the adapter that runs, peft's record of it and what trains end as LoRA's, or as
docs/limits.md says they differ."""

from __future__ import annotations

import warnings

import peft
import peft.functional as pf
import pytest
import torch
from peft.tuners.tuners_utils import BaseTunerLayer

import mmpreproj
from mmpreproj.method.layer import TUNER_PREFIX
from tests.helpers.zoo import tiny_neox

IDS = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(0))


def _config(kind: str) -> peft.PeftConfig:
    return mmpreproj.PreProjConfig() if kind == "ours" else peft.LoraConfig(r=2, target_modules=["query_key_value"])


def _layers_active(model: torch.nn.Module) -> set[tuple[str, ...]]:
    return {tuple(m.active_adapters) for m in model.modules() if isinstance(m, BaseTunerLayer)}


def _trains(model: torch.nn.Module, name: str) -> bool:
    """Whether every weight of adapter `name` trains (False: none does)."""
    flags = {p.requires_grad for n, p in model.named_parameters() if f".{name}." in n}
    assert len(flags) == 1, f"{name}: a mix of trainable and frozen weights"
    return flags.pop()


@pytest.mark.parametrize("kind", ["ours", "lora"])
def test_delete_after_a_per_layer_switch_hands_peft_s_record_to_the_layers_adapter(kind):
    """`set_adapter("b")`, peft's per-layer switch back to "default", then delete "b": peft's record follows the
    layers (before: ours kept "b" in the record and every forward raised KeyError)."""
    pm = peft.get_peft_model(tiny_neox(), _config(kind))
    pm.add_adapter("b", _config(kind))
    pm.set_adapter("b")
    pf.set_adapter(pm, "default")
    pm.delete_adapter("b")
    assert pm.active_adapter == "default" and _layers_active(pm) == {("default",)}
    with torch.no_grad():
        pm(IDS)


@pytest.mark.parametrize("kind", ["ours", "lora"])
def test_set_adapter_freezes_every_other_adapter(kind):
    pm = peft.get_peft_model(tiny_neox(), _config(kind))
    pm.add_adapter("b", _config(kind))
    pm.base_model.set_requires_grad(["b", "default"], True)
    assert _trains(pm, "b") and _trains(pm, "default")
    pm.set_adapter("default")  # already active: the others still freeze (peft's rule)
    assert _trains(pm, "default") and not _trains(pm, "b")


@pytest.mark.parametrize("kind", ["ours", "lora"])
def test_inject_adapter_in_model_of_a_further_adapter_makes_it_the_active_trainable_one(kind):
    model = peft.inject_adapter_in_model(_config(kind), tiny_neox())
    pf.set_requires_grad(model, "default", requires_grad=False)
    model = peft.inject_adapter_in_model(_config(kind), model, adapter_name="b")
    assert _layers_active(model) == {("b",)}
    assert _trains(model, "b") and not _trains(model, "default")  # the others' flags as they were
    model = peft.inject_adapter_in_model(_config(kind), tiny_neox())
    model = peft.inject_adapter_in_model(_config(kind), model, adapter_name="b")
    assert _trains(model, "b") and _trains(model, "default")


def test_inject_adapter_in_model_adds_the_active_adapter_that_runs_and_switches_back():
    base = tiny_neox()
    with torch.no_grad():
        plain = base(IDS).logits
    model = mmpreproj.inject(base, mmpreproj.PreProjConfig(skip_init_std=0.2))
    with torch.no_grad():
        first = model(IDS).logits
    model = peft.inject_adapter_in_model(mmpreproj.PreProjConfig(skip_init_std=0.5), model, adapter_name="b")
    assert mmpreproj.active_adapter(model) == "b"
    with torch.no_grad():
        second = model(IDS).logits
        mmpreproj.set_adapter(model, "default")
        assert torch.equal(model(IDS).logits, first) and not torch.equal(second, first)
        mmpreproj.unload(model)
        assert torch.equal(model(IDS).logits, plain)


def test_documented_differences_from_lora():
    """docs/limits.md: a switch to a name not loaded leaves the active adapter (LoRA's layers switch to it), its state
    dict is refused (LoRA: empty), the layers switched off and on keep every flag (LoRA's thaw the active one), and
    injecting a name already loaded is refused, the model unchanged (LoRA re-initialises it)."""
    ours = peft.inject_adapter_in_model(_config("ours"), tiny_neox())
    lora = peft.inject_adapter_in_model(_config("lora"), tiny_neox())
    for model in (ours, lora):
        pf.set_adapter(model, "nope")
    assert _layers_active(ours) == {("default",)} and _trains(ours, "default")
    assert _layers_active(lora) == {("nope",)} and not _trains(lora, "default")
    for k, model in (("ours", ours), ("lora", lora)):  # a deleted adapter's state dict
        model = peft.inject_adapter_in_model(_config(k), model, adapter_name="b")
        pf.set_adapter(model, "default")
        pf.delete_adapter(model, "b", prefix=TUNER_PREFIX if k == "ours" else "lora_")
    with pytest.raises(ValueError, match="not loaded"):
        peft.get_peft_model_state_dict(ours, adapter_name="b")
    assert peft.get_peft_model_state_dict(lora, adapter_name="b") == {}
    pm = {k: peft.get_peft_model(tiny_neox(), _config(k)) for k in ("ours", "lora")}
    for k, model in pm.items():
        pf.set_requires_grad(model, "default", requires_grad=False)
        with warnings.catch_warnings(), model.disable_adapter():
            warnings.simplefilter("ignore")
        assert _trains(model, "default") is (k == "lora")
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    with pytest.raises(ValueError, match="already loaded"):
        peft.inject_adapter_in_model(_config("ours"), ours, adapter_name="default")
    after = ours.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
