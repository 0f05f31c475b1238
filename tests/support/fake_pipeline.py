"""A stand-in pipeline for driving the session core directly, faithful to ``pipelines.base``:
``feed``/``pause``/``resume``/``commit``/``clear`` never block, ``respond`` streams an answer (a
transcript delta, then its audio, word by word) until it ends or is closed, ``transcribe``
answers for committed audio. It records what the session asked of it, so a test can check the
session's side of the contract (every sample of a turn fed once, speculation started at a pause
and voided on resume, no response left open)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from pipelines.base import (
    AudioChunk,
    Capabilities,
    Judge,
    OutputChunk,
    Pipeline,
    PipelineSession,
    ResponseRequest,
    TextDelta,
    Transcript,
    Usage,
)

CAPS = Capabilities(name="fake", transcribes_input=True, transcription_model="fake", voices=("fake",))
WORD_MS = 200  # of answer audio per word


class FakeSession(PipelineSession):
    def __init__(self, pipeline: FakePipeline) -> None:
        self.pipeline = pipeline
        self.calls: list[tuple[Any, ...]] = []  # ("pause", request) ("resume",) ("commit", id, samples) ("clear", samples) ("judge_words", on)
        self.noise_reduction: list[str | None] = []  # every reduce_noise call, in order
        self.keywords: list[tuple[str, ...]] = []  # every expect call, in order
        self.captions: list[int] = []  # samples of the open turn each caption pass got
        self.pending = 0  # samples fed since the last commit or clear
        self.requests: list[ResponseRequest] = []
        self.open_responses = 0
        self.closed = False

    def feed(self, pcm: np.ndarray) -> None:
        self.pending += len(pcm)

    def reduce_noise(self, kind: str | None) -> None:
        self.noise_reduction.append(kind)

    def expect(self, keywords: tuple[str, ...]) -> None:
        self.keywords.append(keywords)

    def pause(self, request: ResponseRequest | None, answer: bool) -> None:
        self.calls.append(("pause", request if answer else None))

    def judge_words(self, judge: Judge | None) -> None:
        self.calls.append(("judge_words", judge))

    def resume(self) -> None:
        self.calls.append(("resume",))

    def commit(self, item_id: str) -> None:
        self.calls.append(("commit", item_id, self.pending))
        self.pending = 0

    def clear(self) -> None:
        self.calls.append(("clear", self.pending))
        self.pending = 0

    async def transcribe(self, item_id: str, pcm: np.ndarray) -> Transcript | None:
        if self.pipeline.script is not None:
            return Transcript(self.pipeline.script, len(pcm) / CAPS.input_rate)
        return Transcript(f"{len(pcm)} samples", len(pcm) / CAPS.input_rate)

    async def caption(self, pcm: np.ndarray) -> str | None:
        """With a script: a word of it per half second heard so far (a transcriber's partials)."""
        self.captions.append(len(pcm))
        if self.pipeline.script is None:
            return None
        return " ".join(self.pipeline.script.split()[: len(pcm) * 2 // CAPS.input_rate])

    async def respond(self, request: ResponseRequest) -> AsyncIterator[OutputChunk]:
        self.requests.append(request)
        self.open_responses += 1
        try:
            for n, word in enumerate(self.pipeline.reply.split()):
                await asyncio.sleep(self.pipeline.word_interval_s)  # the fake's configured pace, an input of the tests
                yield TextDelta(word if n == 0 else " " + word)
                if "audio" in request.output_modalities:
                    yield AudioChunk(np.full(CAPS.output_rate * WORD_MS // 1000, 1000 + n, np.int16))
            yield Usage(input_tokens=10, output_tokens=len(self.pipeline.reply.split()))
        finally:
            self.open_responses -= 1

    async def close(self) -> None:
        self.closed = True


class FakePipeline(Pipeline):
    def __init__(self, reply: str = "one two three", word_interval_s: float = 0.0, script: str | None = None) -> None:
        self.capabilities = CAPS
        self.reply = reply
        self.script = script  # what the user says: the final transcript, and captions as it is heard
        self.word_interval_s = word_interval_s
        self.sessions: list[FakeSession] = []

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def open(self, session_id: str, tenant: str | None = None) -> FakeSession:
        session = FakeSession(self)
        self.sessions.append(session)
        return session

    def stats(self) -> dict[str, float]:
        return {"active_responses": sum(s.open_responses for s in self.sessions)}
