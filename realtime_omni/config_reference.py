"""The configuration reference (docs/config-reference.md), generated from the config types
themselves: every key a config file may hold, its type and default as the Structs declare them,
and one line on what it does: the comment beside the field in its Struct, or the line in ``LINES``
below (for a field whose Struct has no comment, or one that is not a line on its own).

    python -m realtime_omni.config_reference > docs/config-reference.md

``tests/core/test_config_reference.py`` fails when the committed page differs from what this prints,
when a key has no line, and when ``LINES`` names a field that does not exist.
"""

from __future__ import annotations

import inspect
import io
import re
import sys
import tokenize
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec

import pipelines

from . import config
from .protocol import events as ev

# One line for each field whose Struct has no comment beside it, or one that does not stand on its
# own ("Struct.field"); a line here is used instead of the Struct's comment. New fields: a comment there.
LINES = {
    "ServerConfig.webrtc": "WebRTC calls (`POST /v1/realtime/calls`): ICE, the addresses offered, jitter, timeouts",
    "ServerConfig.sip": "the SIP/RTP phone bridge (docs/telephony.md): off unless `port` is set (`serve --sip-port`)",
    "ServerConfig.ssl_keyfile": "the certificate's PEM private key (with `ssl_certfile`; `serve --ssl-keyfile`)",
    "ServerConfig.ssl_certfile": "serve HTTPS and wss:// (WebSocket, WebRTC signalling, the demo page) with this PEM certificate (chain); both or neither (`serve --ssl-certfile`)",
    "Limits.max_headers": "the most header fields in an HTTP request's head: over it, 431 and the connection closed",
    "TurnEndConfig.eagerness": "semantic_vad's `low`, `medium` and `high` (each: `threshold`, `max_wait_ms`, `silence_ms`; docs/turn-taking.md); `auto` is `medium`",
    "Weights.bias": "the constant term of logit P(finished) (pipelines/turn_end/fusion.py)",
    "SipConfig.interruption_guard": "barge-in that survives echo on a phone line: the caller's speech interrupts the agent only after `min_speech_ms`, and none counts in the first `grace_ms`",
    "InterruptionGuard.min_speech_ms": "continuous speech needed to interrupt the agent while it plays (0: any speech)",
    "InterruptionGuard.grace_ms": "for this long after the agent starts speaking no speech counts (`min_speech_ms` counts from its end)",
    "CascadeOptions.asr_model": "the listener, from `realtime-omni models`: moonshine-base (Moonshine Base English: heard as the words grow, `hear_every_ms`), or a Whisper (whisper-tiny.en, whisper-base; set `hear_every_ms: 0` with one: each Whisper pass costs its whole window)",
    "ServerConfig.pipeline": "which pipeline (`kind`) and its own `options`: the sections below",
    "ServerConfig.host": "the address HTTP (WebSocket, WebRTC signalling, the demo, /healthz) binds: 0.0.0.0 for every interface (docs/production.md)",
    "ServerConfig.port": "the TCP port HTTP listens on",
    "ServerConfig.api_key": "the key clients must send (`Authorization: Bearer`); None: no key needed. Also `REALTIME_OMNI_API_KEY`",
    "ServerConfig.limits": "what one session (and the server) may hold: the `limits` section",
    "Limits.max_sessions": "sessions open at once (with `state_url`: all replicas together); one more is refused (`max_sessions`)",
    "SipConfig.rtp_port_min": "the lowest UDP port a call's RTP binds (an even port in [min, max])",
    "SipConfig.rtp_port_max": "the highest UDP port a call's RTP binds",
    "SipConfig.webhook_timeout_s": "the longest the webhook may take to answer before the call is refused",
    "PipelineConfig.kind": "`cascade` (the CPU agent), `omni` or `synthetic`: which options follow",
    "PipelineConfig.options": "the options of that kind: the sections below",
    "CascadeOptions.asr_threads": "CPU threads of one pass of the listener",
    "CascadeOptions.asr_beam_size": "the listener's beam (1: greedy, fastest; 0: the listener's own: Moonshine 4 where it is unsure, Whisper 1)",
    "CascadeOptions.thinker": "the LLM: the `thinker` section below",
    "CascadeOptions.voice": "the talker: a Piper voice from `realtime-omni models`",
    "CascadeOptions.tts_threads": "ONNX Runtime threads of one Piper synthesis",
    "CascadeOptions.low_water_ms": "the audio made ahead of playback under which clauses are cut at `hurry_words`",
    "ThinkerOptions.remote": "the `vllm serve` the thinker runs on when `engine: remote` (`serve --engine-url` sets its url)",
    "ThinkerOptions.dtype": "the weights' dtype in vLLM (an int8 model's are its own)",
    "ThinkerOptions.max_model_len": "the longest prompt plus answer, in tokens: older turns are dropped to fit",
    "ThinkerOptions.prefix_caching": "vLLM's prefix cache: each turn prefills only what is new",
    "ThinkerOptions.enforce_eager": "no graph capture or compilation (on CPU no faster, minutes more start-up)",
    "ThinkerOptions.max_num_seqs": "the answers the engine decodes at once (more sessions wait their turn)",
    "ThinkerOptions.repetition_penalty": "vLLM's repetition penalty on spoken answers",
    "ThinkerOptions.seed": "the sampling seed (None: random): the same question gets the same answer",
    "RemoteOptions.api_key": "the key the deployment wants (`Authorization: Bearer`); None: none sent",
    "RemoteOptions.connect_timeout_s": "the longest a connection to the deployment may take",
    "RemoteOptions.probe_interval_s": "how often the deployment's health is asked (unhealthy: /healthz 503 until it answers)",
    "OmniOptions.name": "the omni model's profile: qwen3-omni, qwen2.5-omni or ming-omni",
    "OmniOptions.engine": "remote: a vLLM-Omni deployment at `remote.url`; in_process: vLLM-Omni in this process, on its GPU",
    "OmniOptions.remote": "the deployment when `engine: remote` (`serve --engine-url` sets its url)",
    "OmniOptions.in_process": "the engine when `engine: in_process`",
    "OmniOptions.images": "take images (`input_image`) into the model's prompt",
    "OmniOptions.max_tokens": "answer budget in tokens (a response's max_output_tokens can lower it)",
    "OmniOptions.speculate": "prefill the turn ahead at pauses (off: only after the turn ends)",
    "OmniOptions.history_audio_s": "the conversation's audio kept in the prompt (oldest dropped first)",
    "OmniOptions.context_tokens": "the model's context, reported to the session (what fits in a prompt)",
    "SyntheticOptions.reply": "the answer's text: `{heard}` is the user's last words or the synthetic transcript of their audio",
    "SyntheticOptions.audio": "tone: a tone per word, pitched by the word; echo: the user's last audio played back",
    "SyntheticOptions.first_chunk_ms": "time to the first output",
    "SyntheticOptions.chunk_ms": "audio per chunk",
    "SyntheticOptions.chunk_interval_ms": "time between chunks: 0 as fast as possible, `chunk_ms` real time",
    "SyntheticOptions.stall_after_chunks": "one stall after this many chunks (0: none) ...",
    "SyntheticOptions.stall_ms": "... this long",
    "SyntheticOptions.transcribe_ms": "how long an input transcript takes (a slow recogniser)",
    "SyntheticOptions.transcribe_fails": "every input transcript fails (a failing recogniser)",
    "SyntheticOptions.word_ms": "the tone's length per word",
    "SyntheticOptions.transcript": "the synthetic transcript of the user's audio (`{seconds}`: its length)",
    "SyntheticOptions.input_rate": "the pipeline's input audio rate (Hz)",
    "SyntheticOptions.output_rate": "the pipeline's output audio rate (Hz)",
    "SyntheticOptions.context_tokens": "the context reported to the session",
}

