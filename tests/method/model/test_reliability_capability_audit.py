"""What a third independent audit found (`bench/capability_audit.py`: 212 cases of the capabilities the docs promise
to keep, side by side with peft's LoRA; 9 failed), each now as LoRA's, or a limit written in docs/limits.md:

- `PeftModel.unload()` left the PREPROJ `peft_config` on the base (LoRA's unload takes it off), so a later
  `get_peft_model` on it warned of a second adapter;
- `PeftModel.add_adapter` with `modules_to_save` started the new adapter's module from the active adapter's trained
  values (LoRA's new copy starts from the base's);
- `mmpreproj.load_adapter(..., adapter_name="b", is_trainable=True)` beside a frozen adapter left b frozen once
  `mmpreproj.set_adapter` made it active;
- limits: a waiting adapter's `modules_to_save` values are outside `state_dict()`; after transformers'
  `model.load_adapter`, transformers' own record of it outlives `mmpreproj.unload` (as for LoRA).
"""

from __future__ import annotations

import warnings

import peft
import pytest
import torch

import mmpreproj
from mmpreproj import PreProjConfig
from tests.helpers.zoo import tiny_neox

IDS = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(0))
LORA = {"target_modules": ["query_key_value"]}


def _shift_head(model: torch.nn.Module, seed: int) -> None:
    """Train the head by hand: add noise to `lm_head` in place."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.lm_head.weight.add_(0.3 * torch.randn(model.lm_head.weight.shape, generator=g))


@pytest.mark.parametrize("method", ["lora", "preproj"])
def test_peft_unload_takes_peft_config_off_the_base_as_for_lora(method):
    config = peft.LoraConfig(**LORA) if method == "lora" else PreProjConfig()
    base = peft.get_peft_model(tiny_neox(), config).unload()
    assert "peft_config" not in vars(base)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        peft.get_peft_model(base, peft.LoraConfig(**LORA))
    assert not [w for w in said if "peft_config" in str(w.message)]  # "Already found a `peft_config` attribute"


@pytest.mark.parametrize("method", ["lora", "preproj"])
def test_an_added_adapters_saved_module_starts_from_the_base_as_for_lora(method):
    config = (
        peft.LoraConfig(**LORA, modules_to_save=["lm_head"])
        if method == "lora"
        else PreProjConfig(modules_to_save=["lm_head"])
    )
    base_head = tiny_neox().lm_head.weight.detach().clone()
    model = peft.get_peft_model(tiny_neox(), config)
    head = model.base_model.model.lm_head
    live = head.modules_to_save["default"] if method == "lora" else head
    _shift_head(_holder(live), 1)  # the active adapter's head, trained
    model.add_adapter("b", config)
    model.set_adapter("b")
    now = head.modules_to_save["b"].weight if method == "lora" else head.weight
    assert torch.equal(now, base_head)


def _holder(module: torch.nn.Module) -> torch.nn.Module:
    holder = torch.nn.Module()
    holder.lm_head = module
    return holder


def test_an_adapter_loaded_trainable_beside_a_frozen_one_trains_once_active(tmp_path):
    for name, seed in (("a", 1), ("b", 2)):
        mmpreproj.save_adapter(mmpreproj.inject(tiny_neox(seed=seed), PreProjConfig()), tmp_path / name)
    model = mmpreproj.load_adapter(tiny_neox(), tmp_path / "a")  # "default", frozen, for inference
    mmpreproj.load_adapter(model, tmp_path / "b", adapter_name="b", is_trainable=True)
    mmpreproj.set_adapter(model, "b")
    b = [p for w in mmpreproj.injected_modules(model) for m in w.slots("b") for p in m.parameters()]
    assert b and all(p.requires_grad for p in b)
    wrappers = mmpreproj.injected_modules(model)
    assert not any(p.requires_grad for w in wrappers for p in w.preproj["default"].parameters())
    mmpreproj.set_adapter(model, "default")  # the old rule still holds: the new active one takes the flag
    assert all(p.requires_grad for w in wrappers for p in w.preproj["default"].parameters())


def test_a_waiting_adapters_saved_module_values_are_saved_by_name_not_in_state_dict(tmp_path):
    """docs/limits.md: `state_dict()` holds the active adapter's `modules_to_save` values only; `save_adapter(...,
    adapter_name=)` writes a waiting one's own."""
    config = PreProjConfig(modules_to_save=["lm_head"])
    src = mmpreproj.inject(tiny_neox(), config)
    _shift_head(src, 1)
    mmpreproj.save_adapter(src, tmp_path / "b")
    model = mmpreproj.inject(tiny_neox(), config)
    mmpreproj.load_adapter(model, tmp_path / "b", adapter_name="b")
    assert not any(torch.equal(v, src.lm_head.weight) for v in model.state_dict().values())  # the limit
    mmpreproj.save_adapter(model, tmp_path / "b-again", adapter_name="b")
    again = mmpreproj.load_adapter(tiny_neox(), tmp_path / "b-again")
    assert torch.equal(again(IDS).logits, src(IDS).logits)


def test_after_transformers_load_adapter_unload_gives_the_weights_back_and_transformers_answers_as_for_lora(tmp_path):
    """docs/limits.md: transformers keeps its own record of an adapter its `load_adapter` loaded; what its calls then
    say is the same for ours (after `mmpreproj.unload`) as for LoRA."""
    peft.get_peft_model(tiny_neox(seed=1), PreProjConfig()).save_pretrained(tmp_path / "a")
    model = tiny_neox()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_adapter(str(tmp_path / "a"))
    mmpreproj.unload(model)
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], v) for k, v in before.items())
    outcome = []
    for call in (lambda: model.save_pretrained(tmp_path / "saved"), lambda: model.load_adapter(str(tmp_path / "a"))):
        try:
            call()
            outcome.append("ok")
        except ValueError as e:
            outcome.append(str(e).split(".")[0])
    assert outcome == _lora_outcome(tmp_path)


def _lora_outcome(tmp_path) -> list[str]:
    """What transformers answers after its `load_adapter` of a LoRA folder: `save_pretrained`, then a second load."""
    folder = tmp_path / "lora-ref"
    peft.get_peft_model(tiny_neox(seed=1), peft.LoraConfig(**LORA)).save_pretrained(folder)
    model = tiny_neox()
    model.load_adapter(str(folder))
    outcome = []
    for call in (lambda: model.save_pretrained(tmp_path / "lora-saved"), lambda: model.load_adapter(str(folder))):
        try:
            call()
            outcome.append("ok")
        except ValueError as e:
            outcome.append(str(e).split(".")[0])
    return outcome


@pytest.mark.parametrize("saved", [None, ["lm_head"]], ids=["plain", "modules_to_save"])
def test_unload_puts_back_the_flags_of_parameters_replaced_since_inject(saved):
    """`load_state_dict(assign=True)` puts new parameter objects in place: `unload` finds them by name."""
    model = mmpreproj.inject(tiny_neox(), PreProjConfig(modules_to_save=saved))
    model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)
    mmpreproj.unload(model)
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    assert flags == {n: True for n in flags}, [n for n, f in flags.items() if not f][:3]
