"""Several adapters on one base (`mmpreproj.method.adapters`): with adapter A active the model computes what a
model holding only A computes, bit for bit; switching, disabling, saving a named one, deleting, unloading;
refused additions leave the model unchanged; `mmpreproj eval` scores two adapters in one process."""

from __future__ import annotations

import json
import re

import pytest
import torch

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj_cli.command import main
from tests.helpers.adapter_json import load_desc
from tests.helpers.zoo import BUILDERS, tiny_neox

TOKENS = torch.randint(3, 90, (2, 7), generator=torch.Generator().manual_seed(6))
BUILD = {"gpt_neox": tiny_neox, "llama": BUILDERS["llama"]}


def out(model):
    return model(TOKENS).logits


def _save(build, folder, seed, **cfg):
    """An adapter with weights off their init (as if trained), saved to `folder`."""
    model = mmpreproj.inject(build(), PreProjConfig(skip_init_std=0.05, **cfg))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.02 * torch.randn(p.shape, generator=g))
    mmpreproj.save_adapter(model, folder)
    return folder


def _snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}, {
        n: p.requires_grad for n, p in model.named_parameters()
    }


def _same(model, snap):
    sd, grads = snap
    now = model.state_dict()
    assert list(now) == list(sd) and all(torch.equal(now[k], sd[k]) for k in sd)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == grads


@pytest.fixture(scope="module", params=sorted(BUILD))
def host(request, tmp_path_factory):
    build = BUILD[request.param]
    root = tmp_path_factory.mktemp(request.param)
    folders = {
        "a": _save(build, root / "a", 1),
        "b": _save(build, root / "b", 2, expansion=2.0),  # another inner width: its own modules
        "c": _save(build, root / "c", 3, activation="gelu"),
    }
    alone = {k: out(mmpreproj.load_adapter(build(), f)) for k, f in folders.items()}
    return build, folders, alone, out(build())


def test_each_active_adapter_equals_a_model_holding_only_it(host):
    build, folders, alone, base = host
    model = mmpreproj.load_adapter(build(), folders["a"])
    mmpreproj.load_adapter(model, folders["b"], adapter_name="b")
    mmpreproj.load_adapter(model, folders["c"], adapter_name="c")
    assert mmpreproj.adapter_names(model) == ["default", "b", "c"] and mmpreproj.active_adapter(model) == "default"
    assert torch.equal(out(model), alone["a"])
    for name, key in (
        ("b", "b"),
        ("c", "c"),
        ("default", "a"),
        ("c", "c"),
    ):  # one batch per adapter, base kept
        mmpreproj.set_adapter(model, name)
        assert mmpreproj.active_adapter(model) == name
        assert torch.equal(out(model), alone[key]), name
    with mmpreproj.adapter_disabled(model):
        assert torch.equal(out(model), base)
    assert torch.equal(out(model), alone["c"])
    # the active adapter's weights have a single-adapter model's keys once the adapter name is removed (peft's
    # file keys), only they train, and the others wait in their own entries of the slot dicts
    single = mmpreproj.load_adapter(build(), folders["c"], adapter_name="c")
    sd = mmpreproj.adapter_state_dict(model)
    assert sd.keys() == mmpreproj.adapter_state_dict(single).keys()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, p in single.named_parameters() if p.requires_grad}
    assert all(
        re.search(r"\.(preproj|preproj_skip)\.(default|b)\.", n)
        for n in set(dict(model.named_parameters())) - set(dict(single.named_parameters()))
    )


def test_save_a_named_adapter_delete_and_unload(host, tmp_path):
    build, folders, alone, base = host
    model = mmpreproj.load_adapter(build(), folders["a"], adapter_name="a")
    mmpreproj.load_adapter(model, folders["b"], adapter_name="b")
    mmpreproj.save_adapter(model, tmp_path / "b", adapter_name="b")  # inactive: saved from where it waits
    assert torch.equal(out(mmpreproj.load_adapter(build(), tmp_path / "b")), alone["b"])
    desc = load_desc(tmp_path / "b" / "adapter_config.json")
    assert desc["adapter_name"] == "b" and desc["config"]["expansion"] == 2.0
    with pytest.raises(ValueError, match=r"delete_adapter: 'a' is the active adapter; set_adapter to one of \['b'\]"):
        mmpreproj.delete_adapter(model, "a")
    mmpreproj.set_adapter(model, "b")
    mmpreproj.delete_adapter(model, "a")
    assert mmpreproj.adapter_names(model) == ["b"] and torch.equal(out(model), alone["b"])
    with pytest.raises(ValueError, match=r"adapter_name='a' is not loaded; loaded: \['b'\]"):
        mmpreproj.set_adapter(model, "a")
    mmpreproj.load_adapter(model, folders["c"], adapter_name="c")
    mmpreproj.unload(model)  # whatever is loaded and active, the base comes back exactly
    fresh = build()
    assert not mmpreproj.is_injected(model)
    _same(model, _snapshot(fresh))
    assert torch.equal(out(model), base)


