"""Input transcription: each user item's audio transcribed once committed, and live captions of
the turn still being spoken (captions.py has their rules).

A part of the session (see session.py). Transcripts always go into the item (the history a
pipeline reads); the ``conversation.item.input_audio_transcription.*`` events go out only while
the session asks for input transcription. A recogniser that fails or hangs fails that transcript
alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from pipelines.base import Message, Part

from ..protocol import events as ev
from .captions import Captions
from .context import SessionContext

log = logging.getLogger(__name__)

MAX_CAPTIONED_TURNS = 8  # turns whose captions await their final transcript


class Transcriber:
    def __init__(self, ctx: SessionContext) -> None:
        self.ctx = ctx
        self._captions: OrderedDict[str, Captions] = OrderedDict()  # live captions by item, until its transcript

    @property
    def captioning(self) -> bool:
        """Whether live captions are wanted now: the pipeline transcribes and the session asks."""
        return self.ctx.caps.transcribes_input and self.ctx.config.transcription is not None

    def transcribe(self, item: Message) -> None:
        """Transcribe each audio part of a user item that has no text yet, in the background."""
        if not self.ctx.caps.transcribes_input:
            return
        for index, part in enumerate(item.parts):
            if part.kind == "audio" and part.audio is not None and part.text is None:
                self.ctx.tasks.spawn(self._transcribe(item, index, part), "transcribe")

    async def _transcribe(self, item: Message, index: int, part: Part) -> None:
        assert part.audio is not None
        ctx = self.ctx
        span = ctx.trace.transcription(item.id)
        try:
            async with asyncio.timeout(ctx.limits.stage_timeout_s):  # a hung recogniser fails this transcript only
                result = await ctx.pipe.transcribe(item.id, part.audio)
            span.end()
        except asyncio.CancelledError:  # the session closed
            span.end("cancelled")
            raise
        except Exception as exc:
            span.end(str(exc) or type(exc).__name__)
            log.exception("transcription of %s failed", item.id)
            if ctx.config.transcription is not None:
                error = ev.InputTranscriptionError(type="server_error", code="transcription_failed", message=str(exc) or type(exc).__name__)
                await ctx.emit(ev.InputTranscriptionFailed(item_id=item.id, content_index=index, error=error))
            return
        if result is None:
            return
        part.text = result.text
        captions = self._captions.pop(item.id, None)
        if ctx.config.transcription is not None:
            delta = captions.finish(result.text) if captions is not None else result.text
            if delta:  # the rest after the live captions, or the whole transcript
                await ctx.emit(ev.InputTranscriptionDelta(item_id=item.id, content_index=index, delta=delta))
            usage = ev.TranscriptionDurationUsage(seconds=round(result.audio_seconds, 3))
            await ctx.emit(ev.InputTranscriptionCompleted(item_id=item.id, content_index=index, transcript=result.text, usage=usage))

    def caption(self, item_id: str, pcm: np.ndarray, still_open: Callable[[], bool]) -> asyncio.Task[None]:
        """A caption pass over ``pcm``, the turn ``item_id`` from its start so far; its new words
        go out only if ``still_open()`` says the turn is still being spoken when the pass is done."""
        if item_id not in self._captions:
            self._captions[item_id] = Captions()
            while len(self._captions) > MAX_CAPTIONED_TURNS:
                self._captions.popitem(last=False)
        return self.ctx.tasks.spawn(self._caption(item_id, pcm, still_open), "caption")

    async def _caption(self, item_id: str, pcm: np.ndarray, still_open: Callable[[], bool]) -> None:
        try:
            text = await self.ctx.pipe.caption(pcm)
        except Exception:
            log.exception("caption pass of %s failed", item_id)
            return
        captions = self._captions.get(item_id)
        if text is None or captions is None or not still_open():  # the turn ended meanwhile
            return
        delta = captions.hear(text)
        if delta:
            await self.ctx.emit(ev.InputTranscriptionDelta(item_id=item_id, content_index=0, delta=delta))
