"""The test suite's own layout: no test module imports another test module (or conftest); shared pieces
live in `tests/helpers/`, and tests/ holds nothing else importable by a bare name. The method's tests sit by unit
under `tests/method/<unit>/` (config, layer, model, plan, files, convert, api: `mmpreproj/method/`'s files); a
test file's name is unique across the folders (pytest imports each by its bare name)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def _is_test_module(name: str) -> bool:
    """`name` (dotted) is a test module or conftest: `test_x`, `tests.test_x`, `conftest`, `tests.conftest`."""
    parts = name.split(".")
    if parts[0] == "tests":
        parts = parts[1:]
    return bool(parts) and (parts[0].startswith("test_") or parts[0] == "conftest")


def imported_test_modules(source: str) -> list[str]:
    """The test modules (or conftest) that `source` imports, at any depth (inside functions too), in order."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if _is_test_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _is_test_module(node.module):
                found.append(node.module)
            elif node.module == "tests":  # from tests import test_x / conftest
                found += [f"tests.{a.name}" for a in node.names if _is_test_module(a.name)]
        elif isinstance(node, ast.ImportFrom):  # relative: from .test_x import y, from . import conftest
            if node.module:
                found += ["." * node.level + node.module] if _is_test_module(node.module) else []
            else:
                found += ["." * node.level + a.name for a in node.names if _is_test_module(a.name)]
    return found


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("from test_host_transformers import BUILDERS", ["test_host_transformers"]),
        ("import test_train_trainer", ["test_train_trainer"]),
        ("from tests.test_cli import main", ["tests.test_cli"]),
        ("import tests.test_cli as t", ["tests.test_cli"]),
        ("from tests import test_cli, helpers", ["tests.test_cli"]),
        ("from conftest import tiny_neox", ["conftest"]),
        ("from tests.conftest import tiny_neox", ["tests.conftest"]),
        ("from .test_x import y\nfrom . import conftest", [".test_x", ".conftest"]),
        ("def f():\n    from test_train_trainer import DATA\n", ["test_train_trainer"]),
        ("import os\nfrom tests.helpers.zoo import tiny_neox\nfrom mmpreproj import test_utils\n", []),
    ],
)
def test_the_scanner_finds_every_kind_of_test_module_import(source, found):
    assert imported_test_modules(source) == found


def _python_files() -> list[Path]:
    tests = [p for p in TESTS.rglob("test_*.py") if "fixtures" not in p.parts]  # tests/method/<unit>/ too
    return sorted([*tests, TESTS / "conftest.py", *(TESTS / "helpers").glob("*.py")])


def test_no_test_module_imports_another_test_module():
    files = _python_files()
    assert len(files) > 80 and TESTS / "helpers" / "zoo.py" in files  # the scan sees the suite
    bad = {f.relative_to(TESTS).as_posix(): imported_test_modules(f.read_text()) for f in files}
    assert not {f: names for f, names in bad.items() if names}, "import shared pieces from tests.helpers"


def test_tests_top_level_holds_only_test_modules_and_conftest():
    # any other module here would be importable by a bare name from every test module (as helpers were)
    others = [p.name for p in TESTS.glob("*.py") if not p.name.startswith("test_") and p.name != "conftest.py"]
    assert others == [], f"move {others} into tests/helpers/"


def test_test_file_names_are_unique_across_folders():
    names = [p.name for p in TESTS.rglob("test_*.py") if "fixtures" not in p.parts]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_the_method_tests_sit_by_unit():
    units = {p.name for p in (TESTS / "method").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert units == {"config", "layer", "model", "plan", "files", "convert", "api"}
    method = {p.stem for p in (TESTS.parent / "mmpreproj" / "method").glob("*.py")}
    assert {"config", "layer", "model", "plan", "files", "convert"} <= method  # a unit is a file of the method
