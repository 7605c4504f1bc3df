"""Files as users expect them: every file the library writes has the mode the user's umask gives (0644 under
022, 0600 under 077), no lock file is left in an adapter folder, a checkpoint or an upload, a symlink never
makes a writer create a file elsewhere, a commit marker cannot name a file outside its folder, and the model
card's YAML header holds exactly the keys it was written with, whatever the base model is called."""

from __future__ import annotations

import ast
import json
import os
import stat
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import mmpreproj
from mmpreproj.method.files import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, read_adapter
from mmpreproj.modules import Block
from mmpreproj.rope import RoPE1D
from mmpreproj.train import LMExamples, TrainConfig, train
from mmpreproj.train.checkpoint import save_checkpoint
from mmpreproj.train.runlock import RUN_LOCK_NAME, RunInUseError, run_lock
from mmpreproj.train.runlog import StepLog, write_json
from mmpreproj.util import file_sets as adapter_files
from mmpreproj.util.io import atomic_write, new_file_mode, umask
from tests.helpers.procs import HANG_GUARD_S
from tests.helpers.zoo import tiny_neox

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


# ---- 1. modes -------------------------------------------------------------------------------------------


def test_the_umask_is_read_without_changing_it(user_umask):
    assert umask() == user_umask and new_file_mode() == 0o666 & ~user_umask
    assert os.umask(user_umask) == user_umask  # still what the test set


def test_save_adapter_files_and_the_model_card_get_the_umask_mode(tmp_path, user_umask):
    folder = mmpreproj.save_adapter(_blocks(), tmp_path / "a", readme=True)
    assert sorted(_modes(folder)) == sorted([ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, "README.md"])
    _assert_umask_modes(folder, user_umask)
    mmpreproj.save_adapter(_blocks(seed=1), folder, readme=True)  # replacing keeps the mode
    _assert_umask_modes(folder, user_umask)


def test_save_pretrained_adapter_files_get_the_umask_mode(tmp_path, user_umask):
    model = mmpreproj.inject(tiny_neox(), mmpreproj.PreProjConfig(skip_init_std=0.05))
    mmpreproj.save_pretrained(model, tmp_path / "full")
    _assert_umask_modes(tmp_path / "full" / "adapter", user_umask)
    _assert_umask_modes(tmp_path / "full", user_umask)  # the base too (transformers writes its safetensors 0600)
    mmpreproj.save_pretrained(model, tmp_path / "only", adapter_only=True)
    _assert_umask_modes(tmp_path / "only", user_umask)


def test_checkpoints_run_files_and_atomic_writes_get_the_umask_mode(tmp_path, user_umask):
    save_checkpoint(tmp_path / "run" / "checkpoint.pt", {"step": 1, "weights": {"w": torch.zeros(2)}})
    write_json(tmp_path / "run" / "metrics.json", {"steps": 1})
    log = StepLog(tmp_path / "run" / "log.jsonl")
    log.write({"step": 1, "loss": 1.0})
    log.write({"step": 2, "loss": 0.5})
    log.truncate_after(1)  # rewritten atomically
    atomic_write(tmp_path / "run" / "blob.bin", lambda f: Path(f).write_bytes(b"x"))
    _assert_umask_modes(tmp_path / "run", user_umask)


def test_the_run_lock_gets_the_umask_mode(tmp_path, user_umask):
    with run_lock(tmp_path / "run") as lock:
        assert oct(stat.S_IMODE(lock.stat().st_mode)) == oct(0o666 & ~user_umask)


