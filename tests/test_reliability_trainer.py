"""The trainer loses nothing: a last good checkpoint holds finite weights whose own loss was finite, every
input is checked before anything on disk changes, --resume never deletes, --overwrite clears the old run
only once the new one has started, one process per run folder, and a checkpoint write killed or failing
keeps the previous one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmpreproj.data import DataUnavailableError
from mmpreproj.train import NonFiniteLossError, TrainConfig, load_checkpoint, train
from mmpreproj.train.checkpoint import save_checkpoint
from mmpreproj.train.errors import CheckpointWriteError
from mmpreproj.train.runlock import RUN_LOCK_NAME, RunInUseError
from tests.helpers.procs import HANG_GUARD_S
from tests.helpers.training import DATA, byte_tokenizer, run_config, trainable
from tests.helpers.zoo import tiny_neox

REPO = Path(__file__).resolve().parents[1]


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (relative path -> bytes), to prove nothing changed."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A completed run (checkpoint at the last step) trained from a local text file."""
    root = tmp_path_factory.mktemp("finished")
    text = root / "train.txt"
    text.write_text("".join(f" line {i} " + "word " * (12 + i) + "\n" for i in range(12)))
    out = root / "run"
    train(
        run_config(out, data=str(text), data_config=None, max_len=48, steps=2, save_every=1),
        tiny_neox(vocab_size=257),
        byte_tokenizer(),
    )
    return out


def _copy_run(finished_run: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(finished_run, tmp_path / "run"))


def _cfg_of(run: Path, **kw) -> TrainConfig:
    return TrainConfig.from_json(run / "train_config.json").replace(out=str(run), **kw)


# --- learning rates and the last good checkpoint ---------------------------------------------------------


@pytest.mark.parametrize("lr", [float("inf"), float("nan"), 0.0, -1e-3])
def test_a_learning_rate_that_is_not_finite_and_positive_is_refused_before_any_work(tmp_path, lr):
    with pytest.raises(ValueError, match=r"TrainConfig.lr=(inf|nan|0.0|-0.001)( \(float\))?; must be a finite number"):
        run_config(tmp_path / "run", lr=lr)
    assert not (tmp_path / "run").exists()


class _PoisonAt3(torch.optim.AdamW):
    """AdamW whose third step turns every weight to inf (a diverged update)."""

    calls = 0

    def step(self, closure=None):
        type(self).calls += 1
        out = super().step(closure)
        if type(self).calls == 3:
            with torch.no_grad():
                for group in self.param_groups:
                    for p in group["params"]:
                        p.fill_(float("inf"))
        return out


def test_last_good_checkpoint_holds_finite_weights_and_resumes_bit_identical(tmp_path, monkeypatch):
    cfg = run_config(tmp_path / "b", steps=5, grad_accum=1, save_every=1)
    straight = train(cfg.replace(out=str(tmp_path / "a")), tiny_neox(), examples=DATA)
    monkeypatch.setattr(torch.optim, "AdamW", _PoisonAt3)
    with pytest.raises(NonFiniteLossError, match="loss is nan at step 4") as err:
        train(cfg, tiny_neox(), examples=DATA)
    monkeypatch.undo()
    kept = load_checkpoint(tmp_path / "b" / "checkpoint.pt")
    assert kept["step"] == 2  # not step 3's inf weights
    assert err.value.checkpoint == str(tmp_path / "b" / "checkpoint.pt")
    assert all(torch.isfinite(t).all() for t in kept["trainable"].values())
    resumed = train(cfg.replace(resume=True), tiny_neox(), examples=DATA)
    assert (resumed.steps, resumed.metrics["resumed_from"]) == (5, 2)
    want, got = trainable(straight.model), trainable(resumed.model)
    assert all(torch.equal(want[n], got[n]) for n in want)


