"""The browser voice demo (``web_demo/``), served at ``/``, and the two small endpoints it uses.

    GET  /demo/config   what the page needs: pipeline, model, ICE servers, whether a key is needed
    POST /demo/key      an ephemeral key for the page, only with ``web_demo_mints_keys: true``

With an API key set and minting off, the page asks for an ephemeral key minted elsewhere (the
real key never reaches the browser either way).
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from realtime_omni.errors import RealtimeError
from realtime_omni.server import Server

from .control import mint_key

WEB_DEMO = Path(__file__).resolve().parent.parent / "web_demo"


def routes(server: Server) -> list[BaseRoute]:
    if not server.config.web_demo or not WEB_DEMO.is_dir():
        return []
    return [
        Route("/demo/config", config, methods=["GET"]),
        Route("/demo/key", mint, methods=["POST"]),
        Mount("/", app=StaticFiles(directory=WEB_DEMO, html=True), name="web_demo"),
    ]


async def config(request: Request) -> Response:
    server: Server = request.app.state.server
    cfg = server.config
    return JSONResponse(
        {
            "pipeline": server.pipeline.capabilities.name,
            "model": cfg.model,
            "ice_servers": cfg.webrtc.ice_servers,
            "needs_key": bool(cfg.api_key),
            "can_mint": bool(cfg.api_key) and cfg.web_demo_mints_keys,
        }
    )


async def mint(request: Request) -> Response:
    server: Server = request.app.state.server
    if not (server.config.api_key and server.config.web_demo_mints_keys):
        raise RealtimeError("This server does not hand out keys to the demo page (web_demo_mints_keys is off).", code="forbidden")
    key, _ = await mint_key(server, 60, None, server.config.api_key)
    return JSONResponse({"value": key.value, "expires_at": key.expires_at})

