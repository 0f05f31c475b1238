"""The SIP user agent server: phone calls over a SIP trunk land on the session engine.

One UDP socket takes every SIP message. This module is the signalling: server transactions with
RFC 3261's retransmission rules over UDP, dialogs, and what each method means here:

* INVITE (new): 100 Trying; a call (``SipCall``) is created and either accepted at once with the
  configured default session, or, with a webhook, announced as ``realtime.call.incoming`` and left
  ringing (180) until the application accepts or rejects it over HTTP. 488 when the offer has no
  PCMU/PCMA, 486 when the server is full, 503 when it is not serving.
* re-INVITE: the new offer's address is taken (a hold, a media move) and the same answer given.
* ACK ends the final response's retransmissions; CANCEL ends a call still ringing (487); BYE ends
  a call (200); OPTIONS and REGISTER get 200 (trunks probe with OPTIONS, softphones register
  first); NOTIFY in a call we REFERred is taken; anything else is 405, and requests for dialogs
  that do not exist get 481.

Transactions (RFC 3261 17.2): a retransmitted request is answered with the response already sent
(never handled twice). A final INVITE response is resent at T1, 2·T1, ... up to T2 until the ACK
comes, and given up after 64·T1 (for a 2xx the call is then hung up: the caller never confirmed
it). Finished transactions are remembered for 64·T1 to absorb late retransmissions, in a table
with a fixed size. Our own requests (BYE, REFER) are resent the same way until answered.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from realtime_omni.config import SipConfig
from realtime_omni.media.clock import Ticker

from . import message as sipmsg
from . import rtp
from .message import Message, param, response, uri_of

if TYPE_CHECKING:
    from realtime_omni.server import Server

    from .call import SipCall

log = logging.getLogger(__name__)

ALLOW = "INVITE, ACK, CANCEL, BYE, OPTIONS, REGISTER, NOTIFY, REFER"
MAX_TRANSACTIONS = 4096  # remembered server transactions (64·T1 each): a bound whatever the peers send
MAX_CLIENT_TRANSACTIONS = 1024

Addr = tuple[str, int]


@dataclass
class ServerTransaction:
    key: tuple[str, ...]
    addr: Addr
    invite: bool
    last: bytes | None = None  # the last response sent: resent on a retransmitted request
    final: int = 0
    acked: asyncio.Event = field(default_factory=asyncio.Event)
    expires: float = 0.0
    call: SipCall | None = None


@dataclass
class Dialog:
    """Our side of a call's dialog (RFC 3261 12): what in-dialog requests we send must carry."""

    call_id: str
    local_tag: str
    remote_tag: str
    local_uri: str  # the To of the INVITE: becomes our From
    remote_uri: str  # the From of the INVITE: becomes our To
    remote_target: str  # the caller's Contact: the Request-URI of our requests
    route: list[str]
    addr: Addr  # where the caller's signalling comes from
    local_cseq: int = 1
    confirmed: bool = False  # ACK received


