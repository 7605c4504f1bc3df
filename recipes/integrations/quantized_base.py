"""Frozen probe on a quantized base: int8 (torchao) linear layers, float32 pre-projection + content skip.

Method, top to bottom:
  1. Base: the shipped mini Pythia (assets/mini-pythia, GPT-NeoX, 4 blocks, d=256) in float32; then every
     linear layer but the output head is stored quantized and frozen (`quantize_frozen_base`, default int8
     weight-only; "nf4"/"fp4" use bitsandbytes 4-bit). Parameter bytes are printed before and after.
  2. Data: WikiText-103 raw rows shipped in assets/data: training lines from the validation split (rows of
     more than 50 characters, each tokenized alone and padded), perplexity on the first rows of the test split
     (the paper's line-level PPL: every row scored alone).
  3. Inject the pre-projection + content skip (paper init) into every block; only they train (AdamW, constant
     LR, a few steps): gradients pass through the frozen quantized Q/K/V and output projections.
  4. Save the adapter, load it into a freshly loaded and quantized base, check the outputs are bit-exact.
  5. Print the line PPL of the float and the quantized base before, and of the injected model after training.

    .venv/bin/python recipes/integrations/quantized_base.py                       # int8, ~1 min on 2 CPU cores
    .venv/bin/python recipes/integrations/quantized_base.py --scheme nf4 --steps 50
Writes metrics.json and adapter/ under --out (default runs/quantized_base/).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.kit`

import mmpreproj  # noqa: E402
from mmpreproj.data import asset_path, wikitext_lines  # noqa: E402
from mmpreproj.eval import line_perplexity  # noqa: E402
from mmpreproj.integrations.quantized import QUANT_SCHEMES, model_bytes, quantize_frozen_base  # noqa: E402
from mmpreproj.train import load_model, load_tokenizer, pad_lines, select_lines  # noqa: E402
from recipes.kit.recipe import parse_config  # noqa: E402


@dataclass
class Config:
    """Every knob of the run (the CLI is generated from these fields)."""

    model: str = str(asset_path("mini-pythia"))  # a local folder (or hub id when online)
    scheme: str = "int8"  # one of QUANT_SCHEMES
    out: str = "runs/quantized_base"
    steps: int = 30
    batch_size: int = 8
    lr: float = 3e-4
    max_len: int = 128
    train_lines: int = 240  # WikiText validation rows (> 50 chars) to train on
    eval_lines: int = 100  # WikiText test rows scored for PPL (rows under 50 chars are skipped)
    seed: int = 0
    threads: int = 2

    def __post_init__(self) -> None:
        if self.scheme not in QUANT_SCHEMES:
            raise ValueError(f"Config.scheme={self.scheme!r}; allowed values: {sorted(QUANT_SCHEMES)}")
        for name in ("steps", "batch_size", "max_len", "train_lines", "eval_lines", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"Config.{name}={getattr(self, name)}; must be >= 1")


def quantized_base(config: Config) -> torch.nn.Module:
    """The base in float32 with its linear layers quantized and frozen (eval mode)."""
    return quantize_frozen_base(load_model(config.model, "float32"), config.scheme).eval()


def ppl(model: torch.nn.Module, tokenizer, rows: list[str], config: Config) -> float:
    return line_perplexity(model, tokenizer, rows, max_length=config.max_len, progress=False)["ppl"]


def main(argv: list[str] | None = None) -> dict:
    config = parse_config(Config, argv, __doc__)
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(config.model)

    # 1. the base, float32 then quantized
    float_model = load_model(config.model, "float32").eval()
    float_bytes = model_bytes(float_model)["parameters"]
    model = quantized_base(config)
    quant_bytes = model_bytes(model)["parameters"]
    print(
        f"base parameters: float32 {float_bytes / 2**20:.2f} MiB -> {config.scheme} {quant_bytes / 2**20:.2f} MiB "
        f"({quant_bytes / float_bytes:.2f}x)"
    )

    # 2. data
    train = pad_lines(select_lines(wikitext_lines("validation"), config.train_lines), tokenizer, config.max_len)
    eval_rows = wikitext_lines("test")[: config.eval_lines]
    ppl_float = ppl(float_model, tokenizer, eval_rows, config)
    del float_model
    ppl_before = ppl(model, tokenizer, eval_rows, config)
    print(f"line PPL of the base: float32 {ppl_float:.2f}, {config.scheme} {ppl_before:.2f}")

    # 3. inject and train the injected weights only
    mmpreproj.inject(model, mmpreproj.PreProjConfig())
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=config.lr)
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(config.seed))
    model.train()
    start, losses = time.perf_counter(), []
    for step in range(config.steps):
        rows = [int(order[(step * config.batch_size + i) % len(train)]) for i in range(config.batch_size)]
        loss = model(**train.batch(rows)).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 10 == 0 or step == config.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}")
    seconds = time.perf_counter() - start
    model.eval()

    # 4. save, reload into a fresh quantized base, compare
    adapter = mmpreproj.save_adapter(model, out / "adapter")
    fresh = mmpreproj.load_adapter(quantized_base(config), adapter)
    probe = train.batch(range(min(4, len(train))))
    with torch.no_grad():
        exact = torch.equal(model(**probe).logits, fresh(**probe).logits)
    print(f"adapter saved to {adapter}; reloaded into a fresh {config.scheme} base: bit-exact = {exact}")

    # 5. perplexity after
    ppl_after = ppl(model, tokenizer, eval_rows, config)
    print(f"line PPL: {ppl_before:.2f} (base) -> {ppl_after:.2f} (after {config.steps} steps)")
    metrics = {
        "config": dataclasses.asdict(config),
        "ppl_float_base": ppl_float,
        "ppl_before": ppl_before,
        "ppl_after": ppl_after,
        "losses": losses,
        "train_seconds": round(seconds, 1),
        "trainable_parameters": sum(p.numel() for p in trainable),
        "base_bytes": {"float32": float_bytes, config.scheme: quant_bytes},
        "reload_bit_exact": exact,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "load_avg_1_5_15": list(os.getloadavg()),
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    return metrics


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.command`
    from recipes.command import run_main  # a refusal in one line naming its flags

    run_main(main)
