"""bench/bench_hot_path.py measures what it says (issue 45, item 8): its premises on the tiny shape, never its
timings. The four variants are built; ours and the authors' hooked modules compute the same logits and tokens;
LoRA at the paper's rank trains about as many weights as ours; the decode loop is greedy decoding with the KV
cache; ours drops its seam-check hooks after the first forward; the JSON holds every figure the issue asks for."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def hp():
    """The script as a module. Bench scripts import their siblings by bare name (`common`, `bench_tuner`), so
    bench/ goes on sys.path while it imports; those names leave sys.modules again after the module's tests."""
    before = set(sys.modules)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(BENCH))
        yield importlib.import_module("bench_hot_path")
    for name in ("bench_hot_path", "bench_decode", "bench_tuner", "common"):
        if name not in before:
            sys.modules.pop(name, None)


@pytest.fixture
def models(hp):
    return hp.build_variants(hp.build_base("tiny"))


def test_four_variants_each_a_copy_of_one_base(hp, models):
    assert tuple(models) == hp.VARIANTS
    weights = {k: m.get_input_embeddings().weight for k, m in models.items()}
    assert len({w.data_ptr() for w in weights.values()}) == 4  # four copies, no shared storage
    for w in weights.values():
        assert torch.equal(w, weights["base"])
    assert all(p.requires_grad for p in models["base"].parameters())  # each variant froze its own copy only
    assert hp.count_trainable(models["ours"]) == hp.count_trainable(models["authors"]) > 0


def test_ours_and_authors_give_the_same_logits_on_fp32(hp, models):
    ids = hp.check_ids(models["base"])
    with torch.no_grad():
        logits = {k: m(ids).logits for k, m in models.items()}
    torch.testing.assert_close(logits["ours"], logits["authors"], atol=1e-4, rtol=1e-4)
    assert not torch.allclose(logits["ours"], logits["base"], atol=1e-4)  # the modules do change the output
    hp.check_same_outputs(models, ids)
    with torch.no_grad():  # the script's own check can fail: one authors' weight off
        skip = models["authors"].gpt_neox.layers[0].attention.authors.skip.weight
        skip.add_(0.1 * torch.randn(skip.shape, generator=torch.Generator().manual_seed(5)))
    with pytest.raises(AssertionError):
        hp.check_same_outputs(models, ids)


def test_lora_at_the_paper_rank_trains_about_as_many_weights_as_ours(hp, models):
    ours, lora = hp.count_trainable(models["ours"]), hp.count_trainable(models["lora"])
    assert models["lora"].peft_config["default"].r == 40  # the paper's rule: int(2 d int(1.25 d) / 4d) at d = 64
    d, layers, r = 64, 2, 40  # the tiny shape; counted by hand, not by the script's own helpers
    assert ours == layers * (2 * d * int(1.25 * d) + d * d)  # W_up, W_down, the full W_skip per block
    assert lora == layers * r * ((d + 3 * d) + (d + d))  # A and B on query_key_value (d -> 3d) and dense (d -> d)
    names = [n for n, p in models["lora"].named_parameters() if p.requires_grad]
    assert names and all(".lora_" in n and (".query_key_value." in n or ".dense." in n) for n in names)


def test_the_decode_loop_is_greedy_generation_and_ours_matches_authors(hp, models):
    prompt = torch.randint(0, 1024, (1, 8), generator=torch.Generator().manual_seed(4))
    spent, tokens = hp.decode_round(models, prompt, steps=5)
    assert set(spent) == set(tokens) == set(hp.VARIANTS) and all(t > 0 for t in spent.values())
    want = models["base"].generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)[0, 8:].tolist()
    assert tokens["base"] == want  # prefill's next token + 5 cached steps = generate's 6 new tokens
    assert tokens["ours"] == tokens["authors"]
    assert tokens["lora"] == tokens["base"]  # LoRA's B = 0 at init


def test_bf16_host_keeps_our_weights_fp32_and_the_outputs_agree(hp, models):
    hosted = hp.cast_variants(models, torch.bfloat16)
    assert all(hosted[k].dtype == torch.bfloat16 for k in hp.VARIANTS)
    ours = [p.dtype for n, p in hosted["ours"].named_parameters() if ".preproj" in n]
    authors = [p.dtype for n, p in hosted["authors"].named_parameters() if ".authors." in n]
    assert ours and set(ours) == {torch.float32}  # the default config: fp32 weights computing in bf16
    assert authors and set(authors) == {torch.bfloat16}  # the authors' setting: the whole model in bf16
    hp.check_same_outputs(hosted, hp.check_ids(models["base"]))
    assert hp.weight_bytes(hosted["ours"]) > hp.weight_bytes(hosted["base"])


def test_ours_drops_its_seam_checks_after_the_first_forward(hp, models):
    layers = models["base"].config.num_hidden_layers
    before = hp.python_hooks(models["ours"])
    with torch.no_grad():
        models["ours"](hp.check_ids(models["base"]))
    after = {k: hp.python_hooks(m) for k, m in models.items()}
    # a seam check (3 hooks) per block + the embedding's gradient hook + the model's mixed-batch pair
    assert before == 3 * layers + 3
    assert after == {"base": 0, "ours": 3, "authors": 2 * layers, "lora": 0}


def test_a_tiny_run_writes_every_figure(hp, tmp_path):
    out = tmp_path / "hot.json"
    hp.main(["--tiny", "--repeats", "1", "--new", "2", "--prompt", "4", "--seq", "8", "--json", str(out)])
    res = json.loads(out.read_text())
    for key in ("machine", "load_avg_before", "load_avg_after", "shape", "dtypes", "repeats", "trainable"):
        assert key in res, key
    assert res["shape"] == "tiny" and res["dtypes"] == ["float32", "bfloat16"]
    assert res["python_hooks"]["ours"] == 3 < res["python_hooks"]["ours_before_first_forward"]
    for row in res["decode"].values():
        assert set(row["per_token"]) == set(hp.VARIANTS)
        assert set(row["ratios"]) == {"ours/base", "authors/base", "lora/base", "ours/authors"}
        assert row["weight_bytes_ratio"] > 1 and "ours_minus_authors_ms" in row
        assert row["python_hooks"]["ours"] == 3
        for r in row["per_token"].values():
            assert 0 < r["ms_min"] <= r["ms"] <= r["ms_max"]
    assert set(res["train"]["step"]) == {"ours", "authors", "lora"} and "ours/authors" in res["train"]["ratios"]
    assert "ours_minus_authors_ms" in res["train"]
