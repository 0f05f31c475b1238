"""A realtime session: the state machine behind one client, whatever transport carries it.

A transport feeds it client messages (``handle``) or, for media transports, PCM frames at the
pipeline's input rate (``push_audio``), and sends whatever appears in ``outbox``. Client mistakes
become ``error`` events; the session always survives them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from msgspec import UNSET

from pipelines.base import FunctionCall, Message, Part, Pipeline, ResponseRequest, Tool

from . import config as sc
from ..protocol.audio import InputConverter, ms_to_samples, samples_to_ms, wire_bytes
from ..config import InterruptionGuard, Limits
from .conversation import Alignment, Conversation, from_wire, to_wire
from ..errors import RealtimeError, invalid_value
from ..ids import EventIds, new_id
from .input_buffer import InputBuffer
from ..metrics import Metrics
from .outbox import Outbox, Owner
from .playout import Cut, Playout
from ..protocol import events as ev
from ..protocol.codec import decode_client_event
from .run import EventAudio, Outcome, PacedAudio, ResponseRun, Weight
from .turns import ONSET_LOOKBACK_MS, Paused, Resumed, SpeechStarted, SpeechStopped, TurnDetector

log = logging.getLogger(__name__)

MIN_COMMIT_MS = 100


@dataclass
class _Turn:
    """The user's turn in progress (server VAD): the item it will become and what was fed."""

    item_id: str
    start: int
    fed: int
    held_until: int = 0  # interruption guard: not yet a turn until the buffer reaches this position


@dataclass(frozen=True)
class Media:
    """How a session's audio travels, fixed when it opens. The default is a WebSocket's: answer
    audio as ``response.output_audio.delta`` events."""

    playout_rate: int | None = None  # a media transport's: answer audio leaves paced, from a playout at this rate
    playout_buffer_ms: int = 200
    interruption_guard: InterruptionGuard | None = None  # telephony: see ``_guard_holds``


