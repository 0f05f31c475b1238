"""Running the app under uvicorn with realtime-aware graceful shutdown."""

from __future__ import annotations

import socket

import uvicorn
from starlette.applications import Starlette

from realtime_omni.server import Server

from .http_limits import http_protocol
from .ws_protocol import ws_protocol


class RealtimeUvicorn(uvicorn.Server):
    """Ends every session cleanly (an ``error`` event saying why, responses cancelled, close
    1001) before uvicorn closes the connections."""

    def __init__(self, config: uvicorn.Config, server: Server) -> None:
        super().__init__(config)
        self.realtime = server
        server.on_fatal = self._fatal

    def _fatal(self) -> None:
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.realtime.drain()
        await super().shutdown(sockets)


def uvicorn_config(app: Starlette, server: Server, log_level: str = "info") -> uvicorn.Config:
    cfg = server.config
    return uvicorn.Config(
        app,
        host=cfg.host,
        port=cfg.port,
        # Too large a request head, or too many header fields: 431 (uvicorn itself has no limit).
        http=http_protocol(cfg.limits),
        # A client that stops reading goes after send_timeout_s (not when keepalive gives up); a
        # text frame of invalid UTF-8 closes 1007 with a warning, not a traceback.
        ws=ws_protocol(cfg.limits.send_timeout_s),
        ws_max_size=cfg.limits.max_message_bytes,
        # Audio in base64 hardly compresses, and deflate costs CPU and latency on every event.
        ws_per_message_deflate=False,
        ws_ping_interval=20.0,
        ws_ping_timeout=20.0,
        timeout_graceful_shutdown=int(cfg.shutdown_grace_s) + 1,
        ssl_certfile=cfg.ssl_certfile,
        ssl_keyfile=cfg.ssl_keyfile,
        log_level=log_level,
        lifespan="on",
    )
