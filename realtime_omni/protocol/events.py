"""Every wire type of the OpenAI Realtime API (GA), defined once.

Client events are decoded straight from JSON into these Structs (validation at the edge); beta
spellings that clients still send are accepted as extra fields and folded into the GA meaning by
the session (see ``realtime_omni.session.config``). Server events are encoded from these Structs;
a beta connection gets them renamed by ``protocol.beta``.

``UNSET`` marks "the client did not send this field", which is different from ``null``: session
updates merge, and ``null`` clears where clearing means something (``turn_detection: null`` is
manual turns, ``transcription: null`` no transcripts). Everywhere else that the official SDK's GA
models make a field optional, clients send ``null`` for "not given" (LiveKit's plugin sends
``"instructions": null`` in every ``response.create`` without instructions): a class lists those
fields in ``_absent_if_null`` and they decode to ``UNSET``, exactly as if absent. A field that
needs a value still refuses ``null``, naming it in ``param``.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Union, get_args

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

# ---------------------------------------------------------------------------------------------
# Shared value types
# ---------------------------------------------------------------------------------------------


class Wire(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """Base for nested wire objects: unknown fields are an error, unset fields are not sent, and
    the fields named in ``_absent_if_null`` read ``null`` as not given."""

    _absent_if_null: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        for name in self._absent_if_null:
            if getattr(self, name) is None:
                setattr(self, name, UNSET)


class PcmFormat(Wire, tag="audio/pcm", tag_field="type"):
    _absent_if_null = ("rate",)
    rate: int | None | UnsetType = UNSET


class PcmuFormat(Wire, tag="audio/pcmu", tag_field="type"):
    pass


class PcmaFormat(Wire, tag="audio/pcma", tag_field="type"):
    pass


AudioFormat = Union[PcmFormat, PcmuFormat, PcmaFormat]
BetaAudioFormat = Literal["pcm16", "g711_ulaw", "g711_alaw"]

Probability = Annotated[float, Meta(ge=0.0, le=1.0)]
Millis = Annotated[int, Meta(ge=0, le=60_000)]


class ServerVad(Wire, tag="server_vad", tag_field="type"):
    _absent_if_null = ("threshold", "prefix_padding_ms", "silence_duration_ms", "create_response", "interrupt_response")
    threshold: Probability | None | UnsetType = UNSET
    prefix_padding_ms: Millis | None | UnsetType = UNSET
    silence_duration_ms: Millis | None | UnsetType = UNSET
    create_response: bool | None | UnsetType = UNSET
    interrupt_response: bool | None | UnsetType = UNSET
    idle_timeout_ms: Annotated[int, Meta(ge=0, le=600_000)] | None | UnsetType = UNSET


class SemanticVad(Wire, tag="semantic_vad", tag_field="type"):
    _absent_if_null = ("eagerness", "create_response", "interrupt_response")
    eagerness: Literal["low", "medium", "high", "auto"] | None | UnsetType = UNSET
    create_response: bool | None | UnsetType = UNSET
    interrupt_response: bool | None | UnsetType = UNSET


TurnDetection = Union[ServerVad, SemanticVad]


class BetaTurnDetection(Wire):
    """Beta ``turn_detection``: flat, ``type`` optional (defaults to server_vad)."""

    _absent_if_null = ("type", "threshold", "prefix_padding_ms", "silence_duration_ms", "create_response", "interrupt_response", "eagerness")
    type: Literal["server_vad", "semantic_vad"] | None | UnsetType = UNSET
    threshold: Probability | None | UnsetType = UNSET
    prefix_padding_ms: Millis | None | UnsetType = UNSET
    silence_duration_ms: Millis | None | UnsetType = UNSET
    create_response: bool | None | UnsetType = UNSET
    interrupt_response: bool | None | UnsetType = UNSET
    eagerness: Literal["low", "medium", "high", "auto"] | None | UnsetType = UNSET
    idle_timeout_ms: Annotated[int, Meta(ge=0, le=600_000)] | None | UnsetType = UNSET


class Transcription(Wire):
    _absent_if_null = ("delay", "keywords", "languages")
    model: str | None | UnsetType = UNSET
    language: str | None | UnsetType = UNSET
    prompt: str | None | UnsetType = UNSET
    # Newer SDK fields: accepted, passed to the pipeline as hints.
    delay: Literal["minimal", "low", "medium", "high", "xhigh"] | None | UnsetType = UNSET
    keywords: list[str] | None | UnsetType = UNSET
    languages: list[str] | None | UnsetType = UNSET


class NoiseReduction(Wire):
    _absent_if_null = ("type", "strength")
    type: Literal["near_field", "far_field"] | None | UnsetType = UNSET
    strength: Probability | None | UnsetType = UNSET


class AudioInput(Wire):
    _absent_if_null = ("format",)
    format: AudioFormat | None | UnsetType = UNSET
    transcription: Transcription | None | UnsetType = UNSET
    noise_reduction: NoiseReduction | None | UnsetType = UNSET
    turn_detection: TurnDetection | None | UnsetType = UNSET


class VoiceId(Wire):
    id: str


Voice = Union[str, VoiceId]


class AudioOutput(Wire):
    _absent_if_null = ("format", "voice", "speed")
    format: AudioFormat | None | UnsetType = UNSET
    voice: Voice | None | UnsetType = UNSET
    speed: Annotated[float, Meta(ge=0.25, le=1.5)] | None | UnsetType = UNSET


class SessionAudio(Wire):
    _absent_if_null = ("input", "output")
    input: AudioInput | None | UnsetType = UNSET
    output: AudioOutput | None | UnsetType = UNSET


class FunctionTool(Wire, tag="function", tag_field="type"):
    _absent_if_null = ("description", "parameters")
    name: Annotated[str, Meta(min_length=1, max_length=64)]
    description: str | None | UnsetType = UNSET
    parameters: dict[str, Any] | None | UnsetType = UNSET


class McpToolFilter(Wire):
    """Which of an MCP server's tools a rule covers: by name, or by the server's ``readOnlyHint``."""

    _absent_if_null = ("tool_names", "read_only")
    tool_names: list[str] | None | UnsetType = UNSET
    read_only: bool | None | UnsetType = UNSET


class McpApprovalFilter(Wire):
    _absent_if_null = ("always", "never")
    always: McpToolFilter | None | UnsetType = UNSET
    never: McpToolFilter | None | UnsetType = UNSET


class McpTool(Wire, tag="mcp", tag_field="type"):
    """An MCP server whose tools the server itself calls (realtime_omni/session/mcp.py). ``headers``
    and ``authorization`` are secrets: they reach the MCP server only, never an event or a log."""

    _absent_if_null = (
        "server_url", "connector_id", "tunnel_id", "server_description", "headers", "authorization", "allowed_tools",
        "require_approval", "allowed_callers",
    )  # fmt: skip
    server_label: Annotated[str, Meta(min_length=1, max_length=64)]
    server_url: str | None | UnsetType = UNSET
    connector_id: str | None | UnsetType = UNSET
    tunnel_id: str | None | UnsetType = UNSET
    server_description: str | None | UnsetType = UNSET
    headers: dict[str, str] | None | UnsetType = UNSET
    authorization: str | None | UnsetType = UNSET
    allowed_tools: list[str] | McpToolFilter | None | UnsetType = UNSET
    require_approval: Literal["always", "never"] | McpApprovalFilter | None | UnsetType = UNSET
    allowed_callers: list[Literal["direct", "programmatic"]] | None | UnsetType = UNSET


Tool = Union[FunctionTool, McpTool]


class ToolChoiceFunction(Wire, tag="function", tag_field="type"):
    name: str


class ToolChoiceMcp(Wire, tag="mcp", tag_field="type"):
    server_label: str
    name: str | None | UnsetType = UNSET


ToolChoice = Union[Literal["auto", "none", "required"], ToolChoiceFunction, ToolChoiceMcp]


class TracingConfig(Wire):
    _absent_if_null = ("workflow_name", "group_id", "metadata")
    workflow_name: str | None | UnsetType = UNSET
    group_id: str | None | UnsetType = UNSET
    metadata: dict[str, Any] | None | UnsetType = UNSET


class TokenLimits(Wire):
    _absent_if_null = ("post_instructions",)
    post_instructions: int | None | UnsetType = UNSET


class RetentionRatio(Wire, tag="retention_ratio", tag_field="type"):
    _absent_if_null = ("token_limits",)
    retention_ratio: Probability
    token_limits: TokenLimits | None | UnsetType = UNSET


class Reasoning(Wire):
    effort: Literal["minimal", "low", "medium", "high", "xhigh"] | None | UnsetType = UNSET


MaxTokens = Union[Annotated[int, Meta(ge=1, le=4096)], Literal["inf"]]


class ClientSecretConfig(Struct, kw_only=True):
    expires_after: dict[str, Any] | UnsetType = UNSET


class SessionObject(Wire):
    """The session object: the full effective session in ``session.created|updated`` and a
    partial update in ``session.update``. Beta (flat) fields are accepted on input only."""

    _absent_if_null = (
        "model", "instructions", "output_modalities", "audio", "tools", "tool_choice", "max_output_tokens", "truncation",
        "parallel_tool_calls", "modalities", "voice", "input_audio_format", "output_audio_format", "temperature",
        "max_response_output_tokens", "speed",
    )  # fmt: skip
    type: Literal["realtime", "transcription"] | UnsetType = UNSET
    model: str | None | UnsetType = UNSET
    instructions: str | None | UnsetType = UNSET
    output_modalities: list[Literal["text", "audio"]] | None | UnsetType = UNSET
    audio: SessionAudio | None | UnsetType = UNSET
    tools: list[Tool] | None | UnsetType = UNSET
    tool_choice: ToolChoice | None | UnsetType = UNSET
    max_output_tokens: MaxTokens | None | UnsetType = UNSET
    tracing: Literal["auto"] | TracingConfig | None | UnsetType = UNSET
    truncation: Literal["auto", "disabled"] | RetentionRatio | None | UnsetType = UNSET
    prompt: dict[str, Any] | None | UnsetType = UNSET
    include: list[Literal["item.input_audio_transcription.logprobs"]] | None | UnsetType = UNSET
    parallel_tool_calls: bool | None | UnsetType = UNSET
    reasoning: Reasoning | None | UnsetType = UNSET
    # --- beta spellings (input only) ---
    modalities: list[Literal["text", "audio"]] | None | UnsetType = UNSET
    voice: Voice | None | UnsetType = UNSET
    input_audio_format: BetaAudioFormat | None | UnsetType = UNSET
    output_audio_format: BetaAudioFormat | None | UnsetType = UNSET
    input_audio_transcription: Transcription | None | UnsetType = UNSET
    input_audio_noise_reduction: NoiseReduction | None | UnsetType = UNSET
    turn_detection: BetaTurnDetection | None | UnsetType = UNSET
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None | UnsetType = UNSET
    max_response_output_tokens: MaxTokens | None | UnsetType = UNSET
    speed: Annotated[float, Meta(ge=0.25, le=1.5)] | None | UnsetType = UNSET
    client_secret: ClientSecretConfig | UnsetType = UNSET
    id: str | UnsetType = UNSET
    object: str | UnsetType = UNSET
    expires_at: int | UnsetType = UNSET


# ---------------------------------------------------------------------------------------------
# Conversation items
# ---------------------------------------------------------------------------------------------


class InputText(Wire, tag="input_text", tag_field="type"):
    text: str


class InputAudio(Wire, tag="input_audio", tag_field="type"):
    audio: str | None | UnsetType = UNSET
    transcript: str | None | UnsetType = UNSET


class InputImage(Wire, tag="input_image", tag_field="type"):
    _absent_if_null = ("detail",)
    image_url: str
    detail: Literal["auto", "low", "high"] | None | UnsetType = UNSET


class OutputText(Wire, tag="output_text", tag_field="type"):
    text: str


class OutputAudio(Wire, tag="output_audio", tag_field="type"):
    audio: str | None | UnsetType = UNSET
    transcript: str | None | UnsetType = UNSET


class BetaText(Wire, tag="text", tag_field="type"):
    text: str


class BetaAudio(Wire, tag="audio", tag_field="type"):
    audio: str | None | UnsetType = UNSET
    transcript: str | None | UnsetType = UNSET


class ContentReference(Wire, tag="item_reference", tag_field="type"):
    id: str


Content = Union[InputText, InputAudio, InputImage, OutputText, OutputAudio, BetaText, BetaAudio, ContentReference]

ItemStatus = Literal["completed", "incomplete", "in_progress"]


class MessageItem(Wire, tag="message", tag_field="type"):
    _absent_if_null = ("id", "object", "status")
    role: Literal["user", "assistant", "system"]
    content: list[Content]
    id: str | None | UnsetType = UNSET
    object: Literal["realtime.item"] | None | UnsetType = UNSET
    status: ItemStatus | None | UnsetType = UNSET


class FunctionCallItem(Wire, tag="function_call", tag_field="type"):
    _absent_if_null = ("call_id", "id", "object", "status")
    name: str
    arguments: str
    call_id: str | None | UnsetType = UNSET
    id: str | None | UnsetType = UNSET
    object: Literal["realtime.item"] | None | UnsetType = UNSET
    status: ItemStatus | None | UnsetType = UNSET


class FunctionCallOutputItem(Wire, tag="function_call_output", tag_field="type"):
    _absent_if_null = ("id", "object", "status")
    call_id: str
    output: str
    id: str | None | UnsetType = UNSET
    object: Literal["realtime.item"] | None | UnsetType = UNSET
    status: ItemStatus | None | UnsetType = UNSET


class ItemReference(Wire, tag="item_reference", tag_field="type"):
    id: str


class McpListedTool(Struct, kw_only=True, omit_defaults=True):
    name: str
    input_schema: Any
    description: str | None = None
    annotations: Any = None


class McpListToolsItem(Wire, tag="mcp_list_tools", tag_field="type"):
    server_label: str
    tools: list[McpListedTool]
    id: str | None | UnsetType = UNSET


class McpCallError(Struct, kw_only=True, omit_defaults=True):
    """One of the SDK's three: ``protocol_error`` (code), ``tool_execution_error``, ``http_error`` (code)."""

    type: Literal["protocol_error", "tool_execution_error", "http_error"]
    message: str
    code: int | UnsetType = UNSET


