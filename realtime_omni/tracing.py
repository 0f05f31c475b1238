"""Per-turn traces in OpenTelemetry: a span per session, per response, and the stages of each.

Off unless an OTLP endpoint is configured: the ``tracing`` section of the config, or the standard
environment (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``OTEL_EXPORTER_OTLP_ENDPOINT``; with
``OTEL_EXPORTER_OTLP_PROTOCOL``, ``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER`` and its arg;
``OTEL_SDK_DISABLED=true`` turns it off whatever else is set). Off, every hook is a method of
``SessionTrace`` or ``ResponseTrace`` that does nothing, and the OpenTelemetry SDK is never imported.

This module is the port: the hooks (``Tracing``, ``SessionTrace``, ``ResponseTrace``, ``CallTrace``)
and which settings turn traces on. Exporting spans is I/O, so the OpenTelemetry SDK and its OTLP
exporters are an adapter outside the core (host/otel_tracing.py), handed to the server as its
``Exporter``; a server composed without one exports nothing.

The spans (docs/operations.md lists their attributes):

    realtime.session                  open .. close; transport, pipeline, the session's ``tracing``
      realtime.transcription          a user item's input transcription
      realtime.turn_end               a turn's end not followed by a response of its own
      realtime.response               trigger (turn end or response.create) .. response.done
        realtime.turn_end             the silence waited before the turn was judged over
        realtime.stage.<stage>        trigger .. the pipeline stage's first output (asr, thinker_first_token, ...)
        realtime.first_delta          trigger .. the first text/audio delta queued for the client
        realtime.tool_call            a function call being written (its first chunk .. complete)
        realtime.mcp_call             an MCP tool call the server runs
        event realtime.cancel         a barge-in, response.cancel, output_audio_buffer.clear, shutdown

The stage times are the ones /metrics and the timings log already take (``StageTimes``, the run's
``Outcome``): the stage spans are written when the response ends, with those times, no clock of
their own.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .config import TracingConfig

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Off: hooks that do nothing
# ---------------------------------------------------------------------------------------------


class CallTrace:
    """A tool call's or an MCP call's span (``end`` with its error, if it failed)."""

    def end(self, error: str | None = None) -> None:
        pass


class ResponseTrace:
    """One response's span and its children; this base does nothing (tracing off, or not sampled)."""

    def tool_call(self, item_id: str, call_id: str, name: str) -> CallTrace:
        return NO_CALL

    def mcp_call(self, item_id: str, server_label: str, name: str) -> CallTrace:
        return NO_CALL

    def cancelled(self, reason: str) -> None:
        pass

    def abandoned(self) -> None:
        """The session closed under the response (the client went away): it ends here, unfinished."""

    def finished(self, outcome: Any, output_ids: list[str]) -> None:
        """``outcome``: the run's ``Outcome`` (status, timings, usage)."""


class SessionTrace:
    """One session's span; this base does nothing (tracing off, or not sampled)."""

    def configure(self, tracing: Any) -> None:
        """The session's ``tracing`` field (None, ``"auto"`` or the wire's ``TracingConfig``) as it stands now."""

    def turn_ended(self, item_id: str, silence_ms: float) -> None:
        """A user's turn was judged over after ``silence_ms`` of silence (audio time)."""

    def response(self, response_id: str, started_at: float, *, in_band: bool, trigger: str | None, last_item_id: str | None) -> ResponseTrace:
        """A response triggered at ``started_at`` (``time.perf_counter()``) by ``trigger``
        (``response.create``) or, None, by the session itself (a turn's end, the idle timeout, an
        approval): it answers the turn last judged over when that turn's item is
        ``last_item_id``, the conversation's last item."""
        return NO_RESPONSE

    def transcription(self, item_id: str) -> CallTrace:
        return NO_CALL

    def close(self) -> None:
        pass


NO_CALL = CallTrace()
NO_RESPONSE = ResponseTrace()
NO_SESSION = SessionTrace()


class Tracing:
    """A server's tracing; this base is off (``configure`` gives the one the settings ask for)."""

    enabled = False

    def session(self, session_id: str, *, transport: str, pipeline: str) -> SessionTrace:
        return NO_SESSION

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        pass


NO_TRACING = Tracing()


# ---------------------------------------------------------------------------------------------
# Settings: the config's section over the standard environment
# ---------------------------------------------------------------------------------------------

PROTOCOLS = ("http/protobuf", "grpc")


@dataclass(frozen=True)
class Settings:
    endpoint: str | None  # None: the exporter reads the environment's
    protocol: str
    service_name: str
    sample_ratio: float | None  # None: OTEL_TRACES_SAMPLER (default parentbased_always_on)
    max_queue_spans: int
    export_timeout_s: float | None


def settings(config: TracingConfig, environ: dict[str, str] | os._Environ[str] = os.environ) -> Settings | None:
    """What to export where, or None when tracing is off. ``ValueError`` for a protocol this
    server cannot speak."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or not config.enabled:
        return None
    env_endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not (config.endpoint or env_endpoint) or environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    protocol = config.protocol or environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    if protocol not in PROTOCOLS:
        raise ValueError(f"tracing: OTLP protocol {protocol!r} is not supported (use one of {', '.join(PROTOCOLS)})")
    service = config.service_name or environ.get("OTEL_SERVICE_NAME") or "realtime-omni"
    return Settings(config.endpoint, protocol, service, config.sample_ratio, config.max_queue_spans, config.export_timeout_s)



class Exporter(Protocol):
    """What makes the hooks that export spans as ``settings`` say (host/otel_tracing.py's ``OtelTracing``)."""

    def __call__(self, settings: Settings, /) -> Tracing: ...


def no_exporter(settings: Settings) -> Tracing:
    """A server composed without an exporter: its traces stay off, and it says so."""
    log.warning("traces: an OTLP endpoint is set, but this server has no exporter for it; no spans leave")
    return NO_TRACING


def configure(config: TracingConfig, export: Exporter, environ: dict[str, str] | os._Environ[str] = os.environ) -> Tracing:
    """The server's tracing: off (``NO_TRACING``, nothing imported) unless an endpoint is set."""
    chosen = settings(config, environ)
    if chosen is None:
        return NO_TRACING
    return export(chosen)
