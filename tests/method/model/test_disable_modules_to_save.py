"""With our own `modules_to_save` (trained in place), the adapters off give the base, as LoRA's wrapper does: peft's
`disable_adapter()` and `mmpreproj.adapter_disabled` put the base's values in those modules meanwhile and the trained
ones back after, exactly, and a graph recorded before (TRL's DPO: the policy's forward, the reference under
`disable_adapter()`, then backward) keeps its gradients. Found by `bench/integration_audit.py`: the disabled model
ran the trained head (logits 0.5 off the base; DPO's reference drifted with it), LoRA's gave the base exactly."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

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
def test_inside_disable_a_save_holds_the_adapters_values_and_a_switch_is_refused():
    model, _ = _trained("ours")
    model.add_adapter("b", PreProjConfig(modules_to_save=["lm_head"]))
    want = get_peft_model_state_dict(model)
    trained = model(IDS).logits.clone()
    with model.disable_adapter():
        got = get_peft_model_state_dict(model)
        assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
        for call in (lambda: model.set_adapter("b"), lambda: model.delete_adapter("b")):
            with pytest.raises(ValueError, match=r"the adapters are disabled .* \(nothing was changed\)"):
                call()
    assert torch.equal(model(IDS).logits, trained)
    assert sorted(model.peft_config) == ["b", "default"]
