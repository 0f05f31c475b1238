"""What every transport shares: the pipeline, the config, metrics, and the live sessions."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pipelines
from pipelines.base import Capabilities, Pipeline, TurnModel
from pipelines.turn_end.policy import TurnEndConfig, TurnEndPolicy

from .config import ServerConfig
from .errors import RealtimeError
from .ids import new_id
from .keys import is_ephemeral
from .lifecycle import PIPELINE_FAILED, STARTUP_FAILED, Lifecycle, ServerState, health_status
from .loopwatch import LoopWatch
from .memory import MemoryTrim
from .metrics import Metrics
from .origins import Origins
from .protocol import events as ev
from .resume import Holds
from .session import Media, Session
from .session.config import SessionConfig
from .session.tool_servers import Connect, unreachable
from .store import LocalStore, Store, unavailable
from .tracing import NO_TRACING, Exporter, Tracing, no_exporter
from .tracing import configure as configure_tracing

log = logging.getLogger(__name__)


class LiveCall(Protocol):
    """What the server asks of a live call (``calls.Call``): to report its end, and to end when
    the server shuts down."""

    id: str

    def on_end(self, listener: Callable[[Any], Awaitable[None]]) -> None: ...

    async def events_sent(self, timeout: float) -> None: ...

    async def hangup(self, reason: str = "hangup") -> None: ...


class LiveCalls(dict[str, LiveCall]):
    """The server's live calls by id (call control and sidebands find them here), each held from
    ``add`` until it reports its end, and published in the shared store for the other replicas."""

    def __init__(self, store: Callable[[], Store]) -> None:
        super().__init__()
        self._store = store  # the server's store (host/ may swap it for Redis before the start)

    def add(self, call: LiveCall) -> None:
        self[call.id] = call
        call.on_end(self._ended)

    async def publish(self, call: LiveCall) -> None:
        """Tell the replicas sharing the store that this one holds ``call``: call control and
        sidebands that reach another replica are forwarded here. An unreachable store: the call
        works, reached through this replica only."""
        try:
            await self._store().add_call(call.id)
        except RealtimeError as err:
            log.warning("call %s: other replicas will not find it: %s", call.id, err.message)

    async def _ended(self, call: LiveCall) -> None:
        if self.get(call.id) is call:
            del self[call.id]
        try:
            await self._store().remove_call(call.id)
        except RealtimeError as err:
            log.warning("call %s: its entry in the shared store stays until it expires: %s", call.id, err.message)


@dataclass(frozen=True)
class Admission:
    """A client's credentials, checked: an ephemeral key still to spend, and the session
    configuration it grants."""

    ephemeral_key: str | None
    session: ev.SessionObject | None
    tenant: str | None = None  # the prefix-cache namespace of the key (``Server.tenant``); None: the session's own


async def load_turn_end(policy: TurnEndPolicy, config: TurnEndConfig) -> None:
    """semantic_vad's model on the sound. Without it (not installed, not loadable) semantic_vad
    still works, on a fixed silence per eagerness, and the server says so."""
    name = config.model
    loop = asyncio.get_running_loop()
    if policy.model is None and name:
        try:
            model = pipelines.turn_model(name, config.threads)
            await loop.run_in_executor(None, model.load)
            policy.model = model
        except Exception as exc:
            log.warning("semantic_vad falls back to fixed silences: the end-of-turn model %s is unavailable (%s)", name, exc)
    elif policy.model is not None:
        await loop.run_in_executor(None, policy.model.load)
    if policy.model is not None:
        log.info("semantic_vad: end-of-turn model %s", policy.model.name)


def _unknown_ephemeral_key() -> RealtimeError:
    return RealtimeError("This ephemeral key is unknown, expired or already used.", code="invalid_api_key", type="authentication_error")


class Server:
    def __init__(self, config: ServerConfig, pipeline: Pipeline | None = None, turn_model: TurnModel | None = None, store: Store | None = None) -> None:
        self.config = config
        self.origins = Origins(config.allowed_origins)
        self.metrics = Metrics(config.timings_log)
        self.pipeline = pipeline or pipelines.create(config.pipeline.kind, config.pipeline.options)
        # when a user's turn ends (config.turn_end); its sound model is loaded by start()
        self.turn_end = TurnEndPolicy(config.turn_end, turn_model)
        self.metrics.watch_pipeline(self.pipeline.stats)
        self.loop_watch = LoopWatch(self.metrics.registry)
        self.tracing: Tracing = NO_TRACING  # per-turn traces (tracing.py): configured by start(), flushed by stop()
        # the adapters to the outside that host/ composes (as it may swap the store for Redis):
        # what exports traces, and what reaches a session's MCP servers
        self.export_traces: Exporter = no_exporter
        self.connect_mcp: Connect = unreachable
        self.sessions: set[Session] = set()
        self.calls = LiveCalls(lambda: self.store)  # live WebRTC / SIP calls (calls.Call) by call_id
        self.holds = Holds()  # sessions (WebSocket, WebRTC) a dropped client may resume (resume.py), by session id
        # keys, the session count and who holds which call: in this process, or shared by replicas
        self.store: Store = store or LocalStore(mint_rate=config.limits.key_mints_per_s, mint_burst=config.limits.key_mint_burst)
        self._tenant_secret = secrets.token_bytes(32)  # (Server.tenant)
        self.replica = new_id("replica")  # this process, among the replicas sharing the store
        self.url = config.advertise_url  # where the other replicas reach this one (host/ fills it in from the bound port)
        self.defaults: SessionConfig | None = None
        self.lifecycle = Lifecycle()  # moved by this class only (see lifecycle.py)
        self.started_at = time.time()
        self.on_fatal: Callable[[], None] | None = None  # set by the runner: stop serving
        self._drain: asyncio.Task[None] | None = None
        self._failure_watch: asyncio.Task[None] | None = None
        self.memory = MemoryTrim()
        self._starting: asyncio.Task[None] | None = None

    @property
    def status(self) -> str:
        """``/healthz``'s status (``ok``, or why not), derived from the lifecycle, the pipeline's
        health and the shared store's."""
        return health_status(self.lifecycle, pipeline_healthy=self.pipeline.healthy, store_error=self.store.error)

    @property
    def healthy(self) -> bool:
        return self.status == "ok"

    @property
    def ready(self) -> bool:
        """Serving: started, not draining."""
        return self.lifecycle.state is ServerState.READY

    def stop_admitting(self) -> None:
        """Refuse new sessions from now on (``/healthz`` 503 "draining"), before the drain runs:
        SIGTERM, for the balancer's next check."""
        if self.lifecycle.state in (ServerState.STARTING, ServerState.READY):
            self.lifecycle = self.lifecycle.to(ServerState.DRAINING)

    def _defaults(self, caps: Capabilities) -> SessionConfig:
        try:
            return SessionConfig.default(caps, self.config.model).updated(self.config.session, caps)
        except RealtimeError as err:
            raise ValueError(f"invalid 'session' in the server config: {err.message}") from None

    async def start(self) -> None:
        caps = self.pipeline.capabilities
        # Validate the configured session defaults before loading models: a typo fails fast. Whether
        # the pipeline calls tools is known once it has started (the cascade's thinker's template):
        # the defaults' tools are checked against that then.
        self.defaults = self._defaults(dataclasses.replace(caps, tools=True))
        self.tracing = configure_tracing(self.config.tracing, self.export_traces)
        await load_turn_end(self.turn_end, self.config.turn_end)
        await self.store.start(self.replica, self.url, lambda: len(self.sessions))
        self.loop_watch.start()
        await self.pipeline.start()
        caps = self.pipeline.capabilities
        self.defaults = self._defaults(caps)
        if self.lifecycle.state is ServerState.STARTING:  # (a SIGTERM meanwhile: it drains)
            self.lifecycle = self.lifecycle.to(ServerState.READY)
        self._failure_watch = asyncio.create_task(self._watch_for_failure(), name="pipeline-failure-watch")
        self.memory.start()
        log.info("ready: pipeline %s", caps.name)

    async def _watch_for_failure(self, every_s: float = 0.5, grace_s: float = 1.0) -> None:
        """A pipeline failed for good (``Pipeline.failed``): with ``on_pipeline_failure: exit``, let
        the responses in flight fail with their errors (``grace_s``), then stop serving with exit
        status 3 (the runner drains: every session is told why)."""
        while (reason := self.pipeline.failed) is None:
            await asyncio.sleep(every_s)
        if self.config.on_pipeline_failure != "exit":
            log.error("the pipeline failed (%s); serving on unhealthy (on_pipeline_failure: stay)", reason)
            return
        log.error("the pipeline failed (%s); draining and exiting with status 3 for a supervisor to restart the server", reason)
        await asyncio.sleep(grace_s)
        state = ServerState.DRAINING if self.lifecycle.state is ServerState.READY else self.lifecycle.state
        self.lifecycle = self.lifecycle.to(state, failure=f"the pipeline failed: {reason}", exit_code=PIPELINE_FAILED)
        if self.on_fatal is not None:
            self.on_fatal()

    def start_in_background(self) -> None:
        """Load the pipeline while HTTP already answers (``/healthz``: 503 "starting" until ready).
        A failure is logged, reported by ``/healthz`` and stops the server."""

        async def run() -> None:
            try:
                await self.start()
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                log.exception("startup failed")
                self.lifecycle = self.lifecycle.to(ServerState.FAILED, failure=f"{type(exc).__name__}: {exc}", exit_code=STARTUP_FAILED)
                if self.on_fatal is not None:
                    self.on_fatal()

        self._starting = asyncio.create_task(run(), name="server-start")

    async def stop(self) -> None:
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
            await asyncio.gather(self._starting, return_exceptions=True)
        if self._failure_watch is not None:
            self._failure_watch.cancel()
            await asyncio.gather(self._failure_watch, return_exceptions=True)
        await self.memory.stop()
        await self.drain()
        await self.store.stop()
        await self.loop_watch.stop()
        await self.pipeline.stop()
        self.turn_end.close()
        tracing, self.tracing = self.tracing, NO_TRACING
        await tracing.shutdown()  # the spans still queued, then the exporter's thread

    def authorized(self, key: str | None) -> bool:
        """The server's own API key (or any key when it has none). Ephemeral keys: see ``admit``."""
        expected = self.config.api_key
        if is_ephemeral(key):
            return False
        return not expected or (key is not None and hmac.compare_digest(key.encode(), expected.encode()))

    def check_origin(self, origin: str | None) -> None:
        """A browser's ``Origin`` against ``allowed_origins`` (None: anything goes). Raises
        ``RealtimeError`` (code ``origin_not_allowed``) for one not on the list."""
        if self.origins.allows(origin):
            return
        assert origin is not None  # a request without one (not a browser's) is allowed
        raise RealtimeError(f"Origin {origin[:200]!r} is not allowed to connect to this server.", code="origin_not_allowed", type="invalid_request_error")

    async def admit(self, key: str | None) -> Admission:
        """Check a client's key for opening a session: the API key, or an unspent ephemeral key
        (spent only when ``open_session`` opens the session). Raises ``RealtimeError`` (code
        ``invalid_api_key``) for anything else."""
        if is_ephemeral(key):
            if self.store.error is not None:
                raise unavailable(self.store.error)
            grant = await self.store.peek_key(key)  # type: ignore[arg-type]
            if grant is None:
                raise _unknown_ephemeral_key()
            return Admission(key, grant.session, grant.tenant)
        if not self.authorized(key):
            raise RealtimeError("Missing or invalid API key (send 'Authorization: Bearer <key>').", code="invalid_api_key", type="authentication_error")
        return Admission(None, None, self.tenant(key))

    def tenant(self, key: str | None) -> str | None:
        """The prefix-cache namespace of sessions opened with the API key ``key`` (or with an
        ephemeral key it minted): a keyed digest of it under this process's own secret, so neither
        the key nor anything that tells it reaches the engine. Sessions of one key share their
        cached prefixes (instructions, tools); those of different keys never do. None without a
        key (an open server's anonymous client): the session's own namespace."""
        if not key:
            return None
        return hmac.new(self._tenant_secret, key.encode(), hashlib.sha256).hexdigest()[:32]

    def check_capacity(self, pending: int = 0) -> None:
        """Raise the ``RealtimeError`` a new session would get now (not ready, draining, or full
        counting ``pending`` sessions promised but not yet opened, e.g. ringing phone calls)."""
        limits = self.config.limits
        if not self.lifecycle.admitting or self.defaults is None:
            self.metrics.sessions_rejected.labels("unavailable").inc()
            raise RealtimeError("The server is not accepting sessions right now.", code="server_unavailable", type="server_error")
        if self.store.error is not None:
            self.metrics.sessions_rejected.labels("unavailable").inc()
            raise unavailable(self.store.error)
        if len(self.sessions) + pending >= limits.max_sessions:
            self.metrics.sessions_rejected.labels("max_sessions").inc()
            raise RealtimeError(
                f"The server is at its limit of {limits.max_sessions} concurrent sessions; try again later.",
                code="max_sessions_reached",
                type="rate_limit_error",
            )

    async def open_session(
        self,
        *,
        beta: bool,
        transport: str,
        model: str | None,
        admission: Admission,
        updates: tuple[ev.SessionObject | None, ...] = (),
        media: Media = Media(),
    ) -> Session:
        """A new session, or a ``RealtimeError`` saying why not (not ready, full, draining, an
        invalid update to the defaults: an ephemeral key's grant, a call's session config; or the
        admission's ephemeral key spent meanwhile). The key is spent only once nothing else refuses."""
        self.check_capacity()
        assert self.defaults is not None
        defaults = self.defaults
        if model and model != defaults.wire.model:
            defaults = defaults.updated(ev.SessionObject(model=model), self.pipeline.capabilities)
        for update in (admission.session, *updates):
            if update is not None:
                defaults = defaults.updated(update, self.pipeline.capabilities)
        # the tools as written, secrets and all (the session config keeps MCP tools without their
        # headers): the last of these that names tools is the session's, as the updates apply
        written = [u.tools for u in (self.config.session, admission.session, *updates) if u is not None and isinstance(u.tools, list)]
        if not await self.store.reserve_session(self.config.limits.max_sessions):  # every replica's sessions together
            self.metrics.sessions_rejected.labels("max_sessions").inc()
            raise RealtimeError(
                f"The deployment is at its limit of {self.config.limits.max_sessions} concurrent sessions; try again later.",
                code="max_sessions_reached",
                type="rate_limit_error",
            )
        try:
            if admission.ephemeral_key is not None and await self.store.redeem_key(admission.ephemeral_key) is None:
                raise _unknown_ephemeral_key()  # expired, or another connection spent it meanwhile
        except RealtimeError:
            await self._release_slot()
            raise
        session = Session(
            self.pipeline,
            defaults,
            self.config.limits,
            self.metrics,
            media=media,
            beta=beta,
            timing_metadata=self.config.timing_metadata,
            turn_end=self.turn_end,
            mcp_settings=self.config.mcp,
            connect_mcp=self.connect_mcp,
            tenant=admission.tenant,
            tracing=self.tracing,
            transport=transport,
            initial_tools=written[-1] if written else [],
            id_tag=self.config.route_tag,
        )
        self.sessions.add(session)
        self.metrics.sessions_total.labels(transport).inc()
        self.metrics.sessions_active.set(len(self.sessions))
        return session

    async def close_session(self, session: Session) -> None:
        await session.close()
        if session in self.sessions:
            self.sessions.discard(session)
            await self._release_slot()
        self.metrics.sessions_active.set(len(self.sessions))
        self.memory.session_closed()

    async def _release_slot(self) -> None:
        try:
            await self.store.release_session()
        except RealtimeError as err:  # unreachable: the shared count is mended from ours once it is back
            log.warning("could not release a session slot: %s", err.message)

    async def drain(self, let_run_s: float = 0.0) -> None:
        """Stop admitting sessions (``/healthz`` 503 from now on: a balancer sends no more), let
        the open ones run on up to ``let_run_s`` (a replica taken out of a deployment: most end on
        their own), then tell each one left the server is going away (its client reconnects,
        landing on another replica) and wait, up to the grace period, for their transports to
        hang up."""
        if self._drain is None:  # the first call drains; any other waits for it
            self.stop_admitting()
            self._drain = asyncio.create_task(self._end_sessions(let_run_s), name="server-drain")
        await asyncio.shield(self._drain)

    async def _end_sessions(self, let_run_s: float) -> None:
        deadline = time.monotonic() + let_run_s
        while self.sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for session in list(self.sessions):
            await session.end("The server is shutting down; this session is over.", code="server_shutting_down")
        for call in list(self.calls.values()):  # calls hang up once their last events are out
            await call.events_sent(timeout=1.0)
            await call.hangup("server_shutting_down")
        deadline = time.monotonic() + self.config.shutdown_grace_s
        while self.sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for session in list(self.sessions):
            await self.close_session(session)
        if self.lifecycle.state is ServerState.DRAINING:
            self.lifecycle = self.lifecycle.to(ServerState.DRAINED)
