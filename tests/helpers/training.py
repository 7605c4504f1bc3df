"""Trainer test fixtures: a byte-level tokenizer built in code, a tiny data set and run config, parameter copies."""

from __future__ import annotations

import torch

from mmpreproj.train import LMExamples, TrainConfig

EOS = "<|endoftext|>"


def byte_tokenizer():
    """A Pythia-style byte-level tokenizer with no merges: one token per UTF-8 byte, eos = 0 (vocab 257)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {EOS: 0}
    for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet())):
        vocab[ch] = i + 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)


DATA = LMExamples.random(24, 12, 128, seed=0)  # 24 random sequences of 12 tokens for `tiny_neox` (vocab 128)


def run_config(path, **kw) -> TrainConfig:
    """A 3-step fp32 CPU run of `preproj_skip` on the tiny model into `path`; `kw` overrides any field."""
    base = dict(
        method="preproj_skip",
        model="tiny",
        steps=3,
        warmup_steps=0,
        lr=1e-3,
        batch_size=2,
        grad_accum=2,
        precision="fp32",
        gradient_checkpointing=False,
        save_every=0,
        progress=False,
        out=str(path),
        device="cpu",
    )
    return TrainConfig(**{**base, **kw})


def trainable(model) -> dict[str, torch.Tensor]:
    """{name: detached copy} of the trainable parameters."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def frozen(model) -> dict[str, torch.Tensor]:
    """{name: detached copy} of the frozen parameters."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}


def trainer_args(out, steps: int, **kw):
    """transformers `TrainingArguments` of the Trainer tests: `steps` steps of 4 rows at LR 1e-2 on CPU, a
    checkpoint every 2 steps, seed 0, no reporting; `kw` overrides any field."""
    from transformers import TrainingArguments

    base = dict(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        save_steps=2,
        logging_steps=1,
        report_to=[],
        seed=0,
        use_cpu=True,
        disable_tqdm=True,
    )
    return TrainingArguments(**{**base, **kw})
