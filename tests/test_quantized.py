"""A quantized frozen base (torchao int8 weight-only, bitsandbytes 4-bit on CPU): inject, train, save/reload, unload.

Tiny GPT-NeoX and Llama built in code. Equalities are exact (tolerance 0) where both sides run the same
quantized kernels on the same inputs: identity init, reload into a freshly quantized model, unload.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj.integrations.quantized import (
    QUANT_SCHEMES,
    FrozenInt8Linear,
    disable_cpu_4bit_packing,
    is_quantized_tensor,
    model_bytes,
    quantize_frozen_base,
)
from tests.helpers import zoo

pytest.importorskip("torchao")
bnb = pytest.importorskip("bitsandbytes")

IDENTITY = PreProjConfig(init="identity", skip_init_std=0.0)
SCHEMES = ["int8", "nf4"]
REPO = Path(__file__).resolve().parents[1]


def tiny_neox(seed: int = 0) -> nn.Module:
    return zoo.tiny_neox(seed=seed, hidden_size=64, intermediate_size=128, max_position_embeddings=64)


def tiny_llama(seed: int = 0) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg).eval()


HOSTS = {"gpt_neox": tiny_neox, "llama": tiny_llama}


@pytest.fixture(params=sorted(HOSTS))
def host(request):
    return request.param


@pytest.fixture(params=SCHEMES)
def scheme(request):
    return request.param


def quantized(host: str, scheme: str) -> nn.Module:
    return quantize_frozen_base(HOSTS[host](), scheme)


TOKENS = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))


def logits(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(TOKENS).logits


def raw(t: torch.Tensor) -> list[torch.Tensor]:
    """What a (quantized) weight stores, as plain tensors: torchao's inner tensors, bitsandbytes' data + state."""
    if hasattr(t, "__tensor_flatten__") and type(t) is not nn.Parameter:
        return [getattr(t, n).detach().clone() for n in t.__tensor_flatten__()[0]]
    state = getattr(t, "quant_state", None)
    extra = [v.clone() for v in state.as_dict().values() if isinstance(v, torch.Tensor)] if state is not None else []
    return [t.detach().clone(), *extra]


def snapshot(model: nn.Module) -> dict:
    return {n: (type(p), p.requires_grad, raw(p)) for n, p in model.named_parameters()}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for n in a:
        assert a[n][:2] == b[n][:2], n
        assert len(a[n][2]) == len(b[n][2]) and all(torch.equal(x, y) for x, y in zip(a[n][2], b[n][2])), n


def train_steps(model: nn.Module, steps: int = 3, lr: float = 1e-2) -> list[float]:
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    for _ in range(steps):
        loss = model(TOKENS, labels=TOKENS).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_quantize_stores_frozen_quantized_linears(host, scheme):
    model = quantized(host, scheme)
    heads = {"lm_head", "embed_out"}
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    for name, m in linears.items():
        head = name.rsplit(".", 1)[-1] in heads
        assert is_quantized_tensor(m.weight) is not head, name
        assert m.weight.requires_grad is head, name
    kind = FrozenInt8Linear if scheme == "int8" else bnb.nn.Linear4bit
    assert all(type(m) is kind for n, m in linears.items() if n.rsplit(".", 1)[-1] not in heads)
    full, small = model_bytes(HOSTS[host]())["parameters"], model_bytes(model)["parameters"]
    assert small < full


def test_identity_init_equals_quantized_base(host, scheme):
    model = quantized(host, scheme)
    base = logits(model)
    mmpreproj.inject(model, IDENTITY)
    # x~ = x^ + 0 and attn + 0: the same quantized kernels on the same input
    assert torch.equal(logits(model), base)


def test_only_injected_weights_train_through_quantized_attention(host, scheme):
    model = quantized(host, scheme)
    before = snapshot(model)
    base = logits(model)
    mmpreproj.inject(model)
    loss = model(TOKENS, labels=TOKENS).loss
    loss.backward()
    injected = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert injected and all(".preproj." in n or ".preproj_skip." in n for n in injected)
    for n, p in model.named_parameters():
        if p.requires_grad:
            assert p.dtype == torch.float32 and p.grad is not None and p.grad.abs().sum() > 0, n
        else:
            assert p.grad is None, n
    model.zero_grad()
    losses = train_steps(model)
    assert losses[-1] < losses[0]
    model.eval()
    assert not torch.allclose(logits(model), base)  # trained: the test can fail
    mmpreproj.unload(model)
    assert_same(snapshot(model), before)  # the frozen quantized weights never moved


def dequantized_copy(model: nn.Module) -> nn.Module:
    """A float model whose every quantized Linear holds its dequantized weight (what the kernels compute with)."""
    out = copy.deepcopy(HOSTS["gpt_neox" if "GPTNeoX" in type(model).__name__ else "llama"]())
    float_linears = dict(out.named_modules())
    with torch.no_grad():
        for name, m in model.named_modules():
            w = getattr(m, "weight", None)
            if isinstance(m, nn.Linear) and is_quantized_tensor(w):
                if hasattr(w, "dequantize") and not hasattr(w, "quant_state"):
                    dense = w.dequantize()
                else:
                    dense = bnb.functional.dequantize_4bit(w.data, w.quant_state)
                float_linears[name].weight.copy_(dense.reshape(float_linears[name].weight.shape))
    return out.eval()


def test_gradients_match_a_float_base_holding_the_dequantized_weights(host, scheme):
    model = quantized(host, scheme)
    ref = dequantized_copy(model)
    for m in (model, ref):
        torch.manual_seed(3)
        mmpreproj.inject(m)
        m.train()
        m(TOKENS, labels=TOKENS).loss.backward()
    grads = {n: p.grad for n, p in ref.named_parameters() if p.requires_grad}
    for (
        n,
        p,
    ) in model.named_parameters():  # int8 computes (x @ W_int8) * scale: the dequantized matmul, rounded
        if p.requires_grad:
            torch.testing.assert_close(p.grad, grads[n], rtol=1e-3, atol=1e-6, msg=n)


def saved_bytes(model: nn.Module) -> int:
    """Bytes of the tensors autograd keeps for backward during one training forward."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(TOKENS, labels=TOKENS).loss.backward()
    return total


