"""LiveKit Agents' OpenAI realtime plugin (livekit-plugins-openai, unmodified) against the server,
driven the way its ``AgentSession`` drives a ``RealtimeSession``: instructions and tools set up front,
a reply generated from instructions, a user's text, server-VAD audio turns, ``clear_audio`` on an
interruption, a manual ``commit_audio`` + ``generate_reply``, and a ``function_tool`` call whose
output goes back through ``update_chat_ctx`` and is spoken by a ``generate_reply()`` without
instructions (which sends ``"instructions": null``).

Runs in the clients' own venv (tests/clients/setup): ``python livekit_agent.py CONFIG.json``. Every
raw server event it received goes to the config's ``events`` file (JSON lines) for the test to
validate against the official SDK's models; what each step observed is printed as one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from livekit import rtc
from livekit.agents import llm
from livekit.plugins.openai.realtime import RealtimeModel
from openai.types.realtime import AudioTranscription
from openai.types.realtime.realtime_audio_input_turn_detection import ServerVad

RATE = 24000
FRAME = RATE // 50  # 20 ms


@llm.function_tool
async def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
        city: The city's name.
    """
    return f"sunny in {city}"


async def collect(gen: llm.GenerationCreatedEvent, timeout: float = 20.0) -> dict[str, Any]:
    """Everything one generation produced: its messages' text and audio, and its function calls."""

    async def run() -> dict[str, Any]:
        text, audio_s, calls = [], 0.0, []

        async def messages() -> None:
            nonlocal audio_s
            async for msg in gen.message_stream:

                async def read_text(m=msg) -> None:
                    async for t in m.text_stream:
                        text.append(str(t))

                async def read_audio(m=msg) -> None:
                    nonlocal audio_s
                    async for frame in m.audio_stream:
                        audio_s += frame.samples_per_channel / frame.sample_rate

                await asyncio.gather(read_text(), read_audio())

        async def functions() -> None:
            async for call in gen.function_stream:
                calls.append({"name": call.name, "arguments": call.arguments, "call_id": call.call_id})

        await asyncio.gather(messages(), functions())
        return {"text": "".join(text), "audio_s": round(audio_s, 3), "calls": calls, "response_id": gen.response_id}

    return await asyncio.wait_for(run(), timeout)


def frames(pcm: np.ndarray):
    for i in range(0, len(pcm), FRAME):
        chunk = pcm[i : i + FRAME]
        if len(chunk) < FRAME:
            chunk = np.concatenate([chunk, np.zeros(FRAME - len(chunk), np.int16)])
        yield rtc.AudioFrame(chunk.tobytes(), RATE, 1, FRAME)


async def push(session: Any, pcm: np.ndarray, realtime: bool = False) -> None:
    for frame in frames(pcm):
        session.push_audio(frame)
        await asyncio.sleep(0.02 if realtime else 0)  # real time when asked: the pacing is the input


def speech_started(events: list[dict[str, Any]]) -> int:
    return sum(1 for e in events if e.get("type") == "input_audio_buffer.speech_started")


async def until(predicate: Any, timeout: float = 10.0) -> None:
    """Wait until ``predicate()`` holds: it reads what the session's event callbacks collected."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)  # between looks; the callbacks run meanwhile


async def tool_round(session: Any, generations: Any, question: str, wait: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The user asks ``question``; the call the reply makes is run here, its output goes back
    through the chat context, and a reply without instructions speaks it: (the call, the answer)."""
    ctx = session.chat_ctx.copy()
    ctx.add_message(role="user", content=question)
    await session.update_chat_ctx(ctx)
    gen = await asyncio.wait_for(session.generate_reply(), wait)
    await generations.get()
    called = await collect(gen, 2 * wait)
    call = called["calls"][0]
    result = await get_weather(**json.loads(call["arguments"]))
    ctx = session.chat_ctx.copy()
    ctx.items.append(llm.FunctionCallOutput(call_id=call["call_id"], name=call["name"], output=result, is_error=False))
    await session.update_chat_ctx(ctx)
    gen = await asyncio.wait_for(session.generate_reply(), wait)
    await generations.get()
    return called, await collect(gen, 2 * wait)


