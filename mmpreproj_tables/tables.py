"""The library's plain tables: method, preset and option names the command shows, in one place.

Plain data, no torch, no peft, no transformers: the command's parser reads them for `--help` and its
choices without loading the library, and the library reads them from here (`train.methods`, `train.presets`,
`train.config`, `train.sizes`, `eval.evaluate`, `experiments.sweep`, `experiments.budget`), so each name is
written once.

The presets: the paper's two frozen-probe runs, the same protocol on SmolLM2-135M (GPU) and a CPU-sized run
of it, and a CPU-sized `mini` run for the offline demo (`train.presets.get_preset` makes a `TrainConfig`).
The paper (arXiv 2604.10791, Sec. 3.2) fixes: frozen base, AdamW, cosine schedule, 50 warmup steps, LR 1e-5,
500 steps, effective batch 16 (160M: 4 x accum 4; 410M: 2 x 8), bf16, gradient checkpointing, seed 42,
512 tokens, the first 2,000 WikiText-103 train lines longer than 50 characters. What the paper leaves open
is taken from the authors' script, which trains with the `transformers` Trainer defaults: AdamW betas
(0.9, 0.999), eps 1e-8, weight decay 0.0 (torch's own AdamW default would be 0.01), gradient clipping at
norm 1.0, cosine down to 0, and the base loaded in bfloat16. Injected weights stay fp32 (see
`TrainConfig.paper_bf16_weights` for the paper's pure-bf16 setting).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

# --- methods (train/methods.py applies them) ---

PREPROJ_LORA_RANK = 64  # with alpha 2r = 128, as the paper


@dataclass(frozen=True)
class MethodSpec:
    """What a method adds: pre-projection, content skip, LoRA (with the rank rule "paper" or a fixed rank)."""

    name: str
    preproj: bool
    skip: bool
    lora: bool
    lora_rank: str | int | None = None  # "paper" = the paper's rule; "matched" = as many params as preproj_skip
    in_paper: bool = True  # one of the paper's five (Table 1/2)


# The one definition of the methods: every list of names (CLI choices, TrainConfig, reproduce/sweep defaults,
# the `method` tag an adapter folder carries) is read from this table.
METHOD_SPECS: dict[str, MethodSpec] = {
    "preproj": MethodSpec("preproj", preproj=True, skip=False, lora=False),
    "skip": MethodSpec("skip", preproj=False, skip=True, lora=False),
    "preproj_skip": MethodSpec("preproj_skip", preproj=True, skip=True, lora=False),
    "lora": MethodSpec("lora", preproj=False, skip=False, lora=True, lora_rank="paper"),
    "preproj_lora": MethodSpec("preproj_lora", preproj=True, skip=False, lora=True, lora_rank=PREPROJ_LORA_RANK),
    "lora_matched": MethodSpec(
        "lora_matched", preproj=False, skip=False, lora=True, lora_rank="matched", in_paper=False
    ),
}
METHODS: tuple[str, ...] = tuple(METHOD_SPECS)
"""The method names, in the table's order (`mmpreproj train --method`)."""
PAPER_METHODS: tuple[str, ...] = tuple(n for n, s in METHOD_SPECS.items() if s.in_paper)
BUDGET_METHODS = ("lora", "preproj_skip", "preproj", "skip")  # the methods `train.sizes` sizes to a budget

# --- TrainConfig's choices (train/config.py) ---

PRECISIONS = ("bf16", "fp32")  # bf16 = torch.autocast(dtype=bfloat16); trainable weights stay fp32
MODEL_DTYPES = ("float32", "bfloat16")  # dtype the frozen base is loaded in
SCHEDULES = ("cosine", "constant")  # both with linear warmup from 0
PARALLEL = ("ddp", "fsdp")  # how several processes (torchrun / accelerate launch) share the work
# The size fields and their defaults (the paper's modules); `arms.arm_key` leaves a field at its default out.
SIZE_DEFAULTS: dict[str, Any] = {"expansion": 1.25, "skip_rank": None, "layers": None, "parts": None}
# what each size field sizes: a method without any of those modules refuses it set (TrainConfig, `train`'s flags)
SIZED_MODULES: dict[str, tuple[tuple[str, ...], str]] = {
    "expansion": (("preproj",), "a pre-projection"),
    "skip_rank": (("skip",), "a skip"),
    "layers": (("preproj", "skip"), "injected modules"),
    "parts": (("preproj", "skip"), "injected modules"),
}


def unsized_module(method: str, field: str, value: Any) -> str | None:
    """What size field `field` sizes ("a skip") when it is set off its default and `method` has no such module;
    None where the field applies."""
    modules, what = SIZED_MODULES[field]
    spec = METHOD_SPECS[method]
    if value is None or value == SIZE_DEFAULTS[field] or any(getattr(spec, m) for m in modules):
        return None
    return what


MAX_EXPANSION = 16  # the pre-projection's inner width is at most 16·d (the paper uses 1.25·d; method/config.py)

# --- file names of a run or adapter folder (method/files.py, train/adapters.py) ---

