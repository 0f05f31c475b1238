"""Request heads over the limits (``Limits.max_header_bytes``: request target plus header names and
values; ``Limits.max_headers``) get ``431`` with an OpenAI-shaped error and a closed connection,
WebSocket upgrades included; heads within them, and WebSocket sessions, are unaffected.

Spoken over raw sockets, so that what the server answers (or fails to) is seen as it is. Each
test runs against the default server (httptools, default limits), a server with other limits, and
the same on h11 (the fallback when httptools is not installed)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, NamedTuple

import httpx
import pytest
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from websockets import http11 as websockets_http

from host.http_limits import http_protocol
from tests.conftest import synthetic_config
from tests.support.client import connect
from tests.support.server import ServerThread

TIMEOUT = 10.0  # every read: an answer that does not come is a failure, not a hang
# Over the websockets library's header count (128) and wider than its line (8 KiB): upgrades meet
# the library's limits before these.
OTHER_LIMITS = {"max_header_bytes": 16384, "max_headers": 200}
WS_TARGET = "/v1/realtime?model=m"
UPGRADE = [
    ("Connection", "Upgrade"),
    ("Upgrade", "websocket"),
    ("Sec-WebSocket-Version", "13"),
    ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ("Authorization", "Bearer test-key"),
]


@pytest.fixture(scope="module", params=["httptools", "httptools-other-limits", "h11-other-limits"])
def limited(request: Any, server: ServerThread) -> Any:
    if request.param == "httptools":
        assert issubclass(server.uvicorn.config.http_protocol_class, HttpToolsProtocol)
        yield server
        return
    srv = ServerThread(synthetic_config(limits=OTHER_LIMITS))
    if request.param.startswith("h11"):
        srv.uvicorn.config.http = http_protocol(srv.config.limits, parser="h11")
    srv.start()
    parser = H11Protocol if request.param.startswith("h11") else HttpToolsProtocol
    assert issubclass(srv.uvicorn.config.http_protocol_class, parser)
    yield srv
    srv.stop()


class Reply(NamedTuple):
    status: int
    headers: dict[str, str]
    body: bytes


def fields(port: int, headers: list[tuple[str, str]], connection: str, upgrade: bool) -> list[tuple[str, str]]:
    return [("Host", f"127.0.0.1:{port}"), *(UPGRADE if upgrade else [("Connection", connection)]), *headers]


def head(port: int, headers: list[tuple[str, str]], target: str = "/healthz", upgrade: bool = False, connection: str = "close") -> bytes:
    """A GET with Host, then Connection (or the WebSocket upgrade's headers), then ``headers``."""
    lines = [f"GET {target} HTTP/1.1", *(f"{name}: {value}" for name, value in fields(port, headers, connection, upgrade))]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def head_size(port: int, headers: list[tuple[str, str]], target: str = "/healthz", upgrade: bool = False, connection: str = "close") -> tuple[int, int]:
    """What the limits count of ``head(...)``: target + names + values, and the header fields."""
    counted = fields(port, headers, connection, upgrade)
    return len(target) + sum(len(name) + len(value) for name, value in counted), len(counted)


def parse(raw: bytes) -> Reply:
    start, sep, body = raw.partition(b"\r\n\r\n")
    assert sep, f"no complete HTTP answer: {raw[:300]!r}"
    status_line, *lines = start.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Reply(int(status_line.split(" ", 2)[1]), headers, body)


async def exchange(port: int, data: bytes) -> Reply:
    """Send ``data`` and read the answer up to the end of the stream: the server must close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        return parse(await asyncio.wait_for(reader.read(), TIMEOUT))
    finally:
        writer.close()


async def upgrade_answer(port: int, data: bytes) -> Reply:
    """Send an upgrade and read the answer's head (a 101 leaves the connection open)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
        reply = parse(raw)
        if reply.status != 101:  # the body too, then the end of the stream
            rest = await asyncio.wait_for(reader.read(), TIMEOUT)
            reply = reply._replace(body=rest)
        return reply
    finally:
        writer.close()


def assert_431(reply: Reply) -> None:
    assert reply.status == 431, reply
    assert reply.headers["content-type"] == "application/json"
    assert reply.headers["connection"] == "close"
    assert int(reply.headers["content-length"]) == len(reply.body)
    body = json.loads(reply.body)
    assert list(body) == ["error"]
    error = body["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "request_header_fields_too_large"
    assert error["param"] is None
    assert "too large" in error["message"]


async def test_one_header_of_a_mebibyte(limited):
    reply = await exchange(limited.port, head(limited.port, [("X-Big", "a" * 1024 * 1024)]))
    assert_431(reply)


async def test_five_thousand_headers(limited):
    reply = await exchange(limited.port, head(limited.port, [(f"X-H{i}", "v") for i in range(5000)]))
    assert_431(reply)


async def test_header_bytes_up_to_the_limit(limited):
    limit = limited.config.limits.max_header_bytes
    base, _ = head_size(limited.port, [("X-Pad", "")])
    fits = [("X-Pad", "p" * (limit - base))]
    assert head_size(limited.port, fits)[0] == limit
    assert (await exchange(limited.port, head(limited.port, fits))).status == 200
    over = [("X-Pad", "p" * (limit - base + 1))]
    assert_431(await exchange(limited.port, head(limited.port, over)))


@pytest.mark.parametrize("over", [0, 1], ids=["at", "over"])
async def test_a_head_in_small_pieces(limited, over):
    """A head in many reads: bounded while incomplete, and counted exactly once complete."""
    limit = limited.config.limits.max_header_bytes + over
    pad = [(f"X-P{i}", "") for i in range(40)]
    base, _ = head_size(limited.port, pad)
    sizes = [(limit - base) // len(pad) + (i < (limit - base) % len(pad)) for i in range(len(pad))]
    headers = [(name, "p" * size) for (name, _), size in zip(pad, sizes)]
    assert head_size(limited.port, headers)[0] == limit
    data = head(limited.port, headers)
    reader, writer = await asyncio.open_connection("127.0.0.1", limited.port)
    try:
        for at in range(0, len(data), 512):
            writer.write(data[at : at + 512])
            await writer.drain()
            await asyncio.sleep(0.001)  # the test's input: each piece arrives in a read of its own
        reply = parse(await asyncio.wait_for(reader.read(), TIMEOUT))
    finally:
        writer.close()
    if over:
        assert_431(reply)
    else:
        assert reply.status == 200, reply


async def test_a_long_target_counts_too(limited):
    limit = limited.config.limits.max_header_bytes
    base, _ = head_size(limited.port, [], target="/healthz?q=")
    fits = "/healthz?q=" + "q" * (limit - base)
    assert (await exchange(limited.port, head(limited.port, [], target=fits))).status == 200
    assert_431(await exchange(limited.port, head(limited.port, [], target=fits + "q")))


async def test_header_count_up_to_the_limit(limited):
    limit = limited.config.limits.max_headers
    fits = [(f"X-H{i}", "v") for i in range(limit - 2)]  # with Host and Connection
    assert head_size(limited.port, fits)[1] == limit
    assert (await exchange(limited.port, head(limited.port, fits))).status == 200
    assert_431(await exchange(limited.port, head(limited.port, [*fits, ("X-One-More", "v")])))


async def test_a_header_line_that_never_ends(limited):
    """Refused while it grows, not buffered until the line ends (it never does)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", limited.port)

    async def stream() -> None:
        writer.write(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{limited.port}\r\nX-Endless: ".encode())
        with contextlib.suppress(ConnectionError):
            for _ in range(1024):  # 4 MiB at most, never a CRLF
                writer.write(b"e" * 4096)
                await writer.drain()

    sender = asyncio.create_task(stream())
    try:
        assert_431(parse(await asyncio.wait_for(reader.read(), TIMEOUT)))
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender
        writer.close()


async def test_websocket_upgrade_with_a_100_kb_header(limited):
    data = head(limited.port, [("X-Big", "b" * 100_000)], target=WS_TARGET, upgrade=True)
    assert_431(await upgrade_answer(limited.port, data))


async def test_websocket_upgrade_with_ordinary_headers(limited):
    reply = await upgrade_answer(limited.port, head(limited.port, [("User-Agent", "test")], target=WS_TARGET, upgrade=True))
    assert reply.status == 101
    assert reply.headers["upgrade"].lower() == "websocket"


async def test_websocket_upgrade_held_to_the_websockets_line_limit(limited):
    """websockets re-reads the upgrade (``name: value`` CRLF lines) and drops a longer line without
    a word; such a line is within the plain request limit, and gets 431 on an upgrade."""
    line = websockets_http.MAX_LINE_LENGTH
    fits = [("x-long", "l" * (line - len("x-long: \r\n")))]
    over = [("x-long", fits[0][1] + "l")]
    assert head_size(limited.port, over)[0] <= limited.config.limits.max_header_bytes
    assert (await exchange(limited.port, head(limited.port, over))).status == 200
    assert (await upgrade_answer(limited.port, head(limited.port, fits, target=WS_TARGET, upgrade=True))).status == 101
    assert_431(await upgrade_answer(limited.port, head(limited.port, over, target=WS_TARGET, upgrade=True)))


async def test_websocket_upgrade_held_to_the_lower_header_count(limited):
    """An upgrade may carry as many header fields as the lower of the server's limit and the
    websockets library's (which would otherwise answer nothing past its own)."""
    library = websockets_http.MAX_NUM_HEADERS
    most = min(library, limited.config.limits.max_headers)
    fits = [(f"x-h{i}", "v") for i in range(most - 1 - len(UPGRADE))]  # with Host and the upgrade's
    assert head_size(limited.port, fits, upgrade=True)[1] == most
    over = [*fits, ("x-one-more", "v")]
    if most == library:  # only the upgrade is held to the library's count: a plain request passes
        assert (await exchange(limited.port, head(limited.port, over))).status == 200
    assert (await upgrade_answer(limited.port, head(limited.port, fits, target=WS_TARGET, upgrade=True))).status == 101
    assert_431(await upgrade_answer(limited.port, head(limited.port, over, target=WS_TARGET, upgrade=True)))


async def test_keep_alive_requests_each_get_their_own_budget(limited):
    """Three requests on one connection, each at the limit: the count starts again for each."""
    limit = limited.config.limits.max_header_bytes
    requests = b""
    for connection in ("keep-alive", "keep-alive", "close"):
        base, _ = head_size(limited.port, [("X-Pad", "")], connection=connection)
        requests += head(limited.port, [("X-Pad", "p" * (limit - base))], connection=connection)
    reader, writer = await asyncio.open_connection("127.0.0.1", limited.port)
    try:
        writer.write(requests)
        raw = await asyncio.wait_for(reader.read(), TIMEOUT)
    finally:
        writer.close()
    assert raw.count(b"HTTP/1.1 200 OK") == 3, raw[:500]
    assert b" 431 " not in raw


async def test_still_healthy_afterwards(limited, server):
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        assert (await http.get(f"{limited.http_url}/healthz")).status_code == 200
    async with connect(limited.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": {"type": "realtime", "instructions": "still here"}})
        assert (await c.expect("session.updated")).session.instructions == "still here"
    if limited is not server:  # a server of this module's own: every connection above has closed
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TIMEOUT
        while (open_now := limited.call(lambda: len(limited.uvicorn.server_state.connections))) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        assert open_now == 0
