"""The contract between the session engine and a model pipeline.

A ``Pipeline`` is created once per server: it loads and holds the models and says what it can do
(``Capabilities``). Each client session ``open``s a ``PipelineSession``, which

* is fed the user's audio while the user is still speaking (``feed``), told about short pauses
  (``pause``: a pipeline may start speculative work, invisible to the client) and about speech
  resuming (``resume``: throw that work away), and told when the open audio becomes a conversation
  item (``commit``) or is discarded (``clear``);
* transcribes audio items on request (``transcribe``);
* answers with ``respond(request)``: an async iterator of ``OutputChunk``s, produced stage by stage
  (Thinker -> Talker -> Code2Wav) through bounded queues, so the first audio leaves as soon as it
  exists.

Cancellation is the iterator's end: when the consumer stops (``aclose()`` or its task is
cancelled), the pipeline aborts all in-flight work for that response before the close returns:
engine requests are aborted, stage tasks cancelled, queued audio dropped.

Audio is mono int16 numpy at ``Capabilities.input_rate`` in and ``output_rate`` out; the session
converts wire formats at the edge. Chunk order carries alignment: a ``TextDelta`` in an audio
response is the transcript of the audio that follows it, up to the next ``TextDelta``.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union

import numpy as np

# ---------------------------------------------------------------------------------------------
# What a pipeline can do
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Capabilities:
    name: str
    input_modalities: frozenset[str] = frozenset({"audio", "text"})
    output_modalities: frozenset[str] = frozenset({"audio", "text"})
    input_rate: int = 16000
    output_rate: int = 24000
    images: bool = False
    video: bool = False
    tools: bool = False
    transcribes_input: bool = False
    transcription_model: str = ""
    caption_every_ms: int = 1000  # in speech without pauses, a live caption at most this often
    voices: tuple[str, ...] = ("default",)
    context_tokens: int = 4096


# ---------------------------------------------------------------------------------------------
# The conversation as a pipeline sees it
# ---------------------------------------------------------------------------------------------


@dataclass
class Part:
    """One content part of a message. ``audio`` is int16 at the pipeline's input rate (user) or
    output rate (assistant); ``text`` holds input/output text or the audio's transcript."""

    kind: Literal["text", "audio", "image"]
    text: str | None = None
    audio: np.ndarray | None = None
    image_url: str | None = None


ItemStatus = Literal["completed", "incomplete", "in_progress"]


@dataclass
class Message:
    id: str
    role: Literal["system", "user", "assistant"]
    parts: list[Part]
    status: ItemStatus = "completed"


@dataclass
class FunctionCall:
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus = "completed"


@dataclass
class FunctionResult:
    id: str
    call_id: str
    output: str
    status: ItemStatus = "completed"


ContextItem = Union[Message, FunctionCall, FunctionResult]


@dataclass
class Tool:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class ResponseRequest:
    response_id: str
    items: Sequence[ContextItem]
    instructions: str = ""
    output_modalities: tuple[str, ...] = ("audio",)
    voice: str = "default"
    speed: float = 1.0
    max_output_tokens: int | None = None
    temperature: float | None = None
    tools: Sequence[Tool] = ()
    tool_choice: str = "auto"  # "auto" | "none" | "required" | a function name
    parallel_tool_calls: bool = True  # False: one call at most per response


# ---------------------------------------------------------------------------------------------
# What a response yields
# ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class TextDelta:
    text: str


@dataclass(slots=True)
class AudioChunk:
    pcm: np.ndarray


@dataclass(slots=True)
class ToolCall:
    call_id: str
    name: str
    arguments: str


@dataclass(slots=True)
class ToolCallDelta:
    """A call being written: the first of a call (a new ``call_id``) names it, the others carry
    pieces of its arguments; the call's ``ToolCall`` (the same ``call_id``) ends it."""

    call_id: str
    name: str
    delta: str


