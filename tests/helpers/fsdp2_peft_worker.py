"""Run by tests/test_sharded_fsdp2_peft.py under `torch.distributed.run --nproc_per_node 2` (gloo, CPU); not a test
itself, never imported.

argv: SIDE MODE. MODE "peft": `get_peft_model(tiny_neox(), PreProjConfig())`; MODE "inject": `mmpreproj.inject`.
Each rank shards the model with FSDP2 (`fully_shard` per layer, then the whole model), as accelerate does, and
trains 2 AdamW steps on its own batch. Then the save a Trainer makes under FSDP2: every rank gathers the full
model and optimizer state dicts (rank 0 gets them: `cpu_offload=True`), and rank 0 alone calls
`save_pretrained(SIDE/saved, state_dict=full)` (MODE "inject": `mmpreproj.save_pretrained(model, ...)`) while
rank 1 waits at a barrier (a collective inside the save would never return), and the gathered optimizer state
beside it (SIDE/optimizer.pt, as the Trainer's checkpoint).
Both ranks then train a third step (`continued`), and a fresh sharded model resumes from the two files and trains
the same third step (`resumed`); MODE "peft" also loads the saved file with peft's `set_peft_model_state_dict` on
every rank into a fresh sharded model (`loaded`). MODE "peft" also saves without `state_dict=` on every rank
(`is_main_process=rank == 0`) to SIDE/every_rank: that save gathers, every rank taking part.

Rank 0 writes SIDE/result.pt: the adapter's entries of the gathered full state dict after step 2, and the
gathered adapter weights after step 3 of both runs; the test compares them with each other and with the files.
"""

import os
import sys

# the repository root in place of this script's folder (whose module names would shadow)
sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from torch.distributed.checkpoint.state_dict import (  # noqa: E402
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard  # noqa: E402

import mmpreproj  # noqa: E402
from tests.helpers.zoo import tiny_neox  # noqa: E402

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)  # what accelerate gathers for a save
BROADCAST = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
ADAPTER_SLOTS = (".preproj.", ".preproj_skip.")  # the wrapper's slots (adapter_layer_names)


def build(mode: str) -> torch.nn.Module:
    """The injected tiny GPT-NeoX, sharded like accelerate's FSDP2 plugin does (each layer, then the root)."""
    config = mmpreproj.PreProjConfig(skip_init_std=0.02)
    if mode == "peft":
        from peft import get_peft_model

        model = get_peft_model(tiny_neox(), config)
        layers = model.base_model.model.gpt_neox.layers
    else:
        model = mmpreproj.inject(tiny_neox(), config)
        layers = model.gpt_neox.layers
    model.train()
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, i: int, rank: int) -> None:
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(100 * i + rank))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()


def adapter_part(full: dict) -> dict:
    """The adapter's weights of a full state dict, keyed as the file keys them (the adapter name removed)."""
    return {k.replace(".default.", "."): v.clone() for k, v in full.items() if any(s in k for s in ADAPTER_SLOTS)}


def model_key(key: str) -> str:
    """A file key's model key: the adapter name after the slot (peft's `_remove_adapter_name_from_key` inverse)."""
    for slot in ADAPTER_SLOTS:
        if slot in key:
            return key.replace(slot, f"{slot}default.", 1)
    return key


def saved_file(side: str, mode: str) -> str:
    folder = os.path.join(side, "saved") if mode == "peft" else os.path.join(side, "saved", "adapter")
    return os.path.join(folder, "adapter_model.safetensors")


def main() -> None:
    side, mode = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = build(mode)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for i in range(2):
        step(model, opt, i, rank)
    full = get_model_state_dict(model, options=FULL)  # every rank takes part; rank 0 gets it all
    optim = get_optimizer_state_dict(model, opt, options=FULL)
    if rank == 0:  # the main process alone, as Trainer._save (and its optimizer.pt: the state as it is now)
        if mode == "peft":
            model.save_pretrained(os.path.join(side, "saved"), state_dict=full)
        else:  # inject puts no save_pretrained on the instance (issue 45): the function saves base + adapter
            mmpreproj.save_pretrained(model, os.path.join(side, "saved"), state_dict=full)
        torch.save(optim, os.path.join(side, "optimizer.pt"))
    dist.barrier()
    gathered = adapter_part(full)
    if mode == "peft":  # without state_dict=: peft's model.state_dict() holds shards, gathered by every rank
        model.save_pretrained(os.path.join(side, "every_rank"), is_main_process=rank == 0)

    step(model, opt, 2, rank)
    continued = adapter_part(get_model_state_dict(model, options=FULL))

    fresh = build(mode)
    from_file, optim = {}, {}
    if rank == 0:  # the saved file's keys are the model's keys behind peft's prefix (or the wrappers' paths)
        prefix = "" if mode == "peft" else "base_model.model."
        from_file = {model_key(k.removeprefix(prefix)): v for k, v in load_file(saved_file(side, mode)).items()}
        optim = torch.load(os.path.join(side, "optimizer.pt"))
    set_model_state_dict(fresh, from_file, options=BROADCAST)
    opt2 = torch.optim.AdamW([p for p in fresh.parameters() if p.requires_grad], lr=1e-2)
    set_optimizer_state_dict(fresh, opt2, optim, options=BROADCAST)
    step(fresh, opt2, 2, rank)
    resumed = adapter_part(get_model_state_dict(fresh, options=FULL))
    loaded = {}
    if mode == "peft":  # peft's own loader on every rank, into a sharded model (what PeftModel.load_adapter does)
        from peft import set_peft_model_state_dict

        into = build(mode)
        set_peft_model_state_dict(into, load_file(saved_file(side, mode)))
        loaded = adapter_part(get_model_state_dict(into, options=FULL))
    if rank == 0:
        result = {"gathered": gathered, "continued": continued, "resumed": resumed, "loaded": loaded}
        torch.save(result, f"{side}/result.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