class SipBridge(asyncio.DatagramProtocol):
    def __init__(self, server: Server, config: SipConfig) -> None:
        self.server = server
        self.config = config
        self.t1 = config.t1_ms / 1000
        self.t2 = 4.0
        self.transport: asyncio.DatagramTransport | None = None
        self.address: Addr = (config.host, config.port or 0)
        self.transactions: OrderedDict[tuple[str, ...], ServerTransaction] = OrderedDict()
        self.client: dict[str, asyncio.Future[Message]] = {}
        self.calls: dict[str, SipCall] = {}  # by SIP Call-ID
        self.streaming: set[SipCall] = set()  # answered calls: one packet each per clock tick
        self.clock = Ticker(rtp.FRAME_SAMPLES / rtp.RATE)
        self._tasks: set[asyncio.Task[object]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._clock: asyncio.Task[None] | None = None
        self.stats = {"received": 0, "malformed": 0, "retransmissions": 0, "responses_sent": 0}

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: self, local_addr=(self.config.host, self.config.port or 0))
        self.transport = transport  # type: ignore[assignment]
        self.address = transport.get_extra_info("sockname")[:2]
        self._sweeper = asyncio.create_task(self._sweep(), name="sip-sweep")
        self._clock = asyncio.create_task(self._run_clock(), name="sip-rtp-clock")
        log.info("SIP bridge listening on udp %s:%d", *self.address)

    async def stop(self) -> None:
        for call in list(self.calls.values()):
            await call.hangup("server_shutting_down")
        for task in [*self._tasks, self._sweeper, self._clock]:
            if task is not None:
                task.cancel()
        await asyncio.gather(*self._tasks, *(t for t in [self._sweeper, self._clock] if t), return_exceptions=True)
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

    def spawn(self, coro: object, name: str) -> asyncio.Task[object]:
        task = asyncio.ensure_future(coro)  # type: ignore[arg-type]
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ wire

    def send(self, msg: Message | bytes, addr: Addr) -> None:
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
            msg = Message(method="X", headers=[])
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

    def _key(self, msg: Message) -> tuple[str, ...]:
        method = "INVITE" if msg.method == "ACK" else msg.method or ""
        branch = msg.branch
        if branch and branch.startswith("z9hG4bK"):
            return (branch, (msg.get("Via") or "").split(";")[0].strip(), method)
        # RFC 2543 peers: no magic cookie; match on the dialog and CSeq instead
        return (msg.call_id, param(msg.get("From") or "", "tag") or "", str(msg.cseq[0]), method)

    def respond(self, tx: ServerTransaction, msg: Message) -> None:
        data = msg.encode()
        tx.last = data
        self.stats["responses_sent"] += 1
        self.send(data, tx.addr)
        if msg.status >= 200 and not tx.final:
            tx.final = msg.status
            tx.expires = time.monotonic() + 64 * self.t1
            if tx.invite:
                self.spawn(self._retransmit_final(tx), "sip-retransmit")

    async def _retransmit_final(self, tx: ServerTransaction) -> None:
        """Timer G (and the UAS core's 2xx retransmission): resend until the ACK; Timer H: give up."""
        interval, deadline = self.t1, time.monotonic() + 64 * self.t1
        while not tx.acked.is_set():
            try:
                await asyncio.wait_for(tx.acked.wait(), interval)
                return
            except TimeoutError:
                pass
            if time.monotonic() >= deadline:
                if 200 <= tx.final < 300 and tx.call is not None:
                    log.warning("call %s: no ACK for the 200 OK; hanging up", tx.call.id)
                    await tx.call.hangup("no_ack")
                return
            if tx.last is not None:
                self.stats["retransmissions"] += 1
                self.send(tx.last, tx.addr)
            interval = min(interval * 2, self.t2)

    async def _run_clock(self) -> None:
        """The one 20 ms clock of every call's outgoing RTP. One timer for all calls instead of one
        each: a busy event loop then delays a tick once rather than N timers at N moments, which
        keeps every stream's packet spacing steady with many calls. A tick more than 100 ms late
        resynchronises instead of sending a burst."""
        while True:
            await self.clock.wait()
            for call in list(self.streaming):
                call.tick()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for key in [k for k, tx in self.transactions.items() if tx.expires and tx.expires < now]:
                del self.transactions[key]

    def _on_request(self, msg: Message, addr: Addr) -> None:
        if msg.method == "ACK":
            self._on_ack(msg)
            return
        key = self._key(msg)
        tx = self.transactions.get(key)
        if tx is not None:  # a retransmission: answer as before, do nothing twice
            self.stats["retransmissions"] += 1
            if tx.last is not None:
                self.send(tx.last, addr)
            return
        tx = ServerTransaction(key, addr, invite=msg.method == "INVITE")
        self.transactions[key] = tx
        while len(self.transactions) > MAX_TRANSACTIONS:
            self.transactions.popitem(last=False)
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

    def _dialog_call(self, msg: Message) -> SipCall | None:
        """The call an in-dialog request belongs to: Call-ID and both tags must match."""
        call = self.calls.get(msg.call_id)
        if call is None or call.dialog is None:
            return None
        d = call.dialog
        if param(msg.get("To") or "", "tag") != d.local_tag or param(msg.get("From") or "", "tag") != d.remote_tag:
            return None
        return call

    def _on_ack(self, msg: Message) -> None:
        tx = self.transactions.get(self._key(msg))
        if tx is not None and tx.invite:  # ACK for a non-2xx final response (same transaction)
            tx.acked.set()
            tx.expires = time.monotonic() + 5.0  # Timer I (T4): absorb ACK retransmissions
            return
        call = self._dialog_call(msg)  # ACK for a 2xx: a transaction of its own, in the dialog
        if call is not None:
            call.on_ack(msg)
        # an ACK is never answered, whatever it matched

    def _on_invite(self, msg: Message, tx: ServerTransaction) -> None:
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
        from .call import SipCall

        SipCall.incoming(self, msg, tx)

    def _on_cancel(self, msg: Message, tx: ServerTransaction) -> None:
        invite = self.transactions.get(self._key(Message(method="INVITE", headers=msg.headers)))
        if invite is None or invite.call is None:
            self.respond(tx, response(msg, 481))
            return
        self.respond(tx, response(msg, 200))
        if not invite.final:
            self.spawn(invite.call.cancelled(), "sip-cancel")

    def _on_bye(self, msg: Message, tx: ServerTransaction) -> None:
        call = self._dialog_call(msg)
        if call is None:
            self.respond(tx, response(msg, 481))
            return
        self.respond(tx, response(msg, 200))
        self.spawn(call.hangup("caller_hangup"), "sip-bye")

    def _on_options(self, msg: Message, tx: ServerTransaction) -> None:
        self.respond(tx, response(msg, 200, extra=[("Allow", ALLOW), ("Accept", "application/sdp")]))

    def _on_register(self, msg: Message, tx: ServerTransaction) -> None:
        """Registration is accepted and forgotten: calls come in, none go out, so there is
        nothing to route to a registered contact."""
        extra = [("Contact", c) for c in msg.get_all("Contact")]
        expires = msg.get("Expires")
        if expires is not None:
            extra.append(("Expires", expires))
        self.respond(tx, response(msg, 200, to_tag=sipmsg.token(), extra=extra))

    def _on_notify(self, msg: Message, tx: ServerTransaction) -> None:
        call = self._dialog_call(msg)
        if call is None:
            self.respond(tx, response(msg, 481))
            return
        self.respond(tx, response(msg, 200))
        call.on_notify(msg)

    # ------------------------------------------------------------------ our requests

    def request(self, dialog: Dialog, method: str, extra: list[tuple[str, str]] | None = None, body: bytes = b"") -> Message:
        dialog.local_cseq += 1
        branch = "z9hG4bK" + sipmsg.token(16)
        host, port = self.advertised(dialog.addr), self.address[1]
        headers = [
            ("Via", f"SIP/2.0/UDP {host}:{port};branch={branch};rport"),
            ("Max-Forwards", "70"),
            ("From", f"<{dialog.local_uri}>;tag={dialog.local_tag}"),
            ("To", f"<{dialog.remote_uri}>;tag={dialog.remote_tag}"),
            ("Call-ID", dialog.call_id),
            ("CSeq", f"{dialog.local_cseq} {method}"),
            *[("Route", r) for r in dialog.route],
            ("Contact", f"<sip:realtime-omni@{host}:{port}>"),
            ("User-Agent", "realtime-omni"),
            *(extra or []),
        ]
        return Message(method=method, uri=dialog.remote_target, headers=headers, body=body)

    async def transact(self, msg: Message, addr: Addr) -> Message | None:
        """Send a request and wait for its final response (Timer E: resend at T1 doubling to T2;
        Timer F: give up after 64·T1). None when nothing final came back."""
        branch = msg.branch or ""
        if len(self.client) >= MAX_CLIENT_TRANSACTIONS:
            return None
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self.client[branch] = future
        data = msg.encode()
        interval, deadline = self.t1, time.monotonic() + 64 * self.t1
        try:
            while True:
                self.send(data, addr)
                try:
                    return await asyncio.wait_for(asyncio.shield(future), min(interval, max(0.0, deadline - time.monotonic())))
                except TimeoutError:
                    if time.monotonic() >= deadline:
                        return None
                interval = min(interval * 2, self.t2)
        finally:
            self.client.pop(branch, None)

    def _on_response(self, msg: Message) -> None:
        future = self.client.get(msg.branch or "")
        if future is not None and not future.done() and msg.status >= 200:
            future.set_result(msg)


def dialog_for(msg: Message, local_tag: str, addr: Addr) -> Dialog:
    contact = msg.get("Contact")
    return Dialog(
        call_id=msg.call_id,
        local_tag=local_tag,
        remote_tag=param(msg.get("From") or "", "tag") or "",
        local_uri=uri_of(msg.get("To") or ""),
        remote_uri=uri_of(msg.get("From") or ""),
        remote_target=uri_of(contact) if contact else uri_of(msg.get("From") or ""),
        route=msg.get_all("Record-Route"),
        addr=addr,
    )


async def start_bridge(server: Server) -> SipBridge | None:
    """The bridge beside HTTP when the config names a SIP port (``sip.port``, ``--sip-port``)."""
    config = server.config.sip
    if config.port is None:
        return None
    bridge = SipBridge(server, config)
    await bridge.start()
    return bridge
