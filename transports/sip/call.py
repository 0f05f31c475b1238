"""One phone call: call control (ring, accept, reject, refer, hang up) and its RTP media.

Media in: RTP packets from the caller go through a bounded queue to one task that orders them
(``JitterBuffer``), decodes G.711 and hands the frames to the calls' one media-input path
(``MediaInput``: 8 kHz to the pipeline's rate, into the session). RFC 4733 DTMF packets become
``session.dtmf`` (``input_audio_buffer.dtmf_event_received``).
Media out: the session's ``Playout`` at 8 kHz is drained by the bridge's one 20 ms clock
(``SipBridge._run_clock``), one packet per call per tick (silence between answers, so the stream
and any NAT binding stay alive).

A call's state is a ``CallState``, changed only through one setter that refuses a move
``CALL_MOVES`` does not list:

    ringing -> accepting -> answered -> ended
    ringing | accepting -> rejected -> ended      (rejected, or the accept failed)
    ringing | accepting -> cancelled -> ended     (CANCEL before the answer)
    ringing | accepting -> ended                  (hung up before the answer: 603)

The call reports every move to its bridge (``Signalling.call_moved``), which owns the tables a call
sits in (by Call-ID, the answered calls its clock paces, the transactions): a call writes none.

Symmetric RTP (RFC 4961): we send to the address in the caller's SDP, unless its packets come
from another host (a NAT rewrote the address): then we answer where they come from. Once the
first packet has fixed the caller's source, packets from anywhere else are dropped, so a third
party cannot inject audio into the call. No packet for ``rtp_timeout_s`` ends a call whose
caller vanished without a BYE (the calls' one watchdog, ``Call.watch_media``).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import socket
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from realtime_omni.calls import Call, MediaInput
from realtime_omni.errors import RealtimeError
from realtime_omni.protocol import events as ev
from realtime_omni.server import Admission
from realtime_omni.session import Media
from realtime_omni.states import move
from realtime_omni.tasks import TaskSet

from . import message as sipmsg
from . import rtp, sdp, webhook
from .dialog import Dialog, dialog_for
from .message import Addr, SipMessage, response
from .transaction import ServerTransaction

if TYPE_CHECKING:
    from realtime_omni.config import SipConfig
    from realtime_omni.server import Server
    from realtime_omni.session import Session

log = logging.getLogger(__name__)

SILENCE = np.zeros(rtp.FRAME_SAMPLES, np.int16)
INBOUND_PACKETS = 100  # 2 s of 20 ms packets between the socket and the decoder; more is dropped


class CallState(enum.Enum):
    RINGING = "ringing"
    ACCEPTING = "accepting"  # a session and an RTP socket are being opened for it
    ANSWERED = "answered"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    ENDED = "ended"


_BEFORE_THE_ANSWER = (CallState.RINGING, CallState.ACCEPTING)
CALL_MOVES: dict[CallState, frozenset[CallState]] = {
    CallState.RINGING: frozenset({CallState.ACCEPTING, CallState.REJECTED, CallState.CANCELLED, CallState.ENDED}),
    CallState.ACCEPTING: frozenset({CallState.ANSWERED, CallState.REJECTED, CallState.CANCELLED, CallState.ENDED}),
    CallState.ANSWERED: frozenset({CallState.ENDED}),
    CallState.REJECTED: frozenset({CallState.ENDED}),
    CallState.CANCELLED: frozenset({CallState.ENDED}),
    CallState.ENDED: frozenset(),
}


class Signalling(Protocol):
    """What a call asks of the SIP signalling that carries it: ``bridge.SipBridge``, which imports
    this module (a call never imports the bridge)."""

    server: Server
    config: SipConfig
    address: Addr

    def call_moved(self, call: SipCall) -> None:
        """``call`` has moved to ``call.state`` (answered: pace its RTP; ended: forget it)."""

    def advertised(self, peer: Addr) -> str: ...
    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]: ...
    def respond(self, tx: ServerTransaction, msg: SipMessage) -> None: ...
    def acknowledged(self, tx: ServerTransaction) -> None: ...
    def request(self, dialog: Dialog, method: str, extra: list[tuple[str, str]] | None = None, body: bytes = b"") -> SipMessage: ...
    async def transact(self, msg: SipMessage, addr: Addr) -> SipMessage | None: ...


class RtpEndpoint(asyncio.DatagramProtocol):
    """The call's UDP socket: queues packets from the caller, counts and drops the rest."""

    def __init__(self, call: SipCall) -> None:
        self.call = call
        self.transport: asyncio.DatagramTransport | None = None
        self.queue: asyncio.Queue[rtp.Packet] = asyncio.Queue(INBOUND_PACKETS)
        self.source: Addr | None = None
        self.foreign = 0
        self.dropped = 0
        self.invalid = 0

    def datagram_received(self, data: bytes, addr: Addr) -> None:
        call = self.call
        if self.source is None:
            self.source = addr
            if addr[0] != call.remote[0]:  # NAT: answer where the audio really comes from
                call.remote = addr
        elif addr != self.source:
            self.foreign += 1
            return
        packet = rtp.parse(data)
        if packet is None:
            self.invalid += 1
            return
        if call.media is not None:
            call.media.arrived()
        try:
            self.queue.put_nowait(packet)
        except asyncio.QueueFull:
            self.dropped += 1


