"""TrainConfig validation, JSON round trip, presets (the paper's numbers) and the LR schedule."""

from __future__ import annotations

import math

import pytest

from mmpreproj.train import PRESETS, TrainConfig, get_preset
from mmpreproj.train.schedule import lr_factor


@pytest.mark.parametrize(
    ("field", "value", "expect"),
    [
        (
            "method",
            "adapter",
            "allowed values: ['preproj', 'skip', 'preproj_skip', 'lora', 'preproj_lora', 'lora_matched']",
        ),
        ("precision", "fp16", "allowed values: ['bf16', 'fp32']"),
        ("model_dtype", "float16", "allowed values: ['float32', 'bfloat16']"),
        ("schedule", "linear", "allowed values: ['cosine', 'constant']"),
        ("steps", 0, "a positive int"),
        ("batch_size", -1, "a positive int"),
        ("warmup_steps", 600, "in [0, steps=500]"),
        ("lr", 0.0, "> 0"),
        ("adam_betas", (0.9, 1.0), "two floats in [0, 1)"),
        ("stop_at", 501, "None or in [1, 500]"),
        ("device", "gpu0", "'auto', 'cpu', 'cuda', 'cuda:N'"),
        ("max_len", 1, "an int >= 2"),
    ],
)
def test_invalid_fields_name_field_and_allowed_values(field, value, expect):
    with pytest.raises(ValueError) as err:
        TrainConfig(**{field: value})
    assert f"TrainConfig.{field}=" in str(err.value) and expect in str(err.value)


def test_lora_rank_only_for_lora_methods():
    assert TrainConfig(method="lora", lora_r=8).lora_r == 8
    with pytest.raises(ValueError, match="lora_r=8 only applies to methods 'lora' and 'preproj_lora'"):
        TrainConfig(method="preproj", lora_r=8)


def test_json_round_trip_and_unknown_keys_warn(tmp_path):
    cfg = TrainConfig(method="lora", lr=3e-4, adam_betas=(0.8, 0.9), stop_at=7)
    cfg.to_json(tmp_path / "c.json")
    assert TrainConfig.from_json(tmp_path / "c.json") == cfg
    d = cfg.to_dict() | {"from_the_future": 1}
    with pytest.warns(UserWarning, match="ignoring unknown keys \\['from_the_future'\\]"):
        assert TrainConfig.from_dict(d) == cfg


def test_differences_ignore_resume_free_fields():
    a = TrainConfig()
    b = a.replace(resume=True, out="elsewhere", stop_at=3, progress=False, lr=2e-5)
    assert a.differences(b) == {"lr": (1e-5, 2e-5)}


def test_paper_presets_hold_the_papers_hyperparameters():
    for name, model, batch, accum in (
        ("pythia-160m", "EleutherAI/pythia-160m", 4, 4),
        ("pythia-410m", "EleutherAI/pythia-410m", 2, 8),
    ):
        c = get_preset(name)
        assert (c.model, c.batch_size, c.grad_accum, c.effective_batch) == (model, batch, accum, 16)
        assert (c.lr, c.steps, c.warmup_steps, c.schedule, c.min_lr_ratio) == (1e-5, 500, 50, "cosine", 0.0)
        assert (c.precision, c.gradient_checkpointing, c.seed, c.max_len, c.packing) == ("bf16", True, 42, 512, False)
        assert (c.data, c.data_config, c.data_split, c.num_lines, c.min_chars) == (
            "wikitext",
            "wikitext-103-raw-v1",
            "train",
            2000,
            50,
        )
        # The authors' script uses the transformers Trainer defaults for what the paper does not state.
        assert (c.adam_betas, c.adam_eps, c.weight_decay, c.max_grad_norm) == ((0.9, 0.999), 1e-8, 0.0, 1.0)
        assert not c.paper_bf16_weights and c.preset == name


def test_mini_preset_is_an_offline_cpu_run():
    c = get_preset("mini", method="skip", out="x")
    assert c.method == "skip" and c.out == "x" and c.precision == "fp32" and not c.gradient_checkpointing
    assert c.model == "assets/mini-pythia" and c.data.endswith("wiki.valid.raw.gz") and c.data_config is None
    with pytest.raises(ValueError, match="unknown preset 'tiny'; allowed values"):
        get_preset("tiny")
    assert set(PRESETS) == {"pythia-160m", "pythia-410m", "mini", "smollm2-135m", "smollm2-135m-cpu"}


def test_lr_schedule_matches_transformers_cosine_after_a_warmup_whose_first_step_trains():
    import torch
    from transformers import get_cosine_schedule_with_warmup

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    ref = get_cosine_schedule_with_warmup(opt, num_warmup_steps=50, num_training_steps=500)
    for s in range(50, 500):  # after the warmup: transformers' factor exactly
        assert math.isclose(lr_factor(s, warmup=50, total=500), ref.lr_lambdas[0](s), abs_tol=1e-12)
    warm = [lr_factor(s, warmup=50, total=500) for s in range(51)]
    assert ref.lr_lambdas[0](0) == 0.0 and warm[0] == 1 / 51  # transformers' first step is lr 0; ours trains
    assert all(a < b for a, b in zip(warm, warm[1:], strict=False)) and warm[50] == 1.0
    assert lr_factor(0, warmup=1, total=2) == 0.5  # `--steps 2`: both steps train
    assert lr_factor(499, warmup=0, total=500, min_ratio=0.1) > 0.1
    assert lr_factor(100, warmup=10, total=500, kind="constant") == 1.0
