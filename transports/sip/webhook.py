"""``realtime.call.incoming``: a ringing call announced to the application's webhook, in OpenAI's
shape (an ``event`` object with the call's id and its SIP headers of interest).

The POST runs in a worker thread (urllib blocks) with the configured timeout; whatever goes wrong
(refused, timed out, an HTTP error status, a bad URL) is one answer, status 0, and the caller
decides what a call nobody took up becomes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.request
from typing import Any

from realtime_omni.ids import new_id

log = logging.getLogger(__name__)

SIP_HEADERS_IN_WEBHOOK = ("From", "To", "Call-ID", "Contact", "User-Agent", "P-Asserted-Identity", "Diversion", "Subject")


def incoming_call(call_id: str, sip_headers: list[tuple[str, str]]) -> dict[str, Any]:
    """The event for a ringing call: its id and the SIP headers an application routes on (the
    ones above, and every ``X-`` header)."""
    headers = [{"name": k, "value": v} for k, v in sip_headers if k in SIP_HEADERS_IN_WEBHOOK or k.startswith("X-")]
    return {
        "object": "event",
        "id": new_id("evt"),
        "type": "realtime.call.incoming",
        "created_at": int(time.time()),
        "data": {"call_id": call_id, "sip_headers": headers},
    }


async def post(url: str, event: dict[str, Any], *, timeout: float) -> int:
    """POST ``event`` as JSON; the HTTP status, or 0 when none came back."""

    def send() -> int:
        request = urllib.request.Request(url, json.dumps(event).encode(), {"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return int(r.status)

    try:
        return await asyncio.to_thread(send)
    except (OSError, ValueError) as exc:  # refused, timed out, an HTTP error status, a bad URL
        log.warning("webhook %s failed: %s", url, exc)
        return 0
