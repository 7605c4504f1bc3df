"""peft's own functional API (`peft.functional`) on a model we injected, in place and as a `PeftModel`, side by side
with LoRA under the same calls: `set_adapter` switches what runs, `set_requires_grad` what trains,
`get_`/`set_peft_model_state_dict` round-trip an adapter, `delete_adapter(prefix=...)` removes one; our own record
(`mmpreproj.active_adapter`, `adapter_names`, the `modules_to_save` values) follows what peft switched. Before the
wrapper was peft's tuner layer (issue 45), the first three returned without doing anything on ours."""

from __future__ import annotations

import tempfile

import peft
import peft.functional as pf
import pytest
import torch

import mmpreproj
from mmpreproj import PreProjConfig
from tests.helpers.zoo import tiny_neox

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
IDS = torch.randint(1, 128, (2, 7), generator=torch.Generator().manual_seed(1))
LORA = dict(r=4, target_modules=["query_key_value"], init_lora_weights=False)
METHODS = {  # name -> (config factory, peft's prefix of the method)
    "lora": (lambda: peft.LoraConfig(**LORA), "lora_"),
    "preproj": (lambda: PreProjConfig(), "preproj"),
}


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


def _two_adapters(method: str, route: str) -> torch.nn.Module:
    """A tiny GPT-NeoX with adapters "a" and "b" of `method` (different weights), "a" active; route "ours" (ours
    only): `mmpreproj.inject`, "b" read by `mmpreproj.load_adapter`."""
    make, prefix = METHODS[method]
    if route == "ours":
        if method != "preproj":
            pytest.skip("mmpreproj's own route injects ours only")
        model = mmpreproj.inject(tiny_neox(), make(), adapter_name="a")
        with tempfile.TemporaryDirectory() as tmp:
            mmpreproj.save_adapter(mmpreproj.inject(tiny_neox(), make()), tmp)
            mmpreproj.load_adapter(model, tmp, adapter_name="b")
    elif route == "inplace":
        model = peft.inject_adapter_in_model(make(), tiny_neox(), adapter_name="a")
        model = peft.inject_adapter_in_model(make(), model, adapter_name="b")
    else:
        model = peft.get_peft_model(tiny_neox(), make(), adapter_name="a")
        model.add_adapter("b", make())
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if prefix in n:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    pf.set_adapter(model, "a")
    return model.eval()


def _weights(model: torch.nn.Module, method: str, name: str) -> dict[str, torch.nn.Parameter]:
    prefix = METHODS[method][1]
    return {n: p for n, p in model.named_parameters() if prefix in n and f".{name}." in n}


ROUTES = ["inplace", "peftmodel", "ours"]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("method", list(METHODS))
def test_set_adapter_switches_what_runs(method, route):
    model = _two_adapters(method, route)
    a = _logits(model)
    pf.set_adapter(model, "b")
    b = _logits(model)
    pf.set_adapter(model, "a")
    assert not torch.equal(a, b) and torch.equal(_logits(model), a)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("method", list(METHODS))
def test_set_requires_grad_sets_what_trains(method, route):
    model = _two_adapters(method, route)
    weights = _weights(model, method, "b")
    pf.set_requires_grad(model, "b", requires_grad=True)
    assert weights and all(p.requires_grad for p in weights.values())
    pf.set_requires_grad(model, "b", requires_grad=False)
    assert not any(p.requires_grad for p in weights.values())


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("method", list(METHODS))
def test_the_state_dict_functions_round_trip_an_adapter(method, route):
    model = _two_adapters(method, route)
    want = _logits(model)
    saved = {k: v.clone() for k, v in pf.get_peft_model_state_dict(model, adapter_name="a").items()}
    assert len(saved) == len(_weights(model, method, "a")) and not any(".a." in k for k in saved)
    with torch.no_grad():
        for p in _weights(model, method, "a").values():
            p.zero_()
    assert not torch.equal(_logits(model), want)
    result = pf.set_peft_model_state_dict(model, saved, adapter_name="a")
    assert not result.unexpected_keys and torch.equal(_logits(model), want)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("method", list(METHODS))
def test_delete_adapter_removes_it(method, route):
    model = _two_adapters(method, route)
    a = _logits(model)
    pf.delete_adapter(model, "b", prefix=METHODS[method][1])
    assert not _weights(model, method, "b") and _weights(model, method, "a")
    assert torch.equal(_logits(model), a)


