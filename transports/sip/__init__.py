"""SIP/RTP phone bridge: calls from a SIP trunk or softphone land on the session engine.

Modules, lowest first (each imports only the ones above it):

* ``message``  SIP message parse and build (RFC 3261 7, 20), tokens, reason phrases.
* ``sdp``      the SDP offer/answer for one G.711 audio stream (RFC 3264, 4566).
* ``rtp``      RTP packets, G.711 framing, jitter buffer, RFC 4733 DTMF receiver.
* ``call``     ``SipCall``: one phone call (ring, accept, reject, refer, hang up) and its RTP media.
* ``bridge``   ``SipBridge``: the UDP socket, transactions, dialogs, dispatch, the 20 ms RTP clock.
"""

from .bridge import SipBridge, start_bridge

__all__ = ["SipBridge", "start_bridge"]
