"""The loaders that build the base themselves refuse a bad PREPROJ folder with the base as it was (issue 31).

lm-eval's `HFLM(pretrained=BASE, peft=DIR)`, `mmpreproj eval --model BASE --adapter DIR`,
`mmpreproj.from_pretrained(BASE, adapter=DIR)`, `AutoPeftModelForCausalLM.from_pretrained(DIR)` and
transformers' `AutoModelForCausalLM.from_pretrained(DIR)` (an adapter folder: transformers loads the base its
config names, then `load_adapter`), each given folders with NaN weights, integer weights, a wrong shape, a
tampered digest, a weights file or a config that is a symlink to another save's, and a config naming other
blocks. Each base is snapshotted as it is built (the loaders' own `from_pretrained` / `load_adapter` are
observed, not replaced) and compared after the refusal; the adapter folder, the base folder and the working
folder are compared byte for byte.

transformers' `from_pretrained(DIR)` goes through its `load_adapter`, whose folder the tuner finds before it
injects (`method/load_check.py`): every case is refused with the base as it was (issue 45).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from peft import AutoPeftModelForCausalLM, PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, GPTNeoXConfig, GPTNeoXForCausalLM, PreTrainedModel

import mmpreproj
from tests.helpers.adapter_cases import UP0, C, W, edit, files, good
from tests.helpers.adapter_cases import base as _base
from tests.helpers.snapshots import assert_unchanged, snapshot

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    """A saved tiny GPT-NeoX with the shipped mini tokenizer (lm-eval and the command line need one)."""
    path = tmp_path_factory.mktemp("base")
    tok = AutoTokenizer.from_pretrained(str(REPO / "assets" / "mini-pythia"))
    torch.manual_seed(0)
    cfg = GPTNeoXConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        rotary_pct=0.25,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    GPTNeoXForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _tamper_digest(cfg: dict) -> None:
    digest = cfg["injection"]["weights_digest"]
    cfg["injection"]["weights_digest"] = digest[:-1] + ("0" if digest[-1] != "0" else "1")


def _symlinked(name: str):
    def change(folder: Path, other: Path) -> None:
        """`name` becomes a link to `other`'s file of that name (another save, outside the folder)."""
        (folder / name).unlink()
        os.symlink(other / name, folder / name)

    return change


def _layers(cfg: dict) -> None:
    cfg["layers"] = [0]