@pytest.mark.parametrize("route", ROUTES)
def test_our_record_follows_peft(route):
    """What peft switched or deleted is what mmpreproj reports, saves and switches back from."""
    model = _two_adapters("preproj", route)
    pf.set_adapter(model, "b")
    assert mmpreproj.active_adapter(model) == "b"
    b = _logits(model)
    mmpreproj.set_adapter(model, "a")
    mmpreproj.set_adapter(model, "b")
    assert torch.equal(_logits(model), b)
    pf.set_adapter(model, "a")
    pf.delete_adapter(model, "b", prefix="preproj")
    assert mmpreproj.adapter_names(model) == ["a"] and mmpreproj.active_adapter(model) == "a"


def _save_norm_adapter(folder) -> dict:
    """Save to `folder` an adapter whose `modules_to_save` (the final norm) holds 3.0; returns its config's fields."""
    cfg = dict(modules_to_save=["gpt_neox.final_layer_norm"])
    other = mmpreproj.inject(tiny_neox(), PreProjConfig(**cfg))
    with torch.no_grad():
        other.gpt_neox.final_layer_norm.weight.fill_(3.0)
    mmpreproj.save_adapter(other, folder)
    return cfg


def test_a_layer_switch_that_would_leave_modules_to_save_behind_is_refused(tmp_path):
    """Ours trains `modules_to_save` in place, each adapter's values kept aside while another runs, which peft's
    per-layer switch cannot move: with two adapters it is refused naming the model's switch, nothing changed; the
    model's switch moves them."""
    cfg = _save_norm_adapter(tmp_path / "b")
    model = mmpreproj.inject(tiny_neox(), PreProjConfig(**cfg))
    pf.set_adapter(model, "default")  # one adapter: nothing to move, a no-op
    mmpreproj.load_adapter(model, tmp_path / "b", adapter_name="b")
    before = _logits(model)
    with pytest.raises(ValueError, match=r"modules_to_save in place.*mmpreproj.set_adapter\(model, name\)"):
        pf.set_adapter(model, "b")
    assert mmpreproj.active_adapter(model) == "default" and torch.equal(_logits(model), before)
    mmpreproj.set_adapter(model, "b")
    assert torch.all(model.gpt_neox.final_layer_norm.weight == 3.0)


def test_the_peft_model_switch_runs_peft_functional_and_moves_modules_to_save(tmp_path):
    """`PeftModel.set_adapter` / `delete_adapter` are `peft.functional`'s over the tuner's model: its per-layer
    switch, which each layer refuses alone while the `modules_to_save` values wait aside, runs after the values'
    swap; the values follow the active adapter, through a switch and a delete of the active one."""
    cfg = _save_norm_adapter(tmp_path / "b")
    model = peft.get_peft_model(tiny_neox(), PreProjConfig(**cfg))
    norm = model.get_base_model().gpt_neox.final_layer_norm.weight
    first = norm.detach().clone()
    mmpreproj.load_adapter(model, tmp_path / "b", adapter_name="b")
    with pytest.raises(ValueError, match=r"modules_to_save in place"):
        pf.set_adapter(model, "b")  # a layer alone still refuses
    model.set_adapter("b")
    assert model.active_adapter == mmpreproj.active_adapter(model) == "b" and torch.all(norm == 3.0)
    assert all(p.requires_grad for p in _weights(model, "preproj", "b").values()) and norm.requires_grad
    assert not any(p.requires_grad for p in _weights(model, "preproj", "default").values())
    with pytest.warns(UserWarning, match="Adapter b was active which is now deleted"):
        model.delete_adapter("b")
    assert mmpreproj.adapter_names(model) == ["default"] and torch.equal(norm, first)
    assert not _weights(model, "preproj", "b") and model.active_adapter == "default"


class _Outer(torch.nn.Module):
    """A host one level down, under an attribute whose name holds peft's prefix ("preproj")."""

    def __init__(self) -> None:
        super().__init__()
        self.preproj_host = tiny_neox()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.preproj_host(ids).logits


def test_delete_reaches_wrappers_whose_path_holds_peft_prefix():
    """`peft.functional.delete_adapter` skips every module whose path holds the method's prefix; the tuner's
    delete still takes the adapter out of such wrappers (nothing of it left in the state dict)."""
    part = {
        "name": "language",
        "blocks": "preproj_host.gpt_neox.layers",
        "attention": "attention",
        "norm": "input_layernorm",
        "call": {"inputs": [[0, "hidden_states"]], "output_index": 0},
    }
    host = {"name": "outer_neox", "parts": [part]}
    model = peft.get_peft_model(_Outer(), PreProjConfig(host=host), adapter_name="a")
    model.add_adapter("b", PreProjConfig(host=host))
    assert any(".b." in k for k in model.state_dict())
    model.delete_adapter("b")
    assert mmpreproj.adapter_names(model) == ["a"] and not any(".b." in k for k in model.state_dict())
