"""Responses: ``response.create`` (per-response parameters over the session's, in-band or out of
band), ``response.cancel``, ``output_audio_buffer.clear``, cutting the paced audio, and the
bookkeeping when a run ends.

A part of the session (see session.py). One run (run.py) per response, registered in ``Runs``:
at most one in-band response at a time, and ``limits.max_out_of_band`` out-of-band ones. A run sees
the session only through a ``SessionPort`` (events, items, rate limits), which leads back to no
part. When an in-band answer ends, the idle timeout is armed with this part's ``start``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from msgspec import UNSET

from pipelines.base import FunctionCall, Message, OutputChunk, ResponseRequest, Tool

from ..errors import RealtimeError, invalid_value
from ..ids import new_id
from ..protocol import events as ev
from ..protocol.audio import samples_to_ms
from ..tasks import create_task
from . import config as sc
from . import mcp
from .audio_out import EventAudio, PacedAudio
from .context import SessionContext
from .conversation import Alignment, Conversation, from_wire
from .draft import Weight
from .idle import IdleTimeout
from .items import Items
from .playout import Cut, Playout
from .run import Outcome, ResponseRun, Runs

log = logging.getLogger(__name__)


class SessionPort:
    """What a run sees of its session (``port.Port``): the events, the conversation, rate limits."""

    def __init__(self, ctx: SessionContext, items: Items, conversation: Conversation, servers: mcp.McpServers) -> None:
        self.ctx = ctx
        self.mcp = servers
        self.items = items
        self.caps = ctx.caps
        self.conversation = conversation
        self.timing_metadata = ctx.timing_metadata
        self.context_tokens = 0  # of the last in-band response: its input and output

    async def emit(self, event: Any, owner: Any = None, weight: Weight | None = None) -> bool:
        return await self.ctx.emit(event, owner, weight)

    def purge(self, owner: Any) -> list[Weight]:
        return self.ctx.purge(owner)

    def add_item(self, item: Message | FunctionCall | mcp.McpItem, alignment: Alignment | None = None) -> str | None:
        return self.items.add(item, alignment)

    def again(self, request: ResponseRequest, output: Sequence[object], in_band: bool) -> ResponseRequest:
        items = mcp.pipeline_view(self.conversation) if in_band else [*request.items, *mcp.pipeline_view(output)]
        return dataclasses.replace(request, items=items, tool_choice="auto")

    def respond(self, request: ResponseRequest) -> AsyncIterator[OutputChunk]:
        return self.ctx.pipe.respond(request)

    def rate_limits(self) -> ev.RateLimitsUpdated:
        limit = self.caps.context_tokens
        remaining = max(0, limit - self.context_tokens)
        return ev.RateLimitsUpdated(rate_limits=[ev.RateLimit(name="tokens", limit=limit, remaining=remaining, reset_seconds=0.0)])


class Responses:
    def __init__(
        self,
        ctx: SessionContext,
        runs: Runs,
        items: Items,
        conversation: Conversation,
        idle: IdleTimeout,
        playout: Playout | None,
        servers: mcp.McpServers,
    ) -> None:
        self.ctx = ctx
        self.runs = runs
        self.conversation = conversation
        self.idle = idle
        self.playout = playout
        self.mcp = servers
        self.port = SessionPort(ctx, items, conversation, servers)

    # ------------------------------------------------------------------ starting

    async def on_create(self, e: ev.ResponseCreate) -> None:
        if not self.ctx.config.responds:
            raise RealtimeError(
                "This is a transcription session: it transcribes the input audio and creates no responses.",
                code="unsupported_value",
                param="session.type",
            )
        await self.start(e.response or ev.ResponseParams(), started_at=time.perf_counter(), trigger="response.create")

    async def start(self, params: ev.ResponseParams, started_at: float, trigger: str | None = None) -> ResponseRun:
        """Start a response triggered at ``started_at``: by ``trigger`` (for its trace: ``response.create``), or
        None, by the session itself (a turn's end, the idle timeout, an approval)."""
        runs, limits = self.runs, self.ctx.limits
        conversation = params.conversation if params.conversation is not UNSET else "auto"
        if conversation not in ("auto", "none"):
            raise invalid_value("response.conversation", "Invalid 'response.conversation': expected 'auto' or 'none'.")
        in_band = conversation == "auto"
        if in_band and runs.active is not None:
            raise RealtimeError(
                f"Conversation already has an active response in progress: {runs.active.id}. "
                "Wait until the response is finished before creating a new one.",
                code="conversation_already_has_active_response",
            )
        if not in_band and len(runs.out_of_band) >= limits.max_out_of_band:
            raise RealtimeError(f"At most {limits.max_out_of_band} out-of-band responses may run at once.", code="too_many_active_responses")
        if params.tools is not UNSET and params.tools is not None:  # a response's own MCP servers, allowed, connected before it asks
            mcp.check_tools(params.tools, self.mcp.settings, "response.tools", beta=self.mcp.beta)
            await self.connect_mcp(params.tools, keep_others=True)
        await self.mcp.ready()
        if in_band and runs.active is not None:  # (started while this one waited for the listings)
            raise RealtimeError(f"Conversation already has an active response in progress: {runs.active.id}.", code="conversation_already_has_active_response")
        run = self._build_run(params, in_band, started_at, trigger)
        self.idle.cancel()
        if in_band:
            runs.active = run
        else:
            runs.out_of_band.add(run)
        run.task = create_task(self._respond(run), name=f"response:{run.id}")
        return run

    async def _respond(self, run: ResponseRun) -> None:
        self._finished(run, await run.run())

    def _build_run(self, params: ev.ResponseParams, in_band: bool, started_at: float, trigger: str | None) -> ResponseRun:
        request, out, mcp_tools = self._request(params)
        ctx, caps, wire_format = self.ctx, self.ctx.caps, sc.wire_format(out.format)
        items = self.conversation.items
        trace = ctx.trace.response(request.response_id, started_at, in_band=in_band, trigger=trigger, last_item_id=items[-1].id if items else None)
        audio_out = PacedAudio(self.playout, caps.output_rate) if self.playout else EventAudio(self.port, caps.output_rate, wire_format)
        run = ResponseRun(
            self.port,
            request,
            ctx.pipe.respond(request),
            audio_out,
            in_band=in_band,
            output_format=wire_format,
            voice=out.voice,
            max_output_tokens=out.max_output_tokens,
            metadata=params.metadata if params.metadata is not UNSET else None,
            started_at=started_at,
            stage_timeout_s=ctx.limits.stage_timeout_s,
            trace=trace,
        )
        run.items.mcp_tools = mcp_tools
        return run

    async def connect_mcp(self, tools: list[ev.Tool], keep_others: bool) -> None:
        """Connect to and list the MCP servers of ``tools`` (with their secrets) not yet connected."""

        async def add(item: mcp.McpListTools) -> None:
            previous = self.port.add_item(item)
            await self.ctx.emit(ev.ConversationItemAdded(previous_item_id=previous, item=mcp.to_wire(item)))

        async def done(item: mcp.McpListTools) -> None:
            if self.conversation.get(item.id) is item:
                await self.ctx.emit(ev.ConversationItemDone(previous_item_id=self.conversation.previous_id(item), item=mcp.to_wire(item)))

        await self.mcp.ensure(tools, self.ctx.emit, add, done, keep_others=keep_others)

    def _mcp_offer(self, tools: list[ev.Tool]) -> tuple[list[Tool], dict[str, Any]]:
        """The pipeline's tools for the listed MCP servers of ``tools``, and each one's server."""
        taken = {t.name for t in tools if isinstance(t, ev.FunctionTool)}
        return self.mcp.offer(tools, taken)

    def build_request(self, params: ev.ResponseParams) -> tuple[ResponseRequest, sc.OutputChoice]:
        """The pipeline request for ``params`` over this session's settings, and the output settings
        (voice, audio format, max tokens) the response reports."""
        request, out, _ = self._request(params)
        return request, out

    def _request(self, params: ev.ResponseParams) -> tuple[ResponseRequest, sc.OutputChoice, dict[str, Any]]:
        """``build_request``'s, and the MCP tools it offers by name (with their servers)."""
        cfg, caps, wire = self.ctx.config, self.ctx.caps, self.ctx.config.wire
        # ``input`` and ``instructions`` read null as not given (never None): ``is not None`` tells mypy so
        out = sc.fold_output(params, sc.OutputChoice.of(cfg), caps, "response")
        items = self._response_input(params.input) if params.input is not UNSET and params.input is not None else mcp.pipeline_view(self.conversation)
        voice_name = out.voice.id if isinstance(out.voice, ev.VoiceId) else out.voice
        choice = out.tool_choice
        offered, where = self._mcp_offer(out.tools)
        tools = [Tool(t.name, t.description or "", t.parameters or {}) for t in out.tools if isinstance(t, ev.FunctionTool)] + offered
        if isinstance(choice, ev.ToolChoiceMcp):  # a call of that server's tool (of one of its tools: only its tools offered)
            param = "response.tool_choice" if params.tool_choice is not UNSET and params.tool_choice is not None else "session.tool_choice"
            pipeline_choice, only = mcp.forced(choice, where, param)
            tools = tools if only is None else [t for t in tools if t.name in only]
        else:
            pipeline_choice = choice.name if isinstance(choice, ev.ToolChoiceFunction) else choice
        request = ResponseRequest(
            response_id=new_id("resp"),
            items=items,
            instructions=params.instructions if params.instructions is not UNSET and params.instructions is not None else cfg.instructions,
            output_modalities=tuple(out.modalities),
            voice=voice_name if voice_name in caps.voices else caps.voices[0],
            speed=cfg.speed,
            max_output_tokens=None if out.max_output_tokens == "inf" else out.max_output_tokens,
            temperature=params.temperature if params.temperature is not UNSET else cfg.temperature,
            tools=tools,
            tool_choice=pipeline_choice,
            parallel_tool_calls=_parallel(params.parallel_tool_calls, wire.parallel_tool_calls),
        )
        return request, out, where

    def _response_input(self, entries: list[ev.InputItem]) -> list[Any]:
        cfg = self.ctx.config
        items: list[Any] = []
        for i, entry in enumerate(entries):
            if isinstance(entry, ev.ItemReference):
                item = self.conversation.get(entry.id)
                if item is None:
                    raise invalid_value(f"response.input[{i}].id", f"Invalid 'response.input[{i}].id': no item with id {entry.id!r}.")
                items.append(item)
            else:
                items.append(from_wire(entry, self.ctx.caps, cfg.input_format, cfg.output_format, f"response.input[{i}]"))
        return items

    # ------------------------------------------------------------------ stopping

    async def on_cancel(self, e: ev.ResponseCancel) -> None:
        runs = self.runs.all()
        if e.response_id is not None:
            runs = [r for r in runs if r.id == e.response_id]
        if not runs:
            which = f" with id {e.response_id!r}" if e.response_id else ""
            raise RealtimeError(f"Cancellation failed: no active response{which} found.", code="response_cancel_not_active")
        await runs[0].cancel("client_cancelled")

    async def on_output_clear(self, e: ev.OutputAudioBufferClear) -> None:
        run = self.runs.active
        cut = self.cut_playout()
        if run is not None:
            run.mute()
        if cut is not None:
            await self.report_cut(cut)
        if run is not None:
            await run.cancel("client_cancelled")
            if cut is None:
                await self.ctx.emit(ev.OutputAudioBufferCleared(response_id=run.id))

    def cut_playout(self) -> Cut | None:
        """Silence the media stream now (barge-in, ``output_audio_buffer.clear``)."""
        return self.playout.clear() if self.playout is not None else None

    async def report_cut(self, cut: Cut) -> None:
        """After a cut: say so, and truncate an answer that had finished generating but was still
        playing to what was heard (an answer still generating trims itself when cancelled)."""
        await self.ctx.emit(ev.OutputAudioBufferCleared(response_id=cut.owner.id))
        message, conversation = cut.message, self.conversation
        if cut.owner is not self.runs.active and isinstance(message, Message) and conversation.get(message.id) is message:
            part = message.parts[0]
            if part.kind == "audio" and part.audio is not None and cut.played < len(part.audio):
                conversation.truncate(message, 0, cut.played)
                end_ms = samples_to_ms(cut.played, self.ctx.caps.output_rate)
                await self.ctx.emit(ev.ConversationItemTruncated(item_id=message.id, content_index=0, audio_end_ms=end_ms))

    # ------------------------------------------------------------------ the end of a run

    def _finished(self, run: ResponseRun, outcome: Outcome) -> None:
        """A run has said ``response.done``."""
        metrics = self.ctx.metrics
        metrics.responses.labels(outcome.status).inc()
        metrics.response_duration.observe(outcome.done_at - outcome.started_at)
        if outcome.first_audio_at:
            metrics.first_audio.observe(outcome.first_audio_at - outcome.started_at)
        if outcome.cancel_requested_at:
            metrics.cancel_latency.observe(outcome.done_at - outcome.cancel_requested_at)
        metrics.response_timings(
            {
                "response_id": run.id,
                "session_id": self.ctx.id,
                "status": outcome.status,
                "first_audio_ms": outcome.first_audio_ms,
                "stages": outcome.stage_times,
                **outcome.stage_info,
            }
        )
        run.trace.finished(outcome, [item.id for item in run.output])
        if outcome.in_band:
            self.port.context_tokens = outcome.usage.input_tokens + outcome.usage.output_tokens
        if self.runs.active is run:
            self.runs.active = None
            self.idle.arm(outcome, self.start)
        self.runs.out_of_band.discard(run)


def _parallel(*settings: object) -> bool:
    """``parallel_tool_calls``: the response's, else the session's, else OpenAI's default (true)."""
    return next((bool(s) for s in settings if isinstance(s, bool)), True)
