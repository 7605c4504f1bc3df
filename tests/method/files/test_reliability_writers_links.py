"""No writer writes through a link planted in the adapter folder, and none leaves a pair a loader would take
half of (issue 31).

A symlink to a file, to a folder or to nothing (dangling) outside is planted at each file a writer writes
(`README.md`, the weights, the config), into an empty folder or over an earlier complete save of other weights.
Writers: peft's `PeftModel.save_pretrained` (what a plain `Trainer` checkpoint calls) and `mmpreproj.save_adapter`.

`save_adapter` replaces every file by a rename, so a link is replaced, never followed. safetensors (peft's weights
writer) replaces a link too, and `PreProjConfig.save_pretrained` (peft's config writer) removes one first. peft
writes its model card `README.md` in place before any hook of ours sees the folder, so a link there to a file (or
to nothing: peft creates it) is followed: the test pins what that leaves (the outside file holds the card) and that
the save is then refused at the config, naming the link, so the folder is never a pair a loader takes
(`docs/troubleshooting.md`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from peft import PeftModel, get_peft_model

import mmpreproj
from mmpreproj import PreProjConfig
from tests.helpers.adapter_cases import files
from tests.helpers.zoo import tiny_neox

X = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(0))
NAMES = ("README.md", "adapter_model.safetensors", "adapter_config.json")


def _trained(seed: int) -> PeftModel:
    base = tiny_neox()  # seeds its own weights
    torch.manual_seed(seed)
    model = get_peft_model(base, PreProjConfig())
    with torch.no_grad():  # stands for training: every trainable weight moves
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 1e-2)
    return model.eval()


def _logits(model):
    with torch.no_grad():
        return model(X).logits


WRITERS = {
    "peft": lambda m, f: m.save_pretrained(f),
    "save_adapter": lambda m, f: mmpreproj.save_adapter(m, f, readme=True),
}
LOADERS = {
    "peft": lambda f: PeftModel.from_pretrained(tiny_neox(), str(f)),
    "ours": lambda f: mmpreproj.load_adapter(tiny_neox(), f),
}


def _outside(path: Path, kind: str):
    """What lies at the link's target: a folder's files, a file's bytes, or None (nothing, for a dangling link)."""
    if kind == "dir":
        return files(path)
    return path.read_bytes() if path.exists() else None


def _plant(tmp_path: Path, name: str, kind: str, earlier: bool) -> tuple[Path, Path]:
    folder = tmp_path / "adapter"
    folder.mkdir()
    if earlier:  # an earlier complete save of other weights
        _trained(seed=7).save_pretrained(folder)
    outside = tmp_path / "outside"
    if kind == "file":
        outside.write_text("precious\n")
    elif kind == "dir":
        outside.mkdir()
        (outside / "keep").write_text("kept\n")
    (folder / name).unlink(missing_ok=True)
    os.symlink(outside, folder / name)
    return folder, outside


@pytest.mark.parametrize("earlier", [False, True], ids=["empty", "over_earlier_save"])
@pytest.mark.parametrize("kind", ["file", "dir", "dangling"])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_link_in_the_folder_is_never_written_through_nor_left_as_half_a_pair(tmp_path, writer, name, kind, earlier):
    folder, outside = _plant(tmp_path, name, kind, earlier)
    outside_before = _outside(outside, kind)
    model = _trained(seed=1)
    followed = writer == "peft" and name == "README.md"
    if followed and kind != "dir":  # peft writes its card through the link: pinned, then refused at the config
        with pytest.raises(ValueError, match=r"README\.md is a symlink .* adapter_config\.json was not written"):
            WRITERS[writer](model, folder)
        assert "PEFT" in outside.read_text()  # the card peft wrote (or created) through the link: the documented gap
    elif followed:  # a link to a folder: peft's card reader fails before anything is written
        before = {n: (folder / n).read_bytes() for n in NAMES if (folder / n).is_file() and n != name}
        with pytest.raises(ValueError):
            WRITERS[writer](model, folder)
        assert {n: (folder / n).read_bytes() for n in NAMES if (folder / n).is_file() and n != name} == before
        assert files(outside) == outside_before
    else:
        WRITERS[writer](model, folder)
        assert _outside(outside, kind) == outside_before
        assert all((folder / n).is_file() and not (folder / n).is_symlink() for n in NAMES)  # the link replaced
    for load_name, load in LOADERS.items():
        if followed:  # never a pair a loader takes: no config, or the earlier config beside the new weights
            if earlier and kind != "dir":
                with pytest.raises(ValueError, match="does not hold the weights"):
                    load(folder)
            elif not earlier:
                with pytest.raises((ValueError, FileNotFoundError)):
                    load(folder)
            else:  # nothing was written: the earlier save still loads whole
                assert torch.equal(_logits(load(folder).eval()), _logits(_trained(seed=7))), load_name
        else:
            assert torch.equal(_logits(load(folder).eval()), _logits(model)), load_name


# -- `mmpreproj.save_pretrained(model, DIR)`: transformers writes the base in place, so a link at any file it
# writes (or at the `adapter/` folder) is refused before anything is written; the adapter's files replace a link
BASE_NAMES = ("config.json", "generation_config.json", "model.safetensors", "adapter")
ADAPTER_NAMES = tuple(f"adapter/{n}" for n in NAMES)


@pytest.mark.parametrize("kind", ["file", "dir", "dangling"])
@pytest.mark.parametrize("name", BASE_NAMES + ADAPTER_NAMES)
def test_save_pretrained_of_an_injected_model_never_writes_through_a_link(tmp_path, name, kind):
    folder = tmp_path / "model"
    (folder / "adapter").mkdir(parents=True)
    if name == "adapter":
        (folder / "adapter").rmdir()
    outside = tmp_path / "outside"
    if kind == "file":
        outside.write_text("precious\n")
    elif kind == "dir":
        outside.mkdir()
        (outside / "keep").write_text("kept\n")
    os.symlink(outside, folder / name)
    model = mmpreproj.inject(tiny_neox(), PreProjConfig())
    with torch.no_grad():  # stands for training: the adapter's weights move
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 1e-2)
    before_outside, before_folder = _outside(outside, kind), files(folder)
    if name in BASE_NAMES:
        with pytest.raises(ValueError, match=rf"save_pretrained: .*{name} is a symlink .*nothing was written"):
            mmpreproj.save_pretrained(model, folder)
        assert files(folder) == before_folder
    else:
        mmpreproj.save_pretrained(model, folder)
        assert not (folder / name).is_symlink()
        assert torch.equal(_logits(mmpreproj.from_pretrained(folder).eval()), _logits(model.eval()))
    assert _outside(outside, kind) == before_outside
