"""The shared store: what ties a client's requests together, wherever they land (the ``Store`` port).

A client's requests need not reach the same server process: a key minted on one replica is
redeemed on another, a sideband for a WebRTC call lands on a replica that does not hold the call,
and ``max_sessions`` bounds the sessions of every replica together. So everything shared lives
behind this port:

* ephemeral keys: minted (under one mint rate limit), looked at, redeemed once;
* the session count ``max_sessions`` is checked against (a slot reserved per open session);
* call id -> the replica that holds the call (its URL), for forwarding call control and sidebands.

``LocalStore`` is the default: one process, everything in memory (``keys.EphemeralKeys``).
A deployment of several replicas shares one Redis (``state_url``); that implementation does I/O
and lives in ``host/`` (``host/redis_store.py``).

``error`` says why the store cannot be reached (None while it can): the server then refuses new
sessions with ``state_unavailable`` and ``/healthz`` answers 503, while open sessions carry on.
"""

from __future__ import annotations

from typing import Protocol

from .errors import RealtimeError
from .keys import EphemeralKey, EphemeralKeys
from .protocol import events as ev


def unavailable(reason: str) -> RealtimeError:
    """What a new session (or a mint) gets while the shared state is unreachable."""
    return RealtimeError(
        f"The server cannot reach its shared state ({reason}); no new sessions until it is back. Try again later.",
        code="server_unavailable",
        type="server_error",
    )


class Store(Protocol):
    """The shared store's port. Every method may raise ``RealtimeError`` (``server_unavailable``)
    when the store cannot be reached; ``issue_key`` raises ``keys.MintRefused`` over the limits."""

    @property
    def error(self) -> str | None: ...

    async def start(self, replica: str, url: str | None, sessions: SessionCount) -> None:
        """Begin serving as replica ``replica``, reachable by other replicas at ``url``;
        ``sessions()`` is this replica's own count (the truth the shared count is mended from)."""

    async def stop(self) -> None: ...

    async def issue_key(self, ttl_s: int, session: ev.SessionObject | None, tenant: str | None = None) -> EphemeralKey: ...

    async def peek_key(self, value: str) -> EphemeralKey | None:
        """The key's grant if it could be redeemed now, without spending it."""

    async def redeem_key(self, value: str) -> EphemeralKey | None:
        """The key's grant, once across every replica: None for an unknown, expired or spent key."""

    async def reserve_session(self, limit: int) -> bool:
        """Count one more open session if all replicas together hold fewer than ``limit``."""

    async def release_session(self) -> None: ...

    async def add_call(self, call_id: str) -> None:
        """This replica holds ``call_id`` from now on."""

    async def remove_call(self, call_id: str) -> None: ...

    async def call_owner(self, call_id: str) -> str | None:
        """The URL of the replica holding ``call_id`` (None: no replica does)."""


class SessionCount(Protocol):
    def __call__(self) -> int: ...


class LocalStore:
    """One process: keys in a dict (single use by construction: one ``dict.pop`` on the event
    loop), the session count is the server's own, calls are found in ``Server.calls``."""

    def __init__(self, *, mint_rate: float, mint_burst: int, max_keys: int = 10000) -> None:
        self.keys = EphemeralKeys(max_keys, mint_rate=mint_rate, mint_burst=mint_burst)
        self.error: str | None = None

    async def start(self, replica: str, url: str | None, sessions: SessionCount) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def issue_key(self, ttl_s: int, session: ev.SessionObject | None, tenant: str | None = None) -> EphemeralKey:
        return self.keys.issue(ttl_s, session, tenant)

    async def peek_key(self, value: str) -> EphemeralKey | None:
        return self.keys.peek(value)

    async def redeem_key(self, value: str) -> EphemeralKey | None:
        return self.keys.redeem(value)

    async def reserve_session(self, limit: int) -> bool:
        return True  # the server's own count (checked before) is the whole count

    async def release_session(self) -> None:
        return None

    async def add_call(self, call_id: str) -> None:
        return None

    async def remove_call(self, call_id: str) -> None:
        return None

    async def call_owner(self, call_id: str) -> str | None:
        return None  # a call this process does not hold is held by nobody
