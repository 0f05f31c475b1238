"""Clients other than the SDK: ``RawWebSocket`` (frames no WebSocket library would send),
``RtcClient`` (a WebRTC caller on aiortc, as a Python application writes one), ``offer_sdp``
(a browser-like SDP offer, for requests that need one and no call) and ``ResumingClient`` (a
client that drops its connection and resumes its session, on a raw socket).

The load and latency benches drive the server with the same clients, so they live in ``bench/``
(``rawws.py``, ``rtc.py``, ``resume.py``); the tests take them from here."""

from bench.rawws import OP_CLOSE, OP_TEXT, RawWebSocket
from bench.resume import Refused, ResumingClient, event_number, response_headers
from bench.rtc import RtcClient, offer_sdp

__all__ = ["OP_CLOSE", "OP_TEXT", "RawWebSocket", "Refused", "ResumingClient", "RtcClient", "event_number", "offer_sdp", "response_headers"]
