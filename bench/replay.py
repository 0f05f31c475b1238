"""The latency replay harness: replays spoken conversations into any OpenAI-Realtime-compatible
server at real-time pace and measures what a caller feels.

    realtime-omni bench replay --url ws://127.0.0.1:8000/v1 --dataset builtin --concurrency 4 --turns 4 --out DIR
    realtime-omni bench compare A/summary.json B/summary.json

Each simulated user streams 20 ms appends on a steady clock (silence when not speaking, like a live
microphone), waits for the answer to finish *playing* (simulated from the audio received) plus a
short think time before the next turn, and on barge-in turns starts speaking while the answer plays.

Per turn (all client-side, times on the harness's clock):

* ``voice_to_voice_ms``: end of the user's speech in the replayed audio -> first audio delta;
* ``ttft_ms``: the same end of speech -> first text (transcript or text delta);
* ``audio_ttfp_ms``: the server's end-of-turn (``input_audio_buffer.speech_stopped`` arriving) ->
  first audio delta: time to first audio packet, without the VAD's end-of-turn wait;
* ``audio_rtf``: (server end-of-turn -> last audio delta) / seconds of audio received (< 1: faster
  than real time);
* ``gaps_over_100ms``: stalls longer than 100 ms when the received audio is played back in real time
  from its first packet (each delta plays at ``max(arrival, end of the previous one)``);
* ``barge_in_ms``: on a barge-in turn whose answer was still playing, from the onset of the user's
  speech in the replayed audio to the moment the answer's audio stops at the client, which is when
  the server's ``input_audio_buffer.speech_started`` arrives (a client stops playback there, as
  OpenAI's clients do; the harness then truncates the answer to what was played). When the answer
  was still being generated, ``barge_in_cancel_ms`` is the time to its ``response.done`` (cancelled);
* ``input_wer``: word error rate of the server's input transcript against the known text;
* ``server_timings_ms``: the per-stage timings the server reports in ``response.done``
  (``metadata["timing.<stage>_ms"]``; this server does, peers may not);
* errors: ``error`` events, responses that never came, dropped connections.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import re
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .dataset import RATE, Conversation, Turn
from .rtc import WebRTCTransport

CHUNK = RATE // 50  # 20 ms of samples per append
TURN_TIMEOUT_S = 60.0


# ------------------------------------------------------------------------------ transports


class Transport(Protocol):
    """How the harness reaches a server. WebSocket today; WebRTC and SIP clients plug in here."""

    async def send_audio(self, pcm16: bytes) -> None: ...
    async def send_event(self, event: dict[str, Any]) -> None: ...
    def events(self) -> AsyncIterator[dict[str, Any]]: ...
    async def close(self) -> None: ...


class WebSocketTransport:
    def __init__(self, ws: Any) -> None:
        self.ws = ws

    @classmethod
    async def open(cls, url: str, model: str, api_key: str | None) -> "WebSocketTransport":
        import websockets

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        ws = await websockets.connect(f"{url.rstrip('/')}/realtime?model={model}", additional_headers=headers, max_size=None, open_timeout=30)
        return cls(ws)

    async def send_audio(self, pcm16: bytes) -> None:
        await self.ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm16).decode()}))

    async def send_event(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        async for message in self.ws:
            yield json.loads(message)

    async def close(self) -> None:
        await self.ws.close()


TRANSPORTS: dict[str, Any] = {"websocket": WebSocketTransport, "webrtc": WebRTCTransport}


# ------------------------------------------------------------------------------ the user's microphone


class Mic:
    """Streams to the server in real time, one 20 ms append per tick of a steady clock: queued
    speech when there is some, silence otherwise. Knows when each sample it sent had left."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.queue: list[np.ndarray] = []
        self.sent = 0  # samples sent
        self.t0 = 0.0
        self.lag_ms: list[float] = []  # how late each append left (the harness's own health)

    def play(self, pcm: np.ndarray) -> tuple[int, int]:
        """Queue ``pcm``; returns the stream positions of its first and last speech sample."""
        start = self.sent + sum(len(p) for p in self.queue)
        loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > 64)
        first, last = (int(loud[0]), int(loud[-1])) if len(loud) else (0, len(pcm) - 1)
        self.queue.append(pcm)
        return start + first, start + last

    def time_of(self, sample: int) -> float:
        """When ``sample`` had been sent: its 20 ms chunk leaves once fully 'recorded'."""
        return self.t0 + (sample // CHUNK + 1) * CHUNK / RATE

    async def run(self) -> None:
        silence = np.zeros(CHUNK, np.int16)
        pending = np.zeros(0, np.int16)
        self.t0 = time.perf_counter()
        n = 0
        while True:
            n += 1
            delay = self.t0 + n * CHUNK / RATE - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            self.lag_ms.append(max(0.0, -delay * 1000))
            while len(pending) < CHUNK and self.queue:
                pending = np.concatenate([pending, self.queue.pop(0)])
            if len(pending) >= CHUNK:
                chunk, pending = pending[:CHUNK], pending[CHUNK:]
            else:
                chunk, pending = np.concatenate([pending, silence[len(pending) :]]), pending[:0]
            await self.transport.send_audio(chunk.astype("<i2").tobytes())
            self.sent += CHUNK


# ------------------------------------------------------------------------------ one turn's record


@dataclass
class TurnRecord:
    conversation: str
    turn: int
    text: str
    barge_in: bool
    onset_t: float = 0.0  # user speech begins (client clock)
    speech_end_t: float = 0.0  # user speech ends in the replayed audio
    turn_end_t: float | None = None  # the server's speech_stopped arrived
    item_id: str | None = None
    response_id: str | None = None
    created_t: float | None = None
    first_text_t: float | None = None
    first_audio_t: float | None = None
    last_audio_t: float | None = None
    done_t: float | None = None
    status: str | None = None
    audio_s: float = 0.0
    deliveries: list[tuple[float, float]] = field(default_factory=list)  # (arrival, seconds)
    heard: str | None = None
    answer: str | None = None
    input_tokens: int | None = None
    cached_tokens: int | None = None
    server_timings_ms: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    interrupted_by_t: float | None = None  # onset of the user speech that barged in on this answer
    assistant_item: str | None = None
    barge_in_ms: float | None = None  # set on the interrupting turn: onset -> playback stopped
    barge_in_cancel_ms: float | None = None  # onset -> the interrupted response's response.done

    def __post_init__(self) -> None:
        self.done = asyncio.Event()
        self.first_audio = asyncio.Event()

    def playback_end(self) -> float:
        """When the received audio would have finished playing (real time from its first packet)."""
        end = 0.0
        for arrival, seconds in self.deliveries:
            end = max(end, arrival) + seconds
        return end

    def played_s(self, at: float) -> float:
        """Seconds of the received audio played by ``at``."""
        played, end = 0.0, 0.0
        for arrival, seconds in self.deliveries:
            start = max(end, arrival)
            if start >= at:
                break
            played += min(seconds, at - start)
            end = start + seconds
        return played

    def gaps(self) -> list[float]:
        out, end = [], 0.0
        for arrival, seconds in self.deliveries:
            if end and arrival > end:
                out.append(arrival - end)
            end = max(end, arrival) + seconds
        return out

    def metrics(self) -> dict[str, Any]:
        ms = lambda a, b: round((a - b) * 1000, 1) if a is not None and b is not None else None  # noqa: E731
        m: dict[str, Any] = {
            "conversation": self.conversation,
            "turn": self.turn,
            "text": self.text,
            "barge_in": self.barge_in,
            "status": self.status,
            "voice_to_voice_ms": ms(self.first_audio_t, self.speech_end_t),
            "ttft_ms": ms(self.first_text_t, self.speech_end_t),
            "audio_ttfp_ms": ms(self.first_audio_t, self.turn_end_t),
            "turn_end_detected_ms": ms(self.turn_end_t, self.speech_end_t),
            "audio_s": round(self.audio_s, 3),
            "audio_rtf": None,
            "gaps_over_100ms": sum(1 for g in self.gaps() if g > 0.1),
            "max_gap_ms": round(max(self.gaps(), default=0.0) * 1000, 1),
            "barge_in_ms": self.barge_in_ms,
            "barge_in_cancel_ms": self.barge_in_cancel_ms,
            "heard": self.heard,
            "answer": self.answer,
            "input_tokens": self.input_tokens,
            "cached_tokens": self.cached_tokens,
            "input_wer": round(wer(self.text, self.heard), 4) if self.heard is not None and self.text else None,
            "server_timings_ms": self.server_timings_ms,
            "errors": self.errors,
        }
        if self.status == "completed" and self.audio_s > 0 and self.turn_end_t is not None and self.last_audio_t is not None:
            m["audio_rtf"] = round((self.last_audio_t - self.turn_end_t) / self.audio_s, 3)
        # a timeline for plots, in seconds from the conversation's start
        m["timeline"] = {
            k: v
            for k, v in {
                "onset": self.onset_t,
                "speech_end": self.speech_end_t,
                "turn_end": self.turn_end_t,
                "created": self.created_t,
                "first_audio": self.first_audio_t,
                "done": self.done_t,
            }.items()
            if v is not None
        }
        m["playback"] = [[a, s] for a, s in self.deliveries]
        return m


# ------------------------------------------------------------------------------ word error rate


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower().replace("colour", "color").replace("favourite", "favorite"))


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate: (substitutions + deletions + insertions) / reference words."""
    ref, hyp = _words(reference), _words(hypothesis)
    if not ref:
        return 0.0 if not hyp else 1.0
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1] / len(ref)


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


class Replay:
    def __init__(self, conversation: Conversation, options: Options, on_turn: Any = None) -> None:
        self.conversation = conversation
        self.options = options
        self.records: list[TurnRecord] = []
        self.errors: list[str] = []
        self.on_turn = on_turn or (lambda: None)
        self.rng = random.Random(f"{options.seed}:{conversation.name}")
        self.t0 = 0.0
        self._by_response: dict[str, TurnRecord] = {}
        self._by_item: dict[str, TurnRecord] = {}
        self.mic_lag_ms: list[float] = []

    async def run(self) -> list[TurnRecord]:
        o = self.options
        try:
            transport = await TRANSPORTS[o.transport].open(o.url, o.model, o.api_key)
        except Exception as exc:
            self.errors.append(f"connect: {type(exc).__name__}: {exc}")
            return []
        mic = Mic(transport)
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
            rec = TurnRecord(self.conversation.name, k, turn.text, turn.barge_in)
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

    async def _wait(self, event: asyncio.Event, reader: asyncio.Task[None], rec: TurnRecord) -> None:
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

    def _pending(self) -> TurnRecord | None:
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
                    seconds = len(base64.b64decode(e["delta"])) / 2 / RATE
                    rec.deliveries.append((now, seconds))
                    rec.audio_s += seconds
                    rec.last_audio_t = now
                    if rec.first_audio_t is None:
                        rec.first_audio_t = now
                        rec.first_audio.set()
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


# ------------------------------------------------------------------------------ many conversations


class Progress:
    def __init__(self, total: int, stream: Any = sys.stderr) -> None:
        self.total, self.done, self.stream = total, 0, stream
        self.t0 = time.perf_counter()

    def step(self) -> None:
        self.done += 1
        width = 30
        filled = width * self.done // max(1, self.total)
        elapsed = time.perf_counter() - self.t0
        self.stream.write(f"\r  [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} turns  {elapsed:5.0f} s")
        if self.done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


async def replay(
    conversations: list[Conversation],
    options: Options,
    concurrency: int = 1,
    rate: float | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Replay every conversation: at most ``concurrency`` at once, or started at ``rate`` per
    second (Poisson arrivals). Returns the per-turn metrics and the harness's own health."""
    total = sum(len(c.turns[: options.turns or None]) for c in conversations)
    bar = Progress(total) if progress else None
    runs = [Replay(c, options, bar.step if bar else None) for c in conversations]
    rng = random.Random(options.seed)
    limit = asyncio.Semaphore(concurrency if rate is None else len(runs))
    t0 = time.perf_counter()

    async def one(i: int, run: Replay, delay: float) -> None:
        await asyncio.sleep(delay)
        async with limit:
            await run.run()

    delays, at = [], 0.0
    for _ in runs:
        delays.append(at if rate else 0.0)
        at += rng.expovariate(rate) if rate else 0.0
    await asyncio.gather(*(one(i, r, d) for i, (r, d) in enumerate(zip(runs, delays))))
    turns = []
    for run in runs:
        for rec in run.records:
            m = rec.metrics()
            # timeline in seconds from the conversation's start
            m["timeline"] = {k: round(v - run.t0, 4) for k, v in m["timeline"].items()}
            m["playback"] = [[round(a - run.t0, 4), s] for a, s in m["playback"]]
            turns.append(m)
    lag = [x for run in runs for x in run.mic_lag_ms]
    return {
        "turns": turns,
        "connection_errors": [e for run in runs for e in run.errors],
        "wall_s": round(time.perf_counter() - t0, 2),
        "mic_lag_ms": {"p50": float(np.percentile(lag, 50)), "p99": float(np.percentile(lag, 99))} if lag else {},
    }

