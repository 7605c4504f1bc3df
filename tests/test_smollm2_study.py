"""The SmolLM2 study machinery on a tiny GGUF Llama written in the test: the LR search, the seeds at the best LR,
restart without retraining, step claims between workers, the report, and the GPU script's CPU dry run."""

from __future__ import annotations

import json
import os
import socket

import pytest

from mmpreproj.experiments import study as study_mod
from mmpreproj.experiments.runner import LR_LADDER, claim, next_lr
from mmpreproj.experiments.study import Group, study
from mmpreproj.experiments.study_report import write_report
from recipes.smollm2 import gpu_table2
from tests.helpers.gguf_tiny import write_tiny_llama_gguf

pytest.importorskip("gguf")


@pytest.fixture
def tiny_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("MMPREPROJ_CACHE", str(tmp_path / "cache"))
    return write_tiny_llama_gguf(tmp_path / "models" / "tiny.gguf")


def test_next_lr_walks_the_ladder_past_an_edge():
    assert next_lr({1e-3: 10.0, 3e-3: 12.0}) == 3e-4  # best at the low edge: one rung lower
    assert next_lr({1e-3: 12.0, 3e-3: 10.0}) == 1e-2  # best at the high edge: one rung higher
    assert next_lr({3e-4: 11.0, 1e-3: 10.0, 3e-3: 12.0}) is None  # inside: settled
    assert next_lr({1e-3: None, 3e-3: None}) == 3e-4  # every LR diverged: go lower
    assert next_lr({LR_LADDER[0]: 1.0, LR_LADDER[1]: 2.0}) is None  # the ladder ends


def test_claim_is_exclusive_and_a_dead_workers_claim_is_taken(tmp_path):
    with claim(tmp_path / "a") as first:
        assert first
        with claim(tmp_path / "a") as second:
            assert not second  # held by a live process (this one)
    assert not (tmp_path / "a" / ".claim").exists()  # released
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / ".claim").write_text(f"{socket.gethostname()} 999999999")  # no such pid
    with claim(tmp_path / "b") as mine:
        assert mine


def test_study_search_seeds_restart_and_report(tiny_gguf, tmp_path):
    overrides = {"model": str(tiny_gguf), "steps": 2, "warmup_steps": 1, "batch_size": 2, "max_len": 32}
    groups = [Group("preproj_skip", "preproj_skip", (1e-3, 3e-3), seeds=2), Group("lora", "lora", (1e-3,))]
    done: list = []
    kwargs = dict(groups=groups, max_extend=1, overrides=overrides, limit=4, poll_seconds=0.1)
    s = study("smollm2-135m-cpu", tmp_path / "out", tmp_path / "runs", on_finish=done.append, **kwargs)
    arms = tmp_path / "out" / "arms"
    ours = sorted(p.name for p in (arms / "preproj_skip").iterdir())
    # two start LRs and one rung past the edge the better one sat on; seeds 42 and 43 at the pick
    assert len([a for a in ours if a.endswith("seed-42")]) == 3
    picked = [a for a in ours if a.endswith("seed-43")]
    assert len(picked) == 1 and (arms / "preproj_skip" / picked[0] / "full.json").is_file()
    assert (arms / "preproj_skip" / picked[0].replace("43", "42") / "full.json").is_file()
    loras = sorted(p.name for p in (arms / "lora").iterdir())
    assert len(loras) == 2  # one start LR is an edge on both sides: one rung (max_extend=1)
    select = json.loads((arms / "preproj_skip" / ours[0] / "select.json").read_text())
    assert select["row"]["select.ppl"] > 0 and select["row"]["skip_norms"]
    assert (arms / "preproj_skip" / ours[0] / "loss_curve.png").is_file()
    assert done[0] is None and len(done) == 1 + 3 + 2 + 1 + 2 + 1  # baseline, selects, fulls
    # a restart trains nothing and writes the same report
    again: list = []
    study("smollm2-135m-cpu", tmp_path / "out", tmp_path / "runs", on_finish=again.append, **kwargs)
    assert again == []
    report = write_report(s).read_text()
    assert "| preproj_skip |" in report and "| 2/2 |" in report and "(picked)" in report
    data = json.loads((tmp_path / "out" / "study.json").read_text())
    assert {c["reference"] for c in data["comparisons"]} >= {"baseline", "lora"}
    assert (tmp_path / "out" / "skip_norms.png").is_file() and (tmp_path / "out" / "routing.png").is_file()
    # a step written before times were kept: the compute is then said to be a lower bound, naming the file
    assert "lower bound" not in report
    untimed = arms / "preproj_skip" / ours[0] / "select.json"
    kept = json.loads(untimed.read_text())
    kept["row"].pop("select_seconds")
    untimed.write_text(json.dumps(kept))
    report = write_report(s).read_text()
    assert f"1 evaluation(s) recorded no time (preproj_skip/{ours[0]}/select.json: written before" in report
    assert "so this is a lower bound" in report


