"""The first injection runs through peft's own loop (`BaseTuner.inject_adapter`), driven by the host plan through
the tuner's hooks: `_check_target_module_exists` answers for the planned sites, `_create_and_replace` places
their wrappers, `_mark_only_adapters_as_trainable` freezes the base; `mmpreproj.inject` and
`peft.inject_adapter_in_model` are that one path."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model, inject_adapter_in_model
from peft.tuners.tuners_utils import inspect_matched_modules
from peft.utils.other import ModulesToSaveWrapper

import mmpreproj
import mmpreproj.method.model as tuner_model
from mmpreproj import PreProjConfig
from mmpreproj.method import PreProjModel
from mmpreproj.method.plan import config_host, plan_injection
from mmpreproj.method.state import injected_modules
from tests.helpers.snapshots import assert_unchanged, snapshot
from tests.helpers.zoo import qwen2_vl, tiny_neox, vl_forward, vl_inputs

TOKENS = torch.tensor([[1, 5, 9, 3, 7, 2, 11, 4]])
SLOTS = (".preproj.", ".preproj_skip.")


def _planned_paths(model, config: PreProjConfig) -> list[str]:
    """The module paths the host plan wraps, on `model` (left untouched)."""
    return plan_injection(model, config, config_host(model, config)).state.modules


def _trainable(model) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize(
    ("make", "config"),
    [
        (tiny_neox, PreProjConfig()),
        (tiny_neox, PreProjConfig(layers=[1], skip=False)),
        (qwen2_vl, PreProjConfig(parts=["vision", "language"], layers={"vision": [0]})),
    ],
    ids=["neox", "neox_layer_1", "qwen2_vl_two_parts"],
)
def test_peft_loop_places_exactly_the_planned_sites(make, config, monkeypatch):
    planned = _planned_paths(make(), config)
    assert planned  # the comparison below can fail: there are sites
    seen = []
    create = PreProjModel._create_and_replace

    def spy(self, peft_config, adapter_name, target, target_name, parent, current_key, **kw):
        seen.append(current_key)
        return create(self, peft_config, adapter_name, target, target_name, parent, current_key, **kw)

    monkeypatch.setattr(PreProjModel, "_create_and_replace", spy)
    model = make()
    pm = get_peft_model(model, config)
    assert sorted(seen) == sorted(planned)  # peft's loop called the hook for each planned site, once
    assert sorted(pm.base_model.targeted_module_names) == sorted(planned)
    matched = inspect_matched_modules(pm.base_model)  # peft's own helper, asking the hook after the fact
    assert sorted(matched["matched"]) == sorted(planned)
    wrapped = [
        n.removeprefix("base_model.model.") for n, m in pm.named_modules() if type(m).__name__ == "PreProjAttention"
    ]
    assert sorted(wrapped) == sorted(planned)


def test_mark_only_adapters_as_trainable_freezes_the_base_as_lora_does_leaving_ours_and_modules_to_save():
    lora = get_peft_model(tiny_neox(), LoraConfig(r=2, target_modules=["query_key_value"]))
    lora_trainable = _trainable(lora)
    assert lora_trainable and all(".lora_" in n for n in lora_trainable)  # LoRA: its own weights only

    base = tiny_neox()
    base.gpt_neox.layers[0].mlp.requires_grad_(False)  # a part frozen before: it stays frozen after unload
    before = [(n, p.requires_grad) for n, p in base.named_parameters()]
    pm = get_peft_model(base, PreProjConfig(modules_to_save=["gpt_neox.final_layer_norm"]))
    ours = {n for n in _trainable(pm) if any(s in n for s in SLOTS)}
    kept = {n for n in _trainable(pm) if ".final_layer_norm." in n}
    assert ours and kept == {
        "base_model.model.gpt_neox.final_layer_norm.weight",
        "base_model.model.gpt_neox.final_layer_norm.bias",
    }
    assert _trainable(pm) == ours | kept  # everything else frozen, as LoRA freezes everything but its own
    all_slots = {n for n, _ in pm.named_parameters() if any(s in n for s in SLOTS)}
    assert ours == all_slots
    pm.unload()  # each flag the hook changed is put back, and only those
    assert [(n, p.requires_grad) for n, p in base.named_parameters()] == before


def test_modules_to_save_stay_ours_not_wrapped_by_peft():
    config = PreProjConfig(modules_to_save=["gpt_neox.final_layer_norm"])
    pm = get_peft_model(tiny_neox(), config)
    assert not any(isinstance(m, ModulesToSaveWrapper) for m in pm.modules())
    assert isinstance(pm.base_model.model.gpt_neox.final_layer_norm, torch.nn.LayerNorm)
    assert config.modules_to_save == ["gpt_neox.final_layer_norm"]  # the config keeps them (peft read a copy)
    assert pm.peft_config["default"] is config


def test_inference_mode_leaves_adapter_and_modules_to_save_frozen_under_peft():
    config = PreProjConfig(modules_to_save=["gpt_neox.final_layer_norm"], inference_mode=True)
    pm = get_peft_model(tiny_neox(), config)
    assert _trainable(pm) == set()


def _randomize_adapter(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in sorted(model.named_parameters()):
            if any(s in n for s in SLOTS):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def test_inject_adapter_in_model_is_mmpreproj_inject():
    base_out = tiny_neox()(TOKENS).logits
    torch.manual_seed(3)
    a = mmpreproj.inject(tiny_neox())
    torch.manual_seed(3)
    b = inject_adapter_in_model(PreProjConfig(), tiny_neox())
    assert [(n, type(m)) for n, m in a.named_modules()] == [(n, type(m)) for n, m in b.named_modules()]
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)  # the same init from one seed
    assert [(n, p.requires_grad) for n, p in a.named_parameters()] == [
        (n, p.requires_grad) for n, p in b.named_parameters()
    ]
    _randomize_adapter(a, 5)
    _randomize_adapter(b, 5)
    out_a, out_b = a(TOKENS).logits, b(TOKENS).logits
    assert not torch.allclose(out_a, base_out)  # the adapter acts: the equality below can fail
    assert torch.equal(out_a, out_b)
    for m in (a, b):  # peft's record on the model, as peft's route leaves it (peft's functions read it)
        assert list(m.peft_config) == ["default"] and isinstance(m.peft_config["default"], PreProjConfig)
    assert not hasattr(mmpreproj.unload(a), "peft_config")  # unload takes ours off


def test_inject_adapter_in_model_two_parts_is_mmpreproj_inject():
    config = dict(parts=["vision", "language"])
    torch.manual_seed(4)
    a = mmpreproj.inject(qwen2_vl(), PreProjConfig(**config))
    torch.manual_seed(4)
    b = inject_adapter_in_model(PreProjConfig(**config), qwen2_vl())
    _randomize_adapter(a, 6)
    _randomize_adapter(b, 6)
    assert torch.equal(vl_forward(a, vl_inputs()), vl_forward(b, vl_inputs()))


@pytest.mark.parametrize("route", ["inject", "get_peft_model", "inject_adapter_in_model"])
def test_an_error_after_the_wrappers_are_placed_leaves_the_model_as_it_was(route, monkeypatch):
    model = tiny_neox()
    snap = snapshot(model)

    def boom(*_):
        raise RuntimeError("boom in the freeze")

    monkeypatch.setattr(tuner_model, "mark_trainable", boom)  # after peft placed every wrapper
    config = PreProjConfig(modules_to_save=["gpt_neox.final_layer_norm"])
    call = {
        "inject": lambda: mmpreproj.inject(model, config),
        "get_peft_model": lambda: get_peft_model(model, config),
        "inject_adapter_in_model": lambda: inject_adapter_in_model(config, model),
    }[route]
    with pytest.raises(RuntimeError, match="boom in the freeze"):
        call()
    assert_unchanged(model, snap)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert "save_pretrained" not in vars(model) and not hasattr(model, "peft_config")
    monkeypatch.undo()
    mmpreproj.inject(model, config)  # and it injects cleanly afterwards
    assert mmpreproj.is_injected(model)


def test_mmpreproj_inject_keeps_refusing_an_injected_model():
    model = mmpreproj.inject(tiny_neox())
    with pytest.raises(RuntimeError, match="already has mmpreproj modules injected"):
        mmpreproj.inject(model)


def test_inject_refuses_a_peft_model_before_peft_touches_its_configs():
    lora = get_peft_model(tiny_neox(), LoraConfig(r=2, target_modules=["query_key_value"]))
    before = dict(lora.peft_config)
    with pytest.raises(RuntimeError, match="the model is a peft PeftModel"):
        mmpreproj.inject(lora)
    assert lora.peft_config == before and isinstance(lora.peft_config["default"], LoraConfig)


# --- a further adapter: the same loop, `_create_and_replace` adding to the wrappers already there ---------------


def _spy_create(monkeypatch) -> list[str]:
    seen: list[str] = []
    create = PreProjModel._create_and_replace

    def spy(self, peft_config, adapter_name, target, target_name, parent, current_key, **kw):
        seen.append(current_key)
        return create(self, peft_config, adapter_name, target, target_name, parent, current_key, **kw)

    monkeypatch.setattr(PreProjModel, "_create_and_replace", spy)
    return seen


@pytest.mark.parametrize("route", ["peft_add_adapter", "mmpreproj_load_adapter"])
def test_a_further_adapter_goes_through_peft_loop_into_each_wrapper(route, tmp_path, monkeypatch):
    config = PreProjConfig(layers=[0, 1])
    saved = mmpreproj.inject(tiny_neox(), config)
    _randomize_adapter(saved, 3)
    mmpreproj.save_adapter(saved, tmp_path / "b")
    model = mmpreproj.inject(tiny_neox(), config) if route == "mmpreproj_load_adapter" else tiny_neox()
    pm = get_peft_model(model, config) if route == "peft_add_adapter" else None
    planned = model.mmpreproj_state.modules
    seen = _spy_create(monkeypatch)
    if route == "peft_add_adapter":
        pm.add_adapter("b", PreProjConfig(layers=[0, 1]))
        assert sorted(pm.base_model.targeted_module_names) == sorted(planned)  # peft's record: the same sites
    else:
        mmpreproj.load_adapter(model, tmp_path / "b", adapter_name="b")
        mmpreproj.set_adapter(model, "b")
        with torch.no_grad():
            assert torch.equal(model(TOKENS).logits, saved(TOKENS).logits)  # the saved weights went in
    assert sorted(seen) == sorted(planned)  # peft's loop visited each wrapper once
    wrappers = injected_modules(model)
    assert all("b" in w.preproj and "b" in w.preproj_skip for w in wrappers)
    assert mmpreproj.adapter_names(model) == ["default", "b"]


def test_a_further_adapter_failing_inside_peft_loop_leaves_no_wrapper_holding_it(tmp_path, monkeypatch):
    model = mmpreproj.inject(tiny_neox(), PreProjConfig())
    mmpreproj.save_adapter(model, tmp_path / "b")
    snap = snapshot(model)
    place = tuner_model.place_added
    calls = []

    def fail_on_second(addition, path, wrapper):
        calls.append(path)
        if len(calls) == 2:
            raise RuntimeError("boom at the second site")
        place(addition, path, wrapper)

    monkeypatch.setattr(tuner_model, "place_added", fail_on_second)
    with pytest.raises(RuntimeError, match="boom at the second site"):
        mmpreproj.load_adapter(model, tmp_path / "b", adapter_name="b")
    assert len(calls) == 2  # the first wrapper got it before the failure
    assert_unchanged(model, snap)
    assert mmpreproj.adapter_names(model) == ["default"] and list(model.peft_config) == ["default"]
    assert all(w.adapter_names() == ["default"] for w in injected_modules(model))
    monkeypatch.undo()
    mmpreproj.load_adapter(model, tmp_path / "b", adapter_name="b")  # and it adds cleanly afterwards
    assert mmpreproj.adapter_names(model) == ["default", "b"]
