"""Input audio and turn-taking: appends and media frames into the input buffer, the turn detector's
events (speech started / paused / resumed / stopped) into turns, the interruption guard, commits
and clears, input transcription, and the idle timeout that prompts a silent user.

A part of ``Session`` (see session.py): it owns the buffer, the detector, the open turn and the
idle timer, and ends a turn by committing a user item and, with ``create_response``, starting a
response (``ResponseHandling``).

semantic_vad with an end-of-turn model (``Session.turn_model``, a port the server injects): at each
pause of ``Limits.end_of_turn_silence_ms`` the turn's audio goes to the model, and a turn it judges
finished ends there; one judged unfinished waits on for more speech, or for the eagerness's longest
wait. Until speech resumes the pipeline is fed nothing past that pause, so whatever the verdict the
item is exactly the audio fed and speculation started at the pause stays valid. The verdict is
awaited before the next frame is judged (it runs in the model's worker thread, not on the loop), so
the outcome is the same however fast the audio comes.
"""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np

from pipelines.base import Message, Part, ResponseRequest

from ..errors import RealtimeError
from ..ids import new_id
from ..protocol import events as ev
from ..protocol.audio import ms_to_samples, wire_bytes
from .captions import Captions
from .conversation import to_wire
from .run import Outcome
from .turns import (
    ONSET_LOOKBACK_MS,
    EndCheck,
    Paused,
    Resumed,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
)

log = logging.getLogger(__name__)

from dataclasses import dataclass, replace

MIN_COMMIT_MS = 100
CAPTION_EVERY_MS = 1000  # in speech without pauses, a caption pass at most this often
MAX_CAPTIONED_TURNS = 8  # turns whose captions await their final transcript


@dataclass
class UserTurn:
    """The user's turn in progress (server VAD): the item it will become and what was fed."""

    item_id: str
    start: int
    fed: int
    held_until: int = 0  # interruption guard: not yet a turn until the buffer reaches this position
    hold: int | None = None  # semantic_vad: fed up to this pause, waiting for a verdict or more speech
    captioned: int = 0  # buffer position of the last caption pass
    captioning: asyncio.Task[None] | None = None