class McpCallItem(Wire, tag="mcp_call", tag_field="type"):
    id: str
    server_label: str
    name: str
    arguments: str
    approval_request_id: str | None | UnsetType = UNSET
    output: str | None | UnsetType = UNSET
    error: McpCallError | None | UnsetType = UNSET


class McpApprovalRequestItem(Wire, tag="mcp_approval_request", tag_field="type"):
    id: str
    server_label: str
    name: str
    arguments: str


class McpApprovalResponseItem(Wire, tag="mcp_approval_response", tag_field="type"):
    _absent_if_null = ("id", "reason")
    approval_request_id: str
    approve: bool
    id: str | None | UnsetType = UNSET
    reason: str | None | UnsetType = UNSET


Item = Union[
    MessageItem, FunctionCallItem, FunctionCallOutputItem, McpListToolsItem, McpCallItem, McpApprovalRequestItem, McpApprovalResponseItem
]
InputItem = Union[MessageItem, FunctionCallItem, FunctionCallOutputItem, ItemReference]


# ---------------------------------------------------------------------------------------------
# Responses
# ---------------------------------------------------------------------------------------------


class ResponseAudioOutput(Wire):
    _absent_if_null = ("format", "voice")
    format: AudioFormat | None | UnsetType = UNSET
    voice: Voice | None | UnsetType = UNSET


