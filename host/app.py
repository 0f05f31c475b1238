"""The ASGI application: health, metrics, the routes of every transport, HTTP control and the demo."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from realtime_omni.server import Server
from realtime_omni.session.tool_servers import unreachable
from realtime_omni.store import LocalStore
from realtime_omni.tracing import no_exporter
from transports import sip, webrtc, websocket
from transports.http import require_api_key

from . import control, demo
from .cors import Cors
from .errors import HANDLERS
from .mcp_client import McpConnection
from .otel_tracing import OtelTracing


async def healthz(request: Request) -> Response:
    server: Server = request.app.state.server
    status = server.status  # one value, derived by the server from its lifecycle, pipeline and store
    body = {
        "status": status,
        "pipeline": server.pipeline.capabilities.name,
        "sessions": len(server.sessions),
        "max_sessions": server.config.limits.max_sessions,
        "replica": server.replica,
    }
    if server.store.error is not None:  # degraded: open sessions carry on, new ones and keys wait for it
        body["state_error"] = server.store.error
        body["degraded"] = True
    speed = server.pipeline.self_check() if status not in ("starting", "failed") else None
    if speed is not None:
        body["speed"] = speed  # can this machine keep up? (still 200: it serves, slowly, and says so)
    return JSONResponse(body, status_code=200 if status == "ok" else 503)


async def metrics(request: Request) -> Response:
    server: Server = request.app.state.server
    if server.config.metrics_need_key:
        require_api_key(request)
    return Response(server.metrics.render(), media_type="text/plain; version=0.0.4")


def create_app(server: Server, *, ready_before_serving: bool = False) -> Starlette:
    """The app. ``ready_before_serving`` (a ``--workers`` worker): load the pipeline before taking
    connections, so a worker that is starting (or restarting) takes none from the shared port,
    where its ready siblings answer; a lone server answers ``/healthz`` ("starting") meanwhile."""
    if server.config.state_url is not None and isinstance(server.store, LocalStore):
        from .redis_store import RedisStore  # keys, session count and calls shared with the other replicas

        limits = server.config.limits
        server.store = RedisStore(server.config.state_url, mint_rate=limits.key_mints_per_s, mint_burst=limits.key_mint_burst)
    # the other adapters to the outside, unless the server was given its own: both import their SDKs
    # only once used (a session names an MCP server; an OTLP endpoint is set)
    if server.connect_mcp is unreachable:
        server.connect_mcp = McpConnection
    if server.export_traces is no_exporter:
        server.export_traces = OtelTracing

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if ready_before_serving:
            await server.start()  # uvicorn listens once the lifespan has started
        else:
            server.start_in_background()
        bridge = await sip.start_bridge(server)  # None without a configured SIP port
        app.state.sip = bridge
        try:
            yield
        finally:
            if bridge is not None:
                await bridge.stop()
            await server.stop()

    app = Starlette(
        routes=[Route("/healthz", healthz), Route("/metrics", metrics), *control.routes(), *webrtc.routes(), *websocket.routes(), *demo.routes(server)],
        lifespan=lifespan,
        exception_handlers=HANDLERS,  # a RealtimeError an HTTP endpoint raises: its JSON answer
        middleware=[Middleware(Cors, server=server)] if server.origins.checked else [],
    )
    app.state.server = server
    return app
