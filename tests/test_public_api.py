"""Public means public: every name in `mmpreproj.__all__` has a docstring and appears in the API reference
that the documentation site builds from those docstrings (`docs/api.md`, `mkdocs build --strict`)."""

from __future__ import annotations

import inspect
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import mmpreproj

ROOT = Path(__file__).resolve().parents[1]
NOT_DOCUMENTED = {"__version__"}  # a string: documented in mmpreproj/version.py and CHANGELOG.md


def _own_doc(obj: object) -> str:
    """The object's own docstring (not one inherited from a base class or `object`)."""
    if inspect.isclass(obj):
        return obj.__dict__.get("__doc__") or ""
    return inspect.getdoc(obj) or ""


@pytest.mark.parametrize("name", sorted(set(mmpreproj.__all__) - NOT_DOCUMENTED))
def test_public_name_has_a_docstring(name):
    obj = getattr(mmpreproj, name)
    assert len(_own_doc(obj).strip()) > 10, f"mmpreproj.{name} has no docstring of its own"


def test_all_names_exist_once():
    assert len(mmpreproj.__all__) == len(set(mmpreproj.__all__))
    missing = [n for n in mmpreproj.__all__ if not hasattr(mmpreproj, n)]
    assert not missing, missing


def _inventory(site: Path) -> set[str]:
    """The names in mkdocstrings' `objects.inv` (a header of four lines, then zlib-compressed rows)."""
    raw = (site / "objects.inv").read_bytes().split(b"\n", 4)[4]
    return {line.split()[0] for line in zlib.decompress(raw).decode().splitlines() if line.strip()}


@pytest.mark.slow
def test_api_reference_lists_every_public_name(tmp_path):
    """Builds the site in strict mode (a broken link, a missing page or an unresolved reference fails) and
    checks the API reference holds every public name."""
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    assert mkdocs, "mkdocs is not installed: pip install -e '.[docs]' (the dev extra includes it)"
    site = tmp_path / "site"
    run = subprocess.run(
        [mkdocs, "build", "--strict", "-q", "-d", str(site)], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    documented = _inventory(site)
    missing = sorted(f"mmpreproj.{n}" for n in mmpreproj.__all__ if f"mmpreproj.{n}" not in documented)
    assert not missing, f"not in the API reference (docs/api.md): {missing}"
