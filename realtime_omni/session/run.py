"""One response: drives a pipeline's chunk stream and turns it into the Realtime event envelope.

    response.created, rate_limits.updated
    response.output_item.added, conversation.item.added, response.content_part.added
    response.output_audio_transcript.delta / response.output_audio.delta ... (or output_text.delta)
    response.output_audio.done, response.output_audio_transcript.done, response.content_part.done
    response.output_item.done, conversation.item.done
    response.done

Its items (their added/done events, and the function calls it writes) are ``OutputItems``'s
(output_items.py). A run sees its session only through a narrow ``Port`` (send events, add items, drop its own queued
deltas) and hands its audio to an ``AudioOut`` of one of two kinds, chosen when the session
opened (audio_out.py: ``EventAudio`` for WebSocket, ``PacedAudio`` for a media transport's
playout). ``run()`` returns an ``Outcome`` (status, usage, timings); it calls nothing back.

What the client got is known without asking anyone: every delta and every piece of paced audio
carries its weight (samples, characters) when queued; a cut drops what is still queued and says
how much that was; delivered = queued - dropped (draft.py keeps the tally).

A run's lifecycle is a ``RunState``: created (its task has not started), streaming (taking the
pipeline's chunks), finishing (no more output: closing the open message, saying response.done),
done. Muting (``mute``) is apart from it: a latch, set at most once, that any state before
finishing can take, and that the outbox and the playout read to refuse the run's output.

Cancellation (barge-in, ``response.cancel``, ``output_audio_buffer.clear``) cancels the run's task,
which closes the pipeline stream (aborting its engine work), drops this response's deltas still
queued for sending, trims the assistant item to the audio the client actually got (and its
transcript to match), and ends with ``response.done`` status ``cancelled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from pipelines.base import (
    AudioChunk,
    Message,
    OutputChunk,
    Part,
    StageTimes,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)

from ..ids import new_id
from ..protocol import events as ev
from ..protocol.audio import WireFormat
from ..states import move
from ..tracing import NO_RESPONSE, ResponseTrace
from .config import format_struct
from .draft import MessageDraft, Weight
from .mcp import approved_calls
from .output_items import OutputItems
from .playout import Cut
from .port import Port

log = logging.getLogger(__name__)

# "shutdown": the server is going away; reported as cancelled with no client-side reason.
CancelReason = Literal["turn_detected", "client_cancelled", "shutdown"]


MAX_MCP_ROUNDS = 4  # a response asks its pipeline at most this many times (again after each round's MCP calls)


async def _close(chunks: AsyncIterator[OutputChunk]) -> None:
    aclose = getattr(chunks, "aclose", None)
    if aclose is not None:
        await aclose()


class StageTimeout(Exception):
    """A pipeline stage gave no output within ``Limits.stage_timeout_s``."""


class RunState(enum.Enum):
    CREATED = "created"
    STREAMING = "streaming"
    FINISHING = "finishing"
    DONE = "done"


RUN_MOVES: dict[RunState, frozenset[RunState]] = {
    RunState.CREATED: frozenset({RunState.STREAMING}),
    RunState.STREAMING: frozenset({RunState.FINISHING}),
    RunState.FINISHING: frozenset({RunState.DONE}),
    RunState.DONE: frozenset(),
}


class AudioOut(Protocol):
    """Where a response's audio goes (audio_out.py has the two kinds)."""

    async def write(self, run: ResponseRun, message: Message, index: int, pcm: np.ndarray) -> bool:
        """Queue ``pcm`` (pipeline output rate) of ``message``, waiting while the way out is full.
        True when something was queued."""

    async def finish(self, run: ResponseRun, message: Message | None, index: int) -> None:
        """No more audio from ``run``: send what is held back (a resampler's tail)."""

    def drop(self, run: ResponseRun) -> tuple[Cut | None, list[Weight]]:
        """Drop ``run``'s audio still queued here: what was cut if it was playing, and the weights
        of what was dropped."""


@dataclass
class Outcome:
    """How a response ended, for the session's bookkeeping."""

    status: str
    usage: Usage
    in_band: bool
    started_at: float
    done_at: float
    first_audio_at: float = 0.0
    first_delta_at: float = 0.0  # the first text or audio delta queued for the client
    cancel_requested_at: float = 0.0
    audio_seconds: float = 0.0  # of answer audio kept in the output
    stage_times: dict[str, float] = field(default_factory=dict)
    stage_info: dict[str, Any] = field(default_factory=dict)

    @property
    def first_audio_ms(self) -> float | None:
        return round((self.first_audio_at - self.started_at) * 1000, 1) if self.first_audio_at else None


