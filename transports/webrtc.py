"""WebRTC: the Realtime API the way OpenAI serves it to browsers.

    POST /v1/realtime/calls    SDP offer (raw ``application/sdp``, or multipart ``sdp`` + JSON
                               ``session``) -> 201, the SDP answer, ``Location: /v1/realtime/calls/{id}``
    POST /v1/realtime?model=   the beta spelling of the same (raw SDP; beta event names)

One call is one session (aiortc peer connection). The caller's Opus track is decoded, mixed to
mono and resampled once to the pipeline's input rate; the session's answer goes out on an Opus
track fed by a ``Playout`` on a steady 20 ms clock. Events travel on the ``oai-events`` data channel
the caller opens. A video track is sampled (``webrtc.video_fps``) for pipelines that take images.
The call ends on DELETE / hangup, when the peer connection closes or fails, when no audio has
arrived for ``webrtc.media_timeout_s``, or when media never starts within ``connect_timeout_s``.
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
from realtime_omni.protocol import events as ev
from realtime_omni.protocol.codec import decode_session
from realtime_omni.pump import Sink
from realtime_omni.server import Admission, Server
from realtime_omni.session import Media, Session
from realtime_omni.session.playout import Playout
from realtime_omni.tasks import TaskSet

from .http import read_body, request_key

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
    admission = await server.admit(request_key(request))
    sdp, update = await _read_offer(request)
    call = await WebRTCCall.open(server, sdp, beta=beta, model=request.query_params.get("model"), admission=admission, updates=(update,))
    headers = {"Location": f"/v1/realtime/calls/{call.id}"}
    return Response(call.answer, status_code=201, media_type="application/sdp", headers=headers)


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

    @classmethod
    async def open(
        cls, server: Server, sdp: str, *, beta: bool, model: str | None, admission: Admission, updates: tuple[ev.SessionObject | None, ...]
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
            await call._negotiate(sdp)
        except BaseException:
            await call._abandon()
            raise
        server.calls.add(call)
        await server.calls.publish(call)  # before the answer: a sideband may follow it to any replica
        await session.start()
        # the first events wait for the data channel the offer announces (none: nothing to wait for)
        call.start_events(wait_for_sink=config.connect_timeout_s if "m=application" in sdp else None)
        watch = call.watch_media(call.media, timeout=config.media_timeout_s, reason="media_timeout", connect_timeout=config.connect_timeout_s)
        call.tasks.spawn(watch, "watch")
        log.info("call %s: WebRTC session %s", call.id, session.id)
        return call

    async def _negotiate(self, sdp: str) -> None:
        pc = self.pc
        pc.on("datachannel", self._on_datachannel)
        pc.on("track", self._on_track)
        pc.on("connectionstatechange", self._on_state)
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
        self.answer = pc.localDescription.sdp

    # ------------------------------------------------------------------ events

    def _on_datachannel(self, channel: Any) -> None:
        if channel.label != "oai-events":
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

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self.tasks.spawn(self._read_audio(track), "audio-in")
        elif track.kind == "video":
            self.tasks.spawn(self._read_video(track), "video-in")

    async def _read_audio(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            if not isinstance(frame, av.AudioFrame):  # (an audio track's frames all are)
                continue
            self.media.arrived()
            await self.media.push(_mono(frame), frame.sample_rate)

    async def _read_video(self, track: MediaStreamTrack) -> None:
        """Every frame is taken off the track (aiortc queues them unbounded otherwise); one per
        ``1 / video_fps`` seconds is kept for the pipeline, if it takes images."""
        session = self.session
        assert session is not None
        if not session.caps.images:
            await session.report(
                RealtimeError(
                    f"The '{session.caps.name}' pipeline does not take image input; this call's video track is received but not used.",
                    code="unsupported_video",
                    param="video",
                )
            )
        interval = 1.0 / self.config.video_fps if self.config.video_fps > 0 else float("inf")
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
            self.video_frames += 1

    # ------------------------------------------------------------------ lifetime

    def _on_state(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            self.tasks.spawn(self.hangup(f"peer_{self.pc.connectionState}"), "hangup")

    async def _teardown(self) -> None:
        await self.tasks.cancel()
        await _close_peer(self.pc)

    async def _abandon(self) -> None:
        """An offer that could not be answered: undo what negotiating began (tasks a track already
        started, the peer connection, the session), whatever state it stopped in."""
        await _close_peer(self.pc)  # first: aiortc's own connect task, already scheduled, sees it closed
        await self.tasks.cancel()
        assert self.session is not None
        await self.server.close_session(self.session)


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
