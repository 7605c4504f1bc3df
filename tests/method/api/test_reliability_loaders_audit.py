"""Loader cases an independent audit found failing on main (1,104 bad-input cases through every loader the README
lists; 239 failed): each is now refused before anything changes, or behaves as peft's LoRA does.

- a refused peft or transformers load onto a model already injected deleted that model's own `peft_config['default']`;
- a `modules_to_save` tensor edited in the file (int32, bool, reshaped, empty, missing, an extra key; digest redone)
  was refused only after injecting by peft's loaders, and cast or loaded silently by transformers';
- transformers' `load_adapter` checked nothing when the config had no `injection` record (NaN, int32 weights loaded),
  and loaded onto a meta-device base, where the weights were dropped;
- `"__base__"` (a mixed batch's name for the base alone) was accepted as an adapter name;
- `mmpreproj.load_adapter(adapter_name=)` took config fields every other loader refuses, and ignored
  `is_trainable=True`;
- a refused `mmpreproj.save_pretrained` (NaN weights) had already rewritten the base's `config.json`, so the earlier
  save in that folder no longer loaded; peft's `save_pretrained(safe_serialization=False)` paired a new config
  with the old safetensors, so nothing there loaded;
- the record's tags and the form of its fields were read as absent when edited.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from peft import PeftModel, get_peft_model

import mmpreproj
from mmpreproj import PreProjConfig
from tests.helpers.adapter_cases import C, W, assert_refused, edit, files, good
from tests.helpers.adapter_cases import base as _base
from tests.helpers.zoo import tiny_neox

HEAD = "base_model.model.lm_head.weight"
IDS = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("base")
    tiny_neox().save_pretrained(path)
    return path


FIRST = {
    "hf": lambda m, f: m.load_adapter(str(f)),
    "peft": lambda m, f: PeftModel.from_pretrained(m, str(f)),
    "ours": lambda m, f: mmpreproj.load_adapter(m, f),
}


# -- a refused load onto an injected model keeps that model's record of its adapters ------------------------------
@pytest.mark.parametrize("loader", ["hf", "peft"])
def test_a_refused_load_onto_an_injected_model_keeps_its_adapter_record(tmp_path, base_dir, loader):
    folder = good(base_dir, tmp_path / "saved")
    model = mmpreproj.inject(_base(base_dir))
    config = model.peft_config["default"]
    with pytest.raises(ValueError, match="already holds one"):
        FIRST[loader](model, folder)
    assert model.peft_config == {"default": config} and model.peft_config["default"] is config
    assert mmpreproj.adapter_names(model) == ["default"]
    mmpreproj.save_adapter(model, tmp_path / "again")  # the record is whole: it still saves


# -- modules_to_save tensors: checked against injection.tensor_shapes before anything injects ---------------------
HEAD_CASES = {
    "int32": (lambda t: {**t, HEAD: t[HEAD].to(torch.int32)}, r"lm_head\.weight has dtype torch\.int32"),
    "bool": (lambda t: {**t, HEAD: t[HEAD] > 0}, r"lm_head\.weight has dtype torch\.bool"),
    "reshaped": (lambda t: {**t, HEAD: t[HEAD][:-1]}, r"lm_head\.weight has shape"),
    "empty": (lambda t: {**t, HEAD: t[HEAD][:0]}, r"lm_head\.weight has shape"),
    "missing": (lambda t: {k: v for k, v in t.items() if k != HEAD}, r"missing \['lm_head\.weight'\]"),
    "extra": (lambda t: {**t, "base_model.model.lm_head.bias": torch.zeros(128)}, r"unexpected \['lm_head\.bias'\]"),
}


@pytest.fixture(scope="module")
def head_folders(tmp_path_factory, base_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("heads")
    out = {}
    for name, (change, _) in HEAD_CASES.items():
        out[name] = good(base_dir, root / name, modules_to_save=["lm_head"])
        edit(out[name], change)  # the digest recomputed: only the shape record can see it
    return out


@pytest.mark.parametrize("case", sorted(HEAD_CASES))
@pytest.mark.parametrize("loader", ["hf", "peft", "peft_named"])
def test_an_edited_modules_to_save_tensor_is_refused_before_anything_injects(head_folders, base_dir, case, loader):
    if loader == "peft_named":
        model = PeftModel.from_pretrained(
            _base(base_dir), str(good(base_dir, head_folders[case].parent / f"{case}-0"))
        )
        assert_refused(
            lambda m, f: m.load_adapter(str(f), adapter_name="b"), model, head_folders[case], HEAD_CASES[case][1]
        )
        assert list(model.peft_config) == ["default"]
    else:
        assert_refused(FIRST[loader], _base(base_dir), head_folders[case], HEAD_CASES[case][1])


@pytest.mark.parametrize("case", sorted(HEAD_CASES))
def test_ours_refuses_an_edited_modules_to_save_tensor(head_folders, base_dir, case):
    assert_refused(FIRST["ours"], _base(base_dir), head_folders[case], r"lm_head\.weight|lm_head\.bias")


# -- transformers' load_adapter: every config checked, a meta base refused ---------------------------------------
@pytest.mark.parametrize(
    "change",
    [
        lambda c: c.pop("injection"),
        lambda c: c.update(injection=None),
    ],
    ids=["injection_deleted", "injection_null"],
)
@pytest.mark.parametrize("nan", [False, True], ids=["weights_as_saved", "nan_weights"])
def test_transformers_refuses_a_config_without_its_injection_record(tmp_path, base_dir, change, nan):
    folder = good(base_dir, tmp_path / "f")
    edit(folder, (lambda t: {k: torch.full_like(v, float("nan")) for k, v in t.items()}) if nan else None, change)
    assert_refused(FIRST["hf"], _base(base_dir), folder, r"no 'injection' record")


def test_transformers_refuses_a_meta_device_base(tmp_path, base_dir):
    folder = good(base_dir, tmp_path / "f")
    with torch.device("meta"):
        model = tiny_neox()
    with pytest.raises(ValueError, match="meta device"):
        model.load_adapter(str(folder))
    assert not mmpreproj.is_injected(model) and not hasattr(model, "peft_config")


# -- "__base__" names the base alone in a mixed batch: never an adapter ------------------------------------------
def test_base_is_refused_as_an_adapter_name_by_every_route(tmp_path, base_dir):
    folder = good(base_dir, tmp_path / "f")
    said = r"adapter_name='__base__'.*names the base alone"
    with pytest.raises(ValueError, match=said):
        get_peft_model(_base(base_dir), PreProjConfig(), adapter_name="__base__")
    assert_refused(
        lambda m, f: PeftModel.from_pretrained(m, str(f), adapter_name="__base__"), _base(base_dir), folder, said
    )
    assert_refused(lambda m, f: mmpreproj.load_adapter(m, f, adapter_name="__base__"), _base(base_dir), folder, said)
    loaded = PeftModel.from_pretrained(_base(base_dir), str(folder))
    assert_refused(lambda m, f: m.load_adapter(str(f), adapter_name="__base__"), loaded, folder, said)
    assert_refused(lambda m, f: mmpreproj.load_adapter(m, f, adapter_name="__base__"), loaded, folder, said)


# -- an adapter added by name: the same config rule as peft's, and is_trainable ----------------------------------
ADDED_FIELDS = {
    "parts": lambda c: c.update(parts=["vision"]),
    "modules_to_save": lambda c: c.update(modules_to_save=["lm_head"]),
    "layers": lambda c: c.update(layers={"vision": [0]}),
}


@pytest.mark.parametrize("field", sorted(ADDED_FIELDS))
@pytest.mark.parametrize("route", ["ours", "peft"])
def test_an_added_adapter_with_other_sites_in_its_config_is_refused(tmp_path, base_dir, field, route):
    folder = good(base_dir, tmp_path / "f", seed=2)
    edit(folder, config=ADDED_FIELDS[field])
    model = PeftModel.from_pretrained(_base(base_dir), str(good(base_dir, tmp_path / "first")))
    load = (
        (lambda m, f: mmpreproj.load_adapter(m, f, adapter_name="b"))
        if route == "ours"
        else (lambda m, f: m.load_adapter(str(f), adapter_name="b"))
    )
    assert_refused(load, model, folder, rf"config\.{field}=.*the injection has")
    assert mmpreproj.adapter_names(model) == ["default"]


def test_an_added_adapter_loaded_trainable_waits_trainable_as_peft_leaves_it(tmp_path, base_dir):
    first, second = good(base_dir, tmp_path / "a"), good(base_dir, tmp_path / "b", seed=2)
    ours = PeftModel.from_pretrained(_base(base_dir), str(first))
    mmpreproj.load_adapter(ours, second, adapter_name="b", is_trainable=True)
    peft_ = PeftModel.from_pretrained(_base(base_dir), str(first))
    peft_.load_adapter(str(second), adapter_name="b", is_trainable=True)
    for model in (ours, peft_):
        flags = {n: p.requires_grad for n, p in model.named_parameters() if ".b." in n}
        assert len(flags) == 6 and all(flags.values()), flags
        assert mmpreproj.active_adapter(model) == "default"
    frozen = PeftModel.from_pretrained(_base(base_dir), str(first))
    mmpreproj.load_adapter(frozen, second, adapter_name="b")
    assert not any(p.requires_grad for n, p in frozen.named_parameters() if ".b." in n)


# -- writers: a refused save leaves the folder's earlier save loadable --------------------------------------------
def test_a_refused_whole_model_save_leaves_the_earlier_save_loadable(tmp_path, base_dir):
    model = mmpreproj.inject(_base(base_dir))
    folder = tmp_path / "whole"
    mmpreproj.save_pretrained(model, folder)
    tree = files(folder)
    want = model(IDS).logits
    with torch.no_grad():
        next(p for p in model.parameters() if p.requires_grad).fill_(float("nan"))
    with pytest.raises(ValueError, match=r"save_pretrained: refusing to write .* non-finite"):
        mmpreproj.save_pretrained(model, folder)
    assert files(folder) == tree
    assert torch.equal(mmpreproj.from_pretrained(folder)(IDS).logits, want)


def test_peft_save_with_safe_serialization_off_does_not_unpair_the_earlier_save(tmp_path, base_dir):
    model = get_peft_model(_base(base_dir), PreProjConfig())
    folder = tmp_path / "saved"
    model.save_pretrained(folder)
    config, weights = (folder / C).read_bytes(), (folder / W).read_bytes()
    want = PeftModel.from_pretrained(_base(base_dir), str(folder))(IDS).logits
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1)
    with pytest.raises(ValueError, match=r"adapter_model\.bin .*adapter_config\.json was not written"):
        model.save_pretrained(folder, safe_serialization=False)
    assert (folder / C).read_bytes() == config and (folder / W).read_bytes() == weights
    assert torch.equal(PeftModel.from_pretrained(_base(base_dir), str(folder))(IDS).logits, want)
    shutil.rmtree(folder)
    with pytest.raises(ValueError, match=r"adapter_model\.bin"):  # a fresh folder: peft's .bin, no config beside it
        model.save_pretrained(folder, safe_serialization=False)
    assert (folder / "adapter_model.bin").is_file() and not (folder / C).exists()


# -- the record's tags and the form of its fields ----------------------------------------------------------------
RECORD_CASES = {
    "method": (lambda c: c["injection"].update(method="lora"), r"injection\.method='lora'"),
    "adapter_type": (lambda c: c["injection"].update(adapter_type="other"), r"injection\.adapter_type='other'"),
    "parts": (lambda c: c["injection"].update(parts="x"), r"injection\.parts='x' is not a list of part objects"),
    "host_description": (lambda c: c["injection"].update(host_description="x"), r"injection\.host_description='x'"),
    "tensor_shapes": (lambda c: c["injection"].update(tensor_shapes=[]), r"injection\.tensor_shapes=\[\]"),
    "modules_to_save": (
        lambda c: c["injection"].update(modules_to_save=["lm_head"]),
        r"modules_to_save.*(must be|is not) an object of name -> path",
    ),
}


@pytest.fixture(scope="module")
def record_folders(tmp_path_factory, base_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("records")
    out = {}
    for name, (change, _) in RECORD_CASES.items():
        out[name] = good(base_dir, root / name)
        edit(out[name], config=change)
    return out


@pytest.mark.parametrize("case", sorted(RECORD_CASES))
@pytest.mark.parametrize("loader", sorted(FIRST))
def test_an_edited_record_field_is_refused_not_read_as_absent(record_folders, base_dir, case, loader):
    said = RECORD_CASES[case][1]
    if loader == "ours" and case in ("method", "adapter_type"):  # ours reads the tags first, in its own words
        said = r"method=|adapter_type="
    assert_refused(FIRST[loader], _base(base_dir), record_folders[case], said)


# -- what stays as it is, pinned (docs/peft-guide.md, "What each loader checks") -----------------------------------
def test_peft_reads_a_config_that_is_not_json_itself_and_the_model_is_unchanged(tmp_path, base_dir):
    folder = good(base_dir, tmp_path / "f")
    (folder / C).write_text("")
    assert_refused(FIRST["peft"], _base(base_dir), folder, "Expecting value", error=Exception)


def test_the_digest_covers_the_weights_not_the_other_config_fields(tmp_path, base_dir):
    folder = good(base_dir, tmp_path / "f")
    want = PeftModel.from_pretrained(_base(base_dir), str(folder))(IDS).logits
    edit(folder, config=lambda c: c.update(activation="relu"))
    assert not torch.allclose(PeftModel.from_pretrained(_base(base_dir), str(folder))(IDS).logits, want)


def test_peft_writes_non_finite_weights_as_they_are_and_ours_refuse_them(tmp_path, base_dir):
    model = get_peft_model(_base(base_dir), PreProjConfig())
    with torch.no_grad():
        next(p for p in model.parameters() if p.requires_grad).fill_(float("nan"))
    model.save_pretrained(tmp_path / "peft")
    assert (tmp_path / "peft" / C).is_file()
    with pytest.raises(ValueError, match="non-finite"):
        mmpreproj.save_adapter(model, tmp_path / "ours")
    assert not (tmp_path / "ours").exists()


@pytest.mark.parametrize("host", ["llama", "nope", {}], ids=["another_row", "no_row", "empty_description"])
@pytest.mark.parametrize("loader", sorted(FIRST))
def test_a_config_host_that_contradicts_the_record_is_refused(tmp_path, base_dir, host, loader):
    folder = good(base_dir, tmp_path / "f")
    edit(folder, config=lambda c: c.update(host=host))
    assert_refused(FIRST[loader], _base(base_dir), folder, r"config\.host=.*injection\.host='gpt_neox'")


@pytest.mark.parametrize("loader", ["hf", "peft"])
def test_a_record_naming_another_host_row_is_refused_by_the_loaders_that_key_by_path(tmp_path, base_dir, loader):
    folder = good(base_dir, tmp_path / "f")
    edit(folder, config=lambda c: c["injection"].update(host="llama"))
    assert_refused(
        FIRST[loader], _base(base_dir), folder, r"injection\.host='llama' but its config resolves to 'gpt_neox'"
    )


@pytest.mark.parametrize("peft_type", ["preproj", None])
def test_ours_names_the_file_of_a_peft_type_no_one_reads(tmp_path, base_dir, peft_type):
    folder = good(base_dir, tmp_path / "f")
    edit(folder, config=lambda c: c.update(peft_type=peft_type))
    assert_refused(FIRST["ours"], _base(base_dir), folder, r"adapter_config\.json: neither an mmpreproj adapter")


def test_from_pretrained_names_the_missing_adapter_config(tmp_path, base_dir):
    folder = good(base_dir, tmp_path / "f")
    (folder / C).unlink()
    with pytest.raises(FileNotFoundError, match=r"adapter_config\.json is missing"):
        mmpreproj.from_pretrained(base_dir, adapter=folder)
