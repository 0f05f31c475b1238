"""Identifiers in OpenAI's style (``item_…``, ``resp_…``); unique across sessions and restarts."""

from __future__ import annotations

import itertools
import os


def new_id(prefix: str) -> str:
    return f"{prefix}_{os.urandom(10).hex()}"


class EventIds:
    """Server event ids for one session: a random session stem and a counter (cheap on the hot path)."""

    __slots__ = ("_stem", "_count")

    def __init__(self) -> None:
        self._stem = f"event_{os.urandom(6).hex()}"
        self._count = itertools.count(1)

    def __call__(self) -> str:
        return f"{self._stem}{next(self._count):06x}"
