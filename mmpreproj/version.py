"""The library version, written into every saved adapter config."""

__version__ = "0.1.0"