def test_int8_backward_equals_torchao_autograd_without_its_float_weight_copies(host):
    model = quantized(host, "int8")
    plain = copy.deepcopy(model)
    for m in plain.modules():
        if isinstance(m, FrozenInt8Linear):
            m.__class__ = nn.Linear  # torchao's own forward, differentiated by autograd
    for m in (model, plain):
        torch.manual_seed(3)
        mmpreproj.inject(m)
        m.train()
    kept, torchao_kept = saved_bytes(model), saved_bytes(plain)
    grads = {n: p.grad for n, p in plain.named_parameters() if p.requires_grad}
    for n, p in model.named_parameters():
        if p.requires_grad:
            assert torch.equal(p.grad, grads[n]), n  # the same ops on the same values
    # every int8 layer whose input needs a gradient (all but block 0's MLP, whose input may not): autograd kept
    # a float32 copy of its weight; FrozenInt8Linear keeps none
    on_path = [m for n, m in model.named_modules() if isinstance(m, FrozenInt8Linear) and "layers.0.mlp" not in n]
    assert torchao_kept - kept >= sum(m.weight.numel() * 4 for m in on_path)


def test_adapter_reloads_bit_exact_into_a_freshly_quantized_base(host, scheme, tmp_path):
    model = quantized(host, scheme)
    mmpreproj.inject(model)
    train_steps(model)
    model.eval()
    trained = logits(model)
    mmpreproj.save_adapter(model, tmp_path)
    fresh = quantized(host, scheme)
    mmpreproj.load_adapter(fresh, tmp_path, is_trainable=True)
    assert torch.equal(logits(fresh), trained)
    assert {p.dtype for p in fresh.parameters() if p.requires_grad} == {torch.float32}


def test_unload_restores_the_quantized_base_exactly(host, scheme):
    model = quantized(host, scheme)
    before, base = snapshot(model), logits(model)
    ids = [id(p) for p in model.parameters()]
    mmpreproj.inject(model)
    train_steps(model, steps=1)
    mmpreproj.unload(model.eval())
    assert [id(p) for p in model.parameters()] == ids
    assert_same(snapshot(model), before)
    assert torch.equal(logits(model), base)


def test_bf16_autocast_keeps_injected_weights_fp32(scheme):
    model = quantized("llama", scheme)
    mmpreproj.inject(model)
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(TOKENS, labels=TOKENS).loss
    loss.backward()
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert {p.dtype for p in trainable} == {torch.float32}
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in trainable)


def test_bf16_base_quantized_trains_fp32_modules_in_bf16(scheme, tmp_path):
    model = quantize_frozen_base(tiny_llama().to(torch.bfloat16), scheme)
    base = logits(model)
    mmpreproj.inject(model, IDENTITY)
    assert base.dtype == torch.bfloat16 and torch.equal(logits(model), base)
    mmpreproj.unload(model)
    mmpreproj.inject(model)  # compute_dtype="input": fp32 weights, bf16 matmuls like the host's
    losses = train_steps(model, steps=2)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert {p.dtype for p in trainable} == {torch.float32} and losses[-1] < losses[0]
    mmpreproj.save_adapter(model.eval(), tmp_path)
    fresh = mmpreproj.load_adapter(quantize_frozen_base(tiny_llama().to(torch.bfloat16), scheme), tmp_path)
    assert torch.equal(logits(fresh), logits(model))


