"""Where a response's audio goes: the two kinds of ``run.AudioOut``, chosen when the session opens.

``EventAudio`` (WebSocket): ``response.output_audio.delta`` events in the outbox, in the session's
output format; the client plays them itself, and a cut drops the deltas still queued
(``Port.purge``). ``PacedAudio`` (WebRTC, SIP): into the media transport's playout, at its rate; a
cut drops what the playout still holds and says how much of the message playing was heard.
"""

from __future__ import annotations

import base64

import numpy as np

from dsp.resample import PolyphaseResampler
from pipelines.base import Message

from ..protocol import events as ev
from ..protocol.audio import OutputConverter, WireFormat
from .draft import Weight
from .playout import Cut, Playout
from .port import Port
from .run import ResponseRun


class EventAudio:
    """Audio as ``response.output_audio.delta`` events in the outbox, converted to the session's
    output format (the deltas are dropped from the outbox by ``Port.purge``)."""

    def __init__(self, port: Port, rate: int, fmt: WireFormat) -> None:
        self.port = port
        self.rate = rate
        self.format = fmt
        self._converter: OutputConverter | None = None

    async def write(self, run: ResponseRun, message: Message, index: int, pcm: np.ndarray) -> bool:
        if self._converter is None:
            self._converter = OutputConverter(self.rate, self.format)
        return await self._send(run, message, index, self._converter(pcm), len(pcm))

    async def finish(self, run: ResponseRun, message: Message | None, index: int) -> None:
        converter, self._converter = self._converter, None
        if converter is not None and message is not None:
            tail = converter.flush()
            if tail:
                await self._send(run, message, index, tail, 0)

    def drop(self, run: ResponseRun) -> tuple[Cut | None, list[Weight]]:
        return None, []

    async def _send(self, run: ResponseRun, message: Message, index: int, data: bytes, samples: int) -> bool:
        if not data and not samples:
            return False
        delta = ev.ResponseOutputAudioDelta(
            response_id=run.id, item_id=message.id, output_index=index, content_index=0, delta=base64.b64encode(data).decode()
        )
        return await self.port.emit(delta, run, Weight(message, samples=samples))


class PacedAudio:
    """Audio into a media transport's playout, resampled to its rate as it comes (a polyphase
    filter: soxr's stream would hold 40-80 ms back)."""

    def __init__(self, playout: Playout, rate: int) -> None:
        self.playout = playout
        self.rate = rate
        self._resampler: PolyphaseResampler | None = None

    async def write(self, run: ResponseRun, message: Message, index: int, pcm: np.ndarray) -> bool:
        if self._resampler is None:
            self._resampler = PolyphaseResampler(self.rate, self.playout.rate)
        return await self.playout.write(run, message, self._resampler(pcm), len(pcm))

    async def finish(self, run: ResponseRun, message: Message | None, index: int) -> None:
        resampler, self._resampler = self._resampler, None
        if resampler is not None and message is not None:
            await self.playout.write(run, message, resampler.flush(), 0)
        self.playout.end(run)

    def drop(self, run: ResponseRun) -> tuple[Cut | None, list[Weight]]:
        cut, dropped = self.playout.drop(run)
        return cut, [Weight(message, samples=samples) for message, samples in dropped]
