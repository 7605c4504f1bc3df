"""The lowest versions pyproject.toml allows are ones the library can run on: no floor below what a dependency we
import needs itself (transformers 5 disables torch below 2.6: a `torch>=2.1` floor let pip keep a torch that
transformers then refuses)."""

from __future__ import annotations

from importlib.metadata import requires
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _floor(specs: list[str], name: str) -> Version | None:
    """The `>=` bound on `name` among requirement strings (markers other than an extra ignored), else None."""
    for spec in specs:
        req = Requirement(spec)
        if req.name.lower() == name and (req.marker is None or "extra" in str(req.marker)):
            bounds = [Version(s.version) for s in req.specifier if s.operator == ">="]
            if bounds:
                return max(bounds)
    return None


def test_our_torch_floor_is_not_below_what_transformers_and_peft_need():
    ours = _floor(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"], "torch")
    assert ours is not None
    for package in ("transformers", "peft"):
        theirs = _floor(requires(package) or [], "torch")
        assert theirs is None or ours >= theirs, f"pyproject allows torch {ours}, {package} needs >= {theirs}"


def test_the_floor_parser_reads_a_bound():
    assert _floor(['torch>=2.6; extra == "torch"', "numpy"], "torch") == Version("2.6")
    assert _floor(["torch"], "torch") is None
