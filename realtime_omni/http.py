"""What every HTTP endpoint answers alike (the WebRTC offer, ephemeral keys, call control, the
demo): OpenAI-shaped JSON errors ``{"error": {"type", "code", "message", "param"}}`` with one status
per error code, the bearer key, and request bodies read within a bound."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse

from .errors import RealtimeError
from .server import Server

MAX_BODY = 1024 * 1024
BODY_TIMEOUT_S = 30.0  # a body that trickles in slower than this is refused (a slow-body attack holds a connection)


STATUS = {
    "invalid_api_key": 401,
    "forbidden": 403,
    "origin_not_allowed": 403,
    "call_not_found": 404,
    "not_found": 404,
    "invalid_call_action": 409,
    "call_not_accepted": 409,
    "call_state": 409,
    "request_timeout": 408,
    "request_too_large": 413,
    "max_sessions_reached": 429,
    "rate_limit_exceeded": 429,
    "server_unavailable": 503,
}


def status_for(err: RealtimeError) -> int:
    """The HTTP status of an error: by its code, 400 for anything the request got wrong."""
    return STATUS.get(err.code or "", 400)


def error_response(status: int, err: RealtimeError, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"type": err.type, "code": err.code, "message": err.message, "param": err.param}}
    return JSONResponse(body, status_code=status, headers=headers)


def bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else None


def require_api_key(request: Request) -> None:
    server: Server = request.app.state.server
    if not server.authorized(bearer(request)):
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
