"""The thinker's engine port (pipelines/cascade/engines.py) in the remote adapter's terms: a
``Sampling`` as the completions request vLLM's server takes, and its streamed chunks as the
``Output`` pieces the thinker reads. The chunks are vLLM's own shape (``vllm serve``'s
``/v1/completions`` with ``stream_options.include_usage``; the real server is
test_cpu_remote_thinker.py's and test_cpu_remote_tools.py's)."""

from __future__ import annotations

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
