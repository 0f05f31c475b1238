"""A WebRTC client the way a Python application would write one: aiortc for the peer connection,
the official ``openai`` SDK's ``client.realtime.calls.create`` for the offer/answer.

Its microphone is a real-time track (20 ms frames on the clock; silence until ``say``); what the
server sends back is decoded and kept with arrival times. Tests pass ``validate`` to check every
data-channel event strictly. ``WebRTCTransport`` plugs it into the replay harness.
"""

from __future__ import annotations

import asyncio
import base64
import fractions
import json
import ssl
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import av
import httpx
import numpy as np
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError
from openai import AsyncOpenAI

from dsp.resample import Resampler, resample
from transports.webrtc import use_host_addresses

from .metrics import first_audible
from .microphone import FrameQueue

RATE = 48000
FRAME = RATE // 50
MAX_FRAMES_KEPT = 50 * 600  # ten minutes of received audio


class Microphone(MediaStreamTrack):
    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._frames = FrameQueue()
        self._pts = 0
        self._next: float | None = None
        self.spoken_until = 0.0  # monotonic time the last queued speech ends

    def say(self, pcm: np.ndarray, rate: int) -> None:
        audio = resample(pcm, rate, RATE)
        self._frames.push(audio)
        self.spoken_until = max(time.monotonic(), self.spoken_until) + len(audio) / RATE

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        self._next = now if self._next is None else self._next + FRAME / RATE
        if self._next > now:
            await asyncio.sleep(self._next - now)
        frame = av.AudioFrame.from_ndarray(self._frames.take(FRAME).reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, RATE)
        self._pts += FRAME
        return frame


async def offer_sdp() -> str:
    """An SDP offer as a browser's would be (audio both ways and the ``oai-events`` data channel),
    from a peer connection closed at once: for requests that need a valid offer and no call."""
    pc = RTCPeerConnection()
    pc.addTransceiver("audio", direction="sendrecv")
    pc.createDataChannel("oai-events")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


