"""The one exception the session engine raises for anything a client did wrong.

It carries exactly what an OpenAI ``error`` event carries, so the session turns it into one and
carries on: bad input never ends a session.
"""

from __future__ import annotations


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
