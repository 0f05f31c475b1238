"""The session state machine driven directly: no socket, no server thread. Client events go in
through ``Session.handle`` exactly as a transport hands them over, and what the session emits is
read straight from its outbox, so event orders that a socket makes racy are exact here."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

import pipelines
from realtime_omni.config import Limits
from realtime_omni.metrics import Metrics
from realtime_omni.protocol import events as ev
from realtime_omni.session import Session
from realtime_omni.session.config import SessionConfig

MANUAL = msgspec.json.decode(b'{"type": "realtime", "audio": {"input": {"turn_detection": null}}}', type=ev.Session)
TEXT_ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}


def kind(event: Any) -> str:
    return event.__struct_config__.tag


class Opened:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.events: list[Any] = []

    async def send(self, *events: dict[str, Any]) -> None:
        """Hand each event to the session back to back, as a transport's read loop would."""
        for event in events:
            await self.session.handle(json.dumps(event))

    async def until(self, tag: str, timeout: float = 5.0) -> list[Any]:
        """Everything emitted up to and including the next event of type ``tag``."""
        start = len(self.events)
        async with asyncio.timeout(timeout):
            while True:
                event = await self.session.outbox.get()
                assert event is not None, "the outbox closed"
                self.events.append(event)
                if kind(event) == tag:
                    return self.events[start:]


@pytest.fixture
async def opened() -> AsyncIterator[Opened]:
    pipeline = pipelines.create("synthetic", {"chunk_interval_ms": 40, "reply": " ".join(["word"] * 40)})
    await pipeline.start()
    caps = pipeline.capabilities
    session = Session(pipeline, SessionConfig.default(caps, "m").updated(MANUAL, caps), Limits(), Metrics())
    await session.start()
    yield Opened(session)
    await session.close()
    assert pipeline.stats()["active_responses"] == 0
    await pipeline.stop()


@pytest.mark.parametrize("stop", [{"type": "response.cancel"}, {"type": "output_audio_buffer.clear"}])
async def test_a_response_cancelled_before_it_ran_still_reports_created_and_done(opened, stop):
    await opened.send({"type": "conversation.item.create", "item": TEXT_ITEM}, {"type": "response.create"}, stop)
    events = await opened.until("response.done")
    types = [kind(e) for e in events]
    assert types.index("response.created") < types.index("response.done")
    done = events[-1]
    assert done.response.status == "cancelled" and done.response.status_details.reason == "client_cancelled"
    assert opened.session.active is None
    await opened.send({"type": "response.create"})
    created = (await opened.until("response.created"))[-1]
    assert created.response.id != done.response.id
    await opened.send({"type": "response.cancel"})
    assert (await opened.until("response.done"))[-1].response.status == "cancelled"


async def test_an_out_of_band_response_cancelled_before_it_ran_reports_done(opened):
    await opened.send({"type": "response.create", "response": {"conversation": "none", "input": [TEXT_ITEM]}}, {"type": "response.cancel"})
    events = await opened.until("response.done")
    types = [kind(e) for e in events]
    assert types[types.index("response.created") + 1] == "rate_limits.updated"
    assert events[-1].response.status == "cancelled" and events[-1].response.conversation_id is None
    assert not opened.session.out_of_band


MALFORMED = [
    b'{"type":"session.update","session":{"instructions":' + b"[" * 1000 + b"]" * 1000 + b"}}",
    b'{"type":"input_audio_buffer.clear","x":' + b"[" * 1000 + b"]" * 1000 + b"}",
    b'{"type": 0x10}',
    b'{"type":"session.update","session":{"a":1}}}',
    b'{"type":"conversation.item.retrieve","item_id":5 x}',
    b'{"type":"\xff\xfe"}',
    '{"type":"\ud800"}',
    b"[" * 100_000,
]


@pytest.mark.parametrize("data", MALFORMED, ids=range(len(MALFORMED)))
async def test_unreadable_messages_are_errors_not_exceptions(opened, data):
    await opened.session.handle(data)
    error = (await opened.until("error"))[-1]
    assert error.error.type == "invalid_request_error" and error.error.code in ("invalid_json", "invalid_event")
    await opened.send({"type": "input_audio_buffer.clear"})
    await opened.until("input_audio_buffer.cleared")
