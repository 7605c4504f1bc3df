"""Every loader refuses a bad PREPROJ folder before the base is touched (issue 31).

Each case writes a folder as an attacker or a damaged disk would: the weights file is edited and, where
the case says so, the config's digest recomputed over the edited file (so only the other checks can catch
it). Each loader is run on a fresh base, and the base's modules, tensors and `requires_grad` flags are
compared before and after (`tests/helpers/snapshots.py`). Loaders: `PeftModel.from_pretrained` (peft),
`AutoPeftModelForCausalLM.from_pretrained` (auto, base from the config's folder), transformers'
`model.load_adapter` (hf), `mmpreproj.load_adapter` (ours).

transformers' `load_adapter` builds the config with peft's generic `PeftConfig.from_pretrained`, which hands
our hooks no folder; the tuner finds the call's folder before it injects (`method/load_check.py`), so what
is in the weights file alone (values, dtypes, a digest) is refused there too, with the base untouched (issue 45).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import AutoPeftModelForCausalLM, PeftModel

import mmpreproj
from tests.helpers.adapter_cases import CASES, files, good, write_cases
from tests.helpers.adapter_cases import base as _base
from tests.helpers.snapshots import assert_unchanged, snapshot
from tests.helpers.zoo import tiny_neox


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("base")
    tiny_neox().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory, base_dir) -> dict[str, Path]:
    return write_cases(tmp_path_factory.mktemp("cases"), base_dir)


def _peft(base, folder):
    return PeftModel.from_pretrained(base, str(folder))


def _ours(base, folder):
    return mmpreproj.load_adapter(base, folder)


def _hf(base, folder):
    return base.load_adapter(str(folder))


LOADERS = {"peft": _peft, "ours": _ours, "hf": _hf}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_a_bad_folder_is_refused_before_the_base_is_touched(folders, base_dir, case, loader):
    folder = folders[case]
    before_files = files(folder)
    base = _base(base_dir)
    before = snapshot(base)
    with pytest.raises(ValueError):
        LOADERS[loader](base, folder)
    assert_unchanged(base, before)
    assert files(folder) == before_files  # a load never writes


@pytest.mark.parametrize("case", sorted(CASES))
def test_auto_peft_model_refuses_every_case(folders, case):
    with pytest.raises((ValueError, RuntimeError)):
        AutoPeftModelForCausalLM.from_pretrained(str(folders[case]))


def test_a_good_folder_loads_identically_through_every_loader(tmp_path, base_dir):
    folder = good(base_dir, tmp_path / "good")
    x = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    outs = {name: load(_base(base_dir), folder)(x).logits for name, load in {"peft": _peft, "ours": _ours}.items()}
    hf = _base(base_dir)
    _hf(hf, folder)
    outs["hf"] = hf(x).logits
    outs["auto"] = AutoPeftModelForCausalLM.from_pretrained(str(folder)).eval()(x).logits
    assert not torch.equal(outs["peft"], _base(base_dir)(x).logits)
    for name, out in outs.items():
        assert torch.equal(out, outs["peft"]), name
