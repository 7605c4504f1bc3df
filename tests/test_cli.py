"""The `mmpreproj` command end to end on a tiny model saved in a temp folder (offline, seconds)."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

import pytest

import mmpreproj
from mmpreproj_cli.command import main
from mmpreproj_cli.parser import build_parser
from tests.helpers.adapter_json import load_desc
from tests.helpers.net_guard import refuse_network
from tests.helpers.png_content import assert_draws
from tests.helpers.procs import HANG_GUARD_S


def test_every_subcommand_has_help(capsys):
    # the subcommands are read from the parser itself, so a new one cannot be left out of this test
    ap = build_parser()
    (sub,) = [a for a in ap._actions if isinstance(a, argparse._SubParsersAction)]
    assert {"train", "eval", "analyze", "reproduce", "demo", "sweep", "budget"} <= set(sub.choices)
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    top = capsys.readouterr().out
    helps = {a.dest: a.help for a in sub._choices_actions}  # a subcommand added without help= has no entry
    for cmd in sub.choices:  # the top-level help lists every subcommand with its one-line help
        assert helps.get(cmd) and re.search(rf"^\s+{cmd}\s", top, re.M), cmd
    for cmd, parser in sub.choices.items():
        with pytest.raises(SystemExit) as e:
            main([cmd, "--help"])
        assert e.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: mmpreproj " + cmd), cmd
        # every option (and positional) of the subcommand has its own entry line in the help
        lines = [line.strip() for line in out.splitlines()]
        for action in parser._actions:
            names = action.option_strings or [action.metavar or action.dest]
            assert any(line.startswith(names[0]) and all(n in line for n in names) for line in lines), (cmd, names)


@pytest.mark.slow
def test_python_dash_m_works():
    r = subprocess.run(
        [sys.executable, "-m", "mmpreproj", "--help"], capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert r.returncode == 0 and "reproduce" in r.stdout


def test_bad_input_is_one_line_and_nonzero(capsys, tmp_path):
    code = main(["eval", "--model", str(tmp_path / "nope"), "--tasks", "ppl", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and err[0].startswith("mmpreproj eval: error:")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--method", "dora"])


def _reference_model(tiny_model_dir, run=None):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    return (mmpreproj.load_adapter(model, run) if run is not None else model), AutoTokenizer.from_pretrained(
        tiny_model_dir
    )


def test_train_eval_analyze(tiny_model_dir, tmp_path, capsys):
    """Each command's numbers equal the library computed by hand on the same files: a command that loads
    the wrong adapter, drops a flag or mislabels a layer fails here."""
    import math

    import torch
    from safetensors.torch import load_file

    from mmpreproj.analysis import routing_ratios
    from mmpreproj.eval import evaluate
    from mmpreproj.experiments.reproduce import _ratio_batches, _ratio_texts

    run = tmp_path / "run"
    common = [
        "--model",
        str(tiny_model_dir),
        "--steps",
        "3",
        "--warmup-steps",
        "1",
        "--num-lines",
        "16",
        "--max-len",
        "32",
        "--batch-size",
        "4",
        "--no-progress",
    ]
    assert main(["train", "--method", "preproj_skip", "--out", str(run), *common]) == 0
    assert (run / "adapter" / "adapter_model.safetensors").is_file() and (run / "metrics.json").is_file()
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["steps"] == 3 and math.isfinite(metrics["final_loss"])
    saved = load_desc(run / "adapter" / "adapter_config.json")
    assert saved["method"] == "preproj_skip" and saved["base_model_name_or_path"] == str(tiny_model_dir)

    out_json = tmp_path / "eval.json"
    tasks = ["ppl", "lambada", "hellaswag"]
    assert (
        main(
            [
                "eval",
                "--model",
                str(tiny_model_dir),
                "--adapter",
                str(run),
                "--tasks",
                ",".join(tasks),
                "--limit",
                "12",
                "--json",
                str(out_json),
                "--no-progress",
            ]
        )
        == 0
    )
    res = json.loads(out_json.read_text())
    model, tok = _reference_model(tiny_model_dir, run)
    assert res == json.loads(json.dumps(evaluate(model, tok, tasks, limit=12, progress=False)))  # same numbers
    base, _ = _reference_model(tiny_model_dir)
    assert res["ppl"]["ppl"] != evaluate(base, tok, ["ppl"], limit=12, progress=False)["ppl"]["ppl"]  # adapter used
    assert float(res["lambada"]["acc"] * 12).is_integer() and float(res["hellaswag"]["acc"] * 12).is_integer()

    assert main(["analyze", str(run), "--texts", "2"]) == 0
    norms = json.loads((run / "skip_norms.json").read_text())[str(run)]
    weights = load_file(str(run / "adapter" / "adapter_model.safetensors"))
    by_hand = {
        str(i): weights[f"base_model.model.gpt_neox.layers.{i}.attention.preproj_skip.proj.weight"].norm().item()
        for i in (0, 1)
    }  # peft's keys
    assert norms["skip_norms"] == pytest.approx(by_hand, rel=1e-6)
    with torch.no_grad():
        ratios = routing_ratios(model, _ratio_batches(tok, _ratio_texts("local", "test", 2), 32, torch.device("cpu")))
    assert norms["routing_ratios"] == pytest.approx({str(k): v for k, v in ratios.items()}, rel=1e-5)
    assert_draws(run / "skip_norms.png", ["C0"])  # decoded: the one run's line drawn across the axes
    assert "mmpreproj analyze: wrote" in capsys.readouterr().out


def test_reproduce_writes_table(tiny_model_dir, tmp_path):
    out = tmp_path / "rep"
    assert (
        main(
            [
                "reproduce",
                "--preset",
                "mini",
                "--model",
                str(tiny_model_dir),
                "--methods",
                "skip,lora",
                "--steps",
                "2",
                "--limit",
                "12",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    table = (out / "table.md").read_text()
    assert table.count("| mini |") == 3 and "baseline" in table and "lora" in table
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [r["method"] for r in rows] == ["baseline", "skip", "lora"] and (out / "skip_norms.png").is_file()
    # trainable counts by hand (d = 32, L = 2): skip = L*d*d; LoRA r = int(P / (L*2*d*2)) = 20 with
    # P = 2*d*int(1.25 d)*L = 5120, on query_key_value (32 -> 96) and dense (32 -> 32): L * r * (128 + 64)
    assert [r["params"] for r in rows] == [0, 2 * 32 * 32, 2 * 20 * (32 + 96 + 32 + 32)]
    base, skip = rows[0], rows[1]
    assert skip["ppl.ppl"] != base["ppl.ppl"] and len(skip["skip_norms"]) == 2


def test_table_puts_paper_figures_beside_ours():
    from mmpreproj.experiments.reproduce import format_table

    rows = [{"method": "preproj_skip", "params": 24_772_608, "lambada.acc": 0.2, "ppl.ppl": 50.0, "lambada.ppl": 9.5}]
    line = format_table(rows, "pythia-160m").splitlines()[2]
    assert line == (
        "| pythia-160m | preproj_skip | 24.8M (24.8M) | 0.200 (0.180) | n/a (0.338) | n/a (0.348) "
        "| 50.0 (47.9) | 9.5 |"
    )
    assert "(" not in format_table(rows, "mini").splitlines()[2]


HUB_TYPO = ["train", "--preset", "pythia-160m", "--model", "no-such-org/no-such-model", "--no-progress"]


def test_a_mistyped_hub_id_is_refused_offline_by_default_without_the_network(monkeypatch, capsys):
    """Outside `make` nothing sets the offline flags: the command sets them, says so first, and a hub id that is not
    cached is refused from the cache alone (no connection tried, no retries)."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # restored after the test, whatever the command sets
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    attempts = refuse_network(monkeypatch)
    code = main(HUB_TYPO)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and attempts == []
    assert lines == [
        "mmpreproj train: offline: HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 (set by mmpreproj; pass --online to allow "
        "hub downloads)",
        "mmpreproj train: error: --model no-such-org/no-such-model: not in the local hub cache, and hub downloads "
        "are off (HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1); pass --online to download it, or a local folder",
    ], lines


