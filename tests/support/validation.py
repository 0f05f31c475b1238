"""Strict validation of server events against the official openai SDK's own pydantic models.

The SDK itself does not validate what it receives. Here every event must (1) have a type the SDK's
server-event union knows, (2) validate against that type's model, and (3) carry no field the model
does not define, at any depth (the SDK's models allow extras; a misspelt field must not pass).
"""

from __future__ import annotations

import typing
from typing import Any

from openai.types.beta.realtime import realtime_server_event as beta_union
from openai.types.realtime import realtime_server_event as ga_union
from pydantic import BaseModel


def _models(union: Any) -> dict[str, type[BaseModel]]:
    members = typing.get_args(typing.get_args(union)[0])
    out = {}
    for model in members:
        (tag,) = typing.get_args(model.model_fields["type"].annotation)
        out[tag] = model
    return out


GA_MODELS = _models(ga_union.RealtimeServerEvent)
BETA_MODELS = _models(beta_union.RealtimeServerEvent)


class InvalidEvent(AssertionError):
    pass


def validate(data: dict[str, Any], *, beta: bool = False) -> BaseModel:
    models = BETA_MODELS if beta else GA_MODELS
    kind = data.get("type")
    model = models.get(kind)  # type: ignore[arg-type]
    if model is None:
        raise InvalidEvent(f"event type {kind!r} is not in the SDK's {'beta' if beta else 'GA'} server event union: {data}")
    try:
        obj = model.model_validate(data)
    except Exception as exc:
        raise InvalidEvent(f"{kind} does not validate against {model.__name__}: {exc}\n{data}") from None
    _no_extras(obj, kind)
    return obj


def _no_extras(value: Any, path: str) -> None:
    if isinstance(value, BaseModel):
        if value.model_extra:
            raise InvalidEvent(f"{path}: fields not in {type(value).__name__}: {sorted(value.model_extra)}")
        for name in type(value).model_fields:
            _no_extras(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _no_extras(v, f"{path}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            _no_extras(v, f"{path}.{k}")


async def validated_until(conn: Any, kind: str, timeout: float = 15.0) -> list[dict[str, Any]]:
    """The events an SDK connection (``client.realtime.connect``) receives up to and including
    the first of type ``kind``, each validated; fails if it ends or ``timeout`` passes first."""
    import asyncio

    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        async for event in conn:
            data = event.to_dict()
            validate(data)
            seen.append(data)
            if data["type"] == kind:
                return seen
    raise AssertionError(f"the connection ended before {kind}: {[e['type'] for e in seen]}")
