"""Turn-taking: appends and media frames into the input buffer, the turn detector's events (speech
started / paused / resumed / stopped) into turns, the interruption guard, live captions, and the
client's commits and clears.

A part of the session (see session.py), the one that drives the others: a turn that begins
interrupts the answer playing (barge-in), and one that ends is committed as a user item
(user_input.py) and, with ``create_response``, answered through the responses part, seen here only
as ``Answering``. While a turn is open the pipeline is fed its audio as it comes, and told what
request would follow (``PipelineSession.listen``/``pause``) so it may start early.

The turn-end policy (``TurnEndPolicy``, shared by the server's sessions) says what the silences
mean: where pipelines may start ahead (its ``pause_ms``), semantic_vad's silence per eagerness, and,
with an end-of-turn model, the decision at each check (``check_ms`` into a pause), asked once per
check with the turn's audio and what the pipeline heard. A turn it judges finished ends there; one
judged unfinished waits on for more speech, or for the silence the decision gave it. Until speech
resumes the pipeline is fed nothing past that pause, so whatever the decision the item is exactly
the audio fed and speculation started at the pause stays valid. The decision is awaited before the
next frame is judged (the model runs in its worker thread, not on the loop), so the outcome is the
same however fast the audio comes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from pipelines.base import Judge, ResponseRequest
from pipelines.turn_end.policy import LONGEST_WAIT, Decision, TurnEndPolicy

from ..config import InterruptionGuard
from ..errors import RealtimeError
from ..ids import new_id
from ..protocol import events as ev
from ..protocol.audio import InputConverter, WireFormat, ms_to_samples, wire_bytes
from .config import VadSettings
from .context import SessionContext
from .idle import IdleTimeout
from .playout import Cut, Playout
from .run import Runs
from .transcription import Transcriber
from .turns import (
    ONSET_LOOKBACK_MS,
    EndCheck,
    Paused,
    Quiet,
    Resumed,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
)
from .user_input import UserInput, UserTurn

log = logging.getLogger(__name__)

MIN_COMMIT_MS = 100
ECHO = Decision(0.0, None)  # the interruption guard's short sound over the agent: over at once, nothing weighed


class Answering(Protocol):
    """What turn-taking asks of the responses part."""

    async def start(self, params: ev.ResponseParams, started_at: float) -> Any:
        """Start a response; ``RealtimeError`` when one may not start now."""

    def build_request(self, params: ev.ResponseParams) -> tuple[ResponseRequest, Any]:
        """The pipeline request a response with ``params`` would get now."""

    def cut_playout(self) -> Cut | None: ...

    async def report_cut(self, cut: Cut) -> None: ...


def guard_holds(guard: InterruptionGuard | None, playout: Playout | None, turn: UserTurn, onset: int, end: int, rate: int) -> bool:
    """The interruption guard (config.InterruptionGuard): speech that starts while the
    agent's audio plays becomes a turn (and a barge-in) only once it has lasted
    ``min_speech_ms`` (the detector still hears speech that long after its onset), counted
    from the end of the ``grace_ms`` after the agent started; ``end``: the input buffer's end.
    True when it holds ``turn`` back (its ``held_until`` set)."""
    if guard is None or playout is None or playout.playing is None:
        return False
    grace_left = max(0.0, guard.grace_ms / 1000 - (time.monotonic() - playout.playing_since))
    counts_from = max(onset, end + int(grace_left * rate))
    turn.held_until = max(1, counts_from + ms_to_samples(guard.min_speech_ms, rate))
    return True


class TurnTaking:
    def __init__(
        self,
        ctx: SessionContext,
        user: UserInput,
        answering: Answering,
        runs: Runs,
        idle: IdleTimeout,
        transcriber: Transcriber,
        *,
        playout: Playout | None,
        guard: InterruptionGuard | None,
        turn_end: TurnEndPolicy,
    ) -> None:
        self.ctx = ctx
        self.user = user
        self.answering = answering
        self.runs = runs
        self.idle = idle
        self.transcriber = transcriber
        self.playout = playout
        self.guard = guard  # telephony: see ``guard_holds``
        self.turn_end = turn_end
        self.detector: TurnDetector | None = None
        self._told: Judge | None = None  # what the pipeline was told (judge_words): nothing, until semantic_vad
        self._input = InputConverter(ctx.config.input_format, ctx.caps.input_rate)
        self.reset_detector()

    # ------------------------------------------------------------------ settings

    def set_input_format(self, fmt: WireFormat) -> None:
        self._input = InputConverter(fmt, self.ctx.caps.input_rate)

    def detection(self, vad: VadSettings | None) -> object:
        """What turn detection with ``vad`` does here: two settings that do the same (semantic_vad's
        ``auto`` and ``medium``, whose meaning is the policy's) compare equal."""
        if vad is None or vad.eagerness is None:
            return vad
        policy = self.turn_end
        return replace(vad, eagerness=None, silence_duration_ms=policy.silence_ms(vad.eagerness)), policy.eagerness(vad.eagerness)

    def vad_changed(self) -> None:
        """session.update changed turn detection: an open turn is dropped, with its audio."""
        if self.user.turn is not None:
            self.ctx.pipe.clear()
            self.user.buffer.clear()
        self.reset_detector()
        self.idle.cancel()

    def reset_detector(self) -> None:
        """A fresh detector (new settings, a commit/clear mid-turn); an open turn is abandoned. It
        counts from the buffer's end, so its positions stay those of the session's input."""
        ctx = self.ctx
        self.user.turn = None
        vad, policy = ctx.config.vad, self.turn_end
        origin = self.user.buffer.end
        pause_ms = policy.config.pause_ms
        if vad is None:
            self.detector = None
        elif vad.eagerness is not None:  # semantic_vad: its silences are the policy's
            settings = replace(vad, silence_duration_ms=policy.silence_ms(vad.eagerness))
            check = policy.config.check_ms if policy.judges(vad.eagerness) else None
            self.detector = TurnDetector(settings, ctx.caps.input_rate, pause_ms, check_ms=check, origin=origin)
        else:
            self.detector = TurnDetector(vad, ctx.caps.input_rate, pause_ms, origin=origin)
        # semantic_vad's decision weighs a judgement of the words: ask for the policy's at each pause
        judge = policy.judge(vad.eagerness) if vad is not None else None  # (None: no checks)
        if judge != self._told:
            self._told = judge
            ctx.pipe.judge_words(judge)

    # ------------------------------------------------------------------ audio in

    async def on_append(self, e: ev.InputAudioBufferAppend) -> None:
        ctx = self.ctx
        if "audio" not in ctx.caps.input_modalities:
            raise RealtimeError(f"The '{ctx.caps.name}' pipeline does not take audio input.", code="unsupported_value", param="audio")
        if len(e.audio) * 3 // 4 > ctx.limits.max_append_bytes:
            limit = ctx.limits.max_append_bytes / (1024 * 1024)
            raise RealtimeError(
                f"Invalid 'audio': one append may carry at most {limit:g} MiB of audio; split it into smaller appends.",
                code="string_above_max_length",
                param="audio",
            )
        await self.push_audio(self._input(wire_bytes(e.audio, ctx.config.input_format, "audio")))

    async def push_audio(self, pcm: np.ndarray) -> None:
        """Audio at the pipeline's input rate, from an append or a media transport."""
        if not len(pcm):
            return
        ctx, user = self.ctx, self.user
        if user.turn is None and self.detector is not None:
            self._forget_silence()  # a buffer filled without VAD (manual turns) makes room here too
        if len(pcm) > user.buffer.room():
            if user.turn is None or self.detector is None:
                raise RealtimeError(
                    f"The input audio buffer is full ({ctx.limits.max_buffer_seconds:g} s); commit or clear it.",
                    code="input_audio_buffer_full",
                )
            await self._end_turn_now()  # a turn longer than the buffer: end it here
        user.buffer.append(pcm)
        if self.detector is None:
            ctx.pipe.feed(pcm)
            return
        detector = self.detector
        for event in detector.events(pcm):
            if isinstance(event, SpeechStarted):
                await self._speech_started(event)
            elif isinstance(event, Quiet):
                user.feed_to(event.at)
                ctx.pipe.quiet()
            elif isinstance(event, Paused):
                user.feed_to(event.at)
                ctx.pipe.pause(*self._turn_context())
                self._caption(event.at)
            elif isinstance(event, Resumed):
                if user.turn is not None:
                    user.turn.hold = None
                user.feed_to(event.at)
                ctx.pipe.resume()
            elif isinstance(event, EndCheck):
                await self._end_check(detector, event)
            elif isinstance(event, SpeechStopped):
                await self._speech_stopped(event.end)
            if self.detector is not detector:  # reset while a verdict was awaited (clear, commit, update)
                break
        turn = user.turn
        if turn is not None and turn.held_until and self.detector is not None and self.detector.last_speech_end >= turn.held_until:
            turn.held_until = 0  # still speaking that long after it began: real speech, not echo
            await self._begin_turn(turn)
        turn = user.turn
        if turn is not None:
            user.feed_to(user.buffer.end if turn.hold is None else turn.hold)
            if user.buffer.end - turn.captioned >= ms_to_samples(ctx.caps.caption_every_ms, ctx.caps.input_rate):
                self._caption(user.buffer.end)
        elif self.detector is not None:  # (None: a session.update to manual turns while a verdict was awaited)
            self._forget_silence()

    def _forget_silence(self) -> None:
        """VAD and no turn: keep only what a turn detected now (or an idle timeout) would need. Its
        onset can lie up to the detector's onset window back, and the turn keeps prefix padding
        before that."""
        assert self.detector is not None
        buffer = self.user.buffer
        keep_ms = self.detector.settings.prefix_padding_ms + ONSET_LOOKBACK_MS + 40
        pos = buffer.end - ms_to_samples(keep_ms, self.ctx.caps.input_rate)
        if self.idle.since is not None:
            pos = max(min(pos, self.idle.since), buffer.end - buffer.max_samples // 2)
        buffer.drop_before(pos)

    # ------------------------------------------------------------------ turns

    async def _speech_started(self, e: SpeechStarted) -> None:
        self.idle.cancel()
        start = max(e.start, self.user.buffer.start)  # its padding never reaches into audio already committed or cleared
        self.user.turn = turn = UserTurn(new_id("item"), start, start)
        if not guard_holds(self.guard, self.playout, turn, e.onset, self.user.buffer.end, self.ctx.caps.input_rate):
            await self._begin_turn(turn)

    def _caption(self, at: int) -> None:
        """A caption pass over the open turn up to ``at``, unless one is under way. Only when
        input transcription is on."""
        turn = self.user.turn
        if turn is None or turn.held_until or not self.transcriber.captioning:
            return
        turn.captioned = at
        if turn.captioning is not None and not turn.captioning.done():
            return
        pcm = self.user.buffer.slice(turn.start, at)
        turn.captioning = self.transcriber.caption(turn.item_id, pcm, lambda: self.user.turn is turn)

    async def _begin_turn(self, turn: UserTurn) -> None:
        vad = self.ctx.config.vad
        interrupt = vad is not None and vad.interrupt_response
        barge_in = self.runs.active if interrupt else None
        cut = self.answering.cut_playout() if interrupt else None
        if barge_in is not None:
            barge_in.mute()  # not one more sample of it after speech_started
        await self.ctx.emit(ev.InputAudioBufferSpeechStarted(audio_start_ms=self.ctx.ms(turn.start), item_id=turn.item_id))
        if cut is not None:
            await self.answering.report_cut(cut)
        if barge_in is not None:
            await barge_in.cancel("turn_detected")
        self.ctx.pipe.listen(*self._turn_context())

    async def _speech_stopped(self, end: int) -> None:
        ctx, user = self.ctx, self.user
        turn = user.turn
        if turn is None:
            return
        if turn.held_until:  # too short to be the caller talking over the agent: ignore it
            user.turn = None
            ctx.pipe.clear()
            user.buffer.drop_before(end)
            return
        user.feed_to(end)  # the turn's last audio, before the turn closes
        user.turn = None
        ctx.trace.turn_ended(turn.item_id, ctx.ms(user.buffer.end - (self.detector.last_speech_end if self.detector else end)))  # the silence waited
        await ctx.emit(ev.InputAudioBufferSpeechStopped(audio_end_ms=ctx.ms(end), item_id=turn.item_id))
        await user.commit(turn.item_id, turn.start, end)
        vad = ctx.config.vad
        if vad is not None and vad.create_response and self.runs.active is None and ctx.config.responds:
            await self.answering.start(ev.ResponseParams(), started_at=time.perf_counter())

    async def _end_check(self, detector: TurnDetector, e: EndCheck) -> None:
        """semantic_vad: a pause long enough to ask the turn-end policy. A turn it judges finished
        ends here; one it gives more time (``Decision.ends_after_ms``) ends after that much
        silence, unless speech comes first; otherwise the eagerness's longest wait ends it."""
        turn = self.user.turn
        if turn is None:
            return
        self.user.feed_to(e.at)
        turn.hold = e.at
        if turn.held_until:  # a short sound over the agent's voice (interruption guard), not a turn
            decision = ECHO
        else:
            decision = await self._judge(turn, e.at)
        if self.user.turn is not turn or self.detector is not detector:
            return
        if decision.finished:
            detector.end_turn()
            await self._speech_stopped(e.at)
        elif decision.ends_after_ms is not None:
            detector.end_after(decision.ends_after_ms)

    async def _judge(self, turn: UserTurn, end: int) -> Decision:
        """The policy's decision at a check ending at ``end``."""
        ctx, policy, vad = self.ctx, self.turn_end, self.ctx.config.vad
        if vad is None or vad.eagerness is None or not policy.judges(vad.eagerness):
            return LONGEST_WAIT
        rate, buffer = ctx.caps.input_rate, self.user.buffer
        pcm = buffer.slice(policy.window(max(turn.start, buffer.start), end, rate), end)
        try:
            decision = await policy.decide(pcm, rate, vad.eagerness, ctx.pipe.heard, name=ctx.id)
        except Exception:  # a broken model must not end the session: the turn waits for the longest wait
            log.exception("session %s: the end-of-turn decision failed", ctx.id)
            return LONGEST_WAIT
        if decision.verdict is not None:
            ctx.metrics.end_of_turn(decision.finished, decision.verdict.cpu_ms)
        return decision

    def _turn_context(self) -> tuple[ResponseRequest | None, bool]:
        """The request a response would get if the open turn ended now (its items: the conversation
        before the turn; None when the session cannot say), and whether one follows by itself. The
        pipeline hears the turn in that context either way (semantic_vad needs the words even when
        the client makes its own responses), and answers ahead only when one follows."""
        cfg = self.ctx.config
        vad = cfg.vad
        if vad is None or not self.ctx.open:
            return None, False
        answer = vad.create_response and self.runs.active is None and cfg.responds
        try:
            return self.answering.build_request(ev.ResponseParams())[0], answer
        except RealtimeError:
            return None, False  # a response itself will report it

    async def _end_turn_now(self) -> None:
        """A turn longer than the input buffer: it ends where the buffer is full, and a fresh
        detector hears the rest of the speech as a turn of its own."""
        await self._speech_stopped(self.user.buffer.end)
        self.reset_detector()

    # ------------------------------------------------------------------ the client's commits and clears

    async def on_commit(self, e: ev.InputAudioBufferCommit) -> None:
        user, buffer = self.user, self.user.buffer
        tail = self._input.flush()
        if len(tail) and len(tail) <= buffer.room():
            buffer.append(tail)
            if user.turn is not None or self.detector is None:
                self.ctx.pipe.feed(tail)
        if buffer.duration_ms < MIN_COMMIT_MS:
            raise RealtimeError(
                f"Error committing input audio buffer: buffer too small. Expected at least {MIN_COMMIT_MS}ms of audio, "
                f"but buffer only has {buffer.duration_ms:.2f}ms of audio.",
                code="input_audio_buffer_commit_empty",
            )
        turn = user.turn
        if turn is not None:  # the turn under way: its item, from where speech_started said it starts
            user.feed_to(buffer.end)
            self.reset_detector()
        await user.commit(turn.item_id if turn else new_id("item"), turn.start if turn else buffer.start, buffer.end)

    async def on_clear(self, e: ev.InputAudioBufferClear) -> None:
        self._input.flush()
        self.user.buffer.clear()
        self.ctx.pipe.clear()
        self.reset_detector()
        await self.ctx.emit(ev.InputAudioBufferCleared())