class InputHandling:
    async def _on_append(self, e: ev.InputAudioBufferAppend) -> None:
        fmt = self.config.input_format
        if "audio" not in self.caps.input_modalities:
            raise RealtimeError(f"The '{self.caps.name}' pipeline does not take audio input.", code="unsupported_value", param="audio")
        if len(e.audio) * 3 // 4 > self.limits.max_append_bytes:
            limit = self.limits.max_append_bytes / (1024 * 1024)
            raise RealtimeError(
                f"Invalid 'audio': one append may carry at most {limit:g} MiB of audio; split it into smaller appends.",
                code="string_above_max_length",
                param="audio",
            )
        await self.push_audio(self._input(wire_bytes(e.audio, fmt, "audio")))

    def camera_frame(self, data_url: str) -> None:
        """The camera's latest frame (a media transport samples it); it goes with the user's next turn."""
        self._video_frame = data_url

    async def dtmf(self, digit: str) -> None:
        """A key the caller pressed (telephony)."""
        await self.emit(ev.InputAudioBufferDtmfEventReceived(event=digit, received_at=int(time.time())))

    async def push_audio(self, pcm: np.ndarray) -> None:
        """Audio at the pipeline's input rate, from an append or a media transport."""
        if not len(pcm):
            return
        if self._turn is None and self.detector is not None:
            self._forget_silence()  # a buffer filled without VAD (manual turns) makes room here too
        if len(pcm) > self.buffer.room():
            if self._turn is None or self.detector is None:
                raise RealtimeError(
                    f"The input audio buffer is full ({self.limits.max_buffer_seconds:g} s); commit or clear it.",
                    code="input_audio_buffer_full",
                )
            await self._end_turn_now()  # a turn longer than the buffer: end it here
        self.buffer.append(pcm)
        if self.detector is None:
            self.pipe.feed(pcm)
            return
        detector = self.detector
        for event in detector.events(pcm):
            if isinstance(event, SpeechStarted):
                await self._speech_started(event)
            elif isinstance(event, Paused):
                self._feed_to(event.at)
                self.pipe.pause(self._speculative_request())
                self._caption(event.at)
            elif isinstance(event, Resumed):
                if self._turn is not None:
                    self._turn.hold = None
                self._feed_to(event.at)
                self.pipe.resume()
            elif isinstance(event, EndCheck):
                await self._end_check(detector, event)
            elif isinstance(event, SpeechStopped):
                await self._speech_stopped(event.end)
            if self.detector is not detector:  # reset while a verdict was awaited (clear, commit, update)
                break
        turn = self._turn
        if turn is not None and turn.held_until and self.detector is not None and self.detector.last_speech_end >= turn.held_until:
            turn.held_until = 0  # still speaking that long after it began: real speech, not echo
            await self._begin_turn(turn)
        if self._turn is not None:
            self._feed_to(self.buffer.end if self._turn.hold is None else self._turn.hold)
            if self.buffer.end - self._turn.captioned >= ms_to_samples(CAPTION_EVERY_MS, self.caps.input_rate):
                self._caption(self.buffer.end)
        elif self.detector is not None:  # (None: a session.update to manual turns while a verdict was awaited)
            self._forget_silence()

    def _forget_silence(self) -> None:
        """VAD and no turn: keep only what a turn detected now (or an idle timeout) would need. Its
        onset can lie up to the detector's onset window back, and the turn keeps prefix padding
        before that."""
        assert self.detector is not None
        keep_ms = self.detector.settings.prefix_padding_ms + ONSET_LOOKBACK_MS + 40
        keep = ms_to_samples(keep_ms, self.caps.input_rate)
        pos = self.buffer.end - keep
        if self._idle_from is not None:
            pos = max(min(pos, self._idle_from), self.buffer.end - self.buffer.max_samples // 2)
        self.buffer.drop_before(pos)

    def _feed_to(self, pos: int) -> None:
        turn = self._turn
        if turn is not None and pos > turn.fed:
            self.pipe.feed(self.buffer.slice(turn.fed, pos))
            turn.fed = pos

    async def _speech_started(self, e: SpeechStarted) -> None:
        self._cancel_idle_timer()
        start = max(e.start, self.buffer.start)  # its padding never reaches into audio already committed or cleared
        self._turn = turn = UserTurn(new_id("item"), start, start)
        if not self._guard_holds(turn, e.onset):
            await self._begin_turn(turn)

    def _guard_holds(self, turn: UserTurn, onset: int) -> bool:
        """The interruption guard (config.InterruptionGuard): speech that starts while the
        agent's audio plays becomes a turn (and a barge-in) only once it has lasted
        ``min_speech_ms`` (the detector still hears speech that long after its onset), counted
        from the end of the ``grace_ms`` after the agent started."""
        guard, playout = self.media.interruption_guard, self.playout
        if guard is None or playout is None or playout.playing is None:
            return False
        rate = self.caps.input_rate
        grace_left = max(0.0, guard.grace_ms / 1000 - (time.monotonic() - self._agent_since))
        counts_from = max(onset, self.buffer.end + int(grace_left * rate))
        turn.held_until = max(1, counts_from + ms_to_samples(guard.min_speech_ms, rate))
        return True

    # ------------------------------------------------------------------ live captions

    def _caption(self, at: int) -> None:
        """A caption pass over the open turn up to ``at``, unless one is under way (session.captions
        has the rules). Only when input transcription is on."""
        turn = self._turn
        if turn is None or turn.held_until or not self.caps.transcribes_input or self.config.transcription is None:
            return
        turn.captioned = at
        if turn.captioning is not None and not turn.captioning.done():
            return
        if turn.item_id not in self._captions:
            self._captions[turn.item_id] = Captions()
            while len(self._captions) > MAX_CAPTIONED_TURNS:
                self._captions.popitem(last=False)
        turn.captioning = self.tasks.spawn(self._run_caption(turn, self.buffer.slice(turn.start, at)), "caption")

    async def _run_caption(self, turn: UserTurn, pcm: np.ndarray) -> None:
        try:
            text = await self.pipe.caption(pcm)
        except Exception:
            log.exception("caption pass of %s failed", turn.item_id)
            return
        captions = self._captions.get(turn.item_id)
        if text is None or captions is None or self._turn is not turn:  # the turn ended meanwhile
            return
        delta = captions.hear(text)
        if delta:
            await self.emit(ev.InputTranscriptionDelta(item_id=turn.item_id, content_index=0, delta=delta))

    async def _begin_turn(self, turn: UserTurn) -> None:
        vad = self.config.vad
        interrupt = vad is not None and vad.interrupt_response
        barge_in = self.active if interrupt else None
        cut = self._cut_playout() if interrupt else None
        if barge_in is not None:
            barge_in.mute()  # not one more sample of it after speech_started
        await self.emit(ev.InputAudioBufferSpeechStarted(audio_start_ms=self.ms(turn.start), item_id=turn.item_id))
        if cut is not None:
            await self._report_cut(cut)
        if barge_in is not None:
            await barge_in.cancel("turn_detected")
        self.pipe.listen(self._speculative_request())

    async def _speech_stopped(self, end: int) -> None:
        turn = self._turn
        if turn is None:
            return
        if turn.held_until:  # too short to be the caller talking over the agent: ignore it
            self._turn = None
            self.pipe.clear()
            self.buffer.drop_before(end)
            return
        self._feed_to(end)  # the turn's last audio, before the turn closes
        self._turn = None
        await self.emit(ev.InputAudioBufferSpeechStopped(audio_end_ms=self.ms(end), item_id=turn.item_id))
        await self._commit(turn.item_id, turn.start, end)
        vad = self.config.vad
        if vad is not None and vad.create_response and self.active is None and self.config.responds:
            await self._start_response(ev.ResponseParams(), started_at=time.perf_counter())

    async def _end_check(self, detector: TurnDetector, e: EndCheck) -> None:
        """semantic_vad: a pause long enough to ask the end-of-turn model."""
        turn = self._turn
        if turn is None:
            return
        self._feed_to(e.at)
        turn.hold = e.at
        if turn.held_until:  # a short sound over the agent's voice (interruption guard), not a turn
            finished = True
        else:
            finished = await self._judge(turn, e.at)
        if finished and self._turn is turn and self.detector is detector:
            detector.end_turn()
            await self._speech_stopped(e.at)

    async def _judge(self, turn: UserTurn, end: int) -> bool:
        model, vad = self.turn_model, self.config.vad
        if model is None or vad is None or vad.end_of_turn is None:
            return False
        rate = self.caps.input_rate
        pcm = self.buffer.slice(max(turn.start, self.buffer.start, end - int(model.max_seconds * rate)), end)
        try:
            verdict = await model.judge(pcm, rate, self.pipe.partial_transcript())
        except Exception:  # a broken model must not end the session: the turn waits for the longest wait
            log.exception("session %s: the end-of-turn model failed", self.id)
            return False
        finished = verdict.probability >= vad.end_of_turn.threshold
        self.metrics.end_of_turn(finished, verdict.cpu_ms)
        return finished

    def _speculative_request(self) -> ResponseRequest | None:
        """The request a response would get if the open turn ended now (its items: the conversation
        before the turn), or None when none would follow automatically."""
        vad = self.config.vad
        if vad is None or not vad.create_response or self.active is not None or self.ending or not self.config.responds:
            return None
        try:
            return self._build_request(ev.ResponseParams())[0]
        except RealtimeError:
            return None  # the response itself will report it

    async def _end_turn_now(self) -> None:
        """A turn longer than the input buffer: it ends where the buffer is full, and a fresh
        detector hears the rest of the speech as a turn of its own."""
        await self._speech_stopped(self.buffer.end)
        self._reset_detector()

    async def _commit(self, item_id: str, start: int, end: int) -> None:
        pcm = self.buffer.slice(start, end)
        self.buffer.drop_before(end)
        self.pipe.commit(item_id)
        parts = [Part("audio", audio=pcm)]
        if self._video_frame is not None and self.caps.images:
            parts.append(Part("image", image_url=self._video_frame))  # what the camera showed as the turn ended
            self._video_frame = None
        item = Message(item_id, "user", parts)
        previous = self.add_item(item)
        await self.emit(ev.InputAudioBufferCommitted(previous_item_id=previous, item_id=item_id))
        wire = to_wire(item, self.caps)
        await self.emit(ev.ConversationItemAdded(previous_item_id=previous, item=wire))
        await self.emit(ev.ConversationItemDone(previous_item_id=previous, item=wire))
        self._transcribe(item)

    async def _on_commit(self, e: ev.InputAudioBufferCommit) -> None:
        tail = self._input.flush()
        if len(tail) and len(tail) <= self.buffer.room():
            self.buffer.append(tail)
            if self._turn is not None or self.detector is None:
                self.pipe.feed(tail)
        if self.buffer.duration_ms < MIN_COMMIT_MS:
            raise RealtimeError(
                f"Error committing input audio buffer: buffer too small. Expected at least {MIN_COMMIT_MS}ms of audio, "
                f"but buffer only has {self.buffer.duration_ms:.2f}ms of audio.",
                code="input_audio_buffer_commit_empty",
            )
        turn = self._turn
        if turn is not None:  # the turn under way: its item, from where speech_started said it starts
            self._feed_to(self.buffer.end)
            self._reset_detector()
        await self._commit(turn.item_id if turn else new_id("item"), turn.start if turn else self.buffer.start, self.buffer.end)

    async def _on_clear(self, e: ev.InputAudioBufferClear) -> None:
        self._input.flush()
        self.buffer.clear()
        self.pipe.clear()
        self._reset_detector()
        await self.emit(ev.InputAudioBufferCleared())

    def _reset_detector(self) -> None:
        """A fresh detector (new settings, a commit/clear mid-turn); an open turn is abandoned. It
        counts from the buffer's end, so its positions stay those of the session's input."""
        self._turn = None
        vad = self.config.vad
        origin = self.buffer.end
        if vad is None:
            self.detector = None
        elif vad.end_of_turn is not None and self.turn_model is not None:  # semantic_vad with its model
            settings = replace(vad, silence_duration_ms=vad.end_of_turn.max_wait_ms)
            check = self.limits.end_of_turn_silence_ms
            self.detector = TurnDetector(settings, self.caps.input_rate, self.limits.pause_ms, check_ms=check, origin=origin)
        else:
            self.detector = TurnDetector(vad, self.caps.input_rate, self.limits.pause_ms, origin=origin)

    def _transcribe(self, item: Message) -> None:
        if not self.caps.transcribes_input:
            return
        for index, part in enumerate(item.parts):
            if part.kind == "audio" and part.audio is not None and part.text is None:
                self.tasks.spawn(self._run_transcription(item, index, part), "transcribe")

    async def _run_transcription(self, item: Message, index: int, part: Part) -> None:
        assert part.audio is not None
        try:
            async with asyncio.timeout(self.limits.stage_timeout_s):  # a hung recogniser fails this transcript only
                result = await self.pipe.transcribe(item.id, part.audio)
        except Exception as exc:
            log.exception("transcription of %s failed", item.id)
            if self.config.transcription is not None:
                error = ev.InputTranscriptionError(type="server_error", code="transcription_failed", message=str(exc) or type(exc).__name__)
                await self.emit(ev.InputTranscriptionFailed(item_id=item.id, content_index=index, error=error))
            return
        if result is None:
            return
        part.text = result.text
        captions = self._captions.pop(item.id, None)
        if self.config.transcription is not None:
            delta = captions.finish(result.text) if captions is not None else result.text
            if delta:  # the rest after the live captions, or the whole transcript
                await self.emit(ev.InputTranscriptionDelta(item_id=item.id, content_index=index, delta=delta))
            usage = ev.TranscriptionDurationUsage(seconds=round(result.audio_seconds, 3))
            await self.emit(ev.InputTranscriptionCompleted(item_id=item.id, content_index=index, transcript=result.text, usage=usage))

    def _arm_idle_timer(self, outcome: Outcome) -> None:
        vad = self.config.vad
        if vad is None or not vad.idle_timeout_ms or self.closed or self.ending:
            return
        playback_end = max(outcome.done_at, (outcome.first_audio_at or outcome.done_at) + outcome.audio_seconds)
        delay = playback_end - time.perf_counter() + vad.idle_timeout_ms / 1000.0
        self._idle_from = self.buffer.end
        self._idle_timer = self.tasks.spawn(self._idle_timeout(delay), "idle")

    def _cancel_idle_timer(self) -> None:
        self._idle_from = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    async def _idle_timeout(self, delay: float) -> None:
        await asyncio.sleep(max(0.0, delay))
        idle_from, self._idle_timer, self._idle_from = self._idle_from, None, None
        if self._turn is not None or self.active is not None or self.closed:
            return
        item_id = new_id("item")
        start, end = max(self.buffer.start, idle_from or 0), self.buffer.end
        await self.emit(ev.InputAudioBufferTimeoutTriggered(audio_start_ms=self.ms(start), audio_end_ms=self.ms(end), item_id=item_id))
        await self._commit(item_id, start, end)
        try:
            await self._start_response(ev.ResponseParams(), started_at=time.perf_counter())
        except RealtimeError as err:  # e.g. the session's tool_choice no longer fits its tools
            await self.report(err)
