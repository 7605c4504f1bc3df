"""Calls a second independent audit found failing (239 cases of inject, switch, delete, mixed batches and unload on
five host families; 33 failed): each is now refused before anything changes, or behaves as peft's LoRA does.

- `modules_to_save` naming a module that is, holds or sits inside a wrapped attention was accepted; saving then
  failed ("tensors share memory") and `unload` raised a KeyError halfway (wrappers gone, weights not put back);
- `peft.functional.delete_adapter` of the only adapter left a model that raised `StopIteration` at its next forward;
- on an `inject()`ed model a mixed batch naming one adapter for every row skipped the row count;
- `mmpreproj.inject` ignored `config.inference_mode` (peft's `inject_adapter_in_model` freezes the adapter);
- `inject(host=...)` beside a `config.host` naming another row injected one and recorded the other;
- an added adapter whose `layers` spelled the injection's blocks another way was refused as "other sites";
- `estimate` ignored `parts`, `PreProjConfig.for_budget` crashed on a non-model, `adapter_disabled` did nothing on a
  model without adapters, `PreProjConfig(inference_mode="x")` was accepted.
"""

from __future__ import annotations

import copy

import peft.functional as pf
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model, inject_adapter_in_model

import mmpreproj
from mmpreproj import PreProjConfig
from tests.helpers.snapshots import assert_unchanged, snapshot
from tests.helpers.zoo import tiny_neox

IDS = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    "path, where",
    [
        ("gpt_neox.layers.0.attention", "is or holds"),
        ("gpt_neox.layers.0", "is or holds"),
        ("gpt_neox.layers.0.attention.query_key_value", "sits inside"),
    ],
)
@pytest.mark.parametrize("route", ["inject", "peft"])
def test_modules_to_save_around_or_inside_a_wrapped_attention_is_refused(path, where, route):
    model = tiny_neox()
    before = snapshot(model)
    config = PreProjConfig(modules_to_save=[path])
    with pytest.raises(ValueError, match=rf"modules_to_save: '{path}' .* {where} the attention"):
        mmpreproj.inject(model, config) if route == "inject" else get_peft_model(model, config)
    assert_unchanged(model, before)
    assert not hasattr(model, "peft_config")


def test_modules_to_save_outside_the_attention_still_trains_and_unloads():
    model = tiny_neox()
    want = model(IDS).logits
    mmpreproj.inject(model, PreProjConfig(modules_to_save=["gpt_neox.layers.0.mlp"]))
    assert all(p.requires_grad for p in model.gpt_neox.layers[0].mlp.parameters())
    assert torch.equal(mmpreproj.unload(model)(IDS).logits, want)


@pytest.mark.parametrize("route", ["inject", "peft"])
def test_deleting_the_only_adapter_through_peft_functional_leaves_the_host_alone_as_for_lora(route):
    """The audit found `StopIteration` at the next forward, then the last adapter was refused (the family audit: 82
    cases where LoRA deletes it); now, as LoRA, the layers hold no adapter and the model runs as the base."""
    seen = {}
    for kind in ("lora", "preproj"):
        base = tiny_neox()
        want = base(IDS).logits
        config = LoraConfig(target_modules=["query_key_value"]) if kind == "lora" else PreProjConfig()
        if route == "peft":
            model = get_peft_model(base, config)
        else:
            model = inject_adapter_in_model(config, base) if kind == "lora" else mmpreproj.inject(base, config)
        left = pf.delete_adapter(model, "default", prefix="lora_" if kind == "lora" else "preproj")
        seen[kind] = (left, torch.equal(model(IDS).logits, want))
    assert seen["preproj"] == seen["lora"] == ([], True)


@pytest.mark.parametrize("names", [["default"], ["__base__"], ["default"] * 3], ids=["one", "base", "three"])
@pytest.mark.parametrize("route", ["inject", "peft"])
def test_a_mixed_batch_of_one_name_per_row_is_counted_on_every_route(names, route):
    base = tiny_neox()
    model = mmpreproj.inject(base) if route == "inject" else get_peft_model(base, PreProjConfig())
    with pytest.raises(ValueError, match=r"names for 2 rows|pass one adapter name per row"):
        model(input_ids=IDS, adapter_names=names)
    model(input_ids=IDS, adapter_names=["default", "default"])  # the right count runs


