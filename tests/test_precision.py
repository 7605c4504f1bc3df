"""Precision: fp32 master weights computing in the host's dtype (bf16/fp16 hosts, autocast), the cast cache,
the recomputed activation, and the input-embedding hook paid only under reentrant checkpointing."""

from __future__ import annotations

import copy
import warnings

import pytest
import timm
import torch
import torch.nn.functional as F

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj.modules import ContentSkip, PreProjection
from tests.helpers.zoo import tiny_neox

HALF = [torch.bfloat16, torch.float16]


def tiny_vit(seed: int = 0):
    torch.manual_seed(seed)
    return timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=32,
        patch_size=8,
        embed_dim=64,
        depth=2,
        num_heads=4,
        num_classes=10,
    ).eval()


def neox_inputs():
    return torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))


def vit_inputs():
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


HOSTS = {
    "neox": (tiny_neox, neox_inputs, lambda m, x: m(x).logits),
    "vit": (tiny_vit, vit_inputs, lambda m, x: m(x.to(next(m.parameters()).dtype))),
}


def _host(name, dtype, config=None, seed=0):
    build, inputs, run = HOSTS[name]
    model = build(seed=seed).to(dtype)
    if config is not None:
        mmpreproj.inject(model, config)
    return model, inputs(), run


def _injected(model):
    return {
        f"{w.block_index}.{n}": p
        for w in mmpreproj.injected_modules(model)
        for n, p in w.named_parameters()
        if p.requires_grad
    }


def _perturb(model, std=0.05, seed=3):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in _injected(model).values():
            p.normal_(std=std)


@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
@pytest.mark.parametrize("host", HOSTS)
def test_weights_stay_fp32_and_one_adamw_step_at_1e5_moves_all(host, dtype):
    model, x, run = _host(host, dtype, PreProjConfig())
    params = _injected(model)
    assert {p.dtype for p in params.values()} == {torch.float32}
    before = {n: p.detach().clone() for n, p in params.items()}
    model.train()
    run(model, x).float().square().mean().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in params.values())
    torch.optim.AdamW(params.values(), lr=1e-5).step()
    changed = torch.cat([(p != before[n]).flatten() for n, p in params.items()]).float().mean().item()
    assert changed > 0.99, f"only {changed:.2f} of the fp32 weights moved"


@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
@pytest.mark.parametrize("host", HOSTS)
def test_identity_init_is_bit_exact_on_a_half_host(host, dtype):
    model, x, run = _host(host, dtype)
    with torch.no_grad():
        ref = run(model, x)
        mmpreproj.inject(model, PreProjConfig(init="identity", skip_init_std=0))
        out = run(model, x)
    assert out.dtype == dtype and torch.equal(out, ref)


def _outputs_and_grads(host, dtype, compute_dtype):
    model, x, run = _host(host, dtype, PreProjConfig(compute_dtype=compute_dtype))
    _perturb(model)
    model.train() if host == "neox" else model.eval()
    out = run(model, x)
    out.float().square().mean().backward()
    return out.detach(), {n: p.grad for n, p in _injected(model).items()}


@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
@pytest.mark.parametrize("host", HOSTS)
def test_half_compute_agrees_with_fp32_compute(host, dtype):
    """Outputs and gradients of host-dtype compute vs fp32 compute (the earlier behaviour) of the same weights."""
    out, grads = _outputs_and_grads(host, dtype, "input")
    ref, ref_grads = _outputs_and_grads(host, dtype, "float32")
    assert out.dtype == dtype and not torch.equal(out, ref)  # the test can fail: different arithmetic
    scale = ref.float().abs().max()
    torch.testing.assert_close(out.float(), ref.float(), rtol=0, atol=0.02 * scale)
    for n, g in grads.items():
        assert g.dtype == torch.float32
        err = (g - ref_grads[n]).norm() / ref_grads[n].norm()
        assert err < 0.05, f"{n}: relative gradient error {err:.3f}"