# name -> (edit of the folder, what the refusal names)
CASES = {
    "nan": (lambda f, o: edit(f, lambda t: {**t, UP0: torch.full_like(t[UP0], float("nan"))}), r"non-finite"),
    "integer": (lambda f, o: edit(f, lambda t: {**t, UP0: torch.ones_like(t[UP0], dtype=torch.int32)}), r"int32"),
    "shape": (lambda f, o: edit(f, lambda t: {**t, UP0: torch.zeros(t[UP0].shape[0] + 1, 32)}), r"shape"),
    "digest_tampered": (lambda f, o: edit(f, config=_tamper_digest), r"does not hold the weights"),
    "weights_symlinked": (_symlinked(W), r"does not hold the weights"),
    "config_symlinked": (_symlinked(C), r"does not hold the weights"),
    "layers_disagree": (lambda f, o: edit(f, config=_layers), r"layers"),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory, base_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cases")
    other = good(base_dir, root / "other-save", seed=3)
    out = {}
    for name, (change, _) in CASES.items():
        out[name] = good(base_dir, root / name)
        change(out[name], other)
    return out


@pytest.fixture
def built(monkeypatch) -> list:
    """(model, snapshot) of every base `AutoModelForCausalLM.from_pretrained` builds and every model
    transformers' `load_adapter` is called on, taken before the adapter meets it."""
    seen = []
    auto = AutoModelForCausalLM.from_pretrained
    load_adapter = PreTrainedModel.load_adapter

    def observed_from_pretrained(*args, **kwargs):
        model = auto(*args, **kwargs)
        if not mmpreproj.is_injected(model):  # a base (an adapter folder comes back injected: seen below)
            seen.append((model, snapshot(model)))
        return model

    def observed_load_adapter(self, *args, **kwargs):
        seen.append((self, snapshot(self)))
        return load_adapter(self, *args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", observed_from_pretrained)
    monkeypatch.setattr(PreTrainedModel, "load_adapter", observed_load_adapter)
    return seen


def _lm_eval(base_dir: Path, folder: Path):
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=str(base_dir), peft=str(folder), device="cpu", batch_size=1, dtype="float32")


def _cli(base_dir: Path, folder: Path):
    from mmpreproj_cli.command import main

    argv = ["eval", "--model", str(base_dir), "--adapter", str(folder), "--tasks", "ppl", "--limit", "1"]
    if main([*argv, "--no-progress"]) != 0:
        raise ValueError("mmpreproj eval exited 1")


ENTRIES = {
    "lm_eval": _lm_eval,
    "cli_eval": _cli,
    "from_pretrained": lambda b, f: mmpreproj.from_pretrained(b, adapter=f),
    "auto_peft": lambda b, f: AutoPeftModelForCausalLM.from_pretrained(str(f)),
    "transformers_auto": lambda b, f: AutoModelForCausalLM.from_pretrained(str(f)),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_bad_folder_is_refused_and_the_base_it_built_is_unchanged(
    folders, base_dir, built, tmp_path, monkeypatch, capsys, case, entry
):
    if entry == "lm_eval":
        pytest.importorskip("lm_eval")
    monkeypatch.chdir(tmp_path)
    folder = folders[case]
    trees = {p: files(p) for p in (folder, base_dir, tmp_path)}
    with pytest.raises(ValueError) as e:
        ENTRIES[entry](base_dir, folder)
    said = capsys.readouterr().err if entry == "cli_eval" else str(e.value)
    assert re.search(CASES[case][1], said), said
    if entry == "cli_eval":
        errors = [line for line in said.splitlines() if "error" in line.lower()]
        assert len(errors) == 1 and "Traceback" not in said, said  # one line, no traceback
    assert built or entry == "auto_peft", "no base built"  # AutoPeftModel checks the folder before the base
    for model, before in built:
        assert_unchanged(model, before)
    assert {p: files(p) for p in trees} == trees  # a refused load writes nothing, anywhere


def test_a_good_folder_loads_through_every_entry(tmp_path, base_dir):
    pytest.importorskip("lm_eval")
    folder = good(base_dir, tmp_path / "good")
    x = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    want = PeftModel.from_pretrained(_base(base_dir), str(folder)).eval()(x).logits
    assert not torch.equal(want, _base(base_dir)(x).logits)
    for name in ("from_pretrained", "auto_peft", "transformers_auto", "lm_eval"):
        model = ENTRIES[name](base_dir, folder)
        model = model.model if name == "lm_eval" else model
        assert torch.equal(model.eval()(x).logits, want), name


def test_a_weights_file_linked_from_a_hub_cache_style_folder_loads(tmp_path, base_dir):
    """Reading follows links (a hub cache's snapshot folder links every file to its blob); only the pair is
    checked: the same save's weights behind a link load as the file itself would."""
    folder = good(base_dir, tmp_path / "blobs")
    snap = tmp_path / "snapshot"
    snap.mkdir()
    for name in (W, C):
        os.symlink(folder / name, snap / name)
    x = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    want = PeftModel.from_pretrained(_base(base_dir), str(folder)).eval()(x).logits
    for load in (
        lambda: PeftModel.from_pretrained(_base(base_dir), str(snap)),
        lambda: mmpreproj.load_adapter(_base(base_dir), snap),
        lambda: mmpreproj.from_pretrained(base_dir, adapter=snap),
    ):
        assert torch.equal(load().eval()(x).logits, want)
    assert json.loads((snap / C).read_text())["peft_type"] == "PREPROJ"
    assert set(load_file(str(snap / W))) == set(load_file(str(folder / W)))
