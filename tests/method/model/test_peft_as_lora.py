"""peft's calls on a PREPROJ model do what they do on a LoRA model (peft's own method, the peer), side by side.

Which adapter trains, as peft tells it, under peft's own calls: the same sequence of `from_pretrained`,
`load_adapter(is_trainable=)`, `add_adapter`, `set_adapter(inference_mode=)` and `set_requires_grad` leaves a
PREPROJ model and a LoRA model (peft's own method, the peer) with the same adapters trainable, as
`get_model_status().requires_grad` and `get_layer_status()` report it and as a backward fills gradients.

Deleting the active adapter hands over as for LoRA; `autocast_adapter_dtype=False` gives adapter weights in the
base's dtype, as LoRA's.

Before, a PREPROJ adapter loaded with `is_trainable=True` beside a frozen one stayed frozen once made active (peft's
`set_requires_grad` on an inactive adapter did nothing), and peft's status reported no adapter's `requires_grad`.
"""

from __future__ import annotations

import peft
import pytest
import torch
from packaging.version import Version
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

import mmpreproj  # noqa: F401  (registers PREPROJ)
from mmpreproj import PreProjConfig

CONFIG = LlamaConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2,
)  # fmt: skip
X = torch.arange(12).reshape(2, 6) % 64
# peft < 0.21's `load_adapter(is_trainable=True)` beside a frozen adapter sets requires_grad its own way, for LoRA too
# (0.21 made it follow `set_requires_grad`); PREPROJ follows 0.21's rule, so the side-by-side checks need 0.21
LOADS_AS_021 = pytest.mark.skipif(
    Version(peft.__version__) < Version("0.21"), reason="peft < 0.21 loads trainability differently, LoRA too"
)


def _base() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(CONFIG)


def _adapter_config(kind: str) -> peft.PeftConfig:
    if kind == "lora":
        return LoraConfig(r=2, target_modules=["q_proj", "v_proj"])
    return PreProjConfig(expansion=0.25, skip_rank=4)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, dict[str, str]]:
    """kind -> adapter name -> a saved folder of that kind."""
    root = tmp_path_factory.mktemp("trainability")
    out: dict[str, dict[str, str]] = {}
    for kind in ("lora", "preproj"):
        out[kind] = {}
        for name, seed in (("default", 1), ("b", 2)):
            torch.manual_seed(seed)
            folder = root / kind / name
            get_peft_model(_base(), _adapter_config(kind)).save_pretrained(str(folder))
            out[kind][name] = str(folder)
    return out


def _status(model: PeftModel) -> dict:
    return dict(model.get_model_status().requires_grad)


def _trained_names(model: PeftModel) -> set[str]:
    """The adapters whose weights a backward through the active one fills."""
    model.zero_grad(set_to_none=True)
    model(X, labels=X).loss.backward()
    names = set()
    for layer in model.get_layer_status():
        names |= {k for k, v in layer.requires_grad.items() if v is True}
    filled = {name for name in names for n, p in model.named_parameters() if f".{name}." in n and p.grad is not None}
    model.zero_grad(set_to_none=True)
    return filled


SEQUENCES = {
    "frozen_first_then_trainable_second": [
        ("load", "b", True),
        ("set", "b", False),
        ("set", "default", False),
        ("set", "b", True),
        ("grad", "default", True),
        ("grad", ("default", "b"), False),
    ],
    "trainable_first_then_frozen_second": [
        ("load", "b", False),
        ("set", "b", False),
        ("grad", "b", False),
        ("set", "default", True),
    ],
}


def _run(kind: str, folders: dict, first_trainable: bool, steps: list) -> list:
    model = PeftModel.from_pretrained(_base(), folders[kind]["default"], is_trainable=first_trainable)
    seen = [_status(model)]
    for op, name, flag in steps:
        if op == "load":
            model.load_adapter(folders[kind][name], adapter_name=name, is_trainable=flag)
        elif op == "set":
            model.set_adapter(name, inference_mode=flag)
        else:
            model.set_requires_grad(name, requires_grad=flag)
        seen.append((op, name, _status(model), model.active_adapter))
    return seen


@LOADS_AS_021
@pytest.mark.parametrize("sequence", sorted(SEQUENCES))
def test_peft_calls_leave_the_same_adapters_trainable_as_for_lora(folders, sequence):
    first_trainable = sequence.startswith("trainable_first")
    ours = _run("preproj", folders, first_trainable, SEQUENCES[sequence])
    theirs = _run("lora", folders, first_trainable, SEQUENCES[sequence])
    assert ours == theirs
    assert any(True in step[2].values() for step in ours[1:])  # the comparison sees a trainable adapter


