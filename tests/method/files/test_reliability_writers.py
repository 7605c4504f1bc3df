"""What every writer saves is what the config says, and never lands outside the folder (issue 31).

`modules_to_save` attribute paths through every writer (peft's `save_pretrained`, `mmpreproj.save_adapter`, a
plain Trainer checkpoint) and loader; a symlink placed at `adapter_config.json` is replaced, not followed;
`freeze_base=False` under peft is refused with the reason; `expansion`/`skip_rank` bounded by the model's
width, from code, a file and the command line; `save_adapter` records the digest, so a peft save cut short
over its folder is refused; folders without a digest (written before) or with the older values-only digest
still load, the missing digest said once.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch
from peft import PeftModel, get_peft_model
from safetensors.torch import load_file

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj.method import file_check as digest_mod
from tests.helpers.snapshots import assert_unchanged, snapshot
from tests.helpers.zoo import tiny_neox


def _trained(**cfg) -> PeftModel:
    torch.manual_seed(1)
    model = get_peft_model(tiny_neox(), PreProjConfig(**cfg))
    with torch.no_grad():  # stands for training: every trainable weight moves
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 1e-2)
    return model.eval()


def _logits(model, x):
    with torch.no_grad():
        return model(x).logits


X = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(0))


def _trainer_checkpoint(model, out: Path) -> Path:
    """A plain transformers Trainer's first checkpoint of `model` (lr 0: the weights stay as they are)."""
    from transformers import Trainer, TrainingArguments

    ids = torch.randint(0, 128, (4, 8), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": r, "labels": r} for r in ids]
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=1,
        save_steps=1,
        per_device_train_batch_size=2,
        learning_rate=0.0,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        save_only_model=True,
    )
    Trainer(model=model, args=args, train_dataset=data).train()
    return out / "checkpoint-1"


WRITERS = {
    "peft": lambda m, f: m.save_pretrained(f),
    "save_adapter": lambda m, f: mmpreproj.save_adapter(m, f),
    "trainer": lambda m, f: _trainer_checkpoint(m, f),
}


def _load_peft(folder):
    return PeftModel.from_pretrained(tiny_neox(), str(folder)).eval()


def _load_ours(folder):
    return mmpreproj.load_adapter(tiny_neox(), folder).eval()


def _load_hf(folder):
    model = tiny_neox()
    model.load_adapter(str(folder))
    return model.eval()


LOADERS = {"peft": _load_peft, "ours": _load_ours, "hf": _load_hf}
PATHS = (["gpt_neox.final_layer_norm"], ["gpt_neox.layers.1.post_attention_layernorm", "lm_head"])


# -- modules_to_save attribute paths (the regression: KeyError 'gpt_neox' in every writer) -----------------------
@pytest.mark.parametrize("paths", PATHS, ids=["final_norm", "indexed_and_head"])
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_modules_to_save_paths_round_trip_through_every_writer_and_loader(tmp_path, writer, paths):
    model = _trained(modules_to_save=paths)
    want = _logits(model, X)
    folder = WRITERS[writer](model, tmp_path / "a") or tmp_path / "a"
    folder = Path(folder)
    keys = load_file(str(folder / "adapter_model.safetensors"))
    for path in paths:
        assert any(k.removeprefix("base_model.model.").startswith(path + ".") for k in keys), (path, sorted(keys))
    assert not torch.equal(_logits(tiny_neox().eval(), X), want)
    for name, load in LOADERS.items():
        assert torch.equal(_logits(load(folder), X), want), name


# -- writers never follow a link out of the folder ----------------------------------------------------------------
@pytest.mark.parametrize("writer", ["peft", "save_adapter"])
def test_a_symlink_at_the_config_is_replaced_not_followed(tmp_path, writer):
    outside = tmp_path / "outside.json"
    outside.write_text("precious\n")
    folder = tmp_path / "a"
    folder.mkdir()
    os.symlink(outside, folder / "adapter_config.json")
    WRITERS[writer](_trained(), folder)
    assert outside.read_text() == "precious\n"
    assert not (folder / "adapter_config.json").is_symlink()
    assert json.loads((folder / "adapter_config.json").read_text())["peft_type"] == "PREPROJ"
    assert mmpreproj.is_injected(_load_peft(folder))


# -- what the config says is what is saved -------------------------------------------------------------------------
def test_freeze_base_false_under_peft_is_refused_with_the_reason():
    base = tiny_neox()
    before = snapshot(base)
    with pytest.raises(ValueError, match=r"freeze_base=False under peft: peft saves only the adapter"):
        get_peft_model(base, PreProjConfig(freeze_base=False))
    assert_unchanged(base, before)
    mmpreproj.inject(tiny_neox(), PreProjConfig(freeze_base=False))  # ours saves the whole model: allowed


