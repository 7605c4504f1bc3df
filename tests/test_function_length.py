"""No function of the library, the command or the tables is longer than 80 lines (issue 45, item 6): a longer one
is split into named steps."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mmpreproj", "mmpreproj_cli", "mmpreproj_tables")
MAX_LINES = 80


def long_functions(source: str, path: str) -> list[str]:
    """`path:line name (n lines)` for each function (or method) of `source` longer than `MAX_LINES`, decorators
    and docstring included."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines = node.end_lineno - first + 1
            if lines > MAX_LINES:
                out.append(f"{path}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_no_function_is_longer_than_80_lines():
    found = [
        row
        for package in PACKAGES
        for p in sorted((ROOT / package).rglob("*.py"))
        for row in long_functions(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))
    ]
    assert not found, f"functions over {MAX_LINES} lines: {found}"


def test_the_scan_sees_a_long_method():
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_LINES))
    assert long_functions(f"class A:\n    def f(self):\n{body}\n", "a.py") == [f"a.py:2 f ({MAX_LINES + 1} lines)"]
    assert long_functions("def g():\n    return 1\n", "b.py") == []
