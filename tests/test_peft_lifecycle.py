"""The lifecycle a peft user expects, on `peft.get_peft_model(tiny, PreProjConfig())`: a plain transformers
`Trainer` (adapter-only checkpoints, bit-exact resume, activation checkpointing, best-model reload), TRL's
`SFTTrainer(model=<folder>, peft_config=...)`, peft's and transformers' loaders, `push_to_hub` with the hub
client mocked, lm-eval's `HFLM(peft=...)`, and the LoRA -> PREPROJ port script."""

from __future__ import annotations

import difflib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

datasets = pytest.importorskip("datasets")
pytest.importorskip("accelerate")
peft = pytest.importorskip("peft")
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments  # noqa: E402

import mmpreproj  # noqa: E402
from mmpreproj import PreProjConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STEPS = 6
# what a Trainer checkpoint of a PeftModel may hold: the adapter, its card, and the Trainer's own state
CHECKPOINT_FILES = {"adapter_config.json", "adapter_model.safetensors", "README.md", "optimizer.pt",
                    "scheduler.pt", "rng_state.pth", "trainer_state.json", "training_args.bin"}
BASE_FILES = {"model.safetensors", "pytorch_model.bin", "config.json", "generation_config.json"}


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    """A saved tiny GPT-NeoX (2 blocks, width 32) with the shipped mini tokenizer: a local `model id`."""
    from transformers import AutoTokenizer, GPTNeoXConfig, GPTNeoXForCausalLM

    path = tmp_path_factory.mktemp("tiny-base")
    tok = AutoTokenizer.from_pretrained(str(REPO / "assets" / "mini-pythia"))
    torch.manual_seed(0)
    cfg = GPTNeoXConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, rotary_pct=0.25, max_position_embeddings=128,
                        tie_word_embeddings=False)
    GPTNeoXForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def lm_data(base_dir):
    ids = torch.randint(0, 128, (32, 16), generator=torch.Generator().manual_seed(0)).tolist()
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})


def _base(base_dir: Path):
    return AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)


def _peft(base_dir: Path, seed: int = 1):
    torch.manual_seed(seed)  # the adapter's init draws from the global generator, as peft's methods do
    return peft.get_peft_model(_base(base_dir), PreProjConfig())


def _adapter(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in peft.get_peft_model_state_dict(model).items()}


class StopAfterSave(TrainerCallback):
    """Ends training right after the checkpoint of step `at` is written: a kill at the worst moment."""

    def __init__(self, at: int):
        self.at = at

    def on_save(self, args, state, control, **kwargs):
        if state.global_step >= self.at:
            control.should_training_stop = True


def _args(out: Path, **kw) -> TrainingArguments:
    base = dict(output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=4, learning_rate=1e-2,
                save_steps=2, logging_steps=1, report_to=[], seed=0, use_cpu=True, disable_tqdm=True)
    return TrainingArguments(**{**base, **kw})


def _fit(out: Path, model, data, *, callbacks=(), resume=None, eval_data=None, compute_metrics=None,
         **kw) -> Trainer:
    trainer = Trainer(model=model, args=_args(out, **kw), train_dataset=data, eval_dataset=eval_data,
                      callbacks=list(callbacks), compute_metrics=compute_metrics)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _losses(trainer: Trainer) -> list[float]:
    return [row["loss"] for row in trainer.state.log_history if "loss" in row]


def _logits(model, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x).logits


# -- 1. plain transformers.Trainer -------------------------------------------------------------------------
def test_trainer_checkpoints_hold_only_the_adapter_and_a_resume_after_a_kill_is_bit_exact(
        tmp_path, base_dir, lm_data):
    whole_model = _peft(base_dir)
    init = _adapter(whole_model)
    whole = _fit(tmp_path / "whole", whole_model, lm_data)
    ref = _adapter(whole_model)
    assert all(not torch.equal(ref[k], init[k]) for k in ref)  # every adapter tensor trained

    _fit(tmp_path / "cut", _peft(base_dir), lm_data, callbacks=[StopAfterSave(4)])
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == ["checkpoint-2", "checkpoint-4"]
    for ckpt in (tmp_path / "cut").iterdir():
        names = {p.name for p in ckpt.iterdir()}
        assert names <= CHECKPOINT_FILES, sorted(names - CHECKPOINT_FILES)
        assert {"adapter_config.json", "adapter_model.safetensors", "optimizer.pt"} <= names
        assert not names & BASE_FILES  # no copy of the base
        assert load_file(ckpt / "adapter_model.safetensors").keys() == ref.keys()
        assert json.loads((ckpt / "adapter_config.json").read_text())["peft_type"] == "PREPROJ"

    fresh = _peft(base_dir, seed=7)  # another init: the resume must load the checkpoint's adapter
    assert not any(torch.equal(v, init[k]) for k, v in _adapter(fresh).items())
    resumed = _fit(tmp_path / "cut", fresh, lm_data, resume=True)
    assert resumed.state.global_step == STEPS
    got = _adapter(fresh)
    # bit-exact: the same CPU kernels in the same order from the same restored state (adapter, AdamW moments,
    # scheduler, RNG, data order: the Trainer skips the batches already seen)
    assert got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in ref)
    assert _losses(resumed) == _losses(whole) and len(_losses(whole)) == STEPS
    assert all(p.requires_grad == ("preproj" in n or "skip" in n) for n, p in fresh.named_parameters())


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_trainer_gradient_checkpointing_reaches_the_adapter_with_the_same_updates(
        tmp_path, base_dir, lm_data, reentrant):
    plain = _peft(base_dir)
    init = _adapter(plain)
    _fit(tmp_path / "plain", plain, lm_data, max_steps=2, save_strategy="no")
    ckpt = _peft(base_dir)
    _fit(tmp_path / "ckpt", ckpt, lm_data, max_steps=2, save_strategy="no", gradient_checkpointing=True,
         gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    assert ckpt.base_model.model.gpt_neox.gradient_checkpointing
    want, got = _adapter(plain), _adapter(ckpt)
    assert all(not torch.equal(got[k], init[k]) for k in got)  # the gradients reached every adapter tensor
    for k in want:  # recomputing the blocks in backward changes nothing but float rounding (here: none)
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-6)


