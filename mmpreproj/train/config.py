"""`TrainConfig`: every knob of a frozen-probe run, validated up front and saved as JSON in the run folder."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from mmpreproj_tables.tables import (
    METHODS,
    MODEL_DTYPES,
    PARALLEL,
    PRECISIONS,
    SCHEDULES,
    SIZE_DEFAULTS,
    SIZED_MODULES,
    unsized_module,
)
from mmpreproj_tables.values import TRAIN_BOUNDS, warmup_bound

from ..method.config import PreProjConfig
from ..util.jsonconfig import JsonConfig
from ..util.validate import check_choice, check_field_types, check_rule
from .methods import METHOD_SPECS

# The choices (PRECISIONS, ...), the size defaults (`mmpreproj_tables/tables.py`) and the numeric ranges
# (`mmpreproj_tables/values.py`) are plain data the command shows and checks without loading torch.
# Fields that may differ between a checkpoint and the run resuming it (they do not change the numbers).
RESUME_FREE_FIELDS = frozenset({"resume", "overwrite", "progress", "stop_at", "save_every", "out", "device", "preset"})


def _choice(name: str, value: Any, allowed: tuple) -> None:
    check_choice("TrainConfig", name, value, allowed)


def _check(ok: bool, name: str, value: Any, rule: str) -> None:
    check_rule(ok, "TrainConfig", name, value, rule)


@dataclass
class TrainConfig(JsonConfig):
    """A frozen-probe training run (defaults = the paper's Pythia-160M protocol, but for `model_dtype`: float32
    here, bfloat16 in the `pythia-160m` preset as the paper loaded the base; see `presets.py`).

    Args:
        method: what trains, one of `METHODS` (train/methods.py: "preproj", "skip", "preproj_skip", "lora",
            "preproj_lora", "lora_matched").
        model: hub id or local folder for `AutoModelForCausalLM` / `AutoTokenizer`.
        data: hub dataset id (read with `datasets`) or a local text file (one example per line).
        data_config, data_split, text_field: hub dataset config, split and text column.
        num_lines, min_chars: keep the first `num_lines` lines whose stripped text is longer than `min_chars`.
        max_len: tokens per example (truncate, right-pad with eos); block length when `packing`.
        packing: join the kept lines with eos into full `max_len` blocks instead of one padded line each.
        trim_padding: cut each batch to its longest line (same loss as full padding, less compute).
        steps, warmup_steps, lr, min_lr_ratio, schedule: optimizer steps and the LR schedule
            (linear warmup from `lr / (warmup_steps + 1)`, then cosine to `lr * min_lr_ratio`, or constant).
        batch_size, grad_accum: micro-batch per process and micro-batches per optimizer step.
        weight_decay, adam_betas, adam_eps, max_grad_norm: AdamW and clipping (None/0 = no clipping).
        precision: "bf16" (autocast) or "fp32".
        model_dtype: dtype the frozen base is loaded in ("float32" or "bfloat16").
        paper_bf16_weights: cast the trainable weights to bf16 (the paper's setting; updates round away).
        gradient_checkpointing, reentrant_checkpointing: activation checkpointing and its variant.
        lora_r, lora_alpha: override the LoRA rank/alpha (None = the paper's rule for the method).
        expansion, skip_rank, layers, parts: the injected modules' sizes, as `PreProjConfig`'s fields of the
            same names (pre-projection inner width expansion * d, below 1 a bottleneck; None or a rank r
            for `W_skip = B A`; the block indices and host parts injected into, None = all). Each applies
            only to a method that injects what it sizes (`skip_rank`: one with a skip; `expansion`: one
            with a pre-projection).
        seed: seeds the run's torch, python `random` and numpy streams (the caller's are restored after it:
            `rng.seeded_rng`), the injected-weight init and the data order.
        device: "auto" (cuda:LOCAL_RANK if available, else cpu), "cpu", "cuda", "cuda:1", ...
        parallel: with several processes, "ddp" (every rank holds the whole model) or "fsdp" (FSDP2
            `fully_shard` per block, then the root: base and trainable weights sharded over the ranks; a
            checkpoint gathers the trainable weights and optimizer state to rank 0, a resume puts them back
            into the shards). Ignored in a single process.
        out: run folder (adapter/, train_config.json, metrics.json, log.jsonl, checkpoint.pt).
        save_every: write `checkpoint.pt` every N optimizer steps and at the end (0 = never).
        resume: continue from `out/checkpoint.pt` (starts from step 0 when there is none).
        overwrite: allow starting a fresh run in a folder that already holds one.
        stop_at: stop after this optimizer step, as a preempted job would (its checkpoint written there unless
            `save_every=0`, which writes none: such a run cannot be resumed).
        progress: show a tqdm bar (rank 0 only).
        preset: name of the preset this config came from (informational).
    """

    method: str = "preproj_skip"
    model: str = "EleutherAI/pythia-160m"
    data: str = "wikitext"
    data_config: str | None = "wikitext-103-raw-v1"
    data_split: str = "train"
    text_field: str = "text"
    num_lines: int = 2000
    min_chars: int = 50
    max_len: int = 512
    packing: bool = False
    trim_padding: bool = True
    steps: int = 500
    warmup_steps: int = 50
    lr: float = 1e-5
    min_lr_ratio: float = 0.0
    schedule: str = "cosine"
    batch_size: int = 4
    grad_accum: int = 4
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    max_grad_norm: float | None = 1.0
    precision: str = "bf16"
    model_dtype: str = "float32"
    paper_bf16_weights: bool = False
    gradient_checkpointing: bool = True
    reentrant_checkpointing: bool = False
    lora_r: int | None = None
    lora_alpha: int | None = None
    expansion: float = SIZE_DEFAULTS["expansion"]
    skip_rank: int | None = None
    layers: list[int] | None = None
    parts: list[str] | None = None
    seed: int = 42
    device: str = "auto"
    parallel: str = "ddp"
    out: str = "runs/train"
    save_every: int = 100
    resume: bool = False
    overwrite: bool = False
    stop_at: int | None = None
    progress: bool = True
    preset: str | None = None

    def __post_init__(self) -> None:
        check_field_types(self)
        _choice("method", self.method, METHODS)
        _choice("precision", self.precision, PRECISIONS)
        _choice("model_dtype", self.model_dtype, MODEL_DTYPES)
        _choice("schedule", self.schedule, SCHEDULES)
        _choice("parallel", self.parallel, PARALLEL)
        for name in ("model", "data", "data_split", "text_field", "out", "device"):
            value = getattr(self, name)
            _check(bool(value.strip()), name, value, "a non-empty string")
        for name, bound in TRAIN_BOUNDS.items():  # the ranges the command checks its flags against too
            value = getattr(self, name)
            optional = self.__dataclass_fields__[name].default is None
            _check(value is None or bound.holds(value), name, value, ("None or " if optional else "") + bound.says)
        if self.resume and self.overwrite:
            raise ValueError(
                "TrainConfig: resume=True and overwrite=True ask for opposite things (go on with the run in `out`, "
                "or start over there); pass one"
            )
        warmup = warmup_bound(self.steps)
        _check(warmup.holds(self.warmup_steps), "warmup_steps", self.warmup_steps, warmup.says)
        _check(all(0.0 <= b < 1.0 for b in self.adam_betas), "adam_betas", self.adam_betas, "two floats in [0, 1)")
        _check(
            self.max_grad_norm is None or self.max_grad_norm >= 0, "max_grad_norm", self.max_grad_norm, "None or >= 0"
        )
        _check(
            self.stop_at is None or 1 <= self.stop_at <= self.steps,
            "stop_at",
            self.stop_at,
            f"None or in [1, {self.steps}]",
        )
        for name in ("lora_r", "lora_alpha"):
            value = getattr(self, name)
            if value is not None and "lora" not in self.method:
                raise ValueError(
                    f"TrainConfig.{name}={value!r} only applies to methods 'lora' and 'preproj_lora', "
                    f"not method={self.method!r}"
                )
        self._check_sizes()
        if self.device != "auto":
            try:
                torch.device(self.device)
            except (RuntimeError, ValueError):
                raise ValueError(
                    f"TrainConfig.device={self.device!r}; allowed values: 'auto', 'cpu', 'cuda', 'cuda:N', 'mps'"
                ) from None

    def _check_sizes(self) -> None:
        """The size fields: valid as `PreProjConfig` takes them, and only where the method injects their module."""
        spec = METHOD_SPECS[self.method]
        for name in SIZED_MODULES:
            what = unsized_module(self.method, name, getattr(self, name))
            if what is not None:
                raise ValueError(
                    f"TrainConfig.{name}={getattr(self, name)!r} sizes {what}, which method="
                    f"{self.method!r} does not have; leave it at its default"
                )
        if self.layers is not None or self.parts is not None:
            self.preproj_sizes(spec.preproj, spec.skip)  # PreProjConfig's own checks (empty, duplicates)

    def preproj_sizes(self, preproj: bool = True, skip: bool = True) -> dict[str, Any]:
        """The size fields as `PreProjConfig` keyword arguments (checked by building one)."""
        sizes = {
            "expansion": self.expansion,
            "skip_rank": self.skip_rank if skip else None,
            "layers": self.layers,
            "parts": self.parts,
        }
        try:
            PreProjConfig(preproj=preproj, skip=skip, **sizes)
        except ValueError as e:
            raise ValueError(str(e).replace("PreProjConfig.", "TrainConfig.", 1)) from None
        return sizes

    @property
    def effective_batch(self) -> int:
        """Examples per optimizer step on one process (multiply by the world size for data parallel)."""
        return self.batch_size * self.grad_accum

    def replace(self, **changes: Any) -> TrainConfig:
        """A validated copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def differences(self, other: TrainConfig, *, ignore: frozenset[str] = RESUME_FREE_FIELDS) -> dict[str, tuple]:
        """Fields (other than `ignore`) whose values differ: {name: (self value, other value)}."""
        a, b = self.to_dict(), other.to_dict()
        return {k: (a[k], b[k]) for k in a if k not in ignore | {"library_version"} and a[k] != b[k]}
