"""What the fuzzer sends: seeded, reproducible client messages for the Realtime API (GA and beta).

``Generator(seed).frames()`` yields ``Frame``s forever; the same seed gives the same frames. Each
frame is one WebSocket message, drawn from these kinds:

* ``valid``: a well-formed client event of any type, GA or beta shape, with ids from a small pool
  so events refer to each other (truncate, delete, retrieve, previous_item_id), and *scenarios*:
  short runs of valid events in odd orders (cancel before create, truncate during a response,
  commit while speaking, session.update mid-response, create then cancel back to back);
* ``mutated``: a valid event with one field replaced by a value of another JSON type (extreme
  numbers, huge strings, lone surrogates, containers), removed, duplicated, renamed, or the
  event's ``type`` swapped for another's;
* ``broken``: a valid event's JSON cut, with a byte deleted, inserted or replaced at any position
  (and once in a while every prefix of one event in a row);
* ``binary``: binary frames: valid JSON, JSON with invalid UTF-8 inside a string, UTF-16, a BOM,
  random bytes;
* ``nested``: deep nesting (up to 100,000 levels), inside a field or at the top;
* ``odd``: literals JSON has no place for (NaN, 1e999, 10,000-digit numbers), empty and
  whitespace frames, NUL bytes.

Nothing here does I/O; ``bench/fuzz.py`` sends the frames and checks the server.
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

ITEM_IDS = [f"item_fz{i}" for i in range(6)]
CALL_IDS = ["call_fz0", "call_fz1"]
TEXT_TYPES = ("text", "binary")


@dataclass(frozen=True)
class Frame:
    kind: str  # the generator kind (valid, mutated, broken, binary, nested, odd)
    data: str | bytes  # str: a text frame; bytes: a binary frame

    def size(self) -> int:
        return len(self.data)

    def short(self, limit: int = 160) -> str:
        text = repr(self.data)
        return text if len(text) <= limit else f"{text[: limit - 30]}...<{len(self.data)} {'chars' if isinstance(self.data, str) else 'bytes'}>"


def frame(kind: str, text: str) -> Frame:
    """A text frame, or, when ``text`` holds lone surrogates (which no UTF-8 text frame can carry),
    the binary frame of its bytes as written with them (invalid UTF-8)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return Frame(kind, text.encode(errors="surrogatepass"))
    return Frame(kind, text)


class Raw:
    """JSON text written as is (literals ``json`` cannot produce)."""

    def __init__(self, text: str) -> None:
        self.text = text


