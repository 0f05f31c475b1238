"""The SIP user agent server: phone calls over a SIP trunk land on the session engine.

One UDP socket takes every SIP message. This module is the I/O and the dispatch: it parses what
arrives, runs each request through its server transaction (``transaction``: the RFC 3261 state
machines, which own no socket or timer; here each gets one event-loop timer at its ``deadline``),
finds the dialog an in-dialog request belongs to (``dialog``), and says what each method means:

* Who may call (``admission``): a request from a source not in ``sip.allowed_sources`` gets 403;
  with ``sip.credentials``, an INVITE opening a call is challenged (401) and admitted only with
  the right digest answer (403 otherwise).
* INVITE (new): 100 Trying; a call (``SipCall``) is created and either accepted at once with the
  configured default session, or, with a webhook, announced as ``realtime.call.incoming`` and left
  ringing (180) until the application accepts or rejects it over HTTP. 488 when the offer has no
  PCMU/PCMA, 486 when the server is full, 503 when it is not serving.
* re-INVITE: the new offer's address is taken (a hold, a media move) and the same answer given.
* ACK ends the final response's retransmissions; CANCEL ends a call still ringing (487); BYE ends
  a call (200); OPTIONS gets 200 (trunks and balancers probe with it; 503 while the server
  starts or drains, 481 in a dialog we do not hold) and REGISTER 200 (softphones register
  first); NOTIFY in a call we REFERred is taken; anything else is 405, and requests for dialogs
  that do not exist get 481. Max-Forwards 0 is 483, a Require we do not know 420, a message we
  cannot parse 400 (505 for another SIP version) when it says where an answer would go.

A 2xx to an INVITE that is never ACKed within 64·T1 hangs the call up: the caller never confirmed
it. The transactions in flight and their timers are ``inflight.Transactions``'s; our own requests
(BYE, REFER) are client transactions there, resent until answered. The bridge registers its calls
(by Call-ID) and paces the answered ones; a call reports its moves (``call_moved``).

It also owns the one 20 ms clock that paces every answered call's outgoing RTP (``_run_clock``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from realtime_omni.clock import Ticker
from realtime_omni.config import SipConfig
from realtime_omni.tasks import TaskSet

from . import message as sipmsg
from . import rtp
from .admission import Admission
from .call import CallState, SipCall
from .dialog import Dialog
from .inflight import Transactions
from .message import Addr, SipMessage, param, response
from .registration import Registration
from .transaction import ServerTransaction, transaction_key

if TYPE_CHECKING:
    from realtime_omni.server import Server

log = logging.getLogger(__name__)

ALLOW = "INVITE, ACK, CANCEL, BYE, OPTIONS, REGISTER, NOTIFY, REFER"


class SipBridge(asyncio.DatagramProtocol):
    def __init__(self, server: Server, config: SipConfig) -> None:
        self.server = server
        self.config = config
        self.transport: asyncio.DatagramTransport | None = None
        self.address: Addr = (config.host, config.port or 0)
        self.transactions = Transactions(self.send, config.t1_ms / 1000, self._unacknowledged)
        self.calls: dict[str, SipCall] = {}  # by SIP Call-ID
        self.streaming: set[SipCall] = set()  # answered calls: one packet each per clock tick
        self.clock = Ticker(rtp.FRAME_SAMPLES / rtp.RATE)
        self.tasks = TaskSet("sip")
        self._clock: asyncio.Task[None] | None = None
        self.admission = Admission(config)
        self.registration = Registration(self, config.register) if config.register is not None else None
        self._registering: asyncio.Task[None] | None = None
        self.received = 0
        self.malformed = 0

    @property
    def stats(self) -> dict[str, int]:
        tx = self.transactions
        return {"received": self.received, "malformed": self.malformed, "retransmissions": tx.retransmissions, "responses_sent": tx.responses_sent,
                "refused": self.admission.refused, "registered": int(self.registration is not None and self.registration.registered)}

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: self, local_addr=(self.config.host, self.config.port or 0))
        self.transport = transport
        self.address = transport.get_extra_info("sockname")[:2]
        self._clock = asyncio.create_task(self._run_clock(), name="sip-rtp-clock")
        log.info("SIP bridge listening on udp %s:%d", *self.address)
        if self.registration is not None:
            self._registering = asyncio.create_task(self.registration.run(), name="sip-register")
        if not self.admission.restricted and not _loopback(self.address[0]):
            log.warning("SIP bridge on %s:%d takes calls from anyone who reaches it: set sip.allowed_sources (your trunk's addresses) "
                        "and/or sip.credentials (digest authentication); docs/telephony.md#who-may-call", *self.address)

    async def stop(self) -> None:
        for call in list(self.calls.values()):
            await call.hangup("server_shutting_down")
        if self._registering is not None:
            self._registering.cancel()
            await asyncio.gather(self._registering, return_exceptions=True)
        if self.registration is not None:
            await self.registration.unregister()  # the provider stops sending calls to a bridge that is gone
        self.transactions.close()
        if self._clock is not None:
            self._clock.cancel()
        await self.tasks.cancel()
        await asyncio.gather(*(t for t in [self._clock] if t), return_exceptions=True)
        if self.transport is not None:
            self.transport.close()

    def advertised(self, peer: Addr) -> str:
        """The address to put in SDP, Contact and Via for ``peer``: ``sip.advertise``, else the bound
        address, else (bound to every interface) the one this host uses to reach the peer."""
        if self.config.advertise:
            return self.config.advertise
        host = self.address[0]
        if host not in ("0.0.0.0", "::", ""):
            return host
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect(peer)  # UDP: no packet is sent, the kernel only picks a route
                return str(probe.getsockname()[0])
            except OSError:
                return "127.0.0.1"

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        return self.tasks.spawn(coro, name)

    # ------------------------------------------------------------------ wire

    def send(self, msg: SipMessage | bytes, addr: Addr) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(msg if isinstance(msg, bytes) else msg.encode(), addr)

    def datagram_received(self, data: bytes, addr: Addr) -> None:
        self.received += 1
        if not data.strip():
            return  # keep-alive (RFC 5626 CRLF)
        try:
            msg = sipmsg.parse(data)
        except sipmsg.SipVersionError:
            self._reject_raw(data, addr, 505)
            return
        except sipmsg.SipParseError as exc:
            self.malformed += 1
            log.debug("malformed SIP from %s: %s", addr, exc)
            self._reject_raw(data, addr, 400, str(exc))
            return
        try:
            if msg.is_request:
                self._on_request(msg, addr)
            else:
                self.transactions.response_received(msg)
        except Exception:  # one bad message must never take the bridge down
            log.exception("SIP: failed on %s from %s", msg.method or msg.status, addr)
            if msg.is_request and msg.method != "ACK":
                self.send(response(msg, 500), addr)

    def _reject_raw(self, data: bytes, addr: Addr, status: int, why: str = "") -> None:
        """Answer a message we could not parse when it has enough to address an answer to
        (RFC 3261 says a UAS should answer 400 if it can); otherwise drop it."""
        try:
            text = data[:4096].decode("utf-8", "replace").replace("\r\n", "\n")
            lines = text.split("\n")
            if lines[0].startswith("SIP/") or lines[0].startswith("ACK "):
                return
            keep = [ln for ln in lines[1:] if ln.split(":")[0].strip().lower() in ("via", "v", "from", "f", "to", "t", "call-id", "i", "cseq")]
            if not any(ln.split(":")[0].strip().lower() in ("via", "v") for ln in keep):
                return
            msg = SipMessage(method="X", headers=[])
            for ln in keep:
                name, _, value = ln.partition(":")
                key = sipmsg.COMPACT.get(name.strip().lower(), name.strip().lower())
                msg.headers.append((sipmsg.CANONICAL.get(key, key), value.strip()))
            for required in ("From", "To", "Call-ID", "CSeq"):
                if msg.get(required) is None:
                    msg.headers.append((required, ""))
            reason = f"Bad Request ({why[:80]})" if status == 400 and why else None
            self.send(response(msg, status, reason=reason), addr)
        except Exception:
            log.debug("could not answer a malformed message", exc_info=True)

    # ------------------------------------------------------------------ server transactions

    def respond(self, tx: ServerTransaction, msg: SipMessage) -> None:
        self.transactions.respond(tx, msg)

    def acknowledged(self, tx: ServerTransaction) -> None:
        """The ACK for ``tx``'s final response came (for a 2xx, in the call's dialog)."""
        self.transactions.acknowledged(tx)

    def _unacknowledged(self, tx: ServerTransaction) -> None:
        if tx.call is not None:
            log.warning("call %s: no ACK for the 200 OK; hanging up", tx.call.id)
            self.spawn(tx.call.hangup("no_ack"), "sip-no-ack")

    async def _run_clock(self) -> None:
        """The one 20 ms clock of every call's outgoing RTP. One timer for all calls instead of one
        each: a busy event loop then delays a tick once rather than N timers at N moments, which
        keeps every stream's packet spacing steady with many calls. A tick more than 100 ms late
        resynchronises instead of sending a burst."""
        while True:
            await self.clock.wait()
            for call in list(self.streaming):
                try:
                    call.tick()
                except Exception:  # one call's trouble must not stop every call's audio
                    log.exception("call %s: sending RTP failed; hanging up", call.id)
                    self.streaming.discard(call)
                    self.spawn(call.hangup("media_error"), f"hangup:{call.id}")

    def _on_request(self, msg: SipMessage, addr: Addr) -> None:
        allowed = self.admission.source_allowed(addr[0])
        if msg.method == "ACK":
            if not allowed:
                return
            self._on_ack(msg)
            return
        key = transaction_key(msg)
        tx = self.transactions.server.get(key)
        if tx is not None:  # a retransmission: answer as before, do nothing twice
            self.transactions.retransmitted(tx, addr)
            return
        tx = self.transactions.open(key, addr, msg.method or "")
        if not allowed:
            self.respond(tx, self.admission.forbidden_source(msg))
            return
        max_forwards = msg.get("Max-Forwards")
        if max_forwards is not None and max_forwards.strip() == "0":
            self.respond(tx, response(msg, 483))
            return
        require = msg.get("Require")
        if require and msg.method != "CANCEL":
            self.respond(tx, response(msg, 420, extra=[("Unsupported", require)]))
            return
        handler = {
            "INVITE": self._on_invite,
            "CANCEL": self._on_cancel,
            "BYE": self._on_bye,
            "OPTIONS": self._on_options,
            "REGISTER": self._on_register,
            "NOTIFY": self._on_notify,
        }.get(msg.method or "")
        if handler is None:
            self.respond(tx, response(msg, 405, extra=[("Allow", ALLOW)]))
            return
        handler(msg, tx)

    def _dialog_call(self, msg: SipMessage) -> SipCall | None:
        """The call an in-dialog request belongs to: Call-ID and both tags must match."""
        call = self.calls.get(msg.call_id)
        if call is None or call.dialog is None or not call.dialog.matches(msg):
            return None
        return call

    def _on_ack(self, msg: SipMessage) -> None:
        tx = self.transactions.server.get(transaction_key(msg))
        if tx is not None and tx.invite and not 200 <= tx.final < 300:  # ACK for a non-2xx final response (same transaction)
            self.acknowledged(tx)
            return
        call = self._dialog_call(msg)  # ACK for a 2xx: a transaction of its own, in the dialog
        if call is not None:
            call.on_ack(msg)
        # an ACK is never answered, whatever it matched

    def _on_invite(self, msg: SipMessage, tx: ServerTransaction) -> None:
        if param(msg.get("To") or "", "tag") is not None:
            call = self._dialog_call(msg)
            if call is None:
                self.respond(tx, response(msg, 481))
            elif call.on_reinvite(msg, tx):
                tx.call = call
            return
        if msg.call_id in self.calls:  # same Call-ID, new branch, no To tag: a forked or looped copy
            self.respond(tx, response(msg, 482, reason="Loop Detected"))
            return
        refusal = self.admission.refusal(msg)
        if refusal is not None:
            self.respond(tx, refusal)
            return
        call = SipCall.incoming(self, msg, tx, ringing=sum(1 for c in self.calls.values() if c.session is None))
        if call is None:
            return
        tx.call = call
        self.calls[msg.call_id] = call
        self.server.calls.add(call)
        self.spawn(self.server.calls.publish(call), f"sip-publish:{call.id}")
        call.begin()

    def call_moved(self, call: SipCall) -> None:
        """A call reports its move: answered, its RTP is paced by the clock; ended, it is forgotten."""
        if call.state is CallState.ANSWERED:
            self.streaming.add(call)
        elif call.state is CallState.ENDED:
            self.streaming.discard(call)
            if self.calls.get(call.dialog.call_id) is call:
                del self.calls[call.dialog.call_id]

    def _on_cancel(self, msg: SipMessage, tx: ServerTransaction) -> None:
        invite = self.transactions.server.get(transaction_key(SipMessage(method="INVITE", headers=msg.headers)))
        if invite is None or invite.call is None:
            self.respond(tx, response(msg, 481))
            return
        self.respond(tx, response(msg, 200))
        if not invite.final:
            self.spawn(invite.call.cancelled(), "sip-cancel")

    def _on_bye(self, msg: SipMessage, tx: ServerTransaction) -> None:
        call = self._dialog_call(msg)
        if call is None:
            self.respond(tx, response(msg, 481))
            return
        self.respond(tx, response(msg, 200))
        self.spawn(call.hangup("caller_hangup"), "sip-bye")

    def _on_options(self, msg: SipMessage, tx: ServerTransaction) -> None:
        """Out of a dialog, a probe (a trunk's, a balancer's): 200 while the server takes calls, 503
        while it starts or drains, so that a balancer sends new calls elsewhere. In a dialog (a
        proxy's keep-alive of a call): 200 while we hold the call, 481 once we do not (a restarted
        replica), so the proxy ends it."""
        if param(msg.get("To") or "", "tag") is not None:
            if self._dialog_call(msg) is None:
                self.respond(tx, response(msg, 481))
                return
        elif not self.server.healthy:
            self.respond(tx, response(msg, 503, extra=[("Retry-After", "5")]))
            return
        self.respond(tx, response(msg, 200, extra=[("Allow", ALLOW), ("Accept", "application/sdp")]))

    def _on_register(self, msg: SipMessage, tx: ServerTransaction) -> None:
        """Registration is accepted and forgotten: calls come in, none go out, so there is
        nothing to route to a registered contact."""
        extra = [("Contact", c) for c in msg.get_all("Contact")]
        expires = msg.get("Expires")
        if expires is not None:
            extra.append(("Expires", expires))
        self.respond(tx, response(msg, 200, to_tag=sipmsg.token(), extra=extra))

    def _on_notify(self, msg: SipMessage, tx: ServerTransaction) -> None:
        call = self._dialog_call(msg)
        if call is None:
            self.respond(tx, response(msg, 481))
            return
        self.respond(tx, response(msg, 200))
        call.on_notify(msg)

    # ------------------------------------------------------------------ our requests

    def request(self, dialog: Dialog, method: str, extra: list[tuple[str, str]] | None = None, body: bytes = b"") -> SipMessage:
        return dialog.request(method, self.advertised(dialog.addr), self.address[1], extra, body)

    async def transact(self, msg: SipMessage, addr: Addr) -> SipMessage | None:
        """Send a request and wait for its final response (None: nothing final came back)."""
        return await self.transactions.transact(msg, addr)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


async def start_bridge(server: Server) -> SipBridge | None:
    """The bridge beside HTTP when the config names a SIP port (``sip.port``, ``--sip-port``)."""
    config = server.config.sip
    if config.port is None:
        return None
    bridge = SipBridge(server, config)
    await bridge.start()
    return bridge
