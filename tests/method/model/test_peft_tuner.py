"""PREPROJ as a peft method: `peft.get_peft_model(model, PreProjConfig())` is `mmpreproj.inject` behind a
`PeftModel`, its files are peft adapters that peft's own loaders read, and old mmpreproj folders still load."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import peft
import pytest
import torch
from peft import PeftConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj.method import MERGE_REFUSED, PREPROJ, PreProjModel, register_preproj
from tests.helpers.procs import HANG_GUARD_S
from tests.helpers.zoo import tiny_neox

TOKENS = torch.tensor([[1, 5, 9, 3, 7, 2, 11, 4]])
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "legacy_adapters"


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(cfg).eval()


def tiny_vit(seed: int = 0):
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    return VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5).eval()


def _trained(model: torch.nn.Module) -> torch.nn.Module:
    """Move every trainable weight off its init, deterministically (a zero-init down-projection hides bugs)."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


def _out(model, x):
    with torch.no_grad():
        y = model(x)
    return y.logits if hasattr(y, "logits") else y


HOSTS = {"gpt_neox": (tiny_neox, TOKENS % 32), "llama": (tiny_llama, TOKENS), "timm_vit": (tiny_vit, None)}


def _input(name):
    builder, x = HOSTS[name]
    return x if x is not None else torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("name", list(HOSTS))
def test_get_peft_model_is_inject_behind_a_peft_model(name):
    builder, _ = HOSTS[name]
    x = _input(name)
    config = PreProjConfig(skip_init_std=0.02)
    torch.manual_seed(11)
    ours = mmpreproj.inject(builder(), copy.deepcopy(config))
    torch.manual_seed(11)
    theirs = get_peft_model(builder(), copy.deepcopy(config))
    assert isinstance(theirs, PeftModel) and isinstance(theirs.base_model, PreProjModel)
    assert torch.equal(_out(ours, x), _out(theirs, x))
    trainable = {n for n, p in ours.named_parameters() if p.requires_grad}
    assert trainable and trainable == {
        n.removeprefix("base_model.model.") for n, p in theirs.named_parameters() if p.requires_grad
    }
    assert theirs.get_nb_trainable_parameters()[0] == mmpreproj.trainable_report(ours).trainable
    assert theirs.base_model.targeted_module_names == ours.mmpreproj_state.modules


@pytest.mark.parametrize("name", list(HOSTS))
def test_peft_save_and_from_pretrained_round_trip_bit_exact_and_frozen_by_default(tmp_path, name):
    builder, _ = HOSTS[name]
    x = _input(name)
    model = _trained(get_peft_model(builder(), PreProjConfig()))
    want = _out(model, x)
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "PREPROJ" and cfg["injection"]["host"] == name
    keys = set(load_file(str(tmp_path / "adapter_model.safetensors")))
    assert keys == {
        f"base_model.model.{m}.{slot}.{w}"
        for m in cfg["injection"]["modules"]
        for slot, w in (("preproj", "up.weight"), ("preproj", "down.weight"), ("preproj_skip", "proj.weight"))
    }
    again = PeftModel.from_pretrained(builder(), tmp_path)
    assert torch.equal(_out(again, x), want)
    assert not any(p.requires_grad for p in again.parameters())  # inference by default, as peft
    trainable = PeftModel.from_pretrained(builder(), tmp_path, is_trainable=True)
    assert trainable.get_nb_trainable_parameters()[0] == model.get_nb_trainable_parameters()[0]
    # the same folder through mmpreproj's loader, and mmpreproj's writer read by peft
    assert torch.equal(_out(mmpreproj.load_adapter(builder(), tmp_path), x), want)
    mmpreproj.save_adapter(model, tmp_path / "ours")
    assert set(load_file(str(tmp_path / "ours" / "adapter_model.safetensors"))) == keys
    assert torch.equal(_out(PeftModel.from_pretrained(builder(), tmp_path / "ours"), x), want)


