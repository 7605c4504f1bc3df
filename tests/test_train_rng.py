"""train() runs on its own RNG stream: the caller's torch / python `random` / numpy states are left exactly as they
were (after a return or a raise), the run draws the same numbers whatever the caller drew, and a checkpoint holds
the run's stream, not the caller's."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from mmpreproj.train import LMExamples, NonFiniteLossError, TrainConfig, load_checkpoint, train
from mmpreproj.train.rng import seed_everything, seeded_rng
from tests.helpers.training import run_config, trainable
from tests.helpers.zoo import tiny_neox

DATA = LMExamples.random(24, 12, 128, seed=0)
DROPOUT = dict(hidden_dropout=0.2, attention_dropout=0.2)  # the run draws random numbers at every step


def _cfg(path, **kw) -> TrainConfig:
    """`helpers.training.run_config` with 4 steps (two optimizer steps at grad_accum 2)."""
    return run_config(path, **{"steps": 4, **kw})


def _states() -> dict:
    """The caller's global generator states, comparable with ==."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    states = {
        "torch": torch.get_rng_state().tolist(),
        "python": random.getstate(),
        "numpy": (name, keys.tolist(), pos, has_gauss, cached),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return states


def _draw() -> tuple:
    """One draw from each global stream."""
    return torch.rand(3).tolist(), random.random(), np.random.rand(3).tolist()


def _caller_noise(seed: int) -> None:
    """A caller that seeds and uses the global generators its own way."""
    torch.manual_seed(seed)
    random.seed(seed + 1)
    np.random.seed(seed + 2)
    _draw()


def _losses(out) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "log.jsonl").read_text().splitlines()]


def test_train_leaves_the_callers_rng_states_as_they_were(tmp_path):
    model = tiny_neox(**DROPOUT)  # tiny_neox seeds torch: build before taking the states
    _caller_noise(123)
    before = _states()
    train(_cfg(tmp_path / "run", save_every=2), model, examples=DATA)
    assert _states() == before


def test_a_train_that_raises_leaves_the_callers_rng_states_as_they_were(tmp_path):
    model, calls = tiny_neox(**DROPOUT), []

    def poison(module, args, output):  # the 5th forward returns NaN logits: raises mid-run, after draws
        calls.append(1)
        return output * float("nan") if len(calls) == 5 else output

    model.get_output_embeddings().register_forward_hook(poison)
    _caller_noise(7)
    before = _states()
    with pytest.raises(NonFiniteLossError):
        train(_cfg(tmp_path / "run", steps=6, grad_accum=1, save_every=2), model, examples=DATA)
    assert _states() == before
    # raising before anything is set up (the folder holds a run): the same
    model = tiny_neox()
    before = _states()
    with pytest.raises(FileExistsError):
        train(_cfg(tmp_path / "run"), model, examples=DATA)
    assert _states() == before


def test_the_callers_stream_continues_as_if_train_never_ran(tmp_path):
    model = tiny_neox(**DROPOUT)
    _caller_noise(5)
    first = _draw()
    train(_cfg(tmp_path / "run"), model, examples=DATA)
    after = _draw()
    _caller_noise(5)
    assert _draw() == first
    assert _draw() == after


def test_same_seed_same_run_whatever_the_caller_drew(tmp_path):
    runs = []
    for i, noise in enumerate((1, 99)):
        model = tiny_neox(**DROPOUT)
        _caller_noise(noise)
        result = train(_cfg(tmp_path / f"run{i}", seed=3), model, examples=DATA)
        _draw()  # the caller keeps using its streams between the runs
        runs.append((_losses(tmp_path / f"run{i}"), trainable(result.model)))
    (losses_a, weights_a), (losses_b, weights_b) = runs
    assert losses_a == losses_b
    assert weights_a.keys() == weights_b.keys() and all(torch.equal(weights_a[n], weights_b[n]) for n in weights_a)
    # the seed does matter: another seed gives another run
    other = train(_cfg(tmp_path / "other", seed=4), tiny_neox(**DROPOUT), examples=DATA)
    assert not all(torch.equal(weights_a[n], p) for n, p in trainable(other.model).items())


def test_train_draws_what_seed_everything_then_the_same_code_would(tmp_path):
    """`seeded_rng(seed)` starts the stream `seed_everything(seed)` starts, and puts the caller's back."""
    _caller_noise(11)
    before = _states()
    with seeded_rng(42):
        inside = _draw()
    assert _states() == before
    seed_everything(42)
    assert _draw() == inside


def test_a_resume_continues_the_runs_stream_not_the_callers(tmp_path):
    kw = dict(steps=6, save_every=3)
    straight = train(_cfg(tmp_path / "a", **kw), tiny_neox(**DROPOUT), examples=DATA)
    model = tiny_neox(**DROPOUT)
    _caller_noise(2)
    train(_cfg(tmp_path / "b", stop_at=3, **kw), model, examples=DATA)
    saved = load_checkpoint(tmp_path / "b" / "checkpoint.pt")["rng"][0]["torch"]
    # the same stop from another caller state saves the same RNG state: the run's own stream
    model = tiny_neox(**DROPOUT)
    _caller_noise(77)
    train(_cfg(tmp_path / "c", stop_at=3, **kw), model, examples=DATA)
    assert torch.equal(load_checkpoint(tmp_path / "c" / "checkpoint.pt")["rng"][0]["torch"], saved)
    model = tiny_neox(**DROPOUT)
    _caller_noise(3)  # the caller draws between the stop and the resume
    before = _states()
    resumed = train(_cfg(tmp_path / "b", resume=True, **kw), model, examples=DATA)
    assert _states() == before  # restoring the checkpoint's states did not leak out
    want, got = trainable(straight.model), trainable(resumed.model)
    assert all(torch.equal(want[n], got[n]) for n in want)
    assert _losses(tmp_path / "a") == _losses(tmp_path / "b")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_run_leaves_the_callers_cuda_rng_as_it_was(tmp_path):
    torch.cuda.init()
    model = tiny_neox(**DROPOUT)
    _caller_noise(9)
    torch.cuda.manual_seed_all(9)
    before = _states()
    train(_cfg(tmp_path / "run", device="cuda"), model, examples=DATA)
    assert _states() == before
