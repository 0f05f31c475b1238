"""The selectable base-model thinker: Gemma 3 270M (prepared from its GGUF package) with the
transcript prompt format answers a question in one line, on the real engine."""

from __future__ import annotations

import re

import pytest

from realtime_omni import config as config_file
from tests.support.client import connect
from tests.support.processes import server_process

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]


async def test_gemma_answers_in_one_line():
    config = config_file.raw("cpu-gemma")
    with server_process(config, startup_s=900) as url:
        async with connect(url) as c:
            await c.expect("session.created")
            await c.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is the capital of France?"}]}
            await c.send({"type": "conversation.item.create", "item": item})
            await c.send({"type": "response.create"})
            done = await c.expect("response.done", timeout=120)
    assert done.response.status == "completed"
    text = c.of("response.output_text.done")[0].text
    assert re.search(r"[A-Za-z]{2,}", text) and "\n" not in text and "User:" not in text, text