@dataclass(slots=True)
class Usage:
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    input_audio_tokens: int = 0
    output_audio_tokens: int = 0
    hit_max_tokens: bool = False  # generation stopped at max_output_tokens


@dataclass(slots=True)
class StageTimes:
    """When each stage of this response produced its first output, in ms from the moment the
    response was requested (``respond`` called). Negative: done ahead, speculatively, while the user
    was still in their turn. Names are the pipeline's own (e.g. ``asr``, ``thinker_first_token``,
    ``first_clause``, ``first_audio``). ``info`` carries facts about the response that are not
    times (e.g. whether speculative work was used). Yielded once, at the end; optional."""

    stages: dict[str, float]
    info: dict[str, Any] = field(default_factory=dict)


OutputChunk = Union[TextDelta, AudioChunk, ToolCall, ToolCallDelta, Usage, StageTimes]


@dataclass
class Transcript:
    text: str
    audio_seconds: float


# ---------------------------------------------------------------------------------------------
# The two classes a pipeline implements
# ---------------------------------------------------------------------------------------------


class PipelineSession(abc.ABC):
    """Per client session. Methods other than ``respond``/``transcribe`` must not block."""

    def feed(self, pcm: np.ndarray) -> None:
        """Audio of the open input buffer, as it arrives."""

    def transcribing(self, on: bool) -> None:
        """Whether the session transcribes its input (``audio.input.transcription`` set: live
        captions are asked for), at open and whenever it changes."""

    def expect(self, keywords: tuple[str, ...]) -> None:
        """The session's ``audio.input.transcription.keywords`` (words or phrases its ears are to
        expect: names, places), at open when there are some and whenever they change. A pipeline
        whose ears can be guided guides them with these, for this session only."""

    def reduce_noise(self, kind: str | None) -> None:
        """The session's ``audio.input.noise_reduction`` (``near_field``, ``far_field`` or None),
        at open and whenever it changes. A pipeline that can clean its input applies it."""

    def listen(self, request: ResponseRequest | None, answer: bool) -> None:
        """A turn began (speech started): ``request`` and ``answer`` as for ``pause``. A pipeline that
        can take the turn's audio as it comes may start feeding it to its model now."""

    def quiet(self) -> None:
        """The user went quiet (the first silent frame after speech; the audio fed so far ends
        there). It may be a gap between words or the end of the turn: a pipeline whose ears are
        cheap may hear the turn so far now, so that at the ``pause`` that may follow its words are
        ready."""

    def pause(self, request: ResponseRequest | None, answer: bool) -> None:
        """A short silence: the user may be done. ``request`` is the response the session would
        request if the turn ended now, its ``items`` being the conversation *before* the open turn
        (the audio fed so far is the turn): the context the turn is heard in; None when the
        session cannot say. ``answer``: whether a response follows the turn by itself (turn
        detection's ``create_response``, no response under way): only then may speculative work
        on the answer start, and none of it may reach the client unless the turn is then
        committed. Hearing the turn (``heard``) does not wait for that."""

    def resume(self) -> None:
        """Speech resumed after ``pause``: speculative work is void."""

    def prepare(self, request: ResponseRequest) -> None:
        """The session opened, or ``session.update`` changed what every response begins with
        (instructions, tools): ``request`` is the response the session would request now. A
        pipeline may prefill that beginning in the background, so the first turn does not."""

    def commit(self, item_id: str) -> None:
        """The audio fed since the last commit/clear is now user item ``item_id``."""

    def clear(self) -> None:
        """The audio fed since the last commit/clear is discarded."""

    def judge_words(self, judge: "Judge | None") -> None:
        """semantic_vad asks for a judgement of whether the words end the turn at each ``pause``
        (``Heard.ends``), by ``judge`` (the turn-end policy's ``turn_end.judge``); None: no
        judgement. A pipeline that cannot give one ignores it."""

    async def heard(self, within_s: float) -> "Heard | None":
        """What this pipeline heard of the open turn up to the last ``pause`` (the cascade's
        ``Hearing``: its words, and their judgement when asked), or None when it
        hears nothing. Returns within ``within_s``: what is not ready by then is left out.
        semantic_vad's turn-end policy weighs it."""
        return None

    async def transcribe(self, item_id: str, pcm: np.ndarray) -> Transcript | None:
        """Transcript of a user audio item, or None when this pipeline does not transcribe."""
        return None

    async def caption(self, pcm: np.ndarray) -> str | None:
        """The words so far of the open turn (``pcm``: its audio so far), for live captions; None
        when this pipeline cannot tell or is busy with work that matters more (an answer)."""
        return None

    @abc.abstractmethod
    def respond(self, request: ResponseRequest) -> AsyncIterator[OutputChunk]:
        """Stream the answer. See the module docstring for cancellation."""

    async def close(self) -> None:
        """The client session ended: release everything held for it."""


