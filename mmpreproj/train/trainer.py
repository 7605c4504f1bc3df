"""`train()`: the frozen-probe loop. Load, apply the method, then AdamW over the trainable weights only.

    result = train(get_preset("pythia-160m", method="preproj_skip", out="runs/160m-skip"))

One optimizer step = `grad_accum` micro-batches of `batch_size` lines on every rank. The loss is the mean
over all label tokens of the step (all micro-batches, all ranks), so accumulation and data parallelism
give the same update as one big batch. A NaN/inf loss or gradient norm stops the run before the optimizer
step (`NonFiniteLossError`), leaving the last good checkpoint as it was: a checkpoint is written only for
finite weights whose own loss was finite (the next step's loss; after the last step, a loss measured on the
next step's batches without gradients). Nothing on disk changes before the run is set up (model, data,
method, checkpoint all loaded); an overwritten run is cleared only then, and one process at a time trains
into a run folder (`runlock`). Resuming restores weights, optimizer,
scheduler, RNG states and the data position, so the resumed run ends bit-identical to an uninterrupted one
(on CPU; same world size). The RNG streams are the run's own: the process-wide generators, seeded with
`cfg.seed` on entry and put back as the caller left them on exit (`rng.seeded_rng`). With
`parallel="fsdp"` the model is sharded with FSDP2 (`distributed.wrap_fsdp`); the adapter, and a checkpoint's
trainable weights and optimizer state, are gathered from every rank and written by rank 0, and a resume puts
them back into the shards.
"""

from __future__ import annotations

import contextlib
import logging
import math
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from ..version import __version__
from .adapters import ADAPTER_DIR, gather_run_adapter, save_run_adapter
from .checkpoint import (
    CHECKPOINT_NAME,
    capture_rng,
    checked_trainable_state,
    load_checkpoint,
    load_trainable_state,
    restore_rng,
    save_checkpoint,
    trainable_state,
)
from .config import TrainConfig
from .data import IGNORE_INDEX, LMExamples, build_examples
from .distributed import (
    DistContext,
    all_gather_objects,
    all_reduce_sum,
    barrier,
    full_trainable_state,
    grad_sync,
    init_distributed,
    load_full_trainable_state,
    shutdown,
    wrap_ddp,
    wrap_fsdp,
)
from .errors import NonFiniteLossError
from .methods import METHOD_SPECS, apply_method, count_trainable
from .models import (
    check_device_present,
    convert_model_files,
    enable_checkpointing,
    load_model,
    load_tokenizer,
    resolve_device,
)
from .order import ShardedOrder
from .precision import autocast, cast_trainable_
from .rng import kept_rng, seeded_rng
from .runlock import RunInUseError, run_lock
from .runlog import CONFIG_NAME, LOG_NAME, METRICS_NAME, StepLog, write_json
from .schedule import make_scheduler

log = logging.getLogger("mmpreproj.train")
_RUN_FILES = (CHECKPOINT_NAME, LOG_NAME, METRICS_NAME, CONFIG_NAME, ADAPTER_DIR)
T = TypeVar("T")


@dataclass
class RunResult:
    """What `train()` did. `model` is the trained model in eval mode (unwrapped from DDP; a PeftModel for LoRA).

    Under FSDP `model` stays sharded (DTensor parameters): it needs the process group, which `train()`
    closes when it opened it; the saved adapter holds the full weights.
    """

    out: Path
    method: str
    status: str  # "completed" or "stopped" (stop_at)
    steps: int  # optimizer steps done in total (including those before a resume)
    final_loss: float
    metrics: dict[str, Any]
    model: nn.Module = field(repr=False)


