"""Several PREPROJ adapters as peft serves them: mixed-adapter batches equal per-row single-adapter forwards, and
what cannot be served (weighted adapters, several active at once, PeftMixedModel, hotswap, peft's module-name
targeting) is refused with the reason."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import transformers as tf
from peft import LoraConfig, get_peft_model

import mmpreproj
from mmpreproj import PreProjConfig
from tests.helpers.adapter_weights import perturb_adapters
from tests.helpers.trace_zoo import build as trace_build
from tests.helpers.zoo import BUILDERS, VOCAB, qwen2_vl, tokens, vl_inputs

HOSTS = ("gpt_neox", "llama")


@pytest.fixture(params=HOSTS)
def two_adapters(request):
    """A PeftModel on a tiny transformers decoder with adapters "default" and "b" (different sizes), in eval."""
    base = BUILDERS[request.param]()
    model = get_peft_model(base, PreProjConfig())
    model.add_adapter("b", PreProjConfig(expansion=0.5, skip_rank=4))
    perturb_adapters(model, seed=1)
    return model.eval()


def _row_outputs(model, ids: torch.Tensor, names: list[str]) -> torch.Tensor:
    """Each row alone, through its adapter (`set_adapter`) or the base (`disable_adapter`)."""
    rows = []
    for row, name in enumerate(names):
        x = ids[row : row + 1]
        if name == "__base__":
            with model.disable_adapter():
                rows.append(model(x).logits)
        else:
            model.set_adapter(name)
            rows.append(model(x).logits)
    model.set_adapter("default")
    return torch.cat(rows)


@torch.no_grad()
def test_a_mixed_batch_equals_each_row_through_its_own_adapter(two_adapters):
    model = two_adapters
    (ids,) = tokens(batch=4, length=7)
    names = ["b", "default", "__base__", "b"]
    got = model(ids, adapter_names=names).logits
    want = _row_outputs(model, ids, names)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    # the three ways differ on the same row, so the comparison above can fail
    same = ids[:1].expand(3, -1)
    outs = model(same, adapter_names=["b", "default", "__base__"]).logits
    assert not torch.allclose(outs[0], outs[1], atol=1e-3) and not torch.allclose(outs[1], outs[2], atol=1e-3)
    assert model.active_adapter == "default"  # a mixed batch switches nothing


def test_a_mixed_batch_trains_each_adapter_on_its_rows_only(two_adapters):
    model = two_adapters.train()
    for w in mmpreproj.injected_modules(model):
        for slot in w.adapter_layer_names:
            for module in getattr(w, slot).values():
                module.requires_grad_(True)
    (ids,) = tokens(batch=2, length=5)
    model(ids, adapter_names=["b", "__base__"]).logits.square().mean().backward()
    wrapper = mmpreproj.injected_modules(model)[0]
    assert wrapper.preproj["b"].up.weight.grad.abs().sum() > 0
    assert wrapper.preproj["default"].up.weight.grad is None  # no row ran through it


@torch.no_grad()
def test_mixed_batch_names_are_checked(two_adapters):
    model = two_adapters
    (ids,) = tokens(batch=2, length=5)
    with pytest.raises(ValueError, match=r"adapter_names=.*\['nope'\] are not loaded adapters"):
        model(ids, adapter_names=["default", "nope"])
    with pytest.raises(ValueError, match=r"3 names for a batch of 2 rows"):
        model(ids, adapter_names=["default", "b", "b"])
    with pytest.raises(ValueError, match=r"3 names for a batch of 2 rows"):  # counted even when all are one name
        model(ids, adapter_names=["b", "b", "b"])
    causal = get_peft_model(BUILDERS["llama"](), PreProjConfig(task_type="CAUSAL_LM"))  # peft's task class
    causal.add_adapter("b", PreProjConfig(task_type="CAUSAL_LM"))
    with pytest.raises(ValueError, match=r"3 names for a batch of 2 rows"):  # its forward passes input_ids apart
        causal(input_ids=ids, adapter_names=["b", "b", "b"])
    assert causal(input_ids=ids, adapter_names=["b", "b"]).logits.shape[0] == 2


@torch.no_grad()
def test_generate_serves_a_mixed_batch_also_under_beam_search(two_adapters):
    model = two_adapters
    (ids,) = tokens(batch=3, length=5)
    names = ["b", "__base__", "default"]
    for extra in ({}, {"num_beams": 2}):
        kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, **extra)
        got = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), adapter_names=names, **kw)
        for row, name in enumerate(names):
            one = dict(input_ids=ids[row : row + 1], attention_mask=torch.ones_like(ids[:1]), **kw)
            if name == "__base__":
                with model.disable_adapter():
                    want = model.generate(**one)
            else:
                model.set_adapter(name)
                want = model.generate(**one)
            assert torch.equal(got[row], want[0]), (extra, name)
        model.set_adapter("default")


@torch.no_grad()
def test_a_vision_language_model_serves_one_adapter_per_batch_and_refuses_a_mix_its_tower_cannot_split():
    """Qwen2-VL's vision tower packs every image's patches into one (patches, d) sequence: with one adapter for
    every row it runs as set_adapter would; rows with images through different adapters are refused, naming the
    tower's block and why, where the split would otherwise be read along the patches."""
    model = get_peft_model(qwen2_vl(), PreProjConfig())
    model.add_adapter("b", PreProjConfig(expansion=0.5))
    perturb_adapters(model, seed=3)
    model.eval()
    ids, pixels, grid = vl_inputs()
    batch = dict(input_ids=ids, pixel_values=pixels, image_grid_thw=grid, mm_token_type_ids=(ids == VOCAB + 2).long())
    for name in ("b", "default"):
        got = model(**batch, adapter_names=[name]).logits
        model.set_adapter(name)
        torch.testing.assert_close(got, model(**batch).logits, atol=1e-6, rtol=0)
    assert not torch.allclose(model(**batch, adapter_names=["b"]).logits, got, atol=1e-3)  # the two differ
    two = {**batch, "input_ids": ids.repeat(2, 1), "mm_token_type_ids": batch["mm_token_type_ids"].repeat(2, 1)}
    two.update(pixel_values=pixels.repeat(2, 1), image_grid_thw=grid.repeat(2, 1))
    with pytest.raises(ValueError, match=r"part 'vision'\) takes an input of shape \(32, 64\), with no batch dim"):
        model(**two, adapter_names=["b", "default"])
    text = torch.randint(3, VOCAB, (2, 6))  # text rows alone reach only the language blocks: a mix is served
    mixed = model(input_ids=text, adapter_names=["b", "default"]).logits
    model.set_adapter("b")
    torch.testing.assert_close(mixed[:1], model(input_ids=text[:1]).logits, atol=1e-6, rtol=0)


