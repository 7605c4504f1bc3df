"""Make any network attempt visible to a test: every socket connect / DNS lookup is recorded and refused."""

from __future__ import annotations

import socket

import pytest


def refuse_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Patch socket connects, `socket.create_connection` and DNS lookups to record the call and raise OSError
    (so nothing ever leaves the machine); returns the list of recorded attempts, e.g. ["connect ('h', 443)"]."""
    attempts: list[str] = []

    def refuse(what: str):
        def call(*args, **kwargs):
            target = args[1] if what.startswith(("connect", "connect_ex")) and len(args) > 1 else args[:2]
            attempts.append(f"{what} {target!r}")
            raise OSError(f"network access refused in this test ({what})")

        return call

    monkeypatch.setattr(socket.socket, "connect", refuse("connect"))
    monkeypatch.setattr(socket.socket, "connect_ex", refuse("connect_ex"))
    monkeypatch.setattr(socket, "create_connection", refuse("create_connection"))
    monkeypatch.setattr(socket, "getaddrinfo", refuse("getaddrinfo"))
    return attempts
