"""A realtime session: the state machine behind one client, whatever transport carries it.

A transport feeds it client messages (``handle``) or, for media transports, PCM frames at the
pipeline's input rate (``push_audio``), DTMF and camera frames, and sends whatever appears in
``outbox`` (and, for media transports, plays ``playout``). Client mistakes become ``error``
events; the session always survives them.

This module holds the state, the dispatcher (one handler per client event type), event sending,
``session.update`` and the session's end. The handlers live by idea beside it: input.py (input
audio and turn-taking), items.py (conversation items), responses.py (responses).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec

from pipelines.base import FunctionCall, Message, Pipeline, TurnModel

from ..config import InterruptionGuard, Limits
from ..errors import RealtimeError
from ..ids import EventIds, new_id
from ..metrics import Metrics
from ..protocol import events as ev
from ..protocol.audio import InputConverter, samples_to_ms
from ..protocol.codec import decode_client_event
from ..tasks import TaskSet
from . import config as sc
from .captions import Captions
from .conversation import Alignment, Conversation
from .input import InputHandling, UserTurn
from .input_buffer import InputBuffer
from .items import ItemHandling
from .outbox import Outbox, EventOwner
from .playout import Playout
from .responses import ResponseHandling
from .run import ResponseRun, Weight
from .turns import TurnDetector

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Media:
    """How a session's audio travels, fixed when it opens. The default is a WebSocket's: answer
    audio as ``response.output_audio.delta`` events."""

    playout_rate: int | None = None  # a media transport's: answer audio leaves paced, from a playout at this rate
    playout_buffer_ms: int = 200
    interruption_guard: InterruptionGuard | None = None  # telephony: see ``_guard_holds``


class Session(InputHandling, ItemHandling, ResponseHandling):
    # the handler of each client event, by method name: a table of bound methods on the instance
    # would be a reference cycle, keeping a closed session's audio alive until a full collection
    _HANDLERS: ClassVar[dict[type, str]] = {
        ev.InputAudioBufferAppend: "_on_append",
        ev.InputAudioBufferCommit: "_on_commit",
        ev.InputAudioBufferClear: "_on_clear",
        ev.OutputAudioBufferClear: "_on_output_clear",
        ev.SessionUpdate: "_on_session_update",
        ev.TranscriptionSessionUpdate: "_on_transcription_session_update",
        ev.ConversationItemCreate: "_on_item_create",
        ev.ConversationItemRetrieve: "_on_item_retrieve",
        ev.ConversationItemDelete: "_on_item_delete",
        ev.ConversationItemTruncate: "_on_item_truncate",
        ev.ResponseCreate: "_on_response_create",
        ev.ResponseCancel: "_on_response_cancel",
    }

    def __init__(
        self,
        pipeline: Pipeline,
        defaults: sc.SessionConfig,
        limits: Limits,
        metrics: Metrics,
        *,
        media: Media = Media(),
        beta: bool = False,
        timing_metadata: bool = False,
        turn_model: TurnModel | None = None,
    ) -> None:
        self.id = new_id("sess")
        self.turn_model = turn_model  # semantic_vad's end-of-turn model (None: a fixed silence per eagerness)
        self.caps = pipeline.capabilities
        self.limits = limits
        self.metrics = metrics
        self.beta = beta
        self.timing_metadata = timing_metadata
        self.config = defaults
        self.pipe = pipeline.open(self.id)
        if defaults.noise_reduction is not None:
            self.pipe.reduce_noise(defaults.noise_reduction)
        self.outbox = Outbox(limits.outbox_events)
        self.conversation = Conversation(self.caps, max_items=limits.max_items, max_audio_seconds=limits.max_audio_seconds)
        self.buffer = InputBuffer(self.caps.input_rate, limits.max_buffer_seconds)
        self._input = InputConverter(defaults.input_format, self.caps.input_rate)
        self.detector: TurnDetector | None = None
        self._turn: UserTurn | None = None
        self.active: ResponseRun | None = None  # the in-band response, if any
        self.media = media
        self.playout = Playout(media.playout_rate, self._notify, max_buffer_ms=media.playout_buffer_ms) if media.playout_rate else None
        self._agent_since = 0.0  # monotonic time the playout last started an answer
        self._video_frame: str | None = None  # the latest sampled camera frame (data URL), for the next turn
        self._captions: OrderedDict[str, Captions] = OrderedDict()  # live captions by item, until its transcript
        self.out_of_band: set[ResponseRun] = set()
        self.tasks = TaskSet(self.id)  # transcriptions, timers, events emitted from callbacks
        self._idle_timer: asyncio.Task[None] | None = None
        self._idle_from: int | None = None  # buffer position the idle period started at
        self._event_id = EventIds()
        self._context_tokens = 0
        self.closed = False
        self.ending = False
        self._reset_detector()

    # ================================================================== plumbing

    async def start(self) -> None:
        await self.emit(ev.SessionCreated(session=self.config.public))
        await self.emit(ev.ConversationCreated(conversation=ev.Conversation(id=self.conversation.id)))

    async def emit(self, event: Any, owner: EventOwner | None = None, weight: Weight | None = None) -> bool:
        if isinstance(event, ev.ServerEvent):
            event.event_id = self._event_id()
        if isinstance(event, ev.Error):
            self.metrics.errors.labels(event.error.code or "none").inc()
        return await self.outbox.put(event, owner, weight)

    def purge(self, owner: EventOwner) -> list[Weight]:
        return self.outbox.purge(owner)

    async def emit_error(
        self, message: str, *, code: str | None, param: str | None = None, type: str = "invalid_request_error", event_id: str | None = None
    ) -> None:
        await self.emit(ev.Error(error=ev.ErrorDetail(type=type, code=code, message=message, param=param, event_id=event_id)))

    async def report(self, err: RealtimeError) -> None:
        """A client mistake (or a transport's trouble with its input) as an ``error`` event."""
        await self.emit_error(err.message, code=err.code, param=err.param, type=err.type, event_id=err.event_id)

    def ms(self, samples: int) -> int:
        return samples_to_ms(samples, self.caps.input_rate)

    def add_item(self, item: Message | FunctionCall, alignment: Alignment | None = None, previous_item_id: str | None = None) -> str | None:
        previous, evicted = self.conversation.add(item, previous_item_id)
        if alignment is not None:
            self.conversation.alignment[item.id] = alignment
        for item_id in evicted:
            self.tasks.spawn(self.emit(ev.ConversationItemDeleted(item_id=item_id)), "evict")
        return previous

    def rate_limits(self) -> ev.RateLimitsUpdated:
        limit = self.caps.context_tokens
        remaining = max(0, limit - self._context_tokens)
        return ev.RateLimitsUpdated(rate_limits=[ev.RateLimit(name="tokens", limit=limit, remaining=remaining, reset_seconds=0.0)])

    # ================================================================== inbound

    async def handle(self, data: bytes | str) -> None:
        """One client message. Never raises for anything the client sent."""
        try:
            event = decode_client_event(data)
        except RealtimeError as err:
            self.metrics.event_in(None)
            await self.report(err)
            return
        self.metrics.event_in(event.__struct_config__.tag)
        try:
            await getattr(self, self._HANDLERS[type(event)])(event)
        except RealtimeError as err:
            err.event_id = err.event_id or event.event_id
            await self.report(err)
        except Exception:  # a defect of ours, not the client's: say so, and keep the session
            log.exception("session %s: handling %s failed", self.id, event.__struct_config__.tag)
            await self.emit_error(
                "The server failed to handle this event; the session carries on.",
                code="server_error",
                type="server_error",
                event_id=event.event_id,
            )

    # ------------------------------------------------------------------ input audio

    # ------------------------------------------------------------------ session

    async def _on_transcription_session_update(self, e: ev.TranscriptionSessionUpdate) -> None:
        await self._on_session_update(ev.SessionUpdate(session=msgspec.structs.replace(e.session, type="transcription")))

    async def _on_session_update(self, e: ev.SessionUpdate) -> None:
        old = self.config
        new = old.updated(e.session, self.caps)
        self.config = new
        if new.input_format is not old.input_format:
            self._input = InputConverter(new.input_format, self.caps.input_rate)
        if new.noise_reduction != old.noise_reduction:
            self.pipe.reduce_noise(new.noise_reduction)
        if new.vad != old.vad:
            if self._turn is not None:
                self.pipe.clear()
                self.buffer.clear()
            self._reset_detector()
            self._cancel_idle_timer()
        await self.emit(ev.SessionUpdated(session=new.public))

    # ------------------------------------------------------------------ conversation

    # ------------------------------------------------------------------ responses

    # ------------------------------------------------------------------ idle timeout

    # ================================================================== ending

    async def end(self, message: str, code: str) -> None:
        """End the session from the server side (shutdown): tell the client why, cancel what is
        running, and close the outbox so the transport sends what is queued and hangs up."""
        if self.ending or self.closed:
            return
        self.ending = True
        self._cancel_idle_timer()
        await self.emit_error(message, code=code, type="server_error")
        for run in [self.active, *self.out_of_band]:
            if run is not None:
                await run.cancel("shutdown")
        self.outbox.close()

    async def close(self) -> None:
        """The connection is gone: stop everything and release what the session held."""
        if self.closed:
            return
        self.closed = True
        self.outbox.discard()
        if self.playout is not None:
            self.playout.close()
        runs = [r for r in (self.active, *self.out_of_band) if r is not None]
        for run in runs:
            run.abandon()
        await self.tasks.cancel()
        await asyncio.gather(*(r.task for r in runs if r.task), return_exceptions=True)
        self.active = None
        self.out_of_band.clear()
        try:
            await self.pipe.close()
        except Exception:
            log.exception("closing the pipeline session of %s failed", self.id)
