"""The configuration surface as the independent audit `bench/config_audit.py` found it wanting: `from_dict` refuses
what the constructor refuses (it dropped peft's targeting words and replaced a bad `library_version`), `estimate`
refuses a per-part `layers` naming a part the shape lacks (as `inject` does), and `for_budget` sizes the blocks its
`layers` / `parts` select and refuses a fraction under the smallest modules (it sized every block, and gave 4 d L
weights for any smaller budget without a word)."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

import mmpreproj
from mmpreproj import PreProjConfig
from tests.helpers.zoo import llama_like, qwen2_vl


def _trainable(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"target_modules": ["q_proj"]}, r"PreProjConfig\.target_modules=\['q_proj'\]: PREPROJ does not pick"),
        ({"exclude_modules": ["dense"]}, r"PreProjConfig\.exclude_modules"),
        ({"layers_pattern": "layers"}, r"PreProjConfig\.layers_pattern"),
        ({"library_version": 3}, r"PreProjConfig\.library_version=3; must be a version string"),
        ({"library_version": None}, r"PreProjConfig\.library_version=None"),
    ],
)
def test_from_dict_refuses_what_the_constructor_refuses(extra, says):
    d = PreProjConfig().to_dict()
    with pytest.raises(ValueError, match=says):
        PreProjConfig.from_dict({**d, **extra})


def test_from_dict_reads_peft_layers_to_transform_as_layers():
    assert PreProjConfig.from_dict({**PreProjConfig().to_dict(), "layers_to_transform": [0, 2]}).layers == [0, 2]


def test_estimate_refuses_a_part_the_shape_lacks_as_inject_does():
    config = PreProjConfig(layers={"vision": [0]})
    with pytest.raises(ValueError, match=r"layers names parts \['vision'\] that are not injected"):
        mmpreproj.estimate(config, "mini-pythia")
    assert mmpreproj.estimate(PreProjConfig(layers={"language": [0]}), "mini-pythia").blocks == 1


@pytest.mark.parametrize("fraction", [0.01, 0.05])
def test_for_budget_sizes_the_blocks_layers_selects(fraction):
    model = llama_like(tf.LlamaConfig, tf.LlamaForCausalLM, width=128, depth=4)
    asked = fraction * sum(p.numel() for p in model.parameters())
    mmpreproj.inject(model, PreProjConfig.for_budget(model, fraction, layers=[-1]))
    assert abs(_trainable(model) - asked) <= 2 * 128 * 1  # within one 2 d L unit (L = 1 selected block)


def test_for_budget_sizes_the_part_parts_selects():
    model = qwen2_vl()
    asked = 0.02 * sum(p.numel() for p in model.parameters())
    mmpreproj.inject(model, PreProjConfig.for_budget(model, 0.02, parts=["language"]))
    assert abs(_trainable(model) - asked) <= 2 * 64 * 2  # d = 64, the language model's 2 blocks


def test_for_budget_refuses_a_fraction_under_the_smallest_modules():
    model = llama_like(tf.LlamaConfig, tf.LlamaForCausalLM, width=128, depth=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"fraction=0\.001 is 616 weights, under .* \(inner width 1 and a rank-1 "):
        PreProjConfig.for_budget(model, 0.001)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    config = PreProjConfig.for_budget(model, 0.001, layers=[-1])  # one block: 4 d = 512 weights fit
    mmpreproj.inject(model, config)
    assert _trainable(model) == 512