class ResponseAudio(Wire):
    _absent_if_null = ("output",)
    output: ResponseAudioOutput | None | UnsetType = UNSET


Metadata = Annotated[dict[Annotated[str, Meta(max_length=64)], Annotated[str, Meta(max_length=512)]], Meta(max_length=16)]


class ResponseParams(Wire):
    _absent_if_null = (
        "conversation", "input", "instructions", "max_output_tokens", "output_modalities", "audio", "tools", "tool_choice",
        "parallel_tool_calls", "modalities", "voice", "output_audio_format", "max_response_output_tokens", "temperature",
    )  # fmt: skip
    conversation: str | None | UnsetType = UNSET
    input: list[InputItem] | None | UnsetType = UNSET
    instructions: str | None | UnsetType = UNSET
    max_output_tokens: MaxTokens | None | UnsetType = UNSET
    metadata: Metadata | None | UnsetType = UNSET
    output_modalities: list[Literal["text", "audio"]] | None | UnsetType = UNSET
    audio: ResponseAudio | None | UnsetType = UNSET
    tools: list[Tool] | None | UnsetType = UNSET
    tool_choice: ToolChoice | None | UnsetType = UNSET
    prompt: dict[str, Any] | None | UnsetType = UNSET
    parallel_tool_calls: bool | None | UnsetType = UNSET
    reasoning: Reasoning | None | UnsetType = UNSET
    # --- beta spellings ---
    modalities: list[Literal["text", "audio"]] | None | UnsetType = UNSET
    voice: Voice | None | UnsetType = UNSET
    output_audio_format: BetaAudioFormat | None | UnsetType = UNSET
    max_response_output_tokens: MaxTokens | None | UnsetType = UNSET
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None | UnsetType = UNSET


