"""Run by tests/test_train_distributed.py and tests/test_train_fsdp.py (`tests.helpers.distributed.WORKER`)
under `torch.distributed.run --nproc_per_node 2` (not a test itself, never imported).

argv: OUT SIDE [PARALLEL]. Trains a tiny injected GPT-NeoX for 3 steps with gloo data parallelism ("ddp",
the default) or FSDP2 ("fsdp": rank 1 checks the run folder 2 s late, so a rank that wrote before every rank had
checked would make it refuse the folder), then writes this rank's trained adapter weights to SIDE/rank<r>.pt (a
test-only side channel) for the test to compare. For "fsdp" the worker opens the process group itself,
as `accelerate launch` would, so that the sharded weights can still be gathered after `train()` returns.
"fsdp-resume": under FSDP2 with a checkpoint every step, for preproj_skip and for preproj_lora (peft's LoRA beside
ours), once straight through (OUT/<method>/straight) and once stopped after step 2 and resumed
(OUT/<method>/resumed); SIDE/rank<r>.pt holds, per method and run, the gathered trainable weights by parameter
name and the final loss.
"""

import os
import sys
import time

# the repository root in place of this script's folder (whose module names, e.g. `distributed`, would shadow)
sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import mmpreproj  # noqa: E402
from mmpreproj.train import TrainConfig, train, trainer  # noqa: E402
from tests.helpers.distributed import CONFIG, DATA, FSDP_CONFIG  # noqa: E402
from tests.helpers.zoo import tiny_neox  # noqa: E402

if __name__ == "__main__":
    out, side = sys.argv[1], sys.argv[2]
    parallel = sys.argv[3] if len(sys.argv) > 3 else "ddp"
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    if parallel == "fsdp-resume":
        dist.init_process_group("gloo")
        runs = {}
        for method in ("preproj_skip", "preproj_lora"):
            cfg = dict(FSDP_CONFIG, save_every=1, method=method)
            for name, stops in (("straight", [None]), ("resumed", [2, None])):
                for i, stop in enumerate(stops):
                    config = TrainConfig(out=f"{out}/{method}/{name}", stop_at=stop, resume=i > 0, **cfg)
                    result = train(config, tiny_neox(), examples=DATA)
                weights = {  # gathered: every rank takes part
                    n: p.full_tensor() for n, p in result.model.named_parameters() if p.requires_grad
                }
                runs[method, name] = {"weights": weights, "loss": result.final_loss}
        dist.destroy_process_group()
        torch.save(runs, f"{side}/rank{rank}.pt")
        sys.exit(0)
    if parallel == "fsdp":
        dist.init_process_group("gloo")
        # rank 1 checks the run folder 2 s after rank 0, as a rank descheduled under load would (FSDP2 sets up
        # with no collective, so rank 0 goes on to write the run's first files meanwhile)
        checked = trainer._prepare_out
        trainer._prepare_out = lambda *a: (time.sleep(2 * rank), checked(*a))[1]
        result = train(TrainConfig(out=out, **FSDP_CONFIG), tiny_neox(), examples=DATA)
        local = {  # this rank's shard of each injected weight, before gathering (keyed as adapter_state_dict)
            f"{path}.{slot}.{k}": tuple(v.to_local().shape)
            for path, w in result.model.named_modules()
            if isinstance(w, mmpreproj.PreProjAttention)
            for slot, m in zip(w.adapter_layer_names, w.slots())
            for k, v in m.state_dict().items()
        }
        weights = mmpreproj.adapter_state_dict(result.model)  # gathers: every rank takes part
        dist.destroy_process_group()
    else:
        result = train(TrainConfig(out=out, **CONFIG), tiny_neox(), examples=DATA)
        local, weights = None, mmpreproj.adapter_state_dict(result.model)
    state = {"weights": weights, "local_shapes": local, "loss": result.final_loss}
    torch.save(state, f"{side}/rank{rank}.pt")