class ResponseRun:
    def __init__(
        self,
        port: Port,
        request: Any,
        chunks: AsyncIterator[OutputChunk],
        audio_out: AudioOut,
        *,
        in_band: bool,
        output_format: WireFormat,
        voice: ev.Voice,
        max_output_tokens: int | Literal["inf"],
        metadata: dict[str, str] | None,
        started_at: float,
        stage_timeout_s: float = 30.0,
        trace: ResponseTrace = NO_RESPONSE,
    ) -> None:
        self.port = port
        self.trace = trace  # its span (tracing.py): ended by the session when the run has finished
        self.request = request
        self.id = request.response_id
        self.in_band = in_band
        self.audio = "audio" in request.output_modalities
        self.output_format = output_format
        self.voice = voice
        self.max_output_tokens = max_output_tokens
        self.metadata = metadata
        self.items = OutputItems(port, self.id, in_band=in_band, trace=trace)
        self.output = self.items.items
        self.status: str = "in_progress"  # the wire status response.done reports
        self.state = RunState.CREATED
        self.cancel_reason: CancelReason | None = None
        self.task: asyncio.Task[Any] | None = None
        self.muted = False
        self.outcome = Outcome("in_progress", Usage(), in_band, started_at, 0.0)
        self._chunks = chunks
        self._stage_timeout_s = stage_timeout_s
        self._audio_out = audio_out
        self._rate = port.caps.output_rate
        self._announced = False  # response.created is queued
        self._draft: MessageDraft | None = None  # the assistant message open now

    def _move(self, to: RunState) -> None:
        self.state = move(self.state, to, RUN_MOVES, f"response {self.id}")

    @property
    def _output_open(self) -> bool:
        """Still producing output (not finishing): a cut or a cancellation still changes it."""
        return self.state in (RunState.CREATED, RunState.STREAMING)

    # ------------------------------------------------------------------ control (from the session)

    @property
    def done(self) -> bool:
        return self.task is None or self.task.done()

    def mute(self) -> Cut | None:
        """Stop output at once, synchronously: queued deltas (and, on a media transport, queued
        audio) are dropped and no new ones queued. Called before announcing what interrupted the
        response (``speech_started``), so nothing of this response reaches the client after that
        announcement. Returns what was cut if its audio was playing."""
        if not self._output_open or self.muted:
            return None
        self.muted = True
        cut, dropped = self._audio_out.drop(self)
        draft = self._draft
        for weight in [*self.port.purge(self), *dropped]:
            if draft is not None and weight.message is draft.message:
                draft.dropped = draft.dropped.plus(weight)
        return cut

    async def cancel(self, reason: CancelReason) -> None:
        task = self.task
        if task is None or task.done():
            return
        cut = self.mute()
        if cut is not None:
            await self.port.emit(ev.OutputAudioBufferCleared(response_id=self.id))
        if self._output_open:
            self.cancel_reason = reason
            self.outcome.cancel_requested_at = time.perf_counter()
            self.trace.cancelled(reason)
            # A task cancelled before its first step never runs a line of ``run`` (so nothing
            # would ever say response.done): one not yet started sees ``cancel_reason`` instead.
            if self.state is RunState.STREAMING:
                task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def abandon(self) -> None:
        """The session is closing: stop without telling anyone (the outbox is closed)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            self.trace.abandoned()

    # ------------------------------------------------------------------ the run

    async def run(self) -> Outcome:
        self._move(RunState.STREAMING)
        port = self.port
        error: BaseException | None = None
        try:
            self._announced = await port.emit(ev.ResponseCreated(response=self._wire()))
            await port.emit(port.rate_limits())
            if self.cancel_reason is not None:  # cancelled before it started
                raise asyncio.CancelledError
            await self._stream()
            self._move(RunState.FINISHING)
            self.status = "incomplete" if self.outcome.usage.hit_max_tokens else "completed"
            if self.audio:
                draft = self._draft
                await self._audio_out.finish(self, draft.message if draft else None, draft.index if draft else 0)
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
        if self.state is RunState.STREAMING:  # cut off: finishing now
            self._move(RunState.FINISHING)
        if not self._announced:  # cancelled while the outbox was full: say it began before it ended
            await port.emit(ev.ResponseCreated(response=self._wire()))
        await self._close_message()
        await self.items.close_call()
        if error is not None:
            await port.emit(
                ev.Error(
                    error=ev.ErrorDetail(
                        type="server_error", code="pipeline_error", message="The pipeline failed while generating this response.", param=None, event_id=None
                    )
                )
            )
        self.outcome.status = self.status
        self.outcome.done_at = time.perf_counter()
        await port.emit(ev.ResponseDone(response=self._wire(error)))
        self._move(RunState.DONE)
        return self.outcome

    async def _stream(self) -> None:
        """The pipeline's answer; after each round that ran MCP calls, the pipeline is asked again
        with their outputs in its history, so the answer goes on from them in this response."""
        port, items = self.port, self.items
        chunks = self._chunks
        if self.in_band:
            approved = approved_calls(port.conversation)
            for request in approved:  # the client approved them since the last response
                await items.approved(request, self._close_message)
            if approved:
                await _close(chunks)  # asked before those outputs were in the history
                chunks = port.respond(port.again(self.request, self.output, self.in_band))
        for round_ in range(MAX_MCP_ROUNDS):
            if round_:
                await self._close_message()
                chunks = port.respond(port.again(self.request, self.output, self.in_band))
            ran = items.mcp_calls_run
            await self._take(chunks)
            if items.mcp_calls_run == ran or self.muted:
                return

    async def _take(self, chunks: AsyncIterator[OutputChunk]) -> None:
        async with contextlib.aclosing(chunks) as stream:  # type: ignore[type-var]
            while True:
                try:  # every wait on the pipeline is bounded: a hung stage fails the response
                    async with asyncio.timeout(self._stage_timeout_s):
                        chunk = await anext(stream)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    raise StageTimeout(f"The pipeline produced nothing for {self._stage_timeout_s:g} s.") from None
                if isinstance(chunk, AudioChunk):
                    await self._on_audio(chunk.pcm)
                elif isinstance(chunk, TextDelta):
                    await self._on_text(chunk.text)
                elif isinstance(chunk, ToolCallDelta):
                    if self.muted:
                        pass
                    elif self.items.is_mcp(chunk.name, chunk.call_id):
                        await self.items.mcp_delta(chunk, self._close_message)
                    else:
                        await self.items.call_delta(chunk, self._close_message)
                elif isinstance(chunk, ToolCall):
                    if self.muted:
                        pass
                    elif self.items.is_mcp(chunk.name):
                        await self.items.mcp_call(chunk, self._close_message)
                    else:
                        await self.items.call(chunk, self._close_message)
                elif isinstance(chunk, Usage):
                    self.outcome.usage = chunk
                elif isinstance(chunk, StageTimes):
                    self.outcome.stage_times, self.outcome.stage_info = chunk.stages, chunk.info

    # ------------------------------------------------------------------ chunks

    async def _open_message(self) -> MessageDraft:
        if self._draft is not None:
            return self._draft
        port = self.port
        part = Part("audio" if self.audio else "text", text="")
        msg = Message(new_id("item"), "assistant", [part], status="in_progress")
        draft = self._draft = MessageDraft(msg, len(self.output), self._rate, audio=self.audio)
        await self.items.open(msg, draft.alignment)
        wire_part = ev.ContentPart(type="audio", transcript="") if self.audio else ev.ContentPart(type="text", text="")
        await port.emit(
            ev.ResponseContentPartAdded(response_id=self.id, item_id=msg.id, output_index=draft.index, content_index=0, part=wire_part)
        )
        return draft

    async def _on_text(self, text: str) -> None:
        if not text:
            return
        draft = await self._open_message()
        draft.add_text(text)
        cls = ev.ResponseOutputAudioTranscriptDelta if self.audio else ev.ResponseOutputTextDelta
        if not self.muted:
            msg = draft.message
            delta = cls(response_id=self.id, item_id=msg.id, output_index=draft.index, content_index=0, delta=text)
            weight = Weight(msg, chars=len(text))
            if await self.port.emit(delta, self, weight):
                draft.sent = draft.sent.plus(weight)
                self.outcome.first_delta_at = self.outcome.first_delta_at or time.perf_counter()

    async def _on_audio(self, pcm: np.ndarray) -> None:
        if not self.audio or not len(pcm):
            return
        draft = await self._open_message()
        draft.add_audio(pcm)
        if not self.muted and await self._audio_out.write(self, draft.message, draft.index, pcm):
            draft.sent = draft.sent.plus(Weight(draft.message, samples=len(pcm)))
            if not self.outcome.first_audio_at:
                self.outcome.first_audio_at = time.perf_counter()
                self.outcome.first_delta_at = self.outcome.first_delta_at or self.outcome.first_audio_at

    # ------------------------------------------------------------------ endings

    def _trim_to_delivered(self) -> None:
        if self._draft is not None:
            self._draft.trim_to_delivered()

    async def _close_message(self) -> None:
        draft, self._draft = self._draft, None
        if draft is None:
            return
        port = self.port
        msg, text = draft.message, draft.text
        part = msg.parts[0]
        part.text = text
        ids = dict(response_id=self.id, item_id=msg.id, output_index=draft.index, content_index=0)
        if self.audio:
            part.audio = draft.pcm()
            self.outcome.audio_seconds += len(part.audio) / self._rate
            await port.emit(ev.ResponseOutputAudioDone(**ids))
            await port.emit(ev.ResponseOutputAudioTranscriptDone(**ids, transcript=text))
            wire_part = ev.ContentPart(type="audio", transcript=text)
        else:
            await port.emit(ev.ResponseOutputTextDone(**ids, text=text))
            wire_part = ev.ContentPart(type="text", text=text)
        await port.emit(ev.ResponseContentPartDone(**ids, part=wire_part))
        msg.status = "completed" if self.status in ("completed", "in_progress") else "incomplete"
        if self.in_band:
            port.conversation.trim_audio()
        await self.items.done(msg, draft.index)

    # ------------------------------------------------------------------ wire forms

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
        audio = None
        if self.audio:
            audio = ev.ResponseAudio(output=ev.ResponseAudioOutput(format=format_struct(self.output_format), voice=self.voice))
        finished = self.status != "in_progress"
        return ev.Response(
            id=self.id,
            status=self.status,  # type: ignore[arg-type]
            status_details=details,
            output=[self.items.wire(i) for i in self.output],
            conversation_id=self.port.conversation.id if self.in_band else None,
            output_modalities=["audio"] if self.audio else ["text"],
            max_output_tokens=self.max_output_tokens,
            audio=audio,
            usage=usage_wire(self.outcome.usage) if finished else None,
            metadata=with_timings(self.metadata, self.outcome) if finished and self.port.timing_metadata else self.metadata,
        )


class Runs:
    """A session's responses under way: at most one in band (it writes the conversation), and the
    out-of-band ones. The responses part starts and ends them; the others only look."""

    def __init__(self) -> None:
        self.active: ResponseRun | None = None  # the in-band response, if any
        self.out_of_band: set[ResponseRun] = set()

    def all(self) -> list[ResponseRun]:
        """Every run, the in-band one first."""
        return [run for run in (self.active, *self.out_of_band) if run is not None]

    def clear(self) -> None:
        self.active = None
        self.out_of_band.clear()


def usage_wire(u: Usage) -> ev.Usage:
    return ev.Usage(
        total_tokens=u.input_tokens + u.output_tokens,
        input_tokens=u.input_tokens,
        output_tokens=u.output_tokens,
        input_token_details=ev.InputTokenDetails(
            cached_tokens=u.cached_tokens,
            text_tokens=u.input_tokens - u.input_audio_tokens,
            audio_tokens=u.input_audio_tokens,
            cached_tokens_details=ev.CachedTokensDetails(text_tokens=u.cached_tokens),
        ),
        output_token_details=ev.OutputTokenDetails(text_tokens=u.output_tokens - u.output_audio_tokens, audio_tokens=u.output_audio_tokens),
    )


def with_timings(metadata: dict[str, str] | None, outcome: Outcome) -> dict[str, str] | None:
    """The client's metadata, plus the pipeline's stage timings of a finished response as
    ``timing.<stage>_ms``, in ms from the response trigger (the end of the user's turn, or
    response.create). Client keys win."""
    timings: dict[str, str] = {}
    first_audio_ms = outcome.first_audio_ms
    if first_audio_ms is not None:
        timings["timing.first_audio_delta_ms"] = f"{first_audio_ms:.1f}"
    for stage, ms in outcome.stage_times.items():
        timings[f"timing.{stage}_ms"] = f"{ms:.1f}"
    if not timings:
        return metadata
    return {**timings, **(metadata or {})}
