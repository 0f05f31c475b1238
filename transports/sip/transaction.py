"""RFC 3261 17 transactions over UDP, as sans-I/O state machines.

A transaction here owns no socket, no task and no clock. The layer above tells it what happened
(a response the transaction user gives, a retransmitted request, an ACK, a response to our
request) and the time, ``now``, in seconds on any monotonic clock; it answers with a list of
outputs: ``Send`` (bytes to put on the wire, to the transaction's peer), ``Answered`` (the final
response to our request) and ``TimedOut`` (a timer that means failure fired). ``deadline`` says
when ``on_timer`` is next due (None: no timer runs); calling it early does nothing.

Server transactions (17.2), matched by ``transaction_key``:

* INVITE (17.2.1): Proceeding -> Completed (3xx-6xx) -> Confirmed (ACK) -> Terminated (Timer I,
  T4 later). In Completed the final response is resent at T1, 2·T1, ... capped at T2 (Timer G)
  until the ACK; Timer H, 64·T1 after it was sent, gives up with ``TimedOut``.
  A 2xx goes to Accepted (RFC 6026) instead: the UAS core's own 2xx retransmission (13.3.1.4)
  lives here too, on the same schedule, because the ACK for a 2xx is a transaction of its own
  that the dialog routes back with ``on_ack``. Without that ACK within 64·T1, ``TimedOut``; with
  it, the retransmissions stop and the transaction stays to answer a retransmitted INVITE until
  64·T1 after the 2xx (Timer L).
* non-INVITE (17.2.2): Trying -> Proceeding (1xx) -> Completed (final) -> Terminated (Timer J,
  64·T1 later).

In every state but Trying and Terminated a retransmitted request is answered with the last
response sent, and never reaches the transaction user twice. A response the user gives after the
final one is sent and becomes the one resent, but changes no state or timer.

Client transaction, non-INVITE (17.1.2), for our BYE and REFER: Trying -> Proceeding (1xx) ->
Completed (final: ``Answered``) -> Terminated (Timer K, T4 later). The request is resent at T1,
2·T1, ... capped at T2 (Timer E; every T2 once a provisional came), and Timer F gives up after
64·T1 with ``TimedOut``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Union

from .message import Addr, SipMessage, param

T1 = 0.5  # RTT estimate (s)
T2 = 4.0  # the longest retransmit interval for non-INVITE requests and INVITE responses (s)
T4 = 5.0  # how long a message may stay in the network (s)


class State(enum.Enum):
    TRYING = "Trying"
    PROCEEDING = "Proceeding"
    COMPLETED = "Completed"
    ACCEPTED = "Accepted"
    CONFIRMED = "Confirmed"
    TERMINATED = "Terminated"


@dataclass(frozen=True)
class Send:
    data: bytes


@dataclass(frozen=True)
class Answered:
    """The final response to our request."""

    response: SipMessage


@dataclass(frozen=True)
class TimedOut:
    """Timer H or L (a final response ``status`` was never acknowledged) or F (our request got no
    final response: ``status`` 0)."""

    status: int


Output = Union[Send, Answered, TimedOut]


def transaction_key(msg: SipMessage) -> tuple[str, ...]:
    """What matches a request to its server transaction (17.2.3). An ACK matches the INVITE's."""
    method = "INVITE" if msg.method == "ACK" else msg.method or ""
    branch = msg.branch
    if branch and branch.startswith("z9hG4bK"):
        return (branch, (msg.get("Via") or "").split(";")[0].strip(), method)
    # RFC 2543 peers: no magic cookie; match on the dialog and CSeq instead
    return (msg.call_id, param(msg.get("From") or "", "tag") or "", str(msg.cseq[0]), method)


class _Timers:
    """The one retransmission timer and the one ending timer every transaction kind has."""

    def __init__(self, t1: float, t2: float, t4: float) -> None:
        self.t1, self.t2, self.t4 = t1, t2, t4
        self.state = State.TRYING
        self.interval = t1
        self.retransmit_at: float | None = None
        self.end_at: float | None = None

    @property
    def deadline(self) -> float | None:
        due = [t for t in (self.retransmit_at, self.end_at) if t is not None]
        return min(due) if due else None

    @property
    def terminated(self) -> bool:
        return self.state is State.TERMINATED

    def _terminate(self) -> None:
        self.state = State.TERMINATED
        self.retransmit_at = self.end_at = None


