"""PREPROJ's registration into peft's closed `PeftType` enum cannot break silently: outside the tested peft
range `import mmpreproj` fails with one line naming the versions, pyproject.toml bounds peft to that range,
and `mmpreproj-lm-eval` runs lm-eval with PREPROJ registered (the plain `lm_eval` reads our adapters only
after mmpreproj is imported)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from mmpreproj.method.config import TESTED_PEFT, check_peft_version
from tests.helpers.gguf_tiny import write_tiny_llama_gguf

REPO = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


@pytest.mark.parametrize("version", ["0.20.0", "0.22.0", "1.0.0"])
def test_untested_peft_is_refused_naming_the_versions(version):
    with pytest.raises(ImportError) as err:
        check_peft_version(version)
    msg = str(err.value)
    assert f"found peft {version}" in msg and f">={TESTED_PEFT[0]},<{TESTED_PEFT[1]}" in msg and "\n" not in msg


def test_tested_peft_passes():
    check_peft_version(TESTED_PEFT[0] + ".0")
    check_peft_version()  # the installed one


def test_pyproject_bounds_peft_to_the_tested_range():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    peft_dep = next(d for d in deps if d.startswith("peft"))
    assert peft_dep == f"peft>={TESTED_PEFT[0]},<{TESTED_PEFT[1]}"


@pytest.mark.slow
def test_import_fails_at_once_under_an_untested_peft():
    code = "import peft; peft.__version__ = '0.99.0'; import mmpreproj"
    done = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, cwd=REPO)
    assert done.returncode != 0
    assert "found peft 0.99.0" in done.stderr and "PeftType" not in done.stderr.splitlines()[-1][:20]
    assert "ImportError: mmpreproj registers its peft method PREPROJ" in done.stderr


LOAD_WITH_HFLM = """
import sys
import lm_eval.__main__ as harness

def evaluate():  # what lm-eval's `--model hf --model_args pretrained=...,peft=...` does with the adapter
    from lm_eval.models.huggingface import HFLM
    lm = HFLM(pretrained=sys.argv[1], peft=sys.argv[2], device="cpu", batch_size=1, dtype="float32")
    print("PEFT_TYPE", lm.model.peft_config["default"].peft_type)

harness.cli_evaluate = evaluate
if sys.argv[3] == "ours":
    from mmpreproj.integrations.lm_eval_cli import main
    main()
else:
    harness.cli_evaluate()
"""


@pytest.mark.slow
def test_mmpreproj_lm_eval_reads_a_preproj_adapter_where_plain_lm_eval_cannot(tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    import mmpreproj
    from mmpreproj.data.model_source import pretrained_source

    monkeypatch.setenv("MMPREPROJ_CACHE", str(tmp_path / "cache"))
    base_dir, _ = pretrained_source(str(write_tiny_llama_gguf(tmp_path / "tiny.gguf")))
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir), mmpreproj.PreProjConfig())
    model.save_pretrained(tmp_path / "adapter")
    env = {**ENV, "MMPREPROJ_CACHE": str(tmp_path / "cache")}
    runs = {}
    for mode in ("ours", "plain"):
        runs[mode] = subprocess.run(
            [sys.executable, "-c", LOAD_WITH_HFLM, base_dir, str(tmp_path / "adapter"), mode],
            env=env,
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
    assert runs["ours"].returncode == 0, runs["ours"].stderr[-2000:]
    assert "PEFT_TYPE PeftType.PREPROJ" in runs["ours"].stdout
    assert runs["plain"].returncode != 0 and "PREPROJ" in runs["plain"].stderr  # peft's KeyError / unknown type


def test_the_entry_point_is_declared():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["mmpreproj-lm-eval"] == "mmpreproj.integrations.lm_eval_cli:main"
