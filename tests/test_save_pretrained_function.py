"""`mmpreproj.save_pretrained(model, DIR)`, the public whole-model save: its folder reloads bit-exact through
`mmpreproj.from_pretrained`, its base half through a plain `AutoModelForCausalLM.from_pretrained` bit-equal to
the original base; a torn pair is refused; a model it cannot save is refused before anything is written. The
instance method `inject` still installs is the same save (kept while transformers gates its own adapter save on
a peft that mmpreproj does not support; the last test fails once that gate is met)."""

from __future__ import annotations

import copy
import importlib.metadata
import shutil

import peft
import pytest
import torch
from packaging.version import Version
from transformers import AutoModelForCausalLM
from transformers.integrations import peft as hf_peft

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj.folders.files import PRETRAINED_ADAPTER_DIR
from mmpreproj.folders.pretrained_save import load_base_keys
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


def test_the_installed_instance_method_is_the_same_save(tmp_path, base_dir):
    """What a Trainer calls on an injected model, `model.save_pretrained(DIR, state_dict=...)`, positional
    arguments after `state_dict` included, writes what the function writes."""
    model = _trained(base_dir)
    assert "save_pretrained" in vars(model)  # installed by inject (see the last test for why it is kept)
    sd = model.state_dict()
    mmpreproj.save_pretrained(model, tmp_path / "fn", state_dict=sd, max_shard_size="20KB")
    model.save_pretrained(tmp_path / "method", True, sd, False, "20KB")  # push_to_hub, max_shard_size by position
    fn = {p.relative_to(tmp_path / "fn") for p in (tmp_path / "fn").rglob("*") if p.is_file()}
    method = {p.relative_to(tmp_path / "method") for p in (tmp_path / "method").rglob("*") if p.is_file()}
    assert fn == method and any(p.name.startswith("model-00001-of-") for p in fn)
    out = model(X).logits
    for folder in ("fn", "method"):
        assert torch.equal(mmpreproj.from_pretrained(tmp_path / folder).eval()(X).logits, out)


def _patched(model) -> tuple[bool, int]:
    """(whether the instance has its own save_pretrained, how many base-key load hooks it holds)."""
    hooks = [h for h in model._load_state_dict_pre_hooks.values() if getattr(h, "hook", h) is load_base_keys]
    return "save_pretrained" in vars(model), len(hooks)


@pytest.mark.parametrize(
    "route", ["get_peft_model", "inject_adapter_in_model", "PeftModel.from_pretrained", "transformers.load_adapter"]
)
def test_peft_routes_leave_the_instance_alone(tmp_path, base_dir, route):
    """peft's routes build the same tuner but patch nothing on the model (as for LoRA: a PeftModel saves itself);
    only our own API (`inject`, `load_adapter`) installs the whole-model save."""
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
    assert mmpreproj.is_injected(inner) and _patched(inner) == (False, 0)
    mmpreproj.save_adapter(inner, tmp_path / "ours")
    loaded = mmpreproj.load_adapter(AutoModelForCausalLM.from_pretrained(base_dir), tmp_path / "ours")
    assert _patched(loaded) == (True, 1) and _patched(_trained(base_dir)) == (True, 1)


def test_unload_takes_off_what_inject_put_on_and_a_copy_has_its_own(base_dir):
    model = _trained(base_dir)
    twin = copy.deepcopy(model)
    assert _patched(twin) == (True, 1) and twin.save_pretrained.args == (twin,)  # bound to the copy
    mmpreproj.unload(twin)
    assert _patched(twin) == (False, 0) and _patched(model) == (True, 1)
    own = lambda *a, **k: None  # noqa: E731  (the user's own override, set after inject, is theirs)
    model.save_pretrained = own
    mmpreproj.unload(model)
    assert vars(model)["save_pretrained"] is own and _patched(model)[1] == 0


def test_the_class_method_waits_on_transformers_peft_gate():
    """Why `inject` still installs the instance method: transformers saves a model's adapters in peft's format
    itself (`_hf_peft_config_loaded`, `get_adapter_state_dict`, `active_adapters`) only with peft >= its
    MIN_PEFT_VERSION, above the peft mmpreproj supports. When this fails, register the adapter with transformers
    instead (issue 29 item 1) and drop the instance method."""
    installed = Version(importlib.metadata.version("peft"))
    assert installed < Version(hf_peft.MIN_PEFT_VERSION)
    with pytest.raises(ValueError, match="version of PEFT you are using is not compatible"):
        hf_peft.check_peft_version(min_version=hf_peft.MIN_PEFT_VERSION)
