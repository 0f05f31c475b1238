"""Server configuration: one YAML file per deployable pipeline (``configs/<name>.yaml``)."""

from __future__ import annotations

import ipaddress
import os
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

import pipelines
from pipelines.turn_end.policy import TurnEndConfig

from .protocol import events as ev

PACKAGE_CONFIGS = Path(__file__).parent / "configs"  # inside an installed wheel
SOURCE_CONFIGS = Path(__file__).parent.parent / "configs"  # in a source checkout
DEFAULT_CONFIG = "cpu"  # the embedded CPU cascade


class ConfigError(ValueError):
    """A config that cannot be used, in one line: the file, the path of the bad key and what is
    wrong with it (``invalid config configs/cpu.yaml: pipeline.options.thinker.max_tokenz: unknown
    field``). Every problem of a config file comes out as one: its YAML, an unknown key, a wrong
    type or value, an unknown pipeline kind, a file that is not there."""

    def __init__(self, source: str, problem: str, key: str = "") -> None:
        self.source = source  # the file (or what the config was made from)
        self.key = key  # the bad key's path, dotted (``sip.port``, ``session.tools[0].name``); "": the whole config
        self.problem = problem
        super().__init__(f"invalid config {source}: {key + ': ' if key else ''}{problem}")

    @classmethod
    def from_validation(cls, source: str, exc: msgspec.ValidationError, at: str = "") -> ConfigError:
        """msgspec's ``Expected `int`, got `str` - at `$.limits.max_items``` as key and problem; ``at``
        is where the validated value sits in the whole config (``.pipeline.options``)."""
        found = re.fullmatch(r"(?s)(?P<problem>.*?)(?: - at `\$(?P<path>[^`]*)`)?", str(exc))
        assert found is not None  # the pattern matches any text
        problem, key = found["problem"], at + (found["path"] or "")
        field = re.fullmatch(r"Object (?P<what>contains unknown|missing required) field `(?P<name>[^`]*)`", problem)
        if field is not None:
            key += "." + field["name"]
            problem = "unknown field" if field["what"] == "contains unknown" else "required, not given"
            moved = MOVED.get(key.lstrip("."))
            if moved is not None:
                problem += f" (moved to {moved})"
        else:
            problem = problem.replace("`", "")
            problem = problem[:1].lower() + problem[1:]
        return cls(source, problem, key.lstrip("."))


# keys that moved, where they went: a config written before says so when it is read
_THINKER = "pipeline.options.thinker"
MOVED = {
    **{f"{_THINKER}.{old}": f"{_THINKER}.calls.{new}" for old, new in [
        ("tool_max_tokens", "max_tokens"), ("tool_repetition_penalty", "repetition_penalty"), ("ground_calls", "ground"),
        ("second_choices", "second_choices"), ("second_choice_floor", "second_choice_floor"),
        ("second_choice_tokens", "second_choice_tokens"), ("constrain_calls", "constrain"), ("steer_calls", "steer"),
    ]},
    "pipeline.options.judge": "turn_end.judge",
}


