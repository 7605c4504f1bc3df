"""The size flags (--expansion, --skip-rank, --layers, --parts) on train, sweep and reproduce, and `budget`'s
checks."""

from __future__ import annotations

import pytest

from mmpreproj_cli.checks import size_overrides
from mmpreproj_cli.command import main
from mmpreproj_cli.parser import build_parser
from mmpreproj_cli.run import _repro_overrides
from tests.helpers.cli_lines import error_lines


@pytest.mark.parametrize("cmd", [["train"], ["sweep"], ["reproduce", "--preset", "mini"], ["demo"]])
def test_size_flags_parse_into_train_config_fields(cmd):
    args = build_parser().parse_args(
        [*cmd, "--expansion", "0.0625", "--skip-rank", "8", "--layers", "0,-1", "--parts", "language"]
    )
    want = {"expansion": 0.0625, "skip_rank": 8, "layers": [0, -1], "parts": ["language"]}
    assert size_overrides(args) == want
    if cmd[0] != "train":
        assert _repro_overrides(args) == want
    assert size_overrides(build_parser().parse_args(cmd)) == {}  # not given: the preset's


@pytest.mark.parametrize("cmd", ["train", "sweep", "reproduce"])
def test_help_shows_the_presets_value(cmd, capsys):
    with pytest.raises(SystemExit):
        main([cmd, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--skip-rank" in out and "--expansion" in out and "--layers" in out and "--parts" in out
    assert "(default: the preset's, 1.25 in every preset)" in out
    assert "None in every preset; None = the full d x d skip" in out


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["train", "--layers", "0,x"], "--layers"),
        (["train", "--skip-rank", "0"], "--skip-rank"),
        (["sweep", "--expansion", "-1"], "--expansion"),
        (["reproduce", "--preset", "mini", "--parts", ","], "--parts"),
        (
            ["train", "--method", "lora", "--skip-rank", "4"],
            "--skip-rank sizes a skip, which --method lora",
        ),  # the flag
        (["budget", "--budgets", "0.01,2"], "--budgets"),
        (["budget", "--methods", "lora,dora"], "--methods"),
        (["budget", "--seed-methods", "skip", "--methods", "lora"], "--seed-methods"),
        (["budget", "--seeds", "0"], "--seeds"),
        (["budget", "--lrs", "1e-3,x"], "--lrs"),
    ],
)
def test_bad_sizes_are_refused_in_one_line_naming_the_flag(argv, flag, capsys, tmp_path):
    code = main([*argv, "--out", str(tmp_path / "never")])
    err = error_lines(capsys.readouterr().err)
    assert code == 1 and len(err) == 1 and flag in err[0], err
    assert not (tmp_path / "never").exists()