def test_what_cannot_be_served_is_refused_with_the_reason(two_adapters, tmp_path):
    model = two_adapters
    with pytest.raises(ValueError, match=r"add_weighted_adapter: .* nonlinear"):
        model.add_weighted_adapter(["default", "b"], [0.5, 0.5], "mix")
    with pytest.raises(ValueError, match=r"one adapter per forward: two pre-projections would feed one into"):
        model.base_model.set_adapter(["default", "b"])
    wrapper = mmpreproj.injected_modules(model)[0]
    with pytest.raises(ValueError, match=r"merge: the pre-projection .* is nonlinear"):
        wrapper.merge()
    assert model.active_adapter == "default" and wrapper.active_adapters == ["default"]
    with pytest.raises(ValueError, match=r"not compatible with the `PeftMixedModel`"):
        get_peft_model(BUILDERS["gpt_neox"](), PreProjConfig(), mixed=True)
    from peft.utils.hotswap import hotswap_adapter

    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"Hotswapping only supports .* PREPROJ"):
        hotswap_adapter(model, str(tmp_path), "default")


@pytest.mark.parametrize(
    ("word", "value"),
    [("target_modules", ["query_key_value"]), ("exclude_modules", ["dense"]), ("layers_pattern", "layers")],
)
def test_peft_module_targeting_words_are_refused_pointing_to_layers_and_parts(word, value):
    with pytest.raises(ValueError, match=rf"PreProjConfig.{word}=.*layers=\[...\].*parts=\[...\]"):
        PreProjConfig(**{word: value})


