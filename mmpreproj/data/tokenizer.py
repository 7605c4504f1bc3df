"""The shipped GPT-NeoX-20B / Pythia tokenizer as a `transformers` fast tokenizer."""

from __future__ import annotations

import os

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from .assets import asset_path, open_text

PYTHIA_TOKENIZER_FILE = ("tokenizers", "pythia-20b.json.gz")


def pythia_tokenizer(path: str | os.PathLike[str] | None = None):  # -> transformers.PreTrainedTokenizerFast
    """Pythia's tokenizer (`EleutherAI/pythia` `utils/20B_tokenizer.json`), read from the shipped asset.

    `<|endoftext|>` (id 0) is bos, eos, unk and pad, as in the Pythia Hub configs with the paper's pad = eos.
    No special tokens are added on encoding. The vocabulary has 50,277 entries; Pythia's embeddings have
    more rows (50,304 for the small models), so size models from their config, not from this tokenizer.
    """
    with open_text(path or asset_path(*PYTHIA_TOKENIZER_FILE)) as f:
        backend = Tokenizer.from_str(f.read())
    eot = "<|endoftext|>"
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=eot, eos_token=eot, unk_token=eot, pad_token=eot
    )