@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
def test_modules_compute_in_the_input_dtype(dtype):
    pp, skip = PreProjection(16), ContentSkip(16, init_std=0.05)
    x = torch.randn(3, 16).to(dtype)
    with torch.no_grad():
        y = pp(x)
        want = x + F.linear(F.silu(F.linear(x, pp.up.weight.to(dtype))), pp.down.weight.to(dtype))
        assert y.dtype == dtype and torch.equal(y, want)
        assert torch.equal(skip(x), F.linear(x, skip.weight.to(dtype)))
    assert pp.up.weight.dtype == torch.float32


def test_autocast_computes_in_the_autocast_dtype_from_an_fp32_host():
    pp, skip = PreProjection(16), ContentSkip(16, init_std=0.05)
    x = torch.randn(3, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = pp(x)
        s = skip(y)
    assert y.dtype == s.dtype == torch.bfloat16
    (y.float().sum() + s.float().sum()).backward()
    assert pp.up.weight.grad.dtype == skip.weight.grad.dtype == torch.float32 and x.grad.dtype == torch.float32


@pytest.mark.parametrize("activation", ["silu", "gelu", "relu"])
def test_recomputed_activation_gives_autograd_gradients_and_saves_less(activation):
    torch.manual_seed(0)
    pp = PreProjection(16, activation=activation).double()
    with torch.no_grad():
        pp.down.weight.normal_(std=0.1)
    x = torch.randn(5, 16, dtype=torch.float64, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = pp(x)
    y.square().sum().backward()
    got = [x.grad, pp.up.weight.grad, pp.down.weight.grad]
    ref_x = x.detach().clone().requires_grad_(True)
    ref = ref_x + pp.down(pp.act(pp.up(ref_x)))
    want = torch.autograd.grad(ref.square().sum(), [ref_x, pp.up.weight, pp.down.weight])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    acts = {t.untyped_storage().data_ptr() for t in saved} - {p.untyped_storage().data_ptr() for p in pp.parameters()}
    assert len(acts) == 2  # x^ and W_up x^; act(W_up x^) is recomputed in backward


# --- the cast cache -----------------------------------------------------------------------------------


def _cached(model):
    return {
        (id(w), k): id(t)
        for w in mmpreproj.injected_modules(model)
        for m in (w.slots()[0], w.slots()[1])
        for k, (_, _, t) in m.casts._casts.items()
    }


@pytest.mark.parametrize("fused", [False, True], ids=["adamw", "adamw_fused"])
def test_cast_cache_is_reused_and_invalidated_by_an_optimizer_step(fused):
    model, x, _ = _host("neox", torch.bfloat16, PreProjConfig())
    with torch.no_grad():
        out0 = model(x).logits
        first = _cached(model)
        assert len(first) == 3 * model.config.num_hidden_layers  # W_up, W_down, W_skip per block, once
        torch.testing.assert_close(model(x).logits, out0, rtol=0, atol=0)
        assert _cached(model) == first  # reused, not re-cast
    model.train()
    model(x, labels=x).loss.backward()
    torch.optim.AdamW(_injected(model).values(), lr=1e-2, fused=fused).step()
    model.eval()
    fresh = copy.deepcopy(model)  # a copy starts with no casts
    with torch.no_grad():
        out1 = model(x).logits
        assert not torch.equal(out1, out0)
        assert torch.equal(out1, fresh(x).logits)


def test_generate_casts_once(tokens=None):
    model, x, _ = _host("neox", torch.bfloat16, PreProjConfig())
    with torch.no_grad():
        model.generate(x, max_new_tokens=2, do_sample=False, pad_token_id=0)
        first = _cached(model)
        model.generate(x, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert first and _cached(model) == first


def test_cast_cache_invalidated_by_load_adapter_and_state_dict_and_to(tmp_path):
    trained, x, _ = _host("neox", torch.bfloat16, PreProjConfig())
    _perturb(trained)
    mmpreproj.save_adapter(trained, tmp_path / "a")
    model, _, _ = _host("neox", torch.bfloat16, PreProjConfig())
    with torch.no_grad():
        stale = model(x).logits
        want = trained(x).logits
        mmpreproj.unload(model)
        mmpreproj.load_adapter(model, tmp_path / "a")
        assert torch.equal(model(x).logits, want)
        # in-place loads into the same modules, and a round trip through another dtype (new storage)
        wrappers = mmpreproj.injected_modules(model)
        originals = [{k: v.clone() for k, v in w.slots()[0].state_dict().items()} for w in wrappers]
        for w in wrappers:
            w.slots()[0].load_state_dict({k: torch.zeros_like(v) for k, v in w.slots()[0].state_dict().items()})
        assert not torch.equal(model(x).logits, want)
        for w, sd in zip(wrappers, originals):
            w.slots()[0].to(torch.float64)
            w.slots()[0].up.weight.copy_(sd["up.weight"])
            w.slots()[0].down.weight.copy_(sd["down.weight"])
            w.slots()[0].to(torch.float32)
        assert torch.equal(model(x).logits, want) and not torch.equal(want, stale)


def test_training_forward_never_uses_a_cached_cast():
    model, x, _ = _host("neox", torch.bfloat16, PreProjConfig())
    with torch.no_grad():
        model(x)
    model.train()
    model(x, labels=x).loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in _injected(model).values())


def test_float32_compute_dtype_is_the_earlier_behaviour():
    pp = PreProjection(16, compute_dtype="float32")
    x = torch.randn(3, 16).bfloat16()
    with torch.no_grad():
        want = (x.float() + pp.down(pp.act(pp.up(x.float())))).bfloat16()
        assert torch.equal(pp(x), want)
    with pytest.raises(ValueError, match="allowed values"):
        PreProjConfig(compute_dtype="bfloat16")
    assert PreProjConfig().compute_dtype == "input"


# --- the input-embedding hook: only under reentrant checkpointing -------------------------------------


def _embedding_requires_grad(model, emb, x, run):
    seen = []
    handle = emb.register_forward_hook(lambda m, a, o: seen.append(o.requires_grad))
    try:
        run(model, x).float().square().mean().backward()
    finally:
        handle.remove()
    return seen[0]


@pytest.mark.parametrize("mode", [None, False, True], ids=["plain", "non_reentrant", "reentrant"])
def test_embedding_hook_under_any_transformers_checkpointing_neox(mode):
    """transformers' checkpoint function is private, so its checkpointing counts as reentrant whichever variant
    (as transformers' and peft's own input-grad hooks do); plain training leaves the embedding output alone."""
    model, x, run = _host("neox", torch.float32, PreProjConfig())
    _perturb(model)
    ref = copy.deepcopy(model).train()
    run(ref, x).float().square().mean().backward()
    model.train()
    if mode is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": mode})
        model.disable_input_require_grads()  # leave only mmpreproj's hook
    assert _embedding_requires_grad(model, model.get_input_embeddings(), x, run) == (mode is not None)
    ref_grads = _injected(ref)
    for n, p in _injected(model).items():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient for {n}"
        torch.testing.assert_close(p.grad, ref_grads[n].grad, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_embedding_hook_only_under_reentrant_checkpointing_timm(reentrant):
    from timm.layers import set_reentrant_ckpt, use_reentrant_ckpt

    model, x, run = _host("vit", torch.float32, PreProjConfig())
    _perturb(model)
    model.train().set_grad_checkpointing(True)
    before = use_reentrant_ckpt()
    set_reentrant_ckpt(reentrant)
    try:
        assert _embedding_requires_grad(model, model.patch_embed, x, run) == reentrant
    finally:
        set_reentrant_ckpt(before)
    for n, p in _injected(model).items():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient for {n}"
