"""`JsonConfig`: the JSON round trip shared by the dataclass configs (saved with the library version)."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from ..version import __version__
from .validate import check_rule

C = TypeVar("C", bound="JsonConfig")


class JsonConfig:
    """Mixin for dataclass configs: `to_dict/to_json` add `library_version`; `from_dict/from_json` ignore
    unknown keys (e.g. written by a newer version) with a warning instead of failing, refuse a `library_version`
    that is not a string, and hand `INIT_KEYS` (constructor arguments that are not fields) to the constructor."""

    INIT_KEYS: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        d = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}
        d["library_version"] = __version__
        return d

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    @classmethod
    def from_dict(cls: type[C], d: dict[str, Any]) -> C:
        """Build from a dict; unknown keys (e.g. from a newer version) warn and are ignored."""
        if not isinstance(d, dict):
            raise ValueError(
                f"{cls.__name__}: expected a JSON object (a dict of fields), got {type(d).__name__}: {d!r:.80}"
            )
        check_rule(
            isinstance(d.get("library_version", ""), str),
            cls.__name__,
            "library_version",
            d.get("library_version"),
            "a version string",
        )
        known = ({f.name for f in dataclasses.fields(cls)} | set(cls.INIT_KEYS)) - {"library_version"}
        unknown = sorted(set(d) - known - {"library_version"})
        if unknown:
            warnings.warn(
                f"{cls.__name__}: ignoring unknown keys {unknown} "
                f"(saved by mmpreproj {d.get('library_version', '?')}, this is {__version__})",
                stacklevel=2,
            )
        return cls(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def from_json(cls: type[C], path: str | Path) -> C:
        """Read a file written by `to_json`; a file that is not a JSON object is refused, naming the file."""
        path = Path(path)
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{cls.__name__}: {path} is not valid JSON ({e})") from None
        except RecursionError:  # json.loads of a file nested thousands of levels deep
            raise ValueError(f"{cls.__name__}: {path} is not valid JSON (nested too deeply)") from None
        if not isinstance(d, dict):
            raise ValueError(f"{cls.__name__}: {path} holds a JSON {type(d).__name__}, expected an object of fields")
        return cls.from_dict(d)
