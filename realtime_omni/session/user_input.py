"""What the user has said: the input audio buffer, the turn open in it, and commits.

A part of the session (see session.py). Turn-taking (turn_taking.py) decides where a turn begins
and ends; this part keeps the audio, feeds the open turn's audio to the pipeline as far as it is
told, and makes a stretch of the buffer a user item: ``input_audio_buffer.committed``, the item's
``conversation.item.added``/``done``, then its transcription. The camera's latest frame, if the
pipeline sees images, goes with the next item committed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from pipelines.base import Message, Part

from ..protocol import events as ev
from .context import SessionContext
from .conversation import to_wire
from .input_buffer import InputBuffer
from .items import Items
from .transcription import Transcriber


@dataclass
class UserTurn:
    """The user's turn in progress (server VAD): the item it will become and what was fed."""

    item_id: str
    start: int
    fed: int
    held_until: int = 0  # interruption guard: not yet a turn until the buffer reaches this position
    hold: int | None = None  # semantic_vad: fed up to this pause, waiting for a verdict or more speech
    captioned: int = 0  # buffer position of the last caption pass
    captioning: asyncio.Task[None] | None = None


class UserInput:
    def __init__(self, ctx: SessionContext, items: Items, transcriber: Transcriber) -> None:
        self.ctx = ctx
        self.items = items
        self.transcriber = transcriber
        self.buffer = InputBuffer(ctx.caps.input_rate, ctx.limits.max_buffer_seconds)
        self.turn: UserTurn | None = None  # the turn open now (server VAD)
        self.video_frame: str | None = None  # the latest sampled camera frame (data URL), for the next turn

    def feed_to(self, pos: int) -> None:
        """Feed the open turn's audio to the pipeline up to buffer position ``pos``."""
        turn = self.turn
        if turn is not None and pos > turn.fed:
            self.ctx.pipe.feed(self.buffer.slice(turn.fed, pos))
            turn.fed = pos

    async def commit(self, item_id: str, start: int, end: int) -> None:
        """The buffer from ``start`` to ``end`` becomes the user item ``item_id``."""
        ctx = self.ctx
        pcm = self.buffer.slice(start, end)
        self.buffer.drop_before(end)
        ctx.pipe.commit(item_id)
        parts = [Part("audio", audio=pcm)]
        if self.video_frame is not None and ctx.caps.images:
            parts.append(Part("image", image_url=self.video_frame))  # what the camera showed as the turn ended
            self.video_frame = None
        item = Message(item_id, "user", parts)
        previous = self.items.add(item)
        await ctx.emit(ev.InputAudioBufferCommitted(previous_item_id=previous, item_id=item_id))
        wire = to_wire(item, ctx.caps)
        await ctx.emit(ev.ConversationItemAdded(previous_item_id=previous, item=wire))
        await ctx.emit(ev.ConversationItemDone(previous_item_id=previous, item=wire))
        self.transcriber.transcribe(item)