@LOADS_AS_021
def test_an_adapter_loaded_trainable_beside_a_frozen_one_trains_once_active(folders):
    for kind in ("lora", "preproj"):
        model = PeftModel.from_pretrained(_base(), folders[kind]["default"])  # inference, as peft loads
        model.load_adapter(folders[kind]["b"], adapter_name="b", is_trainable=True)
        assert _status(model) == {"default": False, "b": True}, kind
        model.set_adapter("b")
        assert _trained_names(model) == {"b"}, kind
        layers = model.get_layer_status()
        assert layers and all(set(s.devices) <= {"default", "b"} and s.devices for s in layers), kind


def test_add_adapter_and_set_requires_grad_as_for_lora(folders):
    seen = {}
    for kind in ("lora", "preproj"):
        torch.manual_seed(3)
        model = get_peft_model(_base(), _adapter_config(kind))
        model.add_adapter("b", _adapter_config(kind))
        steps = [_status(model)]
        model.set_requires_grad("b")
        steps.append(_status(model))
        model.set_adapter("b", inference_mode=True)
        steps.append(_status(model))
        seen[kind] = steps
    assert seen["preproj"] == seen["lora"]
    assert seen["preproj"][1] == {"default": True, "b": True}


def test_set_requires_grad_refuses_a_name_not_loaded():
    model = get_peft_model(_base(), _adapter_config("preproj"))
    before = _status(model)
    with pytest.raises(ValueError, match=r"set_requires_grad\(\['nope'\]\): \['nope'\] are not loaded adapters"):
        model.set_requires_grad("nope")
    assert _status(model) == before


def test_deleting_the_active_adapter_hands_over_as_for_lora(folders):
    """peft's `delete_adapter` of the active adapter: the first of the others by name becomes active and trains, with
    peft's warning; after the last one the layers hold no adapter and nothing trains, as for LoRA (PeftModel keeps
    its `active_adapter` name, so its own forward fails on any method: peft's, unchanged here)."""
    seen, last = {}, {}
    for kind in ("lora", "preproj"):
        model = PeftModel.from_pretrained(_base(), folders[kind]["default"])
        model.load_adapter(folders[kind]["b"], adapter_name="b")
        model.load_adapter(folders[kind]["b"], adapter_name="a")
        with pytest.warns(UserWarning, match="Adapter default was active which is now deleted"):
            model.delete_adapter("default")
        seen[kind] = (model.active_adapter, sorted(model.peft_config), _status(model), _trained_names(model))
        model.delete_adapter("b")
        model.delete_adapter("a")
        trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        with pytest.raises(KeyError, match="'a'"):  # peft's forward reads peft_config[active_adapter], for any method
            model(X)
        last[kind] = (model.active_adapter, model.active_adapters, sorted(model.peft_config), trainable)
    assert seen["preproj"] == seen["lora"] == ("a", ["a", "b"], {"a": True, "b": False}, {"a"})
    assert last["preproj"] == last["lora"] == ("a", [], [], [])


@pytest.mark.parametrize("autocast", [True, False])
def test_autocast_adapter_dtype_as_for_lora(folders, autocast):
    """peft's `autocast_adapter_dtype`: on a bfloat16 base the adapter's weights are float32 (True, the default) or
    bfloat16 (False), through `get_peft_model`, `add_adapter` and `from_pretrained`, as LoRA's; the bfloat16 one
    runs and trains."""
    seen = {}
    for kind in ("lora", "preproj"):
        made = get_peft_model(_base().to(torch.bfloat16), _adapter_config(kind), autocast_adapter_dtype=autocast)
        made.add_adapter("b", _adapter_config(kind), autocast_adapter_dtype=autocast)
        loaded = PeftModel.from_pretrained(
            _base().to(torch.bfloat16), folders[kind]["default"], autocast_adapter_dtype=autocast, is_trainable=True
        )
        dtypes = [
            sorted({p.dtype for n, p in m.named_parameters() if f".{name}." in n}) for m, name in
            ((made, "default"), (made, "b"), (loaded, "default"))
        ]  # fmt: skip
        loaded(X, labels=X).loss.backward()
        assert all(p.grad is not None for p in loaded.parameters() if p.requires_grad), kind
        seen[kind] = dtypes
    want = torch.float32 if autocast else torch.bfloat16
    assert seen["preproj"] == seen["lora"] == [[want]] * 3
