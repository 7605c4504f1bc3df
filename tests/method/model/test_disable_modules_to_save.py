"""With our own `modules_to_save` (trained in place), the adapters off give the base, as LoRA's wrapper does: peft's
`disable_adapter()` and `mmpreproj.adapter_disabled` put the base's values in those modules meanwhile and the trained
ones back after, exactly; a graph recorded before (TRL's DPO: the policy's forward, the reference under
`disable_adapter()`, then backward) keeps its gradients; a save inside holds the trained values; nested blocks stay
off until the outer one ends. Found by `bench/integration_audit.py` and `bench/today_audit.py`: the disabled model
ran the trained head (logits 0.5 off the base; DPO's reference drifted with it), LoRA's gave the base exactly."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict

import mmpreproj
from mmpreproj import PreProjConfig
from tests.helpers.zoo import tiny_neox

CONFIGS = {
    "ours": lambda: PreProjConfig(modules_to_save=["lm_head"]),
    "lora": lambda: LoraConfig(target_modules=["query_key_value"], modules_to_save=["lm_head"]),
}
IDS = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(3))


def _trained(kind: str):
    base = tiny_neox().eval()
    with torch.no_grad():
        ref = base(IDS).logits.clone()
    model = get_peft_model(base, CONFIGS[kind]())
    with torch.no_grad():  # a trained head (and adapter), as after training
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    return model, ref


@pytest.mark.parametrize("kind", sorted(CONFIGS))
@torch.no_grad()
def test_disable_adapter_gives_the_base_and_the_trained_values_back(kind):
    model, ref = _trained(kind)
    trained = model(IDS).logits.clone()
    assert not torch.equal(trained, ref)
    with model.disable_adapter():
        assert torch.equal(model(IDS).logits, ref)
    assert torch.equal(model(IDS).logits, trained)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_a_reference_forward_under_disable_keeps_the_policys_gradients(kind):
    """TRL's DPO with `peft_config` and no `ref_model`: the policy's forward, the reference under
    `disable_adapter()`, then backward; the gradients are those of the policy's forward alone."""
    model, ref = _trained(kind)
    model.train()
    model(IDS).logits.square().mean().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    loss = model(IDS).logits.square().mean()
    with torch.no_grad(), model.disable_adapter():
        assert torch.allclose(model(IDS).logits, ref, atol=1e-6)  # dropout off in this tiny model: the base
    loss.backward()
    for n, p in model.named_parameters():
        if p.requires_grad:
            assert torch.equal(p.grad, want[n]), n


@torch.no_grad()
def test_in_place_adapter_disabled_gives_the_base_too():
    base = tiny_neox().eval()
    ref = base(IDS).logits.clone()
    model = mmpreproj.inject(base, PreProjConfig(modules_to_save=["lm_head"]))
    for p in model.parameters():
        if p.requires_grad:
            p.add_(0.1)
    trained = model(IDS).logits.clone()
    with mmpreproj.adapter_disabled(model):
        assert torch.equal(model(IDS).logits, ref)
    assert torch.equal(model(IDS).logits, trained)


@torch.no_grad()
def test_inside_disable_a_save_holds_the_adapters_values_and_a_switch_moves_them(tmp_path):
    """Inside the block peft's state dict and save hold the trained values (as LoRA's trained copy), a switch and a
    delete trade the adapters' values where they wait, and the block's end puts the active one's in."""
    model, ref = _trained("ours")
    model.add_adapter("b", PreProjConfig(init="identity", modules_to_save=["lm_head"]))  # exactly the base at init
    want = {k: v.clone() for k, v in get_peft_model_state_dict(model).items()}  # peft hands the live tensors
    trained = model(IDS).logits.clone()
    with model.disable_adapter():
        got = get_peft_model_state_dict(model)
        assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
        model.save_pretrained(tmp_path)
        model.set_adapter("b")
        assert torch.equal(model(IDS).logits, ref)  # still off: the base
    assert model.active_adapter == "b" and torch.equal(model(IDS).logits, ref)  # b's head: the base's copy
    with model.disable_adapter():
        model.set_adapter("default")
        model.delete_adapter("b")
    assert torch.equal(model(IDS).logits, trained)
    reloaded = PeftModel.from_pretrained(tiny_neox().eval(), tmp_path)
    assert torch.equal(reloaded(IDS).logits, trained)


@torch.no_grad()
def test_nested_disables_stay_off_until_the_outer_block_ends():
    model, ref = _trained("ours")
    trained = model(IDS).logits.clone()
    with model.disable_adapter():
        with mmpreproj.adapter_disabled(model):
            assert torch.equal(model(IDS).logits, ref)
        assert torch.equal(model(IDS).logits, ref)
    with mmpreproj.adapter_disabled(model):
        with mmpreproj.adapter_disabled(model):
            pass
        assert torch.equal(model(IDS).logits, ref)
    assert torch.equal(model(IDS).logits, trained)


@torch.no_grad()
def test_deleting_the_last_adapter_inside_disable_leaves_the_base():
    model, ref = _trained("ours")
    with model.disable_adapter():
        model.delete_adapter("default")
    assert torch.equal(model.base_model.model(IDS).logits, ref)  # peft's own forward wants an adapter