async def main(config: dict[str, Any]) -> dict[str, Any]:
    speech = np.fromfile(config["speech"], dtype="<i2")
    silence = np.zeros(RATE, np.int16)
    model = RealtimeModel(
        base_url=config["base_url"],
        api_key=config["api_key"],
        modalities=["audio"],
        input_audio_transcription=AudioTranscription(model="gpt-4o-mini-transcribe"),
        turn_detection=ServerVad(type="server_vad", create_response=True, interrupt_response=True, silence_duration_ms=500),
    )
    session = model.session()
    events: list[dict[str, Any]] = []
    session.on("openai_server_event_received", events.append)
    generations: asyncio.Queue[llm.GenerationCreatedEvent] = asyncio.Queue()
    session.on("generation_created", generations.put_nowait)
    transcripts: list[str] = []
    session.on("input_audio_transcription_completed", lambda e: transcripts.append(e.transcript))
    errors: list[str] = []
    session.on("error", lambda e: errors.append(repr(e.error)))
    out: dict[str, Any] = {}
    wait = float(config.get("wait_s", 10))  # a real thinker on two cores is slower than the stand-in
    try:
        await session.update_instructions("You are a helpful voice assistant.")
        await session.update_tools([get_weather])

        if not config.get("tool_only"):  # (tool_only: step 6 alone, against a real thinker)
            # 1. a reply generated from instructions (how an agent greets)
            gen = await asyncio.wait_for(session.generate_reply(instructions="Greet the user."), 10)
            await generations.get()
            out["greeting"] = await collect(gen)

            # 2. a user's text (AgentSession.generate_reply(user_input=...): the chat context, then a reply)
            ctx = session.chat_ctx.copy()
            ctx.add_message(role="user", content="Hello there, how are you?")
            await session.update_chat_ctx(ctx)
            gen = await asyncio.wait_for(session.generate_reply(), 10)
            await generations.get()
            out["text_reply"] = await collect(gen)

            # 3. audio turns, server VAD: each answered on its own
            out["vad_turns"] = []
            for _ in range(2):
                await push(session, np.concatenate([silence, speech, silence]))
                out["vad_turns"].append(await collect(await asyncio.wait_for(generations.get(), 15)))

            # 4. an interruption: the user starts talking, the agent clears the input (clear_audio), then
            #    the user speaks whole turns again: they must still be heard, whole
            started = speech_started(events)
            await push(session, speech[: len(speech) // 2])
            await until(lambda: speech_started(events) > started)  # the server heard the user begin
            session.clear_audio()
            await push(session, silence)
            for _ in range(2):
                await push(session, np.concatenate([silence, speech, silence]))
                out["vad_turns"].append(await collect(await asyncio.wait_for(generations.get(), 15)))

            # 5. a manual commit and reply, mid-turn (push-to-talk over server VAD)
            await push(session, np.concatenate([silence, speech[: len(speech) // 2]]))
            session.commit_audio()
            gen = await asyncio.wait_for(session.generate_reply(), 10)
            while (g := await generations.get()) is not gen:
                await collect(g)  # a VAD reply that raced the commit
            out["committed_reply"] = await collect(gen)
            await push(session, silence)
            await push(session, np.concatenate([silence, speech, silence]))
            out["after_commit"] = await collect(await asyncio.wait_for(generations.get(), 15))

        # 6. a function tool: called with arguments that fit its schema; its output goes back
        #    through the chat context and a reply without instructions speaks it
        out["tool_call"], out["tool_answer"] = await tool_round(session, generations, "What is the weather like in Paris today?", wait)
    finally:
        out["transcripts"] = transcripts
        out["errors"] = errors
        await session.aclose()
        await model.aclose()
        Path(config["events"]).write_text("".join(json.dumps(e) + "\n" for e in events))
    return out


if __name__ == "__main__":
    result = asyncio.run(main(json.loads(Path(sys.argv[1]).read_text())))
    print(json.dumps(result))