def test_peft_config_from_pretrained_and_the_state_dict_functions(tmp_path):
    model = _trained(get_peft_model(tiny_neox(), PreProjConfig(expansion=0.5, skip=False)))
    model.save_pretrained(tmp_path)
    config = PeftConfig.from_pretrained(tmp_path)
    assert isinstance(config, PreProjConfig) and config.peft_type is PREPROJ
    assert (config.expansion, config.skip, config.inference_mode) == (0.5, False, True)
    sd = peft.get_peft_model_state_dict(model)
    assert sd and all(".preproj." in k and ".default." not in k for k in sd)
    other = get_peft_model(tiny_neox(), PreProjConfig(expansion=0.5, skip=False))
    assert not torch.equal(_out(other, TOKENS % 32), _out(model, TOKENS % 32))
    peft.set_peft_model_state_dict(other, sd)
    assert torch.equal(_out(other, TOKENS % 32), _out(model, TOKENS % 32))


def test_transformers_load_adapter_reads_the_folder(tmp_path):
    model = _trained(get_peft_model(tiny_llama(), PreProjConfig()))
    model.save_pretrained(tmp_path)
    base = tiny_llama()
    base.load_adapter(str(tmp_path))
    assert mmpreproj.is_injected(base)
    assert torch.equal(_out(base, TOKENS), _out(model, TOKENS))


def test_disable_add_set_delete_unload_and_the_refusals():
    base = tiny_neox()
    ref = _out(base, TOKENS % 32)
    model = _trained(get_peft_model(copy.deepcopy(base), PreProjConfig()))
    trained = _out(model, TOKENS % 32)
    with model.disable_adapter():
        assert torch.equal(_out(model, TOKENS % 32), ref)
    assert torch.equal(_out(model, TOKENS % 32), trained)
    model.add_adapter("fresh", PreProjConfig(init="identity", skip_init_std=0.0))
    assert model.active_adapter == "default" and torch.equal(_out(model, TOKENS % 32), trained)  # added inactive
    model.set_adapter("fresh")
    assert torch.equal(_out(model, TOKENS % 32), ref)  # identity init: the base
    fresh = [p for p in model.parameters() if p.requires_grad]
    live = {id(p) for w in mmpreproj.injected_modules(model) for m in w.slots() for p in m.parameters()}
    assert fresh and {id(p) for p in fresh} == live  # the fresh adapter is the one that trains now
    loss = model(TOKENS % 32, labels=TOKENS % 32).loss
    loss.backward()
    assert all(p.grad is not None for p in fresh)
    model.set_adapter("default")
    assert torch.equal(_out(model, TOKENS % 32), trained)
    model.delete_adapter("fresh")
    assert list(model.peft_config) == ["default"] and mmpreproj.adapter_names(model) == ["default"]
    with pytest.raises(ValueError, match="merge_and_unload: the pre-projection .* is nonlinear"):
        model.merge_and_unload()
    assert "nonlinear" in MERGE_REFUSED
    assert torch.equal(model(TOKENS % 32, adapter_names=["default"]).logits.detach(), trained)
    with pytest.raises(ValueError, match=r"adapter_names=.*\['other'\] are not loaded adapters"):
        model(TOKENS % 32, adapter_names=["default", "other"])
    unloaded = model.unload()
    assert not mmpreproj.is_injected(unloaded) and torch.equal(_out(unloaded, TOKENS % 32), ref)


def test_add_adapter_on_other_sites_is_refused_and_nothing_changes():
    model = get_peft_model(tiny_neox(), PreProjConfig())
    with pytest.raises(ValueError, match=r"add_adapter\('x'\): config.layers=\[0\].*same sites"):
        model.add_adapter("x", PreProjConfig(layers=[0]))
    assert list(model.peft_config) == ["default"] and mmpreproj.adapter_names(model) == ["default"]


