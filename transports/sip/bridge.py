"""The SIP user agent server: phone calls over a SIP trunk land on the session engine.

One UDP socket takes every SIP message. This module is the I/O and the dispatch: it parses what
arrives, runs each request through its server transaction (``transaction``: the RFC 3261 state
machines, which own no socket or timer; here each gets one event-loop timer at its ``deadline``),
finds the dialog an in-dialog request belongs to (``dialog``), and says what each method means:

* INVITE (new): 100 Trying; a call (``SipCall``) is created and either accepted at once with the
  configured default session, or, with a webhook, announced as ``realtime.call.incoming`` and left
  ringing (180) until the application accepts or rejects it over HTTP. 488 when the offer has no
  PCMU/PCMA, 486 when the server is full, 503 when it is not serving.
* re-INVITE: the new offer's address is taken (a hold, a media move) and the same answer given.
* ACK ends the final response's retransmissions; CANCEL ends a call still ringing (487); BYE ends
  a call (200); OPTIONS and REGISTER get 200 (trunks probe with OPTIONS, softphones register
  first); NOTIFY in a call we REFERred is taken; anything else is 405, and requests for dialogs
  that do not exist get 481. Max-Forwards 0 is 483, a Require we do not know 420, a message we
  cannot parse 400 (505 for another SIP version) when it says where an answer would go.

A 2xx to an INVITE that is never ACKed within 64·T1 hangs the call up: the caller never confirmed
it. Finished transactions are remembered until their last timer (64·T1 at most) to absorb late
retransmissions, in a table with a fixed size. Our own requests (BYE, REFER) are client
transactions, resent until answered.

It also owns the one 20 ms clock that paces every answered call's outgoing RTP (``_run_clock``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import OrderedDict
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from realtime_omni.clock import Ticker
from realtime_omni.config import SipConfig
from realtime_omni.tasks import TaskSet

from . import message as sipmsg
from . import rtp
from .call import SipCall
from .dialog import Dialog
from .message import Addr, SipMessage, param, response
from .transaction import (
    T2,
    T4,
    Answered,
    ClientTransaction,
    Output,
    Send,
    ServerTransaction,
    TimedOut,
    transaction_key,
)

if TYPE_CHECKING:
    from realtime_omni.server import Server

log = logging.getLogger(__name__)

ALLOW = "INVITE, ACK, CANCEL, BYE, OPTIONS, REGISTER, NOTIFY, REFER"
MAX_TRANSACTIONS = 4096  # remembered server transactions (64·T1 each): a bound whatever the peers send
MAX_CLIENT_TRANSACTIONS = 1024

Transaction = ServerTransaction | ClientTransaction


class SipBridge(asyncio.DatagramProtocol):
    def __init__(self, server: Server, config: SipConfig) -> None:
        self.server = server
        self.config = config
        self.t1 = config.t1_ms / 1000
        self.t2 = T2
        self.t4 = T4
        self.transport: asyncio.DatagramTransport | None = None
        self.address: Addr = (config.host, config.port or 0)
        self.transactions: OrderedDict[tuple[str, ...], ServerTransaction] = OrderedDict()
        self.client: dict[str, tuple[ClientTransaction, asyncio.Future[SipMessage | None]]] = {}  # by branch
        self.calls: dict[str, SipCall] = {}  # by SIP Call-ID
        self.streaming: set[SipCall] = set()  # answered calls: one packet each per clock tick
        self.clock = Ticker(rtp.FRAME_SAMPLES / rtp.RATE)
        # one per transaction with a deadline: (the deadline, its handle). The deadline is kept here:
        # uvloop's call_at gives a plain Handle, without when(), for a time already past
        self._timers: dict[Transaction, tuple[float, asyncio.Handle]] = {}
        self.tasks = TaskSet("sip")
        self._clock: asyncio.Task[None] | None = None
        self.stats = {"received": 0, "malformed": 0, "retransmissions": 0, "responses_sent": 0}

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: self, local_addr=(self.config.host, self.config.port or 0))
        self.transport = transport  # type: ignore[assignment]
        self.address = transport.get_extra_info("sockname")[:2]
        self._clock = asyncio.create_task(self._run_clock(), name="sip-rtp-clock")
        log.info("SIP bridge listening on udp %s:%d", *self.address)

    async def stop(self) -> None:
        for call in list(self.calls.values()):
            await call.hangup("server_shutting_down")
        for _, timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
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

    def datagram_received(self, data: bytes, addr: Addr) -> None:  # type: ignore[override]
        self.stats["received"] += 1
        if not data.strip():
            return  # keep-alive (RFC 5626 CRLF)
        try:
            msg = sipmsg.parse(data)
        except sipmsg.SipVersionError:
            self._reject_raw(data, addr, 505)
            return
        except sipmsg.SipParseError as exc:
            self.stats["malformed"] += 1
            log.debug("malformed SIP from %s: %s", addr, exc)
            self._reject_raw(data, addr, 400, str(exc))
            return
        try:
            if msg.is_request:
                self._on_request(msg, addr)
            else:
                self._on_response(msg)
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

    # ------------------------------------------------------------------ transaction timers

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def _apply(self, tx: Transaction, outputs: list[Output], addr: Addr, *, timer: bool = False) -> None:
        """Carry out what a transaction asked for, then set its timer to its new deadline."""
        for out in outputs:
            if isinstance(out, Send):
                if timer:
                    self.stats["retransmissions"] += 1
                self.send(out.data, addr)
            elif isinstance(out, Answered):
                self._settle(tx, out.response)
            elif isinstance(out, TimedOut):
                self._timed_out(tx, out.status)
        old = self._timers.get(tx)
        if old is not None and old[0] == tx.deadline:
            return
        if old is not None:
            del self._timers[tx]
            old[1].cancel()
        if tx.deadline is not None:
            self._timers[tx] = (tx.deadline, asyncio.get_running_loop().call_at(tx.deadline, self._fire, tx))
        elif tx.terminated and isinstance(tx, ServerTransaction) and self.transactions.get(tx.key) is tx:
            del self.transactions[tx.key]

    def _fire(self, tx: Transaction) -> None:
        self._timers.pop(tx, None)
        self._apply(tx, tx.on_timer(self._now()), tx.addr, timer=True)

    def _timed_out(self, tx: Transaction, status: int) -> None:
        if isinstance(tx, ClientTransaction):
            self._settle(tx, None)
        elif 200 <= status < 300 and tx.call is not None:
            log.warning("call %s: no ACK for the 200 OK; hanging up", tx.call.id)
            self.spawn(tx.call.hangup("no_ack"), "sip-no-ack")

    # ------------------------------------------------------------------ server transactions

    def respond(self, tx: ServerTransaction, msg: SipMessage) -> None:
        self.stats["responses_sent"] += 1
        self._apply(tx, tx.respond(msg, self._now()), tx.addr)

    def acknowledged(self, tx: ServerTransaction) -> None:
        """The ACK for ``tx``'s final response came (for a 2xx, in the call's dialog)."""
        self._apply(tx, tx.on_ack(self._now()), tx.addr)

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
        if msg.method == "ACK":
            self._on_ack(msg)
            return
        key = transaction_key(msg)
        tx = self.transactions.get(key)
        if tx is not None:  # a retransmission: answer as before, do nothing twice
            self.stats["retransmissions"] += 1
            self._apply(tx, tx.on_request(self._now()), addr)
            return
        tx = ServerTransaction(key, addr, msg.method or "", t1=self.t1, t2=self.t2, t4=self.t4)
        self.transactions[key] = tx
        while len(self.transactions) > MAX_TRANSACTIONS:
            self.transactions.popitem(last=False)  # its timers run on: a 2xx still wants its ACK
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
        tx = self.transactions.get(transaction_key(msg))
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
            else:
                call.on_reinvite(msg, tx)
            return
        if msg.call_id in self.calls:  # same Call-ID, new branch, no To tag: a forked or looped copy
            self.respond(tx, response(msg, 482, reason="Loop Detected"))
            return
        SipCall.incoming(self, msg, tx)

    def _on_cancel(self, msg: SipMessage, tx: ServerTransaction) -> None:
        invite = self.transactions.get(transaction_key(SipMessage(method="INVITE", headers=msg.headers)))
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
        """Send a request and wait for its final response (a client transaction: resent at T1
        doubling to T2, given up after 64·T1). None when nothing final came back."""
        if len(self.client) >= MAX_CLIENT_TRANSACTIONS:
            return None
        tx = ClientTransaction(msg, addr, t1=self.t1, t2=self.t2, t4=self.t4)
        future: asyncio.Future[SipMessage | None] = asyncio.get_running_loop().create_future()
        self.client[tx.branch] = (tx, future)
        try:
            self._apply(tx, tx.start(self._now()), addr)
            return await future
        finally:
            # a response retransmitted after this is dropped unmatched: the same as Timer K absorbing it
            self.client.pop(tx.branch, None)
            timer = self._timers.pop(tx, None)
            if timer is not None:
                timer[1].cancel()

    def _settle(self, tx: Transaction, reply: SipMessage | None) -> None:
        entry = self.client.get(tx.branch) if isinstance(tx, ClientTransaction) else None
        if entry is not None and entry[0] is tx and not entry[1].done():
            entry[1].set_result(reply)

    def _on_response(self, msg: SipMessage) -> None:
        entry = self.client.get(msg.branch or "")
        if entry is not None:
            tx = entry[0]
            self._apply(tx, tx.on_response(msg, self._now()), tx.addr)


async def start_bridge(server: Server) -> SipBridge | None:
    """The bridge beside HTTP when the config names a SIP port (``sip.port``, ``--sip-port``)."""
    config = server.config.sip
    if config.port is None:
        return None
    bridge = SipBridge(server, config)
    await bridge.start()
    return bridge