def _bind_rtp(host: str, low: int, high: int) -> socket.socket:
    """An even port in [low, high] (RTP even, RTCP odd: RFC 3550 11)."""
    for _ in range(64):
        port = random.randrange(low, high + 1) & ~1
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.bind((host, port))
            return sock
        except OSError:
            sock.close()
    raise OSError("no free RTP port in the configured range")


class SipCall(Call):
    kind = "sip"

    def __init__(self, bridge: Signalling, invite: SipMessage, tx: ServerTransaction, offer: sdp.Offer) -> None:
        super().__init__(bridge.server)
        self.bridge = bridge
        self.config = bridge.config
        self.invite = invite
        self.tx = tx
        self.offer = offer
        self.dialog: Dialog = dialog_for(invite, sipmsg.token(), tx.addr)
        self.remote: Addr = (offer.address, offer.port)
        self.state = CallState.RINGING
        self.answer_sdp = b""
        self.endpoint: RtpEndpoint | None = None
        self.media: MediaInput | None = None  # once answered
        self.tasks = TaskSet(self.id)
        self.jitter = rtp.JitterBuffer(offer.codec, depth=self.config.jitter_depth, max_depth=self.config.jitter_max_depth)
        self.dtmf = rtp.DtmfReceiver()
        self.sender = rtp.Sender(offer.codec)
        self.packets_sent = 0
        self.dtmf_events = 0
        self._refer: asyncio.Future[int] | None = None
        self._ring_timer: asyncio.TimerHandle | None = None
        self._sdp_id = random.randrange(1, 2**31)

    # ------------------------------------------------------------------ arrival

    @classmethod
    def incoming(cls, bridge: Signalling, invite: SipMessage, tx: ServerTransaction, *, ringing: int) -> SipCall | None:
        """A call for a new INVITE, or None once it is answered with a refusal: no usable SDP offer,
        the server not serving, or full (counting the ``ringing`` calls, each of which will want a
        session when answered). The bridge registers the call, then ``begin``s it."""
        server = bridge.server
        if (invite.get("Content-Type") or "").split(";")[0].strip().lower() != "application/sdp" or not invite.body:
            bridge.respond(tx, response(invite, 488, reason="Not Acceptable Here (an SDP offer is required)"))
            return None
        try:
            offer = sdp.parse_offer(invite.body.decode("utf-8", "replace"))
        except sdp.SdpError as exc:
            bridge.respond(tx, response(invite, exc.status, reason=f"{sipmsg.REASONS[exc.status]} ({exc})"))
            return None
        if not server.healthy:
            bridge.respond(tx, response(invite, 503, extra=[("Retry-After", "5")]))
            return None
        try:
            server.check_capacity(pending=ringing)
        except RealtimeError as err:
            bridge.respond(tx, response(invite, 486) if err.code == "max_sessions_reached" else response(invite, 503, extra=[("Retry-After", "5")]))
            return None
        call = cls(bridge, invite, tx, offer)
        call.endpoint = RtpEndpoint(call)  # its socket is bound when the call is accepted
        return call

    def begin(self) -> None:
        """100 Trying, then ring (180) for the webhook's application to accept, or accept at once."""
        bridge, invite = self.bridge, self.invite
        bridge.respond(self.tx, response(invite, 100))
        if self.config.webhook_url:
            bridge.respond(self.tx, response(invite, 180, to_tag=self.dialog.local_tag))
            self._ring_timer = asyncio.get_running_loop().call_later(self.config.ring_timeout_s, lambda: bridge.spawn(self.reject(480), "sip-ring-timeout"))
            bridge.spawn(self._announce(), f"sip-webhook:{self.id}")
        else:
            bridge.spawn(self._accept_default(), f"sip-accept:{self.id}")
        log.info("call %s: INVITE from %s (%s)", self.id, invite.get("From"), sdp.G711[self.offer.codec])

    async def _accept_default(self) -> None:
        try:
            await self.accept(ev.SessionObject())
        except RealtimeError as err:
            log.info("call %s: not accepted: %s", self.id, err.message)

    async def _announce(self) -> None:
        """``realtime.call.incoming`` to the application's webhook; a call it did not take up is
        declined (503)."""
        url = self.config.webhook_url
        assert url is not None
        status = await webhook.post(url, webhook.incoming_call(self.id, self.invite.headers), timeout=self.config.webhook_timeout_s)
        if not 200 <= status < 300 and self.state is CallState.RINGING:
            await self.reject(503)

    def _move(self, to: CallState) -> None:
        self.state = move(self.state, to, CALL_MOVES, f"call {self.id}")
        self.bridge.call_moved(self)

    # ------------------------------------------------------------------ call control (HTTP)

    async def accept(self, session_update: Any) -> None:
        if self.state is not CallState.RINGING:
            raise RealtimeError(f"Call {self.id!r} is not ringing (it is {self.state.value}).", code="call_state")
        self._move(CallState.ACCEPTING)
        if self._ring_timer is not None:
            self._ring_timer.cancel()
        server = self.server
        guard = self.config.interruption_guard
        media = Media(
            playout_rate=rtp.RATE,
            playout_buffer_ms=self.config.max_buffer_ms,
            interruption_guard=guard if guard.min_speech_ms or guard.grace_ms else None,
        )
        try:
            session = await server.open_session(
                beta=False, transport="sip", model=None, admission=Admission(None, None), updates=(self.config.session, session_update), media=media
            )
        except RealtimeError as err:
            await self._decline(486 if err.code == "max_sessions_reached" else 503 if err.type == "server_error" else 488)
            raise
        self.session = session
        try:
            await self._open_media()
        except OSError as exc:
            log.warning("call %s: no RTP socket: %s", self.id, exc)
            if self.state is CallState.ACCEPTING:
                await self._decline(503)
            raise RealtimeError("No RTP port is free for this call.", code="server_unavailable", type="server_error") from None
        await session.start()
        if self.state is not CallState.ACCEPTING:  # cancelled or hung up while the socket opened
            self._close_media()  # (the hang-up closed the session; the socket came after it)
            raise RealtimeError(f"Call {self.id!r} ended before it was answered.", code="call_state")
        self.start_events()
        host, port = self.bridge.advertised(self.dialog.addr), self._rtp_port()
        self.answer_sdp = sdp.answer(self.offer, host, port, session_id=self._sdp_id).encode()
        self._move(CallState.ANSWERED)
        self.media = media = MediaInput(session)
        media.arrived()  # the caller has rtp_timeout_s from the answer to send audio
        self.tasks.spawn(self._receive(session, media), "sip-rtp-in")
        self.tasks.spawn(self.watch_media(media, timeout=self.config.rtp_timeout_s, reason="rtp_timeout"), "sip-rtp-watch")
        self.bridge.respond(self.tx, self._ok(self.invite))
        log.info("call %s: answered (session %s)", self.id, session.id)

    def _ok(self, request: SipMessage) -> SipMessage:
        host, port = self.bridge.advertised(self.dialog.addr), self.bridge.address[1]
        extra = [("Contact", f"<sip:realtime-omni@{host}:{port}>"), ("Allow", "INVITE, ACK, CANCEL, BYE, OPTIONS, NOTIFY"), ("Content-Type", "application/sdp")]
        return response(request, 200, to_tag=self.dialog.local_tag, extra=extra, body=self.answer_sdp)

    async def reject(self, status_code: int) -> None:
        if self.state is not CallState.RINGING:
            raise RealtimeError(f"Call {self.id!r} is not ringing (it is {self.state.value}).", code="call_state")
        await self._decline(status_code)

    async def _decline(self, status_code: int) -> None:
        """The final answer to the INVITE is ``status_code``, and the call is over."""
        self.bridge.respond(self.tx, response(self.invite, status_code, to_tag=self.dialog.local_tag))
        self._move(CallState.REJECTED)
        await self.hangup("rejected")

    async def refer(self, target_uri: str) -> None:
        if self.state is not CallState.ANSWERED:
            raise RealtimeError(f"Call {self.id!r} is not answered (it is {self.state.value}).", code="call_state")
        msg = self.bridge.request(self.dialog, "REFER", [("Refer-To", f"<{target_uri}>"), ("Referred-By", f"<{self.dialog.local_uri}>")])
        reply = await self.bridge.transact(msg, self.dialog.next_hop)
        if reply is None or not 200 <= reply.status < 300:
            status = f"{reply.status} {reply.reason}" if reply else "no answer"
            raise RealtimeError(f"The caller's side refused the transfer ({status}).", code="refer_failed")
        log.info("call %s: referred to %s", self.id, target_uri)

    async def cancelled(self) -> None:
        """CANCEL before the answer (RFC 3261 9.2): 487 to the INVITE, and the call is gone."""
        if self.state in _BEFORE_THE_ANSWER:
            self.bridge.respond(self.tx, response(self.invite, 487, to_tag=self.dialog.local_tag))
            self._move(CallState.CANCELLED)
            await self.hangup("caller_cancelled")

    async def _teardown(self) -> None:
        if self._ring_timer is not None:
            self._ring_timer.cancel()
        if self.state in _BEFORE_THE_ANSWER:  # hung up before the answer: decline it
            self.bridge.respond(self.tx, response(self.invite, 603, to_tag=self.dialog.local_tag))
        elif self.state is CallState.ANSWERED and self.end_reason not in ("caller_hangup",):
            self.bridge.spawn(self.bridge.transact(self.bridge.request(self.dialog, "BYE"), self.dialog.next_hop), f"sip-bye-out:{self.id}")
        self._move(CallState.ENDED)  # (the bridge stops pacing and forgets it)
        await self.tasks.cancel()
        self._close_media()

    def _close_media(self) -> None:
        if self.endpoint is not None and self.endpoint.transport is not None:
            self.endpoint.transport.close()

    # ------------------------------------------------------------------ in-dialog requests

    def on_ack(self, msg: SipMessage) -> None:
        self.dialog.confirmed = True
        self.bridge.acknowledged(self.tx)

    def on_reinvite(self, msg: SipMessage, tx: ServerTransaction) -> bool:
        """A re-INVITE (hold, media move, session refresh): take the new address, keep our answer.
        True when answered 200: ``tx`` is then the call's INVITE transaction (its ACK is awaited)."""
        if self.state is not CallState.ANSWERED:
            self.bridge.respond(tx, response(msg, 491))
            return False
        if msg.body:
            try:
                offer = sdp.parse_offer(msg.body.decode("utf-8", "replace"))
            except sdp.SdpError as exc:
                self.bridge.respond(tx, response(msg, exc.status))
                return False
            if offer.codec != self.offer.codec:  # keep the codec this call started with
                self.bridge.respond(tx, response(msg, 488, reason="Not Acceptable Here (codec change)"))
                return False
            self.remote = (offer.address, offer.port)
            if self.endpoint is not None:
                self.endpoint.source = None  # latch anew on the moved stream
            self.offer = offer
        host, port = self.bridge.advertised(self.dialog.addr), self._rtp_port()
        self.answer_sdp = sdp.answer(self.offer, host, port, session_id=self._sdp_id).encode()
        self.tx = tx
        log.info("call %s: re-INVITE (caller's media at %s:%d)", self.id, *self.remote)
        self.bridge.respond(tx, self._ok(msg))
        return True

    def on_notify(self, msg: SipMessage) -> None:
        """Progress of a transfer we asked for (RFC 3515): a 2xx sipfrag means the caller is now
        talking to the target, so this call is over."""
        body = msg.body.decode("utf-8", "replace").strip()
        if body.startswith("SIP/2.0 2"):
            self.bridge.spawn(self.hangup("referred"), f"sip-referred:{self.id}")

    # ------------------------------------------------------------------ media

    def _rtp_port(self) -> int:
        endpoint = self.endpoint
        assert endpoint is not None and endpoint.transport is not None, "the call's media is open"
        return int(endpoint.transport.get_extra_info("sockname")[1])

    async def _open_media(self) -> None:
        endpoint = self.endpoint
        assert endpoint is not None
        sock = _bind_rtp(self.bridge.config.host, self.config.rtp_port_min, self.config.rtp_port_max)
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: endpoint, sock=sock)
        endpoint.transport = transport

    async def _receive(self, session: Session, media: MediaInput) -> None:
        assert self.endpoint is not None
        queue = self.endpoint.queue
        while True:
            packet = await queue.get()
            if packet.payload_type == self.offer.dtmf:
                digit = self.dtmf.put(packet)
                if digit is not None:
                    self.dtmf_events += 1
                    await session.dtmf(digit)
                continue
            if packet.payload_type != self.offer.codec:
                continue  # comfort noise (13) and anything not negotiated
            frames = self.jitter.put(packet.seq, packet.payload)
            if not frames:
                continue
            await media.push(np.concatenate(frames) if len(frames) > 1 else frames[0], rtp.RATE)

    def tick(self) -> None:
        """One tick of the bridge's 20 ms clock: the next frame of the answer, or silence."""
        playout, endpoint = self.session.playout if self.session else None, self.endpoint
        if playout is None or endpoint is None or endpoint.transport is None or endpoint.transport.is_closing():
            return
        pcm = playout.frame()
        if pcm is None:
            pcm = SILENCE
        endpoint.transport.sendto(self.sender.packet(pcm, speech=playout.playing is not None), self.remote)
        self.packets_sent += 1

