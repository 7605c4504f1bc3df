"""Shared test helpers (imported by test modules; no test module imports another)."""
