"""Ephemeral client keys (``ek_…``): what a browser or phone app uses instead of the real API key.

An application holding the server's key mints one with ``POST /v1/realtime/client_secrets`` and
hands it to the client. A key lives 10 s to 2 h, carries the session configuration it was minted
with (applied to the session it opens) and opens exactly one session: it is spent when that session
opens (a refusal, e.g. for ``max_sessions``, leaves it usable).

Minting is bounded twice: at most ``max_keys`` unused keys outstanding, and a token bucket of
``mint_rate`` keys a second with bursts of ``mint_burst`` (a leaked API key, or a demo page that
mints for anyone, cannot flood the table or the CPU). Over either, ``issue`` raises ``MintRefused``
with the seconds to wait.

Redemption is single-use under concurrency by construction: ``redeem`` is one ``dict.pop`` on the
event loop (no ``await`` between looking the key up and removing it), so of any number of
connections racing one key exactly one gets its grant.

Every key, the API key or an ephemeral one, comes as ``Authorization: Bearer <key>``: ``bearer``
reads it from the header, for every endpoint alike.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from .protocol import events as ev

PREFIX = "ek_"
MIN_TTL_S, MAX_TTL_S, DEFAULT_TTL_S = 10, 7200, 600


@dataclass
class EphemeralKey:
    value: str
    expires_at: int
    session: ev.SessionObject | None
    tenant: str | None = None  # its issuer's prefix-cache namespace (``Server.tenant`` of the key that minted it)


class MintRefused(OverflowError):
    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EphemeralKeys:
    def __init__(self, max_keys: int = 10000, *, mint_rate: float = 10.0, mint_burst: int = 50) -> None:
        self.max_keys = max_keys
        self.mint_rate = mint_rate
        self.mint_burst = mint_burst
        self._tokens = float(mint_burst)
        self._refilled = time.monotonic()
        self._keys: dict[str, EphemeralKey] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def _take_token(self) -> None:
        now = time.monotonic()
        self._tokens = min(float(self.mint_burst), self._tokens + (now - self._refilled) * self.mint_rate)
        self._refilled = now
        if self._tokens < 1.0:
            wait = (1.0 - self._tokens) / self.mint_rate if self.mint_rate > 0 else 60.0
            raise MintRefused(f"Ephemeral keys are being minted too fast (at most {self.mint_rate:g} a second); try again in {wait:.1f} s.", wait)
        self._tokens -= 1.0

    def issue(self, ttl_s: int, session: ev.SessionObject | None, tenant: str | None = None) -> EphemeralKey:
        self._purge()
        if len(self._keys) >= self.max_keys:
            raise MintRefused("Too many unused ephemeral keys are outstanding; try again later.", 10.0)
        self._take_token()
        key = EphemeralKey(PREFIX + os.urandom(24).hex(), int(time.time()) + ttl_s, session, tenant)
        self._keys[key.value] = key
        return key

    def peek(self, value: str) -> EphemeralKey | None:
        """The key's grant if it could be redeemed now, without spending it."""
        self._purge()
        return self._keys.get(value)

    def redeem(self, value: str) -> EphemeralKey | None:
        """The key's grant, once: None for an unknown, expired or already used key."""
        self._purge()
        return self._keys.pop(value, None)  # 192 random bits: a lookup leaks nothing worth timing

    def _purge(self) -> None:
        now = time.time()
        for value in [v for v, k in self._keys.items() if k.expires_at <= now]:
            del self._keys[value]


def is_ephemeral(key: str | None) -> bool:
    return bool(key) and key.startswith(PREFIX)  # type: ignore[union-attr]


def bearer(authorization: str) -> str | None:
    """The key an ``Authorization: Bearer <key>`` header value presents (the scheme in any case);
    None for any other value. Every HTTP endpoint and the WebSocket read a key through this."""
    return authorization[7:].strip() if authorization.lower().startswith("bearer ") else None
