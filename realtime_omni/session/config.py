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
from typing import Literal, NoReturn, TypeVar

import msgspec
from msgspec import UNSET, UnsetType, structs

from pipelines.base import Capabilities

from ..errors import RealtimeError, invalid_value
from ..protocol import beta as beta_names
from ..protocol import events as ev
from ..protocol.audio import WireFormat

T = TypeVar("T")
S = TypeVar("S", bound=msgspec.Struct)
Modality = Literal["text", "audio"]
# every ToolChoice; an MCP server's is resolved per response, against its listing (session/mcp.py's ``forced``)
FunctionChoice = Literal["auto", "none", "required"] | ev.ToolChoiceFunction | ev.ToolChoiceMcp

# audio.input.transcription.keywords: the words the ears are told to expect (a contact list, a
# service's towns); each one is matched against every hypothesis of the listener's beam
MAX_KEYWORDS = 100
MAX_KEYWORD_CHARS = 64
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


# The effective session (``SessionConfig.wire``) has a value in every field that needs one, though
# the wire type makes every field optional: reading one, narrow it here, once.


def missing(name: str) -> NoReturn:
    """A field the effective session always has is missing: this module's bug, never the client's."""
    raise RuntimeError(f"internal error: the effective session has no '{name}'")


def resolved(value: T | None | UnsetType, name: str) -> T:
    """A field of the effective session that has a value (never ``UNSET``, never ``null``). For a
    field of one type: given a union, mypy infers its join (narrow those inline, with ``missing``)."""
    if value is None or isinstance(value, UnsetType):
        missing(name)
    return value


def known(value: T | UnsetType, name: str) -> T:
    """A field of the effective session where ``null`` means something (``turn_detection: null``
    is manual turns): never ``UNSET``. For a field of one type, as ``resolved``."""
    if isinstance(value, UnsetType):
        missing(name)
    return value


class SessionConfig:
    """The effective session: ``wire`` as the client sees it (every field the wire type makes
    optional is set), ``audio_input`` and ``audio_output`` its audio settings, and what is derived
    from them."""

    __slots__ = (
        "wire", "audio_input", "audio_output", "temperature", "input_format", "output_format", "vad", "voice", "audio_out",
        "max_output_tokens",
    )  # fmt: skip

    def __init__(self, wire: ev.SessionObject, caps: Capabilities, temperature: float | None = None) -> None:
        self.wire = wire
        self.temperature = temperature
        audio = resolved(wire.audio, "audio")
        self.audio_input: ev.AudioInput = resolved(audio.input, "audio.input")
        self.audio_output: ev.AudioOutput = resolved(audio.output, "audio.output")
        self.input_format = wire_format(self.input_format_struct)
        self.output_format = wire_format(self.output_format_struct)
        self.vad = _vad_settings(self.turn_detection)
        voice = self.voice_choice
        name = voice.id if isinstance(voice, ev.VoiceId) else voice
        self.voice = name if name in caps.voices else caps.voices[0]
        self.audio_out = wire.output_modalities == ["audio"]
        max_tokens = self.max_tokens_choice
        self.max_output_tokens = None if max_tokens == "inf" else max_tokens

    # --- the effective session's fields, narrowed (see ``missing``) ---

    @property
    def input_format_struct(self) -> ev.AudioFormat:
        fmt = self.audio_input.format
        if fmt is None or fmt is UNSET:
            missing("audio.input.format")
        return fmt

    @property
    def output_format_struct(self) -> ev.AudioFormat:
        fmt = self.audio_output.format
        if fmt is None or fmt is UNSET:
            missing("audio.output.format")
        return fmt

    @property
    def voice_choice(self) -> ev.Voice:
        """The voice as the client chose it (``voice`` is this server's voice that plays it)."""
        voice = self.audio_output.voice
        if voice is None or voice is UNSET:
            missing("audio.output.voice")
        return voice

    @property
    def turn_detection(self) -> ev.TurnDetection | None:
        td = self.audio_input.turn_detection
        if td is UNSET:
            missing("audio.input.turn_detection")
        return td

    @property
    def max_tokens_choice(self) -> int | Literal["inf"]:
        limit = self.wire.max_output_tokens
        if limit is None or limit is UNSET:
            missing("max_output_tokens")
        return limit

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
        return ev.SessionObject(type="transcription", audio=ev.SessionAudio(input=self.audio_input), include=self.wire.include)

    @property
    def instructions(self) -> str:
        return resolved(self.wire.instructions, "instructions")

    @property
    def speed(self) -> float:
        return resolved(self.audio_output.speed, "audio.output.speed")

    @property
    def transcription(self) -> ev.Transcription | None:
        return known(self.audio_input.transcription, "audio.input.transcription")

    @property
    def keywords(self) -> tuple[str, ...]:
        """Words the ears are to expect (``audio.input.transcription.keywords``)."""
        t = self.transcription
        return tuple(t.keywords) if t is not None and isinstance(t.keywords, list) else ()

    @property
    def noise_reduction(self) -> str | None:
        nr = known(self.audio_input.noise_reduction, "audio.input.noise_reduction")
        return None if nr is None or isinstance(nr.type, UnsetType) else nr.type

    @property
    def tools(self) -> list[ev.Tool]:
        """Functions, and MCP servers (without their secrets: see session/mcp.py)."""
        return resolved(self.wire.tools, "tools")

    @property
    def functions(self) -> list[ev.FunctionTool]:
        return [t for t in self.tools if isinstance(t, ev.FunctionTool)]

    @property
    def tool_choice(self) -> FunctionChoice:
        choice = self.wire.tool_choice
        if choice is None or choice is UNSET:
            missing("tool_choice (a function's, an MCP server's or auto|none|required)")
        return choice

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
    tag = fmt.__struct_config__.tag  # a str for every audio format (msgspec types a tag str | int)
    if not isinstance(tag, str):
        raise RuntimeError(f"internal error: audio format {fmt!r} has no MIME type tag")
    return WireFormat.from_mime(tag)


