"""A real browser talking to the server: headless Chromium opens the web demo with a fake
microphone playing a WAV file and holds a WebRTC conversation with the server.

Server and browser run inside a fresh network namespace that has only loopback (``unshare -n``,
needs root or user namespaces), so ICE can only use 127.0.0.1. The page measures each turn itself
(end of speech to first audio heard) and exposes its state as ``window.demo``; this script reads it
over the Chrome DevTools protocol, takes a screenshot, and writes ``result.json`` + ``screenshot.png``.

    python -m bench.browser --config synthetic --wav question.wav --turns 3 --out bench/results/browser
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import websockets

from bench.common import RESULTS, server_process
from realtime_omni import config as config_file

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
    "--allow-loopback-in-peer-connection",
    "--disable-features=WebRtcHideLocalIpsWithMdns",
    "--window-size=1280,800",
]

# What the test and the benchmark read back from the page.
DOM_PROBE = """JSON.stringify({
  demo: window.demo,
  dom: {
    mic: !!document.querySelector('#mic'),
    micOn: !!document.querySelector('#mic.on'),
    latency: document.querySelector('#latency')?.textContent,
    userBubbles: [...document.querySelectorAll('.msg.user')].map(e => e.textContent),
    assistantBubbles: [...document.querySelectorAll('.msg.assistant')].map(e => e.textContent),
    timelineRows: document.querySelectorAll('#timeline .row').length,
    status: document.querySelector('#status')?.textContent,
  }
})"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise FileNotFoundError("no chromium on PATH (Debian: apt-get install chromium)")


class DevTools:
    """Just enough of the Chrome DevTools protocol: evaluate JS, take a screenshot."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self._ids)
        await self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            reply = json.loads(await self.ws.recv())
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")


def _devtools_url(profile: Path, deadline: float) -> str:
    port_file = profile / "DevToolsActivePort"
    while not port_file.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("chromium did not open its DevTools port")
        time.sleep(0.1)
    port = port_file.read_text().split()[0]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
        pages = [t for t in json.load(r) if t.get("type") == "page"]
    return pages[0]["webSocketDebuggerUrl"]


@contextlib.asynccontextmanager
async def headless_page(wav: Path, out: Path) -> AsyncIterator[DevTools]:
    """Headless Chromium with ``wav`` as its microphone (its log in ``out/chromium.log``), one
    blank page open; yields that page's DevTools. Chromium and its profile are gone afterwards."""
    profile = Path(tempfile.mkdtemp(prefix="rtomni-chromium-"))
    log = open(out / "chromium.log", "w")
    browser = subprocess.Popen(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--use-file-for-fake-audio-capture={wav}",
         "--remote-debugging-port=0", "about:blank"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        url = _devtools_url(profile, time.monotonic() + 30)
        async with websockets.connect(url, max_size=None) as ws:
            tools = DevTools(ws)
            await tools.call("Page.enable")
            yield tools
    finally:
        browser.terminate()
        try:
            browser.wait(10)
        except subprocess.TimeoutExpired:
            browser.kill()
        log.close()
        shutil.rmtree(profile, ignore_errors=True)


async def converse(http_url: str, wav: Path, turns: int, timeout_s: float, out: Path) -> dict[str, Any]:
    async with headless_page(wav, out) as tools:
        await tools.call("Page.navigate", url=f"{http_url}/?autostart=1&raw=1")
        deadline = time.monotonic() + timeout_s
        state: dict[str, Any] = {}
        while time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            raw = await tools.evaluate(DOM_PROBE)
            if not raw:
                continue
            state = json.loads(raw)
            demo = state["demo"]
            heard = [t for t in demo["turns"] if t["latencyMs"] is not None and t["user"] and t["timings"]]
            if len(heard) >= turns or demo["errors"]:
                break
        await asyncio.sleep(0.5)  # let the last answer's transcript land before the picture
        state = json.loads(await tools.evaluate(DOM_PROBE) or "{}") or state
        shot = await tools.call("Page.captureScreenshot", format="png")
        (out / "screenshot.png").write_bytes(base64.b64decode(shot["data"]))
        return state


def run(config: dict[str, Any], wav: Path, turns: int, timeout_s: float, out: Path, startup_s: float) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    config = {**config, "webrtc": {**config.get("webrtc", {}), "host_addresses": ["127.0.0.1"]}}
    with server_process(config, startup_s=startup_s) as ws_base:
        http_url = ws_base.replace("ws://", "http://").removesuffix("/v1")
        state = asyncio.run(converse(http_url, wav, turns, timeout_s, out))
    (out / "result.json").write_text(json.dumps(state, indent=2))
    return state


def in_private_network(argv: list[str]) -> int:
    """Run this module again inside a new network namespace that has only loopback."""
    if not shutil.which("unshare"):
        raise FileNotFoundError("unshare (util-linux) is needed for a private network namespace")
    script = 'ip link set lo up && exec "$@"'
    cmd = ["unshare", "--net", "sh", "-c", script, "sh", sys.executable, "-m", "bench.browser", "--inside", *argv]
    return subprocess.call(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="synthetic", help="config name/path, or JSON of a whole config")
    p.add_argument("--wav", type=Path, required=True, help="what the fake microphone plays, looped (48 kHz mono WAV)")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds for the conversation")
    p.add_argument("--startup", type=float, default=600.0, help="seconds for the server to become ready")
    p.add_argument("--out", type=Path, default=RESULTS / "browser")
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.inside:
        return in_private_network([a for a in argv if a != "--inside"])
    config = json.loads(args.config) if args.config.lstrip().startswith("{") else config_file.raw(args.config)
    state = run(config, args.wav.resolve(), args.turns, args.timeout, args.out, args.startup)
    turns = state.get("demo", {}).get("turns", [])
    for t in turns:
        print(f"turn: {t['latencyMs'] and round(t['latencyMs'])} ms  user={t['user']!r}  assistant={t['assistant']!r}")
    print(f"wrote {args.out}/result.json and screenshot.png")
    return 0 if turns else 1


if __name__ == "__main__":
    sys.exit(main())
