"""Plain HTTP control endpoints beside the realtime transports: ephemeral keys and call control.

    POST   /v1/realtime/client_secrets            mint an ephemeral key (needs the API key)
    POST   /v1/realtime/sessions                  the same, beta shape
    POST   /v1/realtime/calls/{call_id}/accept    SIP: answer a ringing call with a session config
    POST   /v1/realtime/calls/{call_id}/reject    SIP: refuse it (status_code, default 603)
    POST   /v1/realtime/calls/{call_id}/refer     SIP: transfer it (target_uri)
    POST   /v1/realtime/calls/{call_id}/hangup    end any call
    DELETE /v1/realtime/calls/{call_id}           the same

Errors are OpenAI-shaped (transports/http.py), answered by the app's handlers (errors.py). Call control works on any live call through
``calls.Call``'s verbs; it knows no transport.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from realtime_omni import keys
from realtime_omni.calls import Call, live_call
from realtime_omni.errors import RealtimeError
from realtime_omni.ids import new_id
from realtime_omni.protocol import events as ev
from realtime_omni.protocol.codec import decode_session
from realtime_omni.server import Server
from transports.forward import forward_http, owner_elsewhere
from transports.http import json_body, read_body, request_key, require_api_key

from .errors import Throttled


def routes() -> list[Route]:
    return [
        Route("/v1/realtime/client_secrets", client_secrets, methods=["POST"]),
        Route("/v1/realtime/sessions", beta_sessions, methods=["POST"]),
        Route("/v1/realtime/calls/{call_id}/{action}", call_action, methods=["POST"]),
        Route("/v1/realtime/calls/{call_id}", delete_call, methods=["DELETE"]),
    ]


# ---------------------------------------------------------------------------------- keys


def _ttl(body: dict[str, Any]) -> int:
    after = body.get("expires_after") or {}
    if not isinstance(after, dict):
        raise RealtimeError("Invalid 'expires_after': expected an object.", code="invalid_type", param="expires_after")
    anchor = after.get("anchor", "created_at")
    if anchor != "created_at":
        raise RealtimeError("Invalid 'expires_after.anchor': expected 'created_at'.", code="invalid_value", param="expires_after.anchor")
    seconds = after.get("seconds", keys.DEFAULT_TTL_S)
    if not isinstance(seconds, int) or isinstance(seconds, bool) or not keys.MIN_TTL_S <= seconds <= keys.MAX_TTL_S:
        raise RealtimeError(
            f"Invalid 'expires_after.seconds': expected an integer from {keys.MIN_TTL_S} to {keys.MAX_TTL_S}.",
            code="invalid_value",
            param="expires_after.seconds",
        )
    return seconds


async def mint_key(server: Server, ttl: int, session: ev.SessionObject | None, issuer: str | None) -> tuple[keys.EphemeralKey, ev.SessionObject]:
    """An ephemeral key granting ``session``, checked against the server's defaults (a bad config
    fails now, not at connect); minting too fast raises ``Throttled``. The demo page mints here too.
    ``issuer``: the API key minting it: the session it opens shares that key's prefix cache."""
    if server.defaults is None:
        raise RealtimeError("The server is still starting.", code="server_unavailable", type="server_error")
    effective = server.defaults
    if session is not None:
        effective = effective.updated(session, server.pipeline.capabilities)
    try:
        key = await server.store.issue_key(ttl, session, server.tenant(issuer))
    except keys.MintRefused as refused:
        raise Throttled(str(refused), refused.retry_after_s) from None
    server.metrics.keys_minted.inc()
    return key, effective.wire


async def client_secrets(request: Request) -> Response:
    server: Server = request.app.state.server
    require_api_key(request)
    body = await json_body(request)
    ttl = _ttl(body)
    session = decode_session(msgspec.json.encode(body["session"])) if body.get("session") is not None else None
    key, wire = await mint_key(server, ttl, session, request_key(request))
    session_out = {"id": new_id("sess"), "object": "realtime.session", **msgspec.to_builtins(wire), "expires_at": key.expires_at}
    return JSONResponse({"value": key.value, "expires_at": key.expires_at, "session": session_out})


async def beta_sessions(request: Request) -> Response:
    """Beta ``POST /v1/realtime/sessions``: a flat session body, the key under ``client_secret``."""
    server: Server = request.app.state.server
    require_api_key(request)
    body = await json_body(request)
    body.pop("client_secret", None)
    session = decode_session(msgspec.json.encode(body)) if body else None
    key, wire = await mint_key(server, keys.DEFAULT_TTL_S, session, request_key(request))
    out = msgspec.to_builtins(wire)
    out.update({"id": new_id("sess"), "object": "realtime.session", "client_secret": {"value": key.value, "expires_at": key.expires_at}})
    return JSONResponse(out)


# ---------------------------------------------------------------------------------- calls


def _call(request: Request) -> Call:
    return live_call(request.app.state.server, request.path_params["call_id"])


async def _elsewhere(request: Request) -> Response | None:
    """The owner's answer when another replica holds the call (None: this one answers)."""
    server: Server = request.app.state.server
    call_id = request.path_params["call_id"]
    owner = await owner_elsewhere(server, call_id, request.headers)
    if owner is None:
        return None
    return await forward_http(request, server, owner, call_id, await read_body(request))


async def call_action(request: Request) -> Response:
    require_api_key(request)
    if (answer := await _elsewhere(request)) is not None:
        return answer
    call = _call(request)
    body = await json_body(request)
    action = request.path_params["action"]
    if action == "accept":
        await call.accept(decode_session(msgspec.json.encode(body)) if body else ev.SessionObject())
    elif action == "reject":
        status = body.get("status_code", 603)
        if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 699:
            raise RealtimeError("Invalid 'status_code': expected a SIP status code from 400 to 699.", code="invalid_value", param="status_code")
        await call.reject(status)
    elif action == "refer":
        target = body.get("target_uri")
        if not isinstance(target, str) or not target.lower().startswith(("sip:", "sips:", "tel:")):
            raise RealtimeError("Invalid 'target_uri': expected a sip:, sips: or tel: URI.", code="invalid_value", param="target_uri")
        await call.refer(target)
    elif action == "hangup":
        await call.hangup("hangup")
    else:
        raise RealtimeError(f"Unknown call action {action!r}.", code="not_found")
    return Response(status_code=200)


async def delete_call(request: Request) -> Response:
    require_api_key(request)
    if (answer := await _elsewhere(request)) is not None:
        return answer
    call = _call(request)
    await call.hangup("hangup")
    return Response(status_code=200)
