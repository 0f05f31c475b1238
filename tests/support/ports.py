"""A loopback port held for a server the test starts later.

A port picked with ``free_port`` (bind to 0, close) is only free at that moment: picked at
collection and served minutes later, it can meanwhile be taken by another bind to 0 or an outgoing
connection's ephemeral port (errno 98 in the full suite). ``reserved_port`` keeps a socket bound
to it (SO_REUSEADDR, never listening) for as long as the returned socket is open: Linux gives the
port to no bind to 0 and no outgoing connection meanwhile, while a server that binds with
SO_REUSEADDR itself (asyncio's ``create_server``, so uvicorn's) still binds and listens on it, as
often as it likes. Close the socket when the port is no longer needed (or leave it to the process's
end)."""

from __future__ import annotations

import socket


def reserved_port() -> tuple[int, socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return int(sock.getsockname()[1]), sock