def test_trainer_load_best_model_at_end_restores_the_best_checkpoints_adapter(tmp_path, base_dir, lm_data):
    model = _peft(base_dir)
    evals = iter(range(STEPS))  # a metric that is best (lowest) at the first evaluation, worse after: the best
    # checkpoint is not the last one, so "restored the best" is told apart from "kept the final weights"
    trainer = _fit(tmp_path, model, lm_data, eval_data=lm_data.select(range(4)), eval_strategy="steps",
                   eval_steps=2, load_best_model_at_end=True, metric_for_best_model="rank",
                   greater_is_better=False, compute_metrics=lambda _: {"rank": next(evals)})
    best = Path(trainer.state.best_model_checkpoint)
    assert best.name == "checkpoint-2" and (tmp_path / f"checkpoint-{STEPS}").is_dir()
    saved, last = load_file(best / "adapter_model.safetensors"), load_file(tmp_path / f"checkpoint-{STEPS}" /
                                                                           "adapter_model.safetensors")
    got = _adapter(model)
    assert all(torch.equal(got[k], saved[k]) for k in saved)
    assert any(not torch.equal(got[k], last[k]) for k in last)


# -- 2. TRL SFTTrainer with a model folder and peft_config --------------------------------------------------
def test_sft_trainer_with_a_model_folder_and_peft_config_trains_only_the_adapter(tmp_path, base_dir):
    trl = pytest.importorskip("trl")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(base_dir))
    text = datasets.Dataset.from_dict({"text": [f"{a} plus {b} is {a + b}." for a in range(4) for b in range(4)]})
    args = trl.SFTConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, learning_rate=1e-2,
                         save_strategy="no", report_to=[], seed=0, use_cpu=True, disable_tqdm=True, max_length=32)
    torch.manual_seed(1)
    trainer = trl.SFTTrainer(model=str(base_dir), peft_config=PreProjConfig(), args=args, train_dataset=text,
                             processing_class=tok)
    model = trainer.model
    assert isinstance(model, peft.PeftModel) and model.peft_config["default"].peft_type == "PREPROJ"
    adapter = {n for n, p in model.named_parameters() if "preproj" in n or ".skip." in n}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert adapter and trainable == adapter
    assert sum(p.numel() for n, p in model.named_parameters() if p.requires_grad) == sum(
        v.numel() for v in peft.get_peft_model_state_dict(model).values())
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    init = _adapter(model)
    trainer.train()
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if n in base)
    assert all(not torch.equal(v, init[k]) for k, v in _adapter(model).items())


# -- 3. peft's and transformers' loaders -------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory, base_dir, lm_data):
    """A PeftModel trained 2 steps and saved (its config names the base folder), with its logits on `x`."""
    out = tmp_path_factory.mktemp("trained")
    model = _peft(base_dir)
    _fit(out / "run", model, lm_data, max_steps=2, save_strategy="no")
    model.save_pretrained(out / "adapter")
    x = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(3))
    model.eval()
    return out / "adapter", x, _logits(model, x)


def test_saved_adapter_names_the_base_and_reads_back_as_a_preproj_config(trained, base_dir):
    adapter_dir, _, _ = trained
    assert sorted(p.name for p in adapter_dir.iterdir()) == ["README.md", "adapter_config.json",
                                                            "adapter_model.safetensors"]
    config = peft.PeftConfig.from_pretrained(str(adapter_dir))
    assert type(config) is PreProjConfig and config.peft_type == "PREPROJ"
    assert config.base_model_name_or_path == str(base_dir)


def test_auto_peft_model_loads_the_base_from_the_config_and_gives_the_trained_logits(trained, base_dir):
    from peft import AutoPeftModelForCausalLM

    adapter_dir, x, want = trained
    model = AutoPeftModelForCausalLM.from_pretrained(str(adapter_dir)).eval()
    assert isinstance(model, peft.PeftModel)
    assert not any(p.requires_grad for p in model.parameters())  # loading defaults to inference, as peft's
    assert torch.equal(_logits(model, x), want)
    assert not torch.equal(_logits(_base(base_dir).eval(), x), want)  # the adapter is what makes them


def test_peft_model_from_pretrained_with_is_trainable_resumes_training(trained, base_dir):
    adapter_dir, x, want = trained
    model = peft.PeftModel.from_pretrained(_base(base_dir), str(adapter_dir), is_trainable=True).eval()
    assert torch.equal(_logits(model, x), want)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("preproj" in n or ".skip." in n for n in trainable)


def test_transformers_load_adapter_on_a_fresh_base_gives_the_trained_logits(trained, base_dir):
    adapter_dir, x, want = trained
    model = _base(base_dir).eval()
    model.load_adapter(str(adapter_dir))
    assert torch.equal(_logits(model, x), want)
