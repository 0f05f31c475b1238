"""The fuzzer beyond the WebSocket (bench/fuzz_wire.py) at CI size: generated HTTP requests to every
endpoint (malformed bodies, wrong content types, huge and broken heads, mutated WebRTC SDP offers)
and generated SIP datagrams (messages, SDP, RTP, DTMF) against a synthetic server in its own
process. Each gets a protocol error, never a 5xx; after every batch a key is minted, a WebRTC call
opened and ended, a SIP call completed; the log stays free of tracebacks."""

from __future__ import annotations

import pytest

from bench import fuzz_wire
from bench.fuzz import LogWatch
from tests.support.processes import server_process
from tests.support.sip import free_udp_port


async def test_fuzzed_http_requests_and_webrtc_offers_get_errors_and_the_server_serves_on():
    with server_process(fuzz_wire.server_config(free_udp_port()), startup_s=120) as url:
        stats = await fuzz_wire.run_http(url, requests=600, seed=5, logs=LogWatch(url.log))
    assert stats.failures == [], stats.failures
    assert stats.checks == 6
    for status in ("400", "401", "404", "413", "431", "201"):
        assert stats.statuses[status] > 0, (status, stats.statuses)
    assert not [s for s in stats.statuses if s.startswith("5")]


@pytest.mark.slow
async def test_fuzzed_sip_and_rtp_get_answers_and_calls_still_complete():
    sip_port = free_udp_port()
    with server_process(fuzz_wire.server_config(sip_port), startup_s=120) as url:
        stats = await fuzz_wire.run_sip(url, sip_port, datagrams=4000, seed=5, logs=LogWatch(url.log))
    assert stats.failures == [], stats.failures
    assert stats.checks == 20
    for answer in ("answer SIP/2.0 400 ", "answer SIP/2.0 405 ", "answer SIP/2.0 481 ", "answer SIP/2.0 200 "):
        assert stats.statuses[answer] > 0, (answer, stats.statuses)
    assert stats.statuses["rtp"] > 1000
