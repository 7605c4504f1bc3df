"""No function in the library, its plain tables or the command's subcommands (`mmpreproj_cli/run.py`) is over 80
lines (issue 45, item 6): a longer one is split into helpers that each do one step. Read from the source (AST),
nothing imported; a function's length is `end_lineno - lineno + 1`, its docstring and nested functions included."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MOST_LINES = 80


def _long_functions(root: Path, most: int) -> list[str]:
    """'path:line name (n lines)' of every function or method under `root` longer than `most` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > most:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_over_80_lines():
    long = [*_long_functions(REPO / "mmpreproj", MOST_LINES), *_long_functions(REPO / "mmpreproj_tables", MOST_LINES)]
    long += [f for f in _long_functions(REPO / "mmpreproj_cli", MOST_LINES) if f.startswith("mmpreproj_cli/run.py:")]
    assert not long, f"functions over {MOST_LINES} lines (split them into helpers):\n" + "\n".join(long)


def test_the_scan_finds_a_long_function(tmp_path):
    """The check can fail: an 81-line function is named, an 80-line one is not."""
    (tmp_path / "pkg").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(79))
    (tmp_path / "pkg" / "m.py").write_text(f"def short():\n{body}\n\n\ndef long():\n{body}\n    y = 0\n")
    assert _long_functions(tmp_path / "pkg", MOST_LINES) == ["pkg/m.py:83 long (81 lines)"]