Judge = Literal["listener", "thinker"]  # who judges whether the words end the turn (turn_end.judge)


@dataclass(frozen=True, slots=True)
class Heard:
    """The open turn's words at its last pause, as a pipeline heard them."""

    text: str
    ends: float | None = None  # the probability that the user's message ends there (None: not judged) ...
    judge: Judge | None = None  # ... by whom: the listener's own, or the thinker's
    listener: float | None = None  # beside the thinker's: the listener's own (free with the words)


@dataclass(frozen=True, slots=True)
class TurnVerdict:
    probability: float  # that the speaker has finished their turn, at the silence the decision was asked at
    cpu_ms: float  # the model's CPU time for this decision
    audio_probability: float | None = None  # the audio's alone, when more was weighed
    transcript: str | None = None  # the words weighed
    words_probability: float | None = None  # the words' judgement weighed (Heard.ends)
    logit_per_s: float = 0.0  # how much each further second of silence adds to the logit of ``probability`` (the policy's wait: pipelines/turn_end/fusion.py wait_s)
    listener_probability: float | None = None  # beside the thinker's: the listener's weighed (Heard.listener)


class TurnModel(abc.ABC):
    """An end-of-turn classifier (semantic turn detection): has the speaker finished, judged from
    the sound of their turn so far? Shared by every session of a server, whatever its pipeline;
    the turn-end policy (pipelines/turn_end/policy.py) weighs its verdict with the words."""

    name: str
    max_seconds: float = 8.0  # the most of a turn's end it hears; sessions send no more

    def load(self) -> None:
        """Load and warm the model (blocking: the server calls it in a worker thread)."""

    @abc.abstractmethod
    async def judge(self, pcm: np.ndarray, rate: int) -> TurnVerdict:
        """The verdict on a turn's audio (mono int16 at ``rate``, from its start to now, ending
        with the silence that made the session ask). Runs off the event loop."""

    def close(self) -> None:
        """Release the model."""


class Pipeline(abc.ABC):
    capabilities: Capabilities

    async def start(self) -> None:
        """Load and warm the models. The server reports ready only after this returns."""

    async def stop(self) -> None:
        """Release the models."""

    @property
    def healthy(self) -> bool:
        return True

    @property
    def failed(self) -> str | None:
        """Why this pipeline cannot recover without a restart (an in-process engine that died), or
        None. Unhealthy but not failed (a remote deployment down for now) may come back by itself."""
        return None

    @abc.abstractmethod
    def open(self, session_id: str, tenant: str | None = None) -> PipelineSession:
        """A session. ``tenant``: the prefix-cache namespace of whoever opened it (the server
        derives it from the API key, or an ephemeral key's issuer, with a secret of its own: never
        the key): sessions of one tenant may share cached prefixes (their instructions and tools),
        those of different tenants never do. None: the session's own namespace."""

    def stats(self) -> dict[str, float]:
        """The pipeline's own accounting (open sessions, in-flight work), for health and tests."""
        return {}

    def self_check(self) -> dict[str, Any] | None:
        """What the pipeline measured of this machine at start (can it keep up?), for ``/healthz``;
        None when it measures nothing."""
        return None