# ---------------------------------------------------------------------------------------------
# Client events
# ---------------------------------------------------------------------------------------------


class ClientEvent(Struct, tag_field="type", forbid_unknown_fields=True, kw_only=True):
    event_id: str | None = None


class SessionUpdate(ClientEvent, tag="session.update"):
    session: SessionObject


class TranscriptionSessionUpdate(ClientEvent, tag="transcription_session.update"):
    """Beta: a ``session.update`` that makes (or keeps) the session a transcription session."""

    session: SessionObject


class InputAudioBufferAppend(ClientEvent, tag="input_audio_buffer.append"):
    audio: str


class InputAudioBufferCommit(ClientEvent, tag="input_audio_buffer.commit"):
    pass


class InputAudioBufferClear(ClientEvent, tag="input_audio_buffer.clear"):
    pass


class OutputAudioBufferClear(ClientEvent, tag="output_audio_buffer.clear"):
    response_id: str | None = None


class ConversationItemCreate(ClientEvent, tag="conversation.item.create"):
    item: Item
    previous_item_id: str | None = None


class ConversationItemRetrieve(ClientEvent, tag="conversation.item.retrieve"):
    item_id: str


class ConversationItemDelete(ClientEvent, tag="conversation.item.delete"):
    item_id: str


class ConversationItemTruncate(ClientEvent, tag="conversation.item.truncate"):
    item_id: str
    content_index: Annotated[int, Meta(ge=0)]
    audio_end_ms: Annotated[int, Meta(ge=0)]


