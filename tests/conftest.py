"""pytest fixtures shared by every test module (offline hub settings first); the tiny hosts they build, and
every other shared piece, are in `tests/helpers/` (test modules import those, never this file)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.helpers.zoo import tiny_neox  # noqa: E402


@pytest.fixture(params=[True, False], ids=["parallel", "sequential"])
def neox(request):
    return tiny_neox(parallel=request.param)


@pytest.fixture
def tokens():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 128, (2, 9), generator=g)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A 2-block GPT-NeoX (width 32) with the mini-pythia tokenizer, saved in a temp folder for CLI/reproduce runs."""
    from transformers import AutoTokenizer, GPTNeoXConfig, GPTNeoXForCausalLM

    from mmpreproj.data import asset_path

    path = tmp_path_factory.mktemp("tiny-neox")
    tok = AutoTokenizer.from_pretrained(str(asset_path("mini-pythia")))
    torch.manual_seed(0)
    cfg = GPTNeoXConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        rotary_pct=0.25,
        max_position_embeddings=256,
    )
    GPTNeoXForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path
