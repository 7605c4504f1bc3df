"""Bad arguments to the public modules and calls are refused naming the argument, where the independent audit
`bench/api_fuzz_audit.py` found them accepted silently (a NaN `theta`, a float `head_dim`, a pre-projection of
inner width 0, a skip rank above the width, a non-callable observer, an empty save path) or failing deep inside
torch with another error (an AttributeError for a model that is `None`)."""

from __future__ import annotations

import math
import os

import pytest
import torch

import mmpreproj
from mmpreproj import ContentSkip, PreProjection, RoPE1D, RoPE2D
from tests.helpers.zoo import tiny_neox

CASES = {
    "rope theta nan": (lambda: RoPE1D(16, theta=math.nan), ValueError, r"theta=nan; must be a finite number > 0"),
    "rope theta inf": (lambda: RoPE2D(16, theta=math.inf), ValueError, r"theta=inf"),
    "rope head_dim float": (lambda: RoPE1D(8.0), ValueError, r"head_dim=8\.0; must be an int > 0"),
    "preproj width 0": (lambda: PreProjection(16, 0.01), ValueError, r"expansion=0\.01; .* >= 1"),
    "preproj dim None": (lambda: PreProjection(None), ValueError, r"dim=None; must be an int > 0"),
    "preproj expansion inf": (lambda: PreProjection(16, math.inf), ValueError, r"expansion=inf"),
    "skip rank > dim": (lambda: ContentSkip(16, rank=17), ValueError, r"rank=17; .* 1\.\.dim=16"),
    "skip init_std inf": (lambda: ContentSkip(16, init_std=math.inf), ValueError, r"init_std=inf"),
    "skip reset init_std": (lambda: ContentSkip(16).reset_parameters(-1.0), ValueError, r"init_std=-1\.0"),
    "active_adapter None": (lambda: mmpreproj.active_adapter(None), TypeError, r"model=None .* torch\.nn\.Module"),
    "adapter_names str": (lambda: mmpreproj.adapter_names("m"), TypeError, r"must be a torch\.nn\.Module"),
    "checkpoint config": (lambda: mmpreproj.last_whole_checkpoint(".", "x"), TypeError, r"config=\.\.\.\): a PreProj"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_argument_is_refused_naming_it(case):
    call, kind, says = CASES[case]
    with pytest.raises(kind, match=says):
        call()


def test_observe_refuses_what_it_cannot_call():
    model = mmpreproj.inject(tiny_neox())
    wrapper = mmpreproj.injected_modules(model)[0]
    with pytest.raises(TypeError, match=r"observe\(fn=None\): fn must be callable"):
        wrapper.observe(None)
    model(torch.randint(0, 100, (1, 4)))  # nothing was registered


def test_save_adapter_refuses_an_empty_path_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = mmpreproj.inject(tiny_neox())
    with pytest.raises(ValueError, match=r"save_adapter: path=''; must be a folder path"):
        mmpreproj.save_adapter(model, "")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda m, d: mmpreproj.load_adapter(m, d, freeze_base="no"), r"load_adapter\(freeze_base='no'\)"),
        (lambda m, d: mmpreproj.load_adapter(m, d, is_trainable="yes"), r"load_adapter\(is_trainable='yes'\)"),
        (lambda m, d: mmpreproj.save_adapter(m, d / "x", readme="yes"), r"save_adapter\(readme='yes'\)"),
        (lambda m, d: mmpreproj.save_pretrained(m, d / "x", adapter_only="x"), r"save_pretrained\(adapter_only='x'\)"),
    ],
    ids=["freeze_base", "is_trainable", "readme", "adapter_only"],
)
def test_a_switch_that_is_not_a_bool_is_refused(tmp_path, call, says):
    """`freeze_base="no"` read as True before (the base frozen where the caller asked for the opposite)."""
    saved = mmpreproj.inject(tiny_neox())
    mmpreproj.save_adapter(saved, tmp_path)
    target = saved if "save" in says else tiny_neox()
    with pytest.raises(TypeError, match=says + r": must be True or False"):
        call(target, tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["adapter_config.json", "adapter_model.safetensors"]
