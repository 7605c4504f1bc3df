"""train(): what changes, gradients under checkpointing, the run folder, resume, NaN stop, bf16 weights."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import mmpreproj
from mmpreproj.train import (
    METHODS,
    ModelUnavailableError,
    NonFiniteLossError,
    TrainConfig,
    apply_method,
    enable_checkpointing,
    load_checkpoint,
    train,
)
from mmpreproj.train.order import ShardedOrder
from mmpreproj.train.rng import seed_everything
from tests.helpers.adamw import assert_adamw_runs_agree
from tests.helpers.training import DATA, byte_tokenizer, frozen, run_config, trainable
from tests.helpers.zoo import tiny_neox


def _initial(method: str, seed: int = 42, **model_kw):
    """The model `train` starts from: the base, then the method applied right after seeding."""
    model = tiny_neox(**model_kw)
    seed_everything(seed)
    return apply_method(model, method)


def _read_log(out) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("method", METHODS)
def test_training_changes_only_the_methods_weights_and_saves_them(tmp_path, method):
    start = _initial(method)
    result = train(run_config(tmp_path / "run", method=method), tiny_neox(), examples=DATA)
    after = trainable(result.model)
    assert after.keys() == trainable(start).keys() and after
    unchanged = [n for n, p in trainable(start).items() if torch.equal(p, after[n])]
    assert not unchanged, f"trainable weights that did not move: {unchanged}"
    base_after = frozen(result.model)
    assert all(torch.equal(p, base_after[n]) for n, p in frozen(start).items()), "a frozen weight changed"
    # the saved adapter puts the trained weights back onto a fresh base: same logits, unlike the base
    ids = DATA.input_ids[:2]
    loaded = mmpreproj.load_adapter(tiny_neox(), tmp_path / "run").eval()
    with torch.no_grad():
        want = result.model.eval()(input_ids=ids).logits
        torch.testing.assert_close(loaded(input_ids=ids).logits, want, rtol=0, atol=1e-6)
        assert not torch.allclose(tiny_neox()(input_ids=ids).logits, want, atol=1e-4)


def _grads(method: str, reentrant: bool | None, *, via_hf: bool = False) -> dict[str, torch.Tensor | None]:
    torch.manual_seed(0)
    model = apply_method(tiny_neox(), method)
    with torch.no_grad():  # LoRA B starts at 0, which would leave lora_A without gradient
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.05)
    if via_hf:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        model.disable_input_require_grads()  # leave only mmpreproj's own input-embedding hook
    elif reentrant is not None:
        enable_checkpointing(model, reentrant)
    model.train()
    assert model.gpt_neox.layers[0].gradient_checkpointing == (reentrant is not None or via_hf)
    batch = DATA.batch([0, 1, 2])
    model(**batch, use_cache=False).loss.backward()
    return {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("method", ["preproj_skip", "preproj_lora", "lora"])
@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_every_trainable_weight_gets_a_gradient_under_checkpointing(method, reentrant):
    reference = _grads(method, None)
    grads = _grads(method, reentrant)
    for name, g in grads.items():
        assert g is not None and g.abs().sum() > 0, f"no gradient for {name}"
        torch.testing.assert_close(g, reference[name], rtol=1e-4, atol=1e-7)


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_hf_gradient_checkpointing_enable_with_only_the_core_hook(reentrant):
    reference = _grads("preproj_skip", None)
    grads = _grads("preproj_skip", reentrant, via_hf=True)
    for name, g in grads.items():
        assert g is not None and g.abs().sum() > 0, f"no gradient for {name}"
        torch.testing.assert_close(g, reference[name], rtol=1e-4, atol=1e-7)


def test_run_folder_logs_and_metrics(tmp_path):
    out = tmp_path / "run"
    result = train(run_config(out, steps=4, warmup_steps=2, save_every=2), tiny_neox(), examples=DATA)
    assert sorted(p.name for p in out.iterdir()) == [
        "adapter",
        "checkpoint.pt",
        "log.jsonl",
        "metrics.json",
        "train_config.json",
    ]
    records = _read_log(out)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert {"step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "elapsed_s"} <= records[0].keys()
    assert [r["lr"] for r in records] == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3, 5e-4])  # warmup 2, cosine over 4
    seen = [i for k in range(8) for i in ShardedOrder(len(DATA), seed=42).batch(k, 2)]  # 4 steps x 2 x 2 lines
    assert records[-1]["tokens"] == int(DATA.attention_mask[seen].sum())
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["steps"] == 4 and metrics["final_loss"] == records[-1]["loss"]
    assert metrics["trainable_params"] == 2 * (2 * 32 * 40 + 32 * 32)
    assert TrainConfig.from_json(out / "train_config.json") == run_config(out, steps=4, warmup_steps=2, save_every=2)
    assert result.final_loss == records[-1]["loss"] and load_checkpoint(out / "checkpoint.pt")["step"] == 4


def test_the_first_optimizer_step_trains(tmp_path):
    """A one-step run with warmup moves every trainable weight (transformers' warmup would take it at lr 0)."""
    start = _initial("preproj_skip")
    result = train(run_config(tmp_path / "run", steps=1, warmup_steps=1), tiny_neox(), examples=DATA)
    assert _read_log(tmp_path / "run")[0]["lr"] == pytest.approx(5e-4)
    after = trainable(result.model)
    assert [n for n, p in trainable(start).items() if torch.equal(p, after[n])] == []


def test_refuses_to_overwrite_and_to_resume_a_different_config(tmp_path):
    train(run_config(tmp_path, save_every=3), tiny_neox(), examples=DATA)
    with pytest.raises(FileExistsError, match="already holds a run; pass resume=True"):
        train(run_config(tmp_path), tiny_neox(), examples=DATA)
    with pytest.raises(ValueError, match="the config changed \\(lr: 0.001 -> 0.002\\)"):
        train(run_config(tmp_path, lr=2e-3, resume=True), tiny_neox(), examples=DATA)
    assert train(run_config(tmp_path, overwrite=True, steps=1), tiny_neox(), examples=DATA).steps == 1


def test_grad_accumulation_equals_one_big_batch(tmp_path):
    accumulated = train(run_config(tmp_path / "a", batch_size=2, grad_accum=2), tiny_neox(), examples=DATA)
    big = train(run_config(tmp_path / "b", batch_size=4, grad_accum=1), tiny_neox(), examples=DATA)
    # 3 AdamW steps: bounds from lr and the 4 lines x 11 next-token terms summed into each step's gradient
    assert_adamw_runs_agree(trainable(accumulated.model), trainable(big.model), steps=3, lr=1e-3, terms=4 * 11)


def test_resume_ends_bit_identical_to_an_uninterrupted_run(tmp_path):
    dropout = dict(hidden_dropout=0.1, attention_dropout=0.1)  # consumes RNG: a resume must restore it
    kw = dict(steps=6, warmup_steps=2, save_every=3)
    straight = train(run_config(tmp_path / "a", **kw), tiny_neox(**dropout), examples=DATA)
    first = train(run_config(tmp_path / "b", stop_at=3, **kw), tiny_neox(**dropout), examples=DATA)
    assert (first.status, first.steps) == ("stopped", 3)
    halfway = trainable(first.model)
    resumed = train(run_config(tmp_path / "b", resume=True, **kw), tiny_neox(**dropout), examples=DATA)
    assert (resumed.status, resumed.steps, resumed.metrics["resumed_from"]) == ("completed", 6, 3)
    want, got = trainable(straight.model), trainable(resumed.model)
    assert all(torch.equal(want[n], got[n]) for n in want)
    assert not any(torch.equal(want[n], halfway[n]) for n in want)  # steps 4-6 did change the weights
    assert [r["loss"] for r in _read_log(tmp_path / "a")] == [r["loss"] for r in _read_log(tmp_path / "b")]


def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    model, calls = tiny_neox(), []

    def poison(module, args, output):  # the 5th forward (step 5 with grad_accum=1) returns NaN logits
        calls.append(1)
        return output * float("nan") if len(calls) == 5 else output

    model.get_output_embeddings().register_forward_hook(poison)
    cfg = run_config(tmp_path, steps=6, grad_accum=1, save_every=2)
    with pytest.raises(NonFiniteLossError, match="loss is nan at step 5; training stopped") as err:
        train(cfg, model, examples=DATA)
    assert err.value.step == 5 and err.value.checkpoint == str(tmp_path / "checkpoint.pt")
    kept = load_checkpoint(tmp_path / "checkpoint.pt")
    # The weights after step 4 had a NaN loss of their own (step 5's), so the last good checkpoint is step 2's.
    assert kept["step"] == 2 and [r["step"] for r in _read_log(tmp_path)] == [1, 2, 3, 4]
    assert all(torch.isfinite(p).all() for p in kept["trainable"].values())
    assert not any(torch.equal(p, kept["trainable"][n]) for n, p in trainable(model).items())
    assert json.loads((tmp_path / "metrics.json").read_text())["status"] == "nonfinite"
    resumed = train(cfg.replace(resume=True), tiny_neox(), examples=DATA)
    assert resumed.steps == 6 and torch.isfinite(torch.tensor(resumed.final_loss))


def _step_at_1e5(tmp_path, **kw) -> tuple[dict, dict]:
    cfg = run_config(tmp_path, method="preproj", steps=1, lr=1e-5, precision="bf16", grad_accum=1, **kw)
    before = trainable(_initial("preproj", hidden_size=64))
    return before, trainable(train(cfg, tiny_neox(hidden_size=64), examples=DATA).model)


def test_bf16_autocast_keeps_fp32_weights_and_an_lr_1e5_step_moves_them(tmp_path):
    before, after = _step_at_1e5(tmp_path)
    assert all(p.dtype == torch.float32 for p in after.values())
    moved = torch.cat([(after[n] != before[n]).flatten() for n in after]).float().mean()
    assert moved > 0.99


def test_paper_bf16_weights_round_most_lr_1e5_updates_away(tmp_path):
    before, after = _step_at_1e5(tmp_path, paper_bf16_weights=True)
    assert all(p.dtype == torch.bfloat16 for p in after.values())
    unchanged = torch.cat([(after[n] == before[n].to(torch.bfloat16)).flatten() for n in after]).float().mean()
    # Measured 0.70: an update of 1e-5 is below half a bf16 ulp for every |w| >= 2^-8 (P(|N(0, .01)| > .0039) = .70).
    assert unchanged > 0.5


def test_loads_model_tokenizer_and_text_from_local_paths(tmp_path):
    base, tok = tiny_neox(vocab_size=257), byte_tokenizer()
    base.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    text = tmp_path / "train.txt"
    text.write_text("".join(f" line {i} " + "word " * (12 + i) + "\n" for i in range(12)))
    cfg = run_config(
        tmp_path / "run", model=str(tmp_path / "model"), data=str(text), data_config=None, max_len=48, steps=2
    )
    result = train(cfg)
    assert result.steps == 2 and result.metrics["tokens"] > 0
    with pytest.raises(ModelUnavailableError, match="cannot load model 'EleutherAI/not-there' .*--model PATH"):
        train(cfg.replace(model="EleutherAI/not-there", overwrite=True))


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_bf16_base_with_autocast_and_checkpointing_trains_fp32_weights(tmp_path):
    cfg = run_config(tmp_path, method="preproj_lora", precision="bf16", gradient_checkpointing=True, steps=2)
    result = train(cfg, tiny_neox().to(torch.bfloat16), examples=DATA)
    assert torch.isfinite(torch.tensor(result.final_loss))
    assert result.metrics["trainable_dtypes"] == ["torch.float32"]


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_checkpointing_adds_transformers_input_hook_once(reentrant):
    """Either variant leaves exactly one input-embedding hook of transformers' (gradient_checkpointing_enable
    may add one itself: the public disable/enable pair keeps it single, with no private attribute read), so a
    LoRA run's backward reaches as far as a pre-projection run's."""
    model = tiny_neox()
    embeddings = model.get_input_embeddings()
    before = len(embeddings._forward_hooks)  # a test may count hooks; the library reads no private state for it
    enable_checkpointing(model, reentrant)
    assert len(embeddings._forward_hooks) == before + 1
