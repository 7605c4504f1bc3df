"""`mmpreproj.save_pretrained(model, DIR)`, the public whole-model save: its folder reloads bit-exact through
`mmpreproj.from_pretrained`, its base half through a plain `AutoModelForCausalLM.from_pretrained` bit-equal to
the original base; a torn pair is refused; a model it cannot save is refused before anything is written. It is the
only whole-model save: `inject` and `load_adapter` install nothing on the instance (issue 45), as peft's
`inject_adapter_in_model` installs nothing for LoRA, so `model.save_pretrained` is the class's own, which writes
the wrapped keys (transformers gates its own adapter save on a peft that mmpreproj does not support; the last
test fails once that gate is met)."""

from __future__ import annotations

import copy
import importlib.metadata
import shutil

import peft
import pytest
import torch
from packaging.version import Version
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from transformers.integrations import peft as hf_peft

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj.method.files import PRETRAINED_ADAPTER_DIR
from tests.helpers.zoo import tiny_neox

X = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(3))


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]


def _trained(base_dir, seed: int = 1):
    """A base loaded from `base_dir`, injected, every adapter weight moved off its init."""
    model = AutoModelForCausalLM.from_pretrained(base_dir).eval()
    mmpreproj.inject(model, PreProjConfig(skip_init_std=0.05))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.01 * torch.randn(p.shape, generator=gen))
    return model


@pytest.fixture
def base_dir(tmp_path):
    path = tmp_path / "base"
    tiny_neox().save_pretrained(path)
    return path


def test_it_is_the_public_api():
    assert "save_pretrained" in mmpreproj.__all__ and callable(mmpreproj.save_pretrained)


def test_the_folder_reloads_bit_exact_and_its_base_half_is_the_original_base(tmp_path, base_dir):
    original = _state(AutoModelForCausalLM.from_pretrained(base_dir))
    model = _trained(base_dir)
    before, out = _state(model), model(X).logits
    mmpreproj.save_pretrained(model, tmp_path / "full")
    _same(_state(model), before)  # the model is as it was

    again = mmpreproj.from_pretrained(tmp_path / "full").eval()
    _same(_state(again), before)
    assert torch.equal(again(X).logits, out)

    plain, info = AutoModelForCausalLM.from_pretrained(tmp_path / "full", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert not mmpreproj.is_injected(plain)
    _same(_state(plain), original)


def test_a_torn_pair_is_refused(tmp_path, base_dir):
    mmpreproj.save_pretrained(_trained(base_dir, seed=1), tmp_path / "a")
    mmpreproj.save_pretrained(_trained(base_dir, seed=2), tmp_path / "b")
    shutil.rmtree(tmp_path / "a" / PRETRAINED_ADAPTER_DIR)  # a's base beside b's adapter
    shutil.copytree(tmp_path / "b" / PRETRAINED_ADAPTER_DIR, tmp_path / "a" / PRETRAINED_ADAPTER_DIR)
    with pytest.raises(ValueError, match=r"written by different save_pretrained calls .*Nothing was loaded"):
        mmpreproj.from_pretrained(tmp_path / "a")
    with pytest.raises(ValueError, match="written by different save_pretrained calls"):
        mmpreproj.load_adapter(AutoModelForCausalLM.from_pretrained(tmp_path / "a"), tmp_path / "a")


def test_a_model_it_cannot_save_is_refused_before_anything_is_written(tmp_path, base_dir):
    unloaded = mmpreproj.unload(_trained(base_dir))
    wrapped = peft.get_peft_model(tiny_neox(), PreProjConfig())
    for model in (tiny_neox(), unloaded, wrapped):
        with pytest.raises(ValueError, match=r"not an inject\(\)ed transformers model .*nothing was written"):
            mmpreproj.save_pretrained(model, tmp_path / "x")
        assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("through", ["peft_lora", "inject"])
def test_after_inject_save_pretrained_is_the_classs_own_and_the_function_saves_whole(tmp_path, base_dir, through):
    """Side by side with peft's in-place route for LoRA (`inject_adapter_in_model`): after `mmpreproj.inject` the
    model's `save_pretrained` is its class's method, nothing of ours is on the instance, and that method writes
    the wrapped model's keys (`base_layer.` and the adapter's) as it does for LoRA, which a plain
    `from_pretrained` does not read as the base. `mmpreproj.save_pretrained(model, DIR)` writes the folder that a
    plain `from_pretrained` reloads bit-exact as the base, and `mmpreproj.from_pretrained` as the injected model;
    its keyword arguments (`state_dict=`, the class's `max_shard_size`) reach transformers."""
    model = AutoModelForCausalLM.from_pretrained(base_dir).eval()
    attrs = set(vars(model))
    if through == "peft_lora":
        peft.inject_adapter_in_model(peft.LoraConfig(r=2, target_modules=["query_key_value"]), model)
        adapter_key = "lora_A"
    else:
        model = _trained(base_dir)
        adapter_key = ".preproj."
    assert _ours(model) == (False, [])
    assert model.save_pretrained.__func__ is type(model).save_pretrained  # the class's own method
    assert set(vars(model)) - attrs <= {"peft_config", "mmpreproj_state"}  # peft's record, our bookkeeping
    model.save_pretrained(tmp_path / "class")
    keys = set(load_file(tmp_path / "class" / "model.safetensors"))
    assert any(".base_layer." in k for k in keys) and any(adapter_key in k for k in keys)
    assert not (tmp_path / "class" / PRETRAINED_ADAPTER_DIR).exists()
    if through == "peft_lora":
        return
    original = _state(AutoModelForCausalLM.from_pretrained(base_dir))
    sd, out = model.state_dict(), model(X).logits
    mmpreproj.save_pretrained(model, tmp_path / "fn", state_dict=sd, max_shard_size="20KB")
    assert any(p.name.startswith("model-00001-of-") for p in (tmp_path / "fn").iterdir())
    plain, info = AutoModelForCausalLM.from_pretrained(tmp_path / "fn", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    _same(_state(plain), original)
    assert torch.equal(mmpreproj.from_pretrained(tmp_path / "fn").eval()(X).logits, out)


def _ours(model) -> tuple[bool, list]:
    """(whether the instance has its own save_pretrained, the `load_state_dict` pre-hooks of mmpreproj's on any of
    its modules)."""
    hooks = [getattr(h, "hook", h) for m in model.modules() for h in m._load_state_dict_pre_hooks.values()]
    ours = [h for h in hooks if str(getattr(getattr(h, "func", h), "__module__", "")).startswith("mmpreproj")]
    return "save_pretrained" in vars(model), ours


@pytest.mark.parametrize(
    "route", ["get_peft_model", "inject_adapter_in_model", "PeftModel.from_pretrained", "transformers.load_adapter"]
)
def test_no_route_patches_the_instance(tmp_path, base_dir, route):
    """peft's routes build the same tuner and patch nothing on the model (as for LoRA: a PeftModel saves itself);
    our own API (`inject`, `load_adapter`) patches nothing either (issue 45): no `save_pretrained`, no
    `load_state_dict` pre-hook."""
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    if route == "get_peft_model":
        inner = peft.get_peft_model(model, PreProjConfig()).get_base_model()
    elif route == "inject_adapter_in_model":
        inner = peft.inject_adapter_in_model(PreProjConfig(), model)
    else:
        peft.get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir), PreProjConfig()).save_pretrained(tmp_path)
        if route == "PeftModel.from_pretrained":
            inner = peft.PeftModel.from_pretrained(model, tmp_path).get_base_model()
        else:  # transformers' own loader (peft's inject_adapter_in_model underneath)
            model.load_adapter(str(tmp_path))
            inner = model
    assert mmpreproj.is_injected(inner) and _ours(inner) == (False, [])
    mmpreproj.save_adapter(inner, tmp_path / "ours")
    loaded = mmpreproj.load_adapter(AutoModelForCausalLM.from_pretrained(base_dir), tmp_path / "ours")
    assert mmpreproj.is_injected(loaded) and _ours(loaded) == (False, [])
    assert _ours(_trained(base_dir)) == (False, [])