def train(
    config: TrainConfig,
    model: nn.Module | None = None,
    tokenizer: Any = None,
    *,
    examples: LMExamples | None = None,
) -> RunResult:
    """Train `config.method` on a frozen base; writes the run folder `config.out` (rank 0 only).

    Args:
        config: the run.
        model: a base causal LM (not yet injected), used as given and moved to the device; loaded from
            `config.model` in `config.model_dtype` when None.
        tokenizer: tokenizes the training lines; loaded from `config.model` when None and needed.
        examples: pre-tokenized data (skips reading `config.data`), e.g. `LMExamples.random(...)` in tests.

    Under `torchrun` (WORLD_SIZE > 1) every process calls `train` with the same config.

    The run draws from the process-wide generators (torch CPU/CUDA, python `random`, numpy) seeded with
    `config.seed`, as `seed_everything(config.seed)` would, but inside `rng.seeded_rng`: when `train` returns
    or raises, the caller's generator states are exactly as they were before the call.
    """
    config = replace(config)  # its checks again: a field set after it was built is checked too
    check_device_present(config.device)
    if model is None:
        with kept_rng():  # a packaged model is converted before the seed and draws from no stream
            convert_model_files(config.model)
    with seeded_rng(config.seed, resolve_device(config.device)):  # the device's type decides which generators
        ctx = init_distributed(config.device)
        try:
            with _locked(Path(config.out), ctx):
                return _train(config, ctx, model, tokenizer, examples)
        finally:
            shutdown(ctx)


@contextlib.contextmanager
def _locked(out: Path, ctx: DistContext) -> Iterator[None]:
    """Rank 0 holds the run folder's lock; every rank fails alike when another process holds it."""
    with contextlib.ExitStack() as stack:
        lock = (lambda: stack.enter_context(run_lock(out))) if ctx.is_main else (lambda: None)
        _alike_on_every_rank(lock, ctx, (RunInUseError, NotADirectoryError))
        yield


def _alike_on_every_rank(call: Callable[[], T], ctx: DistContext, errors: tuple[type[Exception], ...]) -> T:
    """`call()` on this rank, then a collective: when it raised one of `errors` on some rank, every rank raises
    (its own exception, else the first failing rank's type and message), so no rank goes on alone into a
    collective the others never reach."""
    own, result = None, None
    try:
        result = call()
    except errors as e:
        own = e
    failed = [f for f in all_gather_objects(None if own is None else (type(own), str(own)), ctx) if f is not None]
    if own is not None:
        raise own
    if failed:
        kind, message = failed[0]
        raise kind(message)
    return result


def _prepare_out(cfg: TrainConfig, out: Path, ctx: DistContext) -> tuple[dict[str, Any] | None, bool]:
    """Check the run folder, changing nothing: (checkpoint to resume from or None, whether an old run must
    be cleared once the new one has started)."""
    ckpt = out / CHECKPOINT_NAME
    existing = [name for name in _RUN_FILES if (out / name).exists()]
    if cfg.resume and ckpt.is_file():
        state = load_checkpoint(ckpt)
        saved = TrainConfig.from_dict(state["config"])
        diff = saved.differences(cfg)
        if diff:
            shown = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in sorted(diff.items()))
            raise ValueError(f"cannot resume {ckpt}: the config changed ({shown}); use the same settings")
        if state["world_size"] != ctx.world_size:
            raise ValueError(
                f"cannot resume {ckpt}: it was written with world_size={state['world_size']}, "
                f"this run has {ctx.world_size}"
            )
        return state, False
    if cfg.resume and existing:
        raise FileExistsError(
            f"cannot resume {out}: it holds a run ({', '.join(existing)}) but no {CHECKPOINT_NAME} (trained with "
            "save_every=0, or stopped before its first checkpoint); nothing was changed. Pass overwrite=True "
            "(--overwrite) instead of resume to start it over"
        )
    if cfg.resume:
        log.info("resume: no checkpoint in %s, starting from step 0", out)
    elif existing and not cfg.overwrite:
        raise FileExistsError(
            f"{out} already holds a run; pass resume=True (--resume) to continue it, "
            "overwrite=True (--overwrite) to start over, "
            "or choose another folder"
        )
    return None, bool(existing)


def _clear_old_run(out: Path, ctx: DistContext) -> None:
    """Remove the files of the run being overwritten (rank 0), once the new one has started."""
    barrier(ctx)  # every rank has set up before rank 0 clears anything
    if ctx.is_main:
        for name in _RUN_FILES:
            p = out / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    barrier(ctx)


def _label_tokens(batch: dict[str, torch.Tensor]) -> int:
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())  # labels are shifted by one