# -- sizes bounded by the model --------------------------------------------------------------------------------
@pytest.mark.parametrize("expansion", [1e9, 17.0, float("inf")])
def test_an_expansion_out_of_range_is_refused_naming_the_range(expansion):
    with pytest.raises(ValueError, match=r"expansion=.*must be a finite number in \(0, 16\]|expansion=.*finite"):
        PreProjConfig(expansion=expansion)


@pytest.mark.parametrize("rank", [33, 10**12])
def test_a_skip_rank_above_the_width_is_refused_before_any_allocation(rank):
    base = tiny_neox()  # width 32
    before = snapshot(base)
    with pytest.raises(ValueError, match=rf"skip_rank={rank} at hidden size 32; allowed: 1\.\.32"):
        mmpreproj.inject(base, PreProjConfig(skip_rank=rank))
    assert_unchanged(base, before)
    with pytest.raises(ValueError, match=rf"skip_rank={rank} at hidden size 32; allowed: 1\.\.32"):
        get_peft_model(tiny_neox(), PreProjConfig(skip_rank=rank))
    mmpreproj.inject(tiny_neox(), PreProjConfig(skip_rank=32))  # the top of the range


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("skip_rank", 10**12, r"skip_rank=1000000000000 at hidden size 32; allowed: 1\.\.32"),
        ("expansion", 1e9, r"expansion=1000000000\.0; must be a finite number in \(0, 16\]"),
    ],
)
def test_sizes_out_of_range_in_a_file_are_refused_by_every_loader(tmp_path, field, value, match):
    _trained().save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "adapter_config.json").read_text())
    cfg[field] = value
    (tmp_path / "adapter_config.json").write_text(json.dumps(cfg))
    for load in LOADERS.values():
        with pytest.raises(ValueError, match=match):
            load(tmp_path)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [(["train", "--expansion", "1e9"], "--expansion"), (["sweep", "--expansion", "17"], "--expansion")],
)
def test_sizes_out_of_range_on_the_command_line_are_refused_naming_the_range(argv, flag, capsys, tmp_path):
    from mmpreproj_cli.command import main

    code = main([*argv, "--out", str(tmp_path / "never")])
    err = capsys.readouterr().err.strip().splitlines()  # refused before the offline line: the only line
    assert code == 1 and len(err) == 1 and flag in err[0] and "(0, 16]" in err[0], err
    assert not (tmp_path / "never").exists()


# -- one digest, every writer ------------------------------------------------------------------------------------
def test_save_adapter_records_the_digest_so_a_peft_save_cut_short_over_it_is_refused(tmp_path, monkeypatch):
    first, second = _trained(), _trained(skip_init_std=0.5)
    with torch.no_grad():
        for p in second.parameters():
            if p.requires_grad:
                p.mul_(2)
    mmpreproj.save_adapter(first, tmp_path)
    assert json.loads((tmp_path / "adapter_config.json").read_text())["injection"]["weights_digest"].startswith(
        "blake2b-named:"
    )
    with monkeypatch.context() as m:  # killed between the weights and the config
        m.setattr(PreProjConfig, "save_pretrained", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):
            second.save_pretrained(tmp_path)
    for load in (lambda b: PeftModel.from_pretrained(b, str(tmp_path)), lambda b: mmpreproj.load_adapter(b, tmp_path)):
        base = tiny_neox()
        before = snapshot(base)
        with pytest.raises(ValueError, match="does not hold the weights"):
            load(base)
        assert_unchanged(base, before)


def test_a_folder_with_the_older_values_only_digest_still_loads(tmp_path):
    model = _trained()
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "adapter_config.json").read_text())
    cfg["injection"]["weights_digest"] = digest_mod.values_digest(
        load_file(str(tmp_path / "adapter_model.safetensors"))
    )
    (tmp_path / "adapter_config.json").write_text(json.dumps(cfg))
    for name, load in LOADERS.items():
        assert torch.equal(_logits(load(tmp_path), X), _logits(model, X)), name


def test_a_folder_without_a_digest_loads_and_says_why_once(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(digest_mod, "_said_no_digest", False)
    model = _trained()
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "adapter_config.json").read_text())
    del cfg["injection"]["weights_digest"]
    (tmp_path / "adapter_config.json").write_text(json.dumps(cfg))
    with caplog.at_level(logging.WARNING, logger="mmpreproj.method.file_check"):
        for load in (_load_peft, _load_ours, _load_peft):
            assert torch.equal(_logits(load(tmp_path), X), _logits(model, X))
    said = [r for r in caplog.records if "records no injection.weights_digest" in r.getMessage()]
    assert len(said) == 1