class RtcClient:
    def __init__(
        self, http_url: str, api_key: str = "test-key", validate: Callable[[dict[str, Any]], Any] | None = None, verify: ssl.SSLContext | None = None
    ) -> None:
        self.http_url = http_url
        self.api_key = api_key
        self.validate = validate
        self.verify = verify  # an https server's trust (a test CA); None: the system's
        if urlsplit(http_url).hostname in ("127.0.0.1", "localhost"):
            use_host_addresses(["127.0.0.1"])  # a local server: offer the loopback address
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.mic = Microphone()
        self.channel = self.pc.createDataChannel("oai-events")
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.log: list[tuple[float, dict[str, Any]]] = []
        self.received: list[tuple[float, np.ndarray]] = []  # (arrival, 48 kHz mono int16 frame)
        self.call_id = ""
        self.answer_headers: dict[str, str] = {}
        self.opened = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

        @self.channel.on("open")
        def on_open() -> None:
            self.opened.set()

        @self.channel.on("message")
        def on_message(message: str) -> None:
            event = json.loads(message)
            if self.validate is not None:
                self.validate(event)
            self.on_event(event)
            self.log.append((time.monotonic(), event))
            self.inbox.put_nowait(event)

        @self.pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            self._reader = asyncio.ensure_future(self._read(track))

    async def _read(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            data = frame.to_ndarray().reshape(-1, len(frame.layout.channels))[:, 0].astype(np.int16)
            now = time.monotonic()
            self.received.append((now, data))
            if len(self.received) > MAX_FRAMES_KEPT:
                del self.received[: len(self.received) - MAX_FRAMES_KEPT]
            self.on_audio(now, data)

    def on_event(self, event: dict[str, Any]) -> None:
        """A hook: every data-channel event, as it arrives."""

    def on_audio(self, t: float, pcm: np.ndarray) -> None:
        """A hook: every received 48 kHz frame, as it arrives."""

    async def connect(
        self,
        *,
        session: dict[str, Any] | None = None,
        strip_candidates: bool = False,
        video: MediaStreamTrack | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Offer, answer, and wait for the data channel to open. ``headers`` go with the offer (a
        resume's: ``x-session-id``, ``x-resume-token``, ``last-event-id``); the answer's are kept in
        ``answer_headers``."""
        self.pc.addTrack(self.mic)
        if video is not None:
            self.pc.addTrack(video)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        sdp = self.pc.localDescription.sdp
        if strip_candidates:  # what a browser sends when it does not wait for ICE gathering
            sdp = "".join(line + "\r\n" for line in sdp.splitlines() if not line.startswith(("a=candidate", "a=end-of-candidates")))
        http = httpx.AsyncClient(verify=self.verify) if self.verify is not None else None
        client = AsyncOpenAI(api_key=self.api_key, base_url=f"{self.http_url}/v1", http_client=http)
        kwargs: dict[str, Any] = {"sdp": sdp}
        if session is not None:
            kwargs["session"] = session
        if headers:
            kwargs["extra_headers"] = headers
        response = await client.realtime.calls.with_raw_response.create(**kwargs)
        assert response.status_code == 201, response.text
        self.answer_headers = dict(response.headers)
        assert response.headers["content-type"].startswith("application/sdp")
        self.call_id = response.headers["location"].rsplit("/", 1)[1]
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=response.text, type="answer"))
        await asyncio.wait_for(self.opened.wait(), 20)

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    def cut_network(self) -> None:
        """The network goes, as on a phone that changes networks: the peer connection's UDP sockets
        are closed under it, so the server hears nothing more (no DTLS close, no SCTP abort) and
        its side of the call is left half-open."""
        ice = self.pc.sctp.transport.transport if self.pc.sctp is not None else None  # the RTCIceTransport
        connection = getattr(ice, "_connection", None)  # aioice's Connection: no public way to it
        assert connection is not None, "this aiortc keeps its ICE connection elsewhere"
        for protocol in connection._protocols:
            if protocol.transport is not None:
                protocol.transport.close()

    async def next(self, kind: str, timeout: float = 20.0) -> dict[str, Any]:
        """The next event of type ``kind`` (earlier events of other types are skipped)."""
        async with asyncio.timeout(timeout):
            while True:
                event = await self.inbox.get()
                if event["type"] == kind:
                    return event

    def audio_since(self, t0: float) -> np.ndarray:
        chunks = [pcm for t, pcm in self.received if t >= t0]
        return np.concatenate(chunks) if chunks else np.zeros(0, np.int16)

    def first_sound_after(self, t0: float, threshold: float = 500.0) -> float | None:
        """Arrival time of the first received frame after ``t0`` whose RMS exceeds ``threshold``."""
        for t, pcm in self.received:
            if t >= t0 and np.sqrt(np.mean(pcm.astype(np.float64) ** 2)) > threshold:
                return t
        return None

    async def close(self) -> None:
        await self.pc.close()
        if self._reader is not None:
            self._reader.cancel()


class WebRTCTransport(RtcClient):
    """The replay harness over WebRTC. The harness's 20 ms appends feed the microphone track; the
    answer's audio arrives on the track and is handed to the harness as
    ``response.output_audio.delta`` events (24 kHz, as over WebSocket) from the first audible frame
    after ``output_audio_buffer.started`` until ``stopped``/``cleared``: what a listener hears."""

    def __init__(self, http_url: str, api_key: str) -> None:
        super().__init__(http_url, api_key)
        self._queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._playing: str | None = None  # response id whose audio is on the track
        self._audible = False
        self._resample = Resampler(RATE, 24000)

    @classmethod
    async def open(cls, url: str, model: str, api_key: str | None) -> "WebRTCTransport":
        http_url = url.replace("ws://", "http://").replace("wss://", "https://").rstrip("/").removesuffix("/v1")
        transport = cls(http_url, api_key or "none")
        await transport.connect()
        return transport

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "output_audio_buffer.started":
            self._playing, self._audible = event["response_id"], False
        elif kind in ("output_audio_buffer.stopped", "output_audio_buffer.cleared"):
            self._playing = None
        elif kind == "response.output_item.added":
            self._item = event["item"]["id"]
        self._queue.put_nowait(event)

    def on_audio(self, t: float, pcm: np.ndarray) -> None:
        if self._playing is None:
            return
        if not self._audible and first_audible(pcm) is None:
            return  # the jitter buffer's lead-in: nothing heard yet
        self._audible = True
        pcm24 = self._resample(pcm)
        delta = base64.b64encode(pcm24.astype("<i2").tobytes()).decode()
        self._queue.put_nowait({"type": "response.output_audio.delta", "response_id": self._playing, "item_id": getattr(self, "_item", None), "delta": delta})

    async def send_audio(self, pcm16: bytes) -> None:
        self.mic.say(np.frombuffer(pcm16, "<i2"), 24000)

    async def send_event(self, event: dict[str, Any]) -> None:
        self.send(event)

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        while (event := await self._queue.get()) is not None:
            yield event

    async def close(self) -> None:
        self._queue.put_nowait(None)
        await super().close()
