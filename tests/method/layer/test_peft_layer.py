"""The wrapper as peft's tuner layer: the model's own `state_dict()` keys are the file keys (the adapter name
removed, as peft does for LoRA), peft's state-dict hook builds its result from the state dict it is handed (so a
sharded model's passes through untouched), and the old in-memory block-index keys still load bit-exact (an old
whole-model state dict through `set_adapter_state_dict`, not `load_state_dict`)."""

from __future__ import annotations

import shutil

import pytest
import torch
from peft import PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

import mmpreproj
from mmpreproj import PreProjConfig
from tests.helpers.zoo import tiny_neox


def _trained(model: torch.nn.Module, seed: int = 3) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


def test_file_keys_are_the_model_keys_without_the_adapter_name():
    model = _trained(get_peft_model(tiny_neox(), PreProjConfig()))
    ours = {k: v for k, v in model.state_dict().items() if ".preproj." in k or ".preproj_skip." in k}
    saved = get_peft_model_state_dict(model)
    assert ours and saved.keys() == {k.replace(".default.", ".") for k in ours}
    assert all(torch.equal(saved[k.replace(".default.", ".")], v) for k, v in ours.items())
    other = get_peft_model(tiny_neox(), PreProjConfig())
    set_peft_model_state_dict(other, saved)
    assert all(torch.equal(other.state_dict()[k], v) for k, v in ours.items())  # the same keys, round trip


def test_the_state_dict_hook_reads_the_state_dict_it_is_given_not_the_live_weights():
    model = get_peft_model(tiny_neox(), PreProjConfig())
    handed = {k: v.clone() + 1.0 for k, v in model.state_dict().items()}  # e.g. gathered from shards elsewhere
    saved = get_peft_model_state_dict(model, state_dict=handed)
    key = "base_model.model.gpt_neox.layers.0.attention.preproj.up.weight"
    live = model.base_model.model.gpt_neox.layers[0].attention.preproj["default"].up.weight
    assert torch.equal(saved[key], handed[key.replace(".preproj.", ".preproj.default.")])
    assert not torch.equal(saved[key], live)
    assert model.peft_config["default"].injection["weights_digest"].startswith("blake2b-named:")


def test_the_old_in_memory_block_index_keys_load_bit_exact():
    model = _trained(mmpreproj.inject(tiny_neox()))
    today = mmpreproj.adapter_state_dict(model)
    old_slot = {"preproj": "preproj", "preproj_skip": "skip"}
    old = {  # as `adapter_state_dict` keyed them before adapters were keyed by module path
        f"blocks.{w.block_index}.{old_slot[slot]}.{k}": v.clone()
        for w in mmpreproj.injected_modules(model)
        for slot, m in zip(w.adapter_layer_names, w.slots())
        for k, v in m.state_dict().items()
    }
    fresh = mmpreproj.inject(tiny_neox())
    mmpreproj.set_adapter_state_dict(fresh, old)
    got = mmpreproj.adapter_state_dict(fresh)
    assert got.keys() == today.keys() and all(torch.equal(got[k], today[k]) for k in today)
    tokens = torch.randint(1, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(fresh(tokens).logits, model(tokens).logits)


def test_a_full_state_dict_in_the_old_key_layout_is_refused_by_load_state_dict_and_loads_split():
    """A whole-model checkpoint written before the slots were keyed by adapter name (0.4). `inject` registers no
    `load_state_dict` pre-hook (issue 45), so `model.load_state_dict` of it fails loudly (torch's strict check
    names the old keys) and leaves the adapter as it was; its adapter part (today's adapter file keys) goes in
    through `set_adapter_state_dict`, the rest through `load_state_dict(strict=False)`, bit-exact."""
    model = _trained(mmpreproj.inject(tiny_neox()))
    sd = {k.replace(".default.", "."): v.clone() for k, v in model.state_dict().items()}
    fresh = mmpreproj.inject(tiny_neox())
    init = {k: v.clone() for k, v in mmpreproj.adapter_state_dict(fresh).items()}
    with pytest.raises(RuntimeError, match=r"Unexpected key\(s\) in state_dict: .*\.preproj\.up\.weight"):
        fresh.load_state_dict(sd)
    assert all(torch.equal(v, init[k]) for k, v in mmpreproj.adapter_state_dict(fresh).items())
    adapter = {k: v for k, v in sd.items() if ".preproj." in k or ".preproj_skip." in k}
    mmpreproj.set_adapter_state_dict(fresh, adapter)
    result = fresh.load_state_dict({k: v for k, v in sd.items() if k not in adapter}, strict=False)
    assert not result.unexpected_keys and all(".default." in k for k in result.missing_keys)
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in model.state_dict().items())


def _stacked_0_4() -> torch.nn.Module:
    from peft import LoraConfig

    from mmpreproj.method.stacked import stacked_peft_model

    pm = stacked_peft_model(tiny_neox(), LoraConfig(r=2, target_modules=["query_key_value"]), PreProjConfig())
    return _trained(pm)


