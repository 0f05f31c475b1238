"""Ephemeral client keys (``ek_…``): what a browser or phone app uses instead of the real API key.

An application holding the server's key mints one with ``POST /v1/realtime/client_secrets`` and
hands it to the client. A key lives 10 s to 2 h, carries the session configuration it was minted
with (applied to the session it opens) and opens exactly one session: it is spent when that session
opens (a refusal, e.g. for ``max_sessions``, leaves it usable).
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
    session: ev.Session | None


class EphemeralKeys:
    def __init__(self, max_keys: int = 10000) -> None:
        self.max_keys = max_keys
        self._keys: dict[str, EphemeralKey] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def issue(self, ttl_s: int, session: ev.Session | None) -> EphemeralKey:
        self._purge()
        if len(self._keys) >= self.max_keys:
            raise OverflowError("too many unused ephemeral keys outstanding")
        key = EphemeralKey(PREFIX + os.urandom(24).hex(), int(time.time()) + ttl_s, session)
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
