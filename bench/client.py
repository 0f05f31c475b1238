"""The Realtime client side of the replay harness: one simulated user holding one conversation with
a server, over WebSocket or WebRTC, and recording each turn as the server's events arrive.

The user streams 20 ms appends on a steady clock (``bench/microphone.py``: silence when not
speaking, like a live microphone), waits for the answer to finish *playing* (simulated from the
audio received) plus a short think time before the next turn, and on barge-in turns starts speaking
while the answer plays; when its speech stops the answer, it tells the server how much was heard.
What it records per turn is a ``bench.metrics.TurnRecord``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .dataset import RATE, Conversation, Turn
from .metrics import TurnRecord
from .microphone import Mic

TURN_TIMEOUT_S = 60.0
TRANSPORTS = ("websocket", "webrtc", "pipecat")


# ------------------------------------------------------------------------------ transports


class Transport(Protocol):
    """How the harness reaches a server: WebSocket, WebRTC (``bench.rtc.WebRTCTransport``), or the
    Pipecat benchmark peer's WebSocket (``bench.peers.PipecatTransport``)."""

    async def send_audio(self, pcm16: bytes) -> None: ...
    async def send_event(self, event: dict[str, Any]) -> None: ...
    def events(self) -> AsyncIterator[dict[str, Any]]: ...
    async def close(self) -> None: ...


def append_message(pcm16: bytes) -> str:
    """``input_audio_buffer.append`` of ``pcm16``, as sent over a WebSocket."""
    return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm16).decode()})


async def connect_websocket(url: str, model: str, api_key: str | None = None, **options: Any) -> Any:
    """A bare ``websockets`` connection to ``{url}/realtime``; ``options`` go to ``websockets.connect``."""
    import websockets

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return await websockets.connect(f"{url.rstrip('/')}/realtime?model={model}", additional_headers=headers, max_size=None, **options)


async def open_session(url: str, model: str, **options: Any) -> Any:
    """A bare WebSocket connection whose session is ready: what the server says on connecting is
    read and dropped up to its ``conversation.created``. For load tests that read raw messages."""
    ws = await connect_websocket(url, model, **options)
    while not (await ws.recv()).startswith('{"type":"conversation.created"'):
        pass
    return ws