def format_struct(fmt: WireFormat) -> ev.AudioFormat:
    if fmt is WireFormat.PCM16:
        return ev.PcmFormat(rate=24000)
    return ev.PcmuFormat() if fmt is WireFormat.PCMU else ev.PcmaFormat()


def _vad_settings(td: ev.TurnDetection | None) -> VadSettings | None:
    if td is None:
        return None
    p = "audio.input.turn_detection"
    create, interrupt = resolved(td.create_response, f"{p}.create_response"), resolved(td.interrupt_response, f"{p}.interrupt_response")
    if isinstance(td, ev.ServerVad):
        return VadSettings(
            resolved(td.threshold, f"{p}.threshold"),
            resolved(td.prefix_padding_ms, f"{p}.prefix_padding_ms"),
            resolved(td.silence_duration_ms, f"{p}.silence_duration_ms"),
            create,
            interrupt,
            known(td.idle_timeout_ms, f"{p}.idle_timeout_ms"),
        )
    return VadSettings(0.5, 300, None, create, interrupt, None, resolved(td.eagerness, f"{p}.eagerness"))


def merge(current: S, update: S) -> S:
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


def output_modalities(value: list[Modality], caps: Capabilities, param: str) -> list[Modality]:
    if not value:
        raise invalid_value(param, f"Invalid '{param}': at least one of 'text' or 'audio' is required.")
    wanted: Modality = "audio" if "audio" in value else "text"
    if wanted not in caps.output_modalities:
        raise invalid_value(param, f"Invalid '{param}': the '{caps.name}' pipeline cannot produce {wanted} output.")
    return [wanted]


def check_voice(voice: ev.Voice, caps: Capabilities, param: str) -> ev.Voice:
    name = voice.id if isinstance(voice, ev.VoiceId) else voice
    if name not in caps.voices and name not in OPENAI_VOICES:
        choices = ", ".join(sorted(caps.voices))
        raise invalid_value(param, f"Invalid '{param}': unknown voice {name!r}. Voices of this server: {choices} (OpenAI voice names map to '{caps.voices[0]}').")
    return voice


