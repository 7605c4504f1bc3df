"""Every loader refuses a bad PREPROJ folder before the base is touched (issue 31).

Each case writes a folder as an attacker or a damaged disk would: the weights file is edited and, where
the case says so, the config's digest recomputed over the edited file (so only the other checks can catch
it). Each loader is run on a fresh base, and the base's modules, tensors and `requires_grad` flags are
compared before and after (`tests/helpers/snapshots.py`). Loaders: `PeftModel.from_pretrained` (peft),
`AutoPeftModelForCausalLM.from_pretrained` (auto, base from the config's folder), transformers'
`model.load_adapter` (hf), `mmpreproj.load_adapter` (ours).

transformers' `load_adapter` builds the config with peft's generic `PeftConfig.from_pretrained`, which hands
our hooks no folder, then injects (our hook: the record against the model) and loads the weights with its own
loader: what is in the weights file alone (values, dtypes, a digest) cannot be checked before it injects.
`HF_WEIGHTS_ONLY` lists those cases; the test pins the state they leave (an injected base; no exception, or
transformers' own for a shape), so a change either way is seen.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import AutoPeftModelForCausalLM, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj.tuner.digest import weights_digest
from tests.helpers.snapshots import assert_unchanged, snapshot
from tests.helpers.zoo import tiny_neox

W, C = "adapter_model.safetensors", "adapter_config.json"
UP0 = "base_model.model.gpt_neox.layers.0.attention.preproj.up.weight"
UP1 = "base_model.model.gpt_neox.layers.1.attention.preproj.up.weight"
SKIP0 = "base_model.model.gpt_neox.layers.0.attention.preproj_skip.proj.weight"


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("base")
    tiny_neox().save_pretrained(path)
    return path


def _base(base_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32).eval()


def _good(base_dir: Path, folder: Path, **cfg) -> Path:
    torch.manual_seed(1)
    model = get_peft_model(_base(base_dir), PreProjConfig(**cfg))
    with torch.no_grad():  # stands for training
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 1e-2)
    model.save_pretrained(folder)
    return folder


def _edit(folder: Path, tensors=None, config=None, redigest: bool = True) -> None:
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


def _put(key, value):
    return lambda t: {**t, key: value}


def _drop(key):
    return lambda t: {k: v for k, v in t.items() if k != key}


def _swap(a, b):
    return lambda t: {**t, a: t[b], b: t[a]}


def _cfg(**fields):
    def edit(cfg):
        for k, v in fields.items():
            if k.startswith("injection."):
                cfg["injection"][k.split(".", 1)[1]] = v
            else:
                cfg[k] = v

    return edit


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
# what only the weights file shows: transformers' load_adapter gives our hooks no folder before it injects
HF_WEIGHTS_ONLY = {"nan", "inf", "integer", "bool", "missing", "extra", "shape", "swapped_same_shape", "torn_pair"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory, base_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cases")
    out = {}
    for name, (tensors, config, redigest) in CASES.items():
        folder = _good(base_dir, root / name)
        _edit(folder, tensors, config, redigest)
        out[name] = folder
    return out


def _peft(base, folder):
    return PeftModel.from_pretrained(base, str(folder))


def _ours(base, folder):
    return mmpreproj.load_adapter(base, folder)


def _hf(base, folder):
    return base.load_adapter(str(folder))


LOADERS = {"peft": _peft, "ours": _ours, "hf": _hf}


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_a_bad_folder_is_refused_before_the_base_is_touched(folders, base_dir, case, loader):
    folder = folders[case]
    files = _files(folder)
    base = _base(base_dir)
    before = snapshot(base)
    if loader == "hf" and case in HF_WEIGHTS_ONLY:  # no hook before it injects: pin what it leaves
        try:
            LOADERS[loader](base, folder)
        except RuntimeError as e:  # transformers' own refusal (a shape), after injecting
            assert case == "shape" and "ignore_mismatched_sizes" in str(e)
        else:
            assert case != "shape"
        assert mmpreproj.is_injected(base)  # the base is injected: the documented gap
        assert _files(folder) == files
        return
    with pytest.raises((ValueError, RuntimeError)):
        LOADERS[loader](base, folder)
    assert_unchanged(base, before)
    assert _files(folder) == files  # a load never writes


@pytest.mark.parametrize("case", sorted(CASES))
def test_auto_peft_model_refuses_every_case(folders, case):
    with pytest.raises((ValueError, RuntimeError)):
        AutoPeftModelForCausalLM.from_pretrained(str(folders[case]))


def test_a_good_folder_loads_identically_through_every_loader(tmp_path, base_dir):
    folder = _good(base_dir, tmp_path / "good")
    x = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    outs = {name: load(_base(base_dir), folder)(x).logits for name, load in {"peft": _peft, "ours": _ours}.items()}
    hf = _base(base_dir)
    _hf(hf, folder)
    outs["hf"] = hf(x).logits
    outs["auto"] = AutoPeftModelForCausalLM.from_pretrained(str(folder)).eval()(x).logits
    assert not torch.equal(outs["peft"], _base(base_dir)(x).logits)
    for name, out in outs.items():
        assert torch.equal(out, outs["peft"]), name
