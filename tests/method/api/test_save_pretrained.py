"""`mmpreproj.save_pretrained(model, DIR)` of an injected transformers model writes the base (plain
`from_pretrained` reloads it bit-exact, no missing or unexpected keys) and the adapter in `adapter/`;
`load_adapter` / the `mmpreproj.from_pretrained` convenience give the injected model back bit-exact. Real classes,
built tiny."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import transformers as tf
from safetensors.torch import load_file

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj.method.files import PRETRAINED_ADAPTER_DIR
from tests.helpers.adapter_json import load_desc
from tests.helpers.zoo import BUILDERS, gpt2, qwen2_vl, tiny_neox, vl_forward, vl_inputs

TOKENS = torch.randint(3, 90, (2, 7), generator=torch.Generator().manual_seed(5))


def lm_forward(model, inputs=None):
    return model(TOKENS).logits


@dataclass
class Case:
    id: str
    build: Callable[[], Any]
    config: dict
    forward: Callable = lm_forward
    inputs: Callable = lambda: None  # noqa: E731


CASES = [
    Case("gpt_neox", tiny_neox, {}),
    Case("llama", BUILDERS["llama"], {}),
    Case("gpt2_tied", gpt2, {}),
    Case(
        "qwen2_vl",
        qwen2_vl,
        {"parts": ["language"], "modules_to_save": ["projector"]},
        vl_forward,
        vl_inputs,
    ),
]


def _trained(case: Case):
    """(the base's output, the injected model with non-identity weights, its output)."""
    model = case.build()
    base_out = case.forward(model, case.inputs())
    mmpreproj.inject(model, PreProjConfig(skip_init_std=0.05, **case.config))
    with torch.no_grad():  # as if trained: every injected tensor and modules_to_save move off their init
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return base_out, model, case.forward(model, case.inputs())


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same_state(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.fixture(params=CASES, ids=[c.id for c in CASES])
def case(request):
    return request.param


def test_round_trip_is_bit_exact_for_the_base_and_the_injected_model(case, tmp_path):
    base_out, model, injected_out = _trained(case)
    before = _state(model)
    mmpreproj.save_pretrained(model, tmp_path)
    _same_state(_state(model), before)  # saving put every wrapper and modules_to_save value back
    assert torch.equal(case.forward(model, case.inputs()), injected_out)
    assert (tmp_path / "config.json").is_file() and not (tmp_path / "adapter_config.json").exists()
    assert (tmp_path / PRETRAINED_ADAPTER_DIR / "adapter_config.json").is_file()

    cls = type(model)
    back, info = cls.from_pretrained(tmp_path, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set() and info["mismatched_keys"] == set()
    back.eval()
    _same_state(_state(back), _state(case.build()))  # the base, bit-exact (modules_to_save at their originals)
    assert torch.equal(case.forward(back, case.inputs()), base_out)

    mmpreproj.load_adapter(back, tmp_path)
    assert torch.equal(case.forward(back, case.inputs()), injected_out)
    again = mmpreproj.from_pretrained(tmp_path, model_cls=cls).eval()
    assert torch.equal(case.forward(again, case.inputs()), injected_out)
    assert mmpreproj.from_pretrained(tmp_path, adapter=False, model_cls=cls).eval() is not None
    if case.id == "gpt2_tied":
        assert back.lm_head.weight is back.transformer.wte.weight


def test_gpt2_tied_embeddings_stay_tied_and_the_checkpoint_holds_them_once(tmp_path):
    _, model, _ = _trained(CASES[2])
    mmpreproj.save_pretrained(model, tmp_path)
    keys = set(load_file(str(tmp_path / "model.safetensors")))
    assert "lm_head.weight" not in keys and "transformer.wte.weight" in keys
    assert not any("base_layer" in k or "preproj" in k or ".skip." in k for k in keys)


def test_sharded_save_and_safe_serialization(tmp_path):
    _, model, injected_out = _trained(CASES[0])
    mmpreproj.save_pretrained(model, tmp_path, max_shard_size="20KB", safe_serialization=True)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert not any("base_layer" in k for k in index["weight_map"])
    back, info = tf.GPTNeoXForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert torch.equal(lm_forward(mmpreproj.load_adapter(back.eval(), tmp_path)), injected_out)


def test_a_passed_state_dict_is_unwrapped_the_same_way(tmp_path):
    _, model, _ = _trained(Case("neox_head", tiny_neox, {"modules_to_save": ["lm_head"]}))
    mmpreproj.save_pretrained(model, tmp_path / "plain")
    mmpreproj.save_pretrained(model, tmp_path / "given", state_dict=model.state_dict())
    for name in ("model.safetensors", f"{PRETRAINED_ADAPTER_DIR}/adapter_model.safetensors"):
        a, b = load_file(str(tmp_path / "plain" / name)), load_file(str(tmp_path / "given" / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    # the base file holds lm_head at its inject-time value, the adapter the trained one
    base = load_file(str(tmp_path / "plain" / "model.safetensors"))
    assert torch.equal(base["embed_out.weight"], tiny_neox().lm_head.weight)  # its original name
    adapter = load_file(str(tmp_path / "plain" / PRETRAINED_ADAPTER_DIR / "adapter_model.safetensors"))
    assert torch.equal(adapter["base_model.model.lm_head.weight"], model.lm_head.weight.detach())  # peft's key
    # the adapter is taken from the given state dict when it holds all of it
    sd = model.state_dict()
    key = next(k for k in sd if k.endswith("layers.0.attention.preproj_skip.default.proj.weight"))
    sd[key] = sd[key] * 2
    mmpreproj.save_pretrained(model, tmp_path / "doubled", state_dict=sd)
    doubled = load_file(str(tmp_path / "doubled" / PRETRAINED_ADAPTER_DIR / "adapter_model.safetensors"))
    assert torch.equal(doubled[f"base_model.model.{key.replace('.default', '')}"], sd[key])  # peft: name removed


def test_a_bad_state_dict_key_is_refused_before_anything_is_written(tmp_path):
    _, model, _ = _trained(CASES[0])
    sd = model.state_dict()
    sd["gpt_neox.layers.0.attention.stray.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"'gpt_neox.layers.0.attention.stray.weight' is neither the base's"):
        mmpreproj.save_pretrained(model, tmp_path / "x", state_dict=sd)
    assert not (tmp_path / "x").exists()


def test_a_save_that_fails_inside_transformers_puts_everything_back(tmp_path, monkeypatch):
    _, model, injected_out = _trained(Case("neox_head", tiny_neox, {"modules_to_save": ["lm_head"]}))
    before = _state(model)

    def broken(self, *a, **k):
        assert not mmpreproj.injected_modules(self)  # transformers sees the base only
        raise OSError("disk full")

    monkeypatch.setattr(tf.GPTNeoXForCausalLM, "save_pretrained", broken)
    with pytest.raises(OSError, match="disk full"):
        mmpreproj.save_pretrained(model, tmp_path)
    _same_state(_state(model), before)
    assert len(mmpreproj.injected_modules(model)) == 2
    assert torch.equal(lm_forward(model), injected_out)


def test_adapter_only_writes_only_the_adapter(tmp_path):
    _, model, injected_out = _trained(CASES[0])
    mmpreproj.save_pretrained(model, tmp_path, adapter_only=True)
    assert {p.name for p in tmp_path.iterdir() if not p.name.startswith(".")} == {
        "adapter_config.json",
        "adapter_model.safetensors",
    }
    assert torch.equal(lm_forward(mmpreproj.load_adapter(tiny_neox(), tmp_path)), injected_out)
    for given in (model.state_dict(), mmpreproj.adapter_state_dict(model)):  # full, or the adapter's alone
        mmpreproj.save_pretrained(model, tmp_path / "given", adapter_only=True, state_dict=given)
        assert torch.equal(lm_forward(mmpreproj.load_adapter(tiny_neox(), tmp_path / "given")), injected_out)


def test_after_unload_save_pretrained_is_the_plain_one(tmp_path):
    base_out, model, _ = _trained(CASES[0])
    mmpreproj.unload(model)
    assert "save_pretrained" not in vars(model)
    model.save_pretrained(tmp_path)
    assert not (tmp_path / PRETRAINED_ADAPTER_DIR).exists()
    assert torch.equal(lm_forward(tf.GPTNeoXForCausalLM.from_pretrained(tmp_path).eval()), base_out)


def test_adapter_files_carry_the_model_card_facts(tmp_path):
    _, model, _ = _trained(CASES[0])
    mmpreproj.save_pretrained(model, tmp_path / "first")
    loaded = mmpreproj.from_pretrained(tmp_path / "first")  # name_or_path is now that folder
    mmpreproj.save_adapter(loaded, tmp_path / "card", readme=True)
    desc = load_desc(tmp_path / "card" / "adapter_config.json")
    assert desc["base_model_name_or_path"] == str(tmp_path / "first")
    assert desc["base_model_class"] == "GPTNeoXForCausalLM" and desc["adapter_name"] == "default"
    assert desc["host"] == "gpt_neox" and desc["library_version"] == mmpreproj.__version__
    assert desc["trainable_parameters"]["injected"] == mmpreproj.trainable_report(loaded).injected
    card = (tmp_path / "card" / "README.md").read_text()
    assert f"base_model: {json.dumps(str(tmp_path / 'first'))}" in card and "host row: `gpt_neox`" in card
    assert "pre-projection + content skip" in card and mmpreproj.__version__ in card


def test_from_pretrained_offline_with_an_uncached_hub_id_is_one_clear_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError) as err:
        mmpreproj.from_pretrained("nobody-here/not-a-cached-model")
    msg = str(err.value)
    assert "\n" not in msg and "'nobody-here/not-a-cached-model' is neither cached nor a local folder" in msg


def test_from_pretrained_with_an_adapter_folder_elsewhere(tmp_path):
    _, model, injected_out = _trained(CASES[0])
    mmpreproj.save_pretrained(model, tmp_path / "full")
    mmpreproj.save_adapter(model, tmp_path / "only")
    mmpreproj.unload(model)
    model.save_pretrained(tmp_path / "base")
    got = mmpreproj.from_pretrained(tmp_path / "base", adapter=tmp_path / "only").eval()
    assert torch.equal(lm_forward(got), injected_out)
    # no adapter beside it: said, never the plain base returned as if it were the trained model
    with pytest.raises(FileNotFoundError, match=r"holds no mmpreproj adapter .*pass adapter=False to load only"):
        mmpreproj.from_pretrained(tmp_path / "base")
    assert not mmpreproj.is_injected(mmpreproj.from_pretrained(tmp_path / "base", adapter=False))
    with pytest.raises(FileNotFoundError, match="no mmpreproj adapter files"):
        mmpreproj.from_pretrained(tmp_path / "base", adapter=tmp_path / "base")


def test_load_state_dict_of_an_injected_model_is_torchs_own(tmp_path):
    """inject registers no `load_state_dict` pre-hook (issue 45): the injected model loads a state dict keyed as
    its own `state_dict()` keys it, silently and exactly; a base checkpoint (keys as before inject, what
    `mmpreproj.save_pretrained` writes at the top) is not translated into the wrapped modules. A strict load says
    so (torch's RuntimeError naming the wrapped keys it lacks); `strict=False` returns the same keys and leaves
    every injected weight as it was (never the checkpoint's adapter: it has none). The caller's dict is never
    renamed. A Trainer that resumes goes through `peft.get_peft_model` (test_peft_lifecycle.py)."""
    import warnings

    _, model, out = _trained(CASES[1])
    mmpreproj.save_pretrained(model, tmp_path)
    base_sd = load_file(str(tmp_path / "model.safetensors"))
    other = mmpreproj.inject(BUILDERS["llama"](seed=3), PreProjConfig(skip_init_std=0.05))
    assert not any(m._load_state_dict_pre_hooks for m in other.modules())
    injected = {k: v.clone() for k, v in mmpreproj.adapter_state_dict(other).items()}
    keys = sorted(base_sd)
    with pytest.raises(RuntimeError, match=r"Missing key\(s\) in state_dict: .*\.base_layer\."):
        other.load_state_dict(base_sd)
    result = other.load_state_dict(base_sd, strict=False)
    assert any(".base_layer." in k for k in result.missing_keys) and any(".preproj." in k for k in result.missing_keys)
    assert result.unexpected_keys and not any(".base_layer." in k for k in result.unexpected_keys)
    assert sorted(base_sd) == keys  # the caller's dict is not renamed
    now = mmpreproj.adapter_state_dict(other)
    assert all(torch.equal(now[k], v) for k, v in injected.items())  # not the trained adapter: the base has none
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a full injected state dict loads silently, as before
        other.load_state_dict(model.state_dict())
    assert torch.equal(lm_forward(other), out)
    mmpreproj.unload(other)
    assert not any(m._load_state_dict_pre_hooks for m in other.modules())