def test_inject_leaves_an_inference_mode_config_frozen_as_peft_does():
    ours = mmpreproj.inject(tiny_neox(), PreProjConfig(inference_mode=True))
    theirs = inject_adapter_in_model(PreProjConfig(inference_mode=True), tiny_neox())
    lora = inject_adapter_in_model(LoraConfig(target_modules=["query_key_value"], inference_mode=True), tiny_neox())
    for model in (ours, theirs, lora):
        assert not any(p.requires_grad for p in model.parameters())
    assert any(p.requires_grad for p in mmpreproj.inject(tiny_neox()).parameters())


def test_inject_refuses_a_host_argument_against_the_config_host():
    model = tiny_neox()
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"inject\(host='gpt_neox'\) and its config's host='llama'"):
        mmpreproj.inject(model, PreProjConfig(host="llama"), host="gpt_neox")
    assert_unchanged(model, before)


@pytest.mark.parametrize("layers", [[0, 1], [-2, -1], [1, 0]])
@pytest.mark.parametrize("route", ["add_adapter", "load_adapter"])
def test_an_added_adapter_naming_the_same_blocks_another_way_is_added(tmp_path, layers, route):
    model = get_peft_model(tiny_neox(), PreProjConfig())
    if route == "add_adapter":
        model.add_adapter("b", PreProjConfig(layers=layers))
    else:
        saved = get_peft_model(tiny_neox(), PreProjConfig(layers=layers))
        saved.save_pretrained(tmp_path)
        mmpreproj.load_adapter(model, tmp_path, adapter_name="b")
    assert mmpreproj.adapter_names(model) == ["default", "b"]
    with pytest.raises(ValueError, match=r"config\.layers=\[0\], the injection has None"):
        model.add_adapter("c", PreProjConfig(layers=[0]))  # other blocks: still refused


def test_estimate_refuses_a_part_the_shape_does_not_have():
    with pytest.raises(ValueError, match=r"estimate: PreProjConfig\.parts=\['vision'\].*None or \['language'\]"):
        mmpreproj.estimate(PreProjConfig(parts=["vision"]), "llama-3-8b")
    assert mmpreproj.estimate(PreProjConfig(parts=["language"]), "llama-3-8b").preproj > 0


def test_for_budget_names_a_model_that_is_not_one():
    with pytest.raises(TypeError, match=r"for_budget\(model=\.\.\.\): got str"):
        PreProjConfig.for_budget("neox", 0.05)


def test_adapter_disabled_refuses_a_model_without_adapters():
    with pytest.raises(ValueError, match="holds no mmpreproj modules"), mmpreproj.adapter_disabled(tiny_neox()):
        pass


def test_inference_mode_must_be_a_bool():
    with pytest.raises(ValueError, match=r"PreProjConfig\.inference_mode='x'; must be a bool"):
        PreProjConfig(inference_mode="x")


def test_peft_model_route_unchanged_by_the_one_name_count(tmp_path):
    """The PeftModel route counted before (its model-level hook); with generate's beams it still repeats the names."""
    model = get_peft_model(tiny_neox(), PreProjConfig())
    model.save_pretrained(tmp_path)
    loaded = PeftModel.from_pretrained(tiny_neox(), str(tmp_path))
    out = loaded.generate(input_ids=IDS, adapter_names=["default", "__base__"], max_new_tokens=2, num_beams=2)
    assert out.shape == (2, 9)


@pytest.mark.parametrize("host", [None, "gpt_neox"])
def test_an_example_input_the_host_cannot_run_is_refused_naming_it(host):
    """The calls audit's last two findings: the host's own error from deep inside torch named nothing we take."""
    model = tiny_neox()
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"inject\(example_input=...\): GPTNeoXForCausalLM failed .*TypeError"):
        mmpreproj.inject(model, PreProjConfig(), host=host, example_input="not a batch")
    assert_unchanged(model, before)


