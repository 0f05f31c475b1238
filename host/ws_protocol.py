"""uvicorn's WebSocket protocol with two things a realtime server needs that it lacks.

* **A client that stops reading is dropped after ``send_timeout_s``.** Waiting for a send to block
  is not enough: the kernel's send and receive buffers (several MiB on Linux, autotuned) absorb a
  session's output for tens of seconds before uvicorn pauses writing, so such a client used to go
  only when keepalive pings timed out (40-50 s). Here the connection counts the bytes it wrote and
  asks the kernel how many it still holds unacknowledged (``TIOCOUTQ``): bytes delivered =
  written - still pending. Output pending with no byte delivered for ``send_timeout_s`` means the
  peer's window is shut: the connection is aborted, the ASGI app sees a disconnect, the session
  ends. A slow reader still makes progress and stays.
* **A text frame of invalid UTF-8 closes with 1007** (as before) but logs one warning line, not an
  ERROR with a traceback: it is the client's mistake, not a server defect.
"""

from __future__ import annotations

import fcntl
import logging
import struct
import termios
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

log = logging.getLogger(__name__)

CHECK_EVERY_S = 0.5


class _CountingTransport:
    """The transport, counting what is written to it."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _unacknowledged(transport: Any) -> int:
    """Bytes written to the socket that the peer has not acknowledged yet (Linux ``TIOCOUTQ``)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    except (OSError, ValueError):
        return 0


class RealtimeWebSockets(WebSocketsSansIOProtocol):
    send_timeout_s: float = 10.0  # set by ``ws_protocol``

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self.transport = _CountingTransport(self.transport)  # type: ignore[assignment]
        self._delivered = 0
        self._progress_at = self.loop.time()
        self._stall_timer = self.loop.call_later(CHECK_EVERY_S, self._check_stall)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stall_timer.cancel()
        super().connection_lost(exc)

    def pending_bytes(self) -> int:
        """Output not yet delivered: in uvicorn's transport buffer, or unacknowledged in the kernel."""
        transport = self.transport._transport  # type: ignore[attr-defined]
        return transport.get_write_buffer_size() + _unacknowledged(transport)

    def _check_stall(self) -> None:
        transport = self.transport
        if transport.is_closing():
            return
        now = self.loop.time()
        pending = self.pending_bytes()
        delivered = transport.written - pending  # type: ignore[attr-defined]
        if pending == 0 or delivered > self._delivered:
            self._delivered, self._progress_at = delivered, now
        elif now - self._progress_at >= self.send_timeout_s and self.handshake_complete:
            log.warning(
                "%s: the client took no data for %.0f s with %d bytes waiting; dropping it",
                "%s:%d" % self.client if self.client else "websocket",
                now - self._progress_at,
                pending,
            )
            transport.abort()  # no close frame: it would never be read
            return
        self._stall_timer = self.loop.call_later(CHECK_EVERY_S, self._check_stall)

    def send_receive_event_to_app(self) -> None:
        if self.curr_msg_data_type == "text" and not self.close_sent:
            data = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
            try:
                bytes(data).decode()
            except UnicodeDecodeError as exc:
                self.frames = []
                log.warning("%s: a text frame is not valid UTF-8 (%s); closing 1007", "%s:%d" % self.client if self.client else "websocket", exc.reason)
                self.conn.send_close(1007, "invalid UTF-8 in a text frame")
                self.handle_parser_exception()
                return
        super().send_receive_event_to_app()


def ws_protocol(send_timeout_s: float) -> type[RealtimeWebSockets]:
    return type("RealtimeWebSockets", (RealtimeWebSockets,), {"send_timeout_s": send_timeout_s})