ADAPTER_CONFIG_NAME = "adapter_config.json"  # peft's file: what an adapter folder holds beside its weights
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"  # peft's weights file, the one a PREPROJ folder holds
ADAPTER_DIR = "adapter"  # where a run folder (and a `save_pretrained` folder) keeps its adapter

# --- evaluation (eval/evaluate.py) ---

TASKS = ("ppl", "lambada", "hellaswag", "arc_easy", "doc_ppl")
"""The evaluation tasks `evaluate` knows (`mmpreproj eval --tasks`)."""
PROTOCOLS = ("paper", "lm-eval")
"""`paper`: the paper's own scoring; `lm-eval`: EleutherAI's harness on the same model."""
DATA_SOURCES = ("local", "hub")
"""`local`: the copies in assets/ (never waits on a network); `hub`: the datasets hub."""

# --- studies (experiments/sweep.py, experiments/budget.py) ---

DEFAULT_LRS = (1e-5, 1e-4, 1e-3, 3e-3, 1e-2)
DEFAULT_BUDGETS = (0.01, 0.03, 0.1, 0.3)

# --- presets (train/presets.py) ---

_PAPER: dict[str, Any] = dict(
    data="wikitext",
    data_config="wikitext-103-raw-v1",
    data_split="train",
    num_lines=2000,
    min_chars=50,
    max_len=512,
    steps=500,
    warmup_steps=50,
    lr=1e-5,
    schedule="cosine",
    min_lr_ratio=0.0,
    weight_decay=0.0,
    adam_betas=(0.9, 0.999),
    adam_eps=1e-8,
    max_grad_norm=1.0,
    precision="bf16",
    model_dtype="bfloat16",
    gradient_checkpointing=True,
    seed=42,
)
# What the CPU presets share: WikiText valid lines (so PPL is measured on test rows), 128 tokens, fp32, LR 1e-3.
_CPU: dict[str, Any] = dict(
    data="assets/data/wikitext-103-raw/wiki.valid.raw.gz",
    data_config=None,
    min_chars=50,
    max_len=128,
    lr=1e-3,
    schedule="cosine",
    grad_accum=1,
    weight_decay=0.0,
    max_grad_norm=1.0,
    precision="fp32",
    model_dtype="float32",
    gradient_checkpointing=False,
    seed=42,
)

PRESETS: MappingProxyType[str, MappingProxyType[str, Any]] = MappingProxyType(
    {
        "pythia-160m": MappingProxyType(dict(_PAPER, model="EleutherAI/pythia-160m", batch_size=4, grad_accum=4)),
        "pythia-410m": MappingProxyType(dict(_PAPER, model="EleutherAI/pythia-410m", batch_size=2, grad_accum=8)),
        # SmolLM2-135M-Instruct (a GGUF file a package ships, `make smollm2`; data/gguf_source.py), the paper's
        # protocol unchanged but the model: for a GPU (recipes/smollm2/gpu_table2.py).
        "smollm2-135m": MappingProxyType(dict(_PAPER, model="smollm2-135m", batch_size=4, grad_accum=4)),
        # The same model on 2 CPU cores, chosen by measurement (docs/evidence/smollm2-135m): one step of 4 x 128
        # tokens takes 5.2-5.7 s on one thread (pre-projection + skip at 1%, LoRA r=64), so 100 steps are ~10
        # min an arm and two single-thread processes run two arms at once. Train on the first 1,500 WikiText
        # valid lines longer than 50 characters (they end at row 3,239); learning rates are chosen on the
        # held-out rows after them (`ppl_split="heldout"`), results are measured on test rows.
        "smollm2-135m-cpu": MappingProxyType(
            dict(_CPU, model="smollm2-135m", num_lines=1500, steps=100, warmup_steps=10, batch_size=4, save_every=25)
        ),
        # The offline demo: a ~7M-parameter Pythia-architecture model (assets/mini-pythia) on 2 CPU cores,
        # five methods plus evaluation in 15 minutes: 200 steps of 8 x 128 tokens take ~0.4 CPU-seconds per
        # step on one core (~80 CPU-s per method). fp32 (CPU bf16 autocast is slow and the model is small),
        # no checkpointing (memory is not the limit). Train on WikiText valid lines; the demo scores PPL on test.
        # LR 1e-3, not 1e-5: with 200 steps, 1e-5 leaves the ~0.01-sized injected weights where they started.
        # The paper's "1e-3 is catastrophic" concerns its 500-step Pythia runs; on mini-pythia, 100 steps at
        # 1e-3 lowered the held-out loss on 64 WikiText test lines from 7.28 to 6.20 (preproj_skip) / 6.18 (lora).
        "mini": MappingProxyType(
            dict(
                _CPU,
                model="assets/mini-pythia",
                num_lines=2000,
                steps=200,
                warmup_steps=20,
                batch_size=8,
                save_every=100,
            )
        ),
    }
)
"""The named presets: `TrainConfig` fields per name (`get_preset`, `mmpreproj train --preset`)."""


# Presets that train on WikiText validation lines: their line PPL is measured on test rows instead.
TRAINS_ON_VALIDATION = frozenset({"mini", "smollm2-135m-cpu"})
