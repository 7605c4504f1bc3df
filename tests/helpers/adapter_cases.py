"""Bad PREPROJ adapter folders, written as an attacker or a damaged disk would (issue 31), for the loader tests.

`good(base_dir, folder)` saves a trained adapter of the tiny GPT-NeoX saved in `base_dir` through peft; `edit`
changes its weights and config; `CASES` names each damage. Each case's weights edit recomputes the config's
digest over the edited file where it says so, so that only the other checks can catch it. Keys are peft's file
keys (what any loader reads), never a library's internal names.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import get_peft_model
from safetensors.torch import load_file, save_file

from mmpreproj import PreProjConfig
from mmpreproj.method.file_check import weights_digest
from tests.helpers.snapshots import assert_unchanged, snapshot

W, C = "adapter_model.safetensors", "adapter_config.json"
UP0 = "base_model.model.gpt_neox.layers.0.attention.preproj.up.weight"
UP1 = "base_model.model.gpt_neox.layers.1.attention.preproj.up.weight"
SKIP0 = "base_model.model.gpt_neox.layers.0.attention.preproj_skip.proj.weight"


def base(base_dir: Path):
    """The tiny base saved in `base_dir`, fp32, eval mode."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32).eval()


def good(base_dir: Path, folder: Path, seed: int = 1, **cfg) -> Path:
    """A trained adapter (every trainable weight moved) of the base in `base_dir`, saved by peft into `folder`."""
    torch.manual_seed(seed)
    model = get_peft_model(base(base_dir), PreProjConfig(**cfg))
    with torch.no_grad():  # stands for training
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 1e-2)
    model.save_pretrained(folder)
    return folder


def edit(folder: Path, tensors=None, config=None, redigest: bool = True) -> None:
    """Edit the folder's weights (`tensors(dict) -> dict`) and config (`config(dict) -> None`, in place)."""
    cfg = json.loads((folder / C).read_text())
    if tensors is not None:
        new = tensors(load_file(str(folder / W)))
        save_file(new, str(folder / W))
        if redigest:
            cfg["injection"]["weights_digest"] = weights_digest(new)
    if config is not None:
        config(cfg)
    (folder / C).write_text(json.dumps(cfg, indent=2))


def files(folder: Path) -> dict[str, bytes]:
    """Every file of `folder` (and its subfolders) by relative path, and where each link points."""
    out: dict[str, bytes] = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            out[rel] = b"-> " + str(p.readlink()).encode()
        elif p.is_file():
            out[rel] = p.read_bytes()
    return out


def _put(key, value):
    return lambda t: {**t, key: value}


def _drop(key):
    return lambda t: {k: v for k, v in t.items() if k != key}


def _swap(a, b):
    return lambda t: {**t, a: t[b], b: t[a]}


def _cfg(**fields):
    def change(cfg):
        for k, v in fields.items():
            if k.startswith("injection."):
                cfg["injection"][k.split(".", 1)[1]] = v
            else:
                cfg[k] = v

    return change


def _reverse_modules(cfg):
    cfg["injection"]["modules"] = cfg["injection"]["modules"][::-1]


# name -> (weights edit, config edit, recompute the digest over the edited file)
CASES = {
    "nan": (lambda t: _put(UP0, torch.full_like(t[UP0], float("nan")))(t), None, True),
    "inf": (lambda t: _put(SKIP0, torch.full_like(t[SKIP0], float("inf")))(t), None, True),
    "integer": (lambda t: _put(UP0, torch.ones_like(t[UP0], dtype=torch.int32))(t), None, True),
    "bool": (lambda t: _put(UP0, torch.ones_like(t[UP0], dtype=torch.bool))(t), None, True),
    "missing": (_drop(UP1), None, True),
    "extra": (_put("base_model.model.gpt_neox.layers.0.attention.preproj.extra.weight", torch.zeros(2)), None, True),
    "shape": (lambda t: _put(UP0, torch.zeros(t[UP0].shape[0] + 1, t[UP0].shape[1]))(t), None, True),
    "swapped_same_shape": (_swap(UP0, UP1), None, False),
    "torn_pair": (lambda t: {k: v + 1 for k, v in t.items()}, None, False),
    "skip_rank_disagrees": (None, _cfg(skip_rank=4), False),
    "expansion_disagrees": (None, _cfg(expansion=2.0), False),
    "layers_disagree": (None, _cfg(layers=[0]), False),
    "modules_reversed": (None, _reverse_modules, False),
    "expansion_huge": (None, _cfg(expansion=1e9), False),
    "skip_rank_huge": (None, _cfg(skip_rank=10**12), False),
    "hidden_size_disagrees": (None, _cfg(**{"injection.hidden_size": 64}), False),
}


def write_cases(root: Path, base_dir: Path, names=None) -> dict[str, Path]:
    """One folder per case (all of `CASES`, or `names`) under `root`."""
    out = {}
    for name in names or CASES:
        tensors, config, redigest = CASES[name]
        folder = good(base_dir, root / name)
        edit(folder, tensors, config, redigest)
        out[name] = folder
    return out


PEFT_ATTRS = ("peft_config", "_hf_peft_config_loaded", "mmpreproj_state")


def peft_attrs(model: torch.nn.Module) -> dict:
    """peft's and transformers' attributes on the model, by identity (a refused load adds or replaces none)."""
    return {k: id(vars(model)[k]) for k in PEFT_ATTRS if k in vars(model)}


def assert_refused(load, model: torch.nn.Module, folder: Path, said: str, error: type = ValueError) -> None:
    """`load(model, folder)` raises one `error` matching `said`; the model (modules, tensors, flags, peft's
    attributes) and the folder are as they were."""
    before, attrs, tree = snapshot(model), peft_attrs(model), files(folder)
    with pytest.raises(error, match=said):
        load(model, folder)
    assert_unchanged(model, before)
    assert peft_attrs(model) == attrs
    assert files(folder) == tree