def test_refused_additions_leave_the_model_unchanged(host, tmp_path):
    build, folders, _, _ = host
    model = mmpreproj.load_adapter(build(), folders["a"])
    mmpreproj.load_adapter(model, folders["b"], adapter_name="b")
    snap = _snapshot(model)
    other_layers = _save(build, tmp_path / "l0", 4, layers=[0])
    skip_only = _save(build, tmp_path / "s", 5, preproj=False)
    for folder, name, match in (
        (
            other_layers,
            "x",
            r"injection.layers=\[0\] but the adapter already injected in this model has \[0, 1\]; an added",
        ),
        (skip_only, "x", r"config.preproj=False but the adapter already injected in this model has True"),
        (folders["c"], "b", r"adapter_name='b' is already loaded"),
        (folders["c"], "a.b", r"adapter_name='a.b'; must be a non-empty string without '.'"),
        (tmp_path / "missing", "x", r"adapter file missing"),
    ):
        with pytest.raises((ValueError, FileNotFoundError), match=match):
            mmpreproj.load_adapter(model, folder, adapter_name=name)
        _same(model, snap)
    assert mmpreproj.adapter_names(model) == ["default", "b"]


def test_modules_to_save_follow_the_active_adapter(tmp_path):
    cfg = {"modules_to_save": ["lm_head"]}
    a, b = _save(tiny_neox, tmp_path / "a", 1, **cfg), _save(tiny_neox, tmp_path / "b", 2, **cfg)
    alone_a, alone_b = (
        out(mmpreproj.load_adapter(tiny_neox(), a)),
        out(mmpreproj.load_adapter(tiny_neox(), b)),
    )
    model = mmpreproj.load_adapter(tiny_neox(), a, is_trainable=True)
    mmpreproj.load_adapter(model, b, adapter_name="b")
    assert torch.equal(out(model), alone_a)
    mmpreproj.set_adapter(model, "b")
    assert torch.equal(out(model), alone_b)
    assert model.lm_head.weight.requires_grad
    mmpreproj.save_adapter(model, tmp_path / "saved-a", adapter_name="default")
    assert torch.equal(out(mmpreproj.load_adapter(tiny_neox(), tmp_path / "saved-a")), alone_a)
    mmpreproj.unload(model)
    assert torch.equal(model.lm_head.weight, tiny_neox().lm_head.weight)
    # an adapter without the injection's modules_to_save does not fit
    model = mmpreproj.load_adapter(tiny_neox(), a)
    with pytest.raises(
        ValueError,
        match=r"injection.modules_to_save=\[\] but the adapter already injected in this model has \['lm_head'\]",
    ):
        mmpreproj.load_adapter(model, _save(tiny_neox, tmp_path / "plain", 3), adapter_name="p")


def test_stored_adapters_move_with_the_model(host):
    build, folders, alone, _ = host
    model = mmpreproj.load_adapter(build(), folders["a"])
    mmpreproj.load_adapter(model, folders["b"], adapter_name="b")
    model.to(torch.float64)
    mmpreproj.set_adapter(model, "b")
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    single = mmpreproj.load_adapter(build(), folders["b"]).to(torch.float64)
    assert torch.equal(out(model), out(single))


