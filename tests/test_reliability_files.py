"""Files as users expect them: every file the library writes has the mode the user's umask gives (0644 under
022, 0600 under 077), no lock file is left in an adapter folder, a checkpoint or an upload, a symlink never
makes a writer create a file elsewhere, a commit marker cannot name a file outside its folder, and the model
card's YAML header holds exactly the keys it was written with, whatever the base model is called."""

from __future__ import annotations

import ast
import json
import os
import stat
from pathlib import Path

import mmpreproj
import pytest
import torch
from mmpreproj import adapter_files
from mmpreproj.adapter import ADAPTER_CONFIG_NAME, read_adapter
from mmpreproj.modules import Block
from mmpreproj.rope import RoPE1D
from torch import nn

UMASKS = [0o022, 0o077, 0o027]


@pytest.fixture(params=UMASKS, ids=lambda m: f"umask{m:03o}")
def user_umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _blocks(seed: int = 0, name: str | None = None) -> nn.ModuleList:
    torch.manual_seed(seed)
    blocks = nn.ModuleList(Block(32, 4, rope=RoPE1D(8)) for _ in range(2))
    if name is not None:
        blocks.name_or_path = name  # what transformers records as the base's hub id or folder
    return mmpreproj.inject(blocks, mmpreproj.PreProjConfig(skip_init_std=0.05))


def _modes(folder: Path) -> dict[str, str]:
    """{relative path: octal mode} of every file under `folder`."""
    return {
        str(p.relative_to(folder)): oct(stat.S_IMODE(p.lstat().st_mode))
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _assert_umask_modes(folder: Path, mask: int) -> None:
    modes = _modes(folder)
    assert modes, f"nothing written in {folder}"
    want = oct(0o666 & ~mask)
    assert modes == dict.fromkeys(modes, want), f"umask {mask:03o}: want {want} everywhere, got {modes}"


# ---- 3. the commit marker -------------------------------------------------------------------------------


BAD_TOKENS = ["../../x", "/tmp/x", "a/b", "x/../../evil", "0123456789ABCDEF", "0123", "", 7, None]


@pytest.mark.parametrize("token", BAD_TOKENS, ids=repr)
def test_a_marker_token_that_could_name_another_path_is_refused(tmp_path, token):
    folder = mmpreproj.save_adapter(_blocks(), tmp_path / "work" / "a")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    # What a crafted folder holds so that ".NAME.TOKEN.pending" reaches a file two levels up.
    (folder / f".{ADAPTER_CONFIG_NAME}.x").mkdir()
    outside = tmp_path / "evil.pending"
    outside.write_text('{"config": {}}')
    marker = folder / adapter_files.COMMIT_MARKER
    marker.write_text(json.dumps({"token": token, "files": [ADAPTER_CONFIG_NAME]}))
    pattern = rf"corrupt commit marker .*{adapter_files.COMMIT_MARKER}: token must be 16 hex digits"
    with pytest.raises(ValueError, match=pattern):
        read_adapter(folder)
    with pytest.raises(ValueError, match=pattern):
        mmpreproj.save_adapter(_blocks(seed=1), folder)
    assert outside.read_text() == '{"config": {}}' and marker.exists()
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p != marker} == before


@pytest.mark.parametrize("names", [["../x"], ["/tmp/x"], ["a/b"], [".."], ["a\0b"], "adapter_config.json", [3]])
def test_a_marker_naming_files_outside_the_folder_is_refused(tmp_path, names):
    folder = mmpreproj.save_adapter(_blocks(), tmp_path / "a")
    (folder / adapter_files.COMMIT_MARKER).write_text(json.dumps({"token": "0123456789abcdef", "files": names}))
    with pytest.raises(ValueError, match="corrupt commit marker .*files must be a list of plain file names"):
        read_adapter(folder)


def test_a_good_marker_still_rolls_forward(tmp_path):
    folder = mmpreproj.save_adapter(_blocks(), tmp_path / "a")
    token = "00112233445566ff"
    new = b'{"config": {"preproj": false}, "note": "new"}'
    (folder / f".{ADAPTER_CONFIG_NAME}.{token}.pending").write_bytes(new)
    (folder / adapter_files.COMMIT_MARKER).write_text(json.dumps({"token": token, "files": [ADAPTER_CONFIG_NAME]}))
    with adapter_files.committed_files(folder, [ADAPTER_CONFIG_NAME]) as paths:
        assert paths[ADAPTER_CONFIG_NAME].read_bytes() == new
    assert not (folder / adapter_files.COMMIT_MARKER).exists()


# ---- 4. the model card ----------------------------------------------------------------------------------


EVIL_NAMES = [
    "evil\n---\nfoo: bar",
    "org/model: v2 # not a comment",
    "- a\n- b",
    "x\u2028---\u2028foo: bar\x85y",
    '"); import os; os.system("x"); ("',
    "emoji \U0001f600 and é",
    "{a: 1}",
    "---",
]


def _header(card: str) -> dict:
    yaml = pytest.importorskip("yaml")
    lines = card.split("\n")
    assert lines[0] == "---"
    return yaml.safe_load("\n".join(lines[1 : lines.index("---", 1)]))


@pytest.mark.parametrize("name", EVIL_NAMES, ids=repr)
def test_the_model_card_header_holds_exactly_its_keys_whatever_the_base_is_called(tmp_path, name):
    folder = mmpreproj.save_adapter(_blocks(name=name), tmp_path / "a", readme=True)
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert _header(card) == {
        "base_model": name,
        "library_name": "mmpreproj",
        "tags": ["mmpreproj", "pre-projection", "content-skip"],
    }
    plain = mmpreproj.save_adapter(_blocks(name="org/plain"), tmp_path / "plain", readme=True)
    assert len(card.splitlines()) == len((plain / "README.md").read_text(encoding="utf-8").splitlines())
    # The load snippet is data too: the name is one Python string literal.
    (line,) = [x for x in card.split("\n") if x.startswith("model = mmpreproj.from_pretrained(")]
    call = ast.parse(line).body[0].value
    assert isinstance(call, ast.Call) and ast.literal_eval(call.args[0]) == name
    hub = pytest.importorskip("huggingface_hub")
    assert hub.ModelCard(card).data.to_dict()["base_model"] == name