def _as_0_4_lora_file(pm: torch.nn.Module, lora_file) -> None:
    """Rewrite today's LoRA file as mmpreproj 0.4 wrote it: LoRA's keys inside our wrapper, and ours beside them
    without the adapter name and with the `skip` slot."""
    from safetensors.torch import load_file, save_file

    lora = {k.replace(".attention.", ".attention.base_layer."): v for k, v in load_file(str(lora_file)).items()}
    ours = {
        f"base_model.model.{k}".replace(".preproj_skip.", ".skip."): v
        for k, v in mmpreproj.adapter_state_dict(pm).items()
    }
    assert any(".skip.proj." in k for k in ours) and any(".base_layer.query_key_value.lora_A" in k for k in lora)
    save_file({**lora, **ours}, str(lora_file))


def test_a_preproj_lora_folder_whose_lora_file_holds_ours_in_the_older_keys_loads_bit_exact(tmp_path):
    """mmpreproj 0.4 wrote our weights into LoRA's file too, without the adapter name and with the `skip` slot, and
    LoRA's keys inside our wrapper; ours at DIR, LoRA in DIR/lora."""
    pm = _stacked_0_4()
    mmpreproj.save_adapter(pm, tmp_path)
    pm.save_pretrained(str(tmp_path / "lora"))
    shutil.rmtree(tmp_path / "lora" / "preproj")
    _as_0_4_lora_file(pm, tmp_path / "lora" / "adapter_model.safetensors")
    tokens = torch.randint(1, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    loaded = mmpreproj.load_adapter(tiny_neox(), tmp_path)
    with torch.no_grad():
        assert torch.equal(loaded(tokens).logits, pm(tokens).logits)


def test_a_lora_checkpoint_of_0_4_resumed_by_peft_restores_our_weights_too(tmp_path):
    """A Trainer's resume of `preproj_lora` (`PeftModel.load_adapter` into the loaded name) of a checkpoint of
    mmpreproj 0.4, which held our weights in LoRA's file only (`...preproj.up.weight` / `...skip.proj.weight`)."""
    from peft import LoraConfig

    from mmpreproj.method.stacked import stacked_peft_model

    pm = _stacked_0_4()
    pm.save_pretrained(str(tmp_path))
    shutil.rmtree(tmp_path / "preproj")
    _as_0_4_lora_file(pm, tmp_path / "adapter_model.safetensors")
    resumed = stacked_peft_model(tiny_neox(), LoraConfig(r=2, target_modules=["query_key_value"]), PreProjConfig())
    resumed.load_adapter(str(tmp_path), "default", is_trainable=True)
    want, got = mmpreproj.adapter_state_dict(pm), mmpreproj.adapter_state_dict(resumed)
    assert all(torch.equal(got[k], want[k]) for k in want)
    lora_want = {n: p for n, p in pm.named_parameters() if "lora_" in n}
    lora_got = {n: p for n, p in resumed.named_parameters() if "lora_" in n}
    assert lora_want.keys() == lora_got.keys() and all(torch.equal(lora_got[k], lora_want[k]) for k in lora_want)


@pytest.mark.parametrize("name", ["up", "down", "proj", "preproj", "preproj_skip", "base_layer", "weight"])
def test_an_adapter_named_like_a_key_segment_saves_and_reloads_bit_exact(tmp_path, name):
    """peft removes the adapter name from a key by its position after the slot: a name that is also a slot,
    a weight or a module name must neither be cut elsewhere nor cut twice."""
    model = _trained(get_peft_model(tiny_neox(), PreProjConfig(), adapter_name=name))
    ours = [k for k, p in model.named_parameters() if p.requires_grad]  # the adapter's: the base is frozen
    saved = get_peft_model_state_dict(model, adapter_name=name)
    want = {
        k.replace(f".preproj.{name}.", ".preproj.").replace(f".preproj_skip.{name}.", ".preproj_skip.") for k in ours
    }
    assert len(saved) == 6 and saved.keys() == want
    model.save_pretrained(tmp_path)
    folder = tmp_path / name if name != "default" else tmp_path
    reloaded = PeftModel.from_pretrained(tiny_neox(), folder, adapter_name=name)
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids).logits, model(input_ids=ids).logits)
        assert not torch.equal(reloaded(input_ids=ids).logits, tiny_neox()(input_ids=ids).logits)


@pytest.mark.parametrize("names", [["lora_b"], [], "lora_b"], ids=["other-tuner", "none", "one-name"])
def test_a_layer_switch_to_names_it_does_not_hold_changes_nothing_an_empty_list_clears(names):
    """peft's switch over every tuner layer hands ours another tuner's names (a stacked LoRA switching its own): the
    layer stays as it is; an empty list is peft's "no active adapter" (its `delete_adapter` of the last one)."""
    (wrapper, *_) = mmpreproj.injected_modules(mmpreproj.inject(tiny_neox()))
    wrapper.set_adapter(names)
    assert wrapper.active_adapters == ([] if names == [] else ["default"])