def test_layers_to_transform_is_layers():
    assert PreProjConfig(layers_to_transform=[1]).layers == [1] and PreProjConfig(layers_to_transform=0).layers == [0]
    model = get_peft_model(BUILDERS["gpt_neox"](), PreProjConfig(layers_to_transform=[1]))
    assert [w.block_index for w in mmpreproj.injected_modules(model)] == [1]
    with pytest.raises(ValueError, match=r"layers_to_transform=\[1\] and layers=\[0\] both given"):
        PreProjConfig(layers=[0], layers_to_transform=[1])


def test_the_wrapper_is_peft_s_layer_one_module_dict_per_slot(two_adapters):
    wrapper = mmpreproj.injected_modules(two_adapters)[0]
    assert wrapper.adapter_layer_names == ("preproj", "preproj_skip")
    assert all(isinstance(getattr(wrapper, s), torch.nn.ModuleDict) for s in wrapper.adapter_layer_names)
    assert wrapper.adapter_names() == ["b", "default"] and wrapper.active_adapters == ["default"]
    assert wrapper.slots("b")[1].rank == 4 and wrapper.slots()[1].rank is None
    wrapper.set_requires_grad("b", requires_grad=True)
    assert all(p.requires_grad for m in wrapper.slots("b") for p in m.parameters())
    wrapper.enable_adapters(False)
    assert wrapper.disable_adapters and not wrapper.adapter_enabled
    wrapper.enable_adapters(True)
    status = two_adapters.get_model_status()  # peft reads the slot modules' view
    assert status.enabled is True and status.available_adapters == ["b", "default"]
    assert status.active_adapters == ["default"]
    two_adapters.set_adapter("b")
    assert two_adapters.get_model_status().active_adapters == ["b"] and wrapper.active_adapters == ["b"]
    with two_adapters.disable_adapter():
        assert two_adapters.get_model_status().enabled is False and wrapper.disable_adapters


def test_a_mixed_batch_through_a_sequence_first_attention_is_refused_not_misread():
    from mmpreproj.hosts.spec import AttentionCall
    from mmpreproj.method.layer import PreProjAttention
    from mmpreproj.modules import ContentSkip, PreProjection

    mha = torch.nn.MultiheadAttention(16, 2, batch_first=False)
    call = AttentionCall(inputs=((0, "query"), (1, "key"), (2, "value")), output_index=0)
    wrapper = PreProjAttention(mha, call, PreProjection(16), ContentSkip(16), block_index=0)
    x = torch.randn(3, 3, 16)  # (N, B, d): as many rows as tokens, so a dim-0 split would go unnoticed
    wrapper(x, x, x, need_weights=False)  # a plain forward runs
    with pytest.raises(ValueError, match=r"batch_first=False\) takes the batch in dim 1"):
        wrapper(x, x, x, need_weights=False, adapter_names=["default", "__base__", "default"])


@pytest.mark.parametrize("route", ["inject", "peft"])
def test_a_mixed_batch_is_refused_while_modules_to_save_train_in_place(route, tmp_path):
    """Our `modules_to_save` are the host's own modules, holding the active adapter's values: a row of another
    adapter or of the base would run through them, silently wrong, so a mix is refused; one name for every row
    (the active one) still runs."""
    cfg = dict(modules_to_save=["lm_head"])
    other = mmpreproj.inject(BUILDERS["gpt_neox"](), PreProjConfig(**cfg))
    with torch.no_grad():
        other.lm_head.weight.mul_(2.0)
    mmpreproj.save_adapter(other, tmp_path / "b")
    base = BUILDERS["gpt_neox"]()
    model = (
        mmpreproj.inject(base, PreProjConfig(**cfg))
        if route == "inject"
        else get_peft_model(base, PreProjConfig(**cfg))
    )
    model.eval()
    ids = tokens(batch=2)[0]
    with torch.no_grad():
        want = model(ids).logits
        assert torch.equal(model(ids, adapter_names=["default", "default"]).logits, want)
        with pytest.raises(ValueError, match=r"rows of \['__base__'\] would run through the modules_to_save"):
            model(ids, adapter_names=["default", "__base__"])
        mmpreproj.load_adapter(model, tmp_path / "b", adapter_name="b")
        with pytest.raises(ValueError, match=r"rows of \['b'\] would run through the modules_to_save of the active"):
            model(ids, adapter_names=["b", "default"])
        assert torch.equal(model(ids).logits, want)


