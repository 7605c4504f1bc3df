"""Helpers for the tests/test_train_*.py files: a byte-level tokenizer built in code, tiny configs."""

from __future__ import annotations

import torch

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


def trainable(model) -> dict[str, torch.Tensor]:
    """{name: detached copy} of the trainable parameters."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def frozen(model) -> dict[str, torch.Tensor]:
    """{name: detached copy} of the frozen parameters."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
