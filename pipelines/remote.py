"""A remote engine: an OpenAI-compatible chat-completions deployment (``vllm serve``, vLLM-Omni)
that many frontends share, reached over a pooled HTTP client.

``stream(body)`` posts one request with ``stream: true`` and yields its server-sent chunks, parsed,
as they arrive. Closing the stream (``aclose``: a barge-in, a cancel) closes the connection, and
vLLM aborts a request whose client went away, so nothing keeps generating for nobody.

Faults become an ``EngineError`` that says what happened: the deployment refused the connection,
answered 4xx/5xx (its own message is kept), sent an error in the stream, cut the stream before its
``[DONE]``, or went silent for longer than ``stall_s`` (``first_chunk_s`` for the first chunk,
which includes the prefill). ``healthy`` follows what was seen last: a failed request makes the
engine unhealthy, and a request that succeeds or a probe of the deployment's ``/health`` (every
``probe_interval_s`` while unhealthy) makes it healthy again: recovery needs no restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncGenerator
from typing import Any

import httpx
import msgspec

log = logging.getLogger(__name__)


class RemoteOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    url: str = "http://127.0.0.1:8091/v1"  # the deployment's OpenAI base URL
    api_key: str | None = None
    connect_timeout_s: float = 5.0
    first_chunk_s: float = 60.0  # request sent -> first chunk (queueing and prefill included)
    stall_s: float = 15.0  # the longest silence between two chunks
    max_connections: int = 256  # pooled, across every session of this frontend
    probe_interval_s: float = 2.0
    # Every request of a session carries this header with a value stable for the session (a hash
    # of its cache_salt), so a router in front of several engine replicas (vLLM production-stack's
    # --routing-logic session --session-key x-session-id) keeps the conversation on the replica that
    # holds its prefix in cache. llm-d needs no header: its prefix-cache scorer follows the prompt,
    # which this server re-sends identically; its session-affinity scorer wants its own token
    # echoed back, which this server does not do (docs/deployment.md). None: no header.
    affinity_header: str | None = "x-session-id"


class EngineError(Exception):
    """The remote engine failed this request; ``status`` is its HTTP status when it sent one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RemoteEngine:
    def __init__(self, options: RemoteOptions) -> None:
        self.options = options
        self.base = options.url.rstrip("/")
        self.health_url = self.base.removesuffix("/v1") + "/health"
        self._client: httpx.AsyncClient | None = None
        self._prober: asyncio.Task[None] | None = None
        self.healthy = False
        self.last_error: str | None = None
        self.counts = {"engine_requests": 0, "engine_failures": 0, "engine_aborts": 0}

    # ------------------------------------------------------------------ lifetime

    async def start(self) -> None:
        o = self.options
        headers = {"Authorization": f"Bearer {o.api_key}"} if o.api_key else {}
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(connect=o.connect_timeout_s, read=None, write=o.connect_timeout_s, pool=o.connect_timeout_s),
            limits=httpx.Limits(max_connections=o.max_connections, max_keepalive_connections=o.max_connections),
        )
        if await self.probe():
            log.info("remote engine at %s is up", self.base)
        else:
            log.warning("remote engine at %s does not answer yet (%s); serving, unhealthy until it does", self.base, self.last_error)
            self._watch()

    async def stop(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            await asyncio.gather(self._prober, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()

    async def probe(self) -> bool:
        """Ask the deployment's ``/health``; healthy again when it answers 200."""
        assert self._client is not None
        try:
            r = await self._client.get(self.health_url, timeout=self.options.connect_timeout_s)
            ok = r.status_code == 200
            if not ok:
                self.last_error = f"/health answered {r.status_code}"
        except httpx.HTTPError as exc:
            ok = False
            self.last_error = f"/health: {type(exc).__name__}: {exc}"
        if ok:
            self._recovered()
        else:
            self.healthy = False
        return ok

    def _watch(self) -> None:
        if self._prober is None or self._prober.done():
            self._prober = asyncio.get_running_loop().create_task(self._probe_until_healthy(), name="engine-probe")

    async def _probe_until_healthy(self) -> None:
        while not self.healthy:
            await asyncio.sleep(self.options.probe_interval_s)
            await self.probe()

    def _recovered(self) -> None:
        if not self.healthy and self.last_error is not None:
            log.info("remote engine at %s is healthy again", self.base)
        self.healthy = True

    def _failed(self, err: EngineError) -> EngineError:
        self.counts["engine_failures"] += 1
        self.last_error = str(err)
        self.healthy = False
        log.warning("remote engine: %s", err)
        self._watch()
        return err

    def stats(self) -> dict[str, float]:
        return {**self.counts, "engine_healthy": float(self.healthy)}

    # ------------------------------------------------------------------ requests

    def _affinity(self, body: dict[str, Any]) -> dict[str, str] | None:
        """The session-affinity header: a digest of the body's ``cache_salt`` (one per API key, so a
        key's sessions meet their shared prefix on one replica; one per session without a key),
        not the salt itself, which stays a secret between this server and the engine."""
        salt = body.get("cache_salt")
        if self.options.affinity_header is None or not isinstance(salt, str):
            return None
        return {self.options.affinity_header: hashlib.sha256(salt.encode()).hexdigest()[:32]}

    async def stream(self, body: dict[str, Any], path: str = "/chat/completions") -> AsyncGenerator[dict[str, Any], None]:
        """Post ``body`` (``stream: true``) and yield each parsed chunk until ``[DONE]``."""
        assert self._client is not None, "the engine is not started"
        o = self.options
        self.counts["engine_requests"] += 1
        request = self._client.build_request("POST", self.base + path, json=body, headers=self._affinity(body))
        try:
            try:
                async with asyncio.timeout(o.first_chunk_s):
                    response = await self._client.send(request, stream=True)
            except TimeoutError:
                raise self._failed(EngineError(f"the engine sent no answer within {o.first_chunk_s:g} s")) from None
            except httpx.HTTPError as exc:
                raise self._failed(EngineError(f"the engine at {self.base} is unreachable ({type(exc).__name__}: {exc})")) from None
            try:
                if response.status_code != 200:
                    raise self._failed(EngineError(await _error_text(response), status=response.status_code))
                lines = response.aiter_lines()
                wait = o.first_chunk_s
                while True:
                    try:
                        async with asyncio.timeout(wait):
                            line = await anext(lines)
                    except StopAsyncIteration:
                        raise self._failed(EngineError("the engine closed the stream before the answer ended")) from None
                    except TimeoutError:
                        raise self._failed(EngineError(f"the engine stalled: nothing for {wait:g} s")) from None
                    except httpx.RemoteProtocolError as exc:  # the connection closed mid-answer
                        raise self._failed(EngineError(f"the engine closed the stream before the answer ended ({exc})")) from None
                    except httpx.HTTPError as exc:
                        raise self._failed(EngineError(f"the engine's stream broke ({type(exc).__name__}: {exc})")) from None
                    wait = o.stall_s
                    if not line.startswith("data:"):
                        continue  # blank separators, comments, event names
                    data = line[5:].strip()
                    if data == "[DONE]":
                        self._recovered()
                        return
                    try:
                        chunk = msgspec.json.decode(data)
                    except (ValueError, RecursionError):
                        raise self._failed(EngineError(f"the engine sent a chunk that is not JSON: {data[:120]!r}")) from None
                    if isinstance(chunk, dict) and "error" in chunk:
                        raise self._failed(EngineError(_message(chunk), status=_status(chunk)))
                    yield chunk
            finally:
                await response.aclose()  # unread: the connection closes, and the engine aborts the request
        except (GeneratorExit, asyncio.CancelledError):
            self.counts["engine_aborts"] += 1  # closed by us: a barge-in, a cancel, a speculation voided
            raise


async def _error_text(response: httpx.Response) -> str:
    with contextlib.suppress(Exception):
        body = await response.aread()
        with contextlib.suppress(ValueError):
            return f"the engine answered {response.status_code}: {_message(msgspec.json.decode(body))}"
        return f"the engine answered {response.status_code}: {body[:200].decode(errors='replace')}"
    return f"the engine answered {response.status_code}"


def _message(body: Any) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or error)
    if isinstance(body, dict) and "message" in body:
        return str(body["message"])
    return str(error or body)[:200]


def _status(body: dict[str, Any]) -> int | None:
    error = body.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, int) else None