@pytest.mark.slow
def test_registration_is_idempotent_and_a_process_without_mmpreproj_cannot_read_the_adapter(tmp_path):
    register_preproj()
    register_preproj()
    assert peft.mapping.PEFT_TYPE_TO_TUNER_MAPPING[PREPROJ] is PreProjModel
    assert peft.mapping.PEFT_TYPE_TO_CONFIG_MAPPING["PREPROJ"] is PreProjConfig
    get_peft_model(tiny_neox(), PreProjConfig()).save_pretrained(tmp_path)
    read = f"import peft; print(type(peft.PeftConfig.from_pretrained({str(tmp_path)!r})).__name__)"
    plain = subprocess.run([sys.executable, "-c", read], capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert plain.returncode != 0 and "PREPROJ" in plain.stderr  # what the README says fails without the import
    ok = subprocess.run(
        [sys.executable, "-c", "import mmpreproj; " + read], capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert ok.returncode == 0 and ok.stdout.strip() == "PreProjConfig", ok.stderr[-2000:]


def test_a_foreign_file_key_is_refused_naming_it(tmp_path):
    from safetensors.torch import save_file

    model = get_peft_model(tiny_neox(), PreProjConfig())
    model.save_pretrained(tmp_path)
    weights = tmp_path / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    tensors["base_model.model.gpt_neox.embed_in.weight"] = torch.zeros(32, 32)
    save_file(tensors, str(weights))
    cfg_file = tmp_path / "adapter_config.json"  # a hand-made file: no digest, so the key check is what refuses
    cfg = json.loads(cfg_file.read_text())
    del cfg["injection"]["weights_digest"]
    cfg_file.write_text(json.dumps(cfg))
    fresh = tiny_neox()
    with pytest.raises(ValueError, match=r"weight 'base_model.model.gpt_neox.embed_in.weight' belongs to no injected"):
        mmpreproj.load_adapter(fresh, tmp_path)
    assert not mmpreproj.is_injected(fresh)


# --- folders written before adapters were peft adapters (fixtures written by mmpreproj at 731f6e8) -------------


def _legacy_base():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    cfg = GPTNeoXConfig(
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        vocab_size=32,
        max_position_embeddings=64,
    )
    return GPTNeoXForCausalLM(cfg).eval()


LEGACY_IDS = torch.tensor([[1, 5, 9, 3, 7, 2]])


def _assert_legacy_logits(got: torch.Tensor, folder: str) -> None:
    """Equal to what the model gave when the folder was written, up to float reassociation: the fixture was
    written at one thread count and matmuls may sum in another order here (fp32 eps, scaled by the logits and
    the depth of the sums: 2 blocks of width 16)."""
    want = load_file(str(FIXTURES / folder / "logits.safetensors"))["logits"]
    tol = 64 * torch.finfo(torch.float32).eps * float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=0, atol=tol)


def test_legacy_fixtures_are_the_old_format():
    old = json.loads((FIXTURES / "preproj_skip" / "adapter_config.json").read_text())
    assert old["adapter_type"] == "mmpreproj" and "peft_type" not in old
    assert any(
        k.startswith("blocks.") for k in load_file(str(FIXTURES / "preproj_skip" / "adapter_model.safetensors"))
    )


def test_legacy_adapter_folder_loads_bit_exact():
    model = mmpreproj.load_adapter(_legacy_base(), FIXTURES / "preproj_skip")
    _assert_legacy_logits(_out(model, LEGACY_IDS), "preproj_skip")


def test_legacy_save_pretrained_folder_loads_bit_exact():
    model = mmpreproj.from_pretrained(FIXTURES / "save_pretrained")
    _assert_legacy_logits(_out(model.eval(), LEGACY_IDS), "save_pretrained")


@pytest.mark.parametrize("folder", ["preproj_lora_run", "preproj_lora_checkpoint"])
def test_legacy_preproj_lora_folders_of_both_layouts_load_bit_exact(folder):
    model = mmpreproj.load_adapter(_legacy_base(), FIXTURES / folder)
    _assert_legacy_logits(_out(model, LEGACY_IDS), folder)


def test_a_legacy_folder_converted_and_saved_again_is_a_peft_adapter(tmp_path):
    model = mmpreproj.load_adapter(_legacy_base(), FIXTURES / "preproj_skip")
    mmpreproj.save_adapter(model, tmp_path)
    again = PeftModel.from_pretrained(_legacy_base(), tmp_path)
    _assert_legacy_logits(_out(again, LEGACY_IDS), "preproj_skip")
