"""The recipes as commands (`recipes/command.py`, `recipes/kit/recipe.parse_config`): a refusal is one line led by
the flags it concerns, no traceback, and a run refused before it wrote a file leaves no new `--out` behind (found by
the independent audit `bench/recipes_audit.py`: 48 of 99 FAIL before, most of them tracebacks)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from recipes.command import TRACEBACK_ENV, flags_named, run_main
from tests.helpers.procs import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("message", "argv", "said"),
    [
        ("Config.steps=0; must be >= 1", ["--steps", "0"], "--steps 0: Config.steps=0; must be >= 1"),
        ("need 0 <= warmup_steps < steps, got 30 / 0", ["--out", "x", "--steps", "0"], "--steps 0: need"),
        ("no .txt books in /no/books", ["--books=/no/books"], "--books /no/books: no .txt books"),
        ("method='dora'; allowed values: [...]\nmore", ["--method", "dora", "--quick"], "--method dora: method="),
        ("something else entirely", ["--steps", "3"], "something else entirely"),
    ],
)
def test_flags_named_leads_the_first_line_with_the_options_it_concerns(message, argv, said):
    out = flags_named(message, argv)
    assert out.startswith(said) and "\n" not in out


def test_run_main_says_a_refusal_in_one_line_and_takes_away_the_empty_out_it_made(tmp_path, monkeypatch, capsys):
    out, kept = tmp_path / "new", tmp_path / "kept"
    kept.mkdir()
    monkeypatch.setattr(sys, "argv", ["recipe.py", "--out", str(out), "--runs", str(kept), "--steps", "0"])
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)

    def main() -> None:
        (out / "cells" / "a").mkdir(parents=True)  # made, but no file written yet
        raise ValueError("steps=0; must be >= 1")

    with pytest.raises(SystemExit) as done:
        run_main(main)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 1 and line.startswith("recipe.py: error: --steps 0: steps=0; must be >= 1")
    assert not out.exists() and kept.is_dir()  # a folder that was there before is never touched


def test_run_main_keeps_an_out_that_holds_a_file_and_lets_a_bug_raise(tmp_path, monkeypatch):
    out = tmp_path / "new"
    monkeypatch.setattr(sys, "argv", ["recipe.py", "--out", str(out)])

    def refused() -> None:
        out.mkdir()
        (out / "log.jsonl").write_text("{}\n")
        raise FileNotFoundError("no such data")

    with pytest.raises(SystemExit):
        run_main(refused)
    assert (out / "log.jsonl").is_file()
    with pytest.raises(RuntimeError, match="a bug"):  # not a refusal: the traceback stays
        run_main(lambda: (_ for _ in ()).throw(RuntimeError("a bug")))
    monkeypatch.setenv(TRACEBACK_ENV, "1")
    with pytest.raises(ValueError, match="shown"):
        run_main(lambda: (_ for _ in ()).throw(ValueError("shown")))


@dataclass
class _Counted:
    steps: int = 5
    batch_size: int = 8
    warmup_steps: int = 0  # not a count: 0 is fine
    method: str = "a"

    def __post_init__(self) -> None:
        if self.method not in ("a", "b"):
            raise ValueError(f"method={self.method!r}; allowed values: ['a', 'b']")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--steps", "0"], "argument --steps: 0; must be an integer >= 1"),
        (["--batch-size", "-2"], "argument --batch-size: -2; must be an integer >= 1"),
        (["--method", "c"], "error: --method c: method='c'; allowed values: ['a', 'b']"),
    ],
)
def test_parse_config_refuses_a_count_below_one_and_names_the_flag_of_a_config_refusal(argv, said, capsys):
    from recipes.kit.recipe import parse_config

    with pytest.raises(SystemExit) as done:
        parse_config(_Counted, argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and said in err[-1] and not any("Traceback" in e for e in err)
    assert parse_config(_Counted, ["--warmup-steps", "0"]).warmup_steps == 0


@pytest.mark.slow
def test_a_recipe_refused_after_torch_loads_says_one_line_and_leaves_no_out(tmp_path):
    """End to end: a recipe script whose data folder does not exist, as a user runs it."""
    out = tmp_path / "out"
    args = ["--data", str(tmp_path / "no-cifar"), "--out", str(out), "--quick"]
    run = subprocess.run(
        [sys.executable, str(ROOT / "recipes" / "mixed" / "cifar_vqa.py"), *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
    )
    errors = [line for line in run.stderr.splitlines() if ": error:" in line or "Traceback" in line]
    assert run.returncode == 1 and len(errors) == 1, run.stderr
    assert errors[0].startswith(f"cifar_vqa.py: error: --data {tmp_path / 'no-cifar'}: image zip not found")
    assert not out.exists()