def _in_place_pair(build, tmp_path, inputs):
    """`build()` injected in place with adapters "default" and "b" (b loaded from a folder, other weights), eval."""
    other = mmpreproj.inject(build(), PreProjConfig(skip_init_std=0.05))
    perturb_adapters(other, seed=2)
    mmpreproj.save_adapter(other, tmp_path / "b")
    model = mmpreproj.inject(build(), PreProjConfig(skip_init_std=0.05))
    perturb_adapters(model, seed=1)
    mmpreproj.load_adapter(model, tmp_path / "b", adapter_name="b")
    return model.eval()


def _vit():
    import timm

    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=2, num_classes=5)


IN_PLACE_HOSTS = {  # builder, batch of 3 rows, output of a forward
    "llama": (BUILDERS["llama"], lambda: tokens(batch=3)[0], lambda m, x, **kw: m(x, **kw).logits),
    # blocks that call their attention without the forward's keyword arguments
    "stablelm": (BUILDERS["stablelm"], lambda: tokens(batch=3)[0], lambda m, x, **kw: m(x, **kw).logits),
    "mpt": (
        partial(trace_build, "Mpt", "MptForCausalLM", d_model=32, n_heads=4, n_layers=2, expansion_ratio=2),
        lambda: tokens(batch=3)[0],
        lambda m, x, **kw: m(x, **kw).logits,
    ),
    # a host whose forward takes no adapter_names at all
    "timm_vit": (_vit, lambda: torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0)), None),
}


