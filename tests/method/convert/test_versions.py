"""Versions: every adapter records the library version and the file format that wrote it; a newer format
than this library reads is refused, naming both library versions (CHANGELOG.md, "Versions")."""

from __future__ import annotations

import json
import re
from pathlib import Path

import peft
import pytest
import torch

import mmpreproj
from mmpreproj import PreProjConfig
from mmpreproj.method.config import ADAPTER_FORMAT
from tests.helpers.snapshots import assert_unchanged, snapshot
from tests.helpers.zoo import tiny_neox

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def saved(tmp_path):
    model = mmpreproj.inject(tiny_neox(), PreProjConfig())
    return mmpreproj.save_adapter(model, tmp_path / "adapter")


def _rewrite(path: Path, **fields) -> None:
    cfg = path / "adapter_config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), **fields}))


def test_adapter_records_library_version_and_format(saved):
    cfg = json.loads((saved / "adapter_config.json").read_text())
    assert cfg["library_version"] == mmpreproj.__version__
    assert cfg["format_version"] == ADAPTER_FORMAT
    assert cfg["peft_type"] == "PREPROJ"


def test_a_peft_saved_adapter_records_them_too(tmp_path):
    model = peft.get_peft_model(tiny_neox(), PreProjConfig())
    model.save_pretrained(tmp_path / "p")
    cfg = json.loads((tmp_path / "p" / "adapter_config.json").read_text())
    assert (cfg["library_version"], cfg["format_version"]) == (mmpreproj.__version__, ADAPTER_FORMAT)


def test_newer_format_refused_with_both_versions_named(saved):
    _rewrite(saved, format_version=ADAPTER_FORMAT + 1, library_version="9.1.0")
    model = tiny_neox()
    before = snapshot(model)
    loaders = [
        lambda: mmpreproj.load_adapter(model, saved),
        lambda: PreProjConfig.from_pretrained(str(saved)),
        lambda: peft.PeftModel.from_pretrained(model, str(saved)),
    ]
    for load in loaders:
        with pytest.raises(ValueError) as err:
            load()
        msg = str(err.value)
        assert "mmpreproj 9.1.0" in msg and f"format {ADAPTER_FORMAT + 1}" in msg, msg
        assert f"mmpreproj {mmpreproj.__version__}" in msg, msg
    assert_unchanged(model, before)


def test_older_and_current_formats_load(saved, tokens):
    model = mmpreproj.load_adapter(tiny_neox(), saved)  # current format
    assert mmpreproj.is_injected(model)
    cfg = json.loads((saved / "adapter_config.json").read_text())
    del cfg["format_version"]  # written before the field existed: read as it was
    (saved / "adapter_config.json").write_text(json.dumps(cfg))
    again = mmpreproj.load_adapter(tiny_neox(), saved)
    torch.testing.assert_close(again(tokens).logits, model(tokens).logits, rtol=0, atol=0)


def test_from_dict_refuses_newer_format():
    d = PreProjConfig().to_dict() | {"format_version": ADAPTER_FORMAT + 5, "library_version": "7.0.0"}
    with pytest.raises(ValueError, match=r"mmpreproj 7\.0\.0 in adapter format"):
        PreProjConfig.from_dict(d)


def test_version_is_past_the_unversioned_formats_and_in_the_changelog():
    """The code calls the pre-peft layout 'mmpreproj <= 0.3', so this release is above it, and CHANGELOG.md
    has a section for it."""
    major, minor, _ = (int(x) for x in mmpreproj.__version__.split("."))
    assert (major, minor) > (0, 3)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[?{re.escape(mmpreproj.__version__)}\]?", changelog, re.M), "no CHANGELOG section"