# Sections not expanded here: the GA session object has its own reference (OpenAI's, and
# docs/realtime-api.md for where this server differs).
SESSION_NOTE = "the GA session object (`instructions`, `audio`, `tools`, ...), as a client's `session.update` sends it: its keys with an example in docs/configuration.md#session-defaults-session-and-sipsession"


@dataclass(frozen=True)
class Key:
    path: str  # dotted, as in a config file (``limits.max_sessions``)
    type: str  # as the Struct declares it
    default: str  # as YAML would write it, or what it is when it is a section
    line: str  # one line on what it does ("" when the Struct and LINES have none)


def comments(cls: type) -> dict[str, str]:
    """The comment on each field of ``cls``, from its source: the comment at the end of the field's
    line, after the comment lines just above it, joined into one line."""
    source = inspect.getsource(cls)
    above: list[str] = []
    found: dict[str, str] = {}
    trailing: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            trailing[tok.start[0]] = tok.string.lstrip("#").strip()
    names = {f.name for f in msgspec.structs.fields(cls)}
    for number, line in enumerate(source.splitlines(), start=1):
        stripped = line.strip()
        if line.startswith("    ") and not line.startswith("     ") and stripped.startswith("#"):
            above.append(stripped.lstrip("#").strip())
            continue
        name = stripped.split(":", 1)[0]
        if line.startswith("    ") and not line.startswith("     ") and name in names and ":" in stripped:
            parts = [*above, *([trailing[number]] if number in trailing and not stripped.startswith("#") else [])]
            found[name] = " ".join(parts)
        above = []
    return found


