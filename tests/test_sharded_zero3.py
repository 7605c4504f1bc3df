"""DeepSpeed ZeRO-3 on CPU (2 gloo ranks, `tests/helpers/zero3_worker.py`): a peft PREPROJ model trains with
every parameter partitioned (the seam check passes under ZeRO-3's tensor-replacing module hooks), the main
process saves the consolidated state dict, one process reloads it bit-exact, and a save without `state_dict=`
is refused rather than writing empty partitions. Skipped when DeepSpeed is not installed (the `dev` extra)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
from peft import PeftModel, get_peft_model
from safetensors.torch import load_file

from mmpreproj import PreProjConfig
from tests.helpers.adamw import assert_adamw_runs_agree
from tests.helpers.distributed import run_two_ranks
from tests.helpers.zoo import tiny_neox

WORKER = Path(__file__).parent / "helpers" / "zero3_worker.py"  # run as a script, never imported
SLOTS = (".preproj.", ".preproj_skip.")  # the wrapper's slots (adapter_layer_names)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="DeepSpeed is not installed: pip install -e '.[dev]' (or pip install deepspeed) to run the ZeRO-3 tests",
)


def _batch(i: int, rank: int) -> torch.Tensor:  # the worker's batches
    return torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(100 * i + rank))


def _unsharded_run(steps: int, lr: float) -> dict[str, torch.Tensor]:
    """One process, both ranks' batches at once: what ZeRO-3's averaged gradients should give (the worker's
    optimizer: AdamW, no decay, gradients clipped to norm 1)."""
    model = get_peft_model(tiny_neox(), PreProjConfig(skip_init_std=0.02))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    for i in range(steps):
        ids = torch.cat([_batch(i, 0), _batch(i, 1)])
        model(input_ids=ids, labels=ids).loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items() if any(s in k for s in SLOTS)}


@pytest.mark.slow
def test_zero3_trains_saves_from_the_main_process_and_reloads_bit_exact(tmp_path):
    # importing DeepSpeed on a loaded CPU takes minutes: wait for the work; the guard is only against a hang
    run_two_ranks(WORKER, tmp_path)
    result = torch.load(tmp_path / "result.pt")
    # it trained, really partitioned, and the seam check ran on tensors ZeRO-3 had replaced
    assert result["partitioned"] and all(math.isfinite(x) for x in result["losses"])
    assert result["seam_replaced"] and any(result["seam_replaced"])
    # the main process's save holds the consolidated weights, which are the gathered ones
    consolidated, gathered = result["consolidated"], result["gathered"]
    assert len(consolidated) == 2 * 3 and consolidated.keys() == gathered.keys()
    assert all(torch.equal(consolidated[k], gathered[k]) for k in gathered)
    saved = load_file(tmp_path / "saved" / "adapter_model.safetensors")  # file keys: the adapter name removed
    as_file = {k.replace(".default.", "."): v for k, v in gathered.items()}
    assert saved.keys() == as_file.keys() and all(torch.equal(saved[k], as_file[k]) for k in as_file)
    # a save without the consolidated state dict was refused on every rank, and wrote no weights
    assert "is empty in the given state dict (DeepSpeed ZeRO-3" in result["refused"]
    assert not any((tmp_path / f"unsaved{r}" / "adapter_model.safetensors").exists() for r in range(2))
    # one process reloads it: the trained weights bit-exact, outputs unlike the base's
    reloaded = PeftModel.from_pretrained(tiny_neox(), tmp_path / "saved")
    live = {k: v for k, v in reloaded.state_dict().items() if any(s in k for s in SLOTS)}
    assert live.keys() == gathered.keys() and all(torch.equal(live[k], gathered[k]) for k in gathered)
    ids = _batch(0, 0)
    with torch.no_grad():
        assert not torch.allclose(reloaded(input_ids=ids).logits, tiny_neox()(input_ids=ids).logits)
    # the same training as one unsharded process on both batches, up to float32 rounding; every weight moved
    init = {k: v for k, v in get_peft_model(tiny_neox(), PreProjConfig(skip_init_std=0.02)).state_dict().items()}
    assert not any(torch.equal(gathered[k], init[k]) for k in gathered)
    assert_adamw_runs_agree(gathered, _unsharded_run(3, 1e-3), steps=3, lr=1e-3, terms=4 * 11)
