"""The dataset readers parse the shipped assets: row counts, first examples, splits, checksums."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util

import pytest

from mmpreproj.data import (
    ASSETS_ENV,
    DataUnavailableError,
    arc_easy_examples,
    asset_path,
    hellaswag_examples,
    lambada_examples,
    pythia_tokenizer,
    split_lambada,
    wikitext_articles,
    wikitext_detokenize,
    wikitext_lines,
)

# sha256 of the decompressed files, as pinned upstream (assets/data/README.md)
UPSTREAM_SHA256 = {
    (
        "data",
        "wikitext-103-raw",
        "wiki.valid.raw.gz",
    ): "4cd0f6876d07a413aa911261ff6d363c72d757d47f0fdd6015702014c89cb9c7",
    (
        "data",
        "wikitext-103-raw",
        "wiki.test.raw.gz",
    ): "173c87a53759e0201f33e0ccf978e510c2042d7f2cb78229d9a50d79b9e7dd08",
    (
        "data",
        "lambada_openai",
        "lambada_test.jsonl.gz",
    ): "4aa8d02cd17c719165fc8a7887fddd641f43fcafa4b1c806ca8abc31fabdb226",
    ("data", "hellaswag", "hellaswag_val_subset1000.jsonl.gz"): (
        "79b87117cffba9878961284f233797c5ebeba4193cb48a93eabc4a5a1156cc45"
    ),
    ("tokenizers", "pythia-20b.json.gz"): "56ac4821e129d2c520fdaba60abd920fa852ada51b45c0dd52bbb6bd8c985ade",
}


@pytest.mark.parametrize("parts", list(UPSTREAM_SHA256), ids=lambda p: p[-1])
def test_shipped_files_match_upstream_checksums(parts):
    with gzip.open(asset_path(*parts), "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == UPSTREAM_SHA256[parts]


def test_sha256sums_file_lists_every_data_asset():
    listed = {}
    for line in asset_path("data", "SHA256SUMS").read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        listed[name.lstrip("*")] = digest
    for parts in UPSTREAM_SHA256:
        if parts[0] != "data":
            continue
        rel = "/".join(parts[1:])
        assert listed[rel] == hashlib.sha256(asset_path(*parts).read_bytes()).hexdigest(), rel


def test_asset_path_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv(ASSETS_ENV, str(tmp_path))
    assert asset_path("data", "x.txt") == tmp_path / "data" / "x.txt"
    with pytest.raises(FileNotFoundError, match="data file not found"):
        lambada_examples(3)
    monkeypatch.delenv(ASSETS_ENV)
    assert asset_path("data").is_dir()


def test_wikitext_rows_match_hub_layout():
    valid, test = wikitext_lines("validation"), wikitext_lines("test")
    assert (len(valid), len(test)) == (3760, 4358)
    assert test[:3] == ["", " = Robert Boulter = \n", ""]
    assert valid[1] == " = Homarus gammarus = \n"
    assert all(r == "" or (r.endswith("\n") and r.strip()) for r in valid)
    assert wikitext_lines("valid") == valid
    with pytest.raises(DataUnavailableError, match="not shipped"):
        wikitext_lines("train")
    with pytest.raises(ValueError, match="unknown WikiText split"):
        wikitext_lines("dev")


def test_wikitext_articles_cover_the_file():
    articles = wikitext_articles("test")
    assert len(articles) == 62
    assert articles[0].startswith(" = Robert Boulter = \n")
    assert articles[1].startswith(" = Du Fu = \n")
    with gzip.open(asset_path("data", "wikitext-103-raw", "wiki.test.raw.gz"), "rt", encoding="utf-8") as f:
        raw = f.read()
    assert raw == " \n" + "".join(articles)  # nothing lost but the blank line before the first heading


def test_detokenizer_examples():
    assert wikitext_detokenize(" = = Career = = \n") == " == Career ==\n"
    assert wikitext_detokenize("the 1 @,@ 000 @-@ year , old ( see below ) .") == "the 1,000-year, old (see below) ."


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval not installed")
def test_detokenizer_equals_lm_eval():
    from lm_eval.tasks.wikitext.preprocess_wikitext import wikitext_detokenizer

    for page in wikitext_articles("test")[:5]:
        assert wikitext_detokenize(page) == wikitext_detokenizer({"page": page})


def test_lambada_examples_and_target_split():
    examples = lambada_examples()
    assert len(examples) == 5153
    first = examples[0]
    assert first["text"].startswith("In my palm is a clear stone, and inside it is a small ivory statuette.")
    assert first["target"] == " signs"
    assert first["context"].endswith("I don't care about")
    assert first["context"] + first["target"] == first["text"]
    assert len(lambada_examples(7)) == 7
    assert split_lambada("one two  three") == ("one two ", " three")
    assert split_lambada("single") is None


def test_hellaswag_examples():
    examples = hellaswag_examples()
    assert len(examples) == 1000
    first = examples[0]
    assert set(first) == {"ctx", "endings", "label", "activity_label", "ctx_a", "ctx_b"}
    assert first["activity_label"] == "Pole vault"
    assert first["ctx"] == first["ctx_a"] + " " + first["ctx_b"]
    assert first["label"] == 3 and len(first["endings"]) == 4
    assert first["endings"][3].startswith("are in the gym practicing")
    assert all(isinstance(ex["label"], int) and 0 <= ex["label"] < 4 for ex in examples)
    assert len(hellaswag_examples(5)) == 5


def test_arc_easy_local_is_a_one_line_error():
    with pytest.raises(DataUnavailableError) as err:
        arc_easy_examples(5, source="local")
    assert "\n" not in str(err.value) and "allenai/ai2_arc" in str(err.value)


def test_pythia_tokenizer_matches_reference_ids():
    tok = pythia_tokenizer()
    assert tok("Hello, I am a Pythia model.")["input_ids"] == [
        12092,
        13,
        309,
        717,
        247,
        8462,
        36005,
        1566,
        15,
    ]
    assert tok.eos_token_id == tok.pad_token_id == tok.bos_token_id == 0
    assert len(tok) == 50277


def test_unknown_source_rejected():
    with pytest.raises(ValueError, match="unknown data source"):
        lambada_examples(1, source="ftp")
