"""The package reads one way (issue 19 s4): every import of `mmpreproj` inside `mmpreproj/` goes down the layers of
ARCHITECTURE.md, and no function imports the package except where the list below says why. Across the three
top-level packages (issue 45 s6): `mmpreproj_tables` at the bottom imports neither of the others, and no module of
the library imports the command (`mmpreproj_cli`) but `__main__.py`, its `python -m mmpreproj` entry point.

The scan reads the source (AST), it imports nothing: each module maps to a layer by its folder, and an import
is allowed from the module's own folder or from a lower layer; a peer folder of the same layer or a higher one
is refused. Within a folder, the module graph (top-level imports) must have no circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import mmpreproj

ROOT = Path(mmpreproj.__file__).parent

# Bottom to top; a folder imports only its own modules and those of the layers before it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("version",),
    ("util",),
    ("data",),
    ("modules", "rope"),
    ("hosts", "timm_rope", "models"),
    ("method",),
    ("train",),
    ("eval", "analysis"),
    ("experiments",),
    ("integrations",),
    ("__main__", "__init__"),  # `python -m mmpreproj`, the public API
)
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}

# Imports of the package inside a function, each with its reason. None: the command's deferred imports (one per
# subcommand, so `--help` and a subcommand load only what they need) live outside the package, in
# `mmpreproj_cli/run.py`. The scanner keeps the list for a reason that may come.
DEFERRED_ALLOWED: dict[str, str] = {}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def unit_of(module: str) -> str:
    """The layer unit of `mmpreproj.x.y`: its folder `x` (or `__init__` for the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_of(source: str, module: str, is_package: bool) -> list[tuple[str, tuple[str, ...], int, bool]]:
    """(module named, names taken from it, line, inside a function) for each import statement in `source`."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[str, tuple[str, ...], int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((a.name, (), child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    parts = package.split(".")
                    base = parts[: len(parts) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                found.append((target, tuple(a.name for a in child.names), child.lineno, in_function))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), False)
    return found


def scan(root: Path) -> tuple[dict[str, set[str]], list[str]]:
    """({module: the package modules it imports at the top level}, [violations]) for the package at `root`.
    `from x import y` imports the module `x.y` when there is one, else the module `x`."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    top = root.name
    graph: dict[str, set[str]] = {m: set() for m in files}
    bad: list[str] = []
    for module, path in files.items():
        here = unit_of(module)
        for named, names, line, deferred in imports_of(path.read_text(), module, path.name == "__init__.py"):
            if named != top and not named.startswith(top + "."):
                continue
            submodules = [f"{named}.{n}" for n in names if f"{named}.{n}" in files]
            targets = submodules if submodules and len(submodules) == len(names) else [named]
            for target in targets:
                if target not in files:
                    bad.append(f"{path.relative_to(root)}:{line}: imports {target}, which is no module of the package")
                    continue
                where = f"{path.relative_to(root)}:{line}"
                there = unit_of(target)
                if deferred and here not in DEFERRED_ALLOWED:
                    bad.append(
                        f"{where}: imports {target} inside a function (import it at the top, or add it to "
                        "DEFERRED_ALLOWED with its reason)"
                    )
                if there != here and not (here in RANK and there in RANK and RANK[there] < RANK[here]):
                    bad.append(
                        f"{where}: {module} ({here}, layer {RANK.get(here)}) imports {target} ({there}, "
                        f"layer {RANK.get(there)}), against the order"
                    )
                if not deferred and target != module:
                    graph[module].add(target)
    return graph, bad


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each import circle found by a depth-first walk (one per edge back onto the stack). A module reaching the
    package it sits in is no circle: Python runs the package's `__init__` first, and that one imports it."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []
    found: list[list[str]] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if node.startswith(nxt + "."):
                continue
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node)
    return found


def test_every_folder_of_the_package_has_a_layer():
    units = {unit_of(module_name(p, ROOT)) for p in ROOT.rglob("*.py")}
    assert units - set(RANK) == set(), "add the new folder to LAYERS (and to ARCHITECTURE.md)"


def test_imports_go_down_the_layers_and_none_hides_in_a_function():
    _, bad = scan(ROOT)
    assert bad == []


