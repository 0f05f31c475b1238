"""Bytes <-> events at the edge of a connection.

``decode_client_event`` validates a client message into a typed event in one msgspec pass (the hot
path is ``input_audio_buffer.append``); anything malformed becomes a ``RealtimeError`` whose code and
``param`` point at the offending field, echoing the client's ``event_id`` when it sent one.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from ..errors import RealtimeError
from . import beta, events

_decoder = msgspec.json.Decoder(events.AnyClientEvent)
_encoder = msgspec.json.Encoder()


class _Envelope(msgspec.Struct):
    type: Any = None
    event_id: Any = None


_envelope_decoder = msgspec.json.Decoder(_Envelope)
_PATH = re.compile(r" - at `\$\.?(.*)`$")
_FIELD = re.compile(r"field `([^`]+)`")
_SUPPORTED = ", ".join(f"'{t}'" for t in sorted(events.CLIENT_EVENT_TYPES))


# Everything a decoder can raise for bytes a client chose: msgspec's DecodeError (and its
# ValidationError) and UnicodeDecodeError are ValueErrors; nesting deep enough to exhaust the
# decoder's recursion limit inside a field is a RecursionError.
_UNREADABLE = (ValueError, RecursionError)


def decode_client_event(data: bytes | str) -> events.ClientEvent:
    try:
        return _decoder.decode(data)
    except msgspec.ValidationError as exc:  # (a subclass of DecodeError: catch it first)
        raise _validation_error(data, str(exc)) from None
    except _UNREADABLE as exc:
        raise _invalid_json(exc) from None


def _invalid_json(exc: BaseException) -> RealtimeError:
    reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
    return RealtimeError(
        f"The message is not valid JSON ({reason}). Every client event is a JSON object with a `type`.",
        code="invalid_json",
    )


def _validation_error(data: bytes | str, text: str) -> RealtimeError:
    event_id = None
    try:
        envelope = _envelope_decoder.decode(data)
    except msgspec.ValidationError:
        return RealtimeError(
            "Each client event must be a JSON object with a `type` field.", code="invalid_event"
        )
    except _UNREADABLE as exc:  # well-typed up to the point where the JSON itself breaks
        return _invalid_json(exc)
    if isinstance(envelope.event_id, str):
        event_id = envelope.event_id
    m = _PATH.search(text)
    path = m.group(1).replace("[...]", "") if m else ""  # msgspec's "[...]": a value in a map
    message = text[: m.start()] if m else text
    field = _FIELD.search(message)
    param: str | None
    if message.startswith("Object missing required field"):
        param = _join(path, field.group(1) if field else "")
        code = "missing_required_parameter"
        if param == "type":
            message = "Missing required parameter: 'type'."
        else:
            message = f"Missing required parameter: '{param}'."
    elif message.startswith("Object contains unknown field"):
        param = _join(path, field.group(1) if field else "")
        code = "unknown_parameter"
        message = f"Unknown parameter: '{param}'."
    elif path == "type":
        param, code = "type", "invalid_value"
        message = f"Invalid value: {envelope.type!r}. Supported values are: {_SUPPORTED}."
    else:
        param = path or None
        code = "invalid_type" if message.startswith("Expected `") and "got" in message else "invalid_value"
        message = f"Invalid '{param}': {message[0].lower()}{message[1:]}." if param else message
    return RealtimeError(message, code=code, param=param, event_id=event_id)


def _join(path: str, field: str) -> str:
    return f"{path}.{field}" if path and field else (path or field)


def encode_server_event(event: msgspec.Struct, *, beta_names: bool = False) -> bytes | None:
    """JSON for one server event; ``None`` when a beta client has no such event."""
    if not beta_names:
        return _encoder.encode(event)
    translated = beta.translate(msgspec.to_builtins(event))
    return None if translated is None else _encoder.encode(translated)


_session_decoder = msgspec.json.Decoder(events.SessionObject)


def decode_session(data: bytes | str, param: str = "session") -> events.SessionObject:
    """A session object sent outside an event (a call's multipart ``session`` part, a call's
    accept body, an ephemeral key's grant), checked like ``session.update``'s."""
    try:
        return _session_decoder.decode(data)
    except msgspec.ValidationError as exc:
        m = _PATH.search(str(exc))
        path = _join(param, m.group(1).replace("[...]", "")) if m else param
        message = str(exc)[: m.start()] if m else str(exc)
        return_err = RealtimeError(f"Invalid '{path}': {message}.", code="invalid_value", param=path)
        if message.startswith("Object contains unknown field"):
            field = _FIELD.search(message)
            path = _join(path, field.group(1)) if field else path
            return_err = RealtimeError(f"Unknown parameter: '{path}'.", code="unknown_parameter", param=path)
        raise return_err from None
    except _UNREADABLE as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise RealtimeError(f"Invalid '{param}': not valid JSON ({reason}).", code="invalid_json", param=param) from None
