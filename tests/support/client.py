"""The official openai SDK as the test client, with every received event strictly validated."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from openai import AsyncOpenAI
from openai._websocket_connection import AsyncWebSocketConnectionBase

from .validation import validate

DEFAULT_TIMEOUT = 10.0


class Client:
    """Wraps an SDK connection: ``recv`` validates; ``events`` keeps everything received."""

    def __init__(self, conn: Any, *, beta: bool = False) -> None:
        self.conn = conn
        self.beta = beta
        self.events: list[Any] = []

    async def recv(self, timeout: float = DEFAULT_TIMEOUT) -> Any:
        raw = await asyncio.wait_for(self.conn.recv_bytes(), timeout)
        event = validate(json.loads(raw), beta=self.beta)
        self.events.append(event)
        return event

    async def expect(self, kind: str, timeout: float = DEFAULT_TIMEOUT) -> Any:
        """Receive until an event of ``kind`` arrives; returns it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            event = await self.recv(max(0.01, deadline - loop.time()))
            if event.type == kind:
                return event

    async def first(self, kind: str, since: int = 0, timeout: float = DEFAULT_TIMEOUT) -> Any:
        """The first ``kind`` event at or after index ``since`` of ``events``, waiting if needed."""
        for event in self.events[since:]:
            if event.type == kind:
                return event
        return await self.expect(kind, timeout)

    async def until(self, kind: str, timeout: float = DEFAULT_TIMEOUT) -> list[Any]:
        """Every event received up to and including the next ``kind``."""
        start = len(self.events)
        await self.expect(kind, timeout)
        return self.events[start:]

    async def quiet(self, seconds: float) -> list[Any]:
        """Everything that arrives within ``seconds`` (asserting silence is ``== []``)."""
        got = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while (left := deadline - loop.time()) > 0:
            try:
                got.append(await self.recv(left))
            except asyncio.TimeoutError:
                break
        return got

    async def send(self, event: dict[str, Any]) -> None:
        await self.conn.send(event)

    async def send_raw(self, data: str | bytes) -> None:
        await AsyncWebSocketConnectionBase.send_raw(self.conn, data)

    async def append(self, pcm: np.ndarray | bytes, chunk_ms: int = 20, rate: int = 24000, sample_bytes: int = 2) -> None:
        """Stream audio in appends of ``chunk_ms`` (as fast as the socket takes them)."""
        data = pcm.astype("<i2").tobytes() if isinstance(pcm, np.ndarray) else pcm
        step = rate * chunk_ms // 1000 * sample_bytes
        for i in range(0, len(data), step):
            await self.conn.input_audio_buffer.append(audio=base64.b64encode(data[i : i + step]).decode())

    async def speak(self, pcm: np.ndarray, chunk_ms: int = 20, rate: int = 24000) -> None:
        """Stream pcm16 audio in real time, as a microphone would: one append per ``chunk_ms`` on a
        steady clock."""
        loop = asyncio.get_running_loop()
        step = rate * chunk_ms // 1000
        t0 = loop.time()
        for n, i in enumerate(range(0, len(pcm), step)):
            await self.conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + step].astype("<i2").tobytes()).decode())
            delay = t0 + (n + 1) * chunk_ms / 1000 - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)

    def of(self, kind: str) -> list[Any]:
        return [e for e in self.events if e.type == kind]


def audio_of(events: list[Any], kind: str = "response.output_audio.delta") -> bytes:
    return b"".join(base64.b64decode(e.delta) for e in events if e.type == kind)


@contextlib.asynccontextmanager
async def connect(ws_base: str, *, api_key: str = "test-key", beta: bool = False, model: str = "m", **kw: Any) -> AsyncIterator[Client]:
    client = AsyncOpenAI(api_key=api_key, websocket_base_url=ws_base)
    resource = client.beta.realtime if beta else client.realtime
    async with resource.connect(model=model, **kw) as conn:
        yield Client(conn, beta=beta)
