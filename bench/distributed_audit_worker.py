"""Worker of `bench/distributed_audit.py`: run by `torchrun` / `accelerate launch` (2 gloo ranks) or by plain python
(one process, the reference); the harness also imports its builders and data. Not a test, never run alone.

argv: MODE SIDE. MODE "core": DDP and FSDP2 (`fully_shard`) of an `inject()`ed model, of `peft.get_peft_model`
with `PreProjConfig`, and of peft LoRA (the reference method under the same launcher); "trainer": a plain
`transformers.Trainer` on the peft route and on LoRA; "ourtrain": `mmpreproj.train.train` with parallel "ddp"
then "fsdp"; "zero3": DeepSpeed ZeRO-3 on the peft route. Each rank writes
what it saw to SIDE/<mode><rank>.pt; the harness judges.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":
    sys.path[0] = ROOT  # the repository root in place of bench/ (whose module names could shadow)
elif ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import mmpreproj  # noqa: E402
from mmpreproj import PreProjConfig  # noqa: E402
from tests.helpers.zoo import tiny_neox  # noqa: E402

STEPS = 3
LR = 1e-3
ROWS = 4  # the global batch: one process takes all rows, rank r of 2 takes rows [2r, 2r + 2)
LEN = 12
VOCAB = 128


def global_batch(i: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (ROWS, LEN), generator=torch.Generator().manual_seed(1000 + i))


def rows(i: int, rank: int, world: int) -> torch.Tensor:
    n = ROWS // world
    return global_batch(i)[rank * n : (rank + 1) * n]


def build(kind: str) -> torch.nn.Module:
    """The same model in every process: tiny GPT-NeoX (seed 0), then the method drawn from seed 1."""
    base = tiny_neox()
    torch.manual_seed(1)
    if kind == "inject":
        model = mmpreproj.inject(base, PreProjConfig(skip_init_std=0.02))
    elif kind == "peft":
        from peft import get_peft_model

        model = get_peft_model(base, PreProjConfig(skip_init_std=0.02))
    elif kind == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(base, LoraConfig(r=4, target_modules=["query_key_value"], init_lora_weights=False))
    elif kind == "preproj_lora":
        from mmpreproj.train import apply_method

        model = apply_method(base, "preproj_lora", lora_r=4)
    elif kind == "base":
        model = base
    else:
        raise ValueError(kind)
    return model.train()


def adapter(model: torch.nn.Module, kind: str) -> dict[str, torch.Tensor]:
    """The trained weights as full tensors: ours through the public `adapter_state_dict`, LoRA through peft."""
    if kind == "preproj_lora":  # both parts: every trainable weight by parameter name
        return {n: full_of(p).detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    if kind == "lora":
        from peft import get_peft_model_state_dict

        sd = get_peft_model_state_dict(model)
        return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in sd.items()}
    return {k: v.detach().clone() for k, v in mmpreproj.adapter_state_dict(model).items()}


def full_of(p):  # a full tensor of a parameter, sharded (DTensor) or not
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def frozen(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for n, p in model.named_parameters():
        if not p.requires_grad:
            out[n] = (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
    return out


def train(model, params, rank, world, clip=None, call=None):
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
    call = call or model
    losses = []
    for i in range(STEPS):
        x = rows(i, rank, world)
        loss = call(input_ids=x, labels=x).loss
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def reference(kind: str, clip=None) -> dict:
    """One process, the full batch: the run every distributed one must equal."""
    m = build(kind)
    init = adapter(m, kind)
    losses = train(m, [p for p in m.parameters() if p.requires_grad], 0, 1, clip=clip)
    return {"init": init, "final": adapter(m, kind), "losses": losses, "frozen": frozen(m)}


def attempt(fn, *args):
    try:
        return {"ok": True, "value": fn(*args)}
    except Exception as err:  # noqa: BLE001
        return {"ok": False, "error": f"{type(err).__name__}: {err}"[:600], "tb": traceback.format_exc()[-1500:]}


# ---------------------------------------------------------------- core: DDP + FSDP2


def ddp_case(kind, rank, world):
    m = build(kind)
    ddp = torch.nn.parallel.DistributedDataParallel(m)
    losses = train(m, [p for p in m.parameters() if p.requires_grad], rank, world, call=ddp)
    out = {"final": adapter(m, kind), "frozen": frozen(m), "losses": losses}
    if kind == "inject":
        x = rows(0, rank, world)

        def unload():
            flags_before = sum(not p.requires_grad for p in m.parameters())
            mmpreproj.unload(ddp)
            with torch.no_grad():
                logits = m.eval()(input_ids=x).logits
            return {
                "injected_after": mmpreproj.is_injected(m),
                "frozen_before": flags_before,
                "frozen_after": sum(not p.requires_grad for p in m.parameters()),
                "logits": logits,
            }

        out["unload"] = attempt(unload)
    return out


def shard(model, kind):
    from torch.distributed.fsdp import fully_shard

    inner = model.base_model.model if kind in ("peft", "lora", "preproj_lora") else model
    for layer in inner.gpt_neox.layers:
        fully_shard(layer)
    fully_shard(model)


def full_state(model):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def fsdp_case(kind, rank, world, side):
    m = build(kind)
    frozen_names = [n for n, p in m.named_parameters() if not p.requires_grad]
    shard(m, kind)
    x = rows(0, rank, world)
    out = {}
    with torch.no_grad():
        m.eval()
        out["fwd"] = m(input_ids=x).logits.detach().clone()
        m.train()
    out["init_gathered"] = attempt(lambda: adapter(m, kind))
    out["losses"] = train(m, [p for p in m.parameters() if p.requires_grad], rank, world)
    out["final"] = attempt(lambda: adapter(m, kind))
    full = full_state(m)  # every rank; only rank 0 receives it (cpu_offload)
    out["full_keys"] = len(full)
    saved = os.path.join(side, f"fsdp_{kind}_rank0save")
    if rank == 0:
        out["frozen_full"] = {n: full[n].clone() for n in frozen_names if n in full}
        out["frozen_missing"] = [n for n in frozen_names if n not in full]
        if kind == "inject":
            from mmpreproj.method.state_dict import adapter_tensors_from_state_dict

            def save():
                tensors = adapter_tensors_from_state_dict(m, "default", full)
                mmpreproj.save_adapter(m, saved, state_dict=tensors)
                return {k: v.clone() for k, v in tensors.items()}

            out["rank0_save"] = attempt(save)
        else:
            out["rank0_save"] = attempt(lambda: m.save_pretrained(saved, state_dict=full) or True)
    dist.barrier()
    every = os.path.join(side, f"fsdp_{kind}_every")
    if kind == "inject":  # docs: save_adapter without state_dict gathers, every rank calls it
        out["every_save"] = attempt(lambda: str(mmpreproj.save_adapter(m, os.path.join(every, f"rank{rank}"))))
    else:  # docs: save_pretrained without state_dict gathers FSDP2 shards itself: every rank, is_main_process
        out["every_save"] = attempt(lambda: m.save_pretrained(every, is_main_process=rank == 0) or True)
    dist.barrier()
    if kind == "inject":
        with torch.no_grad():
            m.eval()
            before = m(input_ids=x).logits.detach().clone()
            flags = [p.requires_grad for p in m.parameters()]
            out["unload_after"] = attempt(lambda: mmpreproj.unload(m) and None)
            out["unload_after_injected"] = mmpreproj.is_injected(m)
            out["unload_after_flags_same"] = flags == [p.requires_grad for p in m.parameters()]
            out["unload_after_fwd_diff"] = float((m(input_ids=x).logits - before).abs().max())
    return out


def fsdp_unload_before(rank, world):
    m = build("inject")
    mmpreproj.unload(m)
    all_trainable = all(p.requires_grad for p in m.parameters())
    shard(m, "inject")
    with torch.no_grad():
        logits = m.eval()(input_ids=rows(0, rank, world)).logits.detach().clone()
    return {"logits": logits, "all_trainable": all_trainable, "injected": mmpreproj.is_injected(m)}


def fsdp_resume(rank, world, side):
    """The peft guide's FSDP2 resume: 2 steps, save the adapter on rank 0 (gathered `state_dict=`) and gather the
    optimizer state; step 3 goes on; a fresh sharded model takes the file (`set_model_state_dict`) and the
    optimizer state (`set_optimizer_state_dict`) and takes step 3 too."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    full_opts = StateDictOptions(full_state_dict=True)

    def fresh():
        m = build("peft")
        shard(m, "peft")
        return m, torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=LR, weight_decay=0.0)

    def step(m, opt, i):
        x = rows(i, rank, world)
        m(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()

    m, opt = fresh()
    step(m, opt, 0)
    step(m, opt, 1)
    full = full_state(m)
    ckpt = os.path.join(side, "fsdp_resume_step2")
    # through a file, as a checkpoint: the gathered dict aliases the live `step` tensors (plain tensors, not DTensors),
    # so held in memory it would see the next step's increment
    opt_file = os.path.join(side, f"fsdp_resume_optim{rank}.pt")
    torch.save(get_optimizer_state_dict(m, opt, options=full_opts), opt_file)
    if rank == 0:
        m.save_pretrained(ckpt, state_dict=full)
    dist.barrier()
    at_save = adapter(m, "peft")
    step(m, opt, 2)
    straight = adapter(m, "peft")
    m2, opt2 = fresh()
    saved = load_file(os.path.join(ckpt, "adapter_model.safetensors"))
    names = [n for n, p in m2.named_parameters() if p.requires_grad]
    sd = {n: saved[n.replace(".default.", ".")] for n in names}  # the file's keys: peft's, no adapter name
    set_model_state_dict(m2, sd, options=StateDictOptions(full_state_dict=True, strict=False))
    set_optimizer_state_dict(m2, opt2, torch.load(opt_file, weights_only=False), options=full_opts)
    step(m2, opt2, 2)
    return {"at_save": at_save, "straight": straight, "resumed": adapter(m2, "peft")}


def core(rank, world, side):
    res = {}
    for kind in ("inject", "peft", "lora"):
        res[f"ddp_{kind}"] = attempt(ddp_case, kind, rank, world)
        dist.barrier()
    for kind in ("inject", "peft", "lora", "preproj_lora"):
        res[f"fsdp_{kind}"] = attempt(fsdp_case, kind, rank, world, side)
        dist.barrier()
    res["fsdp_unload_before"] = attempt(fsdp_unload_before, rank, world)
    dist.barrier()
    res["fsdp_resume"] = attempt(fsdp_resume, rank, world, side)
    return res


# ---------------------------------------------------------------- Trainer


def trainer_run(kind, rank, world, side):
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    m = build(kind)
    data = global_batch(0).tolist()  # ROWS rows: one global batch per epoch, so every step sees all of them
    ds = Dataset.from_dict({"input_ids": data, "labels": data})
    args = TrainingArguments(
        output_dir=os.path.join(side, f"trainer_{kind}"),
        max_steps=STEPS,
        per_device_train_batch_size=ROWS // world,
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        save_steps=STEPS,
        logging_steps=1,
        seed=0,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    tr = Trainer(model=m, args=args, train_dataset=ds)
    tr.train()
    return {
        "final": adapter(m, kind),
        "world": int(os.environ.get("WORLD_SIZE", "1")),
        "dist": dist.is_initialized() and dist.get_world_size(),
        "process_index": tr.args.process_index,
        "losses": [h["loss"] for h in tr.state.log_history if "loss" in h],
    }


# ---------------------------------------------------------------- DeepSpeed ZeRO-3

DS_CONFIG = {
    "train_micro_batch_size_per_gpu": ROWS // 2,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {
        "stage": 3,
        "stage3_gather_16bit_weights_on_model_save": True,
        "stage3_param_persistence_threshold": 0,
    },
    "zero_allow_untested_optimizer": True,
    "gradient_clipping": 1.0,
    "steps_per_print": 1_000_000,
}


def zero3(kind, rank, world, side):
    import deepspeed
    from safetensors.torch import load_file

    m = build(kind)
    params = [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
    engine, *_ = deepspeed.initialize(model=m, optimizer=opt, config=DS_CONFIG)
    losses = []
    for i in range(STEPS):
        x = rows(i, rank, world)
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    res = {"losses": losses, "partitioned": all(p.numel() == 0 for p in params)}
    unsaved = os.path.join(side, f"zero3_{kind}_unsaved{rank}")
    saved = os.path.join(side, f"zero3_{kind}_saved")
    if kind != "inject":
        res["plain_save"] = attempt(lambda: m.save_pretrained(unsaved) or True)
    else:
        from mmpreproj.method.state_dict import adapter_tensors_from_state_dict

        res["plain_save"] = attempt(lambda: str(mmpreproj.save_adapter(m, unsaved)))
        res["from_partitions"] = attempt(lambda: len(adapter_tensors_from_state_dict(m, "default", m.state_dict())))
        res["live_adapter_state_dict"] = attempt(
            lambda: {k: tuple(v.shape) for k, v in mmpreproj.adapter_state_dict(m).items()}
        )
    res["plain_save_files"] = sorted(str(f.relative_to(unsaved)) for f in Path(unsaved).rglob("*") if f.is_file())
    res["plain_save_shapes"] = {  # what a refused save left on disk, if anything: its tensors' shapes
        str(f.relative_to(unsaved)): sorted({tuple(v.shape) for v in load_file(f).values()})
        for f in Path(unsaved).rglob("*.safetensors")
    }
    full = engine._zero3_consolidated_16bit_state_dict()
    if rank == 0:
        res["full"] = {k: v.clone() for k, v in full.items()}
        if kind != "inject":
            res["rank0_save"] = attempt(lambda: m.save_pretrained(saved, state_dict=full) or 1)
        else:

            def save():
                tensors = adapter_tensors_from_state_dict(m, "default", full)
                mmpreproj.save_adapter(m, saved, state_dict=tensors)
                return len(tensors)

            res["rank0_save"] = attempt(save)
    dist.barrier()
    return res


# ---------------------------------------------------------------- the library's own trainer (mmpreproj.train)

OUR_CONFIG = dict(
    method="preproj_skip",
    model="tiny",
    steps=STEPS,
    warmup_steps=0,
    lr=LR,
    batch_size=2,
    grad_accum=1,
    precision="fp32",
    gradient_checkpointing=False,
    save_every=0,
    progress=False,
    device="cpu",
)


def our_train(parallel, rank, side):
    from mmpreproj.train import LMExamples, TrainConfig, train

    out = os.path.join(side, f"run_{parallel}")
    config = TrainConfig(out=out, parallel=parallel, **OUR_CONFIG)
    result = train(config, tiny_neox(), examples=LMExamples.random(40, 12, VOCAB, seed=0))
    weights = {k: v.detach().clone() for k, v in mmpreproj.adapter_state_dict(result.model).items()}  # gathers
    return {"weights": weights, "loss": result.final_loss, "out": out}


def main() -> None:
    mode, side = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if mode == "core":
        dist.init_process_group("gloo")
        res = core(rank, world, side)
    elif mode == "trainer":
        res = {kind: attempt(trainer_run, kind, rank, world, side) for kind in ("peft", "lora")}
    elif mode == "ourtrain":
        dist.init_process_group("gloo")  # ours, as accelerate's would be: the sharded weights gather after train()
        res = {parallel: attempt(our_train, parallel, rank, side) for parallel in ("ddp", "fsdp")}
    elif mode == "zero3":
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
        res = {kind: attempt(zero3, kind, rank, world, side) for kind in ("peft", "inject", "preproj_lora", "lora")}
    else:
        raise SystemExit(f"unknown mode {mode}")
    torch.save(res, os.path.join(side, f"{mode}{rank}.pt"))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # DeepSpeed / gloo threads have aborted interpreter teardown; everything is in SIDE already