def check_tools(tools: list[ev.Tool], caps: Capabilities, param: str) -> list[ev.Tool]:
    """The tools checked; an MCP tool kept without its secrets (the allow-list is checked before
    this, by the session: session/mcp.py)."""
    if tools and not caps.tools:
        raise RealtimeError(f"Invalid '{param}': the '{caps.name}' pipeline cannot call tools.", code="unsupported_value", param=param)
    seen: set[str] = set()
    checked: list[ev.Tool] = []
    for i, tool in enumerate(tools):
        if isinstance(tool, ev.McpTool):
            checked.append(structs.replace(tool, headers=UNSET, authorization=UNSET))
            continue
        checked.append(tool)
        if tool.name in seen:
            raise invalid_value(f"{param}[{i}].name", f"Invalid '{param}[{i}].name': duplicate tool name {tool.name!r}.")
        seen.add(tool.name)
        kind = tool.parameters.get("type", "object") if isinstance(tool.parameters, dict) else "object"
        if kind != "object":  # OpenAI's rule: a function's arguments are a JSON object
            message = f"Invalid schema for function {tool.name!r}: schema must be a JSON Schema of 'type: \"object\"', got 'type: {json.dumps(kind)}'."
            raise RealtimeError(message, code="invalid_function_parameters", param=f"{param}[{i}].parameters")
    return checked


def check_tool_choice(choice: ev.ToolChoice, tools: list[ev.Tool], param: str) -> FunctionChoice:
    if isinstance(choice, ev.ToolChoiceMcp) and choice.server_label not in {t.server_label for t in tools if isinstance(t, ev.McpTool)}:
        message = f"Invalid '{param}.server_label': no MCP server labelled {choice.server_label!r} is among the tools."
        raise invalid_value(f"{param}.server_label", message)
    if isinstance(choice, ev.ToolChoiceFunction) and choice.name not in {t.name for t in tools if isinstance(t, ev.FunctionTool)}:
        raise invalid_value(f"{param}.name", f"Invalid '{param}.name': no tool named {choice.name!r} is configured.")
    return choice


@dataclass(frozen=True)
class OutputChoice:
    """What ``session.update`` and ``response.create`` alike may say about a response's output,
    in either spelling (GA: ``output_modalities``, ``audio.output.voice|format``,
    ``max_output_tokens``; beta: ``modalities``, ``voice``, ``output_audio_format``,
    ``max_response_output_tokens``)."""

    modalities: list[Modality]
    voice: ev.Voice
    format: ev.AudioFormat
    tools: list[ev.Tool]
    tool_choice: FunctionChoice
    max_output_tokens: int | Literal["inf"]

    @classmethod
    def of(cls, config: SessionConfig) -> "OutputChoice":
        return cls(
            resolved(config.wire.output_modalities, "output_modalities"),
            config.voice_choice,
            config.output_format_struct,
            config.tools,
            config.tool_choice,
            config.max_tokens_choice,
        )


