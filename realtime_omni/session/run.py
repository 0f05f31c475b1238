"""One response: drives a pipeline's chunk stream and turns it into the Realtime event envelope.

    response.created, rate_limits.updated
    response.output_item.added, conversation.item.added, response.content_part.added
    response.output_audio_transcript.delta / response.output_audio.delta ... (or output_text.delta)
    response.output_audio.done, response.output_audio_transcript.done, response.content_part.done
    response.output_item.done, conversation.item.done
    response.done

Cancellation (barge-in, ``response.cancel``, ``output_audio_buffer.clear``) cancels the run's task,
which closes the pipeline stream (aborting its engine work), drops this response's deltas still
queued for sending, trims the assistant item to the audio the client actually got (and its
transcript to match), and ends with ``response.done`` status ``cancelled``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from pipelines.base import AudioChunk, FunctionCall, Message, Part, ResponseRequest, StageTimes, TextDelta, ToolCall, Usage

from ..protocol.audio import OutputConverter, WireFormat
from .conversation import Alignment, to_wire
from ..ids import new_id
from ..media.resample import PolyphaseResampler
from .playout import Cut
from ..protocol import events as ev
from .config import format_struct

if TYPE_CHECKING:
    from .session import Session

log = logging.getLogger(__name__)

# "shutdown": the server is going away; reported as cancelled with no client-side reason.
CancelReason = Literal["turn_detected", "client_cancelled", "shutdown"]


class ResponseRun:
    def __init__(
        self,
        session: "Session",
        request: ResponseRequest,
        *,
        in_band: bool,
        output_format: WireFormat,
        voice: ev.Voice,
        max_output_tokens: int | Literal["inf"],
        metadata: dict[str, str] | None,
        started_at: float,
    ) -> None:
        self.session = session
        self.request = request
        self.id = request.response_id
        self.in_band = in_band
        self.audio = "audio" in request.output_modalities
        self.output_format = output_format
        self.voice = voice
        self.max_output_tokens = max_output_tokens
        self.metadata = metadata
        self.started_at = started_at  # when the user's turn ended / response.create arrived
        self.output: list[Message | FunctionCall] = []
        self.usage = Usage()
        self.status: str = "in_progress"
        self.cancel_reason: CancelReason | None = None
        self.cancel_requested_at = 0.0
        self.first_audio_at = 0.0
        self.done_at = 0.0
        self.audio_seconds_sent = 0.0
        self.stage_times: dict[str, float] = {}  # the pipeline's own per-stage timings (StageTimes)
        self.stage_info: dict[str, Any] = {}
        self.task: asyncio.Task[None] | None = None
        self._started = False
        self._finishing = False
        self.muted = False
        # the open assistant message
        self._message: Message | None = None
        self._index = 0
        self._text: list[str] = []
        self._text_len = 0
        self._audio: list[np.ndarray] = []
        self._produced = 0  # samples produced (pipeline output rate)
        self._alignment = Alignment(session.caps.output_rate)
        self._converter: OutputConverter | None = None
        self._resampler: PolyphaseResampler | None = None  # to the playout's rate (media transports)
        # deltas queued in the outbox, oldest first: (message, samples, text chars) each carries
        self._inflight: deque[tuple[Message | None, int, int]] = deque()
        self._delivered_samples = 0
        self._delivered_chars = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"response:{self.id}")

    @property
    def first_audio_ms(self) -> float | None:
        """From the response trigger to its first audio delta."""
        return round((self.first_audio_at - self.started_at) * 1000, 1) if self.first_audio_at else None

    @property
    def done(self) -> bool:
        return self.task is None or self.task.done()

    def mute(self) -> Cut | None:
        """Stop output at once, synchronously: queued deltas (and, on a media transport, queued
        audio) are dropped and no new ones queued. Called before announcing what interrupted the
        response (``speech_started``), so nothing of this response reaches the client after that
        announcement. Returns what was cut if its audio was playing."""
        if self._finishing or self.muted:
            return None
        self.muted = True
        self.session.outbox.purge(self)
        self._inflight.clear()
        playout = self.session.playout
        return playout.drop(self) if playout is not None else None

    async def cancel(self, reason: CancelReason) -> None:
        task = self.task
        if task is None or task.done():
            return
        cut = self.mute()
        if cut is not None:
            await self.session.emit(ev.OutputAudioBufferCleared(response_id=self.id))
        if not self._finishing:
            self.cancel_reason = reason
            self.cancel_requested_at = time.perf_counter()
            # A task cancelled before its first step never runs a line of ``_run`` (so nothing
            # would ever say response.done): one not yet started sees ``cancel_reason`` instead.
            if self._started:
                task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def abandon(self) -> None:
        """The session is closing: stop without telling anyone (the outbox is closed)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()

    # ------------------------------------------------------------------ outbox accounting

    def taken(self, event: Any) -> None:
        message, samples, chars = self._inflight.popleft()
        if message is self._message:
            self._delivered_samples += samples
            self._delivered_chars += chars

    def played(self, message: Any, samples: int) -> None:
        """A media transport sent ``samples`` (pipeline output rate) of ``message``'s audio."""
        if message is self._message:
            self._delivered_samples += samples

    async def _delta(self, event: Any, samples: int = 0, chars: int = 0) -> None:
        if self.muted:
            return
        self._inflight.append((self._message, samples, chars))
        await self.session.emit(event, owner=self)

    # ------------------------------------------------------------------ the run

    async def _run(self) -> None:
        self._started = True
        session = self.session
        error: BaseException | None = None
        try:
            # shielded: cancelled while the outbox is full, it still goes out before response.done
            await asyncio.shield(session.emit(ev.ResponseCreated(response=self._wire())))
            await session.emit(session.rate_limits())
            if self.cancel_reason is not None:  # cancelled before it started
                raise asyncio.CancelledError
            async with contextlib.aclosing(session.pipe.respond(self.request)) as stream:
                async for chunk in stream:
                    if isinstance(chunk, AudioChunk):
                        await self._on_audio(chunk.pcm)
                    elif isinstance(chunk, TextDelta):
                        await self._on_text(chunk.text)
                    elif isinstance(chunk, ToolCall):
                        await self._on_tool_call(chunk)
                    elif isinstance(chunk, Usage):
                        self.usage = chunk
                    elif isinstance(chunk, StageTimes):
                        self.stage_times, self.stage_info = chunk.stages, chunk.info
            self._finishing = True
            self.status = "completed"
            if self.usage.hit_max_tokens:
                self.status = "incomplete"
            await self._flush_audio()
            if session.playout is not None:
                session.playout.end(self)
        except asyncio.CancelledError:
            if self.cancel_reason is None:
                raise  # the session is closing
            self.status = "cancelled"
            self._trim_to_delivered()
        except Exception as exc:  # a pipeline failure fails this response, never the session
            log.exception("response %s failed", self.id)
            error = exc
            self.status = "failed"
            self.mute()
            self._trim_to_delivered()
        self._finishing = True
        await self._close_message()
        if error is not None:
            await session.emit_error("The pipeline failed while generating this response.", code="pipeline_error", type="server_error")
        self.done_at = time.perf_counter()
        await session.emit(ev.ResponseDone(response=self._wire(error)))
        session.response_finished(self)

    # ------------------------------------------------------------------ chunks

    async def _open_message(self) -> Message:
        if self._message is not None:
            return self._message
        session = self.session
        part = Part("audio" if self.audio else "text", text="")
        msg = self._message = Message(new_id("item"), "assistant", [part], status="in_progress")
        self._index = len(self.output)
        self.output.append(msg)
        self._text, self._text_len, self._audio, self._produced = [], 0, [], 0
        self._delivered_samples = self._delivered_chars = 0
        self._alignment = Alignment(session.caps.output_rate)
        await session.emit(ev.ResponseOutputItemAdded(response_id=self.id, output_index=self._index, item=self._item_wire(msg)))
        if self.in_band:
            previous = session.add_item(msg)
            await session.emit(ev.ConversationItemAdded(previous_item_id=previous, item=self._item_wire(msg)))
            session.conversation.alignment[msg.id] = self._alignment
        wire_part = ev.ContentPart(type="audio", transcript="") if self.audio else ev.ContentPart(type="text", text="")
        await session.emit(
            ev.ResponseContentPartAdded(response_id=self.id, item_id=msg.id, output_index=self._index, content_index=0, part=wire_part)
        )
        return msg

    async def _on_text(self, text: str) -> None:
        if not text:
            return
        msg = await self._open_message()
        if self.audio:
            self._alignment.mark(self._produced, self._text_len)
        self._text.append(text)
        self._text_len += len(text)
        cls = ev.ResponseOutputAudioTranscriptDelta if self.audio else ev.ResponseOutputTextDelta
        await self._delta(cls(response_id=self.id, item_id=msg.id, output_index=self._index, content_index=0, delta=text), chars=len(text))

    async def _on_audio(self, pcm: np.ndarray) -> None:
        if not self.audio or not len(pcm):
            return
        msg = await self._open_message()
        self._audio.append(pcm)
        self._produced += len(pcm)
        playout = self.session.playout
        if playout is not None:
            self._mark_first_audio()
            if self._resampler is None:
                # paced media: convert each chunk as it comes (soxr streams in 40-80 ms blocks)
                self._resampler = PolyphaseResampler(self.session.caps.output_rate, playout.rate)
            await playout.write(self, msg, self._resampler(pcm), len(pcm))
            return
        if self._converter is None:
            self._converter = OutputConverter(self.session.caps.output_rate, self.output_format)
        await self._send_audio(msg, self._converter(pcm), len(pcm))

    def _mark_first_audio(self) -> None:
        if not self.first_audio_at:
            self.first_audio_at = time.perf_counter()
            self.session.metrics.first_audio.observe(self.first_audio_at - self.started_at)

    async def _send_audio(self, msg: Message, data: bytes, samples: int) -> None:
        if not data and not samples:
            return
        self._mark_first_audio()
        delta = ev.ResponseOutputAudioDelta(
            response_id=self.id, item_id=msg.id, output_index=self._index, content_index=0, delta=base64.b64encode(data).decode()
        )
        await self._delta(delta, samples=samples)

    async def _flush_audio(self) -> None:
        playout = self.session.playout
        if self._resampler is not None and self._message is not None and playout is not None:
            await playout.write(self, self._message, self._resampler.flush(), 0)
            self._resampler = None
        if self._converter is not None and self._message is not None:
            tail = self._converter.flush()
            if tail:
                await self._send_audio(self._message, tail, 0)
            self._converter = None

    async def _on_tool_call(self, call: ToolCall) -> None:
        await self._close_message()
        session = self.session
        item = FunctionCall(new_id("item"), call.call_id or new_id("call"), call.name, "", status="in_progress")
        index = len(self.output)
        self.output.append(item)
        await session.emit(ev.ResponseOutputItemAdded(response_id=self.id, output_index=index, item=self._item_wire(item)))
        if self.in_band:
            previous = session.add_item(item)
            await session.emit(ev.ConversationItemAdded(previous_item_id=previous, item=self._item_wire(item)))
        ids = dict(response_id=self.id, item_id=item.id, output_index=index, call_id=item.call_id)
        await session.emit(ev.ResponseFunctionCallArgumentsDelta(**ids, delta=call.arguments))
        item.arguments, item.status = call.arguments, "completed"
        await session.emit(ev.ResponseFunctionCallArgumentsDone(**ids, name=call.name, arguments=call.arguments))
        await self._item_done(item, index)

    # ------------------------------------------------------------------ endings

    def _trim_to_delivered(self) -> None:
        """Keep only what the client got: audio delivered, and the transcript of that audio."""
        if self._message is None:
            return
        text = "".join(self._text)
        if self.audio:
            text = self._alignment.cut(text, self._delivered_samples, self._produced, final=False)
            self._alignment.trim(self._delivered_samples, len(text))
            pcm = np.concatenate(self._audio) if self._audio else np.zeros(0, np.int16)
            self._audio = [pcm[: self._delivered_samples]]
            self._produced = min(self._produced, self._delivered_samples)
        else:
            text = text[: self._delivered_chars]
        self._text, self._text_len = [text], len(text)

    async def _close_message(self) -> None:
        msg = self._message
        if msg is None:
            return
        self._message = None
        session = self.session
        text = "".join(self._text)
        part = msg.parts[0]
        part.text = text
        ids = dict(response_id=self.id, item_id=msg.id, output_index=self._index, content_index=0)
        if self.audio:
            part.audio = np.concatenate(self._audio) if self._audio else np.zeros(0, np.int16)
            self.audio_seconds_sent += len(part.audio) / session.caps.output_rate
            await session.emit(ev.ResponseOutputAudioDone(**ids))
            await session.emit(ev.ResponseOutputAudioTranscriptDone(**ids, transcript=text))
            wire_part = ev.ContentPart(type="audio", transcript=text)
        else:
            await session.emit(ev.ResponseOutputTextDone(**ids, text=text))
            wire_part = ev.ContentPart(type="text", text=text)
        await session.emit(ev.ResponseContentPartDone(**ids, part=wire_part))
        msg.status = "completed" if self.status in ("completed", "in_progress") else "incomplete"
        if self.in_band:
            session.conversation.trim_audio()
        await self._item_done(msg, self._index)

    async def _item_done(self, item: Message | FunctionCall, index: int) -> None:
        session = self.session
        wire = self._item_wire(item)
        await session.emit(ev.ResponseOutputItemDone(response_id=self.id, output_index=index, item=wire))
        if self.in_band and session.conversation.get(item.id) is item:
            await session.emit(ev.ConversationItemDone(previous_item_id=session.conversation.previous_id(item), item=wire))

    # ------------------------------------------------------------------ wire forms

    def _item_wire(self, item: Message | FunctionCall) -> ev.Item:
        return to_wire(item, self.session.caps)

    def _wire(self, error: BaseException | None = None) -> ev.Response:
        details = None
        if self.status == "cancelled":
            reason = None if self.cancel_reason == "shutdown" else self.cancel_reason
            details = ev.ResponseStatusDetails(type="cancelled", reason=reason)
        elif self.status == "incomplete":
            details = ev.ResponseStatusDetails(type="incomplete", reason="max_output_tokens")
        elif self.status == "failed":
            details = ev.ResponseStatusDetails(
                type="failed", error=ev.ResponseStatusError(type="server_error", code="pipeline_error", message=str(error) or type(error).__name__)
            )
        usage = None
        if self.status != "in_progress":
            u = self.usage
            usage = ev.Usage(
                total_tokens=u.input_tokens + u.output_tokens,
                input_tokens=u.input_tokens,
                output_tokens=u.output_tokens,
                input_token_details=ev.InputTokenDetails(
                    cached_tokens=u.cached_tokens,
                    text_tokens=u.input_tokens - u.input_audio_tokens,
                    audio_tokens=u.input_audio_tokens,
                    cached_tokens_details=ev.CachedTokensDetails(text_tokens=u.cached_tokens),
                ),
                output_token_details=ev.OutputTokenDetails(
                    text_tokens=u.output_tokens - u.output_audio_tokens, audio_tokens=u.output_audio_tokens
                ),
            )
        audio = None
        if self.audio:
            audio = ev.ResponseAudio(output=ev.ResponseAudioOutput(format=format_struct(self.output_format), voice=self.voice))
        return ev.Response(
            id=self.id,
            status=self.status,  # type: ignore[arg-type]
            status_details=details,
            output=[self._item_wire(i) for i in self.output],
            conversation_id=self.session.conversation.id if self.in_band else None,
            output_modalities=["audio"] if self.audio else ["text"],
            max_output_tokens=self.max_output_tokens,
            audio=audio,
            usage=usage,
            metadata=self._metadata(),
        )

    def _metadata(self) -> dict[str, str] | None:
        """The client's metadata, plus (when the server reports timings) the pipeline's stage
        timings of a finished response as ``timing.<stage>_ms``, in ms from the response trigger
        (the end of the user's turn, or response.create). Client keys win."""
        if self.status == "in_progress" or not self.session.timing_metadata:
            return self.metadata
        timings: dict[str, str] = {}
        if self.first_audio_ms is not None:
            timings["timing.first_audio_delta_ms"] = f"{self.first_audio_ms:.1f}"
        for stage, ms in self.stage_times.items():
            timings[f"timing.{stage}_ms"] = f"{ms:.1f}"
        if not timings:
            return self.metadata
        return {**timings, **(self.metadata or {})}