class ResponseCreate(ClientEvent, tag="response.create"):
    response: ResponseParams | None = None


class ResponseCancel(ClientEvent, tag="response.cancel"):
    response_id: str | None = None


AnyClientEvent = Union[
    SessionUpdate,
    TranscriptionSessionUpdate,
    InputAudioBufferAppend,
    InputAudioBufferCommit,
    InputAudioBufferClear,
    OutputAudioBufferClear,
    ConversationItemCreate,
    ConversationItemRetrieve,
    ConversationItemDelete,
    ConversationItemTruncate,
    ResponseCreate,
    ResponseCancel,
]

CLIENT_EVENT_TYPES = frozenset(t.__struct_config__.tag for t in get_args(AnyClientEvent))


# ---------------------------------------------------------------------------------------------
# Server events (GA names)
# ---------------------------------------------------------------------------------------------


class ServerEvent(Struct, tag_field="type", kw_only=True):
    event_id: str = ""


class ErrorDetail(Struct, kw_only=True):
    type: str
    code: str | None
    message: str
    param: str | None
    event_id: str | None


class Error(ServerEvent, tag="error"):
    error: ErrorDetail


class SessionCreated(ServerEvent, tag="session.created"):
    session: SessionObject


class SessionUpdated(ServerEvent, tag="session.updated"):
    session: SessionObject


