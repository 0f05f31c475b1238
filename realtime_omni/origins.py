"""``allowed_origins``: which sites' pages a browser may let talk to this server.

One reading of the setting for both of its uses: the WebSocket handshake and the WebRTC offer
refuse an Origin not listed (``Server.check_origin``), and the HTTP API's CORS answers
(``host/cors.py``) name only a listed one. An origin is compared whole (scheme, host, port), a
trailing slash ignored; ``"*"`` admits any.
"""

from __future__ import annotations


class Origins:
    def __init__(self, allowed: list[str] | None) -> None:
        self.checked = allowed is not None  # None: Origin not checked, and no CORS answers
        self.exact = frozenset(o.rstrip("/") for o in allowed or () if o != "*")
        self.any = "*" in (allowed or ())

    def listed(self, origin: str) -> bool:
        """Named in the list itself (not only admitted by ``"*"``)."""
        return origin.rstrip("/") in self.exact

    def allows(self, origin: str | None) -> bool:
        """An Origin a browser sent (None: none sent, not a browser) may connect."""
        return not self.checked or origin is None or self.any or self.listed(origin)
