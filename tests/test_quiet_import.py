"""A quiet import: `import mmpreproj` and the command print nothing from dependencies; only the known
messages are dropped (`mmpreproj/util/quiet.py`), by exact text, and every other message still prints."""

from __future__ import annotations

import enum
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mmpreproj  # noqa: F401  (installs the filters in this process too)
from mmpreproj.util import quiet

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True)


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class _Color(enum.Enum):
    RED = 1


@pytest.mark.parametrize("name", sorted(quiet.KNOWN_MESSAGES))
def test_only_the_known_message_is_dropped(name):
    logger = logging.getLogger(name)
    keep = _Keep()
    logger.addHandler(keep)
    known = quiet.KNOWN_MESSAGES[name]
    args = (_Color,) if "%s" in known else ()  # a message logged pre-formatted (an f-string) has no arguments
    try:
        logger.warning(known + " Calling register_constant() ... is deprecated.", *args)
        logger.warning("another message of the same logger: %s", _Color)
        logging.getLogger("mmpreproj.test.other").warning(known, *args)  # another logger
    finally:
        logger.removeHandler(keep)
    assert keep.messages == [f"another message of the same logger: {_Color}"]


def test_install_is_idempotent_and_touches_only_the_named_loggers():
    before = {name: list(logging.getLogger(name).filters) for name in quiet.KNOWN_MESSAGES}
    root = (logging.getLogger().level, list(logging.getLogger().handlers), list(logging.getLogger().filters))
    quiet.install()
    quiet.install()
    assert {name: list(logging.getLogger(name).filters) for name in quiet.KNOWN_MESSAGES} == before
    assert all(len(f) == 1 for f in before.values())
    assert (
        logging.getLogger().level,
        list(logging.getLogger().handlers),
        list(logging.getLogger().filters),
    ) == root


@pytest.mark.slow
def test_import_prints_nothing():
    run = _run("-c", "import mmpreproj")
    assert run.returncode == 0, run.stderr
    assert (run.stdout, run.stderr) == ("", "")


@pytest.mark.slow
def test_command_help_and_argument_errors_print_nothing_from_dependencies():
    help_ = _run("-m", "mmpreproj", "--help")
    assert help_.returncode == 0 and help_.stderr == "" and help_.stdout.startswith("usage: mmpreproj")
    bad = _run("-m", "mmpreproj", "train", "--no-such-flag")
    assert bad.returncode == 2
    assert bad.stderr.splitlines()[-1] == "mmpreproj: error: unrecognized arguments: --no-such-flag", bad.stderr
    assert "_pytree" not in bad.stderr and "gemm_4bit" not in bad.stderr
