"""`make demo`'s script: it must not report another service's answer as its own."""

from __future__ import annotations

import socket

import pytest

from service.demo import _abridge, main


def test_the_demo_refuses_a_port_another_service_holds(tmp_path, monkeypatch):
    """With an earlier demo still on the port, the new one's server failed to start while the
    demo printed the other service's forecast as its own and exited 0."""
    monkeypatch.chdir(tmp_path)
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(SystemExit, match=f"port {port} is in use.*PORT="):
            main(["--port", str(port)])
    assert not (tmp_path / "data").exists()  # refused before any work


def test_the_printout_abridges_only_what_is_longer():
    assert _abridge([]) == []
    assert _abridge([1.234, 2.0]) == [1.23, 2.0]
    assert _abridge(list(range(8))) == [0, 1, 2, 3, 4, 5, "..."]
