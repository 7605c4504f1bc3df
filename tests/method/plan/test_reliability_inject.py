"""inject / unload / save through wrappers (containers, peft, DDP, torch.compile), and the silently-wrong
cases that must now be refused: inner width 0, empty layers, meta-device models, non-finite weights,
and save_pretrained of an injected transformers model (base + adapter, test_save_pretrained.py)."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj.method.files import read_adapter
from mmpreproj.method.layer import PreProjAttention
from tests.helpers.adapter_json import dump_desc, load_desc
from tests.helpers.snapshots import assert_unchanged, snapshot
from tests.helpers.zoo import tiny_neox


def _injected(**cfg):
    model = tiny_neox()
    base_grads = {n: p.requires_grad for n, p in model.named_parameters()}
    mmpreproj.inject(model, PreProjConfig(skip_init_std=0.05, **cfg))
    return model, base_grads


def _assert_fully_unloaded(inner, base_grads):
    assert not mmpreproj.is_injected(inner)
    assert "mmpreproj_state" not in vars(inner)
    assert not any(isinstance(m, PreProjAttention) for m in inner.modules())
    assert {n: p.requires_grad for n, p in inner.named_parameters()} == base_grads
    assert not inner.gpt_neox.embed_in._forward_hooks  # the input-grad hook is gone
    assert "save_pretrained" not in vars(inner)  # nothing of ours on the instance (inject installs none)


def test_unload_container_restores_the_inner_model(tokens):
    model, base_grads = _injected()
    ref = None
    with mmpreproj.adapter_disabled(model):
        ref = model(tokens).logits
    container = nn.ModuleDict({"lm": model})
    mmpreproj.unload(container)
    _assert_fully_unloaded(model, base_grads)
    assert not mmpreproj.is_injected(container)
    assert torch.equal(model(tokens).logits, ref)


def test_container_save_report_disabled(tmp_path, tokens):
    model, _ = _injected()
    container = nn.ModuleDict({"lm": model})
    mmpreproj.save_adapter(container, tmp_path / "a")
    assert set(read_adapter(tmp_path / "a")[1]) == set(mmpreproj.adapter_state_dict(model))
    assert mmpreproj.trainable_report(container) == mmpreproj.trainable_report(model)
    with mmpreproj.adapter_disabled(container):
        assert not any(w.adapter_enabled for w in mmpreproj.injected_modules(model))
    assert all(w.adapter_enabled for w in mmpreproj.injected_modules(model))


def test_two_injected_models_in_one_container_are_named_not_guessed(tmp_path):
    container = nn.ModuleDict({"a": _injected()[0], "b": _injected()[0]})
    with pytest.raises(ValueError, match=r"holds 2 injected models \(\['a', 'b'\]\)"):
        mmpreproj.save_adapter(container, tmp_path / "x")
    assert not (tmp_path / "x").exists()
    mmpreproj.unload(container)  # unload takes out both
    assert not mmpreproj.is_injected(container["a"]) and not mmpreproj.is_injected(container["b"])


def _peft(model):
    peft = pytest.importorskip("peft")
    return peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["query_key_value"]))


def test_peft_wrapped_model_unloads_fully(tmp_path, tokens):
    model = tiny_neox()
    base_grads = {n: p.requires_grad for n, p in model.named_parameters()}
    pm = _peft(model)  # LoRA first, ours around the attention that holds it (the order of preproj_lora)
    inner = pm.base_model.model
    assert inner is model
    mmpreproj.inject(inner, PreProjConfig(skip_init_std=0.05))
    mmpreproj.save_adapter(pm, tmp_path / "a")  # the description comes from the inner model's state
    assert load_desc(tmp_path / "a" / "adapter_config.json")["host"] == "gpt_neox"
    report = mmpreproj.trainable_report(pm)
    assert report.injected > 0 and report.trainable > 0
    with mmpreproj.adapter_disabled(pm):
        assert not any(w.adapter_enabled for w in mmpreproj.injected_modules(pm))
    mmpreproj.unload(pm)
    assert not mmpreproj.is_injected(pm)
    lora = {n for n, _ in pm.named_parameters() if "lora_" in n}
    assert lora  # peft's own layers stay; only mmpreproj's are gone
    now = {
        n.replace("base_model.model.", "").replace(".base_layer", ""): p.requires_grad
        for n, p in pm.named_parameters()
        if "lora_" not in n
    }
    assert now == {n: False for n in base_grads}  # the base stays frozen, as peft froze it for its LoRA
    assert all(pm.get_parameter(n).requires_grad for n in lora)


def test_unload_with_a_broken_state_refuses_before_touching_anything():
    model, _ = _injected()
    pm = nn.ModuleDict({"lm": model})
    vars(model)["mmpreproj_state"] = "not a state"
    snap = snapshot(model)
    with pytest.raises(TypeError, match="nothing was changed"):
        mmpreproj.unload(pm)
    assert_unchanged(model, snap)
    assert mmpreproj.injected_modules(model)


def test_ddp_wrapped_model(tmp_path, tokens):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    model, base_grads = _injected()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(model)
        mmpreproj.save_adapter(ddp, tmp_path / "a")
        assert mmpreproj.trainable_report(ddp).injected == mmpreproj.trainable_report(model).injected
        with mmpreproj.adapter_disabled(ddp):
            assert not any(w.adapter_enabled for w in mmpreproj.injected_modules(model))
        mmpreproj.unload(ddp)
    finally:
        dist.destroy_process_group()
    _assert_fully_unloaded(model, base_grads)
    reloaded = mmpreproj.load_adapter(tiny_neox(), tmp_path / "a")
    assert set(mmpreproj.adapter_state_dict(reloaded)) == set(mmpreproj.adapter_state_dict(_injected()[0]))


def test_fsdp2_sharded_model_saves_and_unload_refuses_untouched(tmp_path):
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    model, _ = _injected()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        for layer in model.gpt_neox.layers:
            fully_shard(layer)
        fully_shard(model)
        mmpreproj.save_adapter(model, tmp_path / "a")  # gathers full tensors
        assert mmpreproj.trainable_report(model).injected == 2 * (2 * 32 * 40 + 32 * 32)
        wrappers = mmpreproj.injected_modules(model)
        with pytest.raises(RuntimeError, match="replaced by sharded ones after inject .* nothing was changed"):
            mmpreproj.unload(model)
        assert mmpreproj.injected_modules(model) == wrappers and "mmpreproj_state" in vars(model)
    finally:
        dist.destroy_process_group()
    assert set(read_adapter(tmp_path / "a")[1]) == set(mmpreproj.adapter_state_dict(_injected()[0]))


def test_torch_compile_wrapped_model(tmp_path):
    model, base_grads = _injected()
    compiled = torch.compile(model)  # not run: only the wrapper's structure matters here
    assert compiled is not model
    mmpreproj.save_adapter(compiled, tmp_path / "a")
    assert mmpreproj.trainable_report(compiled) == mmpreproj.trainable_report(model)
    mmpreproj.unload(compiled)
    _assert_fully_unloaded(model, base_grads)


# --- silently wrong before: now refused, leaving the model untouched ---------------------------------


def test_inner_width_zero_is_refused():
    model = tiny_neox()  # hidden size 32: int(0.001 * 32) = 0
    snap = snapshot(model)
    with pytest.raises(ValueError, match=r"expansion=0.001 gives an inner width of int\(0.001 \* 32\) = 0"):
        mmpreproj.inject(model, PreProjConfig(expansion=0.001))
    assert_unchanged(model, snap)
    assert "save_pretrained" not in vars(model)
    mmpreproj.inject(model, PreProjConfig(expansion=1 / 32))  # width 1 is allowed


@pytest.mark.parametrize(
    ("config", "says"),
    [
        (
            "preproj_skip",
            "got str 'preproj_skip'; pass a mmpreproj.PreProjConfig (method 'preproj_skip' is "
            "PreProjConfig(preproj=True, skip=True); None = preproj_skip)",
        ),
        ("skip", "(method 'skip' is PreProjConfig(preproj=False, skip=True); None = preproj_skip)"),
        ("lora", "(method 'lora' trains LoRA: peft.LoraConfig with peft.get_peft_model)"),
        (
            "gpt_neox",
            "got str 'gpt_neox'; pass a mmpreproj.PreProjConfig (a host row name goes to host=; the method "
            "names are preproj, skip, preproj_skip, lora, preproj_lora, lora_matched)",
        ),
        ({"expansion": 0.5}, "got dict; pass a mmpreproj.PreProjConfig (its fields as PreProjConfig(**fields)"),
    ],
    ids=["method", "another-method", "lora-method", "row-name", "dict"],
)
def test_a_config_that_is_no_preproj_config_is_refused_in_one_line_naming_what_to_pass(config, says):
    """peft's `get_peft_model(model, config)` takes a config object; so does `inject`: a method name is refused (not
    read as one, so a row name meant for host= is never taken for a method), naming the config it stands for."""
    model = tiny_neox()
    snap = snapshot(model)
    with pytest.raises(TypeError) as err:
        mmpreproj.inject(model, config)
    assert str(err.value).startswith("inject(config=...): got ") and says in str(err.value)
    assert "\n" not in str(err.value)
    assert_unchanged(model, snap)
    assert not mmpreproj.is_injected(model)


def test_peft_argument_order_is_refused_naming_both_orders():
    model = tiny_neox()
    with pytest.raises(
        TypeError, match=r"^inject\(model=...\): got PreProjConfig; pass a torch.nn.Module \(peft's order"
    ):
        mmpreproj.inject(PreProjConfig(), model)
    assert not mmpreproj.is_injected(model)


def _mamba() -> nn.Module:
    from transformers import MambaConfig, MambaForCausalLM

    config = MambaConfig(vocab_size=64, hidden_size=16, state_size=4, num_hidden_layers=2, expand=2, conv_kernel=2)
    return MambaForCausalLM(config)


@pytest.mark.parametrize(
    ("build", "what"),
    [
        (lambda: nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8)), "Sequential"),
        (_mamba, "MambaForCausalLM (model_type 'mamba')"),
    ],
    ids=["linear-stack", "mamba"],
)
def test_a_model_without_attention_hears_that_first_in_one_line(build, what):
    """Not the list of every host row (none can fit): what was searched for, and that nothing was found."""
    from mmpreproj.hosts import find_host

    model = build()
    snap = snapshot(model)
    for call in (lambda: mmpreproj.inject(model), lambda: find_host(model)):
        with pytest.raises(ValueError) as err:
            call()
        msg = str(err.value)
        assert msg.startswith(f"mmpreproj found no attention layer in {what}: searched its modules for "), msg
        assert "nn.MultiheadAttention" in msg and "*Attention*" in msg and "*attn*" in msg and "host=" in msg
        assert "\n" not in msg and "supported rows" not in msg and "gpt_neox" not in msg
    assert_unchanged(model, snap)


def test_empty_layers_is_refused():
    with pytest.raises(
        ValueError, match=r"PreProjConfig.layers=\[\]; must be None \(every block\) or a non-empty list"
    ):
        PreProjConfig(layers=[])


def test_load_adapter_into_meta_model_is_refused(tmp_path):
    model, _ = _injected()
    mmpreproj.save_adapter(model, tmp_path / "a")
    from transformers import GPTNeoXForCausalLM

    with torch.device("meta"):
        meta = GPTNeoXForCausalLM(model.config)
    with pytest.raises(ValueError, match="load_adapter: the model has .* on the meta device .* materialise it first"):
        mmpreproj.load_adapter(meta, tmp_path / "a")
    assert not mmpreproj.is_injected(meta)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_adapter_weights_are_refused_by_name(tmp_path, bad):
    model, _ = _injected()
    mmpreproj.save_adapter(model, tmp_path / "a")
    weights = tmp_path / "a" / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    key = "base_model.model.gpt_neox.layers.1.attention.preproj_skip.proj.weight"  # the file's (peft's) key
    tensors[key][3, 4] = bad
    save_file(tensors, str(weights))
    fresh = tiny_neox()
    snap = snapshot(fresh)
    with pytest.raises(ValueError, match=rf"tensor {re.escape(key)} holds 1 non-finite value"):
        mmpreproj.load_adapter(fresh, tmp_path / "a")
    assert_unchanged(fresh, snap)


def test_overwritten_tensor_bytes_are_refused(tmp_path):
    model, _ = _injected()
    mmpreproj.save_adapter(model, tmp_path / "a")
    weights = tmp_path / "a" / "adapter_model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-4096:] = b"\xff" * 4096  # header intact, the last tensor's bytes are NaN patterns
    weights.write_bytes(bytes(raw))
    with pytest.raises(
        ValueError,
        match=r"adapter weights .* tensor base_model\.model\.gpt_neox\.layers\.\d\.attention\.\w+\.(\w+\.)?weight "
        r"holds \d+ non-finite",
    ):
        mmpreproj.load_adapter(tiny_neox(), tmp_path / "a")


def test_save_adapter_refuses_non_finite_weights_and_keeps_the_old_pair(tmp_path):
    model, _ = _injected()
    mmpreproj.save_adapter(model, tmp_path / "a")
    before = {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir() if not p.name.startswith(".")}
    with torch.no_grad():
        mmpreproj.injected_modules(model)[0].slots()[0].up.weight[0, 0] = float("nan")
    with pytest.raises(
        ValueError, match="save_adapter: refusing to write .* tensor gpt_neox.layers.0.attention.preproj.up.weight"
    ):
        mmpreproj.save_adapter(model, tmp_path / "a")
    assert {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir() if not p.name.startswith(".")} == before


def test_adapter_config_whose_config_is_a_string(tmp_path):
    model, _ = _injected()
    mmpreproj.save_adapter(model, tmp_path / "a")
    cfg = tmp_path / "a" / "adapter_config.json"
    cfg.write_text(json.dumps(load_desc(cfg) | {"config": "preproj"}))
    with pytest.raises(ValueError, match=r"corrupt adapter config .*adapter_config.json: 'config' must be an object"):
        mmpreproj.load_adapter(tiny_neox(), tmp_path / "a")


def test_adapter_config_with_a_mistyped_field_names_it(tmp_path):
    model, _ = _injected()
    mmpreproj.save_adapter(model, tmp_path / "a")
    cfg = tmp_path / "a" / "adapter_config.json"
    desc = load_desc(cfg)
    desc["config"]["expansion"] = "1.25"
    dump_desc(cfg, desc)
    with pytest.raises(ValueError, match=r"PreProjConfig.expansion='1.25' \(str\); must be a finite number"):
        mmpreproj.load_adapter(tiny_neox(), tmp_path / "a")


def test_save_pretrained_of_an_injected_model_writes_the_base_and_the_adapter(tmp_path, tokens):
    model = tiny_neox()
    ref = model(tokens).logits
    mmpreproj.inject(model, PreProjConfig(skip_init_std=0.05))
    injected = model(tokens).logits
    mmpreproj.save_pretrained(model, tmp_path / "full")  # was refused before the round trip existed
    assert "save_pretrained" not in vars(model) and "save_pretrained" not in vars(tiny_neox())  # none installed
    from transformers import GPTNeoXForCausalLM

    back = GPTNeoXForCausalLM.from_pretrained(tmp_path / "full").eval()
    assert torch.equal(back(tokens).logits, ref)  # the base reloads bit-exact
    mmpreproj.load_adapter(back, tmp_path / "full")
    assert torch.equal(back(tokens).logits, injected)
