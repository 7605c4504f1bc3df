"""Frozen-probe training: the paper's protocol (arXiv 2604.10791, Sec. 3) for every method, on CPU or GPUs.

    from mmpreproj.train import get_preset, train
    result = train(get_preset("pythia-160m", method="preproj_skip", out="runs/160m-preproj-skip"))
    print(result.metrics["final_loss"], result.out / "adapter")

Files: config (TrainConfig), presets, sources (local file / hub lines), data (lines -> padded/packed examples),
order (sharded shuffled order),
methods (apply_method, parameter counts), precision (autocast, bf16 weights), models (loading, checkpointing),
schedule, checkpoint (resumable state), rng (the run's own seeded RNG stream), distributed (torchrun: DDP or
FSDP2), runlog (run folder), adapters (save/load trained weights), trainer (train).
"""

from ..data.hub import DataUnavailableError  # one class for "data cannot be reached", shared with eval
from .adapters import run_adapter_dir, save_run_adapter
from .checkpoint import CHECKPOINT_NAME, load_checkpoint
from .config import METHODS, TrainConfig
from .data import LMExamples, build_examples, pack_lines, pad_lines, select_lines
from .errors import ModelUnavailableError, NonFiniteLossError
from .methods import (
    apply_method,
    count_trainable,
    expected_trainable,
    method_param_table,
    paper_lora_rank,
    preproj_params,
)
from .models import enable_checkpointing, load_model, load_model_and_tokenizer, load_tokenizer
from .presets import PRESETS, get_preset
from .sources import read_lines
from .trainer import RunResult, train

__all__ = [
    "CHECKPOINT_NAME",
    "DataUnavailableError",
    "LMExamples",
    "METHODS",
    "ModelUnavailableError",
    "NonFiniteLossError",
    "PRESETS",
    "RunResult",
    "TrainConfig",
    "apply_method",
    "build_examples",
    "count_trainable",
    "enable_checkpointing",
    "expected_trainable",
    "get_preset",
    "load_checkpoint",
    "load_model",
    "load_tokenizer",
    "load_model_and_tokenizer",
    "method_param_table",
    "pack_lines",
    "pad_lines",
    "paper_lora_rank",
    "preproj_params",
    "read_lines",
    "run_adapter_dir",
    "save_run_adapter",
    "select_lines",
    "train",
]