def test_the_package_has_no_import_circle():
    graph, _ = scan(ROOT)
    assert circles(graph) == []


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "mmpreproj"
    for name, text in {"__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    for folder in {p.parent for p in root.rglob("*.py")}:
        (folder / "__init__.py").touch()
    return root


@pytest.mark.parametrize(
    "files,expected",
    [
        (
            {"hosts/row.py": "from ..method.inject import inject\n", "method/inject.py": ""},
            "hosts/row.py:1: mmpreproj.hosts.row (hosts, layer 4) imports mmpreproj.method.inject (method, layer 5)",
        ),
        (
            {"eval/a.py": "from ..analysis import plot\n", "analysis/plot.py": ""},
            "eval/a.py:1: mmpreproj.eval.a (eval, layer 7) imports mmpreproj.analysis.plot (analysis, layer 7)",
        ),
        (
            {"train/a.py": "def f():\n    from ..method import state\n", "method/state.py": ""},
            "train/a.py:2: imports mmpreproj.method.state inside a function",
        ),
        (
            {"method/a.py": "import mmpreproj.experiments.arms\n", "experiments/arms.py": ""},
            "method/a.py:1: mmpreproj.method.a (method, layer 5) imports mmpreproj.experiments.arms "
            "(experiments, layer 8)",
        ),
    ],
    ids=["up", "peer", "in-a-function", "plain-import-up"],
)
def test_the_scanner_catches_an_import_against_the_order(tmp_path, files, expected):
    _, bad = scan(_package(tmp_path, files))
    assert any(b.startswith(expected) for b in bad), bad


def test_the_scanner_accepts_downward_imports(tmp_path):
    root = _package(
        tmp_path,
        {
            "method/inject.py": "from ..hosts import row\nfrom . import state\n",
            "method/state.py": "",
            "hosts/row.py": "from ..util.io import x\n",
            "util/io.py": "",
        },
    )
    graph, bad = scan(root)
    assert bad == [] and "mmpreproj.hosts.row" in graph["mmpreproj.method.inject"]


def test_the_circle_finder_finds_a_circle_within_a_folder(tmp_path):
    root = _package(tmp_path, {"method/a.py": "from .b import f\n", "method/b.py": "from .a import g\n"})
    graph, _ = scan(root)
    assert circles(graph) == [["mmpreproj.method.a", "mmpreproj.method.b", "mmpreproj.method.a"]]


REPO = ROOT.parent


def crossings(repo: Path, package: str, refused: set[str], allowed: tuple[str, ...] = ()) -> list[str]:
    """'file: imports P' for each module of `repo/package` (but the files `allowed`) that imports a package in
    `refused`, at the top or inside a function."""
    found = []
    for path in sorted((repo / package).rglob("*.py")):
        where = path.relative_to(repo)
        if where.as_posix() in allowed:
            continue
        module = module_name(path, repo / package)
        named = {
            target.split(".")[0] for target, _, _, _ in imports_of(path.read_text(), module, path.stem == "__init__")
        }
        found.extend(f"{where.as_posix()}: imports {name}" for name in sorted(named & refused))
    return found


def test_the_library_imports_the_command_only_in_its_entry_point():
    """No arrow from the library up to the command: `mmpreproj` reads the plain tables from `mmpreproj_tables`."""
    assert crossings(REPO, "mmpreproj", {"mmpreproj_cli"}, allowed=("mmpreproj/__main__.py",)) == []


def test_the_tables_import_neither_the_library_nor_the_command():
    assert crossings(REPO, "mmpreproj_tables", {"mmpreproj", "mmpreproj_cli"}) == []


def test_the_crossing_check_can_fail(tmp_path):
    (tmp_path / "mmpreproj_tables").mkdir()
    (tmp_path / "mmpreproj_tables" / "__init__.py").write_text("from mmpreproj_cli import command\n")
    (tmp_path / "mmpreproj_tables" / "rows.py").write_text(
        "from . import x\n\n\ndef f():\n    import mmpreproj.train\n"
    )
    assert crossings(tmp_path, "mmpreproj_tables", {"mmpreproj", "mmpreproj_cli"}) == [
        "mmpreproj_tables/__init__.py: imports mmpreproj_cli",
        "mmpreproj_tables/rows.py: imports mmpreproj",
    ]
