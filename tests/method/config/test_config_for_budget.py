"""`PreProjConfig.for_budget(model, fraction)`: the size a LoRA user expects, sized as the budget study sizes
its `preproj_skip` points (one formula, `method/config.py`), checked against peft's own count."""

from __future__ import annotations

import pytest
import transformers as tf
from peft import LoraConfig, get_peft_model

from mmpreproj import PreProjConfig
from mmpreproj.train.methods import host_shape
from mmpreproj.train.sizes import sizes_for_budget
from tests.helpers.zoo import llama_like, tiny_neox


@pytest.mark.parametrize("fraction", [0.01, 0.05, 0.2])
@pytest.mark.parametrize(
    "build",
    [lambda: llama_like(tf.LlamaConfig, tf.LlamaForCausalLM, width=64, depth=4), lambda: tiny_neox()],
    ids=["llama", "neox"],
)
def test_trains_about_the_fraction_asked_for(build, fraction):
    model = build()
    total = sum(p.numel() for p in model.parameters())
    dim, layers = host_shape(model)
    cfg = PreProjConfig.for_budget(model, fraction)
    assert {"expansion": cfg.expansion, "skip_rank": cfg.skip_rank} == sizes_for_budget(
        "preproj_skip", round(fraction * total), dim=dim, layers=layers
    )
    trainable, _ = get_peft_model(build(), cfg).get_nb_trainable_parameters()
    assert abs(trainable - fraction * total) <= 2 * dim * layers  # within one unit of 2 d L weights
    assert cfg.skip_rank < dim and int(cfg.expansion * dim) >= 1


def test_small_budget_is_far_below_the_paper_size_and_near_lora():
    model = llama_like(tf.LlamaConfig, tf.LlamaForCausalLM, width=64, depth=4)
    small, _ = get_peft_model(model, PreProjConfig.for_budget(model, 0.01)).get_nb_trainable_parameters()
    full, _ = get_peft_model(
        llama_like(tf.LlamaConfig, tf.LlamaForCausalLM, width=64, depth=4), PreProjConfig()
    ).get_nb_trainable_parameters()
    lora, _ = get_peft_model(
        llama_like(tf.LlamaConfig, tf.LlamaForCausalLM, width=64, depth=4),
        LoraConfig(r=1, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    ).get_nb_trainable_parameters()
    assert small < full / 5 and small < 4 * lora


def test_other_fields_pass_through_and_the_sizes_are_its_own():
    model = tiny_neox()
    cfg = PreProjConfig.for_budget(model, 0.05, layers=[0], skip_init_std=0.0)
    assert cfg.layers == [0] and cfg.skip_init_std == 0.0
    with pytest.raises(ValueError, match="chooses expansion and skip_rank.*drop expansion"):
        PreProjConfig.for_budget(model, 0.05, expansion=2.0)


@pytest.mark.parametrize("fraction", [0, -0.1, 1.5, True, "0.01"])
def test_fraction_out_of_range_is_refused(fraction):
    with pytest.raises(ValueError, match=r"fraction=.*must be in \(0, 1\]"):
        PreProjConfig.for_budget(tiny_neox(), fraction)


def test_a_budget_that_needs_a_full_rank_skip_is_refused():
    with pytest.raises(ValueError, match="skip's rank at the width"):
        PreProjConfig.for_budget(tiny_neox(), 1.0)
