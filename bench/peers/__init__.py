"""Benchmark peers: other voice-agent servers built on the same models, measured by the same replay
harness. Each runs in the peers' own virtual environment (``bench/peers/setup``; its pins conflict
with the server's), in a process of its own; this module (in the server's environment) starts it and
speaks its wire.

* ``pipecat_agent``: Pipecat (``bench/peers/pipecat_agent.py``) on a ``vllm serve`` of the same LLM;
* ``PipecatTransport``: the replay harness's transport to it (``--transport pipecat``): the same
  20 ms microphone frames, and what the agent says back (RTVI messages, raw audio) turned into the
  Realtime events ``bench/client.py`` records a turn from.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
AGENT = Path(__file__).with_name("pipecat_agent.py")


def venv() -> Path:
    """The peers' virtual environment: ``$PEERS_VENV`` or ``.venv-peers`` at the repository root."""
    return Path(os.environ.get("PEERS_VENV") or ROOT / ".venv-peers")


def python() -> Path:
    return venv() / "bin" / "python"


def available() -> bool:
    """Whether ``bench/peers/setup`` has installed Pipecat (a check that imports it there)."""
    if not python().exists():
        return False
    check = subprocess.run([str(python()), "-c", "import pipecat, faster_whisper, moonshine_voice, piper, fastapi, uvicorn"], capture_output=True)
    return check.returncode == 0


class PeerURL(str):
    """A started peer's ws base URL; ``.process`` is its process."""

    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def pipecat_agent(config: dict[str, Any], llm_url: str, llm_model: str, startup_s: float = 300.0, ears: str | None = None) -> Iterator[PeerURL]:
    """The Pipecat peer configured as ``config`` (a ``configs/cpu.yaml``-shaped dict) configures the
    server: the same ears (Moonshine Base's files, or the Whisper directory), Piper voice, instructions, temperature, max tokens and
    repetition penalty, the LLM at ``llm_url`` (``bench.common.vllm_serve``). Yields its ws URL."""
    from pipelines import models

    from ..common import free_port, stop, wait_ready

    options = config["pipeline"]["options"]
    thinker = options.get("thinker", {})
    asr = ears or options.get("asr_model", "moonshine-base")  # (``ears``: another listener than the config's)
    if asr == "moonshine-base":
        # the publisher's files the server's model is built from, as Pipecat's Moonshine service reads them
        ears = ["--moonshine", str(models.MODELS[asr].sources()[0].parent)]
    else:
        ears = ["--whisper", str(models.ensure(asr, print))]
    voice = next(models.ensure(options.get("voice", "piper-joe"), print).glob("*.onnx"))
    instructions = (config.get("session") or {}).get("instructions") or "You are a helpful assistant."
    port = free_port()
    cmd = [
        str(python()), str(AGENT), "--port", str(port), *ears, "--piper", str(voice),
        "--llm-url", llm_url, "--llm-model", llm_model, "--instructions", instructions,
        "--temperature", str(thinker.get("temperature", 0.3)), "--max-tokens", str(thinker.get("max_tokens", 64)),
        "--repetition-penalty", str(thinker.get("repetition_penalty", 1.0)),
    ]  # fmt: skip
    log = open(Path(tempfile.gettempdir()) / f"pipecat-agent-{port}.log", "w")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)  # nothing of this repository's environment leaks into the peer's
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tempfile.gettempdir())
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}/healthz", startup_s, "the Pipecat agent", Path(log.name))
        url = PeerURL(f"ws://127.0.0.1:{port}")
        url.process = proc
        yield url
    finally:
        stop(proc)
        log.close()


# ------------------------------------------------------------------------------ the harness's transport


