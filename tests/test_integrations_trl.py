"""TRL's own `SFTTrainer` (no subclass) on a chat dataset built in code, with the shipped mini tokenizer:
`peft_config=PreProjConfig()`, and an injected model under a peft LoRA (the `preproj_lora` shape)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.zoo import tiny_neox

datasets = pytest.importorskip("datasets")
pytest.importorskip("trl")
peft = pytest.importorskip("peft")
from transformers import AutoTokenizer  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

import mmpreproj  # noqa: E402
from mmpreproj.train import apply_method  # noqa: E402
from tests.helpers.callbacks import StopAfterSave  # noqa: E402

MINI = Path(__file__).resolve().parents[1] / "assets" / "mini-pythia"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    tok = AutoTokenizer.from_pretrained(str(MINI))
    tok.chat_template = CHAT_TEMPLATE
    return tok


@pytest.fixture(scope="module")
def chat():
    rows = [
        {"messages": [{"role": "user", "content": f"What is {a} plus {b}?"},
                      {"role": "assistant", "content": f"{a} plus {b} is {a + b}."}]}
        for a in range(4) for b in range(4)
    ]  # fmt: skip
    return datasets.Dataset.from_list(rows)


def _model(tokenizer, method: str | None = None):
    model = tiny_neox(vocab_size=len(tokenizer))
    return model if method is None else apply_method(model, method, lora_r=4)


def _sft(out, model, tokenizer, chat, *, stop=None, resume=None, peft_config=None, **kw):
    args = SFTConfig(
        output_dir=str(out),
        max_steps=4,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        save_steps=2,
        report_to=[],
        seed=0,
        use_cpu=True,
        disable_tqdm=True,
        max_length=64,
        **kw,
    )  # SFTConfig's own defaults stay: bf16 autocast and activation checkpointing on
    callbacks = [StopAfterSave(stop)] if stop else []
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=chat,
        processing_class=tokenizer,
        callbacks=callbacks,
        peft_config=peft_config,
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _adapter(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in peft.get_peft_model_state_dict(model).items()}


def _trained(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def test_sft_with_peft_config_trains_the_adapter_checkpoints_it_and_resumes_bit_exact(tmp_path, tokenizer, chat):
    torch.manual_seed(1)
    trainer = _sft(tmp_path / "whole", _model(tokenizer), tokenizer, chat, peft_config=mmpreproj.PreProjConfig())
    model = trainer.model
    assert trainer.args.bf16 and trainer.args.gradient_checkpointing  # TRL's defaults, exercised here
    assert isinstance(model, peft.PeftModel) and model.peft_config["default"].peft_type == "PREPROJ"
    injected = {id(p) for w in mmpreproj.injected_modules(model) for p in w.parameters() if p.requires_grad}
    assert {id(p) for g in trainer.optimizer.param_groups for p in g["params"]} == injected
    ref = _adapter(model)
    assert {v.dtype for v in ref.values()} == {torch.float32}

    torch.manual_seed(1)
    _sft(tmp_path / "cut", _model(tokenizer), tokenizer, chat, stop=2, peft_config=mmpreproj.PreProjConfig())
    names = {p.name for p in (tmp_path / "cut" / "checkpoint-2").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= names
    assert "model.safetensors" not in names
    torch.manual_seed(7)  # another init: the resume must load the checkpoint's adapter
    resumed = _sft(
        tmp_path / "cut", _model(tokenizer), tokenizer, chat, resume=True, peft_config=mmpreproj.PreProjConfig()
    )
    got = _adapter(resumed.model)
    assert got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in ref)  # bit-exact


def test_preproj_lora_saves_resumes_reloads_and_unloads_through_sft(tmp_path, tokenizer, chat):
    fast = dict(bf16=False, gradient_checkpointing=False)
    model = _model(tokenizer, "preproj_lora")
    trainer = _sft(tmp_path / "whole", model, tokenizer, chat, **fast)
    trained = _trained(model)
    assert any("lora_" in n for n in trained) and any(".preproj." in n for n in trained)
    assert {id(p) for g in trainer.optimizer.param_groups for p in g["params"]} == {
        id(p) for p in model.parameters() if p.requires_grad
    }

    ckpt = tmp_path / "whole" / "checkpoint-4"
    assert json.loads((ckpt / "adapter_config.json").read_text())["peft_type"] == "LORA"  # peft's, at the top
    saved = load_file(str(ckpt / "adapter_model.safetensors"))
    assert saved and not any(".preproj" in k for k in saved)  # LoRA's alone: ours in preproj/
    ours = load_file(str(ckpt / "preproj" / "adapter_model.safetensors"))
    assert any(".preproj." in k and k.endswith(".up.weight") for k in ours)
    assert not (ckpt / "model.safetensors").exists()

    # stop after step 2, resume into a fresh preproj_lora model: both parts come back, training ends the same
    _sft(tmp_path / "cut", _model(tokenizer, "preproj_lora"), tokenizer, chat, stop=2, **fast)
    resumed = _model(tokenizer, "preproj_lora")
    _sft(tmp_path / "cut", resumed, tokenizer, chat, resume=True, **fast)
    again = _trained(resumed)
    assert again.keys() == trained.keys() and all(torch.equal(again[k], trained[k]) for k in trained)

    assert (ckpt / "preproj" / "adapter_config.json").is_file()  # our injection beside peft's: a base rebuilds both
    trainable = mmpreproj.load_adapter(tiny_neox(vocab_size=len(tokenizer)), ckpt, is_trainable=True)
    assert {n for n, p in trainable.named_parameters() if p.requires_grad} == trained.keys()  # both parts

    # reload from a fresh base: the same outputs
    x = torch.randint(1, len(tokenizer), (2, 12), generator=torch.Generator().manual_seed(1))
    model.eval()
    reloaded = mmpreproj.load_adapter(tiny_neox(vocab_size=len(tokenizer)), ckpt).eval()
    with torch.no_grad():
        want = model(x).logits
        assert torch.equal(reloaded(x).logits, want)

        # unload both parts: the stacked unload() takes ours off (it holds LoRA's layers), then peft's takes LoRA;
        # the base comes back bit-exact
        plain = reloaded.unload()
        assert not mmpreproj.is_injected(plain) and not any("lora_" in n for n, _ in plain.named_parameters())
        assert torch.equal(plain(x).logits, tiny_neox(vocab_size=len(tokenizer)).eval()(x).logits)

        # or merge the LoRA into the base first: the injected model keeps the trained outputs
        merged = model.merge_and_unload()
        assert mmpreproj.is_injected(merged)
        torch.testing.assert_close(merged(x).logits, want, rtol=1e-5, atol=1e-5)
