"""docs/howto-mixed-model.md runs as written: its ```python blocks, in order, in one namespace, in a fresh
process (offline, CPU), as a reader pasting them one after another would run them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.procs import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "howto-mixed-model.md"
BLOCK = r"^```python\n(.*?)^```"
RUNNER = f"""
import re, sys
blocks = re.findall({BLOCK!r}, open(sys.argv[1]).read(), re.S | re.M)
namespace = {{"__name__": "__main__"}}
for i, code in enumerate(blocks):
    exec(compile(code, f"howto-mixed-model.md, python block {{i + 1}}", "exec"), namespace)
print(f"ran {{len(blocks)}} blocks")
"""


def test_the_page_has_its_blocks():
    blocks = re.findall(BLOCK, PAGE.read_text(), re.S | re.M)
    assert len(blocks) >= 4 and "from mmpreproj.modules import Block" in blocks[0]
    assert any("mmpreproj.inject(" in b for b in blocks) and any("assert logits.shape" in b for b in blocks)


@pytest.mark.slow
def test_the_page_runs_as_written():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    run = subprocess.run(
        [sys.executable, "-c", RUNNER, str(PAGE)], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=HANG_GUARD_S,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    blocks = len(re.findall(BLOCK, PAGE.read_text(), re.S | re.M))
    assert f"ran {blocks} blocks" in run.stdout, run.stdout
    assert "trainable params: 7,168" in run.stdout, run.stdout  # the count the page states
