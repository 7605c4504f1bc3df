"""An adapter loaded onto a model of another `model_type` than the one it was saved on (a Qwen2-VL adapter onto
Qwen2.5-VL: the same paths and widths, so the weights fit by shape) warns through every loader, naming both types;
the same type loads without the warning. Measured before: it loaded silently."""

from __future__ import annotations

import json
import warnings

import pytest
import transformers as tf
from peft import PeftModel

import mmpreproj
from mmpreproj import PreProjConfig
from tests.helpers.zoo import llama_like, qwen2_vl

OTHER_BASE = r"saved on a 'qwen2_vl' model, and this model is a 'qwen2_5_vl'"
LOADERS = {
    "ours": lambda b, f: mmpreproj.load_adapter(b, f),
    "peft": lambda b, f: PeftModel.from_pretrained(b, str(f)),
    "hf": lambda b, f: b.load_adapter(str(f)),
}


@pytest.fixture(scope="module")
def qwen2_vl_folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2_vl")
    model = mmpreproj.inject(qwen2_vl(), PreProjConfig())
    mmpreproj.save_adapter(model, path)
    return path


def test_the_file_records_the_base_model_type(qwen2_vl_folder):
    injection = json.loads((qwen2_vl_folder / "adapter_config.json").read_text())["injection"]
    assert injection["base_model_type"] == "qwen2_vl"


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_another_model_type_warns_naming_both(qwen2_vl_folder, loader):
    with pytest.warns(UserWarning, match=OTHER_BASE):
        LOADERS[loader](qwen2_vl(cls_name="Qwen2_5_VL"), qwen2_vl_folder)


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_the_same_model_type_loads_without_it(qwen2_vl_folder, loader):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        LOADERS[loader](qwen2_vl(seed=1), qwen2_vl_folder)
    assert not [w for w in seen if "was saved on a" in str(w.message)]


def test_an_added_adapter_of_another_type_warns(qwen2_vl_folder):
    with pytest.warns(UserWarning, match=OTHER_BASE):
        model = mmpreproj.load_adapter(qwen2_vl(cls_name="Qwen2_5_VL"), qwen2_vl_folder)
    with pytest.warns(UserWarning, match=OTHER_BASE):
        mmpreproj.load_adapter(model, qwen2_vl_folder, adapter_name="other")
    assert mmpreproj.adapter_names(model) == ["default", "other"]


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_a_llama_adapter_onto_mistral_warns(tmp_path, loader):
    mmpreproj.save_adapter(
        mmpreproj.inject(llama_like(tf.LlamaConfig, tf.LlamaForCausalLM), PreProjConfig()), tmp_path
    )
    with pytest.warns(UserWarning, match=r"saved on a 'llama' model, and this model is a 'mistral'"):
        LOADERS[loader](llama_like(tf.MistralConfig, tf.MistralForCausalLM), tmp_path)
