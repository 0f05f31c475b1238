"""Responses: ``response.create`` (per-response parameters over the session's, in-band or out of
band), ``response.cancel``, ``output_audio_buffer.clear``, and the bookkeeping when a run ends.

A part of ``Session`` (see session.py). One run (run.py) per response; at most one in-band
response at a time, and ``limits.max_out_of_band`` out-of-band ones.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from msgspec import UNSET

from pipelines.base import ResponseRequest, Tool

from ..errors import RealtimeError, invalid_value
from ..ids import new_id
from ..protocol import events as ev
from ..tasks import create_task
from . import config as sc
from .conversation import from_wire
from .run import EventAudio, Outcome, PacedAudio, ResponseRun

log = logging.getLogger(__name__)


class ResponseHandling:
    async def _on_response_create(self, e: ev.ResponseCreate) -> None:
        if not self.config.responds:
            raise RealtimeError(
                "This is a transcription session: it transcribes the input audio and creates no responses.",
                code="unsupported_value",
                param="session.type",
            )
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
        run.task = create_task(self._respond(run), name=f"response:{run.id}")
        return run

    async def _respond(self, run: ResponseRun) -> None:
        self._finished(run, await run.run())

    def _build_run(self, params: ev.ResponseParams, in_band: bool, started_at: float) -> ResponseRun:
        request, out = self._build_request(params)
        wire_format = sc.wire_format(out.format)
        audio_out = PacedAudio(self.playout, self.caps.output_rate) if self.playout else EventAudio(self, self.caps.output_rate, wire_format)
        return ResponseRun(
            self,
            request,
            self.pipe.respond(request),
            audio_out,
            in_band=in_band,
            output_format=wire_format,
            voice=out.voice,
            max_output_tokens=out.max_output_tokens,
            metadata=params.metadata if params.metadata is not UNSET else None,
            started_at=started_at,
            stage_timeout_s=self.limits.stage_timeout_s,
        )

    def _build_request(self, params: ev.ResponseParams) -> tuple[ResponseRequest, sc.OutputChoice]:
        """The pipeline request for ``params`` over this session's settings, and the output settings
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
        return request, out

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
