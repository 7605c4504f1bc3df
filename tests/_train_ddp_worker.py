"""Run by tests/test_train_distributed.py under `torch.distributed.run --nproc_per_node 2` (not a test itself).

argv: OUT SIDE. Trains a tiny injected GPT-NeoX for 3 steps with gloo data parallelism, then writes this
rank's trained adapter weights to SIDE/rank<r>.pt (a test-only side channel) for the test to compare.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from conftest import tiny_neox  # noqa: E402

import mmpreproj  # noqa: E402
from mmpreproj.train import LMExamples, TrainConfig, train  # noqa: E402

DATA = LMExamples.random(40, 12, 128, seed=0)
CONFIG = dict(
    method="preproj_skip", model="tiny", steps=3, warmup_steps=0, lr=1e-3, batch_size=2, grad_accum=2,
    precision="fp32", gradient_checkpointing=False, save_every=3, progress=False, device="cpu",
)

if __name__ == "__main__":
    out, side = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    result = train(TrainConfig(out=out, **CONFIG), tiny_neox(), examples=DATA)
    rank = int(os.environ["RANK"])
    torch.save({"weights": mmpreproj.adapter_state_dict(result.model), "loss": result.final_loss}, f"{side}/rank{rank}.pt")
