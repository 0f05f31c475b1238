"""Prometheus metrics. One registry per server, so several servers can live in one process (tests)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily

from .protocol.events import CLIENT_EVENT_TYPES

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


log = logging.getLogger(__name__)


class Metrics:
    def __init__(self, timings_log: str | None = None) -> None:
        self.timings_log = Path(timings_log) if timings_log else None
        self.timings_lost = 0  # records the timings log could not take
        self._timings_failing = False
        self.registry = r = CollectorRegistry()
        self.sessions_active = Gauge("realtime_sessions_active", "Sessions open now", registry=r)
        self.sessions_total = Counter("realtime_sessions", "Sessions opened", ["transport"], registry=r)
        self.sessions_rejected = Counter("realtime_sessions_rejected", "Sessions refused", ["reason"], registry=r)
        self.resumes = Counter("realtime_session_resumes", "Resumes asked for (WebSocket upgrades and WebRTC offers), by outcome", ["outcome"], registry=r)
        self.keys_minted = Counter("realtime_ephemeral_keys_minted", "Ephemeral keys minted by this process", registry=r)
        self.events_in = Counter("realtime_client_events", "Client events received", ["type"], registry=r)
        self.events_out = Counter("realtime_server_events", "Server events sent", ["type"], registry=r)
        self.errors = Counter("realtime_errors", "Error events sent", ["code"], registry=r)
        self.responses = Counter("realtime_responses", "Responses finished", ["status"], registry=r)
        self.first_audio = Histogram(
            "realtime_response_first_audio_seconds",
            "From the response trigger (turn commit or response.create) to its first audio delta",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.response_duration = Histogram(
            "realtime_response_duration_seconds", "From response.created to response.done", buckets=LATENCY_BUCKETS, registry=r
        )
        self.cancel_latency = Histogram(
            "realtime_cancel_seconds", "From a cancel request (barge-in, response.cancel) to response.done", buckets=LATENCY_BUCKETS, registry=r
        )
        self.stage_seconds = Histogram(
            "realtime_stage_seconds",
            "From the response trigger to each pipeline stage's first output (stages done ahead, speculatively, count as 0)",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.end_of_turn_decisions = Counter(
            "realtime_end_of_turn_decisions", "semantic_vad: the end-of-turn model's verdicts at pauses", ["verdict"], registry=r
        )
        self.end_of_turn_cpu = Histogram(
            "realtime_end_of_turn_cpu_seconds",
            "semantic_vad: the end-of-turn model's CPU time per decision",
            buckets=(0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.5),
            registry=r,
        )
        self._in = {t: self.events_in.labels(t) for t in CLIENT_EVENT_TYPES}
        self._in_unknown = self.events_in.labels("invalid")
        self._out: dict[str, Counter] = {}

    def watch_pipeline(self, stats: Callable[[], dict[str, float]]) -> None:
        """Publish the pipeline's own accounting (``Pipeline.stats``) as ``realtime_pipeline_<name>``."""

        class PipelineCollector:
            def collect(self) -> Iterator[GaugeMetricFamily]:
                for name, value in stats().items():
                    yield GaugeMetricFamily(f"realtime_pipeline_{name}", f"Pipeline statistic {name}", value=value)

        self.registry.register(PipelineCollector())

    def end_of_turn(self, finished: bool, cpu_ms: float) -> None:
        self.end_of_turn_decisions.labels("finished" if finished else "unfinished").inc()
        self.end_of_turn_cpu.observe(cpu_ms / 1000.0)

    def event_in(self, kind: str | None) -> None:
        self._in.get(kind or "", self._in_unknown).inc()

    def event_out(self, kind: str) -> None:
        counter = self._out.get(kind)
        if counter is None:
            counter = self._out[kind] = self.events_out.labels(kind)
        counter.inc()

    def response_timings(self, record: dict[str, Any]) -> None:
        """One finished response's timings: per-stage histograms, and a JSON line in the timings
        log when one is configured (``timings_log``), for offline analysis."""
        for stage, ms in record.get("stages", {}).items():
            self.stage_seconds.labels(stage).observe(max(0.0, ms / 1000.0))
        if self.timings_log is not None:
            try:
                with open(self.timings_log, "a") as f:
                    f.write(json.dumps(record) + "\n")
            except OSError as exc:  # a full disk, a read-only mount: the responses go on without it
                self.timings_lost += 1
                if not self._timings_failing:  # once per outage, not once per response
                    log.warning("cannot write the timings log %s (%s); records are dropped until it can be written again", self.timings_log, exc)
                self._timings_failing = True
            else:
                if self._timings_failing:
                    log.warning("the timings log %s is written again (%d records were dropped)", self.timings_log, self.timings_lost)
                self._timings_failing = False

    def render(self) -> bytes:
        return generate_latest(self.registry)
