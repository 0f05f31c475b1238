"""Clients that break the WebSocket rules rather than the Realtime API's: a text frame of invalid
UTF-8, a client that stops reading. Written with a hand-made WebSocket client (bench/rawws.py),
since well-behaved libraries refuse to do either."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest

from tests.support.client import connect
from tests.support.peers import OP_TEXT, RawWebSocket, offer_sdp
from tests.support.server import wait_until


@pytest.fixture(autouse=True)
def _uvicorn_logs(caplog):
    """uvicorn's loggers do not propagate to the root: let caplog see them too (its ERROR
    "Exception in ASGI application" is what a defect leaves)."""
    logger = logging.getLogger("uvicorn")
    logger.addHandler(caplog.handler)
    yield
    logger.removeHandler(caplog.handler)


async def test_invalid_utf8_in_a_text_frame_closes_1007_without_a_traceback(server, caplog):
    caplog.set_level(logging.WARNING)
    ws = await RawWebSocket.connect("127.0.0.1", server.port, "/v1/realtime?model=m", {"Authorization": "Bearer k"})
    assert ws.status == 101
    await ws.send_frame(OP_TEXT, b'{"type":"input_audio_buffer.clear","event_id":"\xff\xfe"}')
    assert await ws.close_code(timeout=5) == 1007
    await ws.close()
    assert await wait_until(lambda: server.acall(lambda: not server.server.sessions), 5)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], [r.getMessage() for r in caplog.records]
    assert any("not valid UTF-8" in r.getMessage() for r in caplog.records)
    async with connect(server.ws_base) as c:  # and the server serves on
        await c.expect("session.created")


async def test_a_client_that_stops_reading_is_dropped_after_the_send_timeout(make_server, caplog):
    """Kernel buffers take megabytes before a send blocks; the server still notices within about
    send_timeout_s that nothing it sent is acknowledged, and drops the client (it used to wait
    for keepalive to fail, 40-50 s)."""
    # (Not kept for a resume here, so the session's end shows when the connection was dropped;
    # test_resume.py has a dropped client's session kept.)
    srv = make_server(reply=" ".join(["word"] * 400), limits={"send_timeout_s": 2.0}, server={"resume": {"grace_s": 0}})
    caplog.set_level(logging.WARNING)
    ws = await RawWebSocket.connect("127.0.0.1", srv.port, "/v1/realtime?model=m", rcvbuf=8192)
    await ws.send_frame(OP_TEXT, json.dumps({"type": "response.create"}).encode())  # 96 s of audio, at once; never read
    t0 = time.monotonic()
    assert await wait_until(lambda: srv.acall(lambda: not srv.server.sessions), 15), "a client that stopped reading was never dropped"
    waited = time.monotonic() - t0
    assert waited < 15  # well before keepalive (20 s ping + 20 s timeout) would have ended it
    # said by whichever noticed first: the stall watch (kernel buffers still taking data) or the
    # session's send timeout (uvicorn stopped taking writes)
    assert any("took no data" in r.getMessage() or "took no event" in r.getMessage() for r in caplog.records)
    assert await wait_until(lambda: srv.acall(lambda: srv.server.pipeline.stats()["active_responses"] == 0), 5)
    await ws.close()


@pytest.mark.slow
async def test_a_client_that_pauses_shorter_than_the_send_timeout_is_kept(make_server):
    """Stopping to read for a while (shorter than send_timeout_s), then catching up, again and
    again for longer than the timeout: the session stays."""
    srv = make_server(reply=" ".join(["word"] * 400), limits={"send_timeout_s": 2.0})
    ws = await RawWebSocket.connect("127.0.0.1", srv.port, "/v1/realtime?model=m", rcvbuf=8192)
    await ws.send_frame(OP_TEXT, json.dumps({"type": "response.create"}).encode())
    got, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < 6:  # 3 x the send timeout
        await asyncio.sleep(1.0)  # the test's input: a pause in reading, shorter than the send timeout
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


# ------------------------------------------------------------------------------ HTTP


async def _raw_http(port: int, data: bytes, *, half_close: bool = False, timeout: float = 10) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    if half_close:
        writer.write_eof()
    try:
        async with asyncio.timeout(timeout):
            return await reader.read(-1)
    finally:
        writer.close()


async def test_a_body_cut_short_leaves_no_traceback(server, caplog):
    """Content-Length promises 100 bytes, 2 come, the client closes: the endpoint gives up quietly."""
    caplog.set_level(logging.WARNING)
    head = b"POST /v1/realtime/client_secrets HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer k\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{}"
    assert await _raw_http(server.port, head, half_close=True) == b""
    # the server closed the connection; once its request task has finished, all it logs is logged
    assert await wait_until(lambda: server.acall(lambda: not server.uvicorn.server_state.tasks), 5)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
    assert await server.acall(lambda: server.server.healthy)


async def test_a_request_head_that_never_ends_gets_408(make_server):
    """A connection that sends part of a head (or nothing) is answered 408 and closed after
    header_timeout_s, instead of being held for ever (uvicorn starts no timer before a first response)."""
    srv = make_server(limits={"header_timeout_s": 0.5})
    t0 = time.monotonic()
    answer = await _raw_http(srv.port, b"POST /v1/realtime/client_secrets HTTP/1.1\r\nHost: h\r\nX-Slow: ")
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
    assert time.monotonic() - t0 < 5
    assert (await _raw_http(srv.port, b"")).startswith(b"HTTP/1.1 408 ")  # nothing at all: the same
    # an ordinary request on a kept-alive connection is unaffected
    ok = await _raw_http(srv.port, b"GET /healthz HTTP/1.1\r\nHost: h\r\n\r\nGET /healthz HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    assert ok.count(b"HTTP/1.1 200 ") == 2


async def test_webrtc_offers_aiortc_cannot_answer_get_400_and_leave_nothing(server, caplog):
    """Offers whose BUNDLE group and mids disagree: aiortc takes them, then fails to answer (and,
    closing, fails again, and in a task of its own). Each is a 400 invalid_offer; no session,
    task or log error is left behind."""
    import httpx

    caplog.set_level(logging.WARNING)
    offer = await offer_sdp()
    bad = [
        offer.replace("a=mid:0\r\n", "a=mid:0\r\na=mid:1\r\n"),
        offer.replace("a=mid:0", "a=mid:7"),
        offer.replace("a=group:BUNDLE 0 1", "a=group:BUNDLE 1"),
        offer.replace("\r\n", "\r"),
    ]
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        for sdp in bad:
            r = await http.post("/v1/realtime/calls", content=sdp, headers={"Content-Type": "application/sdp", "Authorization": "Bearer k"})
            if r.status_code == 201:  # answerable after all: end the call
                await http.delete(r.headers["location"], headers={"Authorization": "Bearer k"})
            else:
                assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_offer", r.text
    assert await wait_until(lambda: server.acall(lambda: not server.server.sessions and not server.server.calls), 5)
    import gc

    await server.acall(gc.collect)  # what is left of the refused offers is finalised (and would log) now
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