def fold_output(u: ev.SessionObject | ev.ResponseParams, current: OutputChoice, caps: Capabilities, p: str) -> OutputChoice:
    """``current`` with what ``u`` sets, checked (beta spellings first, GA ones win)."""
    modalities, voice, fmt = current.modalities, current.voice, current.format
    # Every field read here reads null as not given (``_absent_if_null`` decodes it to UNSET): the
    # ``is not None`` tests never fail at run time, they tell mypy so.
    if u.modalities is not UNSET and u.modalities is not None:
        modalities = output_modalities(u.modalities, caps, f"{p}.modalities")
    if u.output_modalities is not UNSET and u.output_modalities is not None:
        modalities = output_modalities(u.output_modalities, caps, f"{p}.output_modalities")
    if u.output_audio_format is not UNSET and u.output_audio_format is not None:
        fmt = beta_format(u.output_audio_format)
    if u.voice is not UNSET and u.voice is not None:
        voice = check_voice(u.voice, caps, f"{p}.voice")
    out = u.audio.output if u.audio is not UNSET and u.audio is not None else UNSET
    if out is not UNSET and out is not None:
        if out.format is not UNSET and out.format is not None:
            fmt = parse_format(out.format, f"{p}.audio.output.format")
        if out.voice is not UNSET and out.voice is not None:
            voice = check_voice(out.voice, caps, f"{p}.audio.output.voice")
    tools = current.tools
    if u.tools is not UNSET and u.tools is not None:
        tools = check_tools(u.tools, caps, f"{p}.tools")
    new_choice = u.tool_choice if u.tool_choice is not UNSET and u.tool_choice is not None else current.tool_choice
    choice = check_tool_choice(new_choice, tools, f"{p}.tool_choice")
    max_tokens = current.max_output_tokens
    for value in (u.max_response_output_tokens, u.max_output_tokens):
        if value is not UNSET and value is not None:
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
        audio_in, audio_out = self.current.audio_input, self.current.audio_output
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
        if u.input_audio_format is not UNSET and u.input_audio_format is not None:  # (null reads as absent here and below)
            audio_in = structs.replace(audio_in, format=beta_format(u.input_audio_format))
        if u.input_audio_transcription is not UNSET:
            audio_in = structs.replace(audio_in, transcription=self._transcription(u.input_audio_transcription, f"{p}.input_audio_transcription"))
        if u.input_audio_noise_reduction is not UNSET:
            audio_in = structs.replace(audio_in, noise_reduction=u.input_audio_noise_reduction)
        if u.turn_detection is not UNSET:
            audio_in = structs.replace(audio_in, turn_detection=self._turn_detection(audio_in, _from_beta_vad(u.turn_detection)))
        if u.speed is not UNSET:  # (beta)
            audio_out = structs.replace(audio_out, speed=u.speed)

        if u.audio is not UNSET and u.audio is not None:
            a = u.audio
            if a.input is not UNSET and a.input is not None:
                i, ip = a.input, f"{p}.audio.input"
                if i.format is not UNSET and i.format is not None:
                    audio_in = structs.replace(audio_in, format=parse_format(i.format, f"{ip}.format"))
                if i.transcription is not UNSET:
                    audio_in = structs.replace(audio_in, transcription=self._transcription(i.transcription, f"{ip}.transcription"))
                if i.noise_reduction is not UNSET:
                    audio_in = structs.replace(audio_in, noise_reduction=i.noise_reduction)
                if i.turn_detection is not UNSET:
                    audio_in = structs.replace(audio_in, turn_detection=self._turn_detection(audio_in, i.turn_detection))
            if a.output is not UNSET and a.output is not None and a.output.speed is not UNSET:
                audio_out = structs.replace(audio_out, speed=a.output.speed)

        output = fold_output(u, OutputChoice.of(self.current), caps, p)
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
        if isinstance(t.keywords, list):
            _check_keywords(t.keywords, f"{param}.keywords")
        return t

    def _turn_detection(self, audio_in: ev.AudioInput, new: ev.TurnDetection | None) -> ev.TurnDetection | None:
        """``new`` over the current turn detection of ``audio_in`` if of the same type, else over
        that type's defaults."""
        if new is None:
            return None
        current = audio_in.turn_detection
        if isinstance(new, ev.ServerVad):
            return merge(current if isinstance(current, ev.ServerVad) else SERVER_VAD_DEFAULTS, new)
        return merge(current if isinstance(current, ev.SemanticVad) else SEMANTIC_VAD_DEFAULTS, new)


def _check_keywords(keywords: list[str], param: str) -> None:
    if len(keywords) > MAX_KEYWORDS:
        raise invalid_value(param, f"Invalid '{param}': at most {MAX_KEYWORDS} keywords, got {len(keywords)}.")
    for i, word in enumerate(keywords):
        if not word.strip() or len(word) > MAX_KEYWORD_CHARS:
            raise invalid_value(f"{param}[{i}]", f"Invalid '{param}[{i}]': a keyword is 1 to {MAX_KEYWORD_CHARS} characters, not only spaces.")


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
