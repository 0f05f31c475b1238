"""One handler per error type for every HTTP endpoint (Starlette's ``exception_handlers``), instead of
a ``try``/``except`` in each: a ``RealtimeError`` an endpoint raises is answered with OpenAI's error
body and the status of its code (transports/http.py's ``error_response``), a ``Throttled`` with the
seconds to wait in ``Retry-After`` as well.

A WebSocket endpoint answers its errors itself, in the protocol or as a denial: one that escapes
goes on up, as if no handler were here."""

from __future__ import annotations

import math

from starlette.requests import Request
from starlette.responses import Response

from realtime_omni.errors import RealtimeError
from transports.http import error_response


class Throttled(RealtimeError):
    """429, with the seconds to wait in ``Retry-After``."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message, code="rate_limit_exceeded", type="rate_limit_error")
        self.retry_after_s = retry_after_s


async def realtime_error(request: Request, exc: Exception) -> Response:
    if request.scope["type"] != "http" or not isinstance(exc, RealtimeError):
        raise exc
    return error_response(exc)


async def throttled(request: Request, exc: Exception) -> Response:
    if request.scope["type"] != "http" or not isinstance(exc, Throttled):
        raise exc
    return error_response(exc, headers={"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))})


HANDLERS = {RealtimeError: realtime_error, Throttled: throttled}
