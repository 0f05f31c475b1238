"""WebRTC: the Realtime API the way OpenAI serves it to browsers.

    POST /v1/realtime/calls    SDP offer (raw ``application/sdp``, or multipart ``sdp`` + JSON
                               ``session``) -> 201, the SDP answer, ``Location: /v1/realtime/calls/{id}``
    POST /v1/realtime?model=   the beta spelling of the same (raw SDP; beta event names)

One call is one session (aiortc peer connection). The caller's Opus track is decoded, mixed to
mono and resampled once to the pipeline's input rate; the session's answer goes out on an Opus
track fed by a ``Playout`` on a steady 20 ms clock. Events travel on the ``oai-events`` data channel
the caller opens. A video track is sampled (``webrtc.video_fps``) for pipelines that take images.
The call ends on DELETE / hangup, when the peer closes the peer connection, or when media never
starts within ``connect_timeout_s``.

A call may outlive its peer connection (docs/realtime-api.md#resuming-a-session, with
``realtime_omni/resume.py``'s log and checks, shared with the WebSocket): when the connection fails
(ICE) or no audio has arrived for ``webrtc.media_timeout_s``, its session is kept for
``resume.grace_s``, its events going on into the replay log; a new offer carrying the session's id,
token and last event id gets a new peer connection on the same session (new tracks, a new data
channel that replays the log from that event), and the old one is closed. Without a resume in the
grace the call ends as it did before resumes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fractions
import io
import logging
import time
from typing import Any

import aioice.ice
import av
import numpy as np
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCIceServer,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.mediastreams import MediaStreamError
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from realtime_omni.calls import Call, MediaInput
from realtime_omni.config import WebRTCConfig
from realtime_omni.errors import RealtimeError
from realtime_omni.keys import is_ephemeral
from realtime_omni.protocol import events as ev
from realtime_omni.protocol.codec import decode_session
from realtime_omni.pump import Sink
from realtime_omni.resume import Hold, LogSink, ReplayLog
from realtime_omni.server import Admission, Server
from realtime_omni.session import Media, Session
from realtime_omni.session.playout import Playout
from realtime_omni.tasks import TaskSet

from .http import LAST_EVENT_ID, RECEIVED, REPLAYED, RESUME_TOKEN, SESSION_ID, claim_resume, read_body, request_key

log = logging.getLogger(__name__)

OPUS_RATE = 48000
MAX_SDP_BYTES = 64 * 1024
MAX_CHANNEL_BUFFER = 1024 * 1024  # bytes queued on the data channel before the event pump waits
INBOUND_EVENTS = 256  # client events from the data channel waiting for the session
VIDEO_MAX_SIDE = 512  # sampled frames are scaled down to this before JPEG encoding


def routes() -> list[Route]:
    return [
        Route("/v1/realtime/calls", create_call, methods=["POST"]),
        Route("/v1/realtime", create_call_beta, methods=["POST"]),
    ]


def use_host_addresses(addresses: list[str]) -> None:
    """Offer these addresses as ICE host candidates instead of every interface's. aioice has no
    setting for it, so its discovery function is replaced (process-wide)."""
    if not addresses:
        return
    chosen = list(addresses)

    def host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [a for a in chosen if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

    aioice.ice.get_host_addresses = host_addresses


# ------------------------------------------------------------------------------------ HTTP


async def create_call(request: Request) -> Response:
    return await _create(request, beta="realtime=v1" in request.headers.get("openai-beta", ""))


async def create_call_beta(request: Request) -> Response:
    return await _create(request, beta=True)


async def _create(request: Request, *, beta: bool) -> Response:
    """The offer answered (201), or the ``RealtimeError`` that refuses it, answered by the app's
    handler (host/errors.py)."""
    server: Server = request.app.state.server
    server.check_origin(request.headers.get("origin"))
    key = request_key(request)
    if SESSION_ID in request.headers:
        return await _resume(request, server, key)
    admission = await server.admit(key)
    sdp, update = await _read_offer(request)
    key_tag = server.tenant(key) if is_ephemeral(key) else None
    call = await WebRTCCall.open(server, sdp, beta=beta, model=request.query_params.get("model"), admission=admission, updates=(update,), key_tag=key_tag)
    headers = {"Location": f"/v1/realtime/calls/{call.id}"}
    if call.hold is not None:
        assert call.session is not None
        headers |= {SESSION_ID: call.session.id, RESUME_TOKEN: call.hold.token}
    return Response(call.answer, status_code=201, media_type="application/sdp", headers=headers)


async def _resume(request: Request, server: Server, key: str | None) -> Response:
    """An offer that names a session to resume: refused (the ``RealtimeError`` of the WebSocket's
    resume, the session left as it was), or answered with a new peer connection on that session."""
    started = time.perf_counter()
    hold, cursor = claim_resume(server, request.headers, key, "webrtc", request.headers.get(LAST_EVENT_ID))  # (none: from where the old data channel stopped)
    sdp, _ = await _read_offer(request)  # (a session part is not applied: the session is as it was)
    call: WebRTCCall = hold.keeper
    try:
        answer = await call.resume(sdp, cursor)
    except RealtimeError as err:
        server.metrics.resumes.labels(err.code or "refused").inc()
        raise
    server.metrics.resumes.labels("resumed").inc()
    took_ms = (time.perf_counter() - started) * 1000
    log.info("call %s: session %s resumed on a new peer connection: %d events to replay", call.id, hold.id, hold.log.end - cursor)
    reply = {
        "Location": f"/v1/realtime/calls/{call.id}",
        SESSION_ID: hold.id,
        RECEIVED: str(hold.received),
        REPLAYED: str(hold.log.end - cursor),
        "server-timing": f"resume;dur={took_ms:.3f}",
    }
    return Response(answer, status_code=201, media_type="application/sdp", headers=reply)


async def _read_offer(request: Request) -> tuple[str, ev.SessionObject | None]:
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        try:
            form = await request.form(max_files=4, max_fields=4, max_part_size=MAX_SDP_BYTES)
        except Exception as exc:  # malformed multipart (Starlette raises its own parse errors)
            raise RealtimeError(f"Could not read the multipart body: {exc}", code="invalid_request") from None
        sdp = await _text(form.get("sdp"))
        session = await _text(form.get("session"))
        if not sdp:
            raise RealtimeError("Missing required parameter: 'sdp'.", code="missing_required_parameter", param="sdp")
        return sdp, decode_session(session) if session else None
    try:
        body = await read_body(request, MAX_SDP_BYTES)
    except RealtimeError:
        raise RealtimeError(f"The SDP offer is larger than {MAX_SDP_BYTES} bytes.", code="invalid_offer", param="sdp") from None
    if not body.strip():
        raise RealtimeError("The request has no SDP offer (send it as application/sdp or multipart 'sdp').", code="missing_required_parameter", param="sdp")
    try:
        return body.decode(), None
    except UnicodeDecodeError:
        raise RealtimeError("The SDP offer is not UTF-8 text.", code="invalid_offer", param="sdp") from None


async def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, UploadFile):
        data = await value.read(MAX_SDP_BYTES + 1)
        if len(data) > MAX_SDP_BYTES:
            raise RealtimeError("A multipart part is too large.", code="invalid_request")
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise RealtimeError("A multipart part is not UTF-8 text.", code="invalid_request") from None
    return str(value)


# ------------------------------------------------------------------------------------ the call


class PlayoutTrack(MediaStreamTrack):
    """The answer's audio: one 20 ms frame per tick of the playout's clock (silence between answers)."""

    kind = "audio"

    def __init__(self, playout: Playout) -> None:
        super().__init__()
        self.playout = playout
        self._pts = 0

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        pcm = await self.playout.next_frame()
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = OPUS_RATE
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, OPUS_RATE)
        self._pts += len(pcm)
        return frame


class WebRTCCall(Call):
    kind = "webrtc"

    def __init__(self, server: Server, session: Session, pc: RTCPeerConnection, config: WebRTCConfig) -> None:
        super().__init__(server, session)
        self.pc = pc
        self.config = config
        self.answer = ""
        self.media = MediaInput(session)
        self.video_frames = 0
        self.tasks = TaskSet(self.id)
        self._inbound: asyncio.Queue[str | bytes] = asyncio.Queue(INBOUND_EVENTS)
        self._dropped = 0
        # resumable (``hold``): the session's events go into its replay log, and the data channel
        # of the peer connection attached now sends them from ``_cursor``
        self.hold: Hold | None = None
        self.parked_at: float | None = None  # since when no peer connection has been attached
        self._channel: Any = None
        self._cursor = 0
        self._writer: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._why: str | None = None  # why the session ended, as a late resume is told it
        self.resumes = 0  # peer connections that took over the call

    @classmethod
    async def open(
        cls,
        server: Server,
        sdp: str,
        *,
        beta: bool,
        model: str | None,
        admission: Admission,
        updates: tuple[ev.SessionObject | None, ...],
        key_tag: str | None = None,
    ) -> WebRTCCall:
        config = server.config.webrtc
        use_host_addresses(config.host_addresses)
        if "m=audio" not in sdp:
            raise RealtimeError("The SDP offer has no audio media section ('m=audio').", code="invalid_offer", param="sdp")
        media = Media(playout_rate=OPUS_RATE, playout_buffer_ms=config.max_buffer_ms)
        session = await server.open_session(beta=beta, transport="webrtc", model=model, admission=admission, updates=updates, media=media)
        ice = [RTCIceServer(**s) for s in config.ice_servers]
        pc = RTCPeerConnection(RTCConfiguration(iceServers=ice))
        call = cls(server, session, pc, config)
        try:
            call.answer = await call._negotiate(pc, sdp)
        except BaseException:
            await call._abandon()
            raise
        server.calls.add(call)
        await server.calls.publish(call)  # before the answer: a sideband may follow it to any replica
        resume = server.config.resume
        if resume.grace_s > 0 and "m=application" in sdp:  # resumable: its events are kept in a log the data channel sends
            call.hold = Hold(session.id, ReplayLog(resume.buffer_events, resume.buffer_bytes), resume.grace_s, key_tag=key_tag, kind="webrtc")
            call.hold.keeper = call
            call.hold.log.attach(0)  # the call's first peer connection: its data channel will send from the start
            server.holds.add(call.hold)
        await session.start()
        if call.hold is not None:
            call.start_events()
            call.add_sink(LogSink(call.hold.log, beta=session.beta))  # (before the first event is taken: no await since)
            call.tasks.spawn(call._read_events(), "events")
        else:
            # the first events wait for the data channel the offer announces (none: nothing to wait for)
            call.start_events(wait_for_sink=config.connect_timeout_s if "m=application" in sdp else None)
        call._watch_media()
        log.info("call %s: WebRTC session %s", call.id, session.id)
        return call

    def _watch_media(self) -> None:
        watch = self.watch_media(self.media, timeout=self.config.media_timeout_s, reason="media_timeout", connect_timeout=self.config.connect_timeout_s)
        self._watch = self.tasks.spawn(watch, "watch")

    async def _negotiate(self, pc: RTCPeerConnection, sdp: str) -> str:
        """Answer ``sdp`` on ``pc`` (the call's first peer connection, or a resume's)."""
        pc.on("datachannel", lambda channel: self._on_datachannel(pc, channel))
        pc.on("track", lambda track: self._on_track(pc, track))
        pc.on("connectionstatechange", lambda: self._on_state(pc))
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        except Exception as exc:  # aiortc raises ValueError (and friends) for SDP it cannot use
            raise RealtimeError(f"Invalid SDP offer: {exc}", code="invalid_offer", param="sdp") from None
        transceivers = pc.getTransceivers()
        if not any(t.kind == "audio" for t in transceivers) or any(t.receiver.transport is None for t in transceivers):
            # aiortc takes such an offer, then fails answering it and in a task of its own
            raise RealtimeError(
                "Invalid SDP offer: a media section has no transport, or there is no audio (check the BUNDLE group and the mids).",
                code="invalid_offer",
                param="sdp",
            )
        assert self.session is not None
        for transceiver in pc.getTransceivers():
            if transceiver.kind == "audio":
                _set_jitter_frames(transceiver.receiver, self.config.jitter_frames)
        assert self.session.playout is not None
        pc.addTrack(PlayoutTrack(self.session.playout))
        try:
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception as exc:
            raise RealtimeError(f"Could not answer the SDP offer: {exc}", code="invalid_offer", param="sdp") from None
        return str(pc.localDescription.sdp)

    # ------------------------------------------------------------------ resumes

    async def resume(self, sdp: str, cursor: int) -> str:
        """Take a resume's offer: a new peer connection answered, the data channel it opens to send
        the log from ``cursor``; the old peer connection closed. Raises (the session left as it
        was) when the offer cannot be answered."""
        hold = self.hold
        assert hold is not None and self.session is not None
        if "m=application" not in sdp:
            raise RealtimeError("A resume's offer must open the 'oai-events' data channel ('m=application').", code="invalid_offer", param="sdp")
        ice = [RTCIceServer(**s) for s in self.config.ice_servers]
        pc = RTCPeerConnection(RTCConfiguration(iceServers=ice))
        try:
            answer = await self._negotiate(pc, sdp)
            if self.ended.is_set():
                raise RealtimeError(f"Session {hold.id} has ended: {self.end_reason}.", code="session_ended")
            if cursor < hold.log.start:  # (sent on meanwhile by a connection still attached)
                raise RealtimeError("The event named is no longer held for this session; it cannot resume.", code="resume_gap")
        except BaseException:
            await _close_peer(pc)
            raise
        old, self.pc = self.pc, pc
        self._detach()
        self.parked_at = None
        self._cursor = cursor
        hold.log.attach(cursor)
        if self._watch is not None:
            self._watch.cancel()
        self.resumes += 1
        self.media.last_at = 0.0  # the new connection's media: awaited for connect_timeout_s, as a new call's
        self._watch_media()
        self.tasks.spawn(_close_peer(old), "close-old-peer")  # (its state changes are no longer this call's)
        return answer

    def _detach(self) -> None:
        """The attached data channel no longer sends nor takes events."""
        if self._writer is not None:
            self._writer.cancel()
            self._writer = None
        if self._channel is not None:
            self._channel.remove_all_listeners("message")
            self._channel = None

    def _lost(self, pc: RTCPeerConnection, reason: str) -> None:
        """``pc`` failed or went silent: end the call, or, resumable, keep it for a resume."""
        if pc is not self.pc or self.ended.is_set() or self.parked_at is not None:
            return
        if self.hold is None:
            self.tasks.spawn(self.hangup(reason), "hangup")
            return
        log.info("call %s: its peer connection was lost (%s); kept %g s for a resume", self.id, reason, self.hold.grace_s)
        self.parked_at = time.monotonic()
        self._detach()
        self.hold.log.detach()
        if self._watch is not None and self._watch is not asyncio.current_task():
            self._watch.cancel()
        self.tasks.spawn(_close_peer(pc), "close-lost-peer")
        self.tasks.spawn(self._grace(pc, reason), "grace")

    async def _grace(self, pc: RTCPeerConnection, reason: str) -> None:
        assert self.hold is not None
        await asyncio.sleep(self.hold.grace_s)
        if self.pc is pc and not self.ended.is_set():
            self._why = f"nobody resumed it within {self.hold.grace_s:g} s ({reason})"
            await self.hangup(reason)

    def _media_lost(self, reason: str) -> None:
        if self.hold is None or (reason == "connect_timeout" and not self.resumes):  # (a resume's that never connects is lost)
            super()._media_lost(reason)
        else:
            self._lost(self.pc, reason)

    async def events_sent(self, timeout: float) -> None:
        await super().events_sent(timeout)
        if self.hold is not None:  # recorded is not sent: the data channel sends the rest of the log
            self.hold.log.finish()
            if self._writer is not None:
                await asyncio.wait({self._writer}, timeout=timeout)

    # ------------------------------------------------------------------ events

    def _on_datachannel(self, pc: RTCPeerConnection, channel: Any) -> None:
        if channel.label != "oai-events" or pc is not self.pc:
            return
        if self.hold is not None:
            self._attach_channel(pc, channel)
            return
        timeout = self.server.config.limits.send_timeout_s

        async def send(data: str) -> bool:
            deadline = time.monotonic() + timeout
            while channel.bufferedAmount > MAX_CHANNEL_BUFFER:
                if channel.readyState != "open" or time.monotonic() > deadline:
                    return False
                await asyncio.sleep(0.01)
            if channel.readyState != "open":
                return False
            channel.send(data)
            return True

        @channel.on("message")
        def on_message(message: str | bytes) -> None:
            try:
                self._inbound.put_nowait(message)
            except asyncio.QueueFull:
                self._dropped += 1

        self.add_sink(Sink(send, beta=self.session.beta if self.session else False, name="data-channel", essential=True))
        self.tasks.spawn(self._read_events(), "events")

    def _attach_channel(self, pc: RTCPeerConnection, channel: Any) -> None:
        """A resumable call's data channel: it sends the log from the cursor, and its messages go
        to the session (counted, for a resume's ``x-client-events-received``)."""
        hold = self.hold
        assert hold is not None
        self._detach()
        self._channel = channel

        @channel.on("message")
        def on_message(message: str | bytes) -> None:
            hold.received += 1
            try:
                self._inbound.put_nowait(message)
            except asyncio.QueueFull:
                self._dropped += 1

        self._writer = self.tasks.spawn(self._write_events(pc, channel, self._cursor), "events-out")

    async def _write_events(self, pc: RTCPeerConnection, channel: Any, seq: int) -> None:
        """The replay log from ``seq`` on ``channel``, each event handed once the channel took it."""
        assert self.hold is not None
        log_, timeout = self.hold.log, self.server.config.limits.send_timeout_s
        while (data := await log_.next(seq)) is not None:
            deadline = time.monotonic() + timeout
            while channel.bufferedAmount > MAX_CHANNEL_BUFFER and channel.readyState == "open":
                if time.monotonic() > deadline:  # the client stopped reading: as a WebSocket that did
                    log.warning("call %s: the data channel took no event for %.0f s", self.id, timeout)
                    self._lost(pc, "client_gone")
                    return
                await asyncio.sleep(0.01)
            if channel.readyState != "open":  # closed by the peer (a lost network closes nothing): it hung up
                if pc is self.pc and not self.ended.is_set():
                    self.tasks.spawn(self.hangup("peer_closed"), "hangup")
                return
            channel.send(data)
            seq += 1
            log_.handed(seq)

    async def _read_events(self) -> None:
        assert self.session is not None
        while True:
            message = await self._inbound.get()
            await self.session.handle(message)
            if self._dropped:
                dropped, self._dropped = self._dropped, 0
                await self.session.report(
                    RealtimeError(f"{dropped} client events were dropped: they came faster than the session could take them.", code="rate_limit_exceeded")
                )

    # ------------------------------------------------------------------ media in

    def _on_track(self, pc: RTCPeerConnection, track: MediaStreamTrack) -> None:
        if pc is not self.pc:
            return
        if track.kind == "audio":
            self.tasks.spawn(_read_audio(track, self.media), "audio-in")
        elif track.kind == "video":
            self.tasks.spawn(_read_video(track, self), "video-in")

    # ------------------------------------------------------------------ lifetime

    def _on_state(self, pc: RTCPeerConnection) -> None:
        """A peer connection that failed (ICE: the network went) is lost, kept for a resume when the
        call is resumable; one the peer closed (DTLS close: it hung up) ends the call, as a WebSocket
        close frame ends its session. A replaced or parked one's states are no longer the call's."""
        if pc is not self.pc or self.parked_at is not None:
            return
        if pc.connectionState == "failed":
            self._lost(pc, "peer_failed")
        elif pc.connectionState == "closed":
            self.tasks.spawn(self.hangup("peer_closed"), "hangup")

    async def _teardown(self) -> None:
        if self.hold is not None:
            self.server.holds.ended(self.hold, self._why or _ENDED.get(self.end_reason or "", self.end_reason or "it ended"))
            self.hold.log.detach()  # a recorder waiting for room: refused now, the call is going
            self.hold.log.finish()
        await self.tasks.cancel()
        await _close_peer(self.pc)

    async def _abandon(self) -> None:
        """An offer that could not be answered: undo what negotiating began (tasks a track already
        started, the peer connection, the session), whatever state it stopped in."""
        await _close_peer(self.pc)  # first: aiortc's own connect task, already scheduled, sees it closed
        await self.tasks.cancel()
        assert self.session is not None
        await self.server.close_session(self.session)

async def _read_audio(track: MediaStreamTrack, media: MediaInput) -> None:
    """A call's audio track into its session, frame by frame, until the track ends."""
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        if not isinstance(frame, av.AudioFrame):  # (an audio track's frames all are)
            continue
        media.arrived()
        await media.push(_mono(frame), frame.sample_rate)


async def _read_video(track: MediaStreamTrack, call: WebRTCCall) -> None:
    """Every frame is taken off the track (aiortc queues them unbounded otherwise); one per
    ``1 / video_fps`` seconds is kept for the pipeline, if it takes images."""
    session = call.session
    assert session is not None
    if not session.caps.images:
        await session.report(
            RealtimeError(
                f"The '{session.caps.name}' pipeline does not take image input; this call's video track is received but not used.",
                code="unsupported_video",
                param="video",
            )
        )
    interval = 1.0 / call.config.video_fps if call.config.video_fps > 0 else float("inf")
    next_sample = 0.0
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        now = time.monotonic()
        if not session.caps.images or now < next_sample or not isinstance(frame, av.VideoFrame):
            continue
        next_sample = now + interval
        session.camera_frame(await asyncio.to_thread(_jpeg_data_url, frame))
        call.video_frames += 1



_ENDED = {  # a call's end, as a resume that comes too late is told it (410)
    "peer_closed": "the client closed its peer connection",
    "hangup": "the call was hung up",
    "server_shutting_down": "the server ended it",
    "resume_buffer_overflow": "its resume buffer overflowed while no peer connection took its events",
}


async def _close_peer(pc: RTCPeerConnection) -> None:
    """Close a peer connection. aiortc's ``close`` fails on one a bad offer left half set up (a
    transceiver with no transport): that must not keep the rest from being released."""
    try:
        await pc.close()
    except Exception:
        log.debug("closing a half-negotiated peer connection failed; stopping its transports one by one", exc_info=True)
        dtls = [t.receiver.transport for t in pc.getTransceivers()] + [pc.sctp.transport if pc.sctp else None]
        for transport in dtls:
            if transport is not None:
                with contextlib.suppress(Exception):
                    await transport.stop()
                with contextlib.suppress(Exception):
                    await transport.transport.stop()


class InOrder:
    """The incoming audio as it comes: each Opus packet is a whole 20 ms frame, and the caller's
    audio goes to the turn detector and the recognizer, not to a loudspeaker, so a frame waits for
    nothing (aiortc's own buffer holds each until 4 newer ones have come: 80 ms on every turn's end).
    A packet up to ``MAX_BEHIND`` behind the last one passed on (reordered, or a duplicate) is
    dropped: a 20 ms gap for the detector and ASR; one further behind is a sender that restarted its
    numbering, and is passed on. aiortc's ``JitterBuffer.add`` contract: (send a PLI?, a frame or None)."""

    MAX_BEHIND = 100  # packets (2 s); as aiortc's own buffer tells misorder from a restart

    def __init__(self) -> None:
        self._next: int | None = None  # the sequence number after the last one passed on
        self.dropped = 0

    def add(self, packet: Any) -> tuple[bool, JitterFrame | None]:
        seq = packet.sequence_number
        if self._next is not None and 0 < (self._next - seq) & 0xFFFF <= self.MAX_BEHIND:  # behind (mod 2^16)
            self.dropped += 1
            return False, None
        self._next = (seq + 1) & 0xFFFF
        return False, JitterFrame(data=packet._data, timestamp=packet.timestamp)


def _set_jitter_frames(receiver: Any, frames: int) -> None:
    """aiortc holds every incoming audio packet until 4 newer ones have arrived (80 ms) and has no
    setting for it. Each frame held is 20 ms added to every turn (the end of the caller's speech
    reaches the turn detector that much later): with ``frames`` 0 (the default) none is
    (``InOrder``); with more, aiortc's buffer at that depth, which puts a packet up to ``frames`` x
    20 ms late back in its place (otherwise dropped: a 20 ms gap for the turn detector and ASR)."""
    attr = "_RTCRtpReceiver__jitter_buffer"
    if not hasattr(receiver, attr):  # an aiortc that renamed it: its own 80 ms stands
        log.warning("this aiortc has no %s: webrtc.jitter_frames is not applied", attr)
        return
    setattr(receiver, attr, InOrder() if frames <= 0 else JitterBuffer(capacity=16, prefetch=frames))


def _mono(frame: av.AudioFrame) -> np.ndarray:
    """int16 mono from a decoded frame (aiortc's Opus decoder gives packed s16 stereo)."""
    data = frame.to_ndarray()
    channels = len(frame.layout.channels)
    if data.dtype != np.int16:
        data = np.clip(data * 32768.0, -32768, 32767).astype(np.int16) if data.dtype.kind == "f" else data.astype(np.int16)
    if channels == 1:
        return data.reshape(-1)
    if frame.format.is_planar:
        return (data.astype(np.int32).sum(axis=0) // channels).astype(np.int16)
    return (data.reshape(-1, channels).astype(np.int32).sum(axis=1) // channels).astype(np.int16)


def _jpeg_data_url(frame: av.VideoFrame) -> str:
    image = frame.to_image()
    image.thumbnail((VIDEO_MAX_SIDE, VIDEO_MAX_SIDE))
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode()
