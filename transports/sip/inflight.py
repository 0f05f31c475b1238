"""The SIP transactions in flight, and their timers.

The transaction state machines (``transaction``) own no socket or timer: this table carries out
what each asks for (send a message, settle a client transaction's wait, give up) and gives each one
event-loop timer at its ``deadline``. Finished server transactions are remembered until their last
timer (64·T1 at most) to absorb late retransmissions, in a table with a fixed size; client
transactions (our BYE, REFER) are resent until answered, and at most ``MAX_CLIENT`` wait at once.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable

from .message import Addr, SipMessage
from .transaction import T2, T4, Answered, ClientTransaction, Output, Send, ServerTransaction, TimedOut

MAX_SERVER = 4096  # remembered server transactions (64·T1 each): a bound whatever the peers send
MAX_CLIENT = 1024

Transaction = ServerTransaction | ClientTransaction


class Transactions:
    """``send`` puts a message on the wire; ``unacknowledged`` hears of a server transaction whose
    2xx was never ACKed (its call is over)."""

    def __init__(self, send: Callable[[bytes, Addr], None], t1: float, unacknowledged: Callable[[ServerTransaction], None]) -> None:
        self.t1, self.t2, self.t4 = t1, T2, T4
        self._send = send
        self._unacknowledged = unacknowledged
        self.server: OrderedDict[tuple[str, ...], ServerTransaction] = OrderedDict()
        self.client: dict[str, tuple[ClientTransaction, asyncio.Future[SipMessage | None]]] = {}  # by branch
        # one per transaction with a deadline: (the deadline, its handle). The deadline is kept here:
        # uvloop's call_at gives a plain Handle, without when(), for a time already past
        self._timers: dict[Transaction, tuple[float, asyncio.Handle]] = {}
        self.retransmissions = 0
        self.responses_sent = 0

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def close(self) -> None:
        for _, timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    # ------------------------------------------------------------------ server transactions

    def open(self, key: tuple[str, ...], addr: Addr, method: str) -> ServerTransaction:
        """A new server transaction for a request that is no retransmission."""
        tx = ServerTransaction(key, addr, method, t1=self.t1, t2=self.t2, t4=self.t4)
        self.server[key] = tx
        while len(self.server) > MAX_SERVER:
            self.server.popitem(last=False)  # its timers run on: a 2xx still wants its ACK
        return tx

    def retransmitted(self, tx: ServerTransaction, addr: Addr) -> None:
        """``tx``'s request came again: answer as before, do nothing twice."""
        self.retransmissions += 1
        self._apply(tx, tx.on_request(self._now()), addr)

    def respond(self, tx: ServerTransaction, msg: SipMessage) -> None:
        self.responses_sent += 1
        self._apply(tx, tx.respond(msg, self._now()), tx.addr)

    def acknowledged(self, tx: ServerTransaction) -> None:
        self._apply(tx, tx.on_ack(self._now()), tx.addr)

    # ------------------------------------------------------------------ client transactions

    async def transact(self, msg: SipMessage, addr: Addr) -> SipMessage | None:
        """Send a request and wait for its final response (resent at T1 doubling to T2, given up
        after 64·T1). None when nothing final came back, or too many wait already."""
        if len(self.client) >= MAX_CLIENT:
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

    def response_received(self, msg: SipMessage) -> None:
        entry = self.client.get(msg.branch or "")
        if entry is not None:
            tx = entry[0]
            self._apply(tx, tx.on_response(msg, self._now()), tx.addr)

    # ------------------------------------------------------------------ outputs and timers

    def _apply(self, tx: Transaction, outputs: list[Output], addr: Addr, *, timer: bool = False) -> None:
        """Carry out what a transaction asked for, then set its timer to its new deadline."""
        for out in outputs:
            if isinstance(out, Send):
                if timer:
                    self.retransmissions += 1
                self._send(out.data, addr)
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
        elif tx.terminated and isinstance(tx, ServerTransaction) and self.server.get(tx.key) is tx:
            del self.server[tx.key]

    def _fire(self, tx: Transaction) -> None:
        self._timers.pop(tx, None)
        self._apply(tx, tx.on_timer(self._now()), tx.addr, timer=True)

    def _timed_out(self, tx: Transaction, status: int) -> None:
        if isinstance(tx, ClientTransaction):
            self._settle(tx, None)
        elif 200 <= status < 300:
            self._unacknowledged(tx)

    def _settle(self, tx: Transaction, reply: SipMessage | None) -> None:
        entry = self.client.get(tx.branch) if isinstance(tx, ClientTransaction) else None
        if entry is not None and entry[0] is tx and not entry[1].done():
            entry[1].set_result(reply)