@pytest.mark.parametrize("user_umask", [0o022, 0o077], indirect=True, ids=["umask022", "umask077"])
def test_every_file_of_a_training_run_gets_the_umask_mode(tmp_path, user_umask):
    cfg = TrainConfig(
        method="preproj_skip",
        model="tiny",
        steps=2,
        warmup_steps=0,
        lr=1e-3,
        batch_size=2,
        grad_accum=1,
        precision="fp32",
        gradient_checkpointing=False,
        save_every=1,
        progress=False,
        out=str(tmp_path / "run"),
        device="cpu",
    )
    train(cfg, tiny_neox(), examples=LMExamples.random(8, 12, 128, seed=0))
    assert {"adapter/adapter_model.safetensors", "checkpoint.pt", "log.jsonl", "metrics.json"} <= set(
        _modes(tmp_path / "run")
    )
    _assert_umask_modes(tmp_path / "run", user_umask)


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("user_umask", [0o022], indirect=True, ids=["umask022"])
def test_peft_weights_beside_ours_get_the_umask_mode(tmp_path, user_umask):
    pytest.importorskip("peft")
    from mmpreproj.train import apply_method
    from mmpreproj.train.adapters import save_run_adapter

    model = apply_method(tiny_neox(), "preproj_lora")
    save_run_adapter(model, "preproj_lora", tmp_path / "run" / "adapter")  # peft's LoRA in adapter/, ours below
    written = set(_modes(tmp_path / "run"))
    assert {f"adapter/{ADAPTER_WEIGHTS_NAME}", f"adapter/preproj/{ADAPTER_WEIGHTS_NAME}"} <= written
    _assert_umask_modes(tmp_path / "run", user_umask)


# ---- 2. locks -------------------------------------------------------------------------------------------


@pytest.fixture
def outside_lock(tmp_path, monkeypatch):
    """Folders cannot be locked (as on NFS): the lock file outside the folder is used; the temp folder is
    the test's own. Yields the lock folder it will use."""
    monkeypatch.setattr(adapter_files, "_folder_lock", lambda folder, fcntl: None)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    return tmp_path / "tmp" / f"mmpreproj-locks-{os.getuid()}"


@pytest.fixture(params=["folder", "outside"])
def lock_kind(request):
    if request.param == "outside":
        return request.getfixturevalue("outside_lock")
    return None


def test_no_lock_file_is_left_in_adapter_folders_or_checkpoints(tmp_path, lock_kind):
    folder = tmp_path / "a"
    for seed in range(2):
        mmpreproj.save_adapter(_blocks(seed), folder)
    read_adapter(folder)
    assert sorted(p.name for p in folder.iterdir()) == sorted([ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME])
    model = mmpreproj.inject(tiny_neox(), mmpreproj.PreProjConfig())
    mmpreproj.save_pretrained(model, tmp_path / "full")
    assert not list((tmp_path / "full").rglob("*.lock")) and not list((tmp_path / "full").rglob(".mmpreproj*"))
    if lock_kind is not None:  # the outside lock folder is private to this user
        assert stat.S_IMODE(lock_kind.stat().st_mode) == 0o700 and list(lock_kind.iterdir())


def test_two_writers_of_one_folder_exclude_each_other(tmp_path, lock_kind):
    folder = mmpreproj.save_adapter(_blocks(), tmp_path / "a")
    os.symlink(folder, tmp_path / "link")
    done = threading.Event()

    def second_writer():
        mmpreproj.save_adapter(_blocks(seed=1), tmp_path / "link")  # the same folder by another path
        done.set()

    with adapter_files._locked(folder, writer=True) as held:
        assert held
        thread = threading.Thread(target=second_writer)
        thread.start()
        time.sleep(0.5)
        assert not done.is_set(), "a second writer wrote while the folder was locked"
    thread.join(timeout=HANG_GUARD_S)
    assert done.is_set()


def test_a_symlink_at_the_old_lock_path_creates_nothing_outside(tmp_path):
    folder = mmpreproj.save_adapter(_blocks(), tmp_path / "a")
    target = tmp_path / "outside" / "created-by-lock"
    target.parent.mkdir()
    os.symlink(target, folder / ".mmpreproj.lock")
    mmpreproj.save_adapter(_blocks(seed=1), folder)
    read_adapter(folder)
    assert not target.exists() and not target.is_symlink()


