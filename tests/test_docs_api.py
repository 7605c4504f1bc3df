"""What the guides use, the API reference documents: every `mmpreproj...` name imported or used in the Python
code blocks of README.md and docs/*.md is documented in docs/api.md, under its own `:::` line or as a member
of a module or class documented there. Read without building the site (the built reference is checked against
the public names in tests/test_public_api.py)."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^([ \t]*)```(?:python|py)[^\n]*\n(.*?)^[ \t]*```", re.S | re.M)
PACKAGES = ("mmpreproj", "mmpreproj_cli", "mmpreproj_tables")


def python_blocks(text: str) -> list[str]:
    """The ```python fences of a Markdown page, in order, dedented (a fence may sit inside a list item)."""
    return [textwrap.dedent(body) for _, body in FENCE.findall(text)]


def used_names(code: str) -> set[str]:
    """The dotted `mmpreproj...` names `code` imports or reads: `from mmpreproj.rope import RoPE1D` gives
    `mmpreproj.rope.RoPE1D`; `import mmpreproj as mp; mp.inject(m)` gives `mmpreproj.inject`; a name read off an
    imported class (`PreProjConfig.for_budget`) gives that member; `mmpreproj.x` counts without its import."""
    tree = ast.parse(code)
    aliases = {p: p for p in PACKAGES}  # a local name -> the dotted name it stands for (a page may skip the import)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in PACKAGES:
                    found.add(a.name)
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in PACKAGES:
            for a in node.names:
                found.add(f"{node.module}.{a.name}")
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain, base = [], node
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in aliases:
                found.add(".".join([aliases[base.id], *reversed(chain)]))
    return found


def _resolve(dotted: str) -> tuple[str, list[str], object]:
    """(the longest importable module of `dotted`, the attribute path after it, the object it names)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        module = ".".join(parts[:i])
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return module, parts[i:], obj
    raise ImportError(dotted)


def _directives() -> set[str]:
    return set(re.findall(r"^::: ([\w.]+)$", (ROOT / "docs" / "api.md").read_text(), re.M))


def documented(dotted: str, directives: set[str]) -> bool:
    """`dotted` has its own `:::` line, is in the `__all__` of a module that has one, or is a documented member
    (a method or attribute with a docstring of its own) of a class documented either way."""
    if dotted in directives:
        return True
    module, path, obj = _resolve(dotted)
    if not path:
        return module in directives
    if len(path) == 1:
        if module in directives and path[0] in getattr(importlib.import_module(module), "__all__", ()):
            return True
        home = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
        return home in directives  # `::: package.module.Name`, imported under a shorter path
    owner = ".".join([module, *path[:-1]])
    member = inspect.getattr_static(_resolve(owner)[2], path[-1], None)
    has_doc = bool(inspect.getdoc(member)) if member is not None else False
    return documented(owner, directives) and has_doc


def _uses() -> list[tuple[str, str]]:
    uses = set()
    for page in PAGES:  # a page's blocks read as one program: a later block uses what an earlier one imported
        code = "\n".join(python_blocks(page.read_text()))
        uses |= {(page.relative_to(ROOT).as_posix(), name) for name in used_names(code)}
    return sorted(uses)


USES = _uses()


def test_the_collector_reads_imports_aliases_and_members():
    code = textwrap.dedent("""
        import mmpreproj
        import mmpreproj as mp
        from mmpreproj.rope import RoPE1D as R, grid_positions
        from mmpreproj import PreProjConfig
        mp.inject(model, PreProjConfig.for_budget(1))
        mmpreproj.rope.RoPE2D(8)
        mmpreproj_tables.METHODS
        R(8)
        import torch
        torch.nn.Linear(2, 2)
    """)
    assert used_names(code) == {
        "mmpreproj",
        "mmpreproj.inject",
        "mmpreproj.rope",
        "mmpreproj.rope.RoPE1D",
        "mmpreproj.rope.RoPE2D",
        "mmpreproj.rope.grid_positions",
        "mmpreproj.PreProjConfig",
        "mmpreproj.PreProjConfig.for_budget",
        "mmpreproj_tables.METHODS",
    }
    assert python_blocks("text\n\n- item\n\n  ```python\n  x = 1\n  ```\n\n```bash\nls\n```\n") == ["x = 1\n"]


def test_the_check_can_fail():
    directives = _directives()
    assert not documented("mmpreproj.modules.SelfAttention", directives)  # internal: used by Block, not in api.md
    assert documented("mmpreproj.rope.RoPE1D", directives)


def test_the_guides_use_mmpreproj():
    assert len({name for _, name in USES}) >= 10, USES  # the collector finds the guides' names at all


@pytest.mark.parametrize("page,name", USES, ids=[f"{p}:{n}" for p, n in USES])
def test_every_name_a_guide_uses_is_in_the_api_reference(page, name):
    assert documented(name, _directives()), f"{page} uses {name}, which docs/api.md does not document"
