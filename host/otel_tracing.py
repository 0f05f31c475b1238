"""Per-turn traces exported with the OpenTelemetry SDK: the ``Exporter`` of realtime_omni/tracing.py,
which holds the hooks, the span tree and the settings (the server is handed ``OtelTracing`` in app.py).

Spans are made by one ``TracerProvider`` per server (never the process's global one: several
servers share a test process) and leave through a ``BatchSpanProcessor``, whose queue is bounded
(``max_queue_spans``: a full queue drops new spans, an unreachable collector costs the sessions
nothing but those spans); ``Tracing.shutdown`` flushes it when the server stops. The SDK is
imported only once traces are on.

The stage times are the ones /metrics and the timings log already take (``StageTimes``, the run's
``Outcome``): the stage spans are written when the response ends, with those times, no clock of
their own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from realtime_omni.tracing import NO_SESSION, CallTrace, ResponseTrace, SessionTrace, Settings, Tracing
from realtime_omni.tracing import configure as configure_tracing

if TYPE_CHECKING:
    from realtime_omni.config import TracingConfig

log = logging.getLogger(__name__)

MAX_METADATA_KEYS = 16  # of a session's ``tracing.metadata`` put on its span
MAX_VALUE_CHARS = 512
# spans per export: the export encodes them holding the GIL, so a small batch keeps each pause of
# the event loop short (512, the SDK default, took p99 of bench ws_overhead from 5.8 to 13 ms)
EXPORT_BATCH = 64


_offset_taken = -1e9  # when (perf_counter) the offset below was taken
_offset_ns = 0  # wall clock ns - perf_counter ns, then


def _ns(perf: float) -> int:
    """A ``time.perf_counter()`` reading (the clock the session's timings use) as nanoseconds since
    the epoch (what spans carry). The offset between the two clocks is taken again each minute, so
    a wall clock that steps is followed; readings converted together are exactly consistent."""
    global _offset_taken, _offset_ns
    if perf - _offset_taken > 60.0:
        _offset_taken, _offset_ns = time.perf_counter(), time.time_ns() - time.perf_counter_ns()
    return _offset_ns + int(perf * 1e9)


def _now() -> int:
    return _ns(time.perf_counter())




def configure(config: TracingConfig, environ: dict[str, str] | os._Environ[str] = os.environ) -> Tracing:
    """The tracing a server with this exporter gets: off unless an endpoint is set."""
    return configure_tracing(config, OtelTracing, environ)


def _exporter(s: Settings) -> Any:
    kwargs: dict[str, Any] = {}
    if s.export_timeout_s is not None:
        kwargs["timeout"] = s.export_timeout_s
    if s.protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
        except ImportError:
            raise ValueError("tracing: OTLP over grpc needs the package opentelemetry-exporter-otlp-proto-grpc (or use http/protobuf)") from None
        if s.endpoint:
            kwargs["endpoint"] = s.endpoint
        return GrpcExporter(**kwargs)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    if s.endpoint:
        kwargs["endpoint"] = s.endpoint.rstrip("/") + "/v1/traces" if not s.endpoint.rstrip("/").endswith("/v1/traces") else s.endpoint
    return OTLPSpanExporter(**kwargs)


class OtelTracing(Tracing):
    enabled = True

    def __init__(self, s: Settings) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        from realtime_omni import __version__

        self.settings = s
        sampler = ParentBased(TraceIdRatioBased(s.sample_ratio)) if s.sample_ratio is not None else None  # None: the environment's
        resource = Resource.create({"service.name": s.service_name, "service.version": __version__})
        self.provider = TracerProvider(resource=resource, sampler=sampler)
        self.processor = BatchSpanProcessor(_exporter(s), max_queue_size=s.max_queue_spans, max_export_batch_size=min(EXPORT_BATCH, s.max_queue_spans))
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("realtime_omni", __version__)
        where = s.endpoint or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        log.info("traces: OTLP %s to %s as service %s", s.protocol, where, s.service_name)

    def session(self, session_id: str, *, transport: str, pipeline: str) -> SessionTrace:
        span = self.tracer.start_span(
            "realtime.session",
            start_time=_now(),
            attributes={"realtime.session.id": session_id, "realtime.transport": transport, "realtime.pipeline": pipeline},
        )
        if not span.is_recording():  # not sampled: the session costs nothing more
            return NO_SESSION
        return OtelSessionTrace(self.tracer, span, session_id, transport, pipeline)

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Export what is queued and stop, waiting at most ``timeout_s``: past that (a collector that
        does not answer) the exporter's retries are cut short and what is left is dropped. The SDK's
        shutdown blocks, so it runs in a daemon thread of its own that never holds up the exit."""
        stopping = threading.Thread(target=self.processor.shutdown, name="traces-shutdown", daemon=True)
        stopping.start()
        deadline = time.monotonic() + timeout_s
        while stopping.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if stopping.is_alive():
            log.warning("traces: the collector did not take the last spans within %g s; they are dropped", timeout_s)
            self.processor.span_exporter.shutdown()  # ends the retries' waits


def _value(v: Any) -> str | bool | int | float:
    if isinstance(v, (str, bool, int, float)):
        return v[:MAX_VALUE_CHARS] if isinstance(v, str) else v
    return json.dumps(v, default=str)[:MAX_VALUE_CHARS]


class OtelCallTrace(CallTrace):
    def __init__(self, span: Any) -> None:
        self.span = span

    def end(self, error: str | None = None) -> None:
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            self.span.set_status(Status(StatusCode.ERROR, error[:MAX_VALUE_CHARS]))
        self.span.end(end_time=_now())


class OtelSessionTrace(SessionTrace):
    def __init__(self, tracer: Any, span: Any, session_id: str, transport: str, pipeline: str) -> None:
        from opentelemetry.trace import set_span_in_context

        self.tracer = tracer
        self.span = span
        self.context = set_span_in_context(span)
        self.session_id = session_id
        self.common = {"realtime.session.id": session_id, "realtime.transport": transport, "realtime.pipeline": pipeline}
        self._turn_end: tuple[str, float, float] | None = None  # (item id, when judged, silence ms) not yet under a response
        self._tracing: Any = None

    def configure(self, tracing: Any) -> None:
        if tracing == self._tracing:
            return
        self._tracing = tracing
        span = self.span
        if tracing is None:
            return  # (what was set stays: a span's attributes cannot be taken back)
        if tracing == "auto":
            span.set_attribute("realtime.tracing", "auto")
            return
        span.set_attribute("realtime.tracing", "custom")
        for key in ("workflow_name", "group_id"):
            value = getattr(tracing, key, None)
            if isinstance(value, str):
                span.set_attribute(f"realtime.{key}", value[:MAX_VALUE_CHARS])
        metadata = getattr(tracing, "metadata", None)
        if isinstance(metadata, dict):
            for key in list(metadata)[:MAX_METADATA_KEYS]:
                span.set_attribute(f"realtime.metadata.{str(key)[:64]}", _value(metadata[key]))

    def turn_ended(self, item_id: str, silence_ms: float) -> None:
        self._flush_turn_end()
        self._turn_end = (item_id, time.perf_counter(), silence_ms)

    def _turn_end_span(self, context: Any, turn: tuple[str, float, float]) -> None:
        item_id, at, silence_ms = turn
        end = _ns(at)
        span = self.tracer.start_span(
            "realtime.turn_end",
            context=context,
            start_time=end - int(silence_ms * 1e6),
            attributes={"realtime.item.id": item_id, "realtime.turn_end.silence_ms": silence_ms},
        )
        span.end(end_time=end)

    def _flush_turn_end(self) -> None:
        turn, self._turn_end = self._turn_end, None
        if turn is not None:
            self._turn_end_span(self.context, turn)

    def response(self, response_id: str, started_at: float, *, in_band: bool, trigger: str | None, last_item_id: str | None) -> ResponseTrace:
        from opentelemetry.trace import set_span_in_context

        turn = self._turn_end
        if turn is not None and trigger is None and turn[0] == last_item_id:
            self._turn_end = None  # this response answers that turn
            trigger = "turn_end"
        else:
            turn = None
            self._flush_turn_end()
        attributes = {**self.common, "realtime.response.id": response_id, "realtime.response.in_band": in_band, "realtime.response.trigger": trigger or "server"}
        if turn is not None:
            attributes["realtime.item.id"] = turn[0]
        t0 = _ns(started_at)
        span = self.tracer.start_span("realtime.response", context=self.context, start_time=t0, attributes=attributes)
        trace = OtelResponseTrace(self, span, set_span_in_context(span), response_id, t0)
        if turn is not None:
            self._turn_end_span(trace.context, turn)
        return trace

    def transcription(self, item_id: str) -> CallTrace:
        span = self.tracer.start_span("realtime.transcription", context=self.context, start_time=_now(), attributes={"realtime.item.id": item_id})
        return OtelCallTrace(span)

    def close(self) -> None:
        self._flush_turn_end()
        self.span.end(end_time=_now())


class OtelResponseTrace(ResponseTrace):
    def __init__(self, session: OtelSessionTrace, span: Any, context: Any, response_id: str, t0: int) -> None:
        self.session = session
        self.span = span
        self.t0 = t0  # its start (the trigger) in ns: its children's times are offsets from it
        self.context = context
        self.ids = {"realtime.response.id": response_id}  # (each attribute costs every span its encoding: the rest is on the parents)
        self.ended = False  # (a response cancelled as its session closes is both abandoned and finished)

    def _child(self, name: str, attributes: dict[str, Any], start_time: int | None = None) -> Any:
        start = _now() if start_time is None else start_time
        return self.session.tracer.start_span(name, context=self.context, start_time=start, attributes={**self.ids, **attributes})

    def tool_call(self, item_id: str, call_id: str, name: str) -> CallTrace:
        return OtelCallTrace(self._child("realtime.tool_call", {"realtime.item.id": item_id, "realtime.tool.call_id": call_id, "realtime.tool.name": name}))

    def mcp_call(self, item_id: str, server_label: str, name: str) -> CallTrace:
        return OtelCallTrace(self._child("realtime.mcp_call", {"realtime.item.id": item_id, "realtime.mcp.server_label": server_label, "realtime.tool.name": name}))

    def cancelled(self, reason: str) -> None:
        self.span.add_event("realtime.cancel", {"realtime.cancel.reason": reason, "realtime.barge_in": reason == "turn_detected"})

    def abandoned(self) -> None:
        if self.ended:
            return
        self.ended = True
        self.span.set_attribute("realtime.response.status", "abandoned")
        self.span.end(end_time=_now())

    def finished(self, outcome: Any, output_ids: list[str]) -> None:
        if self.ended:
            return
        self.ended = True
        span, started, t0 = self.span, outcome.started_at, self.t0
        for stage, ms in outcome.stage_times.items():  # ms from the trigger; < 0: done ahead (speculation)
            at = t0 + int(ms * 1e6)
            child = self._child(f"realtime.stage.{stage}", {"realtime.stage": stage, "realtime.stage.ms": ms}, start_time=min(t0, at))
            child.end(end_time=max(t0, at))
            span.set_attribute(f"realtime.stage.{stage}_ms", ms)
        first_delta = outcome.first_delta_at
        if first_delta:
            ms = round((first_delta - started) * 1000, 1)
            child = self._child("realtime.first_delta", {"realtime.stage.ms": ms}, start_time=t0)
            child.end(end_time=t0 + int((first_delta - started) * 1e9))
            span.set_attribute("realtime.first_delta_ms", ms)
        if outcome.first_audio_ms is not None:
            span.set_attribute("realtime.first_audio_delta_ms", outcome.first_audio_ms)
        if outcome.cancel_requested_at:
            span.set_attribute("realtime.cancel_ms", round((outcome.done_at - outcome.cancel_requested_at) * 1000, 1))
        for key, value in outcome.stage_info.items():
            span.set_attribute(f"realtime.info.{key}", _value(value))
        usage = outcome.usage
        span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
        span.set_attribute("realtime.response.status", outcome.status)
        span.set_attribute("realtime.response.output_item_ids", output_ids)
        if outcome.status == "failed":
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, "the pipeline failed"))
        span.end(end_time=t0 + int((outcome.done_at - started) * 1e9))
