"""save_adapter / load_adapter / unload and the errors that must leave a model untouched."""

from __future__ import annotations

import json

import pytest
import torch

import mmpreproj
from mmpreproj import PreProjConfig
from tests.helpers.adapter_json import dump_desc, load_desc
from tests.helpers.snapshots import assert_unchanged, snapshot
from tests.helpers.zoo import tiny_neox


@pytest.fixture
def trained_adapter(tmp_path, tokens):
    model = tiny_neox()
    mmpreproj.inject(model, PreProjConfig(skip_init_std=0.05))
    with torch.no_grad():
        for w in mmpreproj.injected_modules(model):
            for p in w.parameters():
                if p.requires_grad:
                    p.add_(0.01 * torch.randn_like(p))
    path = mmpreproj.save_adapter(model, tmp_path / "adapter")
    return path, model(tokens).logits.detach()


def test_save_writes_only_injected_weights(trained_adapter):
    path, _ = trained_adapter
    from safetensors.torch import load_file

    tensors = load_file(str(path / "adapter_model.safetensors"))
    assert set(tensors) == {
        f"base_model.model.gpt_neox.layers.{i}.attention.{k}"
        for i in (0, 1)
        for k in ("preproj.up.weight", "preproj.down.weight", "preproj_skip.proj.weight")
    }  # peft's keys
    assert json.loads((path / "adapter_config.json").read_text())["peft_type"] == "PREPROJ"
    desc = load_desc(path / "adapter_config.json")
    assert desc["host"] == "gpt_neox" and desc["hidden_size"] == 32 and desc["num_blocks"] == 2
    assert desc["library_version"] == mmpreproj.__version__
    assert not list(path.glob("*.tmp"))


def test_load_round_trip_with_other_seed(trained_adapter, tokens):
    path, expected = trained_adapter
    torch.manual_seed(1234)
    fresh = tiny_neox()  # same base weights (seed 0 inside), different RNG afterwards
    torch.manual_seed(999)
    mmpreproj.load_adapter(fresh, path)
    torch.testing.assert_close(fresh(tokens).logits, expected, atol=0, rtol=0)
    assert mmpreproj.trainable_report(fresh).trainable == 0  # loaded for inference by default, as peft does
    again = mmpreproj.load_adapter(tiny_neox(), path, is_trainable=True)
    r = mmpreproj.trainable_report(again)
    assert r.trainable == r.injected > 0  # is_trainable=True: the adapter trains, the saved config froze the base


def test_unload_restores_exact_modules(tokens):
    model = tiny_neox()
    originals = [layer.attention for layer in model.gpt_neox.layers]
    ref = model(tokens).logits
    grads = {n: p.requires_grad for n, p in model.named_parameters()}
    mmpreproj.inject(model)
    assert not torch.equal(model(tokens).logits, ref)
    mmpreproj.unload(model)
    assert [layer.attention for layer in model.gpt_neox.layers] == originals
    assert not mmpreproj.is_injected(model) and not mmpreproj.injected_modules(model)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == grads
    assert torch.equal(model(tokens).logits, ref)
    mmpreproj.inject(model)  # can inject again after unload


def test_adapter_disabled_gives_base_outputs(tokens):
    model = tiny_neox()
    ref = model(tokens).logits
    mmpreproj.inject(model)
    with mmpreproj.adapter_disabled(model):
        assert torch.equal(model(tokens).logits, ref)
    assert not torch.equal(model(tokens).logits, ref)


def test_error_model_without_attention_says_so_first():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    snap = snapshot(model)
    with pytest.raises(ValueError, match="^mmpreproj found no attention layer in Sequential"):
        mmpreproj.inject(model)
    assert_unchanged(model, snap)


def test_error_inject_twice_leaves_model_untouched():
    model = tiny_neox()
    mmpreproj.inject(model)
    snap = snapshot(model)
    with pytest.raises(RuntimeError, match="already"):
        mmpreproj.inject(model)
    assert_unchanged(model, snap)


def test_error_bad_layer_index_leaves_model_untouched():
    model = tiny_neox()
    snap = snapshot(model)
    with pytest.raises(ValueError, match="layers"):
        mmpreproj.inject(model, PreProjConfig(layers=[7]))
    assert_unchanged(model, snap)


@pytest.mark.parametrize(
    "overrides, field",
    [({"hidden_size": 48}, "hidden_size"), ({"num_hidden_layers": 3}, "num_blocks")],
)
def test_error_adapter_for_other_shape(trained_adapter, overrides, field):
    path, _ = trained_adapter
    model = tiny_neox(**overrides)
    snap = snapshot(model)
    with pytest.raises(ValueError, match=field):
        mmpreproj.load_adapter(model, path)
    assert_unchanged(model, snap)


@pytest.mark.parametrize(
    "damage", ["missing_weights", "missing_config", "corrupt_weights", "corrupt_config", "wrong_keys"]
)
def test_error_missing_or_corrupt_files(trained_adapter, damage):
    path, _ = trained_adapter
    weights, config = path / "adapter_model.safetensors", path / "adapter_config.json"
    if damage == "missing_weights":
        weights.unlink()
    elif damage == "missing_config":
        config.unlink()
    elif damage == "corrupt_weights":
        weights.write_bytes(weights.read_bytes()[:50])
    elif damage == "corrupt_config":
        config.write_text("{not json")
    else:
        desc = load_desc(config)
        desc["config"]["skip"] = False  # config says no skip, weights hold one
        dump_desc(config, desc)
    model = tiny_neox()
    snap = snapshot(model)
    with pytest.raises((FileNotFoundError, ValueError), match="adapter"):
        mmpreproj.load_adapter(model, path)
    assert_unchanged(model, snap)


def test_unload_without_injection_errors():
    with pytest.raises(RuntimeError, match="no mmpreproj"):
        mmpreproj.unload(tiny_neox())


def test_set_adapter_state_dict_copies_in_place_and_refuses_mismatches(trained_adapter, tokens):
    path, trained_logits = trained_adapter
    model = mmpreproj.inject(tiny_neox(), PreProjConfig(skip_init_std=0.05))
    params = [p for w in mmpreproj.injected_modules(model) for p in w.parameters()]
    _, tensors = mmpreproj.method.files.read_adapter(path)
    snap = snapshot(model)
    bad = dict(tensors)
    bad.pop(next(iter(bad)))
    with pytest.raises(ValueError, match="missing"):
        mmpreproj.set_adapter_state_dict(model, bad)
    wrong = {k: (v[:1] if i == 0 else v) for i, (k, v) in enumerate(tensors.items())}
    with pytest.raises(ValueError, match="shape"):
        mmpreproj.set_adapter_state_dict(model, wrong)
    assert_unchanged(model, snap)
    assert not torch.allclose(model(tokens).logits, trained_logits)
    mmpreproj.set_adapter_state_dict(model, tensors)
    assert [id(p) for w in mmpreproj.injected_modules(model) for p in w.parameters()] == [id(p) for p in params]
    torch.testing.assert_close(model(tokens).logits, trained_logits, rtol=0, atol=0)
