"""A plain transformers `Trainer` with the method, no Trainer subclass: a `PeftModel` of PREPROJ (what trains,
bf16 autocast), and `preproj_lora` (peft's LoRA on top of an injection): peft's checkpoints hold both parts,
a resume after a stop is bit-exact, and the one loader rebuilds the trained model from a fresh base (the folder's
layout: tests/method/api/test_preproj_lora_layout.py).
(Resume, activation checkpointing and best-model reload of a PREPROJ PeftModel:
tests/method/model/test_peft_lifecycle.py.)"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.helpers.training import trainer_args
from tests.helpers.zoo import tiny_neox

datasets = pytest.importorskip("datasets")
pytest.importorskip("accelerate")
peft = pytest.importorskip("peft")
from safetensors.torch import load_file  # noqa: E402
from transformers import Trainer  # noqa: E402

import mmpreproj  # noqa: E402
from mmpreproj.train import apply_method  # noqa: E402
from tests.helpers.callbacks import StopAfterSave  # noqa: E402

STEPS = 6


@pytest.fixture(scope="module")
def lm_data():
    ids = torch.randint(0, 128, (32, 16), generator=torch.Generator().manual_seed(0)).tolist()
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})


def _args(out, **kw):
    return trainer_args(out, STEPS, **kw)


def _fit(out, data, model, *, callbacks=(), resume=None, **kw) -> Trainer:
    trainer = Trainer(model=model, args=_args(out, **kw), train_dataset=data, callbacks=list(callbacks))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _losses(trainer) -> list[float]:
    return [row["loss"] for row in trainer.state.log_history if "loss" in row]


def _trained(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _preproj_lora():
    return apply_method(tiny_neox(), "preproj_lora", lora_r=4)


def test_only_the_adapter_trains_and_bf16_autocast_keeps_it_fp32(tmp_path, lm_data):
    model = peft.get_peft_model(tiny_neox(), mmpreproj.PreProjConfig())
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    seen = set()
    model.base_model.model.gpt_neox.layers[0].mlp.dense_h_to_4h.register_forward_hook(
        lambda m, a, out: seen.add(out.dtype)
    )
    init = _trained(model)
    trainer = _fit(tmp_path, lm_data, model, max_steps=2, save_strategy="no", bf16=True)
    assert torch.bfloat16 in seen  # the autocast was on
    in_optimizer = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {
        id(p) for w in mmpreproj.injected_modules(model) for p in w.parameters() if p.requires_grad
    }
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if n in base)
    after = _trained(model)
    assert {v.dtype for v in after.values()} == {torch.float32}
    assert all(not torch.equal(after[k], init[k]) for k in init if k.endswith("up.weight"))
    moments = [s["exp_avg"] for s in trainer.optimizer.state.values()]
    assert moments and {m.dtype for m in moments} == {torch.float32}


def test_preproj_lora_checkpoints_both_parts_and_resumes_bit_exact(tmp_path, lm_data):
    model = _preproj_lora()
    whole = _fit(tmp_path / "whole", lm_data, model)
    ref = _trained(model)
    assert any("lora_" in n for n in ref) and any(".preproj." in n for n in ref)

    _fit(tmp_path / "cut", lm_data, _preproj_lora(), callbacks=[StopAfterSave(2)])
    ckpt = tmp_path / "cut" / "checkpoint-2"
    names = {p.name for p in ckpt.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "optimizer.pt"} <= names
    assert not names & {"model.safetensors", "pytorch_model.bin", "config.json"}  # no copy of the base
    assert json.loads((ckpt / "adapter_config.json").read_text())["peft_type"] == "LORA"
    saved = load_file(str(ckpt / "adapter_model.safetensors"))  # peft's LoRA alone, as on the plain base
    assert any("lora_A" in k for k in saved) and not any(".preproj" in k or ".base_layer." in k for k in saved)
    ours = load_file(str(ckpt / "preproj" / "adapter_model.safetensors"))
    assert any(".preproj." in k and k.endswith(".up.weight") for k in ours)

    fresh = _preproj_lora()  # our weights scrambled: the resume must load them from preproj/
    with torch.no_grad():
        for w in mmpreproj.injected_modules(fresh):
            w.slots()[0].up.weight.normal_()
    resumed = _fit(tmp_path / "cut", lm_data, fresh, resume=True)
    got = _trained(fresh)
    assert got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in ref)
    assert _losses(resumed) == _losses(whole)


def test_preproj_lora_reloads_through_the_one_loader_and_unloads(tmp_path, lm_data):
    model = _preproj_lora()
    trainer = _fit(tmp_path / "run", lm_data, model, max_steps=2, save_strategy="no")
    trained = _trained(model)
    final = tmp_path / "final"
    trainer.save_model(str(final))  # peft's LoRA file at the top and our injection in preproj/
    assert (final / "preproj" / "adapter_config.json").is_file()
    x = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    model.eval()
    with torch.no_grad():
        want = model(x).logits
        reloaded = mmpreproj.load_adapter(tiny_neox(), final)
        assert isinstance(reloaded, peft.PeftModel) and not any(p.requires_grad for p in reloaded.parameters())
        assert torch.equal(reloaded.eval()(x).logits, want)
        trainable = mmpreproj.load_adapter(tiny_neox(), final, is_trainable=True)
        assert {n for n, p in trainable.named_parameters() if p.requires_grad} == trained.keys()  # both parts

        # the stacked unload() takes ours off (it holds LoRA's layers), then peft's takes LoRA: the base, bit-exact
        plain = reloaded.unload()
        assert not mmpreproj.is_injected(plain) and not any("lora_" in n for n, _ in plain.named_parameters())
        assert torch.equal(plain(x).logits, tiny_neox().eval()(x).logits)
        merged = model.merge_and_unload()  # the LoRA merged into the base: the injected model keeps the outputs
        assert mmpreproj.is_injected(merged)
        torch.testing.assert_close(merged(x).logits, want, rtol=1e-5, atol=1e-5)


def test_the_top_folder_without_preproj_is_the_plain_lora_part(tmp_path):
    """The top file is LoRA's as on the plain base (ours is written aside): without preproj/ beside it, the folder
    is a plain LoRA adapter and loads as one, weight for weight the trained LoRA."""
    model = _preproj_lora()
    model.save_pretrained(str(tmp_path))
    shutil.rmtree(tmp_path / "preproj")
    loaded = mmpreproj.load_adapter(tiny_neox(), tmp_path)
    assert isinstance(loaded, peft.PeftModel) and not mmpreproj.is_injected(loaded)
    want = {n.replace(".attention.base_layer.", ".attention."): p for n, p in model.named_parameters() if "lora_" in n}
    got = {n: p for n, p in loaded.named_parameters() if "lora_" in n}
    assert want and got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
