"""The seams issue 11 closed: writes through a wrapper, one assets locator and one hub probe, one definition of the
methods, the method tag an adapter folder carries, one adapter key format, and the removed fused path."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from torch import nn

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj.hosts.spec import AttentionCall
from mmpreproj.method.convert import model_keys, parse_block_key
from mmpreproj.method.files import ADAPTER_CONFIG_NAME
from mmpreproj.method.layer import PreProjAttention
from mmpreproj.modules import BaseLayerWrapper, ContentSkip, PreProjection
from tests.helpers.adapter_json import load_desc
from tests.helpers.zoo import tiny_neox

# --- writes through a wrapper: only the listed host switches reach the base layer ------------------------------


def _timm_attention() -> nn.Module:
    from timm.layers import Attention

    return Attention(16, num_heads=2)


def test_a_listed_write_reaches_the_base_and_any_other_write_stays_on_the_wrapper():
    base = _timm_attention()
    w = PreProjAttention(base, AttentionCall(((0, "x"),), None), PreProjection(16), ContentSkip(16), 0)
    assert w.num_heads == 2  # reads are forwarded
    w.fused_attn = not base.fused_attn  # on the list (timm's switch): the base's own value changes
    assert w.fused_attn is base.fused_attn and "fused_attn" not in vars(w)
    w.num_heads = 7  # not on the list: a host attribute of the same name is left alone
    assert base.num_heads == 2 and w.num_heads == 7
    w.brand_new = 1
    assert not hasattr(base, "brand_new")


def test_a_wrapper_setting_its_own_copy_of_a_host_attribute_keeps_it_to_itself():
    """As the vision rotary wrapper sets `num_prefix_tokens`, which timm's EvaAttention also has."""

    class Host(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.num_prefix_tokens = 1

    class Wrapper(BaseLayerWrapper):
        def __init__(self, base: nn.Module) -> None:
            super().__init__()
            self.base_layer = base
            self.num_prefix_tokens = 0

    host = Host()
    w = Wrapper(host)
    assert w.num_prefix_tokens == 0 and host.num_prefix_tokens == 1
    assert w.get_base_layer() is host


def test_timm_toggle_through_an_injected_vit_selects_the_manual_path():
    import timm

    torch.manual_seed(0)
    vit = timm.models.vision_transformer.VisionTransformer(
        img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3
    ).eval()
    mmpreproj.inject(vit, PreProjConfig(skip_init_std=0.05))
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        fused = vit(x)
        vit.blocks[0].attn.fused_attn = False  # through the wrapper
        assert vit.blocks[0].attn.base_layer.fused_attn is False
        torch.testing.assert_close(vit(x), fused, atol=1e-5, rtol=1e-5)


# --- one assets locator, one hub probe ---------------------------------------------------------------------


def test_defaults_under_assets_honour_mmpreproj_assets(monkeypatch, tmp_path):
    from mmpreproj.data.assets import ASSETS_ENV, asset_path, repo_root, resolve_path
    from mmpreproj.train import sources
    from mmpreproj.train.presets import get_preset

    assert sources.resolve_path is resolve_path  # the trainer uses the same locator
    default = get_preset("mini").model  # "assets/mini-pythia"
    monkeypatch.delenv(ASSETS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)  # not the repo: found relative to the package
    assert resolve_path(default) == repo_root() / default
    copy = tmp_path / "elsewhere" / "mini-pythia"
    copy.mkdir(parents=True)
    monkeypatch.setenv(ASSETS_ENV, str(tmp_path / "elsewhere"))
    assert resolve_path(default) == copy == asset_path("mini-pythia")
    assert resolve_path("assets/not-there") is None and resolve_path("no/such/file.txt") is None


def test_training_data_from_the_hub_uses_the_one_hub_probe(monkeypatch):
    from mmpreproj.data import DataUnavailableError, hub
    from mmpreproj.train.sources import read_lines

    calls = []
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: calls.append(timeout) or False)
    with pytest.raises(DataUnavailableError, match="no network"):
        next(read_lines("some-org/some-dataset"))
    assert calls  # the data.hub probe answered


# --- one definition of the methods; the tag an adapter carries ---------------------------------------------


def test_every_list_of_methods_is_read_from_the_one_table():
    from mmpreproj.experiments import reproduce, sweep  # noqa: F401
    from mmpreproj.train import config as train_config
    from mmpreproj.train.methods import METHOD_SPECS, METHODS, check_methods
    from mmpreproj_tables.tables import PAPER_METHODS

    assert tuple(METHOD_SPECS) == METHODS and train_config.METHODS is METHODS
    assert reproduce.DEFAULT_METHODS == METHODS and reproduce.DEMO_METHODS == PAPER_METHODS
    assert PAPER_METHODS == ("preproj", "skip", "preproj_skip", "lora", "preproj_lora")  # the paper's five
    for name, spec in METHOD_SPECS.items():  # the core's tag names the same method
        if not spec.lora:
            assert PreProjConfig(preproj=spec.preproj, skip=spec.skip).method == name
    with pytest.raises(ValueError, match=r"unknown method 'lora2'; allowed values: \['preproj'"):
        check_methods(["skip", "lora2"])