@pytest.mark.parametrize("host", sorted(IN_PLACE_HOSTS))
@torch.no_grad()
def test_an_in_place_mixed_batch_reaches_every_block_whatever_the_host_passes_on(host, tmp_path):
    """In place, `model(x, adapter_names=[...])` reaches every wrapper by the injected model's own pre-hook, not
    through the host's keyword arguments: StableLM's and MPT's blocks call their attention without them (each row
    ran the active adapter, unknown names passed), and timm's forward takes none. Each row equals its own run."""
    build, inputs, run = IN_PLACE_HOSTS[host]
    run = run or (lambda m, x, **kw: m(x, **kw))
    model, x = _in_place_pair(build, tmp_path, inputs), inputs()
    names = ["b", "__base__", "default"]
    got = run(model, x, adapter_names=names)
    want = []
    for row, name in enumerate(names):
        if name == "__base__":
            with mmpreproj.adapter_disabled(model):
                want.append(run(model, x[row : row + 1]))
        else:
            mmpreproj.set_adapter(model, name)
            want.append(run(model, x[row : row + 1]))
    mmpreproj.set_adapter(model, "default")
    torch.testing.assert_close(got, torch.cat(want), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(want[0], want[2], atol=1e-4)  # the adapters differ, so a row run wrong shows
    with pytest.raises(ValueError, match=r"\['nope'\] are not loaded adapters"):
        run(model, x, adapter_names=["nope", "b", "default"])
    with pytest.raises(ValueError, match="names for 3 rows|names for a batch"):
        run(model, x, adapter_names=["b", "default"])
    assert not any(w._forward_pre_hooks for w in mmpreproj.injected_modules(model))  # none left, even after errors
    torch.testing.assert_close(run(model, x), run(model, x, adapter_names=["default"] * 3), atol=0, rtol=0)


def _swin():
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.SwinConfig(
        image_size=16, patch_size=2, embed_dim=64, depths=[2], num_heads=[4], window_size=3, num_labels=3
    )
    return tf.SwinForImageClassification(cfg).eval()


@torch.no_grad()
def test_a_mix_through_windowed_attention_is_refused_naming_the_rows_it_sees(tmp_path):
    """Swin's attention sees windows, not images (27 windows for 3 images here): a mix is refused naming the count,
    and the model runs as before it."""
    model = _in_place_pair(_swin, tmp_path, None)
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    want = model(pixel_values=x).logits
    with pytest.raises(ValueError, match=r"3 names for 27 rows in the attention of block 0"):
        model(pixel_values=x, adapter_names=["default", "b", "__base__"])
    assert not any(w._forward_pre_hooks for w in mmpreproj.injected_modules(model))
    torch.testing.assert_close(model(pixel_values=x).logits, want, atol=0, rtol=0)


def _t5(seed: int = 0):
    torch.manual_seed(seed)
    cfg = tf.T5Config(
        vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0, pad_token_id=0
    )
    return tf.T5ForConditionalGeneration(cfg).eval()


@pytest.mark.parametrize(
    "config", [PreProjConfig(), LoraConfig(r=4, target_modules="all-linear")], ids=["ours", "lora"]
)
@torch.no_grad()
def test_sampled_sequences_take_one_name_per_returned_row_as_lora(config):
    """With sampling and `num_return_sequences`, transformers repeats each prompt; peft repeats LoRA's names only per
    beam, so a mix names every returned row, and one name per prompt is refused: the same calls for ours and LoRA
    (ours repeated the names itself before, and refused LoRA's form)."""
    model = get_peft_model(BUILDERS["llama"](), config)
    model.add_adapter("b", config)
    model.eval()
    (ids,) = tokens(batch=2, length=5)
    kw = dict(input_ids=ids, do_sample=True, num_return_sequences=2, max_new_tokens=3, pad_token_id=0)
    torch.manual_seed(0)
    got = model.generate(**kw, adapter_names=["default", "default", "b", "b"])
    torch.manual_seed(0)
    same = model.generate(**kw, adapter_names=["default", "default", "default", "default"])
    assert got.shape == (4, 8) and torch.equal(got[:2], same[:2])  # the rows of "default" draw as before
    with pytest.raises(ValueError, match=r"2 names for a batch of 4 rows|should be the same as the number of inputs"):
        model.generate(**kw, adapter_names=["default", "b"])


@pytest.mark.parametrize(
    "config", [PreProjConfig(), LoraConfig(r=4, target_modules="all-linear")], ids=["ours", "lora"]
)
@torch.no_grad()
def test_an_encoder_decoder_serves_a_mix_under_beam_search(config):
    """Under beam search the encoder runs once per prompt and the decoder once per beam: the encoder's layers get the
    names as passed, the decoder's each repeated per beam (peft's rule for LoRA); each row equals that prompt
    generated alone with its adapter. Ours refused it before (6 names for the encoder's 2 rows)."""
    model = get_peft_model(_t5(), config)
    model.add_adapter("b", config)
    with torch.no_grad():  # off their init (LoRA's B = 0 too), so a row run through the wrong adapter differs
        g = torch.Generator().manual_seed(2)
        for name, p in model.named_parameters():
            if ".b." in name:  # adapter "b" only: "default" stays at init (the base, for LoRA)
                p.add_(0.5 * torch.randn(p.shape, generator=g))
    model.eval()
    ids = torch.randint(3, 96, (2, 7), generator=torch.Generator().manual_seed(1))
    kw = dict(num_beams=3, max_new_tokens=4, do_sample=False)
    names = ["b", "__base__"]
    got = model.generate(input_ids=ids, adapter_names=names, **kw)
    with model.disable_adapter():
        assert not torch.equal(got[0], model.generate(input_ids=ids[:1], **kw)[0, : got.shape[1]])  # "b" is no base
    for row, name in enumerate(names):
        if name == "__base__":
            with model.disable_adapter():
                want = model.generate(input_ids=ids[row : row + 1], **kw)
        else:
            model.set_adapter(name)
            want = model.generate(input_ids=ids[row : row + 1], **kw)
        assert torch.equal(got[row, : want.shape[1]], want[0]), name
