"""transformers `Trainer` (`PreProjTrainer`) with an injected tiny GPT-NeoX: what trains, what a checkpoint
holds, resume after a stop, activation checkpointing on a frozen base, bf16 autocast, best-model reload."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.zoo import tiny_neox

datasets = pytest.importorskip("datasets")
pytest.importorskip("accelerate")
from transformers import Trainer, TrainingArguments  # noqa: E402

import mmpreproj  # noqa: E402
from mmpreproj.integrations.transformers import PreProjTrainer, preproj_trainer  # noqa: E402
from tests.helpers.callbacks import StopAfterSave  # noqa: E402

STEPS = 6


@pytest.fixture(scope="module")
def lm_data():
    ids = torch.randint(0, 128, (32, 16), generator=torch.Generator().manual_seed(0)).tolist()
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})


def _args(out, **kw) -> TrainingArguments:
    base = dict(
        output_dir=str(out),
        max_steps=STEPS,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        save_steps=2,
        logging_steps=1,
        report_to=[],
        seed=0,
        use_cpu=True,
        disable_tqdm=True,
    )
    return TrainingArguments(**{**base, **kw})


def _fit(out, data, *, callbacks=(), resume=None, model=None, eval_data=None, **kw):
    model = mmpreproj.inject(tiny_neox()) if model is None else model
    trainer = PreProjTrainer(
        model=model,
        args=_args(out, **kw),
        train_dataset=data,
        eval_dataset=eval_data,
        callbacks=list(callbacks),
    )
    trainer.train(resume_from_checkpoint=resume)
    return model, trainer


def _losses(trainer) -> list[float]:
    return [row["loss"] for row in trainer.state.log_history if "loss" in row]


def test_checkpoints_hold_the_adapter_and_resume_after_a_stop_is_bit_exact(tmp_path, lm_data):
    whole, whole_trainer = _fit(tmp_path / "whole", lm_data)
    ref = mmpreproj.adapter_state_dict(whole)

    _fit(tmp_path / "cut", lm_data, callbacks=[StopAfterSave(2)])
    ckpt = tmp_path / "cut" / "checkpoint-2"
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == ["checkpoint-2"]
    names = {p.name for p in ckpt.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "optimizer.pt", "trainer_state.json"} <= names
    assert not names & {"model.safetensors", "pytorch_model.bin", "config.json"}  # no copy of the base
    _, saved = mmpreproj.tuner.read_adapter(ckpt)
    assert saved.keys() == ref.keys()

    fresh = mmpreproj.inject(
        tiny_neox()
    )  # a new model, its injected weights scrambled: resume must load them
    with torch.no_grad():
        for w in mmpreproj.injected_modules(fresh):
            for p in w.preproj.parameters():
                p.normal_()
    resumed, resumed_trainer = _fit(tmp_path / "cut", lm_data, model=fresh, resume=True)
    assert resumed_trainer.state.global_step == STEPS
    got = mmpreproj.adapter_state_dict(resumed)
    # bit-exact: the same CPU kernels in the same order from the same restored state (weights, AdamW
    # moments, scheduler, RNG, data order: the Trainer skips the batches already seen)
    assert all(torch.equal(got[k], ref[k]) for k in ref)
    assert _losses(resumed_trainer) == _losses(whole_trainer)  # the first two come from trainer_state.json


def test_only_the_injected_weights_train(tmp_path, lm_data):
    model = mmpreproj.inject(tiny_neox())
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    init = {k: v.clone() for k, v in mmpreproj.adapter_state_dict(model).items()}
    _, trainer = _fit(tmp_path, lm_data, model=model, max_steps=2, save_strategy="no")
    injected = {id(p) for w in mmpreproj.injected_modules(model) for p in w.parameters() if p.requires_grad}
    in_optimizer = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert in_optimizer == injected
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if n in base)
    after = mmpreproj.adapter_state_dict(model)
    assert all(not torch.equal(after[k], init[k]) for k in init if k.endswith("up.weight"))


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_activation_checkpointing_on_a_frozen_base_gives_the_same_updates(tmp_path, lm_data, reentrant):
    plain, _ = _fit(tmp_path / "plain", lm_data, max_steps=2, save_strategy="no")
    ckpt, _ = _fit(
        tmp_path / "ckpt",
        lm_data,
        max_steps=2,
        save_strategy="no",
        activation_checkpointing=True,
        activation_checkpointing_kwargs={"use_reentrant": reentrant},
    )
    assert ckpt.gpt_neox.gradient_checkpointing
    want, got = mmpreproj.adapter_state_dict(plain), mmpreproj.adapter_state_dict(ckpt)
    init = mmpreproj.adapter_state_dict(mmpreproj.inject(tiny_neox()))
    assert all(not torch.equal(got[k], init[k]) for k in got if k.endswith("up.weight"))  # they got gradients
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-6)


def test_bf16_autocast_runs_the_base_in_bf16_and_keeps_injected_weights_fp32(tmp_path, lm_data):
    model = mmpreproj.inject(tiny_neox())
    seen = set()
    model.gpt_neox.layers[0].mlp.dense_h_to_4h.register_forward_hook(lambda m, a, out: seen.add(out.dtype))
    init = {k: v.clone() for k, v in mmpreproj.adapter_state_dict(model).items()}
    _, trainer = _fit(tmp_path, lm_data, model=model, max_steps=2, save_strategy="no", bf16=True)
    assert torch.bfloat16 in seen  # the autocast was on
    after = mmpreproj.adapter_state_dict(model)
    assert {v.dtype for v in after.values()} == {torch.float32}
    assert all(not torch.equal(after[k], init[k]) for k in init if k.endswith("up.weight"))
    moments = [s["exp_avg"] for s in trainer.optimizer.state.values()]
    assert moments and {m.dtype for m in moments} == {torch.float32}


def test_load_best_model_at_end_reloads_the_best_adapter(tmp_path, lm_data):
    model, trainer = _fit(
        tmp_path,
        lm_data,
        eval_data=lm_data.select(range(8)),
        eval_strategy="steps",
        eval_steps=2,
        load_best_model_at_end=True,
        metric_for_best_model="loss",
        greater_is_better=False,
        save_total_limit=1,
    )
    best = trainer.state.best_model_checkpoint
    assert best is not None
    _, saved = mmpreproj.tuner.read_adapter(best)
    assert all(torch.equal(v, saved[k]) for k, v in mmpreproj.adapter_state_dict(model).items())
    with torch.no_grad():  # scramble, then reload the best: the override copies it back in place
        for w in mmpreproj.injected_modules(model):
            w.skip.proj.weight.normal_()
    trainer._load_best_model()
    assert all(torch.equal(v, saved[k]) for k, v in mmpreproj.adapter_state_dict(model).items())


def test_a_model_without_injection_or_peft_is_refused_before_training(tmp_path, lm_data):
    """It would fine-tune every base weight; the error gives the call to make, nothing is written."""
    model, before = tiny_neox(), sorted(tmp_path.rglob("*"))
    with pytest.raises(ValueError, match=r"no mmpreproj modules injected.*mmpreproj\.inject\(model\)"):
        PreProjTrainer(model=model, args=_args(tmp_path), train_dataset=lm_data)
    assert all(p.requires_grad for p in model.parameters())  # untouched
    assert sorted(tmp_path.rglob("*")) == before


def test_a_peft_model_without_injection_is_saved_by_the_trainer_as_usual(tmp_path, lm_data):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_neox(), LoraConfig(r=2, target_modules=["query_key_value"]))
    trainer = PreProjTrainer(model=model, args=_args(tmp_path), train_dataset=lm_data)
    trainer.save_model(str(tmp_path / "plain"))
    assert (tmp_path / "plain" / "adapter_model.safetensors").is_file()
    assert json.loads((tmp_path / "plain" / "adapter_config.json").read_text())["peft_type"] == "LORA"


def test_preproj_trainer_builds_a_subclass_and_refuses_other_classes():
    cls = preproj_trainer(Trainer)
    assert issubclass(cls, Trainer) and cls is not Trainer and cls.__name__ == "PreProjTrainer"
    with pytest.raises(TypeError, match="subclass of transformers.Trainer"):
        preproj_trainer(dict)