class ServerTransaction(_Timers):
    """One request we answer: RFC 3261 17.2.1 (INVITE) or 17.2.2 (any other method but ACK)."""

    def __init__(self, key: tuple[str, ...], addr: Addr, method: str, *, t1: float = T1, t2: float = T2, t4: float = T4) -> None:
        super().__init__(t1, t2, t4)
        self.key = key
        self.addr = addr  # where the request came from: where responses go
        self.invite = method == "INVITE"
        self.state = State.PROCEEDING if self.invite else State.TRYING
        self.last: bytes | None = None  # the last response sent: resent on a retransmitted request
        self.final = 0  # status of the final response, 0 before it
        self.acked = False
        # the call this INVITE created or re-targeted: the bridge's, for CANCEL and a missing ACK;
        # the state machine never looks at it
        self.call: Any = None

    def respond(self, msg: SipMessage, now: float) -> list[Output]:
        """The transaction user's response ``msg``: send it, and after a final one run the timers."""
        data = msg.encode()
        self.last = data
        if self.final or self.terminated:
            return [Send(data)]
        if msg.status < 200:
            self.state = State.PROCEEDING
            return [Send(data)]
        self.final = msg.status
        self.end_at = now + 64 * self.t1  # Timer H (non-2xx), L (2xx) or J (non-INVITE)
        if self.invite:
            self.state = State.ACCEPTED if msg.status < 300 else State.COMPLETED
            self.interval = self.t1
            self.retransmit_at = now + self.interval  # Timer G (or the 2xx's)
        else:
            self.state = State.COMPLETED
        return [Send(data)]

    def on_request(self, now: float) -> list[Output]:
        """The request came again: answer with the last response, if there is one yet."""
        if self.terminated or self.last is None:
            return []
        return [Send(self.last)]

    def on_ack(self, now: float) -> list[Output]:
        """The ACK for our final response (for a 2xx, routed here by the dialog). Never answered."""
        if not self.invite or self.acked or self.state not in (State.COMPLETED, State.ACCEPTED):
            return []
        self.acked = True
        self.retransmit_at = None
        if self.state is State.COMPLETED:
            self.state = State.CONFIRMED
            self.end_at = now + self.t4  # Timer I: absorb the ACK's retransmissions
        # Accepted stays until Timer L, answering a retransmitted INVITE with the 2xx
        return []

    def on_timer(self, now: float) -> list[Output]:
        if self.end_at is not None and now >= self.end_at:
            failed = self.state in (State.COMPLETED, State.ACCEPTED) and self.invite and not self.acked
            self._terminate()
            return [TimedOut(self.final)] if failed else []
        if self.retransmit_at is not None and now >= self.retransmit_at and self.last is not None:
            self.interval = min(self.interval * 2, self.t2)
            self.retransmit_at = now + self.interval
            return [Send(self.last)]
        return []


class ClientTransaction(_Timers):
    """One request we send outside INVITE (BYE, REFER): RFC 3261 17.1.2."""

    def __init__(self, request: SipMessage, addr: Addr, *, t1: float = T1, t2: float = T2, t4: float = T4) -> None:
        super().__init__(t1, t2, t4)
        self.request = request
        self.addr = addr  # where the request goes
        self.branch = request.branch or ""
        self.data = request.encode()
        self.response: SipMessage | None = None

    def start(self, now: float) -> list[Output]:
        self.state = State.TRYING
        self.interval = self.t1
        self.retransmit_at = now + self.interval  # Timer E
        self.end_at = now + 64 * self.t1  # Timer F
        return [Send(self.data)]

    def on_response(self, msg: SipMessage, now: float) -> list[Output]:
        if self.state not in (State.TRYING, State.PROCEEDING):
            return []  # a retransmitted response, absorbed in Completed (or too late)
        if msg.status < 200:
            self.state = State.PROCEEDING
            return []
        self.state = State.COMPLETED
        self.response = msg
        self.retransmit_at = None
        self.end_at = now + self.t4  # Timer K
        return [Answered(msg)]

    def on_timer(self, now: float) -> list[Output]:
        if self.end_at is not None and now >= self.end_at:
            failed = self.state in (State.TRYING, State.PROCEEDING)
            self._terminate()
            return [TimedOut(0)] if failed else []
        if self.retransmit_at is not None and now >= self.retransmit_at:
            self.interval = self.t2 if self.state is State.PROCEEDING else min(self.interval * 2, self.t2)
            self.retransmit_at = now + self.interval
            return [Send(self.data)]
        return []