class Pairs:
    """A JSON object written from a list of pairs: duplicated keys allowed."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs


def dumps(value: Any, ascii_only: bool = False) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Pairs):
        return "{" + ",".join(f"{json.dumps(k, ensure_ascii=ascii_only)}:{dumps(v, ascii_only)}" for k, v in value.pairs) + "}"
    if isinstance(value, dict):
        return dumps(Pairs(list(value.items())), ascii_only)
    if isinstance(value, list):
        return "[" + ",".join(dumps(v, ascii_only) for v in value) + "]"
    if isinstance(value, float) and not math.isfinite(value):
        return "1e999" if value > 0 else "-1e999"
    return json.dumps(value, ensure_ascii=ascii_only)


@functools.lru_cache(maxsize=1)
def _speech_like(rate: int = 24000, ms: int = 600) -> bytes:
    """A voiced, speech-like sound (a glottal pulse train through two formants, its pitch and level
    moving), so server VAD hears speech without a synthesizer."""
    n = rate * ms // 1000
    t = [i / rate for i in range(n)]
    out = bytearray()
    phase = 0.0
    for i, ti in enumerate(t):
        f0 = 120 + 30 * math.sin(2 * math.pi * 3 * ti)
        phase += f0 / rate
        pulse = (phase % 1.0) - 0.5
        s = 0.5 * math.sin(2 * math.pi * 700 * ti) * (0.6 + pulse) + 0.3 * math.sin(2 * math.pi * 1200 * ti) * (0.4 - pulse)
        env = min(1.0, i / (0.02 * rate), (n - i) / (0.02 * rate)) * (0.7 + 0.3 * math.sin(2 * math.pi * 4 * ti))
        v = int(12000 * s * env)
        out += max(-32768, min(32767, v)).to_bytes(2, "little", signed=True)
    return bytes(out)


class Generator:
    """Seeded frames. ``speech`` is pcm16 24 kHz audio that server VAD takes for speech (the fuzzer
    passes real synthesized speech when espeak-ng is there, else a speech-like sound is made)."""

    WEIGHTS = {"valid": 30, "mutated": 34, "broken": 16, "binary": 8, "nested": 5, "odd": 7}

    def __init__(self, seed: int, *, beta: bool = False, speech: bytes | None = None, huge: bool = True) -> None:
        self.rng = random.Random(seed)
        self.beta = beta
        self.huge = huge  # strings of 1 MiB sometimes (off for quick runs)
        speech = speech if speech is not None else _speech_like()
        step = 24000 * 2 * 20 // 1000  # 20 ms of pcm16
        self.speech = [base64.b64encode(speech[i : i + step]).decode() for i in range(0, len(speech) - step + 1, step)]
        self.silence = base64.b64encode(bytes(step)).decode()
        self._pending: list[Frame] = []
        kinds, weights = zip(*self.WEIGHTS.items())
        self._kinds, self._weights = list(kinds), list(weights)

    # ------------------------------------------------------------------ the stream

    def frames(self) -> Iterator[Frame]:
        while True:
            yield self.next()

    def next(self) -> Frame:
        if self._pending:
            return self._pending.pop(0)
        kind = self.rng.choices(self._kinds, self._weights)[0]
        if kind == "valid":
            events = self.scenario() if self.rng.random() < 0.06 else [self.event()]
            self._pending = [frame("valid", dumps(e)) for e in events]
            return self._pending.pop(0)
        return getattr(self, f"_{kind}")()

    # ------------------------------------------------------------------ valid events

    def event(self, kind: str | None = None) -> dict[str, Any]:
        r = self.rng
        kind = kind or r.choices(list(EVENT_WEIGHTS), list(EVENT_WEIGHTS.values()))[0]
        e: dict[str, Any] = {"type": kind}
        if r.random() < 0.3:
            e["event_id"] = r.choice(["evt_fz", "", "e" * r.choice([1, 64, 300])])
        getattr(self, "_ev_" + kind.replace(".", "_"))(e)
        return copy.deepcopy(e)  # shares nothing with TOOL or another event: mutations stay in it

    def _ev_session_update(self, e: dict[str, Any]) -> None:
        e["session"] = self.beta_session() if self.beta or self.rng.random() < 0.2 else self.ga_session()

    def ga_session(self) -> dict[str, Any]:
        r = self.rng
        s: dict[str, Any] = {}
        if r.random() < 0.7:
            s["type"] = "realtime"
        pick = lambda p: r.random() < p  # noqa: E731
        if pick(0.3):
            s["instructions"] = r.choice(["Be brief.", "", "x" * 2000])
        if pick(0.3):
            s["output_modalities"] = r.choice([["audio"], ["text"]])
        audio: dict[str, Any] = {}
        inp: dict[str, Any] = {}
        if pick(0.2):
            inp["format"] = r.choice([{"type": "audio/pcm", "rate": 24000}, {"type": "audio/pcm"}, {"type": "audio/pcmu"}, {"type": "audio/pcma"}])
        if pick(0.4):
            inp["turn_detection"] = r.choice(
                [
                    None,
                    {"type": "server_vad"},
                    {"type": "server_vad", "threshold": r.random(), "silence_duration_ms": r.choice([0, 200, 500]), "prefix_padding_ms": 300},
                    {"type": "server_vad", "create_response": r.random() < 0.5, "interrupt_response": r.random() < 0.5, "idle_timeout_ms": r.choice([None, 5000])},
                    {"type": "semantic_vad", "eagerness": r.choice(["low", "medium", "high", "auto"])},
                ]
            )
        if pick(0.2):
            inp["transcription"] = r.choice([None, {"model": "synthetic"}, {"model": "whisper-1", "language": "en"}, {"model": "synthetic", "keywords": self._keywords()}])
        if pick(0.1):
            inp["noise_reduction"] = r.choice([None, {"type": "near_field"}])
        if inp:
            audio["input"] = inp
        if pick(0.2):
            out: dict[str, Any] = {}
            if pick(0.5):
                out["format"] = r.choice([{"type": "audio/pcm", "rate": 24000}, {"type": "audio/pcmu"}, {"type": "audio/pcma"}])
            if pick(0.5):
                out["voice"] = r.choice(["tone", {"id": "tone"}])
            if pick(0.3):
                out["speed"] = r.choice([0.25, 1.0, 1.5])
            audio["output"] = out
        if audio:
            s["audio"] = audio
        if pick(0.2):
            s["tools"] = r.choice([[], [TOOL], [TOOL, {**TOOL, "name": "g"}]])
        if pick(0.15):
            s["tool_choice"] = r.choice(["auto", "none", "required", {"type": "function", "name": "f"}])
        if pick(0.15):
            s["max_output_tokens"] = r.choice([1, 2, 4096, "inf"])
        if pick(0.05):
            s["tracing"] = r.choice(["auto", None, {"workflow_name": "w"}])
        if pick(0.05):
            s["truncation"] = r.choice(["auto", "disabled", {"type": "retention_ratio", "retention_ratio": 0.5}])
        if pick(0.05):
            s["include"] = r.choice([None, ["item.input_audio_transcription.logprobs"]])
        return s

    def _keywords(self) -> Any:
        """``transcription.keywords``: a list to expect, or one the server refuses (too many, too
        long, only spaces, not strings, not a list)."""
        r = self.rng
        return r.choice([["Marco", "Lisbon"], [], ["New York"] * 3, ["x" * 65], [" "], ["a"] * 101, [1], "Marco", None, ["\u00e9\u00e8", "\U0001f600"]])

    def beta_session(self) -> dict[str, Any]:
        r = self.rng
        s: dict[str, Any] = {}
        pick = lambda p: r.random() < p  # noqa: E731
        if pick(0.4):
            s["modalities"] = r.choice([["text", "audio"], ["text"], ["audio"]])
        if pick(0.3):
            s["instructions"] = "Be brief."
        if pick(0.2):
            s["voice"] = "tone"
        if pick(0.2):
            s["input_audio_format"] = r.choice(["pcm16", "g711_ulaw", "g711_alaw"])
        if pick(0.2):
            s["output_audio_format"] = r.choice(["pcm16", "g711_ulaw", "g711_alaw"])
        if pick(0.2):
            s["input_audio_transcription"] = r.choice([None, {"model": "synthetic"}])
        if pick(0.4):
            s["turn_detection"] = r.choice([None, {"type": "server_vad", "silence_duration_ms": 200}, {"threshold": 0.5}, {"type": "semantic_vad"}])
        if pick(0.2):
            s["temperature"] = r.choice([0.0, 0.8, 2.0])
        if pick(0.2):
            s["max_response_output_tokens"] = r.choice([1, 3, "inf"])
        if pick(0.1):
            s["tools"] = [TOOL]
            s["tool_choice"] = r.choice(["auto", "required"])
        return s

    def _audio(self) -> str:
        r = self.rng
        x = r.random()
        if x < 0.5:
            return r.choice(self.speech)
        if x < 0.8:
            return self.silence
        if x < 0.9:
            return base64.b64encode(r.randbytes(2 * r.randint(0, 1200))).decode()
        return r.choice(["", "AAA=", "AA==", base64.b64encode(b"\x01").decode(), "!!notbase64!!", "QUJD" * r.randint(1, 1000)])

    def _ev_input_audio_buffer_append(self, e: dict[str, Any]) -> None:
        e["audio"] = self._audio()

    def _ev_input_audio_buffer_commit(self, e: dict[str, Any]) -> None:
        pass

    def _ev_input_audio_buffer_clear(self, e: dict[str, Any]) -> None:
        pass

    def _ev_output_audio_buffer_clear(self, e: dict[str, Any]) -> None:
        if self.rng.random() < 0.2:
            e["response_id"] = self.rng.choice(["resp_fz", None])

    def _item(self) -> dict[str, Any]:
        r = self.rng
        kind = r.choices(["user", "assistant", "system", "function_call", "function_call_output"], [50, 15, 10, 10, 15])[0]
        item: dict[str, Any]
        if kind == "function_call":
            item = {"type": "function_call", "name": "f", "arguments": r.choice(["{}", '{"a": 1}', "not json"]), "call_id": r.choice(CALL_IDS)}
        elif kind == "function_call_output":
            item = {"type": "function_call_output", "call_id": r.choice(CALL_IDS), "output": r.choice(["42", "", "{}"])}
        else:
            beta = self.beta and r.random() < 0.5
            if kind == "user":
                part = r.choice(
                    [
                        {"type": "input_text", "text": r.choice(["hello", "", "what is the time?"])},
                        {"type": "input_audio", "audio": r.choice(self.speech)},
                        {"type": "input_audio", "transcript": "hi"},
                        {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="},
                    ]
                )
            elif kind == "assistant":
                part = r.choice(
                    [
                        {"type": "text" if beta else "output_text", "text": "sure"},
                        {"type": "audio" if beta else "output_audio", "audio": r.choice(self.speech), "transcript": "ok"},
                        {"type": "audio" if beta else "output_audio", "transcript": "ok"},
                    ]
                )
            else:
                part = {"type": "input_text", "text": "You are terse."}
            item = {"type": "message", "role": kind, "content": [copy.deepcopy(part) for _ in range(r.choice([1, 1, 1, 2, 0]))]}
        if r.random() < 0.5:
            item["id"] = r.choice(ITEM_IDS)
        if r.random() < 0.1:
            item["status"] = r.choice(["completed", "incomplete", "in_progress"])
        if r.random() < 0.1:
            item["object"] = "realtime.item"
        return item

    def _ev_conversation_item_create(self, e: dict[str, Any]) -> None:
        e["item"] = self._item()
        if self.rng.random() < 0.3:
            e["previous_item_id"] = self.rng.choice([*ITEM_IDS, "root", None])

    def _ev_conversation_item_retrieve(self, e: dict[str, Any]) -> None:
        e["item_id"] = self.rng.choice(ITEM_IDS)

    def _ev_conversation_item_delete(self, e: dict[str, Any]) -> None:
        e["item_id"] = self.rng.choice(ITEM_IDS)

    def _ev_conversation_item_truncate(self, e: dict[str, Any]) -> None:
        r = self.rng
        e.update(item_id=r.choice(ITEM_IDS), content_index=r.choice([0, 0, 1, 5]), audio_end_ms=r.choice([0, 10, 300, 5000, 10**6]))

    def _ev_response_create(self, e: dict[str, Any]) -> None:
        r = self.rng
        if r.random() < 0.4:
            return
        p: dict[str, Any] = {}
        if r.random() < 0.3:
            p["conversation"] = r.choice(["auto", "none"])
        if r.random() < 0.2:
            p["input"] = r.choice([[], [{"type": "item_reference", "id": r.choice(ITEM_IDS)}], [self._item()]])
        if r.random() < 0.2:
            p["instructions"] = "Answer in one word."
        if r.random() < 0.3:
            if self.beta:
                p["modalities"] = r.choice([["text"], ["text", "audio"]])
            else:
                p["output_modalities"] = r.choice([["text"], ["audio"]])
        if r.random() < 0.2:
            p["max_output_tokens" if not self.beta else "max_response_output_tokens"] = r.choice([1, 3, "inf"])
        if r.random() < 0.2:
            p["metadata"] = r.choice([{}, {"k": "v"}, None])
        if r.random() < 0.1:
            p["tools"] = [TOOL]
            p["tool_choice"] = r.choice(["required", {"type": "function", "name": "f"}])
        if r.random() < 0.1:
            if self.beta:
                p["voice"] = "tone"
                p["output_audio_format"] = r.choice(["pcm16", "g711_ulaw"])
            else:
                p["audio"] = {"output": {"voice": "tone", "format": r.choice([{"type": "audio/pcm"}, {"type": "audio/pcmu"}])}}
        if r.random() < 0.05:
            p["temperature"] = 0.5
        e["response"] = p

    def _ev_response_cancel(self, e: dict[str, Any]) -> None:
        if self.rng.random() < 0.2:
            e["response_id"] = self.rng.choice(["resp_fz", None])

    # ------------------------------------------------------------------ scenarios: odd orders

    def scenario(self) -> list[dict[str, Any]]:
        r = self.rng
        say = {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}}
        create, cancel = {"type": "response.create"}, {"type": "response.cancel"}
        speech = [{"type": "input_audio_buffer.append", "audio": a} for a in self.speech]
        vad = {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 200}}}}}
        oob = {"type": "response.create", "response": {"conversation": "none", "output_modalities": ["text"]}}
        truncate = {"type": "conversation.item.truncate", "item_id": r.choice(ITEM_IDS), "content_index": 0, "audio_end_ms": r.choice([0, 100])}
        name = r.choice(list(SCENARIOS))
        out = {
            "cancel_before_create": [cancel, say, create],
            "create_then_cancel": [say, create, cancel],
            "create_then_clear": [say, create, {"type": "output_audio_buffer.clear"}],
            "oob_then_cancel": [oob, cancel, oob, oob, oob, oob, oob, cancel],
            "truncate_during_response": [say, create, truncate, {"type": "conversation.item.delete", "item_id": r.choice(ITEM_IDS)}],
            "commit_while_speaking": [vad, *speech[: r.randint(1, len(speech))], {"type": "input_audio_buffer.commit"}, *speech],
            "speech_during_response": [say, create, vad, *speech, *[{"type": "input_audio_buffer.append", "audio": self.silence}] * 15],
            "update_mid_response": [say, create, self.event("session.update"), {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}}],
            "clear_mid_turn": [vad, *speech[:10], {"type": "input_audio_buffer.clear"}, *speech[10:]],
            "delete_then_respond": [say, {"type": "conversation.item.delete", "item_id": r.choice(ITEM_IDS)}, create, create],
            "create_twice": [create, create, cancel, cancel],
            "tool_loop": [
                {"type": "session.update", "session": {"type": "realtime", "tools": [TOOL], "tool_choice": "required"}},
                say,
                create,
                {"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "call_fz0", "output": "1"}},
                {"type": "session.update", "session": {"type": "realtime", "tools": [], "tool_choice": "auto"}},
                create,
            ],
            "cut_everywhere": self._every_prefix(),
        }[name]
        return out  # type: ignore[return-value]

    def _every_prefix(self) -> list[Any]:
        text = dumps(self.event(self.rng.choice(list(EVENT_WEIGHTS))))[:80]
        return [Raw(text[:i]) for i in range(len(text))]

    # ------------------------------------------------------------------ mutations

    def _value(self) -> Any:
        r = self.rng
        choice = r.randrange(31)
        if choice == 0:
            return None
        if choice in (1, 2):
            return r.random() < 0.5
        if choice <= 8:
            return r.choice([0, -1, 1, -0.0, 0.5, 2**31, 2**53 + 1, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30, 1e308, 5e-324])
        if choice <= 11:
            return Raw(r.choice(["1e309", "-1e999", "1e-400", "123456789012345678901234567890", "-0", "0.0000000000000000000001", "9" * r.choice([20, 400, 10000])]))
        if choice <= 18:
            return r.choice(["", "a", "\u0000", "\ud800", "\udfff\ud800", "\U0001f600", "\u202e", "tone", "auto", "none", "null", "inf", "NaN", "item_fz0", "realtime"])
        if choice <= 20:
            return self._big_string()
        if choice <= 25:
            return r.choice([[], [None], [1, "a"], {}, {"type": "x"}, {"": None}, [[[]]], {"a": {"b": {"c": []}}}])
        if choice <= 27:
            return self.event()  # an event inside an event
        return [self._value() for _ in range(r.randint(0, 4))] if r.random() < 0.5 else {f"k{i}": self._value() for i in range(r.randint(0, 3))}

    def _big_string(self) -> str:
        r = self.rng
        size = r.choice([1024, 65536] + ([1024 * 1024] if self.huge and r.random() < 0.1 else []))
        return r.choice(["x", "\u00e9", "\U0001f600", "\\", '"', "\ud800"]) * size

    def _paths(self, value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        out = [path]
        if isinstance(value, dict):
            for k, v in value.items():
                out += self._paths(v, (*path, k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                out += self._paths(v, (*path, i))
        return out

    def _mutated(self) -> Frame:
        r = self.rng
        event = self.event()
        paths = self._paths(event)
        path = r.choice(paths)
        op = r.choices(["replace", "remove", "duplicate", "unknown", "retag", "rename"], [45, 15, 12, 10, 10, 8])[0]
        if not path:
            op = "replace" if op in ("remove", "duplicate", "rename") else op
        if op == "retag":
            event["type"] = r.choice([*EVENT_WEIGHTS, *BETA_ONLY_NAMES, "", "session.updated", "error", "response.created"])
            return frame("mutated", dumps(event, r.random() < 0.3))
        if op == "unknown":
            target = _at(event, path)
            if isinstance(target, dict):
                target[r.choice(["x", "type", "", "__proto__", "event_id"]) + ("" if r.random() < 0.5 else "_fz")] = self._value()
            else:
                _set(event, path, {"value": target})
            return frame("mutated", dumps(event))
        if op == "replace":
            if not path:
                return frame("mutated", dumps(self._value()))
            _set(event, path, self._value())
            return frame("mutated", dumps(event, r.random() < 0.3))
        parent, key = _at(event, path[:-1]), path[-1]
        if op == "remove":
            del parent[key]
            return frame("mutated", dumps(event))
        if op == "rename" and isinstance(parent, dict):
            parent[str(key).upper() if r.random() < 0.5 else f"{key} "] = parent.pop(key)
            return frame("mutated", dumps(event))
        # duplicate: the same key twice (an object) or the element twice (an array)
        if isinstance(parent, dict):
            pairs = list(parent.items())
            pairs.insert(r.randint(0, len(pairs)), (key, self._value() if r.random() < 0.5 else parent[key]))
            if not path[:-1]:
                return frame("mutated", dumps(Pairs(pairs)))
            _set(event, path[:-1], Pairs(pairs))
            return frame("mutated", dumps(event))
        parent.insert(key, copy.deepcopy(parent[key]))
        return frame("mutated", dumps(event))

    # ------------------------------------------------------------------ broken JSON, bytes, nesting

    def _broken(self) -> Frame:
        r = self.rng
        text = dumps(self.event())
        pos = r.randrange(len(text) + 1)
        op = r.choice(["cut", "delete", "insert", "replace", "swap"])
        junk = r.choice(['"', "{", "}", "[", "]", ",", ":", "\\", "\x00", "\n", " ", "'", "0", "-", ".", "e", "\x7f", "\ufffd", "\\u", "\\ud800", "/*"])
        if op == "cut":
            text = text[:pos]
        elif op == "delete":
            text = text[:pos] + text[pos + 1 :]
        elif op == "insert":
            text = text[:pos] + junk + text[pos:]
        elif op == "replace":
            text = text[:pos] + junk + text[pos + 1 :]
        elif len(text) > 1:
            i = min(pos, len(text) - 2)
            text = text[:i] + text[i + 1] + text[i] + text[i + 2 :]
        return frame("broken", text)

    def _binary(self) -> Frame:
        r = self.rng
        text = dumps(self.event())
        op = r.choice(["plain", "bad_utf8", "bad_utf8", "utf16", "bom", "random", "nul"])
        if op == "plain":
            return Frame("binary", text.encode(errors="surrogatepass"))
        if op == "bad_utf8":
            raw = text.encode(errors="surrogatepass")
            quotes = [i for i, b in enumerate(raw) if b == ord('"')]
            at = r.choice(quotes) + 1 if quotes and r.random() < 0.8 else r.randrange(len(raw) + 1)
            bad = r.choice([b"\xff", b"\xfe\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xe2\x82", b"\xf8\x88\x80\x80\x80", b"\x80"])
            return Frame("binary", raw[:at] + bad + raw[at:])
        if op == "utf16":
            return Frame("binary", text.encode(r.choice(["utf-16", "utf-16-le", "utf-32"]), errors="surrogatepass"))
        if op == "bom":
            return Frame("binary", b"\xef\xbb\xbf" + text.encode(errors="surrogatepass"))
        if op == "nul":
            return Frame("binary", text.encode(errors="surrogatepass") + b"\x00")
        return Frame("binary", r.randbytes(r.choice([0, 1, 7, 100, 4096])))

    def _nested(self) -> Frame:
        r = self.rng
        depth = r.choice([64, 200, 1000, 5000, 100_000])
        opener, closer, leaf = r.choice([("[", "]", "1"), ('{"a":', "}", "1"), ("[{\"a\":", "}]", "[]")])
        closed = r.random() < 0.85
        nest = opener * depth + leaf + (closer * depth if closed else "")
        if r.random() < 0.3:
            return frame("nested", nest)
        event = self.event()
        path = r.choice(self._paths(event)[1:] or [("x",)])
        _set(event, path, Raw(nest))
        return frame("nested", dumps(event))

    def _odd(self) -> Frame:
        r = self.rng
        return Frame(
            "odd",
            r.choice(
                [
                    "",
                    " ",
                    "\n\t ",
                    "null",
                    "true",
                    "0",
                    "NaN",
                    "Infinity",
                    "1e999",
                    "9" * 10000,
                    '"' + "a" * 100 + '"',
                    '{"type":"input_audio_buffer.commit"}' * 2,
                    '{"type":"input_audio_buffer.commit"} trailing',
                    '{"type":"input_audio_buffer.commit","event_id":NaN}',
                    '{"type":"input_audio_buffer.commit","event_id":"\\ud800"}',
                    '{"type":"input_audio_buffer.commit","event_id":"\x00"}',
                    '{"type":"\\u0069nput_audio_buffer.commit"}',
                    '{"type":"input_audio_buffer.append","audio":"' + "A" * r.choice([3, 5, 4097]) + '"}',
                    '{"type":"conversation.item.truncate","item_id":"item_fz0","content_index":1e2,"audio_end_ms":1.5}',
                    '{"type":"conversation.item.truncate","item_id":"item_fz0","content_index":99999999999999999999,"audio_end_ms":-1}',
                    "\ufeff{}",
                    "{" * 3,
                ]
            ),
        )


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        value = value.pairs[key][1] if isinstance(value, Pairs) else value[key]
    return value


def _set(value: Any, path: tuple[Any, ...], new: Any) -> None:
    parent = _at(value, path[:-1])
    if isinstance(parent, (dict, list)):
        parent[path[-1]] = new


TOOL = {"type": "function", "name": "f", "description": "a tool", "parameters": {"type": "object", "properties": {}}}

EVENT_WEIGHTS = {
    "session.update": 10,
    "input_audio_buffer.append": 30,
    "input_audio_buffer.commit": 6,
    "input_audio_buffer.clear": 4,
    "output_audio_buffer.clear": 4,
    "conversation.item.create": 14,
    "conversation.item.retrieve": 4,
    "conversation.item.delete": 4,
    "conversation.item.truncate": 5,
    "response.create": 10,
    "response.cancel": 6,
}
# Beta names of server events a confused client might send back.
BETA_ONLY_NAMES = ["conversation.item.created", "response.audio.delta", "transcription_session.update", "session.created"]
SCENARIOS = [
    "cancel_before_create",
    "create_then_cancel",
    "create_then_clear",
    "oob_then_cancel",
    "truncate_during_response",
    "commit_while_speaking",
    "speech_during_response",
    "update_mid_response",
    "clear_mid_turn",
    "delete_then_respond",
    "create_twice",
    "tool_loop",
    "cut_everywhere",
]
