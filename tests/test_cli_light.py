"""A light command (issue 32 s4): `mmpreproj --help`, a subcommand's --help and an argument error answer without
importing peft or transformers (`mmpreproj_cli`), the names they show are the library's own (one table), and
`import mmpreproj` leaves the optional parts (plots, hub data, lm-eval, open_clip, GGUF, video) unloaded."""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmpreproj_cli import tables
from mmpreproj_cli.parser import build_parser
from tests.helpers.procs import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[1]
LIGHT = ROOT / "mmpreproj_cli"
HEAVY = ("torch", "peft", "transformers", "mmpreproj")
OPTIONAL = ("matplotlib", "datasets", "lm_eval", "open_clip", "gguf", "av", "pandas", "diffusers", "trl")

# Run `main(argv)` in a fresh interpreter; the last line says how it exited and which heavy modules it loaded.
_MAIN = """
import json, sys
from mmpreproj_cli.command import main
try:
    code = main(sys.argv[1:])
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "loaded": [m for m in %r if m in sys.modules]}))
"""


def _python(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv,code",
    [(["--help"], 0), (["train", "--help"], 0), (["train", "--preset", "nonsense"], 2)],
    ids=["help", "train-help", "bad-preset"],
)
def test_help_and_argument_errors_import_neither_peft_nor_transformers(argv, code):
    run = _python("-c", _MAIN % (HEAVY,), *argv)
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result == {"code": code, "loaded": []}, run.stderr
    if code == 2:  # argparse's one line, naming every allowed value
        last = run.stderr.strip().splitlines()[-1]
        assert last.startswith("mmpreproj train: error: argument --preset: invalid choice: 'nonsense'"), last
        assert all(name in last for name in tables.PRESETS), last


@pytest.mark.slow
def test_a_check_without_the_library_answers_before_it_loads():
    run = _python("-c", _MAIN % (HEAVY,), "sweep", "--methods", "preproj_skip,dora")
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"code": 1, "loaded": []}, run.stderr
    assert run.stderr.startswith("mmpreproj sweep: error: --methods 'preproj_skip,dora': unknown ['dora']")


@pytest.mark.slow
def test_import_mmpreproj_leaves_the_optional_parts_unloaded():
    statement = (
        "import sys, mmpreproj, mmpreproj.train, mmpreproj.eval, mmpreproj.analysis, mmpreproj.experiments, "
        f"mmpreproj.integrations.quantized, mmpreproj.cli; print([m for m in {OPTIONAL!r} if m in sys.modules])"
    )
    run = _python("-c", statement)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[]"


def test_the_console_script_is_the_light_entry_point():
    lines = (ROOT / "pyproject.toml").read_text().splitlines()  # (tomllib is 3.11+; the floor is 3.10)
    assert any(line.startswith('mmpreproj = "mmpreproj_cli.command:main"') for line in lines)


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(top-level package named, inside a function) for each import in `path` (relative ones: this package)."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((a.name.split(".")[0], in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                found.append(("mmpreproj_cli" if child.level else (child.module or "").split(".")[0], in_function))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(ast.parse(path.read_text()), False)
    return found


def test_the_light_package_imports_only_the_standard_library_and_itself():
    """The one import of the library is `command.main`'s, inside the function, after the arguments are checked."""
    allowed = set(sys.stdlib_module_names) | {"mmpreproj_cli"}
    bad = []
    for path in sorted(LIGHT.glob("*.py")):
        for name, deferred in _imports(path):
            if name == "mmpreproj" and deferred and path.name == "command.py":
                continue
            if name not in allowed:
                bad.append(f"{path.name}: {name}{' (in a function)' if deferred else ''}")
    assert bad == []


def test_the_library_reads_only_the_tables_of_the_light_package():
    """The library takes plain names from `mmpreproj_cli.tables` (and the command's runner its parser and checks)."""
    bad = []
    for path in sorted((ROOT / "mmpreproj").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            named = (node.module or "") if isinstance(node, ast.ImportFrom) else ""
            if (
                named.startswith("mmpreproj_cli")
                and named != "mmpreproj_cli.tables"
                and path.name not in ("cli.py", "__main__.py")
            ):
                bad.append(f"{path.relative_to(ROOT)}: {node.module}")
    assert bad == []


def test_the_choices_shown_are_the_librarys_own():
    """One fact in one place: the library's names are the very objects of the table the parser shows."""
    from mmpreproj.experiments import budget, sweep
    from mmpreproj.train import config, methods, presets, sizes

    evaluate = importlib.import_module("mmpreproj.eval.evaluate")  # the package's `evaluate` is the function

    assert methods.METHOD_SPECS is tables.METHOD_SPECS and config.METHODS is tables.METHODS
    assert presets.PRESETS is tables.PRESETS and sizes.BUDGET_METHODS is tables.BUDGET_METHODS
    assert evaluate.TASKS is tables.TASKS and evaluate.PROTOCOLS is tables.PROTOCOLS
    assert sweep.DEFAULT_LRS is tables.DEFAULT_LRS and budget.DEFAULT_BUDGETS is tables.DEFAULT_BUDGETS
    train = build_parser()._subparsers._group_actions[0].choices["train"]  # the parser's own record
    choices = {a.dest: a.choices for a in train._actions if a.choices}
    assert choices["method"] == tables.METHODS and choices["preset"] == sorted(tables.PRESETS)
    assert choices["precision"] == tables.PRECISIONS and choices["parallel"] == tables.PARALLEL