class WebSocketTransport:
    def __init__(self, ws: Any) -> None:
        self.ws = ws

    @classmethod
    async def open(cls, url: str, model: str, api_key: str | None) -> "WebSocketTransport":
        return cls(await connect_websocket(url, model, api_key, open_timeout=30))

    async def send_audio(self, pcm16: bytes) -> None:
        await self.ws.send(append_message(pcm16))

    async def send_event(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        async for message in self.ws:
            yield json.loads(message)

    async def close(self) -> None:
        await self.ws.close()


async def first_audio(ws: Any) -> float | None:
    """Read a bare WebSocket until ``response.done``; when (``time.perf_counter``) its first
    ``response.output_audio.delta`` arrived. An ``error`` raises."""
    first = None
    while True:
        msg = await ws.recv()
        if first is None and msg.startswith('{"type":"response.output_audio.delta"'):
            first = time.perf_counter()
        elif msg.startswith('{"type":"response.done"'):
            return first
        elif msg.startswith('{"type":"error"'):
            raise RuntimeError(msg)


async def open_transport(kind: str, url: str, model: str, api_key: str | None) -> Transport:
    """A connected transport of ``kind`` (one of ``TRANSPORTS``)."""
    if kind == "webrtc":
        from .rtc import (
            WebRTCTransport,  # aiortc, PyAV and the openai SDK load only for WebRTC runs
        )

        return await WebRTCTransport.open(url, model, api_key)
    if kind == "websocket":
        return await WebSocketTransport.open(url, model, api_key)
    if kind == "pipecat":
        from .peers import PipecatTransport

        return await PipecatTransport.open(url, model, api_key)
    raise ValueError(f"unknown transport {kind!r} (one of {', '.join(TRANSPORTS)})")


# ------------------------------------------------------------------------------ one conversation


@dataclass
class Options:
    url: str
    model: str = "realtime-omni"
    api_key: str | None = None
    transport: str = "websocket"
    turns: int = 0  # per conversation; 0 = all
    barge_after_s: float = 1.0  # a barge-in starts this long after the answer's first audio
    think_s: tuple[float, float] = (0.4, 1.0)  # silence after an answer has played, before the next turn
    lead_s: float = 0.5  # silence before the first turn
    seed: int = 0
    session: dict[str, Any] | None = None  # sent as session.update after connecting
    keep_audio: bool = False  # keep each answer's audio (pcm16 at RATE): a turn's "answer_audio"


@dataclass
class LiveTurn(TurnRecord):
    """A turn's record while the conversation goes on, with what the user waits for."""

    done: asyncio.Event = field(default_factory=asyncio.Event, repr=False, compare=False)
    first_audio: asyncio.Event = field(default_factory=asyncio.Event, repr=False, compare=False)
    audio: list[bytes] | None = field(default=None, repr=False, compare=False)  # kept when asked
    calls: list[dict[str, str]] = field(default_factory=list)  # the function calls the response made

    def metrics(self, origin: float = 0.0) -> dict[str, Any]:
        out = super().metrics(origin)
        out["calls"] = self.calls
        if self.audio is not None:
            out["answer_audio"] = b"".join(self.audio)
        return out


class SimulatedUser:
    """Speaks one conversation's turns into one connection and records each turn."""

    def __init__(self, conversation: Conversation, options: Options, on_turn: Any = None) -> None:
        self.conversation = conversation
        self.options = options
        self.records: list[LiveTurn] = []
        self.errors: list[str] = []
        self.on_turn = on_turn or (lambda: None)
        self.rng = random.Random(f"{options.seed}:{conversation.name}")
        self.t0 = 0.0
        self._by_response: dict[str, LiveTurn] = {}
        self._by_item: dict[str, LiveTurn] = {}
        self.mic_lag_ms: list[float] = []

    async def run(self) -> list[LiveTurn]:
        o = self.options
        try:
            transport = await open_transport(o.transport, o.url, o.model, o.api_key)
        except Exception as exc:
            self.errors.append(f"connect: {type(exc).__name__}: {exc}")
            return []
        mic = Mic(transport.send_audio)
        reader = asyncio.create_task(self._read(transport))
        try:
            if o.session:
                await transport.send_event({"type": "session.update", "session": o.session})
            mic_task = asyncio.create_task(mic.run())
            self.t0 = time.perf_counter()
            try:
                await self._drive(mic, reader)
            finally:
                mic_task.cancel()
                await asyncio.gather(mic_task, return_exceptions=True)
                self.mic_lag_ms = mic.lag_ms
        except Exception as exc:  # the server went away mid-conversation: an error, not a crash
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            try:
                await transport.close()
            except Exception:
                pass
        return self.records

    async def _drive(self, mic: Mic, reader: asyncio.Task[None]) -> None:
        o = self.options
        turns: list[Turn] = self.conversation.turns[: o.turns or None]
        await asyncio.sleep(o.lead_s)
        for k, turn in enumerate(turns):
            prev = self.records[-1] if self.records else None
            if prev is not None:
                if turn.barge_in:
                    await self._wait(prev.first_audio, reader, prev)
                    start = (prev.first_audio_t or time.perf_counter()) + o.barge_after_s
                else:
                    await self._wait(prev.done, reader, prev)
                    start = max(time.perf_counter(), prev.playback_end()) + self.rng.uniform(*o.think_s)
                await asyncio.sleep(max(0.0, start - time.perf_counter()))
            rec = LiveTurn(self.conversation.name, k, turn.text, turn.barge_in, audio=[] if o.keep_audio else None)
            first, last = mic.play(turn.audio)
            rec.onset_t, rec.speech_end_t = mic.time_of(first), mic.time_of(last)
            if turn.barge_in and prev is not None and (prev.done_t is None or prev.playback_end() > rec.onset_t):
                prev.interrupted_by_t = rec.onset_t  # the answer is still being generated or played
            self.records.append(rec)
        if self.records:
            last_rec = self.records[-1]
            await self._wait(last_rec.done, reader, last_rec)
            # input transcripts may trail the answer a little
            deadline = time.perf_counter() + 5.0
            while any(r.heard is None and r.item_id for r in self.records) and time.perf_counter() < deadline and not reader.done():
                await asyncio.sleep(0.05)

    async def _wait(self, event: asyncio.Event, reader: asyncio.Task[None], rec: LiveTurn) -> None:
        waiter = asyncio.create_task(event.wait())
        done, _ = await asyncio.wait({waiter, reader}, timeout=TURN_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if reader in done:
            exc = reader.exception() if not reader.cancelled() else None
            raise ConnectionError(f"the server closed the connection ({exc or 'no reason'})")
        if not done:
            rec.errors.append(f"no response within {TURN_TIMEOUT_S:.0f} s")
            raise TimeoutError(f"turn {rec.turn} of {rec.conversation}: no response within {TURN_TIMEOUT_S:.0f} s")

    async def _barge_in(self, transport: Transport, now: float) -> None:
        """Speech started: if it interrupts an answer still playing, playback stops now; tell the
        server how much of the answer was heard."""
        prev = next((r for r in reversed(self.records) if r.interrupted_by_t is not None and r.interrupted_by_t <= now + 0.05), None)
        if prev is None:
            return
        nxt = next((x for x in self.records if x.turn == prev.turn + 1), None)
        if nxt is None or nxt.barge_in_ms is not None:
            return
        nxt.barge_in_ms = round((now - prev.interrupted_by_t) * 1000, 1)
        if prev.assistant_item and prev.deliveries:
            heard_ms = int(min(prev.played_s(now), prev.audio_s) * 1000)
            await transport.send_event(
                {"type": "conversation.item.truncate", "item_id": prev.assistant_item, "content_index": 0, "audio_end_ms": heard_ms}
            )

    def _pending(self) -> LiveTurn | None:
        """The turn the server's next turn/response belongs to: the oldest without one."""
        return next((r for r in self.records if r.response_id is None), None)

    async def _read(self, transport: Transport) -> None:
        async for e in transport.events():
            now = time.perf_counter()
            kind = e.get("type", "")
            rid = e.get("response_id")
            if kind == "input_audio_buffer.speech_started":
                await self._barge_in(transport, now)
            elif kind == "input_audio_buffer.speech_stopped":
                rec = next((r for r in self.records if r.turn_end_t is None), None)
                if rec is not None:
                    rec.turn_end_t, rec.item_id = now, e.get("item_id")
                    self._by_item[rec.item_id or ""] = rec
            elif kind == "response.created":
                rec = self._pending()
                if rec is not None:
                    rec.response_id, rec.created_t = e["response"]["id"], now
                    self._by_response[rec.response_id] = rec
            elif kind in ("response.output_audio.delta", "response.audio.delta"):
                rec = self._by_response.get(rid or "")
                if rec is not None:
                    rec.assistant_item = e.get("item_id")
                    raw = base64.b64decode(e["delta"])
                    seconds = len(raw) / 2 / RATE
                    if rec.audio is not None:
                        rec.audio.append(raw)
                    rec.deliveries.append((now, seconds))
                    rec.audio_s += seconds
                    rec.last_audio_t = now
                    if rec.first_audio_t is None:
                        rec.first_audio_t = now
                        rec.first_audio.set()
                    rec.heard_from(now, np.frombuffer(raw, "<i2"), RATE)
            elif kind in ("response.output_audio_transcript.delta", "response.output_text.delta", "response.audio_transcript.delta", "response.text.delta"):
                rec = self._by_response.get(rid or "")
                if rec is not None and rec.first_text_t is None:
                    rec.first_text_t = now
            elif kind == "conversation.item.input_audio_transcription.completed":
                rec = self._by_item.get(e.get("item_id", ""))
                if rec is not None:
                    rec.heard = e.get("transcript", "")
            elif kind == "response.done":
                r = e["response"]
                rec = self._by_response.get(r["id"])
                if rec is None:
                    continue
                rec.done_t, rec.status = now, r.get("status")
                usage = r.get("usage") or {}
                rec.input_tokens = usage.get("input_tokens")
                rec.cached_tokens = (usage.get("input_token_details") or {}).get("cached_tokens")
                for output in r.get("output") or []:
                    if output.get("type") == "function_call":
                        rec.calls.append({"name": output.get("name", ""), "arguments": output.get("arguments", "")})
                    for part in output.get("content") or []:
                        rec.answer = part.get("transcript") or part.get("text") or rec.answer
                for key, value in (r.get("metadata") or {}).items():
                    if key.startswith("timing.") and key.endswith("_ms"):
                        try:
                            rec.server_timings_ms[key[len("timing.") : -len("_ms")]] = float(value)
                        except ValueError:
                            pass
                if rec.interrupted_by_t is not None and rec.status == "cancelled":
                    nxt = next((x for x in self.records if x.turn == rec.turn + 1), None)
                    if nxt is not None:
                        nxt.barge_in_cancel_ms = round((now - rec.interrupted_by_t) * 1000, 1)
                rec.first_audio.set()  # a response without audio still releases a barge-in wait
                rec.done.set()
                self.on_turn()
            elif kind == "error":
                message = (e.get("error") or {}).get("message", "")
                rec = self._by_response.get(rid or "") or (self.records[-1] if self.records else None)
                (rec.errors if rec else self.errors).append(message)
