"""Clients that break the WebSocket rules rather than the Realtime API's: a text frame of invalid
UTF-8, a client that stops reading. Written with a hand-made WebSocket client (bench/rawws.py),
since well-behaved libraries refuse to do either."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from bench.rawws import OP_TEXT, RawWebSocket
from tests.support.client import connect


async def _until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.05)
    return False


async def test_invalid_utf8_in_a_text_frame_closes_1007_without_a_traceback(server, caplog):
    caplog.set_level(logging.WARNING)
    ws = await RawWebSocket.connect("127.0.0.1", server.port, "/v1/realtime?model=m", {"Authorization": "Bearer k"})
    assert ws.status == 101
    await ws.send_frame(OP_TEXT, b'{"type":"input_audio_buffer.clear","event_id":"\xff\xfe"}')
    assert await ws.close_code(timeout=5) == 1007
    await ws.close()
    assert await _until(lambda: server.acall(lambda: not server.server.sessions), 5)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], [r.getMessage() for r in caplog.records]
    assert any("not valid UTF-8" in r.getMessage() for r in caplog.records)
    async with connect(server.ws_base) as c:  # and the server serves on
        await c.expect("session.created")


async def test_a_client_that_stops_reading_is_dropped_after_the_send_timeout(make_server, caplog):
    """Kernel buffers take megabytes before a send blocks; the server still notices within about
    send_timeout_s that nothing it sent is acknowledged, and drops the client (it used to wait
    for keepalive to fail, 40-50 s)."""
    srv = make_server(reply=" ".join(["word"] * 400), limits={"send_timeout_s": 2.0})
    caplog.set_level(logging.WARNING)
    ws = await RawWebSocket.connect("127.0.0.1", srv.port, "/v1/realtime?model=m", rcvbuf=8192)
    await ws.send_frame(OP_TEXT, json.dumps({"type": "response.create"}).encode())  # 96 s of audio, at once; never read
    t0 = time.monotonic()
    assert await _until(lambda: srv.acall(lambda: not srv.server.sessions), 15), "a client that stopped reading was never dropped"
    waited = time.monotonic() - t0
    assert waited < 15  # well before keepalive (20 s ping + 20 s timeout) would have ended it
    # said by whichever noticed first: the stall watch (kernel buffers still taking data) or the
    # session's send timeout (uvicorn stopped taking writes)
    assert any("took no data" in r.getMessage() or "took no event" in r.getMessage() for r in caplog.records)
    assert await _until(lambda: srv.acall(lambda: srv.server.pipeline.stats()["active_responses"] == 0), 5)
    await ws.close()


async def test_a_client_that_pauses_shorter_than_the_send_timeout_is_kept(make_server):
    """Stopping to read for a while (shorter than send_timeout_s), then catching up, again and
    again for longer than the timeout: the session stays."""
    srv = make_server(reply=" ".join(["word"] * 400), limits={"send_timeout_s": 2.0})
    ws = await RawWebSocket.connect("127.0.0.1", srv.port, "/v1/realtime?model=m", rcvbuf=8192)
    await ws.send_frame(OP_TEXT, json.dumps({"type": "response.create"}).encode())
    got, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < 6:  # 3 x the send timeout
        await asyncio.sleep(1.0)
        while True:  # catch up: read until nothing comes for 50 ms
            try:
                data = await asyncio.wait_for(ws.reader.read(1 << 20), 0.05)
            except TimeoutError:
                break
            got += len(data)
            if not data:
                break
    assert await srv.acall(lambda: len(srv.server.sessions)) >= 1
    assert got > 1_000_000
    ws.abort()
