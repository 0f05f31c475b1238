"""A page of your own on another origin, in headless Chromium, calling the server over WebRTC with
an ephemeral key: what ``tests/transports/test_browser.py`` asks of CORS.

Run as ``python -m tests.support.cross_origin OUT`` inside a network namespace that has only
loopback (the test does that with ``unshare --net``): it starts the server (synthetic pipeline, an
API key, ``allowed_origins`` naming one loopback origin) in a thread, two plain static servers on
other ports (other origins: the listed one and one not listed) serving the same page, mints an
ephemeral key as the page's backend would, and lets Chromium load the page from the unlisted origin
and then from the listed one, both with that key. Writes ``OUT/result.json``: what each page saw,
and the server's sessions after the pages closed.
"""

from __future__ import annotations

import asyncio
import functools
import http.server
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.browser import headless_page
from tests.conftest import synthetic_config
from tests.support.audio import silence, write_wav
from tests.support.server import ServerThread

KEY = "sk-cross-origin"

# The page: the docs' WebRTC snippet (docs/webrtc.md) with a data channel exchange; what it saw goes
# to window.result. The server's URL and the ephemeral key come in the query string.
PAGE = """<!doctype html><meta charset="utf-8"><title>cross-origin call</title><script>
const q = new URLSearchParams(location.search);
window.result = null;
(async () => {
  const out = {origin: location.origin, events: []};
  try {
    const mic = await navigator.mediaDevices.getUserMedia({audio: true});
    const pc = new RTCPeerConnection();
    pc.addTrack(mic.getAudioTracks()[0], mic);
    pc.ontrack = () => { out.remoteTrack = true; };
    const events = pc.createDataChannel("oai-events");
    const answered = new Promise((resolve) => {
      events.onmessage = (m) => {
        const e = JSON.parse(m.data);
        out.events.push(e.type);
        if (e.type === "response.done") { out.response = e.response; resolve(); }
      };
    });
    events.onopen = () => {
      events.send(JSON.stringify({type: "conversation.item.create",
        item: {type: "message", role: "user", content: [{type: "input_text", text: "hello from another origin"}]}}));
      events.send(JSON.stringify({type: "response.create"}));
    };
    await pc.setLocalDescription(await pc.createOffer());
    const r = await fetch(q.get("server") + "/v1/realtime/calls", {method: "POST", body: pc.localDescription.sdp,
      headers: {"Content-Type": "application/sdp", "Authorization": "Bearer " + q.get("key")}});
    out.status = r.status;
    out.location = r.headers.get("Location");  // readable only when the server exposes it
    await pc.setRemoteDescription({type: "answer", sdp: await r.text()});
    await Promise.race([answered, new Promise((_, fail) => setTimeout(() => fail(new Error("no response.done within 20 s")), 20000))]);
    pc.close();
  } catch (e) {
    out.error = String(e);
  }
  window.result = out;
})();
</script>"""


class QuietPageHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve_page(folder: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(QuietPageHandler, directory=str(folder))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


async def visit(urls: list[str], wav: Path, out: Path) -> list[dict[str, Any]]:
    """Each page in turn, in one Chromium: what it left in ``window.result``."""
    seen = []
    async with headless_page(wav, out) as tools:
        for url in urls:
            await tools.call("Page.navigate", url=url)
            deadline = time.monotonic() + 40
            result = None
            while result is None and time.monotonic() < deadline:
                await asyncio.sleep(0.25)
                raw = await tools.evaluate("JSON.stringify(window.result)")
                result = json.loads(raw) if raw and raw != "null" else None
            seen.append(result or {"error": "the page gave no result within 40 s"})
    return seen

def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    site = out / "site"
    site.mkdir(exist_ok=True)
    (site / "call.html").write_text(PAGE)
    wav = out / "silence.wav"
    write_wav(wav, silence(2000, 48000), 48000)  # a silent microphone: no turns of its own
    listed, listed_url = serve_page(site)
    unlisted, unlisted_url = serve_page(site)
    config = synthetic_config(server={"api_key": KEY, "allowed_origins": [listed_url], "webrtc": {"host_addresses": ["127.0.0.1"]}})
    srv = ServerThread(config).start()
    try:
        minted = httpx.post(f"{srv.http_url}/v1/realtime/client_secrets", json={}, headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
        minted.raise_for_status()
        query = f"call.html?server={srv.http_url}&key={minted.json()['value']}"
        # the same key both times: if the refused page's offer had reached the server, the key would be spent
        pages = asyncio.run(visit([f"{unlisted_url}/{query}", f"{listed_url}/{query}"], wav, out))
        deadline = time.monotonic() + 10
        while srv.call(lambda: len(srv.server.sessions)) and time.monotonic() < deadline:
            time.sleep(0.1)
        result = {"unlisted": pages[0], "listed": pages[1], "sessions_after": srv.call(lambda: len(srv.server.sessions))}
    finally:
        srv.stop()
        listed.shutdown()
        unlisted.shutdown()
    (out / "result.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