def test_unload_restores_the_instance_exactly_and_a_copy_has_nothing_of_ours(base_dir):
    """inject puts its bookkeeping (`mmpreproj_state`) and peft's `peft_config` record on the instance and nothing
    else; unload takes exactly those off: the instance's attributes are the very objects they were before, the
    `load_state_dict` pre-hooks as many. A deep copy carries nothing of ours either; the user's own override, set
    after inject, stays theirs."""
    model = AutoModelForCausalLM.from_pretrained(base_dir).eval()
    before, hooks = dict(vars(model)), len(model._load_state_dict_pre_hooks)
    mmpreproj.inject(model, PreProjConfig(skip_init_std=0.05))
    assert set(vars(model)) - set(before) == {"mmpreproj_state", "peft_config"} and _ours(model) == (False, [])
    twin = copy.deepcopy(model)
    assert _ours(twin) == (False, []) and twin.save_pretrained.__self__ is twin
    mmpreproj.unload(twin)
    assert _ours(twin) == (False, []) and set(vars(twin)) == set(before)
    own = lambda *a, **k: None  # noqa: E731
    model.save_pretrained = own
    mmpreproj.unload(model)
    assert vars(model)["save_pretrained"] is own
    del model.save_pretrained
    assert vars(model).keys() == before.keys() and all(vars(model)[k] is v for k, v in before.items())
    assert len(model._load_state_dict_pre_hooks) == hooks and _ours(model) == (False, [])


def test_the_class_method_waits_on_transformers_peft_gate():
    """Why the class's own `save_pretrained` of an injected model writes the wrapped keys, not peft's adapter
    files: transformers saves a model's adapters in peft's format itself (`_hf_peft_config_loaded`,
    `get_adapter_state_dict`, `active_adapters`) only with peft >= its MIN_PEFT_VERSION, above the peft mmpreproj
    supports. When this fails, register the adapter with transformers (issue 29 item 1), so the class's method
    saves it as it saves peft's own."""
    installed = Version(importlib.metadata.version("peft"))
    assert installed < Version(hf_peft.MIN_PEFT_VERSION)
    with pytest.raises(ValueError, match="version of PEFT you are using is not compatible"):
        hf_peft.check_peft_version(min_version=hf_peft.MIN_PEFT_VERSION)
