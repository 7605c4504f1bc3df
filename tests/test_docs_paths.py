"""Every test file the README, ARCHITECTURE.md, docs/ and CHANGELOG's current sections name exists, and every
pattern they name (`tests/test_host_*.py`) matches one (tests move between folders: a page must not point at where
one used to be)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST_PATH = re.compile(r"tests/[\w/*]+\.py")


def _current_changelog() -> str:
    """CHANGELOG.md up to its first released version: the rules and the unreleased changes (released entries keep
    the paths of their time)."""
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    released = re.search(r"^## \[\d", text, flags=re.M)
    return text[: released.start()] if released else text


def test_every_named_test_file_exists():
    pages = {
        p.relative_to(ROOT): p.read_text(encoding="utf-8") for p in [ROOT / "README.md", ROOT / "ARCHITECTURE.md"]
    }
    pages |= {p.relative_to(ROOT): p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").rglob("*.md"))}
    pages[Path("CHANGELOG.md")] = _current_changelog()
    missing = sorted(
        f"{page}: {path}"
        for page, text in pages.items()
        for path in set(TEST_PATH.findall(text))
        if not any(f.is_file() for f in ROOT.glob(path))
    )
    assert not missing, f"pages name test files that do not exist: {missing}"
