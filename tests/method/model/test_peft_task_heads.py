"""peft's classification tasks (`task_type` SEQ_CLS, TOKEN_CLS, QUESTION_ANS) with PREPROJ, as a LoRA user runs them:
peft's task class wraps the head (`score`, `classifier`, `qa_outputs`) in its own `ModulesToSaveWrapper` beside our
injection, trains, saves and reloads it; several adapters switch, mix per row and delete with their heads; the base
comes back whole. Before, SEQ_CLS failed at `get_peft_model` ('classifier' not found), TOKEN_CLS saved a folder
that did not reload, and the Llama / Qwen2 question-answering classes (decoder at `transformer.layers`) had no
host."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from peft import PeftModel, get_peft_model
from peft.utils.other import ModulesToSaveWrapper
from safetensors.torch import load_file

import mmpreproj
from mmpreproj import PreProjConfig
from tests.helpers.adapter_weights import perturb_adapters

CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_labels=3,
    pad_token_id=0,
)
TASKS = {  # task_type: (model class, head attribute, outputs read)
    "SEQ_CLS": (tf.LlamaForSequenceClassification, "score", ("logits",)),
    "TOKEN_CLS": (tf.LlamaForTokenClassification, "score", ("logits",)),
    "QUESTION_ANS": (tf.Qwen2ForQuestionAnswering, "qa_outputs", ("start_logits", "end_logits")),
}


def _base(task: str) -> torch.nn.Module:
    cls = TASKS[task][0]
    config = (tf.LlamaConfig if cls.__name__.startswith("Llama") else tf.Qwen2Config)(**CONFIG)
    torch.manual_seed(0)
    return cls(config).eval()


def _out(model: torch.nn.Module, task: str, ids: torch.Tensor, **kw) -> torch.Tensor:
    with torch.no_grad():
        out = model(input_ids=ids, **kw)
    return torch.cat([getattr(out, name) for name in TASKS[task][2]], dim=-1)


def _train_like(model: torch.nn.Module, head: str, seed: int) -> None:
    """Move every adapter weight and the head's copy of every adapter off their init (as if trained)."""
    perturb_adapters(model, seed, scale=0.3)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for copy in getattr(model.get_base_model(), head).modules_to_save.values():
            for p in copy.parameters():
                p.add_(torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("task", TASKS)
def test_a_task_head_trains_saves_and_reloads_beside_the_injection(task, tmp_path):
    _, head, _ = TASKS[task]
    ids = torch.randint(1, 64, (2, 6), generator=torch.Generator().manual_seed(1))
    model = get_peft_model(_base(task), PreProjConfig(task_type=task))
    wrapper = getattr(model.get_base_model(), head)
    assert isinstance(wrapper, ModulesToSaveWrapper)  # peft's, as with LoRA
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any(".modules_to_save.default." in n for n in trainable)
    assert all(".preproj" in n or f"{head}.modules_to_save.default." in n for n in trainable)
    model.train()
    out = model(input_ids=ids)
    torch.cat([getattr(out, n) for n in TASKS[task][2]], dim=-1).square().mean().backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if p.requires_grad)
    _train_like(model, head, seed=2)
    model.eval()
    want = _out(model, task, ids)
    assert not torch.allclose(want, _out(_base(task), task, ids), atol=1e-3)
    model.save_pretrained(tmp_path)
    keys = set(load_file(tmp_path / "adapter_model.safetensors"))
    assert f"base_model.model.{head}.weight" in keys  # peft's key for its wrapped head, beside ours
    reloaded = PeftModel.from_pretrained(_base(task), tmp_path)
    assert torch.equal(_out(reloaded, task, ids), want)  # the head and the injection, both restored
    low_memory = PeftModel.from_pretrained(_base(task), tmp_path, low_cpu_mem_usage=True)  # peft's head: a copy
    assert torch.equal(_out(low_memory, task, ids), want)
    with pytest.raises(
        ValueError, match=rf"{head}\.(weight|bias)' belongs to no injected block .*load this folder with peft"
    ):
        mmpreproj.load_adapter(_base(task), tmp_path)  # our loader has no wrapper for peft's head: refused, named
    # our writers would leave peft's head out: refused, pointing to peft's save
    for what, call in (
        ("save_adapter", lambda: mmpreproj.save_adapter(model, tmp_path / "ours")),
        ("adapter_state_dict", lambda: mmpreproj.adapter_state_dict(model)),
        ("save_pretrained", lambda: mmpreproj.save_pretrained(model.get_base_model(), tmp_path / "whole")),
    ):
        with pytest.raises(ValueError, match=rf"{what}: '{head}' is a module peft wraps .*peft_model.save_pretrained"):
            call()
    assert not (tmp_path / "ours").exists() and not (tmp_path / "whole").exists()


