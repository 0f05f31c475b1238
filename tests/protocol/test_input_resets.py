"""A server_vad session keeps hearing its user after anything that resets the turn detector.

LiveKit's plugin clears the input buffer on every interruption and handoff, the Agents SDK commits
mid-turn, push-to-talk clients commit by hand, and a ``session.update`` may change the turn
detection: after each of these, every later VAD turn must still hold its audio, and
``audio_start_ms`` must go on counting from the start of the session.
"""

from __future__ import annotations

import base64

import numpy as np
import pytest

from tests.support.audio import silence, speech_bounds_ms, utterance
from tests.support.client import connect

RATE = 24000
TEXT = "Please book a table for two people at eight tonight."


async def vad_turn(c, pcm: np.ndarray, sent_ms: int):
    """Append ``pcm`` (a lead silence, speech, a tail silence) and return the committed item's
    start and end (ms) and the duration of the audio it holds, read back by retrieve."""
    await c.append(pcm)
    started = await c.expect("input_audio_buffer.speech_started")
    stopped = await c.expect("input_audio_buffer.speech_stopped")
    committed = await c.expect("input_audio_buffer.committed")
    assert started.item_id == stopped.item_id == committed.item_id
    await c.send({"type": "conversation.item.retrieve", "item_id": committed.item_id})
    item = (await c.expect("conversation.item.retrieved")).item
    held_ms = len(base64.b64decode(item.content[0].audio)) / 2 / RATE * 1000
    onset, speech_end = speech_bounds_ms(pcm)
    # in the session's time base: everything sent before this utterance, plus its own offsets
    assert abs(started.audio_start_ms - (sent_ms + onset - 300)) <= 60, (started.audio_start_ms, sent_ms + onset)
    assert abs(stopped.audio_end_ms - (sent_ms + speech_end + 500)) <= 80, (stopped.audio_end_ms, sent_ms + speech_end)
    assert abs(held_ms - (stopped.audio_end_ms - started.audio_start_ms)) <= 60, (held_ms, started, stopped)
    return held_ms


@pytest.mark.parametrize("reset", ["clear", "commit_mid_turn", "update_turn_detection", "turn_longer_than_the_buffer"])
async def test_vad_turns_keep_their_audio_after_a_detector_reset(make_server, reset):
    # a 4 s input buffer: a turn longer than it is ended where it fills
    srv = make_server(limits={"max_buffer_seconds": 4}, session={"audio": {"input": {"turn_detection": {"type": "server_vad", "create_response": False}}}})
    pcm = utterance(TEXT, lead_ms=600, tail_ms=900)
    ms = lambda a: len(a) * 1000 // RATE  # noqa: E731
    async with connect(srv.ws_base) as c:
        await c.expect("session.created")
        sent = 0
        held = await vad_turn(c, pcm, sent)
        sent += ms(pcm)
        assert held > 2000
        if reset == "clear":
            await c.append(silence(200))
            sent += 200
            await c.send({"type": "input_audio_buffer.clear"})
            await c.expect("input_audio_buffer.cleared")
        elif reset == "commit_mid_turn":
            head = pcm[: len(pcm) // 2]  # into the speech: a turn is open
            await c.append(head)
            sent += ms(head)
            await c.expect("input_audio_buffer.speech_started")
            await c.send({"type": "input_audio_buffer.commit"})
            await c.expect("input_audio_buffer.committed")
            rest = silence(1000)  # the rest of that utterance never comes
            await c.append(rest)
            sent += ms(rest)
        elif reset == "update_turn_detection":
            await c.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 500, "create_response": False, "threshold": 0.5}}}}})
            await c.expect("session.updated")
            await c.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 500, "create_response": False, "threshold": 0.6}}}}})
            await c.expect("session.updated")
        else:  # speech longer than the 4 s buffer: the turn is ended where the buffer fills
            long = np.concatenate([silence(600), *(utterance(TEXT, 0, 0) for _ in range(3)), silence(900)])
            await c.append(long)
            sent += ms(long)
            turns = []
            while not turns or turns[-1].audio_end_ms < sent - 900:  # until the turn the silence ended
                turns.append(await c.expect("input_audio_buffer.speech_stopped"))
            assert len(turns) >= 2  # the speech went on: the rest of it became turns of their own
            for stopped in turns:
                await c.send({"type": "conversation.item.retrieve", "item_id": stopped.item_id})
                item = (await c.expect("conversation.item.retrieved")).item
                assert len(base64.b64decode(item.content[0].audio)) / 2 / RATE > 1.5
            assert turns[0].audio_end_ms > 4000  # the first ended where the buffer was full
        for _ in range(2):  # every later turn holds its whole utterance
            held = await vad_turn(c, pcm, sent)
            sent += ms(pcm)
            assert held > 2000