class PipecatTransport:
    """The replay harness's side of ``pipecat_agent.py``'s wire, read as Realtime events.

    Out: each 20 ms microphone frame as one binary message (pcm16 at the harness's 24 kHz); the
    Realtime events the harness sends (``conversation.item.truncate``) have no counterpart and are
    dropped. In: Pipecat's own signals, mapped to the events a turn is recorded from:

    * RTVI ``user-started-speaking`` (the user aggregator started a user turn; the same instant it
      broadcasts the interruption that stops the bot's audio) -> ``input_audio_buffer.speech_started``,
      and a bot answer still open ends ``cancelled``; so does ``{"type": "interruption"}``;
    * RTVI ``user-stopped-speaking`` (Smart Turn decided the turn is over) ->
      ``input_audio_buffer.speech_stopped``; the turn's final ``user-transcription``\\ s ->
      ``conversation.item.input_audio_transcription.completed``;
    * a bot answer opens (``response.created``) at RTVI ``bot-llm-started`` or its first audio,
      ``bot-llm-text`` -> ``response.output_text.delta``, each binary message ->
      ``response.output_audio.delta``; it is done when the LLM has finished and the bot has
      stopped speaking (Pipecat's output transport sends audio at playback pace, so that is when
      its last audio left), or at once when the LLM wrote nothing.
    """

    BOT_READY_S = 120.0

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self._turn = 0
        self._item: str | None = None
        self._stopped = False  # the current user turn has ended
        self._heard: list[str] = []
        self._responses = 0
        self._open: dict[str, Any] | None = None  # the bot answer in progress
        self._last_response: str | None = None

    @classmethod
    async def open(cls, url: str, model: str = "", api_key: str | None = None) -> "PipecatTransport":
        """Connect, say RTVI ``client-ready`` and wait for ``bot-ready``: the pipeline is up (its
        models loaded) before the conversation starts, as the server's session is on connect."""
        import websockets

        ws = await websockets.connect(f"{url.rstrip('/')}/ws", max_size=None, open_timeout=30)
        ready = {"label": "rtvi-ai", "type": "client-ready", "id": "ready", "data": {"version": "1.0.0", "about": {"library": "realtime-omni-bench"}}}
        await ws.send(json.dumps(ready))

        async def bot_ready() -> None:
            async for message in ws:
                if isinstance(message, str) and json.loads(message).get("type") == "bot-ready":
                    return
            raise ConnectionError("the Pipecat agent closed the connection before bot-ready")

        try:
            await asyncio.wait_for(bot_ready(), cls.BOT_READY_S)
        except BaseException:
            await ws.close()
            raise
        return cls(ws)

    async def send_audio(self, pcm16: bytes) -> None:
        await self.ws.send(pcm16)

    async def send_event(self, event: dict[str, Any]) -> None:
        pass  # no Realtime events on this wire (see the class docstring)

    async def close(self) -> None:
        await self.ws.close()

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        async for message in self.ws:
            if isinstance(message, bytes):
                for event in self._audio(message):
                    yield event
                continue
            try:
                m = json.loads(message)
            except ValueError:
                continue
            for event in self._message(m):
                yield event

    # -- the mapping

    def _start_response(self) -> list[dict[str, Any]]:
        self._responses += 1
        rid = f"resp_{self._responses}"
        self._open = {"id": rid, "llm_done": False, "speaking": False, "text": "", "audio": False}
        self._last_response = rid
        return [{"type": "response.created", "response": {"id": rid, "status": "in_progress"}}]

    def _done(self, status: str) -> list[dict[str, Any]]:
        r, self._open = self._open, None
        if r is None:
            return []
        output = [{"type": "message", "role": "assistant", "content": [{"type": "output_audio", "transcript": r["text"]}]}]
        return [{"type": "response.done", "response": {"id": r["id"], "status": status, "output": output}}]

    def _audio(self, pcm16: bytes) -> list[dict[str, Any]]:
        events = self._start_response() if self._open is None else []
        rid = self._open["id"] if self._open else self._last_response
        if self._open:
            self._open["audio"] = True
        delta = base64.b64encode(pcm16).decode()
        return [*events, {"type": "response.output_audio.delta", "response_id": rid, "item_id": f"item_{rid}", "delta": delta}]

    def _transcript(self) -> list[dict[str, Any]]:
        if not self._heard or self._item is None:
            return []
        text = " ".join(t.strip() for t in self._heard if t.strip())
        return [{"type": "conversation.item.input_audio_transcription.completed", "item_id": self._item, "transcript": text}]

    def _message(self, m: dict[str, Any]) -> list[dict[str, Any]]:
        kind, data = m.get("type"), m.get("data") or {}
        out: list[dict[str, Any]] = []
        if kind == "interruption":
            out += self._done("cancelled")
        elif kind == "user-started-speaking":
            self._turn += 1
            self._item, self._stopped, self._heard = f"item_{self._turn}", False, []
            out.append({"type": "input_audio_buffer.speech_started", "item_id": self._item})
            out += self._done("cancelled")
        elif kind == "user-stopped-speaking":
            self._stopped = True
            out.append({"type": "input_audio_buffer.speech_stopped", "item_id": self._item})
            out += self._transcript()
        elif kind == "user-transcription" and data.get("final"):
            self._heard.append(data.get("text", ""))
            if self._stopped:
                out += self._transcript()
        elif kind == "bot-llm-started":
            if self._open is None:
                out += self._start_response()
        elif kind == "bot-llm-text" and self._open is not None:
            self._open["text"] += data.get("text", "")
            out.append({"type": "response.output_text.delta", "response_id": self._open["id"], "delta": data.get("text", "")})
        elif kind == "bot-llm-stopped" and self._open is not None:
            self._open["llm_done"] = True
            if not self._open["text"].strip() and not self._open["audio"]:
                out += self._done("completed")  # nothing to say: nothing will be spoken
        elif kind == "bot-started-speaking" and self._open is not None:
            self._open["speaking"] = True
        elif kind == "bot-stopped-speaking" and self._open is not None:
            self._open["speaking"] = False
            if self._open["llm_done"]:
                out += self._done("completed")
        elif kind == "error":
            out.append({"type": "error", "error": {"message": str(data.get("error") or data)}})
        return out
