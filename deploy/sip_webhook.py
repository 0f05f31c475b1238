"""A SIP webhook for realtime-omni (docs/telephony.md#a-webhook-that-decides): the server POSTs
``realtime.call.incoming`` here for every ringing call; this answers the POST at once, then accepts
the call with a session of its own when the caller's From holds one of ALLOWED_CALLERS, and rejects
it (403) otherwise. Python's standard library only:

    REALTIME_OMNI_URL=http://127.0.0.1:8000 REALTIME_OMNI_API_KEY=sk-... \\
    ALLOWED_CALLERS="+15551234567,+15557654321" python3 deploy/sip_webhook.py --port 9100

with ``sip: {webhook_url: "http://127.0.0.1:9100/"}`` in the server's config. The server signs
nothing: keep this listening where only the server reaches it (loopback, a private network).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SERVER = os.environ.get("REALTIME_OMNI_URL", "http://127.0.0.1:8000")
API_KEY = os.environ.get("REALTIME_OMNI_API_KEY", "")
ALLOWED_CALLERS = [c.strip() for c in os.environ.get("ALLOWED_CALLERS", "").split(",") if c.strip()]

# The session a call gets, as a client's session.update writes it; it is laid over sip.session.
SESSION = {"type": "realtime", "instructions": "You answer the phone for Example Ltd. Keep answers to one short sentence."}


def control(call_id: str, action: str, body: dict[str, Any]) -> int:
    """POST /v1/realtime/calls/{call_id}/{action} with the API key; the HTTP status."""
    request = urllib.request.Request(
        f"{SERVER}/v1/realtime/calls/{call_id}/{action}",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", **({"Authorization": f"Bearer {API_KEY}"} if API_KEY else {})},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:  # the call hung up meanwhile (404), ...
        return refused.code


def decide(event: dict[str, Any]) -> None:
    call_id = event["data"]["call_id"]
    headers = {h["name"].lower(): h["value"] for h in event["data"]["sip_headers"]}
    caller = headers.get("p-asserted-identity") or headers.get("from", "")  # a trunk's asserted identity first
    if any(number in caller for number in ALLOWED_CALLERS):
        action, body = "accept", SESSION
    else:
        action, body = "reject", {"status_code": 403}
    print(f"{call_id} from {caller!r}: {action} -> {control(call_id, action, body)}", flush=True)


class Webhook(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            event = json.loads(self.rfile.read(min(length, 64 * 1024)))
        except ValueError:
            self.send_response(400)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        # answer the webhook at once and decide afterwards: the server waits for this answer
        # (sip.webhook_timeout_s) before it counts the call as announced
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
        if isinstance(event, dict) and event.get("type") == "realtime.call.incoming":
            threading.Thread(target=decide, args=(event,), daemon=True).start()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), Webhook)
    print(f"webhook on http://{args.host}:{server.server_address[1]}/", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