class Limits(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    max_sessions: int = 100
    max_append_bytes: int = 15 * 1024 * 1024  # decoded audio per input_audio_buffer.append
    max_message_bytes: int = 24 * 1024 * 1024  # one WebSocket message (base64 inflates 4/3)
    max_buffer_seconds: float = 120.0  # open input audio buffer
    max_items: int = 1024  # conversation items kept (oldest dropped first)
    max_audio_seconds: float = 600.0  # audio retained in conversation items (oldest dropped first)
    outbox_events: int = 512  # server events queued per session before producers wait
    send_timeout_s: float = 10.0  # a client that does not take an event for this long is dropped
    max_out_of_band: int = 4  # concurrent conversation:"none" responses per session
    # A pipeline stage that gives nothing for this long (its first output, or the next, or an input
    # transcript) fails its response with an `error` (a hung Whisper, Piper or engine): the session goes on.
    stage_timeout_s: float = 30.0
    # An HTTP request's head (WebSocket upgrades included): bytes of the request target and of every
    # header name and value, and the number of header fields. Over either: 431, connection closed.
    max_header_bytes: int = 32 * 1024
    max_headers: int = 100
    key_mints_per_s: float = 10.0  # ephemeral keys minted per second (a token bucket), over all clients
    key_mint_burst: int = 50  # ... with bursts up to this many
    header_timeout_s: float = 10.0  # a request head (a WebSocket upgrade's too) must arrive whole within this: else 408


class WebRTCConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # ICE servers handed to the peer connection, as in the browser API: [{urls: ..., username, credential}].
    # None by default: no public STUN server is contacted unless you configure one.
    ice_servers: list[dict[str, Any]] = []
    # Addresses to offer as host candidates instead of every interface's (e.g. the one public
    # interface of a multi-homed host, or 127.0.0.1 on a loopback-only network).
    host_addresses: list[str] = []
    video_fps: float = 1.0  # video frames sampled per second for pipelines that take images
    max_buffer_ms: int = 200  # outgoing audio queued ahead of the 20 ms clock
    # incoming audio frames held to put reordered packets back in place (20 ms each on every turn;
    # aiortc's own is 4). 0: none, each packet passed on as it comes, a reordered one dropped
    jitter_frames: int = 0
    connect_timeout_s: float = 30.0  # offer answered -> media flowing, or the call is dropped
    media_timeout_s: float = 20.0  # no incoming audio packet for this long: the call's peer connection is lost (kept resume.grace_s for a resume, else ended)


class ResumeConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A WebSocket session whose connection drops (no close frame), or a WebRTC call whose peer
    connection is lost (ICE failed, or no audio for ``webrtc.media_timeout_s``), waits this long for its client to
    resume it (docs/realtime-api.md#resuming-a-session); its events meanwhile are kept in a log of
    at most ``buffer_events`` events and ``buffer_bytes`` bytes (encoded), which ends the session
    when it overflows. 0 s: a dropped connection ends its session at once, and no log is kept."""

    grace_s: float = 30.0  # a session whose WebSocket dropped (no close frame) or whose WebRTC peer connection was lost waits this long to be resumed; 0: it ends at once
    buffer_events: int = 2048  # server events kept per session for a resume (the last ones sent, and all not yet sent)
    buffer_bytes: int = 4 * 1024 * 1024  # ... and at most this many bytes of them; full while no connection takes them: the session ends

    def __post_init__(self) -> None:
        if self.grace_s < 0 or self.buffer_events < 1 or self.buffer_bytes < 0:
            raise ValueError("resume: grace_s and buffer_bytes are at least 0, buffer_events at least 1")


class InterruptionGuard(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Barge-in that survives echo (telephony): while the agent's audio is playing, the caller's
    speech interrupts it only after ``min_speech_ms`` of continuous speech, and none of it counts
    during the first ``grace_ms`` after the agent starts speaking. Shorter sounds (the agent's own
    voice echoed back by a handset, a cough, "mhm") are ignored: no turn, no interruption."""

    min_speech_ms: int = 0
    grace_ms: int = 0


class SipRegister(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A provider's registrar this bridge keeps itself registered with, so that the provider's trunk
    sends the account's calls here (docs/telephony.md#registering-with-a-provider)."""

    registrar: str  # host[:port] of the provider's registrar (an address or a name; port 5060 unless given)
    user: str  # the account: its address of record is sip:user@domain
    password: str = ""  # answers the registrar's digest challenge (MD5 or SHA-256)
    domain: str | None = None  # the address of record's domain; None: the registrar's host
    auth_user: str | None = None  # the digest username where the provider's differs from `user`
    expires_s: int = 600  # the registration asked for; the registrar's grant wins, refreshed at 80% of it
    retry_s: float = 30.0  # after a failed registration (no answer, refused), the next try

    def __post_init__(self) -> None:
        if not 0 < self.expires_s <= 86400:
            raise ValueError("sip.register.expires_s: 1 to 86400 seconds")
        if self.retry_s <= 0:
            raise ValueError("sip.register.retry_s must be above 0")


class SipConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    port: int | None = None  # UDP port of the SIP bridge; None: no bridge (0: any free port)
    host: str = "127.0.0.1"  # bind address for SIP and RTP
    advertise: str | None = None  # the address put in SDP and Contact (default: host)
    rtp_port_min: int = 20000
    rtp_port_max: int = 30000
    # POST realtime.call.incoming here and let the application accept/reject over HTTP; None:
    # every call is accepted with ``session``
    webhook_url: str | None = None
    webhook_timeout_s: float = 5.0
    ring_timeout_s: float = 30.0  # unanswered for this long: 480
    session: ev.SessionObject = msgspec.field(default_factory=ev.SessionObject)  # applied to every SIP call's session
    rtp_timeout_s: float = 30.0  # no RTP from the caller for this long ends the call
    jitter_depth: int = 2  # packets held waiting for a missing one before it is concealed
    jitter_max_depth: int = 10  # the most the depth grows to when packets arrive late
    max_buffer_ms: int = 100  # outgoing audio queued ahead of the 20 ms clock
    t1_ms: int = 500  # RFC 3261 T1 (retransmission base)
    interruption_guard: InterruptionGuard = msgspec.field(default_factory=lambda: InterruptionGuard(min_speech_ms=300))
    # Who may call (docs/telephony.md#who-may-call). Source addresses (CIDRs: a trunk's, "203.0.113.0/24")
    # whose requests are taken; any other source gets 403. []: any source
    allowed_sources: list[str] = []
    # user: password. Set: an INVITE opening a call must answer a digest challenge (401) with one
    # of these (RFC 8760, 2617); a wrong one gets 403. {}: no authentication
    credentials: dict[str, str] = {}
    digest_algorithms: list[Literal["SHA-256", "MD5"]] = msgspec.field(default_factory=lambda: ["SHA-256", "MD5"])  # offered in this order (a caller takes the first it knows)
    realm: str = "realtime-omni"  # the digest realm callers' credentials belong to
    register: SipRegister | None = None  # keep registered with a provider's registrar (outbound REGISTER); None: no registration

    def __post_init__(self) -> None:
        for source in self.allowed_sources:
            try:
                ipaddress.ip_network(source, strict=False)
            except ValueError:
                raise ValueError(f"sip.allowed_sources: {source!r} is not an address or a CIDR block (10.0.0.0/8)") from None
        if not self.digest_algorithms or len(set(self.digest_algorithms)) != len(self.digest_algorithms):
            raise ValueError("sip.digest_algorithms: one or both of SHA-256 and MD5, each once")


class McpConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """MCP servers the server itself calls for a session's ``type: "mcp"`` tools (docs/tools.md).
    The server fetches URLs that clients name: none is allowed unless listed here."""

    allowed_servers: list[str] = []  # URL prefixes (scheme, host and port exact; the path a prefix); serve --mcp-allow
    sse_servers: list[str] = []  # URL prefixes of servers reached over the older HTTP+SSE transport at once (others: Streamable HTTP, SSE if refused 404/405)
    list_timeout_s: float = 10.0  # connecting and listing one server's tools
    call_timeout_s: float = 30.0  # one tool call
    max_output_bytes: int = 64 * 1024  # a call's output, UTF-8: more fails the call
    max_servers: int = 4  # MCP servers per session


class TracingConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Per-turn traces in OpenTelemetry (realtime_omni/tracing.py, docs/operations.md): on when an
    OTLP endpoint is set here or in the standard environment (``OTEL_EXPORTER_OTLP_ENDPOINT``, ...)."""

    enabled: bool = True  # false: no traces even when the environment names an endpoint
    endpoint: str | None = None  # the collector's OTLP base URL (http://host:4318: spans go to /v1/traces); None: OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT
    protocol: Literal["http/protobuf", "grpc"] | None = None  # None: OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf
    service_name: str | None = None  # the traces' service.name; None: OTEL_SERVICE_NAME, else realtime-omni
    sample_ratio: float | None = None  # the share of sessions traced (0..1, per session); None: OTEL_TRACES_SAMPLER
    max_queue_spans: int = 2048  # spans waiting for export; a full queue drops new spans (the sessions go on)
    export_timeout_s: float | None = None  # one export's limit, retries included; None: OTEL_EXPORTER_OTLP_TIMEOUT (10 s)

    def __post_init__(self) -> None:
        if self.sample_ratio is not None and not 0.0 <= self.sample_ratio <= 1.0:
            raise ValueError("tracing.sample_ratio is a share of sessions: between 0 and 1")
        if self.max_queue_spans < 1:
            raise ValueError("tracing.max_queue_spans must be at least 1")


class PipelineConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Which pipeline, and its own options: the Struct its kind declares (``pipelines.options_type``:
    ``CascadeOptions``, ``OmniOptions``, ``SyntheticOptions``), typed when the config is loaded."""

    kind: str
    options: msgspec.Struct

    def __post_init__(self) -> None:
        expected = pipelines.options_type(self.kind)
        if not isinstance(self.options, expected):  # options decoded as a bare Struct: made without from_dict
            raise TypeError(f"a {self.kind} pipeline's options are a {expected.__name__} (make the config with config.from_dict)")


class _PipelineSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The ``pipeline`` section as written, before its options are typed by its kind."""

    kind: str
    options: dict[str, Any] = {}


class ServerConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pipeline: PipelineConfig
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    model: str = "realtime-omni"  # reported when a client names no model
    limits: Limits = msgspec.field(default_factory=Limits)
    # when a user's turn ends: semantic_vad's model, the fusion, the eagerness, the silences (pipelines/turn_end/policy.py)
    turn_end: TurnEndConfig = msgspec.field(default_factory=TurnEndConfig)
    session: ev.SessionObject = msgspec.field(default_factory=ev.SessionObject)  # defaults for new sessions (GA shape)
    resume: ResumeConfig = msgspec.field(default_factory=ResumeConfig)  # WebSocket sessions and WebRTC calls resumed after a dropped connection
    # On SIGTERM: /healthz 503 at once, open sessions run on up to this long, then each is told to
    # reconnect (server_shutting_down) and given as long again to close.
    shutdown_grace_s: float = 5.0
    # Several replicas (processes, machines) behind one balancer share their ephemeral keys, mint
    # rate limit, session count (max_sessions: all replicas together) and call owners through this
    # Redis, redis://HOST:PORT/DB (docs/deployment.md). None: all of it in this process.
    state_url: str | None = None
    # How the other replicas reach this one (call control and sidebands for a call it holds are
    # forwarded here), e.g. http://10.0.0.5:8000. Default: http://<host>:<port> as bound.
    advertise_url: str | None = None
    # This replica's name in the id of every session it opens (sess_<tag>_...), so that a balancer
    # sends a resume (its x-session-id) to the replica holding the session: deploy/nginx.conf's map
    # (docs/deployment.md). Letters and digits, up to 16; None: plain ids.
    route_tag: str | None = None
    # A pipeline that fails for good (its in-process vLLM engine died): "exit" drains (every session
    # told why, every response ended) and exits with status 3 for a supervisor to restart the server;
    # "stay" keeps serving, /healthz 503, every response failing, until someone restarts it.
    on_pipeline_failure: Literal["exit", "stay"] = "exit"
    timings_log: str | None = None  # append one JSON line per finished response (stage timings)
    # add the pipeline's stage timings to response.done's metadata ("timing.<stage>_ms"); the
    # client's own metadata keys are kept and win
    timing_metadata: bool = True
    webrtc: WebRTCConfig = msgspec.field(default_factory=WebRTCConfig)
    sip: SipConfig = msgspec.field(default_factory=SipConfig)
    tracing: TracingConfig = msgspec.field(default_factory=TracingConfig)  # per-turn traces in OpenTelemetry (OTLP): off unless an endpoint is set here or in OTEL_EXPORTER_OTLP_ENDPOINT
    mcp: McpConfig = msgspec.field(default_factory=McpConfig)  # the MCP servers sessions' `type: "mcp"` tools may make the server call (docs/tools.md): none unless listed (`serve --mcp-allow`)
    web_demo: bool = True  # serve the browser demo at /
    # let the demo page mint itself an ephemeral key when the server has an API key: anyone who can
    # load the page can then talk to the server (off: the page asks for a key minted elsewhere)
    web_demo_mints_keys: bool = False
    # Browsers send Origin with every WebSocket and cross-origin request. None: not checked, and no
    # CORS (only pages this server serves may call its HTTP API). A list: a WebSocket or a WebRTC offer
    # (/v1/realtime/calls) that carries an Origin must carry one of these ("https://app.example.com";
    # "*" any), else 403; clients that are not browsers send none. Pages on these origins may call the
    # HTTP API (CORS: preflights answered, the answers readable; credentials never with "*")
    allowed_origins: list[str] | None = None
    metrics_need_key: bool = False  # /metrics answers only with the API key (401 otherwise)
    # TLS for everything served over HTTP (WebSocket as wss://, WebRTC signalling, the demo page):
    # a PEM certificate (chain) and its key. Both or neither; neither is plain HTTP.
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None

    def __post_init__(self) -> None:
        if self.route_tag is not None and not re.fullmatch(r"[A-Za-z0-9]{1,16}", self.route_tag):
            raise ValueError("route_tag is letters and digits, 1 to 16 of them")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile go together: give both, or neither")

    @property
    def tls(self) -> bool:
        return self.ssl_certfile is not None


def resolve(name_or_path: str | Path) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.exists():
            raise ConfigError(str(path), "file not found")
        return path
    for folder in (SOURCE_CONFIGS, PACKAGE_CONFIGS, Path.cwd() / "configs"):
        candidate = folder / f"{name_or_path}.yaml"
        if candidate.exists():
            return candidate
    raise ConfigError(str(name_or_path), f"no config of that name (looked in {SOURCE_CONFIGS} and {PACKAGE_CONFIGS})")


def _shown(path: Path) -> str:
    """A config file's path as an error shows it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def raw(name_or_path: str | Path) -> dict[str, Any]:
    """A config file as plain data (to adjust before use, as tests and benchmarks do)."""
    path = resolve(name_or_path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(_shown(path), f"not YAML: {problem}{where}") from None
    except OSError as exc:
        raise ConfigError(_shown(path), f"unreadable: {exc.strerror or exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(_shown(path), f"expected a mapping of settings, got {type(data).__name__}")
    return data


def merged(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` laid over it, mappings merged key by key; a change of None is no
    change (a flag not given). Neither argument is modified."""
    out = dict(base)
    for key, value in changes.items():
        if value is None:
            continue
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def load(name_or_path: str | Path = DEFAULT_CONFIG, overrides: Mapping[str, Any] | None = None, *, engine_url: str | None = None) -> ServerConfig:
    """The config file ``name_or_path`` with ``overrides`` (settings laid over the file's, as
    ``merged``) and, given ``engine_url``, its pipeline's model on that remote engine; validated once,
    every problem a ``ConfigError``."""
    path = resolve(name_or_path)
    source = _shown(path)
    data = merged(raw(path), overrides or {})
    section = data.get("pipeline")
    kind = section.get("kind") if isinstance(section, Mapping) else None
    if engine_url is not None and isinstance(kind, str) and kind in pipelines.KINDS:  # else from_dict says what is wrong
        try:
            changes = pipelines.remote_engine(kind, engine_url)
        except ValueError as exc:
            raise ConfigError(source, f"engine_url: {exc}") from None
        data = merged(data, {"pipeline": {"options": changes}})
    if data.get("api_key") is None and os.environ.get("REALTIME_OMNI_API_KEY"):
        data["api_key"] = os.environ["REALTIME_OMNI_API_KEY"]
    return from_dict(data, source)


def from_dict(raw: Mapping[str, Any], source: str = "(from a dict)") -> ServerConfig:
    """A config from plain data (a config file's, or built by a test), its pipeline's options typed
    by its kind; every problem a ``ConfigError`` naming ``source`` and the bad key."""
    if not isinstance(raw, Mapping):
        raise ConfigError(source, f"expected a mapping of settings, got {type(raw).__name__}")
    data = dict(raw)
    section = data.get("pipeline")
    if section is not None and not isinstance(section, PipelineConfig):  # missing: ServerConfig says so
        data["pipeline"] = _pipeline(section, source)
    try:
        return msgspec.convert(with_defaults(data, ServerConfig), ServerConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError.from_validation(source, exc) from None


def _pipeline(section: Any, source: str) -> PipelineConfig:
    try:
        written = msgspec.convert(section, _PipelineSection)
    except msgspec.ValidationError as exc:
        raise ConfigError.from_validation(source, exc, ".pipeline") from None
    try:
        options_type = pipelines.options_type(written.kind)
    except pipelines.UnknownKind as exc:
        raise ConfigError(source, str(exc), "pipeline.kind") from None
    try:
        options = msgspec.convert(with_defaults(written.options, options_type), options_type)
    except msgspec.ValidationError as exc:
        raise ConfigError.from_validation(source, exc, ".pipeline.options") from None
    return PipelineConfig(kind=written.kind, options=options)


def with_defaults(written: Mapping[str, Any], cls: type[msgspec.Struct], default: msgspec.Struct | None = None) -> dict[str, Any]:
    """``written`` (a section of ``cls`` as a config gives it) laid over ``default`` (the section's
    default; None: ``cls``'s own field defaults), each section in it merged the same way, and each
    entry of a map of sections (``turn_end.eagerness``) onto the default's entry of that name.

    msgspec alone gives a section written in part its Struct's class defaults for the keys left out,
    not the defaults of the field that holds it: ``sip: {interruption_guard: {grace_ms: 100}}``
    would set ``min_speech_ms`` to 0 where SipConfig's default guard has 300, and one weight of
    ``turn_end.fusion.with_words`` would zero the others. What is not a mapping (a wrong type
    included) is left for msgspec to judge."""
    out: dict[str, Any] = msgspec.to_builtins(default) if default is not None else {}
    fields = {f.encode_name: f for f in msgspec.structs.fields(cls)}
    for key, value in written.items():
        field = fields.get(key)
        if field is not None and isinstance(value, Mapping):
            inner = getattr(default, field.name) if default is not None else _field_default(field)
            section = _section_type(field.type)
            if section is not None:
                value = with_defaults(value, section, inner if isinstance(inner, section) else None)
            elif (entry := _map_of_sections(field.type)) is not None and isinstance(inner, dict):
                value = {**msgspec.to_builtins(inner), **{
                    name: with_defaults(item, entry, inner.get(name)) if isinstance(item, Mapping) else item for name, item in value.items()
                }}
        out[key] = value
    return out


def _field_default(field: msgspec.structs.FieldInfo) -> Any:
    if field.default is not msgspec.NODEFAULT:
        return field.default
    if field.default_factory is not msgspec.NODEFAULT:
        return field.default_factory()
    return None


def _is_config_section(tp: Any) -> bool:
    # the session object is a wire type with a partial update's meaning of its own: taken as written
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct) and tp is not msgspec.Struct and not issubclass(tp, ev.Wire)


def _section_type(tp: Any) -> type[msgspec.Struct] | None:
    """The section's Struct of a field typed ``S`` or ``S | None``; None for any other field."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        choices = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = choices[0] if len(choices) == 1 else None
    return tp if _is_config_section(tp) else None


def _map_of_sections(tp: Any) -> type[msgspec.Struct] | None:
    """``S`` of a field typed ``dict[str, S]`` (a map of sections by name); None for any other field."""
    if typing.get_origin(tp) is dict:
        entry = typing.get_args(tp)[1]
        return entry if _is_config_section(entry) else None
    return None