class Conversation(Struct, kw_only=True):
    id: str
    object: str = "realtime.conversation"


class ConversationCreated(ServerEvent, tag="conversation.created"):
    conversation: Conversation


class InputAudioBufferCommitted(ServerEvent, tag="input_audio_buffer.committed"):
    previous_item_id: str | None
    item_id: str


class InputAudioBufferCleared(ServerEvent, tag="input_audio_buffer.cleared"):
    pass


class InputAudioBufferSpeechStarted(ServerEvent, tag="input_audio_buffer.speech_started"):
    audio_start_ms: int
    item_id: str


class InputAudioBufferSpeechStopped(ServerEvent, tag="input_audio_buffer.speech_stopped"):
    audio_end_ms: int
    item_id: str


class InputAudioBufferTimeoutTriggered(ServerEvent, tag="input_audio_buffer.timeout_triggered"):
    audio_start_ms: int
    audio_end_ms: int
    item_id: str


class InputAudioBufferDtmfEventReceived(Struct, tag="input_audio_buffer.dtmf_event_received", tag_field="type", kw_only=True):
    # The SDK's model of this event has no event_id.
    event: str
    received_at: int


class ConversationItemAdded(ServerEvent, tag="conversation.item.added"):
    previous_item_id: str | None
    item: Item


class ConversationItemDone(ServerEvent, tag="conversation.item.done"):
    previous_item_id: str | None
    item: Item


class ConversationItemRetrieved(ServerEvent, tag="conversation.item.retrieved"):
    item: Item


class ConversationItemTruncated(ServerEvent, tag="conversation.item.truncated"):
    item_id: str
    content_index: int
    audio_end_ms: int


class ConversationItemDeleted(ServerEvent, tag="conversation.item.deleted"):
    item_id: str


class TranscriptionDurationUsage(Struct, tag="duration", tag_field="type", kw_only=True):
    seconds: float


class InputTranscriptionDelta(ServerEvent, tag="conversation.item.input_audio_transcription.delta"):
    item_id: str
    content_index: int
    delta: str


class InputTranscriptionCompleted(ServerEvent, tag="conversation.item.input_audio_transcription.completed"):
    item_id: str
    content_index: int
    transcript: str
    usage: TranscriptionDurationUsage


class InputTranscriptionError(Struct, kw_only=True):
    type: str
    code: str | None
    message: str
    param: str | None = None


class InputTranscriptionFailed(ServerEvent, tag="conversation.item.input_audio_transcription.failed"):
    item_id: str
    content_index: int
    error: InputTranscriptionError


class ResponseStatusError(Struct, kw_only=True, omit_defaults=True):
    type: str
    code: str | None = None
    message: str | None = None


class ResponseStatusDetails(Struct, kw_only=True, omit_defaults=True):
    type: Literal["completed", "cancelled", "incomplete", "failed"]
    reason: Literal["turn_detected", "client_cancelled", "max_output_tokens", "content_filter"] | None = None
    error: ResponseStatusError | None = None


class CachedTokensDetails(Struct, kw_only=True):
    text_tokens: int = 0
    audio_tokens: int = 0
    image_tokens: int = 0


class InputTokenDetails(Struct, kw_only=True):
    cached_tokens: int = 0
    text_tokens: int = 0
    audio_tokens: int = 0
    image_tokens: int = 0
    cached_tokens_details: CachedTokensDetails = msgspec.field(default_factory=CachedTokensDetails)


class OutputTokenDetails(Struct, kw_only=True):
    text_tokens: int = 0
    audio_tokens: int = 0


class Usage(Struct, kw_only=True):
    total_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    input_token_details: InputTokenDetails = msgspec.field(default_factory=InputTokenDetails)
    output_token_details: OutputTokenDetails = msgspec.field(default_factory=OutputTokenDetails)


