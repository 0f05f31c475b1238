"""Limits on an HTTP request's head: too large, or too many header fields, gets ``431``.

uvicorn's httptools protocol (the one ``uvicorn[standard]`` runs) takes a head of any size: a
header line is buffered until it ends however long it grows, and 5,000 headers reach the app. A
WebSocket upgrade is then read a second time by the websockets library, whose own limits (8 KiB a
line, 128 headers), when exceeded, end the handshake without a word: the client waits until it
times out.

The protocols here count, once the parser has the whole head, the bytes of the request target
and of each header name and value, and the header fields. Over ``Limits.max_header_bytes`` or
``Limits.max_headers`` the client gets ``431 Request Header Fields Too Large`` with an OpenAI-shaped
JSON error before the request reaches the app or the WebSocket handshake, and the connection is
closed. An upgrade is held to the websockets limits as well, so what that library would drop in
silence is answered here. Until the head is complete its raw bytes are bounded instead, so a
header line that never ends is refused while it grows. Checking once per head, not in a callback
per header, and counting bytes only for a head that came in reads larger than the limit, keeps the
cost to an ordinary request to a few comparisons.

A request head must also arrive whole within ``Limits.header_timeout_s`` of the connection opening
(or, on a kept-alive connection, of its first byte): uvicorn starts no timer before a first response,
so a connection that never finishes its head (or sends nothing) used to be held for ever. Late,
it gets ``408`` with an OpenAI-shaped error and is closed.

httptools when it is installed, else h11 (whose own buffer limit is then the raw bound).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from itertools import chain
from typing import Any

import h11
import msgspec
from uvicorn.protocols.http.h11_impl import H11Protocol

from realtime_omni.config import Limits
from realtime_omni.errors import RealtimeError, error_body

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # no httptools: h11 serves alone
    HttpToolsProtocol = None  # type: ignore[assignment, misc]

try:
    from websockets import http11 as websockets_http
except ImportError:  # no websockets: uvicorn hands no upgrade to it
    websockets_http = None  # type: ignore[assignment]

# After the 431, what the client is still sending is read and dropped for this long before the
# socket closes: closing with unread input makes the kernel answer with a reset, which can destroy
# the 431 before the client has read it.
LINGER_S = 2.0
# What framing adds to a head line beyond what is counted (": ", CRLF, optional whitespace; the
# method and version on the request line): the raw bound on an incomplete head allows this much.
FRAMING_PER_LINE = 64


class HeadTooLarge(Exception):
    """Raised from a parser callback: it stops the parser, and uvicorn calls ``send_400_response``."""


def asks_for_websocket(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    connection = upgrade = b""
    for name, value in headers:  # names lowercased, as both parsers give them
        if name == b"connection":
            connection = value.lower()
        elif name == b"upgrade":
            upgrade = value.lower()
    return upgrade == b"websocket" and b"upgrade" in connection


class HeadLimits:
    """What both protocols share: the checks, and the 431. Set on a subclass by ``http_protocol``."""

    max_header_bytes: int
    max_headers: int
    max_raw_head: int  # bytes of a head still incomplete, framing included
    header_timeout_s: float  # a head must be complete this long after the connection (or the request) began
    refusal: str | None = None  # why the request was refused: from then on the connection only lingers
    _head_timer: asyncio.TimerHandle | None = None

    # of the uvicorn protocol this is mixed into
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    server_state: Any
    logger: Any

    def check_head(self, target: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        if len(headers) > self.max_headers:
            self.refuse(f"more than {self.max_headers} header fields")
        if len(target) + sum(map(len, chain.from_iterable(headers))) > self.max_header_bytes:
            self.refuse(f"more than {self.max_header_bytes} bytes of request target and header fields")

    def check_upgrade(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        """uvicorn hands websockets the upgrade as ``name: value`` CRLF lines; hold it to that
        library's line length and header count, which it enforces by not answering at all."""
        if websockets_http is None or not asks_for_websocket(headers):
            return
        line = max([len(method) + len(target) + len(b"  HTTP/1.1\r\n")] + [len(n) + len(v) + len(b": \r\n") for n, v in headers])
        if line > websockets_http.MAX_LINE_LENGTH:
            self.refuse(f"a line of a WebSocket upgrade over {websockets_http.MAX_LINE_LENGTH} bytes")
        if len(headers) > websockets_http.MAX_NUM_HEADERS:
            self.refuse(f"more than {websockets_http.MAX_NUM_HEADERS} header fields in a WebSocket upgrade")

    def refuse(self, why: str) -> None:
        self.refusal = why
        raise HeadTooLarge(why)

    # ------------------------------------------------------------------ the head's deadline

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self.head_started()

    def connection_lost(self, exc: Exception | None) -> None:
        self.head_done()
        super().connection_lost(exc)  # type: ignore[misc]

    def head_started(self) -> None:
        self.head_done()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_late)

    def head_done(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self.refusal is None and not self.transport.is_closing():
            self.refusal = f"no complete request head within {self.header_timeout_s:g} s"
            self.logger.info("Request head timed out (%s): answered 408.", self.refusal)
            self._answer(b"408 Request Timeout", "request_timeout", f"Request timeout: {self.refusal}.")

    def send_400_response(self, msg: str) -> None:
        if self.refusal is None:
            super().send_400_response(msg)  # type: ignore[misc]
            return
        self.logger.warning("Request header fields too large (%s): answered 431.", self.refusal)
        self._answer(b"431 Request Header Fields Too Large", "request_header_fields_too_large", f"Request header fields too large: {self.refusal}.")

    def _answer(self, status: bytes, code: str, message: str) -> None:
        """An OpenAI-shaped error, then the connection ends (it lingers for the client to read it)."""
        self.head_done()
        body = msgspec.json.encode(error_body(RealtimeError(message, code=code)))
        lines = [b"HTTP/1.1 " + status]
        lines += [name + b": " + value for name, value in self.server_state.default_headers]
        lines += [b"content-type: application/json", b"content-length: %d" % len(body), b"connection: close"]
        self.transport.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        if self.transport.can_write_eof():
            self.transport.write_eof()  # the client reads the answer, then the end of the stream
            self.loop.call_later(LINGER_S, self.transport.close)  # sooner if the client closes
        else:
            self.transport.close()


if HttpToolsProtocol is not None:

    class HttpToolsHeadLimits(HeadLimits, HttpToolsProtocol):
        """httptools buffers a header until it ends and hands the head over in callbacks; it is
        checked when complete, and bounded while it is not."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.read = 0  # bytes of the read being parsed
            self.head_open = False  # from a request's first byte to the end of its headers
            self.first_read = self.head_reads = 0  # the read a head began in; all the reads it is in
            self.first_request_done = False

        def data_received(self, data: bytes) -> None:
            if self.refusal is not None:
                return  # answered: lingering until the client, or the timer, closes
            if self.head_open:
                self.head_reads += len(data)
            self.read = len(data)
            super().data_received(data)
            # The reads after the first are all head while it is still open (the first is left out:
            # it may end a pipelined request's body).
            if self.head_open and self.head_reads - self.first_read > self.max_raw_head and self.refusal is None and not self.transport.is_closing():
                self.refusal = f"more than {self.max_header_bytes} bytes of request target and header fields"
                self.send_400_response("")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self.first_request_done:
                self.head_started()  # a kept-alive connection's next request: its head's own deadline
            self.first_request_done = True
            self.head_open = True
            self.first_read = self.head_reads = self.read

        def on_headers_complete(self) -> None:
            self.head_open = False
            self.head_done()
            # A head holds no more bytes than the reads it came in: only one that came in more than
            # the limit's worth is counted byte by byte (an ordinary request costs two comparisons).
            if self.head_reads > self.max_header_bytes or len(self.headers) > self.max_headers:
                self.check_head(self.url, self.headers)
            if self.parser.should_upgrade():
                self.check_upgrade(self.parser.get_method(), self.url, self.headers)
            super().on_headers_complete()


class CheckedH11Connection(h11.Connection):
    """h11 hands over the whole head at once, as a ``Request``: checked as it comes out."""

    def __init__(self, protocol: H11HeadLimits) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=protocol.max_raw_head)
        self.protocol = protocol

    def next_event(self) -> Any:
        try:
            event = super().next_event()
            if isinstance(event, h11.Request):
                self.protocol.head_done()
                headers = list(event.headers)
                self.protocol.check_head(event.target, headers)
                self.protocol.check_upgrade(event.method, event.target, headers)
        except h11.RemoteProtocolError as exc:
            if exc.error_status_hint == 431:  # h11's own buffer limit
                self.protocol.refusal = f"more than {self.protocol.max_header_bytes} bytes of request target and header fields"
            raise
        except HeadTooLarge as exc:
            raise h11.RemoteProtocolError(str(exc), error_status_hint=431) from exc
        return event


class H11HeadLimits(HeadLimits, H11Protocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = CheckedH11Connection(self)  # in place of uvicorn's, before it has seen a byte

    def data_received(self, data: bytes) -> None:
        if self.refusal is None:
            super().data_received(data)


def http_protocol(limits: Limits, parser: str | None = None) -> type[asyncio.Protocol]:
    """The HTTP protocol for ``uvicorn.Config(http=...)`` that enforces ``limits``' head limits:
    on httptools (the default when installed) or h11 (``parser="h11"``, or without httptools)."""
    if parser is None:
        parser = "h11" if HttpToolsProtocol is None else "httptools"
    base: type[HeadLimits] = HttpToolsHeadLimits if parser == "httptools" else H11HeadLimits
    values = {
        "max_header_bytes": limits.max_header_bytes,
        "max_headers": limits.max_headers,
        "max_raw_head": limits.max_header_bytes + FRAMING_PER_LINE * (limits.max_headers + 1),
        "header_timeout_s": limits.header_timeout_s,
    }
    return type(base.__name__, (base,), values)
