"""A WebSocket client written by hand on a plain socket, for what well-behaved libraries refuse to do:
send a text frame of invalid UTF-8, connect and never read, stop mid-frame.

    ws = await RawWebSocket.connect("127.0.0.1", port, "/v1/realtime?model=m", headers={...})
    await ws.send_frame(OP_TEXT, b"\\xff")
    code = await ws.close_code(timeout=5)
"""

from __future__ import annotations

import asyncio
import base64
import os
import struct

OP_TEXT, OP_BINARY, OP_CLOSE = 0x1, 0x2, 0x8


class RawWebSocket:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, status: int, head: bytes) -> None:
        self.reader, self.writer = reader, writer
        self.status = status  # of the upgrade response: 101 when open
        self.head = head

    @classmethod
    async def connect(cls, host: str, port: int, path: str, headers: dict[str, str] | None = None, *, rcvbuf: int | None = None) -> "RawWebSocket":
        """Open and upgrade. ``rcvbuf``: a small receive buffer (bytes), so a client that stops
        reading pushes back on the server sooner, as a slow mobile link would."""
        if rcvbuf is not None:
            import socket

            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, (host, port))
            reader, writer = await asyncio.open_connection(sock=sock)
        else:
            reader, writer = await asyncio.open_connection(host, port)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Upgrade: websocket", "Connection: Upgrade", f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        return cls(reader, writer, status, head)

    async def send_frame(self, opcode: int, payload: bytes, *, fin: bool = True) -> None:
        mask = os.urandom(4)
        n = len(payload)
        header = bytes([(0x80 if fin else 0) | opcode])
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 65536:
            header += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack("!Q", n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload)) if n < 65536 else _mask(payload, mask)
        self.writer.write(header + mask + masked)
        await self.writer.drain()

    async def read_frame(self) -> tuple[int, bytes]:
        b0, b1 = await self.reader.readexactly(2)
        n = b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", await self.reader.readexactly(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", await self.reader.readexactly(8))
        return b0 & 0x0F, await self.reader.readexactly(n)

    async def close_code(self, timeout: float) -> int | None:
        """Read until the server's close frame: its code (None: the socket ended without one)."""
        async with asyncio.timeout(timeout):
            while True:
                try:
                    opcode, payload = await self.read_frame()
                except (asyncio.IncompleteReadError, ConnectionError):
                    return None
                if opcode == OP_CLOSE:
                    return struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005

    def abort(self) -> None:
        transport = self.writer.transport
        transport.abort()  # type: ignore[attr-defined]

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except Exception:  # noqa: BLE001 - closing a socket the server already dropped
            pass


def _mask(payload: bytes, mask: bytes) -> bytes:
    import numpy as np

    data = np.frombuffer(payload, np.uint8)
    key = np.resize(np.frombuffer(mask, np.uint8), len(data))
    return (data ^ key).tobytes()