def test_diverging_lr_never_writes_a_checkpoint_that_cannot_resume(tmp_path):
    cfg = run_config(tmp_path, lr=1e6, warmup_steps=0, steps=4, grad_accum=1, save_every=1)
    with pytest.raises(NonFiniteLossError, match=r"loss is nan at step 2.*\(no checkpoint was written yet\)"):
        train(cfg, tiny_neox(), examples=DATA)
    assert not (tmp_path / "checkpoint.pt").exists()  # step 1's weights diverged: their own loss was nan


def test_the_final_checkpoint_is_probed_too(tmp_path, monkeypatch):
    monkeypatch.setattr(_PoisonAt3, "calls", 0)
    monkeypatch.setattr(torch.optim, "AdamW", _PoisonAt3)
    with pytest.raises(NonFiniteLossError, match="loss is nan at step 4"):  # the probe of step 3's weights
        train(run_config(tmp_path, steps=3, grad_accum=1, save_every=3), tiny_neox(), examples=DATA)
    assert not (tmp_path / "checkpoint.pt").exists() and not (tmp_path / "adapter").exists()


# --- nothing on disk changes before every input is checked ----------------------------------------------


def test_resume_with_a_typo_in_data_changes_nothing(finished_run, tmp_path):
    run = _copy_run(finished_run, tmp_path)
    before = _files(run)
    with pytest.raises(ValueError, match="cannot resume .*the config changed \\(data: .*typo.txt'\\)"):
        train(
            _cfg_of(run, resume=True, data=str(tmp_path / "typo.txt")),
            tiny_neox(vocab_size=257),
            byte_tokenizer(),
        )
    assert _files(run) == before


def test_resume_when_the_data_file_is_gone_changes_nothing(tmp_path):
    text = tmp_path / "train.txt"
    text.write_text("".join(f" line {i} " + "word " * 12 + "\n" for i in range(8)))
    run = tmp_path / "run"
    cfg = run_config(run, data=str(text), data_config=None, max_len=32, steps=1, save_every=1)
    train(cfg, tiny_neox(vocab_size=257), byte_tokenizer())
    text.unlink()
    before = _files(run)
    with pytest.raises(DataUnavailableError, match="data file not found: .*train.txt"):
        train(cfg.replace(resume=True), tiny_neox(vocab_size=257), byte_tokenizer())
    assert _files(run) == before


def test_resume_of_a_run_without_checkpoint_refuses_and_deletes_nothing(tmp_path):
    out = tmp_path / "run"
    train(run_config(out, steps=1), tiny_neox(), examples=DATA)  # save_every=0: no checkpoint
    before = _files(out)
    with pytest.raises(FileExistsError, match="holds a run .* but no checkpoint.pt .*nothing was changed"):
        train(run_config(out, steps=1, resume=True), tiny_neox(), examples=DATA)
    assert _files(out) == before


def test_overwrite_keeps_the_old_run_until_the_new_one_has_started(finished_run, tmp_path):
    run = _copy_run(finished_run, tmp_path)
    before = _files(run)
    with pytest.raises(DataUnavailableError, match="typo.txt"):
        train(
            _cfg_of(run, overwrite=True, data=str(tmp_path / "typo.txt")),
            tiny_neox(vocab_size=257),
            byte_tokenizer(),
        )
    with pytest.raises(ValueError, match="no attention layer"):  # fails in apply_method
        train(_cfg_of(run, overwrite=True), torch.nn.Sequential(torch.nn.Linear(4, 4)), byte_tokenizer())
    assert _files(run) == before
    result = train(
        _cfg_of(run, overwrite=True, steps=1, warmup_steps=0, save_every=0),
        tiny_neox(vocab_size=257),
        byte_tokenizer(),
    )
    assert result.steps == 1 and not (run / "checkpoint.pt").exists()  # the old run's checkpoint is gone
    assert [json.loads(x)["step"] for x in (run / "log.jsonl").read_text().splitlines()] == [1]


