"""Clients other than the SDK: ``RawWebSocket`` (frames no WebSocket library would send),
``RtcClient`` (a WebRTC caller on aiortc, as a Python application writes one) and ``offer_sdp``
(a browser-like SDP offer, for requests that need one and no call).

The load and latency benches drive the server with the same clients, so they live in ``bench/``
(``rawws.py``, ``rtc.py``); the tests take them from here."""

from bench.rawws import OP_TEXT, RawWebSocket
from bench.rtc import RtcClient, offer_sdp

__all__ = ["OP_TEXT", "RawWebSocket", "RtcClient", "offer_sdp"]
