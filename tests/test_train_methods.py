"""The five methods: trainable-parameter counts equal the paper's Table 1/2 on meta-device Pythia shapes;
LoRA counts read off the host row's real target modules equal peft's (Llama GQA, GPT-2 Conv1D, GPT-NeoX)."""

from __future__ import annotations

import pytest
import torch
from transformers import GPTNeoXConfig

import mmpreproj
from mmpreproj.train import METHODS, apply_method, count_trainable, expected_trainable, method_param_table
from mmpreproj.train.methods import paper_lora_rank, preproj_params
from tests.helpers.zoo import tiny_neox

PYTHIA = {
    "160m": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "410m": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
}
# Table 1 / Table 2 of the paper, in millions (rounded to 0.1M there).
PAPER_M = {
    "160m": {"preproj": 17.7, "skip": 7.1, "preproj_skip": 24.8, "lora": 26.5, "preproj_lora": 21.2},
    "410m": {"preproj": 62.9, "skip": 25.2, "preproj_skip": 88.1, "lora": 94.4, "preproj_lora": 72.4},
}


@pytest.fixture(scope="module")
def tables():
    out = {}
    for size, shape in PYTHIA.items():
        cfg = GPTNeoXConfig(vocab_size=50304, rotary_pct=0.25, **shape)
        out[size] = method_param_table(cfg)
    return out


@pytest.mark.parametrize("size", ["160m", "410m"])
def test_counts_on_meta_models_match_the_paper(tables, size):
    d, layers = PYTHIA[size]["hidden_size"], PYTHIA[size]["num_hidden_layers"]
    counts = tables[size]
    for method in METHODS:
        assert counts[method] == expected_trainable(method, d, layers), method
        if method in PAPER_M[size]:  # lora_matched is ours, not in the paper's tables
            assert round(counts[method] / 1e6, 1) == PAPER_M[size][method], (method, counts[method])


def test_exact_figures_and_lora_ranks(tables):
    assert tables["160m"]["preproj"] == preproj_params(768, 12) == 2 * 768 * 960 * 12 == 17_694_720
    assert tables["160m"]["skip"] == 768 * 768 * 12 == 7_077_888
    assert paper_lora_rank(768, 12) == 480 and paper_lora_rank(1024, 24) == 640
    assert tables["160m"]["lora"] == 480 * 6 * 768 * 12 == 26_542_080
    assert tables["410m"]["lora"] == 640 * 6 * 1024 * 24 == 94_371_840
    assert tables["410m"]["preproj_lora"] == 62_914_560 + 64 * 6 * 1024 * 24 == 72_351_744


def _names(model, pattern: str) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad and pattern in n}


@pytest.mark.parametrize("method", METHODS)
def test_only_the_methods_weights_train(method):
    model = apply_method(tiny_neox(), method)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    slot_kind = {".preproj.": "preproj", ".preproj_skip.": "skip", "lora_": "lora_"}  # the wrapper's slot names
    kinds = {kind for k, kind in slot_kind.items() if any(k in n for n in trainable)}
    want = {
        "preproj_lora": {"preproj", "lora_"},
        "lora": {"lora_"},
        "lora_matched": {"lora_"},
        "preproj_skip": {"preproj", "skip"},
    }
    assert kinds == want.get(method, {method})
    assert trainable == _names(model, ".preproj.") | _names(model, ".preproj_skip.") | _names(model, "lora_")
    assert count_trainable(model) == expected_trainable(method, 32, 2)
    assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if n in trainable)


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_preproj_lora_keeps_the_injected_weights_trainable_under_peft():
    from peft import LoraConfig, get_peft_model

    wrapped = get_peft_model(tiny_neox(), LoraConfig(r=4, target_modules=["query_key_value", "dense"]))
    # LoRA first, ours around the attention that holds it: inject freezes the base, not another tuner's weights
    mmpreproj.inject(wrapped.base_model.model, mmpreproj.PreProjConfig(preproj=True, skip=False))
    assert len(_names(wrapped, ".preproj.")) == 2 * 2 and len(_names(wrapped, "lora_")) == 2 * 2 * 2
    assert (
        not {n for n, p in wrapped.named_parameters() if p.requires_grad}
        - _names(wrapped, ".preproj.")
        - _names(wrapped, "lora_")
    )
    model = apply_method(tiny_neox(), "preproj_lora")
    assert len(_names(model, ".preproj.")) == 2 * 2 and len(_names(model, "lora_")) == 2 * 2 * 2
    assert len(mmpreproj.injected_modules(model)) == 2  # the wrappers are reachable through the PeftModel
    lora = model.peft_config["default"]
    assert (lora.r, lora.lora_alpha, lora.lora_dropout) == (64, 128, 0.0)
    assert set(lora.target_modules) == {"query_key_value", "dense"}


