"""CORS: a page served from another origin (app.example.com calling the API on voice.example.com)
may call the HTTP API (``POST /v1/realtime/calls``, ``/v1/realtime/client_secrets``, call control,
the demo's endpoints) when ``allowed_origins`` lists its origin.

One middleware for every route, so no endpoint (nor an error it answers) can forget the headers:

- a preflight (``OPTIONS`` with ``Access-Control-Request-Method``) from a listed origin is answered
  here, ``204``, with the methods, the headers the page asked to send and how long to keep the
  answer; from any other origin, ``403`` (``origin_not_allowed``) and no CORS headers;
- any other answer to a listed origin (errors included) carries ``Access-Control-Allow-Origin``
  and exposes ``Location`` (a WebRTC call's id), ``Retry-After`` and a WebRTC resume's headers;
- an origin listed by name is echoed, with ``Access-Control-Allow-Credentials``; one admitted only
  by ``"*"`` gets ``*`` and never credentials (the Fetch standard refuses the pair, and a wildcard
  must not let every site send a user's cookies);
- every answer of a server with named origins says ``Vary: Origin``: a cache between must not hand
  one site's answer to another.

Without ``allowed_origins`` (None) nothing here runs: same-origin pages (the demo) need no CORS.
A WebSocket needs none either (its Origin is checked at the handshake, ``Server.check_origin``).
Answers sent before the app (431, 408: ``http_limits.py``) and an unexpected 500 carry no headers.
"""

from __future__ import annotations

import msgspec
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from realtime_omni.errors import RealtimeError, error_body, http_status
from realtime_omni.server import Server

METHODS = b"GET, POST, DELETE"
EXPOSED = b"Location, Retry-After, x-session-id, x-resume-token, x-client-events-received, x-replayed-events"  # (the last four: a WebRTC resume)
MAX_AGE_S = b"600"  # how long a browser may keep a preflight's answer


class Cors:
    def __init__(self, app: ASGIApp, server: Server) -> None:
        self.app = app
        self.server = server
        self.origins = server.origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])  # names are lowercase in ASGI; a repeated Origin: the last
        raw_origin = headers.get(b"origin")
        origin = raw_origin.decode("latin-1") if raw_origin is not None else None
        granted = self._granted(origin)
        if scope["method"] == "OPTIONS" and b"access-control-request-method" in headers and origin is not None:
            await self._preflight(send, origin, granted, headers.get(b"access-control-request-headers", b""))
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *self._answer_headers(granted)]}
            await send(message)

        await self.app(scope, receive, send_with_cors)

    def _granted(self, origin: str | None) -> tuple[bytes, bool] | None:
        """What ``Access-Control-Allow-Origin`` says to this origin, and whether credentials are
        allowed; None: no CORS headers for it."""
        if origin is None:
            return None
        if self.origins.listed(origin):
            return origin.encode("latin-1"), True
        if self.origins.any:
            return b"*", False
        return None

    def _answer_headers(self, granted: tuple[bytes, bool] | None) -> list[tuple[bytes, bytes]]:
        out = [(b"vary", b"Origin")] if self.origins.exact else []
        if granted is not None:
            value, credentials = granted
            out += [(b"access-control-allow-origin", value), (b"access-control-expose-headers", EXPOSED)]
            if credentials:
                out.append((b"access-control-allow-credentials", b"true"))
        return out

    async def _preflight(self, send: Send, origin: str, granted: tuple[bytes, bool] | None, requested: bytes) -> None:
        if granted is None:
            await self._refuse(send, origin)
            return
        headers = [
            *self._answer_headers(granted),
            (b"access-control-allow-methods", METHODS),
            (b"access-control-max-age", MAX_AGE_S),
            (b"content-length", b"0"),
        ]
        if requested:
            # the page's own headers (Authorization, Content-Type, OpenAI-Beta, an SDK's X-Stainless-*):
            # the origin is trusted, so what it asks to send is allowed rather than a list kept here
            # (bounded: the whole head is, by limits.max_header_bytes)
            headers.append((b"access-control-allow-headers", requested))
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    async def _refuse(self, send: Send, origin: str) -> None:
        try:
            self.server.check_origin(origin)
        except RealtimeError as err:
            body = msgspec.json.encode(error_body(err))
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *self._answer_headers(None)]
            await send({"type": "http.response.start", "status": http_status(err), "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        raise AssertionError(f"an origin granted no CORS was allowed: {origin!r}")
