"""Resume that finds its footing (issue 31): `mmpreproj.last_whole_checkpoint` takes the newest whole Trainer
checkpoint, skipping a torn one and saying so; a checkpoint with non-finite weights or of another method is
refused, by it and by the plain Trainer's own resume (our `set_peft_model_state_dict` hook)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import Trainer, TrainingArguments

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj.method.file_check import weights_digest
from tests.helpers.zoo import tiny_neox

W, C = "adapter_model.safetensors", "adapter_config.json"


def _data():
    ids = torch.randint(0, 128, (8, 8), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": r, "labels": r} for r in ids]


def _trainer(out: Path, model=None, steps: int = 4) -> Trainer:
    torch.manual_seed(0)
    model = model if model is not None else get_peft_model(tiny_neox(), PreProjConfig())
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        save_steps=2,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    return Trainer(model=model, args=args, train_dataset=_data())


@pytest.fixture
def run(tmp_path) -> Path:
    _trainer(tmp_path).train()
    assert {p.name for p in tmp_path.iterdir()} >= {"checkpoint-2", "checkpoint-4"}
    return tmp_path


def _redigest(ckpt: Path, tensors: dict) -> None:
    save_file(tensors, str(ckpt / W))
    cfg = json.loads((ckpt / C).read_text())
    cfg["injection"]["weights_digest"] = weights_digest(tensors)
    (ckpt / C).write_text(json.dumps(cfg))


def test_the_newest_whole_checkpoint_is_taken(run):
    assert mmpreproj.last_whole_checkpoint(run) == str(run / "checkpoint-4")
    assert mmpreproj.last_whole_checkpoint(run / "nothing-here") is None


@pytest.mark.parametrize(
    "tear",
    ["weights_truncated", "weights_replaced", "config_missing", "state_missing", "state_a_list", "config_cut"],
)
def test_a_torn_newest_checkpoint_is_skipped_and_named(run, tear, caplog):
    ckpt = run / "checkpoint-4"
    if tear == "weights_truncated":
        data = (ckpt / W).read_bytes()
        (ckpt / W).write_bytes(data[: len(data) // 2])
    elif tear == "weights_replaced":  # the weights of a later save, the config of this one (a kill between the two)
        save_file({k: v + 1 for k, v in load_file(str(ckpt / W)).items()}, str(ckpt / W))
    elif tear == "config_missing":
        (ckpt / C).unlink()
    elif tear == "state_a_list":  # valid JSON, but not the object the Trainer writes
        (ckpt / "trainer_state.json").write_text("[]")
    elif tear == "config_cut":
        text = (ckpt / C).read_text()
        (ckpt / C).write_text(text[: len(text) // 2])
    else:
        (ckpt / "trainer_state.json").unlink()
    with caplog.at_level(logging.WARNING, logger="mmpreproj.method.resume"):
        found = mmpreproj.last_whole_checkpoint(run)
    assert found == str(run / "checkpoint-2")
    assert any("skipping" in r.getMessage() and "checkpoint-4" in r.getMessage() for r in caplog.records)
    if tear == "state_a_list":
        assert any("trainer_state.json is not an object" in r.getMessage() for r in caplog.records)
    trainer = _trainer(run)
    trainer.train(resume_from_checkpoint=found)  # and the Trainer resumes from it
    assert trainer.state.global_step == 4


def test_a_checkpoint_with_non_finite_weights_is_refused_at_resume(run):
    ckpt = run / "checkpoint-4"
    tensors = load_file(str(ckpt / W))
    key = next(iter(tensors))
    tensors[key] = torch.full_like(tensors[key], float("nan"))
    _redigest(ckpt, tensors)  # whole, but diverged
    with pytest.raises(ValueError, match=r"checkpoint-4 is whole but cannot be resumed: .*non-finite"):
        mmpreproj.last_whole_checkpoint(run)
    trainer = _trainer(run)
    with pytest.raises(ValueError, match="non-finite"):  # the plain Trainer's own resume, through our hook
        trainer.train(resume_from_checkpoint=str(ckpt))


def test_a_checkpoint_of_another_method_is_refused_at_resume(run, tmp_path):
    lora_run = tmp_path / "lora"
    lora = get_peft_model(tiny_neox(), LoraConfig(r=2, target_modules=["query_key_value"]))
    _trainer(lora_run, lora, steps=2).train()
    with pytest.raises(ValueError, match=r"holds a 'LORA' adapter, not PREPROJ"):
        mmpreproj.last_whole_checkpoint(lora_run)
    with pytest.raises(
        ValueError,
        match=r"written by method 'preproj_skip' with skip_rank=None; this run trains "
        r"'preproj_skip' with skip_rank=4",
    ):
        mmpreproj.last_whole_checkpoint(run, PreProjConfig(skip_rank=4))
    trainer = _trainer(run, get_peft_model(tiny_neox(), PreProjConfig(skip_rank=4)))
    with pytest.raises(ValueError, match="do not match this adapter"):  # the Trainer's resume, through our hook
        trainer.train(resume_from_checkpoint=str(run / "checkpoint-4"))
