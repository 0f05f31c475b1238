"""The thinker's engine port (pipelines/cascade/engines.py) in the remote adapter's terms: a
``Sampling`` as the completions request vLLM's server takes, and its streamed chunks as the
``Output`` pieces the thinker reads. The chunks are vLLM's own shape (``vllm serve``'s
``/v1/completions`` with ``stream_options.include_usage``; the real server is
test_cpu_remote_thinker.py's and test_cpu_remote_tools.py's)."""

from __future__ import annotations

import pytest

from pipelines.cascade.engines import CompletionsEngine, Output, Sampling, _outputs
from pipelines.cascade.thinker import ThinkerOptions
from pipelines.remote import RemoteOptions


def engine(served: str | None = "qwen") -> CompletionsEngine:
    return CompletionsEngine(ThinkerOptions(engine="remote", remote=RemoteOptions(url="http://127.0.0.1:9/v1"), served_model=served))


def test_an_answers_sampling_is_the_completions_request_vllm_takes():
    s = Sampling(max_tokens=88, temperature=0.3, repetition_penalty=1.2, seed=0, stop=("\n",), banned=frozenset({7, 9}), schema={"type": "object"})
    body = engine().body([1, 2, 3], "salt-a", s)
    assert body == {
        "prompt": [1, 2, 3],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 88,
        "temperature": 0.3,
        "cache_salt": "salt-a",
        "model": "qwen",
        "repetition_penalty": 1.2,
        "seed": 0,
        "stop": ["\n"],
        "logit_bias": {"7": -100, "9": -100},
        "structured_outputs": {"json": {"type": "object"}},
    }


def test_a_judgement_asks_for_logprobs_named_by_token_id_and_nothing_it_does_not_set():
    body = engine(served=None).body([5], "salt-b", Sampling(max_tokens=1, logprobs=20))
    assert body == {
        "prompt": [5],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 1,
        "temperature": 0.0,
        "cache_salt": "salt-b",
        "logprobs": 20,
        "return_tokens_as_token_ids": True,
    }
    assert engine().body([5], "s", Sampling(max_tokens=32, ignore_eos=True))["ignore_eos"] is True


