"""The `mmpreproj` command end to end on a tiny model saved in a temp folder (offline, seconds)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mmpreproj.cli import build_parser, main


def test_every_subcommand_has_help(capsys):
    for cmd in ("train", "eval", "analyze", "reproduce", "demo"):
        with pytest.raises(SystemExit) as e:
            main([cmd, "--help"])
        assert e.value.code == 0
        assert "usage: mmpreproj " + cmd in capsys.readouterr().out


def test_python_dash_m_works():
    r = subprocess.run([sys.executable, "-m", "mmpreproj", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "reproduce" in r.stdout


def test_bad_input_is_one_line_and_nonzero(capsys, tmp_path):
    code = main(["eval", "--model", str(tmp_path / "nope"), "--tasks", "ppl", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and err[0].startswith("mmpreproj eval: error:")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--method", "dora"])


def test_train_eval_analyze(tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    common = ["--model", str(tiny_model_dir), "--steps", "3", "--warmup-steps", "1", "--num-lines", "16",
              "--max-len", "32", "--batch-size", "4", "--no-progress"]
    assert main(["train", "--method", "preproj_skip", "--out", str(run), *common]) == 0
    assert (run / "adapter" / "adapter_model.safetensors").is_file() and (run / "metrics.json").is_file()
    assert json.loads((run / "metrics.json").read_text())["steps"] == 3
    out_json = tmp_path / "eval.json"
    assert main(["eval", "--model", str(tiny_model_dir), "--adapter", str(run), "--tasks", "ppl,lambada,hellaswag",
                 "--limit", "12", "--json", str(out_json), "--no-progress"]) == 0
    res = json.loads(out_json.read_text())
    assert 0.0 <= res["lambada"]["acc"] <= 1.0 and res["ppl"]["ppl"] > 1.0
    assert main(["analyze", str(run), "--texts", "2"]) == 0
    norms = json.loads((run / "skip_norms.json").read_text())[str(run)]
    assert len(norms["skip_norms"]) == 2 and len(norms["routing_ratios"]) == 2
    assert (run / "skip_norms.png").read_bytes()[:4] == b"\x89PNG"
    assert "mmpreproj analyze: wrote" in capsys.readouterr().out


def test_reproduce_writes_table(tiny_model_dir, tmp_path):
    out = tmp_path / "rep"
    assert main(["reproduce", "--preset", "mini", "--model", str(tiny_model_dir), "--methods", "skip,lora",
                 "--steps", "2", "--limit", "12", "--out", str(out), "--no-progress"]) == 0
    table = (out / "table.md").read_text()
    assert table.count("| mini |") == 3 and "baseline" in table and "lora" in table
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [r["method"] for r in rows] == ["baseline", "skip", "lora"] and (out / "skip_norms.png").is_file()


def test_table_puts_paper_figures_beside_ours():
    from mmpreproj.reproduce import format_table

    rows = [{"method": "preproj_skip", "params": 24_772_608, "lambada.acc": 0.2, "ppl.ppl": 50.0, "lambada.ppl": 9.5}]
    line = format_table(rows, "pythia-160m").splitlines()[2]
    assert line == ("| pythia-160m | preproj_skip | 24.8M (24.8M) | 0.200 (0.180) | n/a (0.338) | n/a (0.348) "
                    "| 50.0 (47.9) | 9.5 |")
    assert "(" not in format_table(rows, "mini").splitlines()[2]


def test_unreachable_hub_model_fails_at_once_in_one_line(monkeypatch, capsys):
    from mmpreproj.data import hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: False)
    code = main(["train", "--preset", "pythia-160m", "--model", "no-such-org/no-such-model", "--steps", "2",
                 "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "cannot be reached" in err[0] and "--model PATH" in err[0]
