"""The conversation: ordered items, their wire form, and what was actually heard.

Items are the pipeline's own context types (``pipelines.base.Message`` …), so the history handed to
a pipeline is the conversation itself, never a re-rendering. Audio lives in the items as int16 at
pipeline rates; it is converted to a wire format only when a client asks for it (``retrieve``).

Memory is bounded: at most ``max_items`` items (the oldest are dropped first) and at most
``max_audio_seconds`` of retained audio (the oldest items lose their audio first, keeping their
transcripts, which is all a pipeline needs for history).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator

import numpy as np
from msgspec import UNSET, UnsetType

from dsp.resample import resample
from pipelines.base import (
    Capabilities,
    ContextItem,
    FunctionCall,
    FunctionResult,
    Message,
    Part,
)

from ..errors import RealtimeError, invalid_value
from ..ids import new_id
from ..protocol import events as ev
from ..protocol.audio import WireFormat, wire_bytes
from . import mcp
from .mcp import MCP_ITEMS, McpItem

Item = ContextItem | McpItem  # a conversation's: the pipeline's own types, and the server's MCP items (mcp.py)


class Alignment:
    """Where each transcript segment starts in an assistant item's audio: (sample, char) pairs.
    Lets a cut at a playback position keep the transcript of exactly what was heard."""

    CHARS_PER_SECOND = 14.0  # speaking rate assumed before any segment has finished

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.marks: list[tuple[int, int]] = []

    def mark(self, sample: int, char: int) -> None:
        self.marks.append((sample, char))

    def cut(self, text: str, end_sample: int, total_samples: int, *, final: bool = True) -> str:
        """Text heard when playback stopped at ``end_sample``: whole segments that finished, plus
        the words of the segment in progress in proportion to how much of its audio was played.
        ``final=False``: the last segment's audio is still being produced, so its length is
        estimated from the speaking rate so far."""
        marks = [m for m in self.marks if m[1] <= len(text)]
        if not marks or (final and end_sample >= total_samples):
            return text if end_sample >= total_samples else ""
        last_sample, last_char = marks[-1]
        end_of_last = total_samples
        if not final:
            per_char = last_sample / last_char if last_sample and last_char else self.rate / self.CHARS_PER_SECOND
            end_of_last = max(total_samples, last_sample + int((len(text) - last_char) * per_char))
        kept = 0
        bounds = marks + [(end_of_last, len(text))]
        for (a0, c0), (a1, c1) in zip(bounds, bounds[1:]):
            if end_sample >= a1:
                kept = c1
                continue
            if end_sample > a0 and a1 > a0:
                word_ends = [m.end() for m in re.finditer(r"\S+", text[c0:c1])]
                heard = int(len(word_ends) * (end_sample - a0) / (a1 - a0))
                kept = c0 + (word_ends[heard - 1] if heard else 0)
            break
        return text[:kept].rstrip()

    def trim(self, end_sample: int, end_char: int) -> None:
        self.marks = [m for m in self.marks if m[0] < end_sample and m[1] < end_char]


class Conversation:
    def __init__(self, caps: Capabilities, *, max_items: int = 1024, max_audio_seconds: float = 600.0) -> None:
        self.id = new_id("conv")
        self.caps = caps
        self.items: list[Item] = []
        self._by_id: dict[str, Item] = {}
        self.alignment: dict[str, Alignment] = {}
        self.max_items = max_items
        self.max_audio_seconds = max_audio_seconds

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Item]:
        return iter(self.items)

    def get(self, item_id: str) -> Item | None:
        return self._by_id.get(item_id)

    def previous_id(self, item: Item) -> str | None:
        i = self.items.index(item)
        return self.items[i - 1].id if i > 0 else None

    def add(self, item: Item, previous_item_id: str | None = None) -> tuple[str | None, list[str]]:
        """Insert after ``previous_item_id`` (``"root"``: at the start; None: at the end).
        Returns the id of the item before it and the ids evicted to stay within bounds."""
        if item.id in self._by_id:
            raise invalid_value("item.id", f"Invalid 'item.id': an item with id {item.id!r} already exists.")
        if previous_item_id is None:
            index = len(self.items)
        elif previous_item_id == "root":
            index = 0
        else:
            prev = self._by_id.get(previous_item_id)
            if prev is None:
                raise RealtimeError(
                    f"Invalid 'previous_item_id': no item with id {previous_item_id!r} in the conversation.",
                    code="item_create_invalid_previous_item_id",
                    param="previous_item_id",
                )
            index = self.items.index(prev) + 1
        self.items.insert(index, item)
        self._by_id[item.id] = item
        before = self.items[index - 1].id if index > 0 else None
        return before, self._enforce_bounds(keep=item)

    def delete(self, item_id: str) -> None:
        item = self._by_id.pop(item_id)
        self.items.remove(item)
        self.alignment.pop(item_id, None)

    def _enforce_bounds(self, keep: Item) -> list[str]:
        evicted = []
        while len(self.items) > self.max_items:
            victim = self.items[0] if self.items[0] is not keep else self.items[1]
            self.delete(victim.id)
            evicted.append(victim.id)
        self.trim_audio()
        return evicted

    def truncate(self, item: Message, index: int, end: int) -> None:
        """Keep the first ``end`` samples of an assistant item's audio part ``index``, and the
        words of them (its alignment says which; with none known, no words the user may not
        have heard)."""
        part = item.parts[index]
        assert part.audio is not None
        total = len(part.audio)
        alignment = self.alignment.get(item.id)
        if part.text and alignment is not None:
            part.text = alignment.cut(part.text, end, total)
        elif part.text and end < total:
            part.text = ""
        part.audio = part.audio[:end]

    def trim_audio(self) -> None:
        budget = self.max_audio_seconds
        for item in reversed(self.items):
            if not isinstance(item, Message):
                continue
            for part in item.parts:
                if part.audio is None:
                    continue
                rate = self.caps.output_rate if item.role == "assistant" else self.caps.input_rate
                seconds = len(part.audio) / rate
                if seconds > budget:
                    part.audio = None
                budget = max(0.0, budget - seconds)


# ---------------------------------------------------------------------------------------------
# Wire <-> items
# ---------------------------------------------------------------------------------------------


def decode_audio(b64: str, fmt: WireFormat, rate: int, param: str) -> np.ndarray:
    return resample(fmt.decode(wire_bytes(b64, fmt, param)), fmt.rate, rate)


def encode_audio(pcm: np.ndarray, rate: int, fmt: WireFormat) -> str:
    return base64.b64encode(fmt.encode(resample(pcm, rate, fmt.rate))).decode()


def from_wire(
    item: ev.Item, caps: Capabilities, input_format: WireFormat, output_format: WireFormat, param: str = "item"
) -> Item:
    """A client-supplied item (``conversation.item.create`` / ``response.create`` input)."""
    if isinstance(item, (ev.McpListToolsItem, ev.McpCallItem, ev.McpApprovalRequestItem, ev.McpApprovalResponseItem)):
        return mcp.from_wire(item, param)
    # (these fields read null as UNSET when decoded: a str, or not given)
    item_id = item.id if isinstance(item.id, str) else new_id("item")
    status = item.status if isinstance(item.status, str) else "completed"
    if isinstance(item, ev.FunctionCallItem):
        call_id = item.call_id if isinstance(item.call_id, str) else new_id("call")
        return FunctionCall(item_id, call_id, item.name, item.arguments, status)
    if isinstance(item, ev.FunctionCallOutputItem):
        return FunctionResult(item_id, item.call_id, item.output, status)
    allowed = {
        "system": (ev.InputText,),
        "user": (ev.InputText, ev.InputAudio, ev.InputImage),
        "assistant": (ev.OutputText, ev.OutputAudio, ev.BetaText, ev.BetaAudio),
    }[item.role]
    parts = []
    for i, c in enumerate(item.content):
        cp = f"{param}.content[{i}]"
        if not isinstance(c, allowed):
            kind = c.__struct_config__.tag
            raise invalid_value(f"{cp}.type", f"Invalid '{cp}.type': {kind!r} content is not allowed in a {item.role} message.")
        if isinstance(c, ev.InputImage):
            kind, accepted = "image", caps.images
        else:
            kind = "text" if isinstance(c, (ev.InputText, ev.OutputText, ev.BetaText)) else "audio"
            accepted = item.role != "user" or kind in caps.input_modalities
        if not accepted:
            raise RealtimeError(f"Invalid '{cp}': the '{caps.name}' pipeline does not take {kind} input.", code="unsupported_value", param=cp)
        if isinstance(c, ev.InputImage):
            parts.append(Part("image", image_url=c.image_url))
        elif isinstance(c, (ev.InputText, ev.OutputText, ev.BetaText)):
            parts.append(Part("text", text=c.text))
        else:
            transcript = c.transcript if isinstance(c.transcript, str) else None
            audio = None
            if isinstance(c.audio, str):
                if item.role == "user":
                    audio = decode_audio(c.audio, input_format, caps.input_rate, f"{cp}.audio")
                else:
                    audio = decode_audio(c.audio, output_format, caps.output_rate, f"{cp}.audio")
            elif transcript is None:
                raise RealtimeError(f"Missing required parameter: '{cp}.audio'.", code="missing_required_parameter", param=f"{cp}.audio")
            parts.append(Part("audio", text=transcript, audio=audio))
    return Message(item_id, item.role, parts, status)


def to_wire(
    item: Item, caps: Capabilities, audio_formats: tuple[WireFormat, WireFormat] | None = None
) -> ev.Item:
    """The GA wire form. Audio bytes are included only when ``audio_formats`` (input, output) is
    given, as in ``conversation.item.retrieved``; other events carry transcripts only."""
    if isinstance(item, MCP_ITEMS):
        return mcp.to_wire(item)
    if isinstance(item, FunctionCall):
        return ev.FunctionCallItem(
            id=item.id, object="realtime.item", status=item.status, call_id=item.call_id, name=item.name, arguments=item.arguments
        )
    if isinstance(item, FunctionResult):
        return ev.FunctionCallOutputItem(id=item.id, object="realtime.item", status=item.status, call_id=item.call_id, output=item.output)
    content: list[ev.Content] = []
    assistant = item.role == "assistant"
    for part in item.parts:
        if part.kind == "text":
            content.append(ev.OutputText(text=part.text or "") if assistant else ev.InputText(text=part.text or ""))
        elif part.kind == "image":
            content.append(ev.InputImage(image_url=part.image_url or ""))
        else:
            audio: str | UnsetType = UNSET
            if audio_formats is not None and part.audio is not None:
                fmt = audio_formats[1] if assistant else audio_formats[0]
                audio = encode_audio(part.audio, caps.output_rate if assistant else caps.input_rate, fmt)
            cls = ev.OutputAudio if assistant else ev.InputAudio
            content.append(cls(audio=audio, transcript=part.text))
    return ev.MessageItem(id=item.id, object="realtime.item", status=item.status, role=item.role, content=content)