def test_lora_overrides_and_unknown_method():
    model = apply_method(tiny_neox(), "lora", lora_r=3)
    assert (model.peft_config["default"].r, model.peft_config["default"].lora_alpha) == (3, 6)
    with pytest.raises(ValueError, match="method='ia3'; allowed values"):
        apply_method(tiny_neox(), "ia3")


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("method", METHODS)
def test_trainable_weights_are_fp32_on_a_bf16_base(method):
    model = apply_method(tiny_neox().to(torch.bfloat16), method)
    dtypes = {n: p.dtype for n, p in model.named_parameters() if p.requires_grad}
    assert dtypes and set(dtypes.values()) == {torch.float32}, dtypes
    assert {p.dtype for p in model.parameters() if not p.requires_grad} == {torch.bfloat16}


# --- LoRA counted from the host row's real target modules (Llama GQA, GPT-2 Conv1D, GPT-NeoX) -------------


def _llama_gqa():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )  # k/v_proj: 64 -> 32
    return LlamaForCausalLM(cfg)


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(
        GPT2Config(vocab_size=97, n_embd=64, n_layer=2, n_head=4, n_positions=32, bos_token_id=0, eos_token_id=0)
    )


LORA_HOSTS = {
    # build, targets given to peft by hand (independent of the row), (in + out) per block by hand
    "llama": (_llama_gqa, ["q_proj", "k_proj", "v_proj", "o_proj"], (64 + 64) + 2 * (64 + 32) + (64 + 64)),
    "gpt2": (_gpt2, r".*\.attn\.(c_attn|c_proj)", (64 + 192) + (64 + 64)),  # Conv1D; not the MLP's c_proj
    "gpt_neox": (tiny_neox, ["query_key_value", "dense"], (32 + 96) + (32 + 32)),
}


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore:fan_in_fan_out:UserWarning")
@pytest.mark.parametrize("name", LORA_HOSTS)
def test_lora_count_from_the_row_equals_peft(name):
    from peft import LoraConfig, get_peft_model

    from mmpreproj.hosts import find_host
    from mmpreproj.hosts.lora import lora_params_per_rank

    build, targets, per_block = LORA_HOSTS[name]
    model = build()
    assert lora_params_per_rank(model, find_host(model)) == 2 * per_block
    peft_model = get_peft_model(build(), LoraConfig(r=3, target_modules=targets))
    assert count_trainable(peft_model) == 3 * 2 * per_block
    assert expected_trainable("lora", lora_r=3, model=build()) == 3 * 2 * per_block


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore:fan_in_fan_out:UserWarning")
@pytest.mark.parametrize("name", LORA_HOSTS)
@pytest.mark.parametrize("method", METHODS)
def test_apply_method_counts_equal_the_rows_formula(name, method):
    build = LORA_HOSTS[name][0]
    model = apply_method(build(), method)
    assert count_trainable(model) == expected_trainable(method, model=build())
    if name == "gpt_neox":  # the model-derived count is the GPT-NeoX formula
        assert expected_trainable(method, model=build()) == expected_trainable(method, 32, 2)
    lora = {n for n, p in model.named_parameters() if p.requires_grad and "lora_" in n}
    assert all(".mlp." not in n for n in lora), "LoRA must stay inside attention"
    assert bool(lora) == ("lora" in method)


def test_llama_lora_rank_rules_use_its_gqa_count():
    from mmpreproj.train.methods import matched_lora_rank

    d, layers, per_rank = 64, 2, 2 * 448
    assert expected_trainable("lora", model=_llama_gqa()) == 40 * per_rank  # paper rule: int(int(1.25d) / 2)
    r = matched_lora_rank(d, layers, per_rank=per_rank)
    assert r == round((preproj_params(d, layers) + d * d * layers) / per_rank) == 32
    assert r != matched_lora_rank(d, layers)  # GPT-NeoX's 6d per block would give another rank
    assert expected_trainable("lora_matched", model=_llama_gqa()) == r * per_rank
