"""Server events in beta spelling, for connections opened with ``OpenAI-Beta: realtime=v1``.

The session engine only ever produces GA events; this module rewrites them (names, flat session,
item content types, response fields) into the shapes of the SDK's ``openai.types.beta.realtime``.
Events that have no beta counterpart are dropped. Beta *client* shapes need no translation here:
the GA structs accept them and ``session_config`` folds them in.
"""

from __future__ import annotations

from typing import Any

RENAMES = {
    "conversation.item.added": "conversation.item.created",
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
}
DROPPED = frozenset(
    {
        "conversation.item.done",
        "input_audio_buffer.timeout_triggered",
        "input_audio_buffer.dtmf_event_received",
        "conversation.item.input_audio_transcription.segment",
    }
)
FORMATS = {"audio/pcm": "pcm16", "audio/pcmu": "g711_ulaw", "audio/pcma": "g711_alaw"}
BETA_FORMATS = {v: k for k, v in FORMATS.items()}
_CONTENT_TYPES = {"output_text": "text", "output_audio": "audio"}


def translate(event: dict[str, Any]) -> dict[str, Any] | None:
    kind = event["type"]
    if kind in DROPPED:
        return None
    event["type"] = RENAMES.get(kind, kind)
    if "session" in event:
        event["session"] = session(event["session"])
    if "item" in event:
        event["item"] = item(event["item"])
    if "response" in event:
        event["response"] = response(event["response"])
    return event


def session(ga: dict[str, Any]) -> dict[str, Any]:
    audio = ga.get("audio", {})
    inp, out = audio.get("input", {}), audio.get("output", {})
    out_modalities = ga.get("output_modalities", ["audio"])
    beta: dict[str, Any] = {
        "modalities": ["text", "audio"] if "audio" in out_modalities else ["text"],
        "instructions": ga.get("instructions", ""),
        "voice": _voice(out.get("voice")),
        "input_audio_format": FORMATS[inp.get("format", {}).get("type", "audio/pcm")],
        "output_audio_format": FORMATS[out.get("format", {}).get("type", "audio/pcm")],
        "input_audio_transcription": _transcription(inp.get("transcription")),
        "input_audio_noise_reduction": inp.get("noise_reduction"),
        "turn_detection": _turn_detection(inp.get("turn_detection")),
        "tools": ga.get("tools", []),
        "tool_choice": ga["tool_choice"] if isinstance(ga.get("tool_choice"), str) else "auto",
        "max_response_output_tokens": ga.get("max_output_tokens", "inf"),
        "speed": out.get("speed", 1.0),
        "tracing": ga.get("tracing"),
    }
    return beta


def _voice(voice: Any) -> Any:
    return voice["id"] if isinstance(voice, dict) else voice


def _transcription(t: dict[str, Any] | None) -> dict[str, Any] | None:
    if t is None:
        return None
    return {k: t[k] for k in ("model", "language", "prompt") if k in t}


def _turn_detection(td: dict[str, Any] | None) -> dict[str, Any] | None:
    if td is None:
        return None
    return {k: v for k, v in td.items() if k != "idle_timeout_ms"}


def item(ga: dict[str, Any]) -> dict[str, Any]:
    if "content" in ga:
        content = []
        for part in ga["content"]:
            if part["type"] == "input_image":
                continue  # the beta protocol has no image content
            part["type"] = _CONTENT_TYPES.get(part["type"], part["type"])
            content.append(part)
        ga["content"] = content
    return ga


def response(ga: dict[str, Any]) -> dict[str, Any]:
    out = ga.pop("audio", None) or {}
    out = out.get("output", {})
    ga["modalities"] = ["text", "audio"] if "audio" in ga.pop("output_modalities", []) else ["text"]
    if "format" in out:
        ga["output_audio_format"] = FORMATS[out["format"]["type"]]
    if "voice" in out:
        ga["voice"] = _voice(out["voice"])
    ga["output"] = [item(i) for i in ga.get("output", [])]
    details = (ga.get("usage") or {}).get("input_token_details")
    if details:
        details.pop("cached_tokens_details", None)
        details.pop("image_tokens", None)
    return ga
