"""What the cascade's pipeline shares with its sessions and their answers: the options, and the
``Models`` port (the models it holds, its worker threads and its accounting). The sessions see the
pipeline through this port only, so they never import the module that opens them."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal, Protocol

import msgspec
import numpy as np

from pipelines.base import Capabilities
from pipelines.cascade.listener import Words
from pipelines.cascade.thinker import Thinker, ThinkerOptions
from pipelines.speculation import SpeculationCounts


class CascadeOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    asr_model: str = "moonshine-base"  # the listener: moonshine-base, or whisper-tiny.en / whisper-base
    asr_threads: int = 2
    asr_beam_size: int = 0  # 0: the listener's own (Moonshine 4 where it is unsure, moonshine.py; Whisper 1: greedy)
    asr_window: Literal["fit", "full"] = "fit"  # Whisper's; fit: encode the clip + 5 s (listener.py), not its whole 30 s window
    # the open turn heard as it is spoken (overhearing.py): a pass every this much new audio and one
    # when the user goes quiet, each going on from the last; 0: heard only at pauses and commits
    # (for Whisper, whose every pass costs its whole window)
    hear_every_ms: int = 300
    # the words two of those passes agree on (less the newest's last) given to the thinker's request
    # for the turn while the user speaks, so that at the pause only the last words are prefilled
    # (words_ahead.py); needs hear_every_ms and an in-process thinker. Off by default: measured slower
    # (bench voice_to_voice, 2026-11-29: v2v p50 658 ms with it, 576 without, docs/cpu-agent.md)
    words_ahead: bool = False
    thinker: ThinkerOptions = msgspec.field(default_factory=ThinkerOptions)
    voice: str = "piper-joe"
    tts_threads: int = 1
    denoise_keep: float = 0.5  # noise_reduction: RNNoise, with this share of the original mixed back (bench/noise.py)
    speculate: bool = True  # incremental prefill: work ahead at pauses (off: only after the turn ends)
    # the tools in the answer to a tool's output (tool_choice "auto"; docs/tools.md): "hidden" (or false)
    # renders them out of that prompt, which is then prefilled whole; "shown" keeps them in it, so the
    # whole conversation comes from the prefix cache, and bans every token that could begin a call
    # (Qwen2.5-Coder-0.5B then often talks about "this response" instead of answering from it);
    # "offered" (or true) lets it call again (Qwen2.5-Coder-0.5B calls the same tool again)
    tools_after_output: Literal["hidden", "shown", "offered"] | bool = "hidden"
    async_chunk: bool = True  # speak clause by clause (off: the whole answer, then audio)
    first_clause_words: int = 1  # the first clause may be one word ("Sure,"): it sets the first audio
    first_clause_max_words: int = 2  # failing punctuation, the first clause ends here
    clause_words: int = 5  # later clauses end at punctuation after this many words ...
    hurry_words: int = 2  # ... or after this many once the audio made is less than low_water_ms ahead of playback
    low_water_ms: int = 800
    chunk_ms: int = 100  # audio per chunk sent on
    buffer_chunks: int = 256  # output buffered ahead of the consumer, per response


@dataclass
class Counts:
    """The cascade's accounting, shared by its sessions (``stats``: each counter by its name)."""

    speculations: SpeculationCounts = field(default_factory=SpeculationCounts)  # answers started at a pause
    responses: int = 0
    # a session's prompt prefilled before its first turn: warmups, and the preparations with tools
    prefix_warmups: int = 0
    prefix_prepares: int = 0
    prefix_prepared_tokens: int = 0
    prefix_prepared_cached_tokens: int = 0
    prefills_ahead_of_output: int = 0  # the conversation up to a tool's output, prefilled while the tool ran
    words_judged: int = 0  # the end of the user's words judged at a pause (semantic_vad) ...
    words_judged_streamed: int = 0  # ... in the turn's streamed request
    # tool calls (calls/): made, steered, off their schema, of no tool offered, schemas the engine refused,
    # dropped for values nobody said; what followed: said in words, asked back, a second choice of tool
    tool_calls: int = 0
    tool_calls_steered: int = 0
    tool_calls_off_schema: int = 0
    tool_calls_unknown: int = 0
    tool_schemas_refused: int = 0
    tool_calls_ungrounded: int = 0
    tool_calls_misfit: int = 0  # ... for a value said that the thinker does not read as its parameter's (grounding.misfits)
    answers_said_instead_of_calls: int = 0
    answers_asking_back: int = 0
    calls_second_choice: int = 0
    # the user's words given to the turn's request while they spoke (words_ahead.py), and what
    # answers in that request found there: their turn's tokens, and how many came ahead of the pause
    words_ahead_parts: int = 0
    words_ahead_tokens: int = 0
    words_ahead_rewritten: int = 0
    words_ahead_missed: int = 0
    answers_streamed: int = 0
    answer_turn_tokens: int = 0
    answer_turn_tokens_ahead: int = 0

    def stats(self) -> dict[str, float]:
        counters = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "speculations"}
        return {**self.speculations.stats(), **counters}


class Models(Protocol):
    """A ``CascadePipeline`` as its sessions use it."""

    options: CascadeOptions
    capabilities: Capabilities
    thinker: Thinker
    counts: Counts  # the pipeline's accounting (``stats``)
    sessions: set[Any]  # its open sessions
    asr_busy: int  # listener calls queued or running

    async def transcribe(self, pcm: np.ndarray, clean: bool = False, keywords: tuple[str, ...] = ()) -> str:
        """The listener on its worker thread; ``clean``: noise reduction first; ``keywords``: words
        to expect (the session's)."""
        ...

    async def hear(self, pcm: np.ndarray, clean: bool = False, ends: bool = True, hint: tuple[int, ...] = (), keywords: tuple[str, ...] = ()) -> Words:
        """``transcribe``, and with ``ends`` the listener's probability that the words end a
        sentence there; ``hint``: an earlier pass's tokens over the clip's beginning."""
        ...

    async def speak(self, text: str) -> np.ndarray:
        """Piper on its worker thread."""
        ...