def test_saved_adapter_carries_type_method_and_base(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    mmpreproj.inject(model, PreProjConfig(preproj=False))
    mmpreproj.save_adapter(model, tmp_path / "a")
    assert json.loads((tmp_path / "a" / ADAPTER_CONFIG_NAME).read_text())["peft_type"] == "PREPROJ"
    desc = load_desc(tmp_path / "a" / ADAPTER_CONFIG_NAME)
    assert desc["adapter_type"] == "mmpreproj" and desc["method"] == "skip"
    assert desc["base_model_name_or_path"] == str(tiny_model_dir)
    assert "fuse_qkv_skip" not in desc["config"]
    built = mmpreproj.inject(tiny_neox(), PreProjConfig())
    mmpreproj.save_adapter(built, tmp_path / "b")
    desc = load_desc(tmp_path / "b" / ADAPTER_CONFIG_NAME)
    assert desc["method"] == "preproj_skip" and desc["base_model_name_or_path"] is None  # built in code


_V01_CONFIG_FIELDS = (
    "preproj",
    "skip",
    "expansion",
    "activation",
    "init",
    "skip_init_std",
    "layers",
    "freeze_base",
    "compute_dtype",
    "library_version",
)


def test_an_adapter_saved_before_the_tags_still_loads_and_is_recognised(tmp_path, tokens):
    model = mmpreproj.inject(tiny_neox(), PreProjConfig(skip=False, init="paper"))
    mmpreproj.save_adapter(model, tmp_path)
    cfg_file = tmp_path / ADAPTER_CONFIG_NAME
    old_slot = {"preproj": "preproj", "preproj_skip": "skip"}
    tensors = {  # keyed blocks.{i}.*, as mmpreproj 0.1.0 keyed the file
        f"blocks.{w.block_index}.{old_slot[slot]}.{k}": v
        for w in mmpreproj.injected_modules(model)
        for slot, m in zip(w.adapter_layer_names, w.slots())
        if m is not None
        for k, v in m.state_dict().items()
    }
    desc = load_desc(cfg_file)  # written as mmpreproj 0.1.0 wrote it: the old layout, without the tags
    for k in ("adapter_type", "method", "base_model_name_or_path"):
        del desc[k]
    for k in ("weights_digest", "tensor_shapes"):  # written since issue 31
        desc.pop(k, None)
    desc["config"] = {k: v for k, v in desc["config"].items() if k in _V01_CONFIG_FIELDS}
    desc["config"]["fuse_qkv_skip"] = False
    cfg_file.write_text(json.dumps(desc))
    safetensors = pytest.importorskip("safetensors.torch")
    safetensors.save_file(tensors, str(tmp_path / "adapter_model.safetensors"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "unknown key" or deprecation warning for an old file
        fresh = mmpreproj.load_adapter(tiny_neox(), tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(fresh(tokens).logits, model(tokens).logits)
    desc["method"] = "lora"  # a tag that is not ours
    cfg_file.write_text(json.dumps(desc))
    with pytest.raises(ValueError, match="method='lora' is not an mmpreproj adapter method"):
        mmpreproj.load_adapter(tiny_neox(), tmp_path)


def test_load_adapter_reads_a_peft_lora_folder_as_peft_and_names_weights_that_do_not_match(tmp_path):
    (tmp_path / ADAPTER_CONFIG_NAME).write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(tmp_path / "adapter_model.safetensors"))
    model = tiny_neox()
    with pytest.raises(
        ValueError,
        match=r"peft adapter at .* does not match its config: missing \[.*lora_A.*\], "
        r"unexpected \['x'\] \(nothing was loaded\)",
    ):
        mmpreproj.load_adapter(model, tmp_path)
    assert not any("lora_" in n for n, _ in model.named_modules())  # peft's layers were taken off again


# --- one adapter key format: the model's own keys; the old block-index keys read by the legacy reader ---------


def test_adapter_keys_are_the_model_keys_without_the_adapter_name_and_old_keys_map_onto_them():
    model = mmpreproj.inject(tiny_neox(), PreProjConfig())
    sd = mmpreproj.adapter_state_dict(model)
    model_keys_ = {k for k in model.state_dict() if ".default." in k}
    assert set(sd) == {k.replace(".default.", ".") for k in model_keys_}
    assert "gpt_neox.layers.1.attention.preproj_skip.proj.weight" in sd
    pairs = [(n, w) for n, w in model.named_modules() if isinstance(w, PreProjAttention)]
    old = {"blocks.1.skip.proj.weight": 1, "blocks.0.preproj.up.weight": 2, "modules.head.0.weight": 3}
    assert model_keys(old, pairs, {"head": "lm_head"}) == {
        "gpt_neox.layers.1.attention.preproj_skip.proj.weight": 1,
        "gpt_neox.layers.0.attention.preproj.up.weight": 2,
        "lm_head.0.weight": 3,
    }
    assert parse_block_key("modules.projector.0.weight") == (None, "projector", "0.weight")
    for bad in ("blocks.x.skip.w", "blocks.1", "layers.1.skip.w", "modules.p", "blocks.0.attn.preproj.w"):
        assert parse_block_key(bad) is None
    assert model_keys(sd, pairs, {}) == sd  # today's keys pass unchanged


# --- the removed fused path -----------------------------------------------------------------------------------


def test_fuse_qkv_skip_is_refused_with_the_reason_and_false_is_accepted():
    with pytest.raises(ValueError, match="fuse_qkv_skip was removed .* no reliable speed-up"):
        PreProjConfig(fuse_qkv_skip=True)
    with pytest.raises(ValueError, match="fuse_qkv_skip was removed"):
        PreProjConfig.from_dict({"fuse_qkv_skip": True})
    with pytest.warns(DeprecationWarning, match="fuse_qkv_skip was removed"):
        assert PreProjConfig(fuse_qkv_skip=False) == PreProjConfig()
    assert not hasattr(mmpreproj, "set_fused")
