"""Running the app under uvicorn with realtime-aware graceful shutdown."""

from __future__ import annotations

import signal
import socket
from types import FrameType

import uvicorn
from starlette.applications import Starlette

from realtime_omni.server import Server

from .http_limits import http_protocol
from .ws_protocol import ws_protocol


class RealtimeUvicorn(uvicorn.Server):
    """Ends every session cleanly (an ``error`` event saying why, responses cancelled, close
    1001) before uvicorn closes the connections. SIGTERM (a replica taken out of a deployment)
    turns ``/healthz`` 503 at once and lets the open sessions run on up to ``shutdown_grace_s``
    before they are told; SIGINT (a person at a terminal) tells them at once."""

    def __init__(self, config: uvicorn.Config, server: Server) -> None:
        super().__init__(config)
        self.realtime = server
        self.let_run_s = 0.0
        server.on_fatal = self._fatal

    def _fatal(self) -> None:
        self.should_exit = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and not self.should_exit:
            self.realtime.stop_admitting()  # unhealthy now; the balancer's next check sees it
            self.let_run_s = self.realtime.config.shutdown_grace_s
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.realtime.drain(let_run_s=self.let_run_s)
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