def _loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    # logits: (B, L, V), labels: (B, L) -> summed next-token loss in fp32
    return F.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]),
        labels[:, 1:].reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


@dataclass
class _Run:
    """Everything the loop mutates: the model (and its DDP wrapper), optimizer, scheduler, counters."""

    cfg: TrainConfig
    ctx: DistContext
    model: nn.Module
    ddp: nn.Module  # what runs the forward: the DDP wrapper, else the model (one process; FSDP2 in place)
    params: list[nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    step: int = 0
    tokens: int = 0
    elapsed: float = 0.0
    checkpoint: str | None = None  # the last good checkpoint

    @property
    def out(self) -> Path:
        return Path(self.cfg.out)


def _setup(
    cfg: TrainConfig,
    ctx: DistContext,
    model: nn.Module | None,
    tokenizer: Any,
    examples: LMExamples | None,
    resume: dict[str, Any] | None,
) -> tuple[_Run, LMExamples]:
    """Check the folder, load, apply the method, build the optimizer; restore a checkpoint if resuming.

    Nothing on disk changes here: an overwritten run is cleared by the caller once this has succeeded. The
    RNG streams are the run's own, seeded with `cfg.seed` by `train` (`seeded_rng`); nothing has drawn yet.
    """
    if model is None:
        model = load_model(cfg.model, cfg.model_dtype)
    if examples is None:
        examples = build_examples(cfg, tokenizer if tokenizer is not None else load_tokenizer(cfg.model))
    spec = METHOD_SPECS[cfg.method]
    sizes = cfg.preproj_sizes(spec.preproj, spec.skip) if spec.preproj or spec.skip else None
    model = apply_method(model.to(ctx.device), cfg.method, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha, sizes=sizes)
    if cfg.paper_bf16_weights:
        cast_trainable_(model, torch.bfloat16)
    if cfg.gradient_checkpointing:
        enable_checkpointing(model, cfg.reentrant_checkpointing)
    model.train()
    if cfg.parallel == "fsdp":
        model = wrap_fsdp(model, ctx)  # in place, before the optimizer sees the (now sharded) parameters
    params = [p for p in model.parameters() if p.requires_grad]
    fused = cfg.parallel != "fsdp" and all(p.device.type in ("cpu", "cuda") for p in params)  # one kernel per step
    optimizer = torch.optim.AdamW(
        params, lr=cfg.lr, betas=cfg.adam_betas, eps=cfg.adam_eps, weight_decay=cfg.weight_decay, fused=fused or None
    )
    scheduler = make_scheduler(
        optimizer, warmup=cfg.warmup_steps, total=cfg.steps, kind=cfg.schedule, min_ratio=cfg.min_lr_ratio
    )
    run = _Run(cfg, ctx, model, model, params, optimizer, scheduler)
    if resume is not None:
        if _sharded(run):
            trainable = checked_trainable_state(model, resume["trainable"])
            load_full_trainable_state(model, optimizer, trainable, resume["optimizer"])
        else:
            load_trainable_state(model, resume["trainable"])
            optimizer.load_state_dict(resume["optimizer"])
        scheduler.load_state_dict(resume["scheduler"])
        run.step, run.tokens, run.elapsed = resume["step"], resume["tokens"], resume["elapsed_s"]
        run.checkpoint = str(run.out / CHECKPOINT_NAME)
    if cfg.parallel == "ddp":
        run.ddp = wrap_ddp(model, ctx)
    return run, examples


def _save(run: _Run, rng: list[dict[str, Any]]) -> None:
    """Write `checkpoint.pt` (rank 0) with every rank's RNG state `rng`; all ranks must call it.

    Called only for weights known good: finite, and their own loss (the next step's) was finite. Under FSDP2 the
    trainable weights and the optimizer state are gathered to rank 0 first (`full_trainable_state`).
    """
    if _sharded(run):
        trainable, optim_state = full_trainable_state(run.model, run.optimizer)  # a collective
    elif run.ctx.is_main:
        trainable, optim_state = trainable_state(run.model), run.optimizer.state_dict()
    else:
        trainable, optim_state = {}, {}
    bad = [n for n, t in trainable.items() if not bool(torch.isfinite(t).all())]  # found on rank 0, told to all
    bad = next((b for b in all_gather_objects(bad, run.ctx) if b), [])
    if bad:
        raise NonFiniteLossError(run.step, f"weight {bad[0]}", math.nan, run.checkpoint)
    if run.ctx.is_main:
        save_checkpoint(
            run.out / CHECKPOINT_NAME,
            {
                "step": run.step,
                "data_position": run.step * run.cfg.grad_accum,  # micro-batches consumed per rank
                "tokens": run.tokens,
                "elapsed_s": run.elapsed,
                "world_size": run.ctx.world_size,
                "config": run.cfg.to_dict(),
                "trainable": trainable,
                "optimizer": optim_state,
                "scheduler": run.scheduler.state_dict(),
                "rng": rng,
            },
        )
    barrier(run.ctx)
    run.checkpoint = str(run.out / CHECKPOINT_NAME)


def _sharded(run: _Run) -> bool:
    """Whether the run's weights are FSDP2 shards (several processes with parallel="fsdp")."""
    return run.cfg.parallel == "fsdp" and run.ctx.enabled


def _forward_backward(
    run: _Run, batches: list[dict[str, torch.Tensor]], *, backward: bool = True
) -> tuple[float, int]:
    """Accumulate the gradients of one optimizer step; returns (mean loss per label token, real tokens), global.

    `backward=False` only measures the loss (call it under `torch.no_grad()`).
    """
    ctx, cfg = run.ctx, run.cfg
    counts = torch.tensor(
        [sum(_label_tokens(b) for b in batches), sum(int(b["attention_mask"].sum()) for b in batches)],
        dtype=torch.float64,
        device=ctx.device,
    )
    n_labels, n_tokens = (int(c) for c in all_reduce_sum(counts, ctx).tolist())
    loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
    for i, batch in enumerate(batches):
        batch = {k: v.to(ctx.device) for k, v in batch.items()}
        last = i == len(batches) - 1
        with grad_sync(run.ddp, ctx, sync=last) if backward else contextlib.nullcontext():
            with autocast(cfg.precision, ctx.device):
                out = run.ddp(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
            s = _loss_sum(out.logits, batch["labels"])
            if backward:
                (s * ctx.world_size / max(n_labels, 1)).backward()  # DDP/FSDP average ranks: sum / all labels
        loss_sum += s.detach().double()
    return all_reduce_sum(loss_sum, ctx).item() / max(n_labels, 1), n_tokens


def _probe_loss(run: _Run, batches: list[dict[str, torch.Tensor]]) -> float:
    """The loss of the current weights on `batches`, in eval mode, without gradients or RNG draws."""
    modes = [(m, m.training) for m in run.ddp.modules()]
    devices = [run.ctx.device] if run.ctx.device.type == "cuda" else []
    try:
        run.ddp.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            return _forward_backward(run, batches, backward=False)[0]
    finally:
        for m, training in modes:
            m.training = training


def _check_finite(run: _Run, what: str, value: float) -> None:
    if not math.isfinite(value):
        if run.ctx.is_main:
            write_json(
                run.out / METRICS_NAME,
                {"method": run.cfg.method, "status": "nonfinite", "step": run.step + 1, what: value},
            )
        raise NonFiniteLossError(run.step + 1, what, value, run.checkpoint)


def _train(
    cfg: TrainConfig, ctx: DistContext, model: nn.Module | None, tokenizer: Any, examples: LMExamples | None
) -> RunResult:
    # checks only, nothing on disk changes before setup; the collective after the checks keeps a fast rank from
    # writing the new run's files before a slow one has looked at the folder (it would find a run there)
    resume, clear = _alike_on_every_rank(lambda: _prepare_out(cfg, Path(cfg.out), ctx), ctx, (ValueError, OSError))
    run, examples = _setup(cfg, ctx, model, tokenizer, examples, resume)
    if clear:
        _clear_old_run(run.out, ctx)  # overwrite: the new run has started
    steplog = StepLog(run.out / LOG_NAME, enabled=ctx.is_main)
    if resume is not None:
        restore_rng(resume["rng"][ctx.rank])  # last, after everything that draws random numbers
        steplog.truncate_after(run.step)
    if ctx.is_main:
        write_json(run.out / CONFIG_NAME, cfg.to_dict())
    start, end = run.step, cfg.stop_at or cfg.steps
    order = ShardedOrder(len(examples), cfg.seed, ctx.rank, ctx.world_size)
    bar = tqdm(total=cfg.steps, initial=start, disable=not (cfg.progress and ctx.is_main), desc=f"train {cfg.method}")
    max_norm = cfg.max_grad_norm or math.inf
    pending = None  # RNG states of a checkpoint due after the last step, written once its loss proved finite

    def step_batches() -> list[dict[str, torch.Tensor]]:
        first = run.step * cfg.grad_accum  # micro-batch position in this rank's data stream
        return [
            examples.batch(order.batch(first + i, cfg.batch_size), trim=cfg.trim_padding)
            for i in range(cfg.grad_accum)
        ]

    while run.step < end:
        t0 = time.perf_counter()
        loss, n_tokens = _forward_backward(run, step_batches())
        _check_finite(run, "loss", loss)
        grad_norm = torch.nn.utils.clip_grad_norm_(run.params, max_norm)
        if hasattr(grad_norm, "full_tensor"):  # FSDP2: a replicated DTensor
            grad_norm = grad_norm.full_tensor()
        grad_norm = float(grad_norm)
        _check_finite(run, "gradient norm", grad_norm)
        if pending is not None:  # weights, optimizer and counters are still those of the last step
            _save(run, pending)
            pending = None
        lr = run.optimizer.param_groups[0]["lr"]
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        run.step, run.tokens, run.elapsed = run.step + 1, run.tokens + n_tokens, run.elapsed + dt
        steplog.write(
            {
                "step": run.step,
                "loss": loss,
                "lr": lr,
                "grad_norm": grad_norm,
                "tokens": run.tokens,
                "tokens_per_s": n_tokens / dt,
                "elapsed_s": run.elapsed,
            }
        )
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}")
        if cfg.save_every and (run.step % cfg.save_every == 0 or run.step == end):
            pending = all_gather_objects(capture_rng(), ctx)
    if pending is not None:  # the last weights have no next step: measure their loss on its batches
        _check_finite(run, "loss", _probe_loss(run, step_batches()))
        _save(run, pending)
    bar.close()
    status = "completed" if run.step >= cfg.steps else "stopped"
    metrics = _metrics(cfg, ctx, run.model, steplog.records, status, run.step, start, run.tokens, run.elapsed)
    state = gather_run_adapter(run.model, cfg.method) if _sharded(run) else None  # a collective: every rank gathers
    if ctx.is_main:
        save_run_adapter(run.model, cfg.method, run.out / ADAPTER_DIR, state=state)
        write_json(run.out / METRICS_NAME, metrics)
    barrier(ctx)
    final = metrics["final_loss"] if metrics["final_loss"] is not None else math.nan
    return RunResult(run.out, cfg.method, status, run.step, final, metrics, run.model.eval())


def _metrics(
    cfg: TrainConfig,
    ctx: DistContext,
    model: nn.Module,
    records: list[dict[str, Any]],
    status: str,
    steps: int,
    start: int,
    tokens: int,
    elapsed: float,
) -> dict[str, Any]:
    losses = [r["loss"] for r in records]
    return {
        "method": cfg.method,
        "status": status,
        "steps": steps,
        "resumed_from": start or None,
        "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None,
        "final_loss_mean10": sum(losses[-10:]) / len(losses[-10:]) if losses else None,
        "tokens": tokens,
        "train_seconds": elapsed,
        "tokens_per_s": tokens / elapsed if elapsed > 0 else None,
        "trainable_params": count_trainable(model),
        "total_params": sum(p.numel() for p in model.parameters()),
        "trainable_dtypes": sorted({str(p.dtype) for p in model.parameters() if p.requires_grad}),
        "world_size": ctx.world_size,
        "examples_per_step": cfg.effective_batch * ctx.world_size,
        "library_version": __version__,
    }
