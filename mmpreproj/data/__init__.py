"""Dataset readers for evaluation: plain lists of rows or dicts, from the shipped assets or the Hub."""

from .arc import arc_easy_examples
from .assets import ASSETS_ENV, asset_path, open_text
from .hellaswag import hellaswag_examples
from .hub import DataUnavailableError, hub_offline, hub_reachable, load_hub_split
from .lambada import lambada_examples, split_lambada
from .tokenizer import pythia_tokenizer
from .wikitext import wikitext_articles, wikitext_detokenize, wikitext_lines

__all__ = [
    "ASSETS_ENV",
    "DataUnavailableError",
    "arc_easy_examples",
    "asset_path",
    "hellaswag_examples",
    "hub_offline",
    "hub_reachable",
    "lambada_examples",
    "load_hub_split",
    "open_text",
    "pythia_tokenizer",
    "split_lambada",
    "wikitext_articles",
    "wikitext_detokenize",
    "wikitext_lines",
]
