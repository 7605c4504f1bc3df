"""The library version, written into every saved adapter config (`library_version`).

Versions follow the public API and the adapter file format (CHANGELOG.md, "Versions"): a release that changes
either raises the minor version while below 1.0; the file format itself has its own number,
`mmpreproj.method.config.ADAPTER_FORMAT`, saved as `format_version` with every adapter.
"""

__version__ = "0.5.0"