def test_a_symlink_at_the_outside_lock_path_is_refused(tmp_path, outside_lock):
    folder = mmpreproj.save_adapter(_blocks(), tmp_path / "a")
    (lock,) = outside_lock.iterdir()
    lock.unlink()
    target = tmp_path / "outside" / "created-by-lock"
    target.parent.mkdir()
    os.symlink(target, lock)
    before = (folder / ADAPTER_WEIGHTS_NAME).read_bytes()
    with pytest.raises(PermissionError, match=r"lock file .* is a symlink"):
        mmpreproj.save_adapter(_blocks(seed=1), folder)
    assert not target.exists()
    assert (folder / ADAPTER_WEIGHTS_NAME).read_bytes() == before
    read_adapter(folder)  # a reader reads without the lock


def test_a_lock_folder_another_user_could_write_is_refused(tmp_path, outside_lock):
    outside_lock.mkdir(mode=0o777)
    os.chmod(outside_lock, 0o777)
    with pytest.raises(PermissionError, match="is not a private folder of this user"):
        mmpreproj.save_adapter(_blocks(), tmp_path / "a")
    outside_lock.rmdir()
    os.symlink(tmp_path, outside_lock)
    with pytest.raises(PermissionError, match="is not a private folder of this user"):
        mmpreproj.save_adapter(_blocks(), tmp_path / "b")


@pytest.mark.parametrize("holder", ["dangling", "dead_pid"])
def test_a_symlink_at_the_run_lock_path_is_never_written_through_nor_taken_over(tmp_path, holder):
    import socket

    out = tmp_path / "run"
    out.mkdir()
    target = tmp_path / "outside.json"
    if holder == "dead_pid":  # what a stale lock of this host says: taken over if it were a plain file
        target.write_text(json.dumps({"pid": 2**22 + 12345, "host": socket.gethostname()}))
    os.symlink(target, out / RUN_LOCK_NAME)
    before = target.read_bytes() if target.exists() else None
    with pytest.raises(RunInUseError), run_lock(out):
        pass
    assert (target.read_bytes() if target.exists() else None) == before
    assert (out / RUN_LOCK_NAME).is_symlink()


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
        "library_name": "peft",
        "tags": ["mmpreproj", "peft", "preproj", "pre-projection", "content-skip"],
    }
    plain = mmpreproj.save_adapter(_blocks(name="org/plain"), tmp_path / "plain", readme=True)

    def body(text: str) -> list[str]:  # after the YAML header (the Hub's writer may fold a value over lines)
        return text.split("\n---\n", 1)[1].splitlines()

    assert len(body(card)) == len(body((plain / "README.md").read_text(encoding="utf-8")))
    # The load snippet is data too: the name is one Python string literal.
    (line,) = [x for x in card.split("\n") if x.startswith("model = mmpreproj.from_pretrained(")]
    call = ast.parse(line).body[0].value
    assert isinstance(call, ast.Call) and ast.literal_eval(call.args[0]) == name
    hub = pytest.importorskip("huggingface_hub")
    assert hub.ModelCard(card).data.to_dict()["base_model"] == name


def test_a_reader_of_a_read_only_folder_reads_the_committed_pending_files(tmp_path, monkeypatch):
    folder = mmpreproj.save_adapter(_blocks(), tmp_path / "a")
    token = "00112233445566ff"
    new = b'{"config": {"preproj": false}, "note": "new"}'
    (folder / f".{ADAPTER_CONFIG_NAME}.{token}.pending").write_bytes(new)
    (folder / adapter_files.COMMIT_MARKER).write_text(json.dumps({"token": token, "files": [ADAPTER_CONFIG_NAME]}))

    def read_only(src, dst):
        raise PermissionError(13, "Permission denied", str(src))

    monkeypatch.setattr(adapter_files.os, "replace", read_only)  # as in a folder this user cannot write
    with adapter_files.committed_files(folder, [ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME]) as paths:
        assert paths[ADAPTER_CONFIG_NAME].read_bytes() == new
        assert paths[ADAPTER_WEIGHTS_NAME] == folder / ADAPTER_WEIGHTS_NAME
    assert (folder / adapter_files.COMMIT_MARKER).exists()
