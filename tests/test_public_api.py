"""Public means public: a module is public when the API reference documents it (`docs/api.md`, a `:::` line),
only a public module has an `__all__`, and every name in a public `__all__` has a docstring and appears in the
reference that the documentation site builds from those docstrings (`mkdocs build --strict`)."""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mmpreproj", "mmpreproj_cli", "mmpreproj_tables")
NOT_DOCUMENTED = {("mmpreproj", "__version__")}  # a string: documented in mmpreproj/version.py and CHANGELOG.md


def _documented() -> list[str]:
    """The modules docs/api.md documents whole (`::: module` with `members: true` or none)."""
    text = (ROOT / "docs" / "api.md").read_text()
    return [m for m in re.findall(r"^::: ([\w.]+)$", text, re.M) if _path(m) is not None]


def _path(module: str) -> Path | None:
    """The module's file, or None when `module` names no module (a `::: module.name` line for one name)."""
    base = ROOT / Path(*module.split("."))
    return next((p for p in (base / "__init__.py", base.with_suffix(".py")) if p.is_file()), None)


def _exports(path: Path) -> list[str] | None:
    """The names of the module's top-level `__all__` (None when it has none), read without importing it."""
    for node in ast.parse(path.read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == "__all__":
            return [ast.literal_eval(e) for e in node.value.elts]
    return None


def _modules_with_all() -> set[str]:
    found = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if _exports(path) is not None:
                found.add(module)
    return found


PUBLIC = _documented()
NAMES = [(m, n) for m in PUBLIC for n in _exports(_path(m)) or [] if (m, n) not in NOT_DOCUMENTED]


def test_only_the_documented_modules_have_an_all():
    internal = _modules_with_all() - set(PUBLIC)
    assert internal == set(), "an internal module has an __all__ (remove it, or document the module in docs/api.md)"
    assert [m for m in PUBLIC if _exports(_path(m)) is None] == [], "a documented module without an __all__"


def test_all_names_exist_once():
    for module in PUBLIC:
        names, mod = _exports(_path(module)), importlib.import_module(module)
        assert len(names) == len(set(names)), module
        assert [n for n in names if not hasattr(mod, n)] == [], module


def _own_doc(obj: object) -> str:
    """The object's own docstring (not one inherited from a base class or `object`)."""
    if inspect.isclass(obj):
        return obj.__dict__.get("__doc__") or ""
    return inspect.getdoc(obj) or ""


@functools.cache
def _griffe_modules():  # -> griffe.ModulesCollection
    griffe = pytest.importorskip("griffe")  # the docs' reader of docstrings (mkdocstrings[python])
    loader = griffe.GriffeLoader(search_paths=[str(ROOT)])
    for package in PACKAGES:
        loader.load(package)
    loader.resolve_aliases(external=True)
    return loader.modules_collection


def _attribute_doc(module: str, name: str) -> str:
    """A constant's docstring (the string right after its assignment), as the API reference reads it."""
    obj = _griffe_modules()[module][name]
    target = obj.final_target if obj.is_alias else obj
    return target.docstring.value if target.docstring else ""


@pytest.mark.parametrize("module,name", NAMES, ids=[f"{m}.{n}" for m, n in NAMES])
def test_public_name_has_a_docstring(module, name):
    obj = getattr(importlib.import_module(module), name)
    plain = inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj)
    doc = _own_doc(obj) if plain else _attribute_doc(module, name)
    assert len(doc.strip()) > 10, f"{module}.{name} has no docstring of its own"


def _inventory(site: Path) -> set[str]:
    """The names in mkdocstrings' `objects.inv` (a header of four lines, then zlib-compressed rows)."""
    raw = (site / "objects.inv").read_bytes().split(b"\n", 4)[4]
    return {line.split()[0] for line in zlib.decompress(raw).decode().splitlines() if line.strip()}


@pytest.mark.slow
def test_api_reference_lists_every_public_name(tmp_path):
    """Builds the site in strict mode (a broken link, a missing page or an unresolved reference fails) and
    checks the API reference holds every public name (under its module, or where it is defined when a
    submodule has its name, as `mmpreproj.eval.evaluate`)."""
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    assert mkdocs, "mkdocs is not installed: pip install -e '.[docs]' (the dev extra includes it)"
    site = tmp_path / "site"
    run = subprocess.run(
        [mkdocs, "build", "--strict", "-q", "-d", str(site)], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    documented = _inventory(site)
    missing = []
    for module, name in NAMES:
        obj = getattr(importlib.import_module(module), name)
        home = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
        if f"{module}.{name}" not in documented and home not in documented:
            missing.append(f"{module}.{name}")
    assert not missing, f"not in the API reference (docs/api.md): {missing}"
