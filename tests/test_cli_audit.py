"""Command-line and training inputs a third independent audit found accepted or refused late (251 cases; 29 failed,
14 of them real): each is now refused in one line naming the option, before torch loads where the command can tell.

- a list with an empty item ("1,,2", ",ppl", "lora,") was read without the empty item and the run started;
- `--layers 0,0` / `--parts a,a` were refused only by the library, naming `TrainConfig`, after torch loaded;
- `reproduce` / `sweep` with `--layers` past the model's blocks ran the baseline (35 s, files written) first;
- `--resume --overwrite` were both accepted, one silently winning;
- `train(cfg)` did not check fields set after the `TrainConfig` was built (`steps=-1` trained);
- `--device cuda` on a machine without CUDA loaded the model before torch's own error.
"""

from __future__ import annotations

import os

import pytest

from mmpreproj_cli.command import main

EMPTY_ITEM = "an empty item (two commas in a row, or one at an end)"


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["train", "--layers", "1,,2"], "--layers '1,,2'"),
        (["train", "--parts", ",dense"], "--parts ',dense'"),
        (["eval", "--tasks", ",ppl"], "--tasks ',ppl'"),
        (["reproduce", "--preset", "mini", "--methods", "lora,"], "--methods 'lora,'"),
        (["reproduce", "--preset", "mini", "--seeds", "0,,3"], "--seeds '0,,3'"),
        (["sweep", "--lrs", "1e-3,,1e-2"], "--lrs '1e-3,,1e-2'"),
        (["budget", "--budgets", "0.1,,0.3"], "--budgets '0.1,,0.3'"),
    ],
    ids=["layers", "parts", "tasks", "methods", "seeds", "lrs", "budgets"],
)
def test_a_list_with_an_empty_item_is_refused_naming_the_option(argv, flag, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--out", "o"] if argv[0] != "eval" else argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"mmpreproj {argv[0]}: error: {flag}: {EMPTY_ITEM}"), err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "argv, says",
    [
        (["train", "--layers", "0,0"], "--layers '0,0': a block named twice; pass comma-separated block indices"),
        (["train", "--parts", "language,language"], "--parts 'language,language': a part named twice"),
    ],
)
def test_a_size_list_naming_one_item_twice_is_refused_by_the_command(argv, says, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"mmpreproj train: error: {says}"), err


def test_resume_and_overwrite_together_are_refused(capsys):
    with pytest.raises(SystemExit) as ended:
        main(["train", "--resume", "--overwrite"])
    assert ended.value.code == 2
    assert "argument --overwrite: not allowed with argument --resume" in capsys.readouterr().err


def test_train_config_refuses_resume_with_overwrite():
    from mmpreproj.train import TrainConfig

    with pytest.raises(ValueError, match="resume=True and overwrite=True ask for opposite things"):
        TrainConfig(resume=True, overwrite=True)


def test_train_checks_a_field_set_after_the_config_was_built(tmp_path):
    from mmpreproj.train import TrainConfig, train

    cfg = TrainConfig(out=str(tmp_path / "run"), steps=2, warmup_steps=0)
    cfg.steps = -1
    with pytest.raises(ValueError, match=r"TrainConfig\.steps=-1"):
        train(cfg)
    assert not (tmp_path / "run").exists()


def test_train_refuses_a_device_this_machine_lacks_before_loading(tmp_path, monkeypatch):
    import torch

    from mmpreproj.train import TrainConfig, train

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"TrainConfig\.device='cuda': this machine has no cuda device"):
        train(TrainConfig(out=str(tmp_path / "run"), device="cuda", model="no/such-model"))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["reproduce", "sweep"])
def test_a_study_refuses_layers_past_the_models_blocks_before_its_baseline(command, tmp_path):
    from mmpreproj.experiments.reproduce import reproduce
    from mmpreproj.experiments.sweep import lr_sweep

    out = tmp_path / "o"
    with pytest.raises(ValueError, match=r"PreProjConfig\.layers contains 100, but the model has 4 blocks"):
        if command == "reproduce":
            reproduce("mini", out, ["preproj"], train_overrides={"layers": [100]}, progress=False)
        else:
            lr_sweep("mini", out, ["preproj_skip"], [1e-3], train_overrides={"layers": [100]}, progress=False)
    assert not out.exists()


def test_a_hub_data_config_with_a_local_data_file_is_refused(tmp_path, monkeypatch, capsys):
    """--data-config picks a config of a hub dataset; with a local --data file it was silently ignored."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lines.txt").write_text("one line of text\n" * 4, encoding="utf-8")
    argv = ["train", "--data", "lines.txt", "--data-config", "wikitext-2-raw-v1", "--out", "o"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mmpreproj train: error: --data-config wikitext-2-raw-v1:"), err
    assert "local file lines.txt" in err[0] and not (tmp_path / "o").exists()
    assert main(["train", "--data-config", "x", "--out", "o"]) == 1  # the mini preset's data is a shipped file
    assert "--data-config x" in capsys.readouterr().err
