"""`docs/private-touchpoints.md` is true to the package: every row of its list A names files that exist and private
names that those files use, its count is the number of rows, and every private module path or private name imported
from another library in the package is in the list (issue 45, item 4)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "private-touchpoints.md"
PACKAGES = ("mmpreproj", "mmpreproj_cli", "mmpreproj_tables")
OTHERS = r"(?:peft|transformers|torch|timm|lm_eval|accelerate|deepspeed|kernels)"
# a dotted path of another library with a private segment (`torch.utils._pytree`), in code or in a string
PRIVATE_PATH = re.compile(rf"\b{OTHERS}(?:\.\w+)*\.(_[A-Za-z]\w*)")
# `from <other library>... import _name`
PRIVATE_IMPORT = re.compile(rf"^\s*from {OTHERS}[\w.]* import \(?\s*(_\w+)", re.M)


def _rows_of_list_a() -> list[list[str]]:
    text = DOC.read_text(encoding="utf-8")
    part = text.split("## A.", 1)[1].split("\n## ", 1)[0]
    return [
        [c.strip() for c in line.strip("|").split("|")] for line in part.splitlines() if re.match(r"\| A\d+ ", line)
    ]


def _without_comments(source: str) -> str:
    """`source` less its comments (a comment may name a private module without using it)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return tokenize.untokenize((t.type, t.string) for t in tokens if t.type != tokenize.COMMENT)


def _package_sources() -> dict[Path, str]:
    files = (p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py")))
    return {p: _without_comments(p.read_text(encoding="utf-8")) for p in files}


def test_each_row_names_files_that_use_its_private_names():
    rows = _rows_of_list_a()
    assert rows, "list A has no rows"
    for number, where, _library, names, *_ in rows:
        files = [ROOT / f.split(":")[0] for f in re.findall(r"`(mmpreproj[\w/]*\.py)[^`]*`", where)]
        assert files, f"{number}: no file named in {where!r}"
        for f in files:
            assert f.is_file(), f"{number}: {f} does not exist"
        text = "\n".join(f.read_text(encoding="utf-8") for f in files)
        for name in set(re.findall(r"(?<![\w])(_[A-Za-z]\w*)", names)):
            assert name in text, f"{number}: {name} is not used in {[str(f.relative_to(ROOT)) for f in files]}"


def test_the_stated_count_is_the_number_of_rows():
    text = DOC.read_text(encoding="utf-8")
    stated = int(re.search(r"## A\. Reads and writes \((\d+) entries\)", text).group(1))
    assert stated == len(_rows_of_list_a())
    architecture = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    assert f"{stated} reads or writes of another library's private" in architecture


def test_every_private_path_or_import_of_another_library_is_listed():
    listed = DOC.read_text(encoding="utf-8")
    missing = set()
    for path, text in _package_sources().items():
        for name in {*PRIVATE_PATH.findall(text), *PRIVATE_IMPORT.findall(text)}:
            if name not in listed:
                missing.add(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, f"private names of other libraries missing from {DOC.name}: {sorted(missing)}"
