"""A `PeftModel.save_pretrained` cut short between its two files is refused on load, never loaded as a mix.

peft writes the weights first and the config second, each in place (`mmpreproj/method/file_check.py`). The kill is
simulated by making the config write fail after the weights were replaced; the loaders peft users reach
(`PeftModel.from_pretrained`, `PeftModel.load_adapter` of a new name, `mmpreproj.load_adapter`) must refuse
the pair and leave the model as it was. Not covered: `PeftModel.load_adapter` into the name already loaded (the
Trainer's resume) reads no config, so there is nothing to compare; the Trainer writes each checkpoint to a new
folder.
"""

from __future__ import annotations

import json

import pytest
import torch
from peft import PeftModel, get_peft_model

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj.method.file_check import check_weights_digest, weights_digest
from tests.helpers.zoo import tiny_neox


def _trained(seed: int) -> PeftModel:
    model = get_peft_model(tiny_neox(), PreProjConfig())
    with torch.no_grad():  # stands for training: every adapter weight moves
        g = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * 1e-2)
    return model


def _cut_short_save(model: PeftModel, folder, monkeypatch) -> None:
    """`model.save_pretrained(folder)` killed after the weights were written, before the config."""

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed between the two files")

    with monkeypatch.context() as m:
        m.setattr(PreProjConfig, "save_pretrained", killed)
        with pytest.raises(KeyboardInterrupt):
            model.save_pretrained(folder)


def _adapter_values(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if ".preproj." in k or ".preproj_skip." in k}


def test_a_complete_save_records_the_digest_of_what_it_wrote(tmp_path):
    from safetensors.torch import load_file

    _trained(1).save_pretrained(tmp_path)
    digest = json.loads((tmp_path / "adapter_config.json").read_text())["injection"]["weights_digest"]
    assert digest == weights_digest(load_file(str(tmp_path / "adapter_model.safetensors")))
    loaded = PeftModel.from_pretrained(tiny_neox(), tmp_path)  # the pair matches: it loads
    assert mmpreproj.is_injected(loaded)


def test_a_save_cut_short_is_refused_by_every_loader(tmp_path, monkeypatch):
    first, second = _trained(1), _trained(2)
    first.save_pretrained(tmp_path)
    _cut_short_save(second, tmp_path, monkeypatch)  # second's weights beside first's config
    match = r"does not hold the weights .*adapter_config.json was saved with"
    with pytest.raises(ValueError, match=match):
        PeftModel.from_pretrained(tiny_neox(), tmp_path)
    fresh = tiny_neox()
    with pytest.raises(ValueError, match=match):
        mmpreproj.load_adapter(fresh, tmp_path)
    assert not mmpreproj.is_injected(fresh)  # nothing was injected
    before = _adapter_values(first)
    with pytest.raises(ValueError, match=match):  # a further adapter: peft reads the folder's config first
        first.load_adapter(str(tmp_path), "other")
    after = _adapter_values(first)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert list(first.peft_config) == ["default"]


def test_the_digest_reads_names_values_shapes_and_dtypes():
    a = {"x": torch.arange(6.0).reshape(2, 3), "y": torch.ones(4, dtype=torch.bfloat16), "z": torch.zeros(2, 3)}
    prefixed = {"base_model.model.y": a["y"], "base_model.model.x": a["x"], "base_model.model.z": a["z"]}
    assert weights_digest(a) == weights_digest(prefixed)  # peft's prefix and the order do not count
    assert weights_digest(a).startswith("blake2b-named:")
    for changed in (
        {**a, "x": a["z"], "z": a["x"]},  # two same-shaped tensors swapped between names
        {"w": a["x"], "y": a["y"], "z": a["z"]},  # a tensor renamed
        {**a, "y": a["y"].clone().index_fill_(0, torch.tensor([3]), 2.0)},  # one bf16 value
        {**a, "x": a["x"].reshape(3, 2)},  # same values, another shape
        {**a, "x": a["x"].double()},  # same values, another dtype
        {"x": a["x"]},  # a tensor missing
    ):
        assert weights_digest(changed) != weights_digest(a)


@pytest.mark.parametrize(
    "bad", ["blake2b:xyz", "blake2b-named:" + "0" * 31, "sha256:" + "0" * 32, 7, ["blake2b:" + "0" * 32]]
)
def test_a_malformed_digest_is_refused_naming_the_field(tmp_path, bad):
    with pytest.raises(
        ValueError, match=r"injection.weights_digest=.*expected 'blake2b-named:' \(or 'blake2b:'\) and 32 hex digits"
    ):
        check_weights_digest(bad, {"x": torch.zeros(1)}, tmp_path / "adapter_model.safetensors")
    check_weights_digest(None, {"x": torch.zeros(1)}, tmp_path / "w")  # not recorded: a folder written before
