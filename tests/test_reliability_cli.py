"""Every CLI option that takes a path, a count or a list is checked before any work starts; errors are one
line naming the option and the value."""

from __future__ import annotations

import json

import pytest

import mmpreproj
from mmpreproj_cli.command import main
from tests.helpers.cli_lines import error_lines
from tests.helpers.zoo import tiny_neox


def _fails(capsys, argv: list[str], expect: str) -> None:
    code = main(argv)
    err = error_lines(capsys.readouterr().err)
    assert code == 1 and len(err) == 1, err
    assert expect in err[0], err[0]


NO_MODEL = ["--model", "/nonexistent/model"]  # loading it would fail: an input error must be found first


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["eval", *NO_MODEL, "--limit", "-1"], "--limit -1; must be an integer >= 1"),
        (["eval", *NO_MODEL, "--limit", "0"], "--limit 0; must be an integer >= 1"),
        (["eval", *NO_MODEL, "--batch-size", "0"], "--batch-size 0; must be an integer >= 1"),
        (
            ["eval", *NO_MODEL, "--tasks", "ppl,bogus"],
            "--tasks 'ppl,bogus': unknown ['bogus']; allowed: ppl, lambada",
        ),
        (["eval", *NO_MODEL, "--tasks", ","], "--tasks ',': empty"),
        (
            ["eval", *NO_MODEL, "--adapter", "/nonexistent/adapter"],
            "--adapter /nonexistent/adapter: no such file or folder",
        ),
        (["analyze", "/nonexistent/run"], "run folder /nonexistent/run: no such file or folder"),
        (
            ["reproduce", "--preset", "mini", "--methods", "preproj,dora"],
            "--methods 'preproj,dora': unknown ['dora']",
        ),
        (["demo", "--steps", "0"], "--steps 0; must be a positive int"),
        (["demo", "--limit", "-1"], "--limit -1; must be an integer >= 1"),
        (["train", "--lr", "inf"], "--lr inf; must be a finite number > 0"),
        (["train", "--lr", "nan"], "--lr nan; must be a finite number > 0"),
        (["train", "--lr", "0"], "--lr 0.0; must be a finite number > 0"),
        (["train", "--steps", "0"], "--steps 0; must be a positive int"),
        (["train", "--save-every", "-1"], "--save-every -1; must be >= 0"),
    ],
)
def test_bad_counts_and_lists_are_refused_before_work(capsys, tmp_path, monkeypatch, argv, expect):
    monkeypatch.chdir(tmp_path)  # a train/demo that started anyway would write runs/ here
    _fails(capsys, argv, expect)
    assert list(tmp_path.iterdir()) == []


def test_eval_json_that_is_a_folder_is_refused_before_work(capsys, tmp_path):
    _fails(
        capsys,
        ["eval", *NO_MODEL, "--json", str(tmp_path)],
        f"--json {tmp_path}: is a folder; pass a file name",
    )
    (tmp_path / "file").write_text("x")
    _fails(capsys, ["eval", *NO_MODEL, "--json", str(tmp_path / "file" / "r.json")], "is a file, not a folder")


def test_out_that_is_a_file_is_refused(capsys, tmp_path):
    (tmp_path / "f").write_text("x")
    for cmd in (["train"], ["demo"], ["analyze", str(tmp_path)]):
        _fails(capsys, [*cmd, "--out", str(tmp_path / "f")], f"--out {tmp_path / 'f'}: is a file; pass a folder")


def _run_folder(tmp_path, method: str):
    """A run folder holding a preproj_skip adapter, whose train_config.json names `method`."""
    model = mmpreproj.inject(tiny_neox())
    mmpreproj.save_adapter(model, tmp_path / "run" / "adapter")
    (tmp_path / "run" / "train_config.json").write_text(json.dumps({"method": method}))
    return tmp_path / "run"


@pytest.mark.parametrize("method", ["lora", "preproj_lora", "preproj"])
def test_train_config_naming_the_wrong_method_is_refused_by_name(tmp_path, method):
    run = _run_folder(tmp_path, method)
    model = tiny_neox()
    with pytest.raises(
        ValueError,
        match=f"train_config.json names method '{method}', but the adapter in .* holds "
        r"'preproj_skip' weights \(allowed: \['preproj_skip'\]\); nothing was loaded",
    ):
        mmpreproj.load_adapter(model, run)
    assert not mmpreproj.is_injected(model)


def test_train_config_naming_an_unknown_method(tmp_path):
    with pytest.raises(ValueError, match=r"names method 'dora', but .* holds 'preproj_skip' weights \(allowed: "):
        mmpreproj.load_adapter(tiny_neox(), _run_folder(tmp_path, "dora"))
    assert isinstance(
        mmpreproj.load_adapter(tiny_neox(), _run_folder(tmp_path / "ok", "preproj_skip")), type(tiny_neox())
    )
