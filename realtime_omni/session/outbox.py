"""The bounded queue of server events waiting for a transport to send them.

A full outbox makes the producer wait (a slow client slows only its own session, and a response's
pipeline with it); the transport's send timeout ends a session whose client stopped reading.

Deltas of a response are put with their ``ResponseRun`` as owner and a weight (what of the answer
they carry). ``purge`` drops an owner's deltas that were never taken and returns their weights, so
a cancelled response sends no stale audio after its cancellation and knows exactly what of it the
client got: what it queued, less what was purged.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Protocol


class EventOwner(Protocol):
    """What put a delta in the outbox: a response."""

    muted: bool  # set once its deltas must no longer be sent (see ResponseRun.mute)


class Outbox:
    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._items: deque[tuple[Any, EventOwner | None, Any]] = deque()
        self._getter: asyncio.Future[None] | None = None
        self._putters: deque[asyncio.Future[None]] = deque()
        self.closed = False

    def __len__(self) -> int:
        return len(self._items)

    async def put(self, event: Any, owner: EventOwner | None = None, weight: Any = None) -> bool:
        """Queue ``event`` (waiting while the outbox is full). False when it was not queued: the
        outbox closed, or the owner was muted while it waited."""
        while len(self._items) >= self.maxsize and not self.closed:
            fut = asyncio.get_running_loop().create_future()
            self._putters.append(fut)
            try:
                await fut
            finally:
                if fut in self._putters:
                    self._putters.remove(fut)
        if self.closed or (owner is not None and owner.muted):
            return False  # the session is ending, or the response was cut off while we waited
        self._items.append((event, owner, weight))
        if self._getter is not None and not self._getter.done():
            self._getter.set_result(None)
        return True

    async def get(self) -> Any | None:
        """The next event to send, or None once the outbox is closed and drained."""
        while not self._items:
            if self.closed:
                return None
            self._getter = asyncio.get_running_loop().create_future()
            try:
                await self._getter
            finally:
                self._getter = None
        event = self._items.popleft()[0]
        self._wake_putter()
        return event

    def _wake_putter(self) -> None:
        while self._putters:
            fut = self._putters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def purge(self, owner: EventOwner) -> list[Any]:
        """Drop the owner's queued events; the weights they were put with."""
        dropped = [weight for _, o, weight in self._items if o is owner]
        if dropped:
            self._items = deque(entry for entry in self._items if entry[1] is not owner)
        for _ in dropped:
            self._wake_putter()
        return dropped

    def close(self) -> None:
        """No more events will be accepted; ``get`` drains what is queued, then returns None."""
        self.closed = True
        if self._getter is not None and not self._getter.done():
            self._getter.set_result(None)
        while self._putters:
            fut = self._putters.popleft()
            if not fut.done():
                fut.set_result(None)

    def discard(self) -> None:
        """The connection is gone: drop what is still queued (no one will send it; the responses
        it names would otherwise stay referenced from a closed session)."""
        self.close()
        self._items.clear()
