"""Paced output audio for media transports (WebRTC, SIP).

Over WebSocket the client gets audio as fast as it is produced and plays it itself. A media
transport instead sends a real-time stream: one 20 ms frame per tick of a steady clock. The
``Playout`` sits between the two: responses ``write`` audio (already at the transport's rate) into
a small bounded buffer, waiting while it is full, so a response is never more than
``max_buffer_ms`` ahead of what the caller hears; the transport's clock calls ``next_frame``.

Because only a little is buffered, cutting the audio (barge-in, ``output_audio_buffer.clear``)
silences the stream within a frame, and what was played is known to the sample: ``drop`` returns
how much of each message's audio it removed unplayed, and a cut how much of the message playing
had been played, which is how an interrupted answer is truncated to what the caller heard.

It reports ``output_audio_buffer.started`` when a response's first frame leaves, ``stopped`` when
its last one has, and the session reports ``cleared`` when it cuts it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..clock import Ticker
from ..protocol import events as ev


class AudioOwner(Protocol):
    """What writes audio into the playout: a response."""

    id: str
    muted: bool


@dataclass
class _Chunk:
    owner: AudioOwner
    message: Any
    pcm: np.ndarray  # at the playout rate
    source_samples: int  # the same audio in samples at the pipeline's output rate
    pos: int = 0


@dataclass
class Cut:
    """What a cut interrupted: the owner playing, its message, and how much of it was played
    (samples at the pipeline's output rate)."""

    owner: AudioOwner
    message: Any
    played: int


class Playout:
    def __init__(self, rate: int, notify: Callable[[Any], None], *, frame_ms: int = 20, max_buffer_ms: int = 200) -> None:
        self.rate = rate
        self.frame_ms = frame_ms
        self.frame_samples = rate * frame_ms // 1000
        self.max_samples = max(self.frame_samples, rate * max_buffer_ms // 1000)
        self._notify = notify  # takes a server event (started / stopped)
        self._chunks: deque[_Chunk] = deque()
        self._buffered = 0
        self._space = asyncio.Event()
        self._playing: AudioOwner | None = None  # whose audio is on the wire (started, not yet stopped)
        self.playing_since = 0.0  # monotonic time the owner playing now started (the interruption guard's grace)
        self._ended: set[int] = set()  # id() of owners that will write no more
        self._message: Any = None
        self._message_played = 0
        self.clock = Ticker(frame_ms / 1000)
        self.closed = False

    @property
    def playing(self) -> AudioOwner | None:
        return self._playing

    # ------------------------------------------------------------------ producer side

    async def write(self, owner: AudioOwner, message: Any, pcm: np.ndarray, source_samples: int) -> bool:
        """Queue audio; waits while the buffer is full. False (nothing queued) once the owner is
        muted or the playout closed."""
        while self._buffered >= self.max_samples and not owner.muted and not self.closed:
            self._space.clear()
            await self._space.wait()
        if owner.muted or self.closed or (not len(pcm) and not source_samples):
            return False
        self._chunks.append(_Chunk(owner, message, pcm, source_samples))
        self._buffered += len(pcm)
        return True

    def end(self, owner: AudioOwner) -> None:
        """The owner will write no more: ``stopped`` follows its last frame."""
        if self._has(owner):
            self._ended.add(id(owner))
        elif self._playing is owner:
            self._stop()

    def drop(self, owner: AudioOwner) -> tuple[Cut | None, list[tuple[Any, int]]]:
        """Remove what ``owner`` still has queued (it was muted). Returns what was cut if its audio
        was playing, and (message, samples at the pipeline's rate) of each piece removed unplayed."""
        cut = self._cut() if self._playing is owner else None
        dropped = [(c.message, c.source_samples - _scaled(c.pos, c)) for c in self._chunks if c.owner is owner]
        kept = deque(c for c in self._chunks if c.owner is not owner)
        self._buffered = sum(len(c.pcm) - c.pos for c in kept)
        self._chunks = kept
        self._ended.discard(id(owner))
        self._space.set()
        return cut, dropped

    def clear(self) -> Cut | None:
        """Drop everything queued. Returns what was cut if audio was playing."""
        cut = self._cut() if self._playing is not None else None
        self._chunks.clear()
        self._buffered = 0
        self._ended.clear()
        self._space.set()
        return cut

    def close(self) -> None:
        self.closed = True
        self.clear()

    # ------------------------------------------------------------------ clock side

    async def next_frame(self) -> np.ndarray:
        """Wait for the next tick of the playout's own 20 ms clock, then the frame to send
        (silence when nothing is queued)."""
        await self.clock.wait()
        frame = self.frame()
        return frame if frame is not None else np.zeros(self.frame_samples, np.int16)

    def frame(self) -> np.ndarray | None:
        """The next frame of queued audio (padded with silence), or None when nothing is queued."""
        if not self._chunks:
            return None
        out = np.zeros(self.frame_samples, np.int16)
        filled = 0
        while filled < self.frame_samples and self._chunks:
            chunk = self._chunks[0]
            if self._playing is not chunk.owner:
                if self._playing is not None:
                    self._stop()
                self._playing = chunk.owner
                self.playing_since = time.monotonic()
                self._notify(ev.OutputAudioBufferStarted(response_id=chunk.owner.id))
            if chunk.message is not self._message:
                self._message, self._message_played = chunk.message, 0
            take = min(self.frame_samples - filled, len(chunk.pcm) - chunk.pos)
            out[filled : filled + take] = chunk.pcm[chunk.pos : chunk.pos + take]
            start, chunk.pos = chunk.pos, chunk.pos + take
            filled += take
            # the pipeline-rate samples this slice stands for, exact over the whole chunk
            self._message_played += _scaled(chunk.pos, chunk) - _scaled(start, chunk)
            if chunk.pos >= len(chunk.pcm):
                self._chunks.popleft()
        self._buffered -= filled
        self._space.set()
        playing = self._playing
        if playing is not None and id(playing) in self._ended and not self._has(playing):
            self._stop()
        return out

    # ------------------------------------------------------------------ internals

    def _has(self, owner: AudioOwner) -> bool:
        return any(c.owner is owner for c in self._chunks)

    def _stop(self) -> None:
        owner = self._playing
        if owner is None:
            return
        self._playing = None
        self._ended.discard(id(owner))
        self._notify(ev.OutputAudioBufferStopped(response_id=owner.id))

    def _cut(self) -> Cut:
        owner = self._playing
        assert owner is not None
        cut = Cut(owner, self._message, self._message_played)
        self._playing = None
        self._message, self._message_played = None, 0
        return cut


def _scaled(pos: int, chunk: _Chunk) -> int:
    """The pipeline-rate samples that ``pos`` playout samples of ``chunk`` stand for."""
    if not len(chunk.pcm):
        return 0
    return pos * chunk.source_samples // len(chunk.pcm)
