"""SIP/RTP phone bridge: calls from a SIP trunk or softphone land on the session engine.

Modules, lowest first; each imports only modules above it in this list:

* ``message``      SIP message parse and build (RFC 3261 7, 20): headers, tags, responses, ``Addr``.
* ``sdp``          the SDP offer/answer for one G.711 audio stream (RFC 3264, 4566).
* ``rtp``          RTP packets, G.711 framing, jitter buffer, RFC 4733 DTMF receiver.
* ``transaction``  RFC 3261 17 transactions as sans-I/O state machines: messages and time in,
                   datagrams to send, timer deadlines and failures out.
* ``dialog``       dialog state (RFC 3261 12): tags, CSeq, route set, matching, our in-dialog requests.
* ``webhook``      ``realtime.call.incoming`` POSTed to the application's webhook.
* ``call``         ``SipCall``: one phone call (ring, accept, reject, refer, hang up), its states
                   (``CallState``) and its RTP media.
* ``bridge``       ``SipBridge``: the UDP socket, transaction timers, dispatch to dialogs and calls,
                   the shared 20 ms RTP clock; ``start_bridge``.
"""

from .bridge import SipBridge, start_bridge

__all__ = ["SipBridge", "start_bridge"]
