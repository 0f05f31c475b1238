"""The open turn's words given to the thinker while they are spoken.

While the user speaks, the ears hear the turn as it grows (``overhearing.py``: a pass every
``hear_every_ms`` of new audio, each going on from the last), and the turn's engine request holds
the conversation up to where their words will go (``thinker.StreamedPrompt``, opened at
``listen``). Here the words two successive passes agree on, less the newest pass's last word (it is
still being said, or may be heard again as another), are *stable*; whatever of them the request
does not have yet is given to it (``StreamedPrompt.extend``): prefilled then, so at the pause only
the last words are new to the thinker, and the judgement and the answer prefill only those.

**Tokens that are the prompt's own.** The user's message is the chat template's text as is (the
words, white space folded: ``Prompts.prompt``), and the tokenizer splits text before a space
(Qwen2's and GPT-2's pre-tokenizers: a word is its leading space and its letters), so the tokens of
the first words are the first tokens of the whole message, and the prompt for any words that go on
from them goes on from the request (``StreamedPrompt.fits``). The judgement's words (the same
words, their final punctuation stripped: ``judgement.bare``) go on from them too.
(tests/pipelines/test_words_ahead.py holds the default thinker's tokenizer to this.)

**Words heard again as others.** A request cannot take back what it was given: when a later pass
no longer begins with the words given (its last word aside), the request is closed and a fresh one
opened for the turn with the same prefix (its whole blocks are in the prefix cache), given the
newest stable words once it is in (``words_ahead_rewritten``). Words at the pause that do not go on
from those given are judged and answered in a request of their own (``words_ahead_missed``, the
session's and the hearing's): the conversation's whole blocks still come from the cache.

At a pause nothing is given (``between``): the words go to the judgement and the answer there,
in the request the session hands on. Words settled meanwhile (the pass at the first silent frame)
are given when the user speaks on (``give``, from the session's ``resume``), to the request the
session holds for the turn then (a fresh one, if the pause's was dropped with its answer).

Bounded: at most one part given at a time per session (the engine's step for it); stable words
met meanwhile wait for it to end, and only the newest are given. A turn's words go only to the
session's request for that turn (``reset`` at its end), under the session's cache salt.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from pipelines.cascade.listener import Words
from pipelines.cascade.shared import Counts
from pipelines.cascade.thinker import StreamedPrompt, Thinker

log = logging.getLogger(__name__)

HOLD = 1  # the newest pass's last words not given: still being said, or heard again as others


def stable_words(before: Sequence[str], after: Sequence[str], hold: int = HOLD) -> list[str]:
    """The words two successive passes (``before``, then ``after`` over more of the turn) agree on,
    from the first, up to the ``hold`` last of ``after``."""
    agreed = 0
    for a, b in zip(before, after[: max(0, len(after) - hold)]):
        if a != b:
            break
        agreed += 1
    return list(after[:agreed])


def rewrites(given: Sequence[str], newest: Sequence[str], hold: int = HOLD) -> bool:
    """Whether the ``newest`` pass (up to its ``hold`` last words) says other words than those
    ``given``, where both have words."""
    settled = newest[: max(0, len(newest) - hold)]
    return any(a != b for a, b in zip(given, settled))


class Holder(Protocol):
    """The session as words are given for it: its request for the open turn (None: none, or
    handed on at a pause), which is replaced when words given to it are heard again as others."""

    streamed: StreamedPrompt | None


class WordsAhead:
    """Per session. ``thinker``: its tokenizer, and a fresh request; ``counts``: the pipeline's;
    ``background``: the session's (a replaced request is closed there); ``between``: whether the
    session is between pauses (the user speaking: words may be given); ``on``: the option."""

    def __init__(
        self,
        thinker: Thinker,
        counts: Counts,
        session: Holder,
        background: Callable[[Awaitable[Any]], None],
        between: Callable[[], bool],
        on: bool = True,
    ) -> None:
        self.thinker = thinker
        self.counts = counts
        self.session = session
        self.background = background
        self.between = between
        self.on = on
        self.wanted: list[str] = []  # the open turn's newest stable words
        self._waiting: asyncio.Future[Any] | None = None  # the part whose end gives the next

    def heard(self, before: Words | None, after: Words) -> None:
        """A pass over the open turn heard ``after``; ``before``: the pass before it, if any. (At
        a pause too: the words are given once the user speaks on, ``give``.)"""
        if not self.on:
            return
        newest = after.text.split()
        streamed = self.session.streamed
        if streamed is not None and not streamed.used and streamed.words and rewrites(streamed.words, newest):
            self._reopen(streamed)
        self.wanted = stable_words(before.text.split() if before is not None else [], newest)
        self.give()

    def reset(self) -> None:
        """The turn was committed or cleared: its words are no other turn's."""
        self.wanted = []

    def _reopen(self, old: StreamedPrompt) -> None:
        """``old`` was given words now heard as others: a fresh request in its place, its prefix
        the same (the cache holds its whole blocks)."""
        self.counts.words_ahead_rewritten += 1
        log.debug("words given ahead heard again as others (%r): a fresh request", " ".join(old.words))
        self.session.streamed = self.thinker.open_prompt(old.prefix, old.salt, old.logprobs is not None)
        self.background(old.close())

    def give(self) -> None:
        """Give the session's request for the turn what it lacks of the newest stable words, unless
        a part is still being given (then once it is), or the session is at a pause."""
        streamed = self.session.streamed
        if streamed is None or streamed.used or not self.between():
            return
        wanted, given = self.wanted, list(streamed.words)
        if len(wanted) <= len(given) or wanted[: len(given)] != given:
            return
        if not streamed.step.done():  # one part at a time: the newest words once this one is in
            self._wait(streamed.step)
            return
        ids = self.thinker.encode(" ".join(wanted))
        had = streamed.sent[len(streamed.prefix) :]
        if ids[: len(had)] != had:
            return  # (a tokenizer that joins words across the space: nothing given but whole words)
        step = streamed.extend(ids[len(had) :], wanted)
        if step is not None:
            self.counts.words_ahead_parts += 1
            self.counts.words_ahead_tokens += len(ids) - len(had)
            log.debug("words given ahead: %r (%d tokens, %d in all)", " ".join(wanted[len(given) :]), len(ids) - len(had), streamed.ahead)
            self._wait(step)

    def _wait(self, step: asyncio.Future[Any]) -> None:
        if step is not self._waiting:  # (called back once per part)
            self._waiting = step
            step.add_done_callback(self._given)

    def _given(self, step: asyncio.Future[Any]) -> None:
        if step.cancelled() or step.exception() is not None:
            return  # (the request was closed, or failed: the answer meets that, not this)
        self.give()


def count_answer(counts: Counts, streamed: StreamedPrompt, prompt: list[int]) -> None:
    """An answer goes on in the turn's request: how many of its turn's tokens (the prompt after the
    conversation so far) were given while the user spoke, and so how many were left to the pause."""
    counts.answers_streamed += 1
    counts.answer_turn_tokens += len(prompt) - len(streamed.prefix)
    counts.answer_turn_tokens_ahead += streamed.ahead
