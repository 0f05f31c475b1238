"""The thinker's own judgement of a turn's end: do the user's words so far end their message?

semantic_vad's second opinion, beside Smart Turn's audio one. At a pause the cascade already has a
transcript of the turn so far and the conversation prefilled in the thinker; one more engine step
over the words gives the next token's distribution, and this module reads it.

How it is read (measured zero-shot on the default Qwen2.5 instruct thinker, docs/notes/turn-judgement.md):
the transcript's final punctuation is stripped (Whisper writes "I was thinking that we could." as
readily as "Paris."), and the probability that the next token ends a sentence (".", "?", "!", alone
or with a closing quote) or the message itself (the chat template's end token) is summed over the
top ``TOP_LOGPROBS`` tokens. After a fragment ("I'd like to book a table for") it is below 0.01;
after a sentence it is mostly well above 0.1. Reading the end token alone, right after the
punctuated words (LiveKit's reading), does not work on a plain instruct model: it follows the
punctuation, not the sentence.

The judgement is one-sided: a high value says the words end a sentence, a low one may also be a
complete answer that needs the question before it ("Tomorrow."), so the session fuses it with the
audio and the silence so far (pipelines/turn_end/fusion.py) instead of trusting it alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pipelines.sentences import piece_ends_sentence

TOP_LOGPROBS = 20  # the next token's top candidates asked of the engine
_TRAILING = " \t\n.,;:!?\u2026-\u2013\u2014\"'"


def bare(text: str | None) -> str:
    """The words as the thinker judges them: white space folded, the final punctuation (and a
    trailing ellipsis or dash) stripped. Empty when nothing is left."""
    return " ".join((text or "").split()).rstrip(_TRAILING)


def end_token_ids(tokenizer: Any, texts: Sequence[str]) -> frozenset[int]:
    """Every token of ``tokenizer`` that ends a sentence, and the tokens that end a message (its
    end-of-sequence token and, for chat templates that have one, ``<|im_end|>``/``<|eot_id|>``).
    ``texts``: every token's text by id (the thinker decodes them once for all its sets)."""
    ids = {i for i, text in enumerate(texts) if piece_ends_sentence(text)}
    specials = {tokenizer.eos_token_id}
    for name in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|endoftext|>"):
        found = tokenizer.convert_tokens_to_ids(name)
        if isinstance(found, int) and found != getattr(tokenizer, "unk_token_id", None):
            specials.add(found)
    return frozenset(ids | {i for i in specials if i is not None})


def probability(top: Mapping[int, float] | Iterable[tuple[int, float]], ends: frozenset[int]) -> float:
    """P(the next token ends the sentence or message), from the next token's top candidates as
    ``{token_id: logprob}`` (or pairs)."""
    pairs = top.items() if isinstance(top, Mapping) else top
    return min(1.0, sum(math.exp(lp) for token, lp in pairs if token in ends))