def test_eval_scores_two_adapters_in_one_process(tmp_path, capsys):
    from mmpreproj.data import asset_path
    from mmpreproj.train import load_model

    mini = str(asset_path("mini-pythia"))
    base = load_model(mini)
    for seed, name in ((1, "a"), (2, "b")):
        model = mmpreproj.inject(base, PreProjConfig(skip_init_std=0.05))
        torch.manual_seed(seed)
        with torch.no_grad():
            for p in mmpreproj.adapter_state_dict(model).values():
                p.add_(0.02 * torch.randn_like(p))
        mmpreproj.save_adapter(model, tmp_path / name)
        mmpreproj.unload(model)
    common = ["--model", mini, "--tasks", "ppl,lambada", "--limit", "12", "--batch-size", "6"]
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    two_json = f"{tmp_path}/2.json"
    assert main(["eval", *common, "--adapter", f"{a},{b}", "--json", two_json, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    two = json.loads((tmp_path / "2.json").read_text())
    assert list(two) == [a, b] and f"| {a} |" in printed and f"| {b} |" in printed  # one row per adapter
    assert two[a]["ppl"]["ppl"] != two[b]["ppl"]["ppl"]
    assert main(["eval", *common, "--adapter", b, "--json", f"{tmp_path}/1.json", "--no-progress"]) == 0
    assert json.loads((tmp_path / "1.json").read_text()) == two[b]  # the same as alone
    assert main(["eval", *common, "--adapter", a, "--adapter", a]) == 1
    assert "names one adapter twice" in capsys.readouterr().err


def test_save_pretrained_with_several_adapters(tmp_path):
    from transformers import GPTNeoXForCausalLM

    a, b = _save(tiny_neox, tmp_path / "a", 1), _save(tiny_neox, tmp_path / "b", 2)
    single_b = mmpreproj.load_adapter(tiny_neox(), b)
    model = mmpreproj.load_adapter(tiny_neox(), a)
    mmpreproj.load_adapter(model, b, adapter_name="b")
    out(model)  # fills the weight-cast cache with a's weights
    mmpreproj.set_adapter(model, "b")
    assert torch.equal(out(model), out(single_b))
    mmpreproj.save_pretrained(model, tmp_path / "full")  # the base, and the active adapter beside it
    back, info = GPTNeoXForCausalLM.from_pretrained(tmp_path / "full", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert torch.equal(out(mmpreproj.load_adapter(back.eval(), tmp_path / "full")), out(single_b))


def test_a_deep_copy_keeps_its_own_adapters(tmp_path):
    import copy

    a, b = _save(tiny_neox, tmp_path / "a", 1), _save(tiny_neox, tmp_path / "b", 2)
    model = mmpreproj.load_adapter(tiny_neox(), a)
    mmpreproj.load_adapter(model, b, adapter_name="b")
    twin = copy.deepcopy(model)
    mmpreproj.set_adapter(twin, "b")
    assert mmpreproj.active_adapter(model) == "default" and mmpreproj.active_adapter(twin) == "b"
    assert torch.equal(out(twin), out(mmpreproj.load_adapter(tiny_neox(), b)))
    assert torch.equal(out(model), out(mmpreproj.load_adapter(tiny_neox(), a)))
    # one record of the adapters, peft's: the copy's state holds the copy's own `peft_config`, not the original's
    assert twin.mmpreproj_state.peft_config is twin.peft_config is not model.peft_config
    assert list(twin.peft_config) == ["default", "b"] and model.mmpreproj_state.peft_config is model.peft_config


def test_forward_with_adapter_names_runs_each_row_through_its_adapter_never_ignored():
    """peft's mixed-batch `adapter_names=` reaches the attention in place (the injected model's own pre-hook hands
    it to every wrapper): each row runs through its adapter ("__base__": none), an unknown name is refused
    (tests/method/layer/test_mixed_adapter_batch.py for several adapters)."""
    base = tiny_neox()
    tokens = torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(0))
    plain = base(tokens).logits.detach()
    model = mmpreproj.inject(base, PreProjConfig(skip_init_std=0.05))
    ref = model(tokens).logits.detach()
    got = model(tokens, adapter_names=["default", "__base__"]).logits.detach()
    assert torch.allclose(got[0], ref[0], atol=1e-6, rtol=0) and torch.allclose(got[1], plain[1], atol=1e-6, rtol=0)
    assert not torch.allclose(ref[1], plain[1], atol=1e-4)  # the two rows' adapters differ: the test can fail
    with pytest.raises(ValueError, match=r"adapter_names=.*\['other'\] are not loaded adapters"):
        model(tokens, adapter_names=["default", "other"])
    assert torch.equal(model(tokens).logits, ref)


def test_mmpreproj_calls_on_a_peft_model_keep_peft_record_of_the_adapters(tmp_path):
    """mmpreproj's load_adapter(adapter_name=) / set_adapter / delete_adapter on a `PeftModel` go through its tuner:
    peft's `peft_config` and `active_adapter` name what runs, peft's own calls and save see the added adapter."""
    from peft import PeftModel, get_peft_model

    folder = _save(tiny_neox, tmp_path / "b", 2)
    alone = mmpreproj.load_adapter(tiny_neox(), folder)
    pm = get_peft_model(tiny_neox(), PreProjConfig())
    mmpreproj.load_adapter(pm, folder, adapter_name="b")
    assert list(pm.peft_config) == ["default", "b"] == mmpreproj.adapter_names(pm)
    pm.set_adapter("b")  # peft's own switch knows it
    assert pm.active_adapter == "b" == mmpreproj.active_adapter(pm)
    with torch.no_grad():
        assert torch.equal(out(pm), out(alone))
    mmpreproj.set_adapter(pm, "default")
    assert pm.active_adapter == "default" == mmpreproj.active_adapter(pm)
    pm.save_pretrained(tmp_path / "saved")  # peft writes every adapter in its record: "b" in its own folder
    again = PeftModel.from_pretrained(tiny_neox(), tmp_path / "saved")
    again.load_adapter(tmp_path / "saved" / "b", "b")
    again.set_adapter("b")
    with torch.no_grad():
        assert torch.equal(out(again), out(alone))
    mmpreproj.delete_adapter(pm, "b")
    assert list(pm.peft_config) == ["default"] == mmpreproj.adapter_names(pm)
    # one added through the injected model itself joins peft's record at once (the model shares the tuner's dict)
    mmpreproj.load_adapter(pm.base_model.model, folder, adapter_name="c")
    assert "c" in pm.peft_config
    mmpreproj.set_adapter(pm, "c")
    assert pm.active_adapter == "c" and "c" in pm.peft_config
    with pytest.raises(ValueError, match=r"adapter_name='nope' is not loaded; loaded: \['default', 'c'\]"):
        mmpreproj.set_adapter(pm, "nope")