def test_non_utf8_data_file_is_named_and_nothing_is_written(tmp_path):
    data = tmp_path / "latin1.txt"
    data.write_bytes(("word " * 20 + "\n").encode() * 3 + "caf\xe9 ".encode("latin-1") * 20 + b"\n")
    with pytest.raises(DataUnavailableError, match=r"data file .*latin1.txt is not UTF-8 text \(byte b'\\xe9'"):
        train(
            run_config(tmp_path / "run", data=str(data), data_config=None, max_len=32),
            tiny_neox(vocab_size=257),
            byte_tokenizer(),
        )
    assert not (tmp_path / "run").exists()


def test_out_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError, match="run folder .*f is a file"):
        train(run_config(tmp_path / "f"), tiny_neox(), examples=DATA)


# --- one process per run folder ------------------------------------------------------------------------

HOLDER = """
import sys, time
from mmpreproj.train.runlock import run_lock
with run_lock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(120)
"""


def test_a_second_process_is_refused_and_a_killed_holders_lock_is_taken_over(tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out)],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunInUseError, match=f"in use by process {holder.pid} .*{RUN_LOCK_NAME}"):
            train(run_config(out, steps=1), tiny_neox(), examples=DATA)
        assert sorted(p.name for p in out.iterdir()) == [RUN_LOCK_NAME]  # nothing written
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert train(run_config(out, steps=1), tiny_neox(), examples=DATA).steps == 1  # stale lock: its process is gone
    assert not (out / RUN_LOCK_NAME).exists()  # released at the end


# --- checkpoint writes that fail or are killed ---------------------------------------------------------


def test_a_failed_checkpoint_write_names_the_file_and_why(tmp_path, monkeypatch):
    save_checkpoint(tmp_path / "checkpoint.pt", {"step": 1})

    def full_disk(obj, f):
        Path(f).write_bytes(b"partial")
        raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(
        CheckpointWriteError,
        match=r"cannot write checkpoint .*checkpoint.pt: RuntimeError: "
        r"PytorchStreamWriter failed writing file .*previous checkpoint",
    ):
        save_checkpoint(tmp_path / "checkpoint.pt", {"step": 2})
    monkeypatch.undo()
    assert load_checkpoint(tmp_path / "checkpoint.pt")["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]


KILLER = """
import os, signal, sys, torch
from mmpreproj.train import checkpoint

path, point = sys.argv[1], sys.argv[2]
real_save, real_replace = torch.save, os.replace

def half_then_kill(obj, f):
    real_save(obj, f)
    with open(f, "r+b") as fh:
        fh.truncate(os.path.getsize(f) // 2)
    os.kill(os.getpid(), signal.SIGKILL)

def kill_before_rename(src, dst):
    os.kill(os.getpid(), signal.SIGKILL)

if point == "mid-write":
    torch.save = half_then_kill
else:
    os.replace = kill_before_rename
checkpoint.save_checkpoint(path, {"step": 2, "trainable": {"w": torch.ones(1000)}})
print("finished")
"""


@pytest.mark.slow
def test_sigkill_during_a_checkpoint_write_keeps_the_previous_one(tmp_path):
    procs = {}
    for point in ("mid-write", "before-rename"):
        (tmp_path / point).mkdir()
        save_checkpoint(tmp_path / point / "checkpoint.pt", {"step": 1, "trainable": {"w": torch.zeros(1000)}})
        procs[point] = subprocess.Popen(
            [sys.executable, "-c", KILLER, str(tmp_path / point / "checkpoint.pt"), point],
            stdout=subprocess.PIPE,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
        )
    for point, proc in procs.items():
        out, _ = proc.communicate(timeout=HANG_GUARD_S)
        assert proc.returncode == -signal.SIGKILL and b"finished" not in out, point
        folder = tmp_path / point
        kept = load_checkpoint(folder / "checkpoint.pt")
        assert kept["step"] == 1 and torch.equal(kept["trainable"]["w"], torch.zeros(1000))
        assert len(list(folder.glob(".checkpoint.pt.*.tmp"))) == 1  # the killed write's temp file ...
        save_checkpoint(folder / "checkpoint.pt", {"step": 3})  # ... is removed by the next save
        assert sorted(p.name for p in folder.iterdir()) == ["checkpoint.pt"]