class Session:
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
    ) -> None:
        self.id = new_id("sess")
        self.caps = pipeline.capabilities
        self.limits = limits
        self.metrics = metrics
        self.beta = beta
        self.timing_metadata = timing_metadata
        self.config = defaults
        self.pipe = pipeline.open(self.id)
        self.outbox = Outbox(limits.outbox_events)
        self.conversation = Conversation(self.caps, max_items=limits.max_items, max_audio_seconds=limits.max_audio_seconds)
        self.buffer = InputBuffer(self.caps.input_rate, limits.max_buffer_seconds)
        self._input = InputConverter(defaults.input_format, self.caps.input_rate)
        self.detector: TurnDetector | None = None
        self._turn: _Turn | None = None
        self.active: ResponseRun | None = None  # the in-band response, if any
        self.media = media
        self.playout = Playout(media.playout_rate, self._notify, max_buffer_ms=media.playout_buffer_ms) if media.playout_rate else None
        self._agent_since = 0.0  # monotonic time the playout last started an answer
        self._video_frame: str | None = None  # the latest sampled camera frame (data URL), for the next turn
        self.out_of_band: set[ResponseRun] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._idle_timer: asyncio.Task[None] | None = None
        self._idle_from: int | None = None  # buffer position the idle period started at
        self._event_id = EventIds()
        self._context_tokens = 0
        self.closed = False
        self.ending = False
        self._reset_detector()
        self._handlers: dict[type, Callable[[Any], Awaitable[None]]] = {
            ev.InputAudioBufferAppend: self._on_append,
            ev.InputAudioBufferCommit: self._on_commit,
            ev.InputAudioBufferClear: self._on_clear,
            ev.OutputAudioBufferClear: self._on_output_clear,
            ev.SessionUpdate: self._on_session_update,
            ev.ConversationItemCreate: self._on_item_create,
            ev.ConversationItemRetrieve: self._on_item_retrieve,
            ev.ConversationItemDelete: self._on_item_delete,
            ev.ConversationItemTruncate: self._on_item_truncate,
            ev.ResponseCreate: self._on_response_create,
            ev.ResponseCancel: self._on_response_cancel,
        }

    # ================================================================== plumbing

    async def start(self) -> None:
        await self.emit(ev.SessionCreated(session=self.config.wire))
        await self.emit(ev.ConversationCreated(conversation=ev.Conversation(id=self.conversation.id)))

    async def emit(self, event: Any, owner: Owner | None = None, weight: Weight | None = None) -> bool:
        if isinstance(event, ev.ServerEvent):
            event.event_id = self._event_id()
        if isinstance(event, ev.Error):
            self.metrics.errors.labels(event.error.code or "none").inc()
        return await self.outbox.put(event, owner, weight)

    def purge(self, owner: Owner) -> list[Weight]:
        return self.outbox.purge(owner)

    async def emit_error(
        self, message: str, *, code: str | None, param: str | None = None, type: str = "invalid_request_error", event_id: str | None = None
    ) -> None:
        await self.emit(ev.Error(error=ev.ErrorDetail(type=type, code=code, message=message, param=param, event_id=event_id)))

    async def report(self, err: RealtimeError) -> None:
        """A client mistake (or a transport's trouble with its input) as an ``error`` event."""
        await self.emit_error(err.message, code=err.code, param=err.param, type=err.type, event_id=err.event_id)

    def _spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.set_name(f"{name}:{self.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _notify(self, event: Any) -> None:
        if isinstance(event, ev.OutputAudioBufferStarted):
            self._agent_since = time.monotonic()
        if not self.closed:
            self._spawn(self.emit(event), "notify")

    def _cut_playout(self) -> Cut | None:
        """Silence the media stream now (barge-in, ``output_audio_buffer.clear``)."""
        return self.playout.clear() if self.playout is not None else None

    async def _report_cut(self, cut: Cut) -> None:
        """After a cut: say so, and truncate an answer that had finished generating but was still
        playing to what was heard (an answer still generating trims itself when cancelled)."""
        await self.emit(ev.OutputAudioBufferCleared(response_id=cut.owner.id))
        message = cut.message
        if cut.owner is not self.active and isinstance(message, Message) and self.conversation.get(message.id) is message:
            part = message.parts[0]
            if part.kind == "audio" and part.audio is not None and cut.played < len(part.audio):
                self._truncate(message, 0, cut.played)
                end_ms = samples_to_ms(cut.played, self.caps.output_rate)
                await self.emit(ev.ConversationItemTruncated(item_id=message.id, content_index=0, audio_end_ms=end_ms))

    def ms(self, samples: int) -> int:
        return samples_to_ms(samples, self.caps.input_rate)

    def add_item(self, item: Message | FunctionCall, alignment: Alignment | None = None, previous_item_id: str | None = None) -> str | None:
        previous, evicted = self.conversation.add(item, previous_item_id)
        if alignment is not None:
            self.conversation.alignment[item.id] = alignment
        for item_id in evicted:
            self._spawn(self.emit(ev.ConversationItemDeleted(item_id=item_id)), "evict")
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
            await self._handlers[type(event)](event)
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

    async def _on_append(self, e: ev.InputAudioBufferAppend) -> None:
        fmt = self.config.input_format
        if "audio" not in self.caps.input_modalities:
            raise RealtimeError(f"The '{self.caps.name}' pipeline does not take audio input.", code="unsupported_value", param="audio")
        if len(e.audio) * 3 // 4 > self.limits.max_append_bytes:
            limit = self.limits.max_append_bytes / (1024 * 1024)
            raise RealtimeError(
                f"Invalid 'audio': one append may carry at most {limit:g} MiB of audio; split it into smaller appends.",
                code="string_above_max_length",
                param="audio",
            )
        await self.push_audio(self._input(wire_bytes(e.audio, fmt, "audio")))

    def camera_frame(self, data_url: str) -> None:
        """The camera's latest frame (a media transport samples it); it goes with the user's next turn."""
        self._video_frame = data_url

    async def dtmf(self, digit: str) -> None:
        """A key the caller pressed (telephony)."""
        await self.emit(ev.InputAudioBufferDtmfEventReceived(event=digit, received_at=int(time.time())))

    async def push_audio(self, pcm: np.ndarray) -> None:
        """Audio at the pipeline's input rate, from an append or a media transport."""
        if not len(pcm):
            return
        if len(pcm) > self.buffer.room():
            if self._turn is None or self.detector is None:
                raise RealtimeError(
                    f"The input audio buffer is full ({self.limits.max_buffer_seconds:g} s); commit or clear it.",
                    code="input_audio_buffer_full",
                )
            await self._end_turn_now()  # a turn longer than the buffer: end it here
        self.buffer.append(pcm)
        if self.detector is None:
            self.pipe.feed(pcm)
            return
        for event in self.detector.process(pcm):
            if isinstance(event, SpeechStarted):
                await self._speech_started(event)
            elif isinstance(event, Paused):
                self._feed_to(event.at)
                self.pipe.pause(self._speculative_request())
            elif isinstance(event, Resumed):
                self._feed_to(event.at)
                self.pipe.resume()
            elif isinstance(event, SpeechStopped):
                await self._speech_stopped(event.end)
        turn = self._turn
        if turn is not None and turn.held_until and self.detector is not None and self.detector.last_speech_end >= turn.held_until:
            turn.held_until = 0  # still speaking that long after it began: real speech, not echo
            await self._begin_turn(turn)
        if self._turn is not None:
            self._feed_to(self.buffer.end)
        else:  # keep only what a turn detected now (or an idle timeout) would need: its onset can lie
            # up to the detector's onset window back, and the turn keeps prefix padding before that
            keep_ms = self.detector.settings.prefix_padding_ms + ONSET_LOOKBACK_MS + 40
            keep = ms_to_samples(keep_ms, self.caps.input_rate)
            pos = self.buffer.end - keep
            if self._idle_from is not None:
                pos = max(min(pos, self._idle_from), self.buffer.end - self.buffer.max_samples // 2)
            self.buffer.drop_before(pos)

    def _feed_to(self, pos: int) -> None:
        turn = self._turn
        if turn is not None and pos > turn.fed:
            self.pipe.feed(self.buffer.slice(turn.fed, pos))
            turn.fed = pos

    async def _speech_started(self, e: SpeechStarted) -> None:
        self._cancel_idle_timer()
        self._turn = turn = _Turn(new_id("item"), e.start, e.start)
        if not self._guard_holds(turn, e.onset):
            await self._begin_turn(turn)

    def _guard_holds(self, turn: _Turn, onset: int) -> bool:
        """The interruption guard (config.InterruptionGuard): speech that starts while the
        agent's audio plays becomes a turn (and a barge-in) only once it has lasted
        ``min_speech_ms`` (the detector still hears speech that long after its onset), counted
        from the end of the ``grace_ms`` after the agent started."""
        guard, playout = self.media.interruption_guard, self.playout
        if guard is None or playout is None or playout.playing is None:
            return False
        rate = self.caps.input_rate
        grace_left = max(0.0, guard.grace_ms / 1000 - (time.monotonic() - self._agent_since))
        counts_from = max(onset, self.buffer.end + int(grace_left * rate))
        turn.held_until = max(1, counts_from + ms_to_samples(guard.min_speech_ms, rate))
        return True

    async def _begin_turn(self, turn: _Turn) -> None:
        vad = self.config.vad
        interrupt = vad is not None and vad.interrupt_response
        barge_in = self.active if interrupt else None
        cut = self._cut_playout() if interrupt else None
        if barge_in is not None:
            barge_in.mute()  # not one more sample of it after speech_started
        await self.emit(ev.InputAudioBufferSpeechStarted(audio_start_ms=self.ms(turn.start), item_id=turn.item_id))
        if cut is not None:
            await self._report_cut(cut)
        if barge_in is not None:
            await barge_in.cancel("turn_detected")

    async def _speech_stopped(self, end: int) -> None:
        turn = self._turn
        if turn is None:
            return
        if turn.held_until:  # too short to be the caller talking over the agent: ignore it
            self._turn = None
            self.pipe.clear()
            self.buffer.drop_before(end)
            return
        self._feed_to(end)  # the turn's last audio, before the turn closes
        self._turn = None
        await self.emit(ev.InputAudioBufferSpeechStopped(audio_end_ms=self.ms(end), item_id=turn.item_id))
        await self._commit(turn.item_id, turn.start, end)
        vad = self.config.vad
        if vad is not None and vad.create_response and self.active is None:
            await self._start_response(ev.ResponseParams(), started_at=time.perf_counter())

    def _speculative_request(self) -> ResponseRequest | None:
        """The request a response would get if the open turn ended now (its items: the conversation
        before the turn), or None when none would follow automatically."""
        vad = self.config.vad
        if vad is None or not vad.create_response or self.active is not None or self.ending:
            return None
        try:
            return self._build_request(ev.ResponseParams())[0]
        except RealtimeError:
            return None  # the response itself will report it

    async def _end_turn_now(self) -> None:
        self._reset_detector()
        await self._speech_stopped(self.buffer.end)

    async def _commit(self, item_id: str, start: int, end: int) -> None:
        pcm = self.buffer.slice(start, end)
        self.buffer.drop_before(end)
        self.pipe.commit(item_id)
        parts = [Part("audio", audio=pcm)]
        if self._video_frame is not None and self.caps.images:
            parts.append(Part("image", image_url=self._video_frame))  # what the camera showed as the turn ended
            self._video_frame = None
        item = Message(item_id, "user", parts)
        previous = self.add_item(item)
        await self.emit(ev.InputAudioBufferCommitted(previous_item_id=previous, item_id=item_id))
        wire = to_wire(item, self.caps)
        await self.emit(ev.ConversationItemAdded(previous_item_id=previous, item=wire))
        await self.emit(ev.ConversationItemDone(previous_item_id=previous, item=wire))
        self._transcribe(item)

    async def _on_commit(self, e: ev.InputAudioBufferCommit) -> None:
        tail = self._input.flush()
        if len(tail) and len(tail) <= self.buffer.room():
            self.buffer.append(tail)
            if self._turn is not None or self.detector is None:
                self.pipe.feed(tail)
        if self.buffer.duration_ms < MIN_COMMIT_MS:
            raise RealtimeError(
                f"Error committing input audio buffer: buffer too small. Expected at least {MIN_COMMIT_MS}ms of audio, "
                f"but buffer only has {self.buffer.duration_ms:.2f}ms of audio.",
                code="input_audio_buffer_commit_empty",
            )
        turn = self._turn
        if turn is not None:
            self._feed_to(self.buffer.end)
            self._reset_detector()
        await self._commit(turn.item_id if turn else new_id("item"), self.buffer.start, self.buffer.end)

    async def _on_clear(self, e: ev.InputAudioBufferClear) -> None:
        self._input.flush()
        self.buffer.clear()
        self.pipe.clear()
        self._reset_detector()
        await self.emit(ev.InputAudioBufferCleared())

    def _reset_detector(self) -> None:
        """A fresh detector (new settings, a commit/clear mid-turn); an open turn is abandoned."""
        self._turn = None
        vad = self.config.vad
        self.detector = None if vad is None else TurnDetector(vad, self.caps.input_rate, self.limits.pause_ms)

    def _transcribe(self, item: Message) -> None:
        if not self.caps.transcribes_input:
            return
        for index, part in enumerate(item.parts):
            if part.kind == "audio" and part.audio is not None and part.text is None:
                self._spawn(self._run_transcription(item, index, part), "transcribe")

    async def _run_transcription(self, item: Message, index: int, part: Part) -> None:
        assert part.audio is not None
        try:
            result = await self.pipe.transcribe(item.id, part.audio)
        except Exception as exc:
            log.exception("transcription of %s failed", item.id)
            if self.config.transcription is not None:
                error = ev.InputTranscriptionError(type="server_error", code="transcription_failed", message=str(exc) or type(exc).__name__)
                await self.emit(ev.InputTranscriptionFailed(item_id=item.id, content_index=index, error=error))
            return
        if result is None:
            return
        part.text = result.text
        if self.config.transcription is not None:
            await self.emit(ev.InputTranscriptionDelta(item_id=item.id, content_index=index, delta=result.text))
            usage = ev.TranscriptionDurationUsage(seconds=round(result.audio_seconds, 3))
            await self.emit(ev.InputTranscriptionCompleted(item_id=item.id, content_index=index, transcript=result.text, usage=usage))

    # ------------------------------------------------------------------ session

    async def _on_session_update(self, e: ev.SessionUpdate) -> None:
        old = self.config
        new = old.updated(e.session, self.caps)
        self.config = new
        if new.input_format is not old.input_format:
            self._input = InputConverter(new.input_format, self.caps.input_rate)
        if new.vad != old.vad:
            if self._turn is not None:
                self.pipe.clear()
                self.buffer.clear()
            self._reset_detector()
            self._cancel_idle_timer()
        await self.emit(ev.SessionUpdated(session=new.wire))

    # ------------------------------------------------------------------ conversation

    async def _on_item_create(self, e: ev.ConversationItemCreate) -> None:
        cfg = self.config
        item = from_wire(e.item, self.caps, cfg.input_format, cfg.output_format)
        previous = self.add_item(item, previous_item_id=e.previous_item_id)
        wire = to_wire(item, self.caps)
        await self.emit(ev.ConversationItemAdded(previous_item_id=previous, item=wire))
        await self.emit(ev.ConversationItemDone(previous_item_id=previous, item=wire))
        if isinstance(item, Message) and item.role == "user":
            self._transcribe(item)

    def _item(self, item_id: str, verb: str) -> Message | FunctionCall | Any:
        item = self.conversation.get(item_id)
        if item is None:
            raise RealtimeError(
                f"Invalid 'item_id': no item with id {item_id!r} in the conversation.", code=f"item_{verb}_invalid_item_id", param="item_id"
            )
        return item

    async def _on_item_retrieve(self, e: ev.ConversationItemRetrieve) -> None:
        item = self._item(e.item_id, "retrieve")
        formats = (self.config.input_format, self.config.output_format)
        await self.emit(ev.ConversationItemRetrieved(item=to_wire(item, self.caps, formats)))

    async def _on_item_delete(self, e: ev.ConversationItemDelete) -> None:
        self._item(e.item_id, "delete")
        self.conversation.delete(e.item_id)
        await self.emit(ev.ConversationItemDeleted(item_id=e.item_id))

    async def _on_item_truncate(self, e: ev.ConversationItemTruncate) -> None:
        item = self._item(e.item_id, "truncate")
        if not (isinstance(item, Message) and item.role == "assistant"):
            raise invalid_value("item_id", "Invalid 'item_id': only assistant messages with audio can be truncated.")
        if e.content_index >= len(item.parts) or item.parts[e.content_index].kind != "audio":
            raise invalid_value("content_index", f"Invalid 'content_index': part {e.content_index} of this item is not audio.")
        if self.active is not None and item in self.active.output and item.status == "in_progress":
            await self.active.cancel("client_cancelled")  # the client stopped playing it
        part = item.parts[e.content_index]
        if part.audio is None:
            raise invalid_value("item_id", "Invalid 'item_id': this item's audio is no longer retained.")
        rate = self.caps.output_rate
        total = len(part.audio)
        end = ms_to_samples(e.audio_end_ms, rate)
        if end > total + rate // 1000:
            raise invalid_value(
                "audio_end_ms",
                f"Invalid 'audio_end_ms': {e.audio_end_ms} ms is past the end of the item's audio ({total * 1000 // rate} ms).",
            )
        self._truncate(item, e.content_index, end)
        await self.emit(ev.ConversationItemTruncated(item_id=item.id, content_index=e.content_index, audio_end_ms=e.audio_end_ms))

    def _truncate(self, item: Message, index: int, end: int) -> None:
        """Keep the first ``end`` samples of an assistant audio part, and the words of them."""
        part = item.parts[index]
        assert part.audio is not None
        total = len(part.audio)
        alignment = self.conversation.alignment.get(item.id)
        if part.text and alignment is not None:
            part.text = alignment.cut(part.text, end, total)
        elif part.text and end < total:
            part.text = ""  # no alignment known: keep no words the user may not have heard
        part.audio = part.audio[:end]

    # ------------------------------------------------------------------ responses

    async def _on_response_create(self, e: ev.ResponseCreate) -> None:
        await self._start_response(e.response or ev.ResponseParams(), started_at=time.perf_counter())

    async def _start_response(self, params: ev.ResponseParams, started_at: float) -> ResponseRun:
        conversation = params.conversation if params.conversation is not UNSET else "auto"
        if conversation not in ("auto", "none"):
            raise invalid_value("response.conversation", "Invalid 'response.conversation': expected 'auto' or 'none'.")
        in_band = conversation == "auto"
        if in_band and self.active is not None:
            raise RealtimeError(
                f"Conversation already has an active response in progress: {self.active.id}. "
                "Wait until the response is finished before creating a new one.",
                code="conversation_already_has_active_response",
            )
        if not in_band and len(self.out_of_band) >= self.limits.max_out_of_band:
            raise RealtimeError(
                f"At most {self.limits.max_out_of_band} out-of-band responses may run at once.", code="too_many_active_responses"
            )
        run = self._build_run(params, in_band, started_at)
        self._cancel_idle_timer()
        if in_band:
            self.active = run
        else:
            self.out_of_band.add(run)
        run.task = asyncio.create_task(self._respond(run), name=f"response:{run.id}")
        return run

    async def _respond(self, run: ResponseRun) -> None:
        self._finished(run, await run.run())

    def _build_run(self, params: ev.ResponseParams, in_band: bool, started_at: float) -> ResponseRun:
        request, voice, fmt, max_tokens = self._build_request(params)
        wire_format = sc.wire_format(fmt)
        audio_out = PacedAudio(self.playout, self.caps.output_rate) if self.playout else EventAudio(self, self.caps.output_rate, wire_format)
        return ResponseRun(
            self,
            request,
            self.pipe.respond(request),
            audio_out,
            in_band=in_band,
            output_format=wire_format,
            voice=voice,
            max_output_tokens=max_tokens,
            metadata=params.metadata if params.metadata is not UNSET else None,
            started_at=started_at,
        )

    def _build_request(self, params: ev.ResponseParams) -> tuple[ResponseRequest, ev.Voice, Any, int | Literal["inf"]]:
        """The pipeline request for ``params`` over this session's settings, and the wire settings
        (voice, audio format, max tokens) the response reports."""
        cfg, caps, wire = self.config, self.caps, self.config.wire
        out = sc.fold_output(params, sc.OutputChoice.of(wire), caps, "response")
        items = self._response_input(params) if params.input is not UNSET else list(self.conversation)
        voice_name = out.voice.id if isinstance(out.voice, ev.VoiceId) else out.voice
        choice = out.tool_choice
        request = ResponseRequest(
            response_id=new_id("resp"),
            items=items,
            instructions=params.instructions if params.instructions is not UNSET else wire.instructions,
            output_modalities=tuple(out.modalities),
            voice=voice_name if voice_name in caps.voices else caps.voices[0],
            speed=wire.audio.output.speed,
            max_output_tokens=None if out.max_output_tokens == "inf" else out.max_output_tokens,
            temperature=params.temperature if params.temperature is not UNSET else cfg.temperature,
            tools=[Tool(t.name, t.description or "", t.parameters or {}) for t in out.tools],
            tool_choice=choice.name if isinstance(choice, ev.ToolChoiceFunction) else choice,  # type: ignore[arg-type]
        )
        return request, out.voice, out.format, out.max_output_tokens

    def _response_input(self, params: ev.ResponseParams) -> list[Any]:
        items: list[Any] = []
        for i, entry in enumerate(params.input):  # type: ignore[arg-type]
            if isinstance(entry, ev.ItemReference):
                item = self.conversation.get(entry.id)
                if item is None:
                    raise invalid_value(f"response.input[{i}].id", f"Invalid 'response.input[{i}].id': no item with id {entry.id!r}.")
                items.append(item)
            else:
                items.append(from_wire(entry, self.caps, self.config.input_format, self.config.output_format, f"response.input[{i}]"))
        return items

    async def _on_response_cancel(self, e: ev.ResponseCancel) -> None:
        runs = ([self.active] if self.active else []) + list(self.out_of_band)
        if e.response_id is not None:
            runs = [r for r in runs if r.id == e.response_id]
        if not runs:
            which = f" with id {e.response_id!r}" if e.response_id else ""
            raise RealtimeError(f"Cancellation failed: no active response{which} found.", code="response_cancel_not_active")
        await runs[0].cancel("client_cancelled")

    async def _on_output_clear(self, e: ev.OutputAudioBufferClear) -> None:
        run = self.active
        cut = self._cut_playout()
        if run is not None:
            run.mute()
        if cut is not None:
            await self._report_cut(cut)
        if run is not None:
            await run.cancel("client_cancelled")
            if cut is None:
                await self.emit(ev.OutputAudioBufferCleared(response_id=run.id))

    def _finished(self, run: ResponseRun, outcome: Outcome) -> None:
        """A run has said ``response.done``."""
        metrics = self.metrics
        metrics.responses.labels(outcome.status).inc()
        metrics.response_duration.observe(outcome.done_at - outcome.started_at)
        if outcome.first_audio_at:
            metrics.first_audio.observe(outcome.first_audio_at - outcome.started_at)
        if outcome.cancel_requested_at:
            metrics.cancel_latency.observe(outcome.done_at - outcome.cancel_requested_at)
        metrics.response_timings(
            {
                "response_id": run.id,
                "session_id": self.id,
                "status": outcome.status,
                "first_audio_ms": outcome.first_audio_ms,
                "stages": outcome.stage_times,
                **outcome.stage_info,
            }
        )
        if outcome.in_band:
            self._context_tokens = outcome.usage.input_tokens + outcome.usage.output_tokens
        if self.active is run:
            self.active = None
            self._arm_idle_timer(outcome)
        self.out_of_band.discard(run)

    # ------------------------------------------------------------------ idle timeout

    def _arm_idle_timer(self, outcome: Outcome) -> None:
        vad = self.config.vad
        if vad is None or not vad.idle_timeout_ms or self.closed or self.ending:
            return
        playback_end = max(outcome.done_at, (outcome.first_audio_at or outcome.done_at) + outcome.audio_seconds)
        delay = playback_end - time.perf_counter() + vad.idle_timeout_ms / 1000.0
        self._idle_from = self.buffer.end
        self._idle_timer = self._spawn(self._idle_timeout(delay), "idle")

    def _cancel_idle_timer(self) -> None:
        self._idle_from = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    async def _idle_timeout(self, delay: float) -> None:
        await asyncio.sleep(max(0.0, delay))
        idle_from, self._idle_timer, self._idle_from = self._idle_from, None, None
        if self._turn is not None or self.active is not None or self.closed:
            return
        item_id = new_id("item")
        start, end = max(self.buffer.start, idle_from or 0), self.buffer.end
        await self.emit(ev.InputAudioBufferTimeoutTriggered(audio_start_ms=self.ms(start), audio_end_ms=self.ms(end), item_id=item_id))
        await self._commit(item_id, start, end)
        try:
            await self._start_response(ev.ResponseParams(), started_at=time.perf_counter())
        except RealtimeError as err:  # e.g. the session's tool_choice no longer fits its tools
            await self.report(err)

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
        self.outbox.close()
        if self.playout is not None:
            self.playout.close()
        runs = [r for r in (self.active, *self.out_of_band) if r is not None]
        for run in runs:
            run.abandon()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*(r.task for r in runs if r.task), *self._tasks, return_exceptions=True)
        self.active = None
        self.out_of_band.clear()
        try:
            await self.pipe.close()
        except Exception:
            log.exception("closing the pipeline session of %s failed", self.id)