def type_name(tp: object) -> str:
    """A field's type as a reader writes it: ``int | None``, ``Literal['fit', 'full']``, ``list[str]``."""
    if tp is type(None):
        return "None"
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return "Literal[" + ", ".join(repr(a) for a in args) + "]"
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join('...' if a is Ellipsis else type_name(a) for a in args)}]"
    return str(tp).replace("typing.", "")


def default_of(field: msgspec.structs.FieldInfo) -> object:
    if field.default is not msgspec.NODEFAULT:
        return field.default
    if field.default_factory is not msgspec.NODEFAULT:
        return field.default_factory()
    return msgspec.NODEFAULT


def shown(value: object) -> str:
    """A default as YAML's flow style writes it (JSON is YAML)."""
    if value is msgspec.NODEFAULT:
        return "(required)"
    return msgspec.json.encode(value).decode()


def is_section(tp: object) -> bool:
    """A Struct-typed field: a section of its own (``pipeline.options``, typed by the pipeline's
    kind, is listed per kind instead)."""
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct) and tp is not msgspec.Struct


def optional_section(tp: object) -> type[msgspec.Struct] | None:
    """The Struct of a field typed ``S | None``: a section that is off (null) unless written."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        choices = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(choices) == 1 and len(typing.get_args(tp)) == 2 and is_section(choices[0]):
            return typing.cast(type[msgspec.Struct], choices[0])
    return None


def keys(cls: type[msgspec.Struct], prefix: str = "", default: object = None) -> Iterator[tuple[str, type[msgspec.Struct], list[Key]]]:
    """``cls``'s keys under ``prefix``, then the keys of each section in it (a Struct-typed field),
    depth first: (the section's path, its Struct, its keys). ``default``: the section's default
    where its field gives one of its own (``sip.interruption_guard``: ``min_speech_ms=300``)."""
    notes = comments(cls)
    rows: list[Key] = []
    sections: list[tuple[str, type[msgspec.Struct], object]] = []
    for field in msgspec.structs.fields(cls):
        path = f"{prefix}{field.name}"
        line = LINES.get(f"{cls.__name__}.{field.name}") or notes.get(field.name, "")
        value = getattr(default, field.name) if isinstance(default, msgspec.Struct) else default_of(field)
        if field.type is ev.SessionObject:
            rows.append(Key(path, "session object", "{}", line or SESSION_NOTE))
        elif field.type is msgspec.Struct:
            rows.append(Key(path, "section", "(below, per kind)", line))
        elif is_section(field.type):
            rows.append(Key(path, "section", "(below)", line))
            sections.append((path, typing.cast(type[msgspec.Struct], field.type), value))
        elif (optional := optional_section(field.type)) is not None and value is None:
            rows.append(Key(path, "section", "`null`: none (its keys below, when written)", line))
            sections.append((path, optional, None))
        else:
            rows.append(Key(path, type_name(field.type), shown(value), line))
    yield prefix.rstrip("."), cls, rows
    for path, section, value in sections:
        yield from keys(section, f"{path}.", value)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (but hyphens and underscores),
    spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(rows: list[Key]) -> list[str]:
    out = ["| key | type | default | what it does |", "|---|---|---|---|"]
    for key in rows:
        out.append(f"| `{key.path}` | `{cell(key.type)}` | {key.default if key.type == 'section' else '`' + cell(key.default) + '`'} | {cell(key.line)} |")
    return out


def where(cls: type) -> str:
    module = sys.modules[cls.__module__]
    path = (module.__file__ or "").replace("\\", "/")
    for root in ("realtime_omni/", "pipelines/"):
        if root in path:
            return root + path.split(root, 1)[1]
    return cls.__module__


def sections() -> Iterator[tuple[str, type[msgspec.Struct], list[Key]]]:
    """Every section of a config file: the top level and its sections, then each pipeline kind's
    options (``pipeline.options`` when ``pipeline.kind`` names it)."""
    yield from keys(config.ServerConfig)
    for kind in sorted(pipelines.KINDS):
        for path, cls, rows in keys(pipelines.options_type(kind), "pipeline.options."):
            yield f"{path} ({kind})", cls, rows


def missing_lines() -> list[str]:
    """The keys with no line: neither a comment in their Struct nor a line in ``LINES``."""
    return [key.path for _, _, rows in sections() for key in rows if not key.line]


def stale_lines() -> list[str]:
    """``LINES`` entries that name no field of a config's Structs."""
    structs = {cls.__name__: cls for _, cls, _ in sections()}
    stale = []
    for name in LINES:
        owner, field = name.split(".", 1)
        cls = structs.get(owner)
        if cls is None or field not in {f.name for f in msgspec.structs.fields(cls)}:
            stale.append(name)
    return stale


def render() -> str:
    out = [
        "# Configuration reference",
        "",
        "Every key a config file may hold (`realtime-omni serve --config NAME|PATH`), its type, its default and",
        "what it does. Generated from the config types themselves by `python -m realtime_omni.config_reference",
        "> docs/config-reference.md` (`realtime_omni/config_reference.py`); `tests/core/test_config_reference.py`",
        "fails when this page is out of date. How a config file is read, the flags laid over it and which",
        "config suits which machine: [configuration.md](configuration.md).",
        "",
        "A key left out takes its default, in a section written in part too (`sip: {interruption_guard:",
        "{grace_ms: 100}}` keeps `min_speech_ms` at 300; each entry of `turn_end.eagerness` merges onto its",
        "default); an unknown key, a wrong type or value stops `serve` with one line naming the key.",
        "Defaults are written as YAML's flow style writes them (`null` is YAML's None).",
        "",
        "These are the types' defaults, not the product's: a shipped config (`configs/*.yaml`) sets some keys",
        "to other values. `configs/cpu.yaml`, the default, runs the int8 thinker",
        "(`qwen2.5-coder-0.5b-instruct-w8`) greedily (`temperature: 0.0`) with `tts_threads: 2`,",
        "`turn_end.pause_ms: 100` and `limits.max_sessions: 8`, where the types say the fp32 model,",
        "0.3, 1, 200 and 100. Start a config of your own from a shipped one (copy it, or lay flags over it),",
        "not from this page.",
        "",
        "Sections:",
        "",
    ]
    listed = list(sections())
    out += [f"- [{path or 'Top level'}](#{anchor(path or 'Top level')})" for path, _, _ in listed]
    for path, cls, rows in listed:
        out += ["", f"## {path or 'Top level'}", "", f"`{cls.__name__}` in `{where(cls)}`.", "", *table(rows)]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