def test_study_full_step_retrains_when_the_adapter_is_gone(tiny_gguf, tmp_path, monkeypatch):
    """The full evaluation of an arm trained on another machine (no adapter under runs/) trains it again."""
    overrides = {"model": str(tiny_gguf), "steps": 2, "warmup_steps": 1, "batch_size": 2, "max_len": 32}
    groups = [Group("skip", "skip", (1e-3,))]
    kwargs = dict(groups=groups, max_extend=0, overrides=overrides, limit=4, poll_seconds=0.1)
    real = study_mod.run_step

    def select_only(s, step, base, tok, trained):
        if step.kind == "full":
            raise KeyboardInterrupt  # the session ends between the two steps
        real(s, step, base, tok, trained)

    monkeypatch.setattr(study_mod, "run_step", select_only)
    with pytest.raises(KeyboardInterrupt):
        study("smollm2-135m-cpu", tmp_path / "out", tmp_path / "runs", **kwargs)
    import shutil

    shutil.rmtree(tmp_path / "runs")  # another machine: no adapter, no claims
    monkeypatch.setattr(study_mod, "run_step", real)
    study("smollm2-135m-cpu", tmp_path / "out", tmp_path / "runs", **kwargs)
    arm = tmp_path / "out" / "arms" / "skip" / "lr-0.001-seed-42"
    assert json.loads((arm / "full.json").read_text())["row"]["lambada.total"] == 4


def test_gpu_script_dry_run(tiny_gguf, tmp_path):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    report = gpu_table2.main(["--dry-run", "--model", str(tiny_gguf), "--out", str(tmp_path / "gpu")])
    table = (tmp_path / "gpu" / "table.md").read_text()
    for method in ("baseline", "preproj", "skip", "preproj_skip", "lora", "preproj_lora"):
        assert f"| {method} |" in table
    assert "smollm2-135m" in report.read_text()


def test_gpu_script_splits_the_papers_batch_of_16_and_refuses_other_splits(capsys):
    from mmpreproj.train.presets import get_preset

    ap = gpu_table2.build_parser()
    fast = gpu_table2.train_overrides(ap.parse_args(["--micro-batch", "16", "--no-checkpointing", "--device", "cpu"]))
    cfg = get_preset("smollm2-135m", **fast)
    assert (cfg.batch_size, cfg.grad_accum, cfg.gradient_checkpointing) == (16, 1, False)
    assert (cfg.lr, cfg.steps, cfg.max_len, cfg.precision, cfg.model_dtype) == (1e-5, 500, 512, "bf16", "bfloat16")
    paper = get_preset("smollm2-135m", **gpu_table2.train_overrides(ap.parse_args(["--device", "cpu"])))
    assert (paper.batch_size, paper.grad_accum, paper.gradient_checkpointing) == (4, 4, True)
    with pytest.raises(SystemExit):
        ap.parse_args(["--micro-batch", "5"])
    assert "--micro-batch: invalid choice: 5 (choose from 1, 2, 4, 8, 16)" in capsys.readouterr().err


def test_study_report_keeps_the_gpu_run_beside_the_cpu_study(tmp_path):
    from mmpreproj.experiments.study_report import gpu_run, gpu_section

    assert gpu_run(tmp_path) == {} and gpu_section(tmp_path, {}) == []
    rows = [
        {"method": "baseline", "lambada.acc": 0.25, "ppl.ppl": 50.0},
        {"method": "preproj_skip", "lambada.acc": 0.3, "ppl.ppl": 30.0, "skip_norms": [0.1, 0.2]},
    ]
    run = {"rows": rows, "seeds": [42], "command": "python recipes/smollm2/gpu_table2.py --micro-batch 16"}
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "results.json").write_text(json.dumps(run))
    (tmp_path / "gpu" / "table.md").write_text("| method | PPL |\n|---|---|\n| preproj_skip | 30.0 |\n\nprose\n")
    assert gpu_run(tmp_path) == run
    text = "\n".join(gpu_section(tmp_path, run))
    assert "(seeds: 42)" in text and "`python recipes/smollm2/gpu_table2.py --micro-batch 16`" in text
    assert "| preproj_skip | 30.0 |" in text and "prose" not in text
    assert "preproj_skip: LAMBADA +20.0%, line PPL -40.0% over the baseline" in text
    (tmp_path / "gpu" / "table.md").unlink()  # a copy without its table.md: the rows still say the changes
    assert "preproj_skip: LAMBADA +20.0%" in "\n".join(gpu_section(tmp_path, run))


