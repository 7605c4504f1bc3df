"""A second adapter loaded under a new name is checked exactly as the first one is (issue 31).

Every case of `tests/helpers/adapter_cases.py` goes to a model that already holds a good adapter, through
peft's `PeftModel.load_adapter(DIR, adapter_name="other")` (peft), transformers'
`model.load_adapter(DIR, adapter_name="other")` (hf) and `mmpreproj.load_adapter(model, DIR,
adapter_name="other")` (ours), and into the name already loaded (peft's, as a Trainer's resume). The model
(modules, tensors, `requires_grad`, its adapter names) and the folder are compared before and after each refusal.

transformers loads a second adapter through a new tuner and then reads the file by its keys, which are the
active adapter's: the weights would land on the adapter already loaded and the new one would stay at its init.
That load is refused before anything changes, naming the two loaders that add a named adapter right.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import PeftModel, inject_adapter_in_model

import mmpreproj
from tests.helpers.adapter_cases import CASES, files, good, write_cases
from tests.helpers.adapter_cases import base as _base
from tests.helpers.snapshots import assert_unchanged, snapshot
from tests.helpers.zoo import tiny_neox

X = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("base")
    tiny_neox().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def first(tmp_path_factory, base_dir) -> Path:
    return good(base_dir, tmp_path_factory.mktemp("first") / "a")


@pytest.fixture(scope="module")
def folders(tmp_path_factory, base_dir) -> dict[str, Path]:
    return write_cases(tmp_path_factory.mktemp("cases"), base_dir)


def _loaded(loader: str, base_dir: Path, first: Path):
    """A model holding the good adapter `first` as "default", loaded the way `loader` loads."""
    if loader == "peft":
        return PeftModel.from_pretrained(_base(base_dir), str(first))
    if loader == "ours":
        return mmpreproj.load_adapter(_base(base_dir), first)
    model = _base(base_dir)
    model.load_adapter(str(first))
    return model


def _add(loader: str, model, folder: Path):
    if loader == "ours":
        return mmpreproj.load_adapter(model, folder, adapter_name="other")
    return model.load_adapter(str(folder), adapter_name="other")


def _names(loader: str, model) -> list[str]:
    return mmpreproj.adapter_names(model) if loader == "ours" else sorted(model.peft_config)


def _logits(model):
    with torch.no_grad():
        return model(X).logits


LOADERS = ("peft", "hf", "ours")


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("loader", LOADERS)
def test_a_bad_folder_loaded_under_a_new_name_is_refused_and_nothing_changes(folders, base_dir, first, case, loader):
    model = _loaded(loader, base_dir, first)
    before, before_files, out = snapshot(model), files(folders[case]), _logits(model)
    with pytest.raises((ValueError, RuntimeError)):
        _add(loader, model, folders[case])
    assert_unchanged(model, before)
    assert _names(loader, model) == ["default"]
    assert mmpreproj.adapter_names(model) == ["default"]
    assert torch.equal(_logits(model), out)
    assert files(folders[case]) == before_files  # a load never writes


@pytest.mark.parametrize("loader", ["peft", "ours"])
def test_a_good_folder_loaded_under_a_new_name_holds_its_own_weights(tmp_path, base_dir, first, loader):
    second = good(base_dir, tmp_path / "b", seed=2)
    model = _loaded(loader, base_dir, first)
    out_first = _logits(model)
    _add(loader, model, second)
    assert torch.equal(_logits(model), out_first)  # added inactive: the first one still runs, untouched
    mmpreproj.set_adapter(model, "other") if loader == "ours" else model.set_adapter("other")
    alone = PeftModel.from_pretrained(_base(base_dir), str(second)).eval()
    assert torch.equal(_logits(model), _logits(alone))
    assert not torch.equal(_logits(model), out_first)


def test_transformers_named_load_is_refused_naming_the_loaders_that_add_one(tmp_path, base_dir, first):
    second = good(base_dir, tmp_path / "b", seed=2)
    model = _loaded("hf", base_dir, first)
    before, out = snapshot(model), _logits(model)
    with pytest.raises(ValueError, match=r"PeftModel\.load_adapter\(DIR, adapter_name=\.\.\.\) or mmpreproj\.load"):
        model.load_adapter(str(second), adapter_name="other")
    assert_unchanged(model, before)
    assert sorted(model.peft_config) == ["default"] and torch.equal(_logits(model), out)
    inject_adapter_in_model(mmpreproj.PreProjConfig(), model, "fresh")  # a fresh one (no file) is still added,
    assert mmpreproj.adapter_names(model) == ["default", "fresh"]  # and runs, as LoRA's would
    assert mmpreproj.active_adapter(model) == "fresh"
    mmpreproj.set_adapter(model, "default")
    assert torch.equal(_logits(model), out)


@pytest.mark.parametrize("case", ["modules_reversed", "layers_disagree", "hidden_size_disagrees"])
@pytest.mark.parametrize("loader", ["peft", "ours"])
def test_the_named_refusal_names_the_field_as_the_first_adapters_does(folders, base_dir, first, case, loader):
    field = {"modules_reversed": "modules", "layers_disagree": "layers", "hidden_size_disagrees": "hidden_size"}
    model = _loaded(loader, base_dir, first)
    with pytest.raises(ValueError, match=rf"{field[case]}"):
        _add(loader, model, folders[case])


# what a load into a name already loaded (a Trainer's resume, peft's best-model load) refuses: it reads the weights
# file alone (no config, so no digest), each tensor checked in memory before any is copied
SAME_NAME_REFUSED = {"nan", "inf", "integer", "bool", "missing", "extra", "shape"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_load_into_the_name_already_loaded_checks_every_tensor_before_copying(folders, base_dir, first, case):
    model = _loaded("peft", base_dir, first)
    before, before_files = snapshot(model), files(folders[case])
    if case in SAME_NAME_REFUSED:
        with pytest.raises((ValueError, RuntimeError)):
            model.load_adapter(str(folders[case]), adapter_name="default")
        assert_unchanged(model, before)
    else:  # the tensors fit: loaded as they are (what only the config or the digest shows is not read here)
        model.load_adapter(str(folders[case]), adapter_name="default")
        assert list(model.peft_config) == ["default"]
    assert files(folders[case]) == before_files