class Response(Struct, kw_only=True):
    id: str
    object: str = "realtime.response"
    status: Literal["in_progress", "completed", "cancelled", "failed", "incomplete"]
    status_details: ResponseStatusDetails | None = None
    output: list[Item]
    conversation_id: str | None
    output_modalities: list[str]
    max_output_tokens: int | Literal["inf"]
    audio: ResponseAudio | None = None
    usage: Usage | None = None
    metadata: dict[str, str] | None = None


class ResponseCreated(ServerEvent, tag="response.created"):
    response: Response


class ResponseDone(ServerEvent, tag="response.done"):
    response: Response


class ResponseOutputItemAdded(ServerEvent, tag="response.output_item.added"):
    response_id: str
    output_index: int
    item: Item


class ResponseOutputItemDone(ServerEvent, tag="response.output_item.done"):
    response_id: str
    output_index: int
    item: Item


class ContentPart(Struct, kw_only=True, omit_defaults=True):
    type: Literal["text", "audio"]
    text: str | UnsetType = UNSET
    transcript: str | UnsetType = UNSET


class ResponseContentPartAdded(ServerEvent, tag="response.content_part.added"):
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    part: ContentPart


class ResponseContentPartDone(ServerEvent, tag="response.content_part.done"):
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    part: ContentPart


class _ContentEvent(ServerEvent):
    response_id: str
    item_id: str
    output_index: int
    content_index: int


class ResponseOutputTextDelta(_ContentEvent, tag="response.output_text.delta"):
    delta: str


class ResponseOutputTextDone(_ContentEvent, tag="response.output_text.done"):
    text: str


class ResponseOutputAudioDelta(_ContentEvent, tag="response.output_audio.delta"):
    delta: str


class ResponseOutputAudioDone(_ContentEvent, tag="response.output_audio.done"):
    pass


class ResponseOutputAudioTranscriptDelta(_ContentEvent, tag="response.output_audio_transcript.delta"):
    delta: str


class ResponseOutputAudioTranscriptDone(_ContentEvent, tag="response.output_audio_transcript.done"):
    transcript: str


class ResponseFunctionCallArgumentsDelta(ServerEvent, tag="response.function_call_arguments.delta"):
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    delta: str


class ResponseFunctionCallArgumentsDone(ServerEvent, tag="response.function_call_arguments.done"):
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    name: str
    arguments: str


class RateLimit(Struct, kw_only=True):
    name: Literal["requests", "tokens"]
    limit: int
    remaining: int
    reset_seconds: float


class RateLimitsUpdated(ServerEvent, tag="rate_limits.updated"):
    rate_limits: list[RateLimit]


class OutputAudioBufferStarted(ServerEvent, tag="output_audio_buffer.started"):
    response_id: str


class OutputAudioBufferStopped(ServerEvent, tag="output_audio_buffer.stopped"):
    response_id: str


class OutputAudioBufferCleared(ServerEvent, tag="output_audio_buffer.cleared"):
    response_id: str


class McpListToolsInProgress(ServerEvent, tag="mcp_list_tools.in_progress"):
    item_id: str


class McpListToolsCompleted(ServerEvent, tag="mcp_list_tools.completed"):
    item_id: str


class McpListToolsFailed(ServerEvent, tag="mcp_list_tools.failed"):
    item_id: str


class ResponseMcpCallArgumentsDelta(ServerEvent, tag="response.mcp_call_arguments.delta"):
    response_id: str
    item_id: str
    output_index: int
    delta: str


class ResponseMcpCallArgumentsDone(ServerEvent, tag="response.mcp_call_arguments.done"):
    response_id: str
    item_id: str
    output_index: int
    arguments: str


class ResponseMcpCallInProgress(ServerEvent, tag="response.mcp_call.in_progress"):
    item_id: str
    output_index: int


class ResponseMcpCallCompleted(ServerEvent, tag="response.mcp_call.completed"):
    item_id: str
    output_index: int


class ResponseMcpCallFailed(ServerEvent, tag="response.mcp_call.failed"):
    item_id: str
    output_index: int
