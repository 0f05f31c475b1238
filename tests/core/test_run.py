"""``ResponseRun`` on its own, through its ``Port`` and nothing else: a list stands in for the
session's outbox, and a test plays the transport taking events from it. What the client got is
what the run queued less what a cut dropped, and the item keeps exactly that."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from pipelines.base import AudioChunk, ResponseRequest, TextDelta, Usage
from realtime_omni.protocol import events as ev
from realtime_omni.protocol.audio import WireFormat
from realtime_omni.session.conversation import Alignment, Conversation
from realtime_omni.session.audio_out import EventAudio
from realtime_omni.session.draft import Weight
from realtime_omni.session.run import ResponseRun
from tests.support.fake_pipeline import CAPS

WORD = CAPS.output_rate // 5  # 200 ms of audio per word


class ListPort:
    """The whole of what a run may do to its session, over a list."""

    caps = CAPS
    timing_metadata = False

    def __init__(self) -> None:
        self.conversation = Conversation(CAPS)
        self.queue: list[tuple[Any, Any, Weight | None]] = []  # (event, owner, weight) not yet taken
        self.taken: list[Any] = []

    async def emit(self, event: Any, owner: Any = None, weight: Weight | None = None) -> bool:
        if owner is not None and owner.muted:
            return False
        self.queue.append((event, owner, weight))
        return True

    def purge(self, owner: Any) -> list[Weight]:
        dropped = [w for _, o, w in self.queue if o is owner and w is not None]
        self.queue = [entry for entry in self.queue if entry[1] is not owner]
        return dropped

    def add_item(self, item: Any, alignment: Alignment | None = None) -> str | None:
        previous, _ = self.conversation.add(item)
        if alignment is not None:
            self.conversation.alignment[item.id] = alignment
        return previous

    def rate_limits(self) -> ev.RateLimitsUpdated:
        return ev.RateLimitsUpdated(rate_limits=[])

    def take(self, n: int | None = None) -> list[str]:
        """The transport sends the oldest ``n`` queued events (all when None)."""
        n = len(self.queue) if n is None else n
        sent, self.queue = self.queue[:n], self.queue[n:]
        self.taken += [e for e, _, _ in sent]
        return [e.__struct_config__.tag for e, _, _ in sent]


async def words(n: int, gate: asyncio.Event | None = None) -> AsyncIterator[Any]:
    for i in range(n):
        if gate is not None and i == 2:
            await gate.wait()  # the pipeline is still producing when the cut comes
        yield TextDelta(("" if i == 0 else " ") + f"w{i}")
        yield AudioChunk(np.full(WORD, i + 1, np.int16))
    yield Usage(output_tokens=n)


def make_run(port: ListPort, chunks: AsyncIterator[Any], audio_out: Any = None) -> ResponseRun:
    """An in-band audio response over ``port``, its audio as deltas (unless ``audio_out`` says)."""
    request = ResponseRequest(response_id="resp_1", items=[], output_modalities=("audio",))
    audio_out = audio_out or EventAudio(port, CAPS.output_rate, WireFormat.PCM16)
    return ResponseRun(
        port, request, chunks, audio_out, in_band=True, output_format=WireFormat.PCM16,
        voice="fake", max_output_tokens="inf", metadata=None, started_at=0.0,
    )  # fmt: skip


async def test_a_completed_run_returns_its_outcome_and_its_item_holds_all_it_produced():
    port = ListPort()
    run = make_run(port, words(3))
    outcome = await run.run()
    assert (outcome.status, outcome.usage.output_tokens, outcome.in_band) == ("completed", 3, True)
    assert outcome.first_audio_at > 0 and outcome.audio_seconds == 3 * WORD / CAPS.output_rate
    types = port.take()
    assert types[0] == "response.created" and types[-1] == "response.done"
    item = port.conversation.get(run.output[0].id)
    assert item.parts[0].text == "w0 w1 w2" and len(item.parts[0].audio) == 3 * WORD


async def test_a_cut_keeps_exactly_what_the_transport_took():
    port = ListPort()
    gate = asyncio.Event()
    run = make_run(port, words(5, gate))
    run.task = asyncio.create_task(run.run())
    while sum(1 for e, _, _ in port.queue if e.__struct_config__.tag == "response.output_audio.delta") < 2:
        await asyncio.sleep(0)
    # the transport took everything up to the first word's audio; the second word waits in the queue
    first_audio = next(i for i, (e, _, _) in enumerate(port.queue) if e.__struct_config__.tag == "response.output_audio.delta")
    port.take(first_audio + 1)
    run.mute()
    await run.cancel("turn_detected")
    outcome = run.task.result()
    assert outcome.status == "cancelled"
    got = [base64.b64decode(e.delta) for e in port.taken if e.__struct_config__.tag == "response.output_audio.delta"]
    assert sum(len(d) for d in got) // 2 == WORD  # one word's audio (pcm16) reached the client
    item = port.conversation.get(run.output[0].id)
    assert len(item.parts[0].audio) == WORD and np.all(item.parts[0].audio == 1)
    assert item.parts[0].text == "w0" and item.status == "incomplete"
    tail = port.take()
    assert "response.output_audio.delta" not in tail and tail[-1] == "response.done"
