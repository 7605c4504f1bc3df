"""The adapter folder's two files are replaced together: a process SIGKILLed at any point of `save_adapter`
leaves a folder whose reader sees the complete old pair or the complete new pair, and the temp files that
killed writers leave are removed by the next save."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import mmpreproj
from mmpreproj.method.files import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, read_adapter
from mmpreproj.modules import Block
from mmpreproj.rope import RoPE1D
from mmpreproj.util import file_sets as adapter_files
from tests.helpers.procs import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[3]

# The child builds the same base blocks, injects skip only and saves over a pre-projection + skip adapter,
# killing itself with SIGKILL when the write reaches POINT.
CHILD = """
import os, signal, sys, torch
from torch import nn
import mmpreproj
from mmpreproj.util import file_sets as adapter_files
from mmpreproj.modules import Block
from mmpreproj.rope import RoPE1D

folder, point = sys.argv[1], sys.argv[2]

def fault(at):
    if at == point:
        os.kill(os.getpid(), signal.SIGKILL)

adapter_files._fault_point = fault
torch.manual_seed(0)
blocks = nn.ModuleList(Block(32, 4, rope=RoPE1D(8)) for _ in range(2))
mmpreproj.inject(blocks, mmpreproj.PreProjConfig(preproj=False, skip_init_std=0.5))
mmpreproj.save_adapter(blocks, folder)
print("finished")
"""

BEFORE_COMMIT = [f"written:{ADAPTER_WEIGHTS_NAME}", f"written:{ADAPTER_CONFIG_NAME}"]
AFTER_COMMIT = ["committed", f"renamed:{ADAPTER_WEIGHTS_NAME}", f"renamed:{ADAPTER_CONFIG_NAME}"]


def _blocks(seed=0):
    torch.manual_seed(seed)
    return nn.ModuleList(Block(32, 4, rope=RoPE1D(8)) for _ in range(2))


def _old_adapter(folder: Path) -> Path:
    blocks = mmpreproj.inject(_blocks(), mmpreproj.PreProjConfig(skip_init_std=0.05))
    return mmpreproj.save_adapter(blocks, folder)


def _kill_children(tmp_path: Path, points: list[str]) -> dict[str, Path]:
    """Run one child per point at once (each on its own copy of the old adapter); all must die by SIGKILL."""
    old = _old_adapter(tmp_path / "old")
    folders, procs = {}, {}
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for i, point in enumerate(points):
        folders[point] = tmp_path / f"kill{i}"
        shutil.copytree(old, folders[point])
        procs[point] = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(folders[point]), point],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    for point, proc in procs.items():
        out, err = proc.communicate(timeout=HANG_GUARD_S)
        assert proc.returncode == -signal.SIGKILL, (point, proc.returncode, out, err.decode()[-2000:])
        assert b"finished" not in out
    return folders


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> dict[str, Path]:
    """{point: folder a child was killed in}; tests copy a folder before changing it."""
    return _kill_children(tmp_path_factory.mktemp("killed"), BEFORE_COMMIT + AFTER_COMMIT)


def _copy(killed: dict[str, Path], point: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(killed[point], tmp_path / "copy"))


def _is_complete(desc: dict, tensors: dict, preproj: bool) -> bool:
    slots = {k.split(".")[2] for k in tensors}  # the wrapper's slots (adapter_layer_names) holding weights
    return desc["config"]["preproj"] is preproj and slots == (
        {"preproj", "preproj_skip"} if preproj else {"preproj_skip"}
    )


@pytest.mark.slow  # the `killed` fixture starts and SIGKILLs subprocesses
def test_sigkill_at_every_point_leaves_the_old_or_the_new_pair(killed, tmp_path):
    for i, point in enumerate(killed):
        folder = Path(shutil.copytree(killed[point], tmp_path / str(i)))
        desc, tensors = read_adapter(folder)  # rolls a committed write forward
        new = point in AFTER_COMMIT
        assert _is_complete(desc, tensors, preproj=not new), point
        assert not (folder / adapter_files.COMMIT_MARKER).exists()
        loaded = mmpreproj.load_adapter(_blocks(seed=0), folder)  # the pair loads
        assert (mmpreproj.injected_modules(loaded)[0].slots()[0] is None) is new


@pytest.mark.slow  # the `killed` fixture starts and SIGKILLs subprocesses
def test_next_save_removes_what_killed_writers_left(killed, tmp_path):
    folder = _copy(killed, BEFORE_COMMIT[1], tmp_path)  # both pending files written, never committed
    assert len(list(folder.glob(".*.pending"))) == 2
    (folder / f".{ADAPTER_WEIGHTS_NAME}.abc123.tmp").write_bytes(b"x" * 100)  # an old-style killed temp
    blocks = mmpreproj.inject(_blocks(), mmpreproj.PreProjConfig(preproj=False))
    for _ in range(3):
        mmpreproj.save_adapter(blocks, folder)
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted([ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME])  # no lock file either


@pytest.mark.slow  # the `killed` fixture starts and SIGKILLs subprocesses
def test_a_reader_that_cannot_roll_forward_reads_the_committed_pending_pair(killed, tmp_path, monkeypatch):
    folder = _copy(killed, f"renamed:{ADAPTER_WEIGHTS_NAME}", tmp_path)  # new weights, old config in place
    assert (folder / adapter_files.COMMIT_MARKER).exists()

    def no_lock(folder, *, writer):
        from contextlib import nullcontext

        return nullcontext(False)  # as in a read-only folder

    monkeypatch.setattr(adapter_files, "_locked", no_lock)
    desc, tensors = read_adapter(folder)
    assert _is_complete(desc, tensors, preproj=False)
    assert (folder / adapter_files.COMMIT_MARKER).exists()  # nothing was changed on disk


def test_corrupt_commit_marker_is_named(tmp_path):
    folder = _old_adapter(tmp_path / "a")
    (folder / adapter_files.COMMIT_MARKER).write_text('{"token": 3}')
    with pytest.raises(ValueError, match=r"corrupt commit marker .*\.mmpreproj-commit\.json"):
        read_adapter(folder)


def test_a_failing_writer_leaves_the_old_pair_and_no_pending_files(tmp_path, monkeypatch):
    folder = _old_adapter(tmp_path / "a")
    before = {n: (folder / n).read_bytes() for n in (ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME)}

    def fail(at):
        if at == f"written:{ADAPTER_WEIGHTS_NAME}":
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(adapter_files, "_fault_point", fail)
    blocks = mmpreproj.inject(_blocks(), mmpreproj.PreProjConfig(preproj=False))
    with pytest.raises(OSError, match="No space left"):
        mmpreproj.save_adapter(blocks, folder)
    assert {n: (folder / n).read_bytes() for n in before} == before
    assert not list(folder.glob(".*.pending"))


def test_reading_never_adds_files(tmp_path):
    old = _old_adapter(tmp_path / "a")
    plain = tmp_path / "plain"  # an adapter folder as an older version (or a copy tool) left it: no lock file
    plain.mkdir()
    for name in (ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME):
        shutil.copy(old / name, plain / name)
    read_adapter(plain)
    mmpreproj.load_adapter(_blocks(), plain)
    assert sorted(p.name for p in plain.iterdir()) == sorted([ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME])
