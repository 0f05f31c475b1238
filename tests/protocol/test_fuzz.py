"""The generative fuzzer (bench/fuzz.py) at CI size: 10,000 seeded frames of every client event,
GA and beta, valid in odd orders, mutated, broken, binary and deeply nested, against a synthetic
server in its own process. After every batch of 200 the same connection completes a turn; the
server's log stays free of tracebacks and /healthz stays 200."""

from __future__ import annotations

import json

import pytest

from bench import fuzz
from bench.fuzz_gen import Frame, Generator
from tests.support.processes import server_process


def test_the_generator_is_reproducible_and_covers_every_kind():
    a, b = Generator(7), Generator(7)
    frames = [a.next() for _ in range(3000)]
    assert frames == [b.next() for _ in range(3000)]
    assert {f.kind for f in frames} == {"valid", "mutated", "broken", "binary", "nested", "odd"}
    assert any(isinstance(f.data, bytes) for f in frames) and any(isinstance(f.data, str) for f in frames)
    other = Generator(8)
    assert frames != [other.next() for _ in range(3000)]


async def test_ten_thousand_fuzzed_events_and_every_batch_still_completes_a_turn():
    with server_process(fuzz.synthetic_server_config(), startup_s=120) as url:
        stats = await fuzz.run(url, events=10_000, seed=17, connections=4, batch=200, logs=fuzz.LogWatch(url.log), minimise_budget_s=60)
    assert stats.failures == [], stats.failures
    assert stats.frames == 10_000
    assert stats.turns == stats.batches == 52  # every batch was followed by a completed turn
    # it reached the state machines, not only the decoder
    for kind in ("input_audio_buffer.speech_started", "input_audio_buffer.committed", "response.done:cancelled", "response.done:completed", "conversation.item.deleted"):
        assert stats.types[kind] > 0, kind
    for code in ("invalid_json", "invalid_event", "invalid_value", "invalid_type", "unknown_parameter", "conversation_already_has_active_response"):
        assert stats.errors[code] > 0, code


async def test_a_failing_batch_is_shrunk_to_its_reproducer():
    """A server that takes no message over 2,000 bytes closes the connection (1009) on a longer
    one: the batch holding one fails, and delta debugging shrinks it to that one frame."""
    config = fuzz.synthetic_server_config()
    config["limits"]["max_message_bytes"] = 2000
    clear = Frame("valid", '{"type":"input_audio_buffer.clear"}')
    big = Frame("mutated", '{"type":"session.update","session":{"instructions":"' + "x" * 3000 + '"}}')
    with server_process(config, startup_s=120) as url:
        logs = fuzz.LogWatch(url.log)
        small, failure = await fuzz.minimise(url, False, None, [clear] * 8, logs, 5.0)
        assert failure is None and len(small) == 8  # passes: nothing to shrink
        small, failure = await fuzz.minimise(url, False, None, [clear] * 5 + [big] + [clear] * 10, logs, 5.0)
    assert small == [big]
    # the server closes 1009; a client still writing may see the reset before it reads that frame
    assert failure is not None and "lost connection" in failure


async def test_an_oversize_message_is_closed_1009(make_server):
    """What the shrinking test above provokes, on its own: a message over ``max_message_bytes``
    ends that connection with close code 1009 (message too big), and the server goes on."""
    import websockets

    srv = make_server(limits={"max_message_bytes": 2000})
    headers = {"Authorization": "Bearer test-key"}
    async with websockets.connect(f"{srv.ws_base}/realtime?model=m", additional_headers=headers) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send('{"type":"session.update","session":{"instructions":"' + "x" * 3000 + '"}}')
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    async with websockets.connect(f"{srv.ws_base}/realtime?model=m", additional_headers=headers) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