def test_streamed_chunks_are_outputs_one_token_each_and_the_usage_the_engines_own_counts():
    text = {"choices": [{"index": 0, "text": " Paris", "finish_reason": None, "logprobs": None}], "usage": None}
    last = {"choices": [{"index": 0, "text": ".", "finish_reason": "stop", "logprobs": None}], "usage": None}
    usage = {"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 32}}}
    assert _outputs(text) == [Output(" Paris", count=1)]
    assert _outputs(last) == [Output(".", count=1, finish_reason="stop", finished=True)]
    assert _outputs(usage) == [Output(cached=32, total=2, prompt=40)]
    assert _outputs({"choices": [{"index": 0, "text": "", "finish_reason": None}]}) == []  # (a keep-alive)


def test_top_logprobs_come_back_keyed_by_token_id():
    chunk = {"choices": [{"index": 0, "text": " the", "finish_reason": "length", "logprobs": {"top_logprobs": [{"token_id:13": -0.1, "token_id:30": -2.5}]}}]}
    (out,) = _outputs(chunk)
    assert out.top == {13: -0.1, 30: -2.5} and out.finish_reason == "length" and out.count == 1


# ----------------------------------------------------------------------- a resumable remote request


class Deployment:
    """What ``vllm serve``'s completions stream for a body (the real one is the engine tests'): a
    toy model whose next token follows from the whole prompt so far, held to ``allowed_token_ids``,
    ended by ``stop_token_ids`` (the stop token written, its id the ``stop_reason``) or
    ``max_tokens``, each token a chunk with its text and (``return_token_ids``) its id, then the
    usage. The prefix cache: the longest prompt prefix seen before, in whole blocks of 4."""

    BLOCK = 4

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.closed = 0
        self.seen: list[list[int]] = []

    @staticmethod
    def next_token(context: list[int], allowed: list[int] | None) -> int:
        token = 100 + sum(i * t for i, t in enumerate(context, 1)) % 7
        return min(allowed, key=lambda t: (t - token) % 1000) if allowed else token

    async def stream(self, body: dict, path: str = "/chat/completions"):  # type: ignore[no-untyped-def]
        assert path == "/completions"
        self.bodies.append(body)
        prompt = list(body["prompt"])
        cached = max((len(_common(prompt, p)) // self.BLOCK * self.BLOCK for p in self.seen), default=0)
        self.seen.append(prompt)
        context, written = list(prompt), 0
        try:
            while True:
                token = self.next_token(context, body.get("allowed_token_ids"))
                context.append(token)
                written += 1
                reason = stop = None
                if token in (body.get("stop_token_ids") or ()):
                    reason, stop = "stop", token
                elif written == body["max_tokens"]:
                    reason = "length"
                choice = {"index": 0, "text": f"<{token}>", "finish_reason": reason, "stop_reason": stop}
                if body.get("return_token_ids"):
                    choice["token_ids"] = [token]
                yield {"choices": [choice], "usage": None}
                if reason:
                    break
            yield {"choices": [], "usage": {"prompt_tokens": len(prompt), "completion_tokens": written, "prompt_tokens_details": {"cached_tokens": cached}}}
        finally:
            self.closed += 1


def _common(a: list[int], b: list[int]) -> list[int]:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def deployment() -> tuple[CompletionsEngine, Deployment]:
    e, d = engine(), Deployment()
    e.remote.stream = d.stream  # type: ignore[method-assign]
    return e, d


async def test_a_resumable_remote_request_plays_vllms_streaming_input_a_part_a_request():
    """A part ends at its stop token (reported, its tokens given); the next part's prompt is all
    before it but the last token sampled (dropped, as vLLM's streaming input drops it), with the
    same salt, so it begins with what the deployment has cached; the counts are the request's: the first part's
    cached and prompt tokens, what every part wrote; ``end`` finishes it with its last part."""
    e, d = deployment()
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    first = d.next_token(prompt, None)
    r = e.request(prompt, "salt-a", Sampling(max_tokens=8, stop_token_ids=(first,)), "r1", resumable=True)
    ended = await anext(r)
    assert (ended.tokens, ended.stop, ended.finish_reason, ended.finished) == ([first], first, "stop", False)
    assert (ended.total, ended.prompt, ended.cached) == (1, 9, 0)
    assert d.bodies[0]["return_token_ids"] is True and d.bodies[0]["cache_salt"] == "salt-a"
    await r.give([40, 41], Sampling(max_tokens=3, allowed_token_ids=(200, 201)))
    await r.end()
    outs = [out async for out in r]
    assert d.bodies[1]["prompt"] == prompt + [40, 41]  # (the first part's one token dropped)
    assert d.bodies[1]["allowed_token_ids"] == [200, 201] and d.bodies[1]["cache_salt"] == "salt-a"
    written = [t for o in outs for t in o.tokens]
    assert len(written) == 3 and set(written) <= {200, 201}
    assert [o.finish_reason for o in outs] == [None, None, "length"] and [o.finished for o in outs] == [False, False, True]
    assert outs[-1].total == 4 and outs[-1].cached is None and outs[-1].prompt is None  # (the request's counts: the first part's)
    assert "".join(o.text for o in outs) == "".join(f"<{t}>" for t in written)
    assert d.closed == 2


async def test_a_remote_parts_next_prompt_goes_on_from_what_was_written_and_closing_aborts_the_part_running():
    e, d = deployment()
    r = e.request([5, 6, 7], "s", Sampling(max_tokens=3), "r2", resumable=True)
    part = [out async for out in _until_end(r)]
    one = [t for o in part for t in o.tokens]
    assert len(one) == 3 and part[-1].finish_reason == "length" and not part[-1].finished and part[-1].stop is None
    assert r.offer([9], Sampling(max_tokens=50)) and not r.offer([10], Sampling(max_tokens=1))  # (one part waits at most)
    assert (await anext(r)).finish_reason is None  # the second part runs
    assert d.bodies[1]["prompt"] == [5, 6, 7] + one[:-1] + [9]
    await r.close()
    assert d.closed == 2  # its stream closed: the deployment aborts it
    assert [out async for out in r] == []
    assert not r.offer([1], Sampling(max_tokens=1))


async def _until_end(r):  # type: ignore[no-untyped-def]
    async for out in r:
        yield out
        if out.finish_reason is not None:
            return


def test_token_ids_and_the_stop_token_come_back_from_a_chunk():
    chunk = {"choices": [{"index": 0, "text": "", "finish_reason": "stop", "stop_reason": 151657, "token_ids": [151657]}]}
    assert _outputs(chunk) == [Output("", [151657], 1, finish_reason="stop", finished=True, stop=151657)]
    eos = {"choices": [{"index": 0, "text": "", "finish_reason": "stop", "stop_reason": None, "token_ids": [151645]}]}
    assert _outputs(eos)[0].stop is None and _outputs(eos)[0].tokens == [151645]


async def test_a_remote_request_that_is_not_resumable_is_one_part_ended_from_the_start():
    e, d = deployment()
    r = e.request([3, 1, 4], "s", Sampling(max_tokens=2, logprobs=5), "r3")
    outs = [out async for out in r]
    assert [o.finish_reason for o in outs] == [None, "length"] and outs[-1].finished
    assert (outs[-1].total, outs[-1].prompt, outs[-1].cached) == (2, 3, 0)  # (its usage, with its last output)
    assert len(d.bodies) == 1 and d.bodies[0]["logprobs"] == 5 and d.closed == 1
    assert not r.offer([9], Sampling(max_tokens=1))
    with pytest.raises(RuntimeError):
        await r.give([9], Sampling(max_tokens=1))