def test_a_traced_model_names_the_example_input_it_could_not_run():
    from tests.helpers.trace_zoo import build

    model = build("XLMRobertaXL", "XLMRobertaXLModel")
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"the forward on example_input= raised .* Pass a batch its forward takes"):
        mmpreproj.inject(model, PreProjConfig(), example_input="not a batch")
    assert_unchanged(model, before)


@pytest.mark.parametrize("route", ["inject", "peft"])
def test_deleting_the_last_adapter_puts_modules_to_save_back_and_one_can_be_loaded_again(route, tmp_path):
    """After the last adapter the host runs alone: its `modules_to_save` back at the base's values and frozen, nothing
    to save (a clear refusal), and an adapter loaded again runs as saved; `unload` still restores the base."""
    base = tiny_neox()
    want = base(IDS).logits.detach()
    model = copy.deepcopy(base)
    config = PreProjConfig(modules_to_save=["lm_head"])
    model = mmpreproj.inject(model, config) if route == "inject" else get_peft_model(model, config)
    host = model if route == "inject" else model.base_model.model
    with torch.no_grad():
        for p in (*mmpreproj.injected_modules(host)[0].parameters(), host.lm_head.weight):
            if p.requires_grad:
                p.add_(0.05)
    trained = host(IDS).logits.detach()
    mmpreproj.save_adapter(model, tmp_path / "a")
    if route == "inject":
        mmpreproj.delete_adapter(model, "default")
    else:
        model.delete_adapter("default")
    assert torch.equal(host(IDS).logits, want)
    assert not any(p.requires_grad for p in model.parameters())
    with pytest.raises(ValueError, match="no adapter is loaded: every one was deleted"):
        mmpreproj.save_adapter(model, tmp_path / "b")
    mmpreproj.load_adapter(model, tmp_path / "a", adapter_name="again")
    mmpreproj.set_adapter(model, "again")
    assert torch.equal(host(IDS).logits, trained)
    mmpreproj.unload(host)
    assert torch.equal(host(IDS).logits, want)


@pytest.mark.parametrize("route", ["inject", "peft"])
def test_a_mixed_batch_under_gradient_checkpointing_is_refused_not_silently_wrong(route):
    """The blocks run again in backward after the call, without the names: reentrant checkpointing gave other
    gradients, non-reentrant a CheckpointError (found by bench/change_audit.py). Under no_grad it still runs."""
    base = tiny_neox()
    model = mmpreproj.inject(base) if route == "inject" else get_peft_model(base, PreProjConfig())
    host = model if route == "inject" else model.base_model.model
    host.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    before = snapshot(model)
    with pytest.raises(ValueError, match="a mixed-adapter batch with gradient checkpointing on is refused"):
        model(IDS, adapter_names=["default", "__base__"])
    assert_unchanged(model, before)
    with torch.no_grad():
        mixed = model(IDS, adapter_names=["default", "__base__"]).logits
        assert torch.equal(mixed[0], model(IDS[:1]).logits[0])


def test_after_the_last_delete_a_mixed_batch_naming_a_waiting_adapter_is_refused_and_the_state_dict_too(tmp_path):
    """With our own modules_to_save trained in place, the host holds the base's values once every adapter is gone:
    rows of an adapter loaded again but not active would run through them (found by bench/change_audit.py)."""
    model = mmpreproj.inject(tiny_neox(), PreProjConfig(modules_to_save=["lm_head"]))
    mmpreproj.save_adapter(model, tmp_path / "a")
    mmpreproj.delete_adapter(model, "default")
    with pytest.raises(ValueError, match="no adapter is loaded"):
        mmpreproj.adapter_state_dict(model)
    mmpreproj.load_adapter(model, tmp_path / "a", adapter_name="tr")
    with pytest.raises(ValueError, match=r"rows of \['tr'\] would run through the modules_to_save of the base"):
        model(IDS, adapter_names=["tr", "tr"])
    with torch.no_grad():
        assert torch.equal(model(IDS, adapter_names=["__base__", "__base__"]).logits, model(IDS).logits)
