"""FSDP2 training: two CPU processes (gloo) via `torch.distributed.run` shard the model, train identically,
and rank 0 saves the full (gathered) adapter."""

from __future__ import annotations

import json

import pytest
import torch

import mmpreproj
from mmpreproj.method.files import read_adapter
from mmpreproj.train import TrainConfig, apply_method, train
from mmpreproj.train.rng import seed_everything
from mmpreproj_cli.parser import build_parser
from tests.helpers.adamw import assert_adamw_runs_agree
from tests.helpers.distributed import DATA, FSDP_CONFIG, WORKER, run_two_ranks
from tests.helpers.zoo import tiny_neox


def _two_ranks(tmp_path, mode: str) -> tuple:
    """(run folder, [what each rank's worker wrote]) of the worker run under `mode` on two gloo ranks; three
    processes import torch on a shared CPU: waited for, the guard is only against a hang."""
    out, side = tmp_path / "run", tmp_path / "side"
    side.mkdir()
    run_two_ranks(WORKER, out, side, mode)
    return out, [torch.load(side / f"rank{r}.pt") for r in range(2)]


@pytest.mark.slow
def test_two_gloo_ranks_fsdp_train_identically_and_save_full_adapter(tmp_path):
    out, ranks = _two_ranks(tmp_path, "fsdp")
    w0, w1 = ranks[0]["weights"], ranks[1]["weights"]
    assert w0.keys() == w1.keys() and all(torch.equal(w0[k], w1[k]) for k in w0)
    assert ranks[0]["loss"] == ranks[1]["loss"]
    # the weights really were sharded: each rank held half of every injected matrix (dim 0)
    for r in ranks:
        assert r["local_shapes"].keys() == w0.keys()
        assert all(r["local_shapes"][k] == (w0[k].shape[0] // 2, *w0[k].shape[1:]) for k in w0)
    # only rank 0 wrote the run folder (no checkpoint under FSDP): one log line per step
    files = sorted(p.name for p in out.iterdir())
    assert files == ["adapter", "log.jsonl", "metrics.json", "train_config.json"]
    assert len((out / "log.jsonl").read_text().splitlines()) == 3
    # the saved adapter holds the full gathered weights, not shards
    _, saved = read_adapter(out / "adapter")
    assert saved.keys() == w0.keys() and all(torch.equal(saved[k], w0[k]) for k in w0)
    # ... and reloads into a fresh base with the trained outputs, which differ from the base's
    reloaded = mmpreproj.load_adapter(tiny_neox(), out / "adapter")
    ids = DATA.batch(list(range(4)))["input_ids"]
    with torch.no_grad():
        assert not torch.allclose(reloaded(input_ids=ids).logits, tiny_neox()(input_ids=ids).logits)
    assert all(torch.equal(v, w0[k]) for k, v in mmpreproj.adapter_state_dict(reloaded).items())
    # each rank saw half of every step: the same update as one process with twice the batch
    single_cfg = TrainConfig(out=str(tmp_path / "single"), **{**FSDP_CONFIG, "batch_size": 4})
    single = train(single_cfg, tiny_neox(), examples=DATA)
    ref = mmpreproj.adapter_state_dict(single.model)
    # 3 AdamW steps: bounds from lr and the 4 rows x 2 accumulated x 11 next-token terms per step
    assert_adamw_runs_agree(w0, ref, steps=3, lr=1e-3, terms=4 * 2 * 11)
    seed_everything(42)  # what train() starts from
    init = mmpreproj.adapter_state_dict(apply_method(tiny_neox(), "preproj_skip"))
    assert not any(torch.equal(w0[k], init[k]) for k in w0)  # every injected weight got gradients and moved


@pytest.mark.slow
def test_two_gloo_ranks_fsdp_checkpoint_and_resume_bit_identically(tmp_path):
    out, ranks = _two_ranks(tmp_path, "fsdp-resume")
    for method in ("preproj_skip", "preproj_lora"):
        straight, resumed = ranks[0][method, "straight"], ranks[0][method, "resumed"]
        # stopped after step 2 and resumed from its checkpoint, the run ends where the straight run ends, bit for bit
        w, r = straight["weights"], resumed["weights"]
        assert w.keys() == r.keys() and all(torch.equal(w[k], r[k]) for k in w)
        assert straight["loss"] == resumed["loss"] == ranks[1][method, "resumed"]["loss"]
        metrics = json.loads((out / method / "resumed" / "metrics.json").read_text())
        assert metrics["resumed_from"] == 2 and metrics["steps"] == 3 and metrics["world_size"] == 2
        assert len((out / method / "resumed" / "log.jsonl").read_text().splitlines()) == 3
        # the checkpoint holds full tensors, not rank 0's shards: every trainable weight and its AdamW moments
        ckpt = torch.load(out / method / "straight" / "checkpoint.pt", weights_only=True)
        assert ckpt["step"] == 3 and ckpt["world_size"] == 2
        assert ckpt["trainable"].keys() == w.keys() and all(torch.equal(ckpt["trainable"][k], w[k]) for k in w)
        moments = ckpt["optimizer"]["state"]
        assert moments.keys() == w.keys() and all(moments[k]["exp_avg"].shape == w[k].shape for k in w)
    assert any(".lora_A." in k for k in ranks[0]["preproj_lora", "straight"]["weights"])  # peft's LoRA trained too


def test_parallel_is_validated_and_fsdp_takes_checkpoints():
    with pytest.raises(ValueError, match=r"TrainConfig.parallel='zero3'; allowed values: \['ddp', 'fsdp'\]"):
        TrainConfig(parallel="zero3")
    assert TrainConfig(parallel="fsdp").save_every == 100  # checkpoints and resume as under ddp
    assert TrainConfig(parallel="fsdp", resume=True).resume
    assert build_parser().parse_args(["train", "--parallel", "fsdp"]).parallel == "fsdp"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--parallel", "zero3"])
