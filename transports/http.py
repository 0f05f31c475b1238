"""What every HTTP endpoint answers alike (the WebRTC offer here; ephemeral keys, call control,
metrics and the demo in ``host/``): OpenAI-shaped JSON errors with one status per error code, the
API key, and request bodies read within a bound.

The error's body and status and the Bearer header are the core's (``realtime_omni.errors``,
``realtime_omni.keys``); this module puts them into Starlette. It sits in ``transports/`` because
the WebRTC endpoint needs it and ``host/`` is above the transports."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import msgspec
from starlette.requests import ClientDisconnect, HTTPConnection, Request
from starlette.responses import JSONResponse

from realtime_omni.errors import RealtimeError, error_body, http_status
from realtime_omni.keys import bearer, is_ephemeral
from realtime_omni.resume import Hold
from realtime_omni.server import Server

# The resume extension's headers, on the WebSocket's upgrade and the WebRTC offer alike
# (docs/realtime-api.md#resuming-a-session)
SESSION_ID = "x-session-id"
RESUME_TOKEN = "x-resume-token"
LAST_EVENT_ID = "last-event-id"
RECEIVED = "x-client-events-received"
REPLAYED = "x-replayed-events"

MAX_BODY = 1024 * 1024
BODY_TIMEOUT_S = 30.0  # a body that trickles in slower than this is refused (a slow-body attack holds a connection)


def error_response(err: RealtimeError, status: int | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    """``err`` as an HTTP answer: its status by its code (``http_status``) unless ``status`` says otherwise."""
    return JSONResponse(error_body(err), status_code=status or http_status(err), headers=headers)


def request_key(conn: HTTPConnection) -> str | None:
    """The key a request or a WebSocket handshake presents in ``Authorization: Bearer``, if any."""
    return bearer(conn.headers.get("authorization", ""))


def require_api_key(request: Request) -> None:
    server: Server = request.app.state.server
    if not server.authorized(request_key(request)):
        raise RealtimeError("This endpoint needs the server's API key (not an ephemeral key).", code="invalid_api_key", type="authentication_error")


async def read_body(request: Request, limit: int = MAX_BODY) -> bytes:
    """The request body, read no further than ``limit`` bytes (a larger one is refused, never
    held in memory whole)."""
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise RealtimeError(f"The request body is larger than {limit} bytes.", code="request_too_large")
                chunks.append(chunk)
    except TimeoutError:
        raise RealtimeError(f"The request body did not arrive within {BODY_TIMEOUT_S:g} s.", code="request_timeout") from None
    except ClientDisconnect:  # it closed before sending the body it announced: nobody to answer
        raise RealtimeError("The connection closed before the request body was complete.", code="incomplete_body") from None
    return b"".join(chunks)


async def json_body(request: Request) -> dict[str, Any]:
    data = await read_body(request)
    if not data.strip():
        return {}
    try:
        body = msgspec.json.decode(data)
    except (ValueError, RecursionError) as exc:  # DecodeError and UnicodeDecodeError are ValueErrors
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise RealtimeError(f"The request body is not valid JSON ({reason}).", code="invalid_json") from None
    if not isinstance(body, dict):
        raise RealtimeError("The request body must be a JSON object.", code="invalid_json")
    return body


def claim_resume(server: Server, headers: Mapping[str, str], key: str | None, kind: str, last_event_id: str | None) -> tuple[Hold, int]:
    """A resume's claim of its session, from the headers a WebSocket upgrade or a WebRTC offer
    carries: the session's hold and where its replay begins, or the ``RealtimeError`` that refuses
    it (counted; the session left as it was). ``last_event_id``: the client's ``last-event-id``."""
    authorized = server.authorized(key)
    try:
        if not authorized and not is_ephemeral(key):
            raise RealtimeError("Missing or invalid API key (send 'Authorization: Bearer <key>').", code="invalid_api_key", type="authentication_error")
        return server.holds.claim(
            headers.get(SESSION_ID, ""),
            headers.get(RESUME_TOKEN, ""),
            last_event_id,
            key_tag=server.tenant(key) if is_ephemeral(key) else None,
            authorized=authorized,
            kind=kind,
        )
    except RealtimeError as err:
        server.metrics.resumes.labels(err.code or "refused").inc()
        raise
