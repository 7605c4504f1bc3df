"""Run by tests/test_sharded_zero3.py under `torch.distributed.run --nproc_per_node 2` (gloo, DeepSpeed's CPU
accelerator); not a test itself, never imported.

argv: SIDE. `get_peft_model(tiny_neox(), PreProjConfig())` under a DeepSpeed ZeRO-3 engine (fp32, torch AdamW):
every parameter is partitioned over the two ranks and ZeRO-3's module hooks hand each module's inputs and
outputs on as new tensor objects (the seam check must still pass). Three steps, each rank on its own batch.
Then the save a Trainer makes under ZeRO-3: every rank gathers the consolidated state dict, and rank 0 alone
calls `save_pretrained(SIDE/saved, state_dict=full)`; a save without `state_dict=` must be refused (the live
weights are empty partitions), identically on every rank.

Rank 0 writes SIDE/result.pt: the losses, the adapter's entries of the consolidated state dict, the adapter
weights gathered with `GatheredParameters`, the refusal's message, and for each seam comparison whether the
attention received another tensor object than the norm returned (it must, or the run proves nothing).
"""

import os
import sys

# the repository root in place of this script's folder (whose module names would shadow)
sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from peft import get_peft_model  # noqa: E402

import mmpreproj.method.layer as seam  # noqa: E402
from mmpreproj import PreProjConfig  # noqa: E402
from tests.helpers.zoo import tiny_neox  # noqa: E402

SLOTS = (".preproj.", ".preproj_skip.")  # the wrapper's slots (adapter_layer_names)
LR = 1e-3
DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {
        "stage": 3,
        "stage3_gather_16bit_weights_on_model_save": True,
        "stage3_param_persistence_threshold": 0,  # partition every parameter, however small
    },
    "zero_allow_untested_optimizer": True,  # a torch AdamW: no DeepSpeed op to build
    "gradient_clipping": 1.0,  # as the test's unsharded run (named: DeepSpeed's default has been 1.0, not 0)
    "steps_per_print": 1_000_000,
}


def batch(i: int, rank: int) -> torch.Tensor:
    return torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(100 * i + rank))


REPLACED: list[bool] = []  # per seam comparison: did the attention get another object than the norm's output?
_same_tensor = seam.same_tensor


def _counted(seen: torch.Tensor, x: object) -> bool:
    REPLACED.append(x is not seen)
    return _same_tensor(seen, x)


seam.same_tensor = _counted  # what SeamCheck.verify calls


def main() -> None:
    side = sys.argv[1]
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    model = get_peft_model(tiny_neox(), PreProjConfig(skip_init_std=0.02))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=LR, weight_decay=0.0)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=DS_CONFIG)
    losses = []
    for i in range(3):
        loss = engine(input_ids=batch(i, rank), labels=batch(i, rank)).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    print(f"rank {rank}: trained", file=sys.stderr, flush=True)
    partitioned = all(p.numel() == 0 for p in trainable)  # ZeRO-3 really holds them elsewhere

    refused = None
    try:  # every rank: no collective may run, and nothing may be written
        model.save_pretrained(os.path.join(side, f"unsaved{rank}"))
    except ValueError as e:
        refused = str(e)
    full = engine._zero3_consolidated_16bit_state_dict()  # every rank takes part; rank 0 gets it
    if rank == 0:  # the main process alone, as Trainer._save
        model.save_pretrained(os.path.join(side, "saved"), state_dict=full)
    dist.barrier()
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    with deepspeed.zero.GatheredParameters(trainable):
        gathered = {n: p.detach().clone() for n, p in zip(names, trainable)}
    if rank == 0:
        result = {
            "losses": losses,
            "partitioned": partitioned,
            "consolidated": {k: v.clone() for k, v in full.items() if any(s in k for s in SLOTS)},
            "gathered": gathered,
            "refused": refused,
            "seam_replaced": list(REPLACED),
        }
        torch.save(result, os.path.join(side, "result.pt"))
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: done", file=sys.stderr, flush=True)  # in the test's stderr tail if teardown fails


if __name__ == "__main__":
    main()
    # Skip the interpreter's teardown: once, under load, a rank aborted after its work with "terminate called
    # without an active exception" (a C++ thread of DeepSpeed's or gloo's destroyed while joinable). Every check
    # this run makes is in result.pt, written and barriered above.
    sys.stdout.flush()
    os._exit(0)