def test_a_quantized_module_cannot_be_kept_trainable(scheme):
    model = quantized("gpt_neox", scheme)
    before = snapshot(model)
    with pytest.raises(ValueError, match="modules_to_save: 'gpt_neox.layers.1.mlp'.*holds quantized weights"):
        mmpreproj.inject(model, PreProjConfig(modules_to_save=["gpt_neox.layers.1.mlp"]))
    assert not mmpreproj.is_injected(model)
    assert_same(snapshot(model), before)
    mmpreproj.inject(model, PreProjConfig(modules_to_save=["lm_head"]))  # a float module still can
    assert model.lm_head.weight.requires_grad


def test_fp4_scheme_trains_and_reloads(tmp_path):
    model = quantized("gpt_neox", "fp4")
    assert model.gpt_neox.layers[0].attention.query_key_value.weight.quant_type == "fp4"
    mmpreproj.inject(model)
    train_steps(model, steps=1)
    mmpreproj.save_adapter(model.eval(), tmp_path)
    fresh = mmpreproj.load_adapter(quantized("gpt_neox", "fp4"), tmp_path)
    assert torch.equal(logits(fresh), logits(model))


def test_refusals_name_the_allowed_values():
    with pytest.raises(ValueError, match=r"scheme='int4'; allowed values: \['fp4', 'int8', 'nf4'\]"):
        quantize_frozen_base(tiny_neox(), "int4")
    assert sorted(QUANT_SCHEMES) == ["fp4", "int8", "nf4"]
    injected = mmpreproj.inject(tiny_neox())
    with pytest.raises(RuntimeError, match="quantize the base first, then inject"):
        quantize_frozen_base(injected, "int8")
    model = quantize_frozen_base(tiny_neox(), "int8")
    with pytest.raises(ValueError, match="already holds quantized weights"):
        quantize_frozen_base(model, "nf4")
    with pytest.raises(ValueError, match="has no nn.Linear to quantize"):
        quantize_frozen_base(nn.Sequential(nn.LayerNorm(4)), "int8")
    tied = tiny_llama()
    tied.lm_head.weight = tied.model.embed_tokens.weight
    with pytest.raises(ValueError, match=r"\['model.embed_tokens.weight', 'lm_head.weight'\] share one weight"):
        quantize_frozen_base(tied, "int8", skip_modules=())
    with pytest.raises(TypeError, match="skip_modules must be a list"):
        quantize_frozen_base(tiny_neox(), "int8", skip_modules="lm_head")


def test_transformers_bitsandbytes_4bit_loading_path(tmp_path):
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    tiny_neox().save_pretrained(tmp_path / "base")
    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float32)

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "base", quantization_config=q, device_map="cpu")
    n = sum(type(m).__name__ == "Linear4bit" for m in model.modules())
    assert n == 8 and disable_cpu_4bit_packing(model) == n
    base = logits(model)
    mmpreproj.inject(model, IDENTITY)
    assert torch.equal(logits(model), base)
    mmpreproj.unload(model)
    mmpreproj.inject(model)
    train_steps(model, steps=2)
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)
    mmpreproj.save_adapter(model.eval(), tmp_path / "adapter")
    fresh = AutoModelForCausalLM.from_pretrained(tmp_path / "base", quantization_config=q, device_map="cpu")
    disable_cpu_4bit_packing(fresh)
    mmpreproj.load_adapter(fresh, tmp_path / "adapter")
    assert torch.equal(logits(fresh), logits(model))


@pytest.mark.skipif(
    not bnb.functional.has_avx512bf16(), reason="bitsandbytes repacks 4-bit weights only on AVX512-BF16 CPUs"
)
def test_disable_packing_refuses_a_model_already_repacked():
    from mmpreproj.integrations.quantized import _targets

    model = tiny_neox()
    for parent, name, linear in _targets(model, ("embed_out",)):  # bnb's own module, packing left on
        q = bnb.nn.Linear4bit(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            compute_dtype=torch.float32,
            quant_type="nf4",
        )
        q.load_state_dict(linear.state_dict())
        setattr(parent, name, q.to("cpu").eval())
    logits(model)  # eval, no grad: bitsandbytes repacks in place; that layer now passes no gradient
    with pytest.raises(RuntimeError, match="already repacked.*cannot pass gradients"):
        disable_cpu_4bit_packing(model)


def test_recipe_runs_on_a_tiny_model(tiny_model_dir, tmp_path):
    spec = importlib.util.spec_from_file_location(
        "quantized_base", REPO / "recipes" / "integrations" / "quantized_base.py"
    )
    recipe = importlib.util.module_from_spec(spec)
    sys.modules["quantized_base"] = recipe
    spec.loader.exec_module(recipe)
    args = f"--model {tiny_model_dir} --out {tmp_path / 'run'} --steps 3 --train-lines 16 --eval-lines 8 --max-len 32"
    out = recipe.main([*args.split(), "--batch-size", "4"])
    assert out["reload_bit_exact"] and out["ppl_after"] < out["ppl_before"]
    assert (tmp_path / "run" / "adapter" / "adapter_model.safetensors").is_file()
    assert out["base_bytes"]["int8"] < out["base_bytes"]["float32"]