@torch.no_grad()
def test_two_adapters_with_their_heads_switch_mix_per_row_disable_delete_and_unload():
    task, head = "SEQ_CLS", "score"
    ids = torch.randint(1, 64, (3, 6), generator=torch.Generator().manual_seed(1))
    model = get_peft_model(_base(task), PreProjConfig(task_type=task))
    model.add_adapter("b", PreProjConfig(task_type=task, expansion=0.5))
    _train_like(model, head, seed=3)
    model.eval()
    alone = {}
    for name in ("default", "b"):
        model.set_adapter(name)
        assert getattr(model.get_base_model(), head).active_adapters == [name]  # the head follows
        alone[name] = _out(model, task, ids)
    assert not torch.allclose(alone["default"], alone["b"], atol=1e-3)
    mixed = _out(model, task, ids, adapter_names=["b", "default", "b"])
    torch.testing.assert_close(mixed, torch.stack([alone["b"][0], alone["default"][1], alone["b"][2]]))
    base_out = _out(_base(task), task, ids)
    with model.disable_adapter():
        torch.testing.assert_close(_out(model, task, ids), base_out, atol=1e-6, rtol=0)
    model.delete_adapter("default")
    assert list(getattr(model.get_base_model(), head).modules_to_save) == ["b"]
    base = model.unload()
    assert type(getattr(base, head)) is torch.nn.Linear and not mmpreproj.is_injected(base)
    assert torch.equal(_out(base, task, ids), base_out)


def test_a_trainer_on_a_sequence_classifier_resumes_bit_exact_with_its_head(tmp_path):
    """The LoRA user's classification script with PREPROJ: a plain Trainer, adapter-only checkpoints holding the
    head, killed after a save and resumed from it, ends where the straight run ends."""
    datasets = pytest.importorskip("datasets")
    from transformers import Trainer

    from tests.helpers.callbacks import StopAfterSave
    from tests.helpers.training import trainer_args

    g = torch.Generator().manual_seed(0)
    ids, labels = torch.randint(1, 64, (16, 6), generator=g), torch.randint(0, 3, (16,), generator=g)
    data = datasets.Dataset.from_dict({"input_ids": ids.tolist(), "labels": labels.tolist()})

    def fit(out, callbacks=(), resume=None, seed=1):
        torch.manual_seed(seed)
        model = get_peft_model(_base("SEQ_CLS"), PreProjConfig(task_type="SEQ_CLS"))
        trainer = Trainer(model=model, args=trainer_args(out, 4), train_dataset=data, callbacks=list(callbacks))
        trainer.train(resume_from_checkpoint=resume)
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    straight = fit(tmp_path / "straight")
    fit(tmp_path / "cut", callbacks=[StopAfterSave(2)])
    ckpt = tmp_path / "cut" / "checkpoint-2" / "adapter_model.safetensors"
    assert "base_model.model.score.weight" in load_file(ckpt)  # the head is in every checkpoint
    resumed = fit(tmp_path / "cut", resume=True, seed=7)  # another init: the checkpoint must replace it
    assert any("score.modules_to_save" in k for k in straight)
    assert resumed.keys() == straight.keys() and all(torch.equal(resumed[k], straight[k]) for k in straight)


def test_auto_peft_and_transformers_load_adapter_restore_a_sequence_classifier_with_its_head(tmp_path):
    from peft import AutoPeftModelForSequenceClassification

    _base("SEQ_CLS").save_pretrained(tmp_path / "base")
    ids = torch.randint(1, 64, (2, 6), generator=torch.Generator().manual_seed(1))
    base = tf.AutoModelForSequenceClassification.from_pretrained(tmp_path / "base")
    model = get_peft_model(base, PreProjConfig(task_type="SEQ_CLS"))
    _train_like(model, "score", seed=4)
    want = _out(model.eval(), "SEQ_CLS", ids)
    model.save_pretrained(tmp_path / "adapter")  # names the base folder: AutoPeft loads it from there
    auto = AutoPeftModelForSequenceClassification.from_pretrained(tmp_path / "adapter")
    assert torch.equal(_out(auto.eval(), "SEQ_CLS", ids), want)
    plain = tf.AutoModelForSequenceClassification.from_pretrained(tmp_path / "base")
    plain.load_adapter(str(tmp_path / "adapter"))  # transformers' own loader: peft's inject path
    assert isinstance(plain.score, ModulesToSaveWrapper) and torch.equal(_out(plain.eval(), "SEQ_CLS", ids), want)
