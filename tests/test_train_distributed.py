"""Data-parallel training: two CPU processes (gloo) via `torch.distributed.run` end with the same weights."""

from __future__ import annotations

import pytest
import torch

import mmpreproj
from mmpreproj.train import TrainConfig, apply_method, train
from mmpreproj.train.rng import seed_everything
from tests.helpers.adamw import assert_adamw_runs_agree
from tests.helpers.distributed import CONFIG, DATA, WORKER, run_two_ranks
from tests.helpers.zoo import tiny_neox


@pytest.mark.slow
def test_two_gloo_ranks_train_identically_and_only_rank0_writes(tmp_path):
    out, side = tmp_path / "run", tmp_path / "side"
    side.mkdir()
    run_two_ranks(WORKER, out, side)
    ranks = [torch.load(side / f"rank{r}.pt") for r in range(2)]
    w0, w1 = ranks[0]["weights"], ranks[1]["weights"]
    assert w0.keys() == w1.keys() and all(torch.equal(w0[k], w1[k]) for k in w0)
    assert ranks[0]["loss"] == ranks[1]["loss"]  # the logged loss is the global mean
    # only rank 0 wrote the run folder: one log line per step, no stray temp files
    assert sorted(p.name for p in out.iterdir()) == [
        "adapter",
        "checkpoint.pt",
        "log.jsonl",
        "metrics.json",
        "train_config.json",
    ]
    assert len((out / "log.jsonl").read_text().splitlines()) == 3
    # each rank saw half of every step: the same update as one process with twice the batch
    single = train(
        TrainConfig(out=str(tmp_path / "single"), **{**CONFIG, "batch_size": 4}), tiny_neox(), examples=DATA
    )
    ref = mmpreproj.adapter_state_dict(single.model)
    # 3 AdamW steps: bounds from lr and the 4 rows x 2 accumulated x 11 next-token terms per step
    assert_adamw_runs_agree(w0, ref, steps=3, lr=1e-3, terms=4 * 2 * 11)
    seed_everything(42)  # what train() starts from
    init = mmpreproj.adapter_state_dict(apply_method(tiny_neox(), "preproj_skip"))
    assert not any(torch.equal(w0[k], init[k]) for k in w0)  # training moved every weight


def test_the_current_cuda_device_set_for_nccl_is_put_back(monkeypatch):
    """`init_distributed` sets the current CUDA device (process-wide) only for the group it opens;
    `shutdown` puts the caller's back, also when joining the group fails."""
    import torch.distributed as dist

    from mmpreproj.train import distributed

    current, joined = [0], []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(
        torch.cuda, "set_device", lambda d: current.__setitem__(0, d if isinstance(d, int) else d.index)
    )
    monkeypatch.setattr(dist, "is_initialized", lambda: bool(joined))
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: joined.append(kw["backend"]))
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "destroy_process_group", joined.clear)
    ctx = distributed.init_distributed("cuda:1")
    assert (joined, current, ctx.owns_group) == (["nccl"], [1], True)
    distributed.shutdown(ctx)
    assert (joined, current) == ([], [0])

    def refuse(**kw):
        raise RuntimeError("no rendezvous")

    monkeypatch.setattr(dist, "init_process_group", refuse)
    with pytest.raises(RuntimeError, match="no rendezvous"):
        distributed.init_distributed("cuda:1")
    assert current == [0]


class _Stop(Exception):
    """Raised by the stubbed set-up: the test looks only at what ran before it."""


def _stub_start(monkeypatch, gathered: list) -> list[str]:
    """`trainer._train` on rank 1 of 2 with the folder check, the collective and the set-up stubbed: the order in
    which they ran. `gathered` is what the collective returns (one entry per rank)."""
    from mmpreproj.train import trainer

    calls: list[str] = []
    monkeypatch.setattr(trainer, "_prepare_out", lambda *a: calls.append("check") or (None, False))
    monkeypatch.setattr(trainer, "all_gather_objects", lambda obj, ctx: calls.append("gather") or gathered)

    def setup(*a):
        calls.append("setup")
        raise _Stop

    monkeypatch.setattr(trainer, "_setup", setup)
    return calls


def test_every_rank_checks_the_run_folder_before_any_rank_writes_to_it(monkeypatch, tmp_path):
    """A rank that started late found the run folder the faster rank had begun writing, and refused it as "already
    holds a run" (seen under load in test_train_fsdp): a collective now sits between every rank's check and the
    set-up that writes."""
    from mmpreproj.train import trainer
    from mmpreproj.train.distributed import DistContext

    calls = _stub_start(monkeypatch, [None, None])
    with pytest.raises(_Stop):
        trainer._train(TrainConfig(out=str(tmp_path)), DistContext(rank=1, world_size=2), None, None, None)
    assert calls == ["check", "gather", "setup"]


def test_a_folder_refused_on_one_rank_is_refused_on_every_rank(monkeypatch, tmp_path):
    from mmpreproj.train import trainer
    from mmpreproj.train.distributed import DistContext

    calls = _stub_start(monkeypatch, [(FileExistsError, "run already holds a run"), None])
    with pytest.raises(FileExistsError, match="^run already holds a run$"):
        trainer._train(TrainConfig(out=str(tmp_path)), DistContext(rank=1, world_size=2), None, None, None)
    assert calls == ["check", "gather"]  # nothing set up, nothing written
