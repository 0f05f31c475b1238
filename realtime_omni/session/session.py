"""A realtime session: the state machine behind one client, whatever transport carries it.

A transport feeds it client messages (``handle``) or, for media transports, PCM frames at the
pipeline's input rate (``push_audio``), DTMF and camera frames, and sends whatever appears in
``outbox`` (and, for media transports, plays ``playout``). Client mistakes become ``error``
events; the session always survives them.

The session is composed of parts it owns, each given the shared ``SessionContext`` (settings,
lifecycle, pipeline session, events out) and only the parts it calls, so every dependency points
one way, down this list:

    TurnTaking    turn_taking.py   appends and frames -> turns; barge-in; commits and clears
    Responses     responses.py     response.create/cancel, output_audio_buffer.clear, cuts
    IdleTimeout   idle.py          prompting a silent user after an answer
    UserInput     user_input.py    the input buffer, the open turn, committing user items
    Items         items.py         adding items; conversation.item.*
    Transcriber   transcription.py input transcription and live captions
    Runs          run.py           the responses under way (read by all, changed by Responses)

This module holds the composition, the dispatcher (one handler per client event type),
``session.update`` and the session's end.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import ClassVar

import msgspec
import numpy as np

from pipelines.base import Capabilities, Pipeline
from pipelines.turn_end.policy import TurnEndPolicy

from ..config import InterruptionGuard, Limits, McpConfig
from ..errors import RealtimeError
from ..ids import new_id
from ..metrics import Metrics
from ..protocol import events as ev
from ..protocol.codec import decode_client_event
from ..tracing import NO_TRACING, Tracing
from . import config as sc
from . import mcp
from .context import Lifecycle, SessionContext
from .conversation import Conversation
from .idle import IdleTimeout
from .items import Items
from .outbox import Outbox
from .playout import Playout
from .responses import Responses
from .run import Runs
from .tool_servers import Connect, unreachable
from .transcription import Transcriber
from .turn_taking import TurnTaking
from .user_input import UserInput

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Media:
    """How a session's audio travels, fixed when it opens. The default is a WebSocket's: answer
    audio as ``response.output_audio.delta`` events."""

    playout_rate: int | None = None  # a media transport's: answer audio leaves paced, from a playout at this rate
    playout_buffer_ms: int = 200
    interruption_guard: InterruptionGuard | None = None  # telephony: see ``turn_taking.guard_holds``


class Session:
    # The handler of each client event: the part's attribute and the method's name, looked up per
    # event. A table of bound methods kept on the instance would be a reference cycle, keeping a
    # closed session's audio alive until a full collection. (None: the session's own.)
    _HANDLERS: ClassVar[dict[type, tuple[str | None, str]]] = {
        ev.InputAudioBufferAppend: ("turns", "on_append"),
        ev.InputAudioBufferCommit: ("turns", "on_commit"),
        ev.InputAudioBufferClear: ("turns", "on_clear"),
        ev.OutputAudioBufferClear: ("responses", "on_output_clear"),
        ev.SessionUpdate: (None, "_on_session_update"),
        ev.TranscriptionSessionUpdate: (None, "_on_transcription_session_update"),
        ev.ConversationItemCreate: (None, "_on_item_create"),
        ev.ConversationItemRetrieve: ("items", "on_retrieve"),
        ev.ConversationItemDelete: ("items", "on_delete"),
        ev.ConversationItemTruncate: ("items", "on_truncate"),
        ev.ResponseCreate: ("responses", "on_create"),
        ev.ResponseCancel: ("responses", "on_cancel"),
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
        turn_end: TurnEndPolicy | None = None,
        mcp_settings: McpConfig | None = None,
        connect_mcp: Connect = unreachable,
        tenant: str | None = None,
        tracing: Tracing = NO_TRACING,
        transport: str = "",
        initial_tools: list[ev.Tool] | None = None,
        id_tag: str | None = None,
    ) -> None:
        session_id = new_id(f"sess_{id_tag}" if id_tag else "sess")  # the tag: which replica holds it (config.route_tag)
        caps = pipeline.capabilities
        pipe = pipeline.open(session_id, tenant)  # tenant: the prefix-cache namespace (Pipeline.open)
        trace = tracing.session(session_id, transport=transport, pipeline=caps.name)
        self.ctx = ctx = SessionContext(session_id, caps, defaults, limits, metrics, pipe, timing_metadata=timing_metadata, trace=trace)
        trace.configure(defaults.wire.tracing)
        if defaults.noise_reduction is not None:
            ctx.pipe.reduce_noise(defaults.noise_reduction)
        if defaults.transcription is not None:
            ctx.pipe.transcribing(True)
        if defaults.keywords:
            ctx.pipe.expect(defaults.keywords)
        self.beta = beta
        self.media = media
        self.conversation = Conversation(caps, max_items=limits.max_items, max_audio_seconds=limits.max_audio_seconds)
        rate = media.playout_rate
        self.playout = Playout(rate, ctx.emit_soon, max_buffer_ms=media.playout_buffer_ms) if rate else None
        self.runs = Runs()
        self.transcriber = Transcriber(ctx)
        self.items = Items(ctx, self.conversation, self.transcriber, self.runs)
        self.user = UserInput(ctx, self.items, self.transcriber)
        self.idle = IdleTimeout(ctx, self.user, self.runs)
        self.mcp = mcp.McpServers(mcp_settings or McpConfig(), session_id, beta=beta, connect=connect_mcp)
        # the defaults' tools (the config's session, sip.session, a key's grant, a call's accept) as
        # written, secrets included: their MCP servers are connected at start, as a session.update's are
        self._initial_tools = initial_tools or []
        self.responses = Responses(ctx, self.runs, self.items, self.conversation, self.idle, self.playout, self.mcp)
        self.turns = TurnTaking(
            ctx,
            self.user,
            self.responses,
            self.runs,
            self.idle,
            self.transcriber,
            playout=self.playout,
            guard=media.interruption_guard,
            turn_end=turn_end or TurnEndPolicy(),
        )

    # What transports and the server read of a session.

    @property
    def id(self) -> str:
        return self.ctx.id

    @property
    def config(self) -> sc.SessionConfig:
        return self.ctx.config

    @property
    def caps(self) -> Capabilities:
        return self.ctx.caps

    @property
    def outbox(self) -> Outbox:
        return self.ctx.outbox

    # ================================================================== inbound

    async def start(self) -> None:
        await self.ctx.emit(ev.SessionCreated(session=self.config.public))
        await self.ctx.emit(ev.ConversationCreated(conversation=ev.Conversation(id=self.conversation.id)))
        tools = self._initial_tools
        if any(isinstance(t, ev.McpTool) for t in tools) and self.config.responds:
            try:
                mcp.check_tools(tools, self.mcp.settings, "session.tools", beta=self.beta)
            except RealtimeError as err:  # an MCP server the operator did not allow: said, and the session goes on without it
                await self.ctx.report(err)
            else:
                self.mcp.spawn(self._connect_mcp(tools))
        self._prepare()

    async def handle(self, data: bytes | str) -> None:
        """One client message. Never raises for anything the client sent."""
        ctx = self.ctx
        try:
            event = decode_client_event(data)
        except RealtimeError as err:
            ctx.metrics.event_in(None)
            await ctx.report(err)
            return
        ctx.metrics.event_in(str(event.__struct_config__.tag))  # (a client event's tag is its type, a str)
        part, method = self._HANDLERS[type(event)]
        try:
            await getattr(self if part is None else getattr(self, part), method)(event)
        except RealtimeError as err:
            err.event_id = err.event_id or event.event_id
            await ctx.report(err)
        except Exception:  # a defect of ours, not the client's: say so, and keep the session
            log.exception("session %s: handling %s failed", ctx.id, event.__struct_config__.tag)
            await ctx.emit_error(
                "The server failed to handle this event; the session carries on.",
                code="server_error",
                type="server_error",
                event_id=event.event_id,
            )

    async def push_audio(self, pcm: np.ndarray) -> None:
        """Audio at the pipeline's input rate, from a media transport (``RealtimeError`` when the
        input buffer is full)."""
        await self.turns.push_audio(pcm)

    def camera_frame(self, data_url: str) -> None:
        """The camera's latest frame (a media transport samples it); it goes with the user's next turn."""
        self.user.video_frame = data_url

    async def dtmf(self, digit: str) -> None:
        """A key the caller pressed (telephony)."""
        await self.ctx.emit(ev.InputAudioBufferDtmfEventReceived(event=digit, received_at=int(time.time())))

    async def report(self, err: RealtimeError) -> None:
        """A transport's trouble with its input, as an ``error`` event."""
        await self.ctx.report(err)

    async def _on_transcription_session_update(self, e: ev.TranscriptionSessionUpdate) -> None:
        await self._on_session_update(ev.SessionUpdate(session=msgspec.structs.replace(e.session, type="transcription")))

    async def _on_item_create(self, e: ev.ConversationItemCreate) -> None:
        item = await self.items.on_create(e)
        if isinstance(item, mcp.McpApprovalResponse) and self.config.responds and self.runs.active is None:
            await self.responses.start(ev.ResponseParams(), started_at=time.perf_counter())  # runs (or declines) the call, and answers

    async def _on_session_update(self, e: ev.SessionUpdate) -> None:
        ctx = self.ctx
        old = ctx.config
        new = old.updated(e.session, ctx.caps)
        tools = e.session.tools if e.session.tools is not msgspec.UNSET and e.session.tools is not None else None
        if tools is not None:  # the allow-list, before anything changes or connects
            mcp.check_tools(tools, self.mcp.settings, "session.tools", beta=self.beta)
        ctx.config = new
        ctx.trace.configure(new.wire.tracing)
        if new.input_format is not old.input_format:
            self.turns.set_input_format(new.input_format)
        if new.noise_reduction != old.noise_reduction:
            ctx.pipe.reduce_noise(new.noise_reduction)
        if (new.transcription is None) != (old.transcription is None):
            ctx.pipe.transcribing(new.transcription is not None)
        if new.keywords != old.keywords:
            ctx.pipe.expect(new.keywords)
        if self.turns.detection(new.vad) != self.turns.detection(old.vad):
            self.turns.vad_changed()
        await ctx.emit(ev.SessionUpdated(session=new.public))
        if tools is not None and new.responds:
            self.mcp.spawn(self._connect_mcp(tools))
        self._prepare()

    async def _connect_mcp(self, tools: list[ev.Tool]) -> None:
        try:
            await self.responses.connect_mcp(tools, keep_others=False)
        except Exception:  # (the outbox closed under it: the session is going)
            log.exception("session %s: connecting its MCP servers failed", self.ctx.id)
            return
        if not self.mcp.closed and any(isinstance(t, ev.McpTool) for t in tools):
            self._prepare()  # the tools just listed begin every prompt now: prefilled off the turn's path too

    def _prepare(self) -> None:
        """Tell the pipeline what every response begins with now (instructions, tools), so it can
        prefill that off the first turn's path."""
        try:
            request = self.responses.build_request(ev.ResponseParams())[0]
        except RealtimeError:
            return  # a response itself will report it
        self.ctx.pipe.prepare(request)

    # ================================================================== ending

    async def end(self, message: str, code: str) -> None:
        """End the session from the server side (shutdown): tell the client why, cancel what is
        running, and close the outbox so the transport sends what is queued and hangs up."""
        ctx = self.ctx
        if ctx.lifecycle is not Lifecycle.OPEN:
            return
        ctx.move_to(Lifecycle.ENDING)
        self.idle.cancel()
        await ctx.emit_error(message, code=code, type="server_error")
        for run in self.runs.all():
            await run.cancel("shutdown")
        ctx.outbox.close()

    async def close(self) -> None:
        """The connection is gone: stop everything and release what the session held."""
        ctx = self.ctx
        if ctx.closed:
            return
        ctx.move_to(Lifecycle.CLOSED)
        ctx.outbox.discard()
        if self.playout is not None:
            self.playout.close()
        runs = self.runs.all()
        for run in runs:
            run.abandon()
        await ctx.tasks.cancel()
        await asyncio.gather(*(r.task for r in runs if r.task), return_exceptions=True)
        self.runs.clear()
        ctx.trace.close()
        try:
            await self.mcp.close()
        except Exception:
            log.exception("closing the MCP connections of %s failed", ctx.id)
        try:
            await ctx.pipe.close()
        except Exception:
            log.exception("closing the pipeline session of %s failed", ctx.id)
