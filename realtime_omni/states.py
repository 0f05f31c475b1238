"""State machines written plainly: an enum of states, a table of the legal moves, one setter.

Every object with a lifecycle (a session, a response, a SIP call) keeps its state as one enum
value and changes it only through ``move``, which refuses a move its table does not list. An
illegal move is a defect of ours, never a client's mistake, so it raises ``IllegalMove`` instead of
becoming an ``error`` event: the caller checks the state first wherever a request may come at the
wrong time (a ``cancel`` after the end, an ``accept`` of a call already answered).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from typing import TypeVar

S = TypeVar("S", bound=enum.Enum)


class IllegalMove(RuntimeError):
    """A state machine was asked for a move its table does not list."""


def move(current: S, to: S, legal: Mapping[S, Collection[S]], owner: str) -> S:
    """``to``, when ``current -> to`` is a legal move; otherwise ``IllegalMove`` naming ``owner``."""
    if to not in legal[current]:
        raise IllegalMove(f"{owner}: {current.value} -> {to.value} is not a legal move")
    return to