def test_online_with_an_unreachable_hub_fails_at_once_in_one_line(monkeypatch, capsys):
    import huggingface_hub.constants

    from mmpreproj.data import hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # --online sets both to 0: put back after the test
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", huggingface_hub.constants.HF_HUB_OFFLINE)
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: False)
    code = main([*HUB_TYPO, "--online"])
    first, *err = capsys.readouterr().err.strip().splitlines()
    assert first == "mmpreproj train: online: HF_HUB_OFFLINE=0 HF_DATASETS_OFFLINE=0 (--online: hub downloads allowed)"
    assert code == 1 and len(err) == 1 and "cannot be reached" in err[0] and "--model PATH" in err[0], err


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--layers", "9"], "--layers contains 9, but the model has 2 blocks (allowed: -2..1)"),
        (["--parts", "bogus"], "--parts names ['bogus'], but this 'gpt_neox' model has parts ['language']"),
    ],
    ids=["layers", "parts"],
)
def test_a_size_flag_out_of_range_for_the_model_is_refused_naming_the_flag(
    flags, says, tiny_model_dir, tmp_path, capsys
):
    """In range only once the model is loaded (its blocks, its parts): refused in one line that names the flag the
    user typed (not the config field behind it), before anything is written to --out."""
    out = tmp_path / "new"
    code = main(["train", "--model", str(tiny_model_dir), "--steps", "2", "--out", str(out), "--no-progress", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1] == f"mmpreproj train: error: {says}", err
    assert not out.exists()


def test_the_flag_names_replace_only_fields_the_subcommand_has_flags_for():
    from mmpreproj_cli.command import _flag_names

    train = build_parser().parse_args(["train"])
    evaluate = build_parser().parse_args(["eval"])
    msg = "PreProjConfig.layers contains 9; TrainConfig.device='x'; TrainConfig.min_lr_ratio=2"
    assert _flag_names(msg, train) == "--layers contains 9; --device 'x'; TrainConfig.min_lr_ratio=2"
    assert _flag_names(msg, evaluate) == msg  # eval has none of these flags


def test_reproduce_with_too_few_ppl_rows_names_limit_and_leaves_no_output_folder(tiny_model_dir, tmp_path, capsys):
    """`--limit 3` is in range, but the first 3 WikiText rows are all too short for the paper's PPL filters: the
    baseline's evaluation refuses in one line naming --limit, and the new --out is not left behind empty."""
    out = tmp_path / "new"
    argv = ["reproduce", "--preset", "mini", "--model", str(tiny_model_dir), "--methods", "lora"]
    code = main([*argv, "--steps", "2", "--limit", "3", "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and "none of the 3 rows given passed the filters" in err[-1] and "--limit" in err[-1], err
    assert not out.exists()


@pytest.mark.parametrize("flags", [["--no-progress"], []], ids=["no-progress", "default"])
def test_no_progress_silences_the_weight_loading_bar_too(capsys, tmp_path, flags):
    """`--no-progress` says "no progress bars": transformers' "Loading weights" bar too (it printed before the one
    error line), and the bars are back after the call."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()  # whatever another test module left
    try:
        argv = ["train", "--preset", "mini", "--steps", "1", "--layers=99", "--out", str(tmp_path / "r"), *flags]
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert ("Loading weights" in err) == (not flags), err
        assert err.strip().splitlines()[-1].startswith("mmpreproj train: error: --layers contains 99")
        assert hf_logging.is_progress_bar_enabled()
    finally:
        if not was_on:
            hf_logging.disable_progress_bar()
