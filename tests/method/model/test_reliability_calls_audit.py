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
def test_deleting_the_only_adapter_through_peft_functional_is_refused(route):
    base = tiny_neox()
    model = mmpreproj.inject(base) if route == "inject" else get_peft_model(base, PreProjConfig())
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"delete_adapter\('default'\): it is the only adapter"):
        pf.delete_adapter(model, "default", prefix="preproj")
    assert_unchanged(model, before)
    assert mmpreproj.adapter_names(model) == ["default"]
    model(IDS)  # still runs


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
