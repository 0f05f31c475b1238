"""The one exception the session engine raises for anything a client did wrong, and the shapes it
takes on the wire.

It carries exactly what an OpenAI ``error`` event carries, so the session turns it into one and
carries on: bad input never ends a session. Over HTTP (an endpoint's refusal, a WebSocket
handshake denied, a request head refused before it reaches the app) it is ``error_body`` with the
status ``http_status`` gives its code; the transports and host send those, this module only shapes them.
"""

from __future__ import annotations

from typing import Any


class RealtimeError(Exception):
    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        type: str = "invalid_request_error",
        event_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.type = type
        self.event_id = event_id

    def __repr__(self) -> str:
        return f"RealtimeError({self.code!r}, {self.message!r}, param={self.param!r})"


def invalid_value(param: str, message: str) -> RealtimeError:
    return RealtimeError(message, code="invalid_value", param=param)


HTTP_STATUS = {
    "invalid_api_key": 401,
    "forbidden": 403,
    "origin_not_allowed": 403,
    "call_not_found": 404,
    "not_found": 404,
    "session_not_found": 404,
    "invalid_resume_token": 403,
    "session_ended": 410,
    "resume_gap": 409,
    "invalid_call_action": 409,
    "call_not_accepted": 409,
    "call_state": 409,
    "request_timeout": 408,
    "request_too_large": 413,
    "max_sessions_reached": 429,
    "rate_limit_exceeded": 429,
    "server_unavailable": 503,
}


def http_status(err: RealtimeError) -> int:
    """The HTTP status of an error: by its code, 400 for anything the request got wrong."""
    return HTTP_STATUS.get(err.code or "", 400)


def error_body(err: RealtimeError) -> dict[str, Any]:
    """An HTTP error answer's JSON body, as OpenAI's API writes it: ``{"error": {"type", "code",
    "message", "param"}}`` (the ``error`` event's fields less ``event_id``)."""
    return {"error": {"type": err.type, "code": err.code, "message": err.message, "param": err.param}}
