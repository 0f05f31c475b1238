"""The effective session configuration and ``session.update`` merge semantics.

The effective session is kept as a fully populated GA ``SessionObject`` (exactly what
``session.created`` and ``session.updated`` report) plus the values derived from it that the
engine reads often.
Updates merge: a field that is absent keeps its value, ``null`` clears it, nested objects merge
field by field (a turn detection of another ``type`` starts from that type's defaults), lists are
replaced. Beta spellings (flat fields) are folded into their GA places, here and only here: a
response's parameters override the session's through the same ``fold_output``. Every rejection
names the offending ``param``; an update that fails changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

import msgspec
from msgspec import UNSET, structs

from pipelines.base import Capabilities

from ..errors import RealtimeError, invalid_value
from ..protocol import beta as beta_names
from ..protocol import events as ev
from ..protocol.audio import WireFormat

OPENAI_VOICES = frozenset({"alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar"})

SERVER_VAD_DEFAULTS = ev.ServerVad(
    threshold=0.5,
    prefix_padding_ms=300,
    silence_duration_ms=500,
    create_response=True,
    interrupt_response=True,
    idle_timeout_ms=None,
)
SEMANTIC_VAD_DEFAULTS = ev.SemanticVad(eagerness="auto", create_response=True, interrupt_response=True)


@dataclass(frozen=True)
class VadSettings:
    """What the turn detector runs on, whichever VAD type the client chose."""

    threshold: float
    prefix_padding_ms: int
    silence_duration_ms: int | None  # None (semantic_vad): the turn-end policy's for the eagerness
    create_response: bool
    interrupt_response: bool
    idle_timeout_ms: int | None
    eagerness: str | None = None  # semantic_vad (what it means: pipelines/turn_end/policy.py)


class SessionConfig:
    __slots__ = ("wire", "temperature", "input_format", "output_format", "vad", "voice", "audio_out", "max_output_tokens")

    def __init__(self, wire: ev.SessionObject, caps: Capabilities, temperature: float | None = None) -> None:
        self.wire = wire
        self.temperature = temperature
        audio = wire.audio
        self.input_format = wire_format(audio.input.format)
        self.output_format = wire_format(audio.output.format)
        self.vad = _vad_settings(audio.input.turn_detection)
        voice = audio.output.voice
        name = voice.id if isinstance(voice, ev.VoiceId) else voice
        self.voice = name if name in caps.voices else caps.voices[0]
        self.audio_out = wire.output_modalities == ["audio"]
        self.max_output_tokens = None if wire.max_output_tokens == "inf" else wire.max_output_tokens

    @property
    def responds(self) -> bool:
        """False in a transcription session: turns are transcribed, never answered."""
        return self.wire.type != "transcription"

    @property
    def public(self) -> ev.SessionObject:
        """The session as ``session.created|updated`` show it: a transcription session has only
        its input audio settings and ``include``."""
        if self.responds:
            return self.wire
        w = self.wire
        return ev.SessionObject(type="transcription", audio=ev.SessionAudio(input=w.audio.input), include=w.include)

    @property
    def transcription(self) -> ev.Transcription | None:
        return self.wire.audio.input.transcription

    @property
    def noise_reduction(self) -> str | None:
        nr = self.wire.audio.input.noise_reduction
        return None if nr is None or isinstance(nr.type, msgspec.UnsetType) else nr.type

    @classmethod
    def default(cls, caps: Capabilities, model: str) -> "SessionConfig":
        audio_out = "audio" in caps.output_modalities
        wire = ev.SessionObject(
            type="realtime",
            model=model,
            instructions="",
            output_modalities=["audio"] if audio_out else ["text"],
            audio=ev.SessionAudio(
                input=ev.AudioInput(
                    format=ev.PcmFormat(rate=24000),
                    transcription=None,
                    noise_reduction=None,
                    turn_detection=SERVER_VAD_DEFAULTS,
                ),
                output=ev.AudioOutput(format=ev.PcmFormat(rate=24000), voice=caps.voices[0], speed=1.0),
            ),
            tools=[],
            tool_choice="auto",
            max_output_tokens="inf",
            tracing=None,
            truncation="auto",
        )
        return cls(wire, caps)

    def updated(self, update: ev.SessionObject, caps: Capabilities, prefix: str = "session") -> "SessionConfig":
        return _Merger(self, caps, prefix).apply(update)


def wire_format(fmt: ev.AudioFormat) -> WireFormat:
    return WireFormat.from_mime(fmt.__struct_config__.tag)  # type: ignore[arg-type]


def format_struct(fmt: WireFormat) -> ev.AudioFormat:
    if fmt is WireFormat.PCM16:
        return ev.PcmFormat(rate=24000)
    return ev.PcmuFormat() if fmt is WireFormat.PCMU else ev.PcmaFormat()


def _vad_settings(td: ev.TurnDetection | None) -> VadSettings | None:
    if td is None:
        return None
    if isinstance(td, ev.ServerVad):
        return VadSettings(
            td.threshold, td.prefix_padding_ms, td.silence_duration_ms, td.create_response, td.interrupt_response, td.idle_timeout_ms
        )
    return VadSettings(0.5, 300, None, td.create_response, td.interrupt_response, None, td.eagerness)


def merge(current: msgspec.Struct, update: msgspec.Struct) -> msgspec.Struct:
    """Fields set in ``update`` replace those of ``current`` (same Struct type)."""
    changes = {f: v for f in update.__struct_fields__ if (v := getattr(update, f)) is not UNSET}
    return structs.replace(current, **changes)


def parse_format(fmt: ev.AudioFormat, param: str) -> ev.AudioFormat:
    if isinstance(fmt, ev.PcmFormat):
        if fmt.rate not in (UNSET, 24000):
            raise invalid_value(f"{param}.rate", f"Invalid '{param}.rate': only 24000 is supported for audio/pcm.")
        return ev.PcmFormat(rate=24000)
    return fmt


def beta_format(name: str) -> ev.AudioFormat:
    return format_struct(WireFormat.from_mime(beta_names.BETA_FORMATS[name]))


def output_modalities(value: list[str], caps: Capabilities, param: str) -> list[str]:
    if not value:
        raise invalid_value(param, f"Invalid '{param}': at least one of 'text' or 'audio' is required.")
    wanted = "audio" if "audio" in value else "text"
    if wanted not in caps.output_modalities:
        raise invalid_value(param, f"Invalid '{param}': the '{caps.name}' pipeline cannot produce {wanted} output.")
    return [wanted]


def check_voice(voice: ev.Voice, caps: Capabilities, param: str) -> ev.Voice:
    name = voice.id if isinstance(voice, ev.VoiceId) else voice
    if name not in caps.voices and name not in OPENAI_VOICES:
        choices = ", ".join(sorted(caps.voices))
        raise invalid_value(param, f"Invalid '{param}': unknown voice {name!r}. Voices of this server: {choices} (OpenAI voice names map to '{caps.voices[0]}').")
    return voice


def check_tools(tools: list[ev.Tool], caps: Capabilities, param: str) -> list[ev.FunctionTool]:
    if tools and not caps.tools:
        raise RealtimeError(f"Invalid '{param}': the '{caps.name}' pipeline cannot call tools.", code="unsupported_value", param=param)
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if isinstance(tool, ev.McpTool):
            raise RealtimeError(f"Invalid '{param}[{i}].type': MCP tools are not supported by this server.", code="unsupported_value", param=f"{param}[{i}].type")
        if tool.name in seen:
            raise invalid_value(f"{param}[{i}].name", f"Invalid '{param}[{i}].name': duplicate tool name {tool.name!r}.")
        seen.add(tool.name)
        kind = tool.parameters.get("type", "object") if isinstance(tool.parameters, dict) else "object"
        if kind != "object":  # OpenAI's rule: a function's arguments are a JSON object
            message = f"Invalid schema for function {tool.name!r}: schema must be a JSON Schema of 'type: \"object\"', got 'type: {json.dumps(kind)}'."
            raise RealtimeError(message, code="invalid_function_parameters", param=f"{param}[{i}].parameters")
    return list(tools)  # type: ignore[arg-type]


def check_tool_choice(choice: ev.ToolChoice, tools: list[ev.FunctionTool], param: str) -> ev.ToolChoice:
    if isinstance(choice, ev.ToolChoiceMcp):
        raise RealtimeError(f"Invalid '{param}': MCP tools are not supported by this server.", code="unsupported_value", param=param)
    if isinstance(choice, ev.ToolChoiceFunction) and choice.name not in {t.name for t in tools}:
        raise invalid_value(f"{param}.name", f"Invalid '{param}.name': no tool named {choice.name!r} is configured.")
    return choice


@dataclass(frozen=True)
class OutputChoice:
    """What ``session.update`` and ``response.create`` alike may say about a response's output,
    in either spelling (GA: ``output_modalities``, ``audio.output.voice|format``,
    ``max_output_tokens``; beta: ``modalities``, ``voice``, ``output_audio_format``,
    ``max_response_output_tokens``)."""

    modalities: list[str]
    voice: ev.Voice
    format: ev.AudioFormat
    tools: list[ev.FunctionTool]
    tool_choice: ev.ToolChoice
    max_output_tokens: int | Literal["inf"]

    @classmethod
    def of(cls, wire: ev.SessionObject) -> "OutputChoice":
        out = wire.audio.output
        return cls(wire.output_modalities, out.voice, out.format, wire.tools, wire.tool_choice, wire.max_output_tokens)  # type: ignore[arg-type]


def fold_output(u: ev.SessionObject | ev.ResponseParams, current: OutputChoice, caps: Capabilities, p: str) -> OutputChoice:
    """``current`` with what ``u`` sets, checked (beta spellings first, GA ones win)."""
    modalities, voice, fmt = current.modalities, current.voice, current.format
    if u.modalities is not UNSET:
        modalities = output_modalities(u.modalities, caps, f"{p}.modalities")
    if u.output_modalities is not UNSET:
        modalities = output_modalities(u.output_modalities, caps, f"{p}.output_modalities")
    if u.output_audio_format is not UNSET:
        fmt = beta_format(u.output_audio_format)
    if u.voice is not UNSET:
        voice = check_voice(u.voice, caps, f"{p}.voice")
    out = u.audio.output if u.audio is not UNSET else UNSET
    if out is not UNSET:
        if out.format is not UNSET:
            fmt = parse_format(out.format, f"{p}.audio.output.format")
        if out.voice is not UNSET:
            voice = check_voice(out.voice, caps, f"{p}.audio.output.voice")
    tools = current.tools
    if u.tools is not UNSET:
        tools = check_tools(u.tools, caps, f"{p}.tools")
    choice = check_tool_choice(u.tool_choice if u.tool_choice is not UNSET else current.tool_choice, tools, f"{p}.tool_choice")
    max_tokens = current.max_output_tokens
    for value in (u.max_response_output_tokens, u.max_output_tokens):
        if value is not UNSET:
            max_tokens = value
    if u.prompt is not UNSET and u.prompt is not None:
        raise RealtimeError(f"Invalid '{p}.prompt': prompt templates are not supported by this server.", code="unsupported_value", param=f"{p}.prompt")
    return OutputChoice(modalities, voice, fmt, tools, choice, max_tokens)


class _Merger:
    """Applies one ``session.update`` to a copy of the effective session."""

    def __init__(self, current: SessionConfig, caps: Capabilities, prefix: str) -> None:
        self.current = current
        self.caps = caps
        self.p = prefix

    def apply(self, u: ev.SessionObject) -> SessionConfig:
        p, caps = self.p, self.caps
        wire = self.current.wire
        audio_in, audio_out = wire.audio.input, wire.audio.output
        temperature = self.current.temperature
        top: dict[str, object] = {}

        if u.type is not UNSET:
            if u.type == "transcription" and not caps.transcribes_input:
                raise RealtimeError(
                    f"Invalid '{p}.type': the '{caps.name}' pipeline does not transcribe, so it serves no transcription sessions.",
                    code="unsupported_value",
                    param=f"{p}.type",
                )
            top["type"] = u.type
        if u.model is not UNSET:
            top["model"] = u.model
        if u.instructions is not UNSET:
            top["instructions"] = u.instructions
        if u.temperature is not UNSET:
            temperature = u.temperature

        # --- audio.input (beta flat fields first, GA nested fields win) ---
        if u.input_audio_format is not UNSET:
            audio_in = structs.replace(audio_in, format=beta_format(u.input_audio_format))
        if u.input_audio_transcription is not UNSET:
            audio_in = structs.replace(audio_in, transcription=self._transcription(u.input_audio_transcription, f"{p}.input_audio_transcription"))
        if u.input_audio_noise_reduction is not UNSET:
            audio_in = structs.replace(audio_in, noise_reduction=u.input_audio_noise_reduction)
        if u.turn_detection is not UNSET:
            audio_in = structs.replace(audio_in, turn_detection=self._turn_detection(audio_in.turn_detection, _from_beta_vad(u.turn_detection)))
        if u.speed is not UNSET:  # (beta)
            audio_out = structs.replace(audio_out, speed=u.speed)

        if u.audio is not UNSET:
            a = u.audio
            if a.input is not UNSET:
                i, ip = a.input, f"{p}.audio.input"
                if i.format is not UNSET:
                    audio_in = structs.replace(audio_in, format=parse_format(i.format, f"{ip}.format"))
                if i.transcription is not UNSET:
                    audio_in = structs.replace(audio_in, transcription=self._transcription(i.transcription, f"{ip}.transcription"))
                if i.noise_reduction is not UNSET:
                    audio_in = structs.replace(audio_in, noise_reduction=i.noise_reduction)
                if i.turn_detection is not UNSET:
                    audio_in = structs.replace(audio_in, turn_detection=self._turn_detection(audio_in.turn_detection, i.turn_detection))
            if a.output is not UNSET and a.output.speed is not UNSET:
                audio_out = structs.replace(audio_out, speed=a.output.speed)

        output = fold_output(u, OutputChoice.of(wire), caps, p)
        audio_out = structs.replace(audio_out, voice=output.voice, format=output.format)
        top.update(
            output_modalities=output.modalities, tools=output.tools, tool_choice=output.tool_choice, max_output_tokens=output.max_output_tokens
        )
        for name in ("tracing", "truncation", "include", "parallel_tool_calls", "reasoning"):
            value = getattr(u, name)
            if value is not UNSET:
                top[name] = value
        if top.get("type", wire.type) == "transcription" and audio_in.transcription is None:
            audio_in = structs.replace(audio_in, transcription=ev.Transcription(model=caps.transcription_model))  # its whole point
        wire = structs.replace(wire, audio=ev.SessionAudio(input=audio_in, output=audio_out), **top)
        return SessionConfig(wire, caps, temperature)

    def _transcription(self, t: ev.Transcription | None, param: str) -> ev.Transcription | None:
        if t is None:
            return None
        if not self.caps.transcribes_input:
            raise RealtimeError(
                f"Invalid '{param}': the '{self.caps.name}' pipeline does not transcribe input audio.", code="unsupported_value", param=param
            )
        if t.model in (UNSET, None):
            t = structs.replace(t, model=self.caps.transcription_model)
        return t

    def _turn_detection(self, current: ev.TurnDetection | None, new: ev.TurnDetection | None) -> ev.TurnDetection | None:
        if new is None:
            return None
        base = current if type(current) is type(new) else (SERVER_VAD_DEFAULTS if isinstance(new, ev.ServerVad) else SEMANTIC_VAD_DEFAULTS)
        return merge(base, new)  # type: ignore[return-value]


def _from_beta_vad(td: ev.BetaTurnDetection | None) -> ev.TurnDetection | None:
    if td is None:
        return None
    if td.type == "semantic_vad":
        return ev.SemanticVad(eagerness=td.eagerness, create_response=td.create_response, interrupt_response=td.interrupt_response)
    return ev.ServerVad(
        threshold=td.threshold,
        prefix_padding_ms=td.prefix_padding_ms,
        silence_duration_ms=td.silence_duration_ms,
        create_response=td.create_response,
        interrupt_response=td.interrupt_response,
        idle_timeout_ms=td.idle_timeout_ms,
    )
