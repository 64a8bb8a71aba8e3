"""One place that picks a free TCP port (rendezvous, controllers in tests and benchmarks)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago; the caller binds it right after.

    ``host=""`` asks for a port free on every interface (a Ray replica's rendezvous, which
    peers on other nodes connect to)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