def test_study_restarts_a_run_that_stopped_before_its_first_checkpoint(tiny_gguf, tmp_path):
    """A worker killed before its first checkpoint leaves train_config.json and nothing to resume: the next run
    of the study starts that run over instead of refusing it."""
    overrides = {"model": str(tiny_gguf), "steps": 2, "warmup_steps": 1, "batch_size": 2, "max_len": 32}
    groups = [Group("skip", "skip", (1e-3,))]
    kwargs = dict(groups=groups, max_extend=0, overrides=overrides, limit=4, poll_seconds=0.1)
    run = tmp_path / "runs" / "skip" / "lr-0.001-seed-42"
    run.mkdir(parents=True)
    (run / "train_config.json").write_text("{}")  # what a killed worker leaves behind
    study("smollm2-135m-cpu", tmp_path / "out", tmp_path / "runs", **kwargs)
    arm = tmp_path / "out" / "arms" / "skip" / "lr-0.001-seed-42"
    assert json.loads((arm / "select.json").read_text())["row"]["select.ppl"] > 0


def test_gpu_script_picks_each_methods_lr_on_heldout_rows(tiny_gguf, tmp_path):
    """`--lrs`: each method trains at each LR (held-out PPL), only the pick gets the test tasks."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = tmp_path / "lrs"
    argv = ["--dry-run", "--model", str(tiny_gguf), "--out", str(out), "--lrs", "1e-4,3e-4", "--device", "cpu"]
    report = gpu_table2.main([*argv, "--methods", "preproj_skip,lora"])
    for method in ("preproj_skip", "lora"):
        arms = sorted(p.name for p in (out / "arms" / method).iterdir())
        assert arms == ["lr-0.0001-seed-42", "lr-0.0003-seed-42"]
        selects = {a: json.loads((out / "arms" / method / a / "select.json").read_text()) for a in arms}
        heldout = {a: d["row"]["select.ppl"] for a, d in selects.items()}
        fulls = [a for a in arms if (out / "arms" / method / a / "full.json").is_file()]
        assert fulls == [min(heldout, key=heldout.get)]  # the held-out pick, and only it, is tested
    assert "(picked)" in report.read_text()
    with pytest.raises(SystemExit, match="--lrs: 'x' is not a positive learning rate"):
        gpu_table2.main([*argv, "--lrs", "1e-4,x"])


@pytest.mark.slow  # runs git
def test_commit_takes_only_its_paths_and_returns_at_once_when_they_are_unchanged(tmp_path, monkeypatch, caplog):
    """The study runners' `commit`: a finished step's files alone (never what else is staged), and nothing to do
    (no retries, no warning) when they are as committed, even beside untracked files."""
    import subprocess

    from recipes.smollm2 import table2

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    git("config", "user.email", "t@t")
    git("config", "user.name", "t")
    (tmp_path / "kept.json").write_text("{}")
    git("add", "kept.json")
    git("commit", "-q", "-m", "first")
    (tmp_path / "untracked.txt").write_text("x")
    (tmp_path / "staged.txt").write_text("y")
    git("add", "staged.txt")
    monkeypatch.setattr(table2, "ROOT", tmp_path)
    monkeypatch.setattr(table2.time, "sleep", lambda s: pytest.fail("commit retried an unchanged file"))
    table2.commit([tmp_path / "kept.json"], "unchanged")
    table2.commit([tmp_path / "missing.json"], "nothing there")
    assert git("rev-list", "--count", "HEAD").strip() == "1" and "could not commit" not in caplog.text
    (tmp_path / "new.json").write_text("{}")
    table2.commit([tmp_path / "new.json"], "a step")
    assert git("show", "--name-only", "--format=", "HEAD").split() == ["new.json"]
    assert "staged.txt" in git("diff", "--cached", "--name-only")  # what else was staged stays staged
