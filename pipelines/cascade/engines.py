"""The thinker's engine port, and its two adapters: vLLM in this process, and a remote ``vllm serve``.

The ``Thinker`` (thinker.py) renders prompts, decides what an answer is sampled with and reads its
output; an ``Engine`` only runs requests. A request is given token ids, a cache salt and a
``Sampling`` in the engine's neutral terms, and yields ``Output`` pieces: one loop in the thinker
reads both engines' answers. A request may be *resumable* (vLLM's ``StreamingInput``): more parts
of the prompt given while it runs (the turn's streamed prompt, a steered call's parts). In
process that is vLLM's own; on a remote engine each part is a completions request of its own,
its prompt all the request was given and wrote before it (the deployment's prefix cache holds
that but for its newest tokens).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pipelines.remote import RemoteEngine, RemoteOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sampling:
    """What a request (or one part of a resumable one) is sampled with. ``None`` and empty: the
    engine's own default; ``banned``: tokens it may not write; ``schema``: a JSON schema its text
    is held to as it is written; ``logprobs``: the top candidates of each token to return."""

    max_tokens: int
    temperature: float = 0.0
    repetition_penalty: float | None = None
    seed: int | None = None
    logprobs: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    allowed_token_ids: tuple[int, ...] | None = None
    banned: frozenset[int] = frozenset()
    schema: dict[str, Any] | None = None
    ignore_eos: bool = False


@dataclass(frozen=True)
class Output:
    """What a request wrote since its last output. ``finish_reason``: its part (or the whole
    request) ended, and why; ``finished``: the whole request did. ``stop``: the token id that
    ended the part, where one did. ``cached``: prompt tokens the engine found in its prefix cache,
    ``total``/``prompt``: the engine's own counts, where it reports them (a remote engine's usage);
    ``top``: the last token's likeliest candidates and their logprobs, when asked."""

    text: str = ""
    tokens: Sequence[int] = ()
    count: int = 0  # tokens written (``len(tokens)`` where the engine names them)
    finish_reason: str | None = None
    finished: bool = False
    stop: int | None = None
    cached: int | None = None
    total: int | None = None
    prompt: int | None = None
    top: dict[int, float] | None = None


class Request(Protocol):
    """One engine request: read its outputs (``async for``, or ``anext``), give a resumable one
    more parts, and close it (aborted in the engine unless it finished)."""

    request_id: str

    def __aiter__(self) -> AsyncIterator[Output]: ...

    async def __anext__(self) -> Output: ...

    async def give(self, ids: list[int], sampling: Sampling) -> None:
        """A further part of the prompt, sampled with ``sampling`` (resumable requests only)."""
        ...

    def offer(self, ids: list[int], sampling: Sampling) -> bool:
        """``give`` unless a part is still waiting to be taken: False, and nothing given."""
        ...

    async def end(self) -> None:
        """No more parts: the request ends when its last part does."""
        ...

    async def close(self) -> None: ...


class Settings(Protocol):
    """What the engines read of the thinker's options (``thinker.ThinkerOptions``)."""

    engine: Literal["in_process", "remote"]
    remote: RemoteOptions
    served_model: str | None
    dtype: str
    max_model_len: int
    block_size: int | None
    prefix_caching: bool
    enforce_eager: bool
    max_num_seqs: int
    kv_cache_gib: float
    engine_args: dict[str, Any]
    seed: int | None


class Engine(Protocol):
    """What the thinker asks of an engine. ``in_process``: the model runs here (warmed at start; a
    resumable request's parts prefilled as they come, so a prompt can be streamed while the user
    speaks, where a remote engine's parts are each a request)."""

    in_process: bool

    async def start(self, model_path: str, progress: Callable[[str], Any]) -> None: ...

    async def stop(self) -> None: ...

    @property
    def healthy(self) -> bool: ...

    @property
    def failed(self) -> str | None:
        """Why the engine is dead for good (None while it lives or may come back)."""
        ...

    def request(self, prompt: list[int], salt: str, sampling: Sampling, request_id: str, resumable: bool = False) -> Request: ...

    async def prompt_logprobs(self, prompt: list[int], salt: str) -> list[float | None]:
        """The log probability of each token of ``prompt`` after those before it (the first None)."""
        ...

    def stats(self) -> dict[str, float]: ...


# ---------------------------------------------------------------------------------------- in process


def _cpu_environment(options: Settings) -> None:
    """vLLM reads these at import time; set them before the first import (ours or anyone's)."""
    from pipelines.paths import home

    cache = home()
    env = {
        "VLLM_CPU_KVCACHE_SPACE": f"{options.kv_cache_gib:g}",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",  # else vLLM keeps one of our two cores to itself
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # model inside the engine-core process: 2 processes, not 3
        "VLLM_USE_AOT_COMPILE": "0",
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "VLLM_RPC_BASE_PATH": str(cache / "rpc"),
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        # OpenMP threads wait for the next parallel region spinning briefly, then asleep: a decode
        # step opens ~200 regions, and waking a sleeping thread for each cost a third of its time
        # (bench.thinker), while spinning without end would take the cores ASR and TTS need too
        "GOMP_SPINCOUNT": "20000",
    }
    for key, value in env.items():
        os.environ.setdefault(key, value)
    for key in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "VLLM_RPC_BASE_PATH"):
        Path(os.environ[key]).mkdir(parents=True, exist_ok=True)


def _import_vllm() -> tuple[Any, Any]:
    """vLLM's engine classes, with the int8 checkpoints' method registered (realtime_omni_w8; the
    entry point does it in vLLM's own processes)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from pipelines.int8.vllm_method import register

    register()
    return AsyncEngineArgs, AsyncLLM


def _params(s: Sampling) -> Any:
    """``s`` in vLLM's terms."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    return SamplingParams(
        max_tokens=s.max_tokens,
        temperature=s.temperature,
        repetition_penalty=1.0 if s.repetition_penalty is None else s.repetition_penalty,  # (1.0: vLLM's own default)
        seed=s.seed,
        logprobs=s.logprobs,
        stop=list(s.stop) or None,
        stop_token_ids=list(s.stop_token_ids) or None,
        allowed_token_ids=list(s.allowed_token_ids) if s.allowed_token_ids is not None else None,
        logit_bias=dict.fromkeys(s.banned, -100.0) if s.banned else None,
        structured_outputs=StructuredOutputsParams(json=s.schema) if s.schema else None,
        ignore_eos=s.ignore_eos,
        output_kind=RequestOutputKind.DELTA,
    )


async def _parts(parts: asyncio.Queue[Any]) -> AsyncIterator[Any]:
    """A resumable request's input: its parts as they are given, until None."""
    while (item := await parts.get()) is not None:
        yield item


class _VllmRequest:
    """A request on an ``AsyncLLM``. Resumable: its input a queue of parts, one waiting at most
    beside the end (the engine's outputs are read in order, one part at a time)."""

    def __init__(self, engine: Any, prompt: list[int], salt: str, sampling: Sampling, request_id: str, resumable: bool) -> None:
        from vllm.inputs import tokens_input

        self.engine = engine
        self.salt = salt
        self.request_id = request_id
        self.finished = False
        self._input: asyncio.Queue[Any] | None = None
        params = _params(sampling)
        # (the engine extends a resumable request's token list in place: it is given copies)
        if resumable:
            self._input = asyncio.Queue(maxsize=2)
            self._input.put_nowait(self._part(prompt, params))
            self._outputs = engine.generate(_parts(self._input), params, request_id=request_id)
        else:
            self._outputs = engine.generate(tokens_input(list(prompt), cache_salt=salt), params, request_id=request_id)

    def _part(self, ids: list[int], params: Any) -> Any:
        from vllm.engine.protocol import StreamingInput
        from vllm.inputs import tokens_input

        return StreamingInput(tokens_input(list(ids), cache_salt=self.salt), params)

    def __aiter__(self) -> _VllmRequest:
        return self

    async def __anext__(self) -> Output:
        out = await anext(self._outputs)
        self.finished = out.finished
        c = out.outputs[0]
        top = {token: lp.logprob for token, lp in c.logprobs[-1].items()} if c.logprobs else None
        stop = c.stop_reason if c.finish_reason == "stop" and isinstance(c.stop_reason, int) else None
        return Output(c.text, c.token_ids, len(c.token_ids), c.finish_reason, out.finished, stop, out.num_cached_tokens, top=top)

    async def give(self, ids: list[int], sampling: Sampling) -> None:
        assert self._input is not None, "a request that is not resumable takes no more parts"
        await self._input.put(self._part(ids, _params(sampling)))

    def offer(self, ids: list[int], sampling: Sampling) -> bool:
        assert self._input is not None, "a request that is not resumable takes no more parts"
        try:
            self._input.put_nowait(self._part(ids, _params(sampling)))
        except asyncio.QueueFull:
            return False
        return True

    async def end(self) -> None:
        if self._input is not None:
            await self._input.put(None)

    async def close(self) -> None:
        if self._input is not None:
            with contextlib.suppress(asyncio.QueueFull):
                self._input.put_nowait(None)  # the input's end
        with contextlib.suppress(Exception):
            await self._outputs.aclose()
        if not self.finished:
            with contextlib.suppress(Exception):
                await self.engine.abort(self.request_id)


class VllmEngine:
    """vLLM's ``AsyncLLM`` in this process (vLLM-CPU, or GPU vLLM: only the options differ)."""

    in_process = True

    def __init__(self, options: Settings) -> None:
        self.options = options
        self.llm: Any = None

    async def start(self, model_path: str, progress: Callable[[str], Any]) -> None:
        o = self.options
        _cpu_environment(o)
        # vLLM imported off the loop too (seconds: torch, its kernels), and the engine built there
        # (tens of seconds: its process, the weights, the KV cache), so that the server answers
        # meanwhile (/healthz 503); the engine's output handler starts with its first request
        AsyncEngineArgs, AsyncLLM = await asyncio.to_thread(_import_vllm)
        args: dict[str, Any] = dict(
            model=model_path,
            dtype=o.dtype,
            max_model_len=o.max_model_len,
            enable_prefix_caching=o.prefix_caching,
            disable_log_stats=False,  # the prefix-cache counters need the stats
            enforce_eager=o.enforce_eager,
            max_num_seqs=o.max_num_seqs,
            seed=o.seed,
        )
        if o.block_size:
            args["block_size"] = o.block_size
        args.update(o.engine_args)
        progress(f"starting vLLM on {model_path} ...")
        self.llm = await asyncio.to_thread(AsyncLLM.from_engine_args, AsyncEngineArgs(**args))

    async def stop(self) -> None:
        if self.llm is not None:
            self.llm.shutdown()
            self.llm = None

    @property
    def healthy(self) -> bool:
        return self.llm is not None and not self.llm.errored

    @property
    def failed(self) -> str | None:
        """An in-process engine that died (its engine-core process killed, or crashed) stays dead."""
        return "the vLLM engine died" if self.llm is not None and self.llm.errored else None

    def request(self, prompt: list[int], salt: str, sampling: Sampling, request_id: str, resumable: bool = False) -> _VllmRequest:
        return _VllmRequest(self.llm, prompt, salt, sampling, request_id, resumable)

    async def prompt_logprobs(self, prompt: list[int], salt: str) -> list[float | None]:
        from vllm import SamplingParams
        from vllm.inputs import tokens_input
        from vllm.sampling_params import RequestOutputKind

        assert self.llm is not None, "the engine is not started"
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, output_kind=RequestOutputKind.FINAL_ONLY)
        final = None
        async for out in self.llm.generate(tokens_input(list(prompt), cache_salt=salt), params, request_id=uuid.uuid4().hex):
            final = out
        rows = (final.prompt_logprobs if final is not None else None) or []
        return [None if row is None or token not in row else float(row[token].logprob) for row, token in zip(rows, prompt)]

    def stats(self) -> dict[str, float]:
        if self.llm is None:
            return {}
        from vllm.v1.metrics.reader import Counter, Gauge, get_metrics_snapshot

        out = {"engine_unfinished_requests": float(self.llm.get_num_unfinished_requests())}
        names = {
            "vllm:prefix_cache_hits": "prefix_cache_hit_tokens",
            "vllm:prefix_cache_queries": "prefix_cache_query_tokens",
            "vllm:num_requests_running": "engine_requests_running",
        }
        for metric in get_metrics_snapshot():
            name = names.get(metric.name)
            if name and isinstance(metric, (Counter, Gauge)):
                out[name] = out.get(name, 0.0) + float(metric.value)
        return out


# ---------------------------------------------------------------------------------------- remote


class _CompletionsRequest:
    """A request on a deployment's completions: the prompt as token ids, streamed back; closing
    it closes the stream, which aborts the request upstream. A resumable one plays vLLM's
    streaming input, one completions request a part (a request that is not is one part, ended
    from the start). As in vLLM, a part's last sampled token is dropped (never computed) and
    the next part goes on from the tokens before it: each part's prompt is the first part, what
    every part before it wrote but its last token, and the parts given since (the deployment
    finds all but the newest in its prefix cache: the same salt). Its outputs are the in-process
    request's: a part's end one output with its finish reason, its stop token, its tokens, and
    the engine's counts (the first part's cached and prompt tokens; what all parts wrote); the
    request's end ``finished``. One part may wait beside the one running (``offer``)."""

    def __init__(self, engine: CompletionsEngine, prompt: list[int], salt: str, sampling: Sampling, request_id: str, resumable: bool) -> None:
        self.engine = engine
        self.salt = salt
        self.request_id = request_id
        self.context: list[int] = []  # what the deployment was given and kept so far
        self._waiting: collections.deque[tuple[list[int], Sampling]] = collections.deque([(list(prompt), sampling)])
        self._given = asyncio.Event()  # a part given, or the end
        self._taken = asyncio.Event()  # the part waiting was taken
        self._ending = not resumable  # no more parts after those given
        self._done = False
        self._chunks: AsyncIterator[dict[str, Any]] | None = None
        self._pending: list[Output] = []
        self._part: list[int] = []  # the running part's tokens
        self._end: Output | None = None  # the running part's last output, held until its usage comes
        self._usage = Output()
        self._written = 0
        self._parts = 0

    def __aiter__(self) -> _CompletionsRequest:
        return self

    async def __anext__(self) -> Output:
        while not self._pending:
            if self._done:
                raise StopAsyncIteration
            if self._chunks is None:
                await self._start()
                continue
            try:
                chunk = await anext(self._chunks)
            except StopAsyncIteration:
                self._pending.append(self._ended())
                continue
            for out in _outputs(chunk):
                if out.cached is not None or out.prompt is not None or out.total is not None:
                    self._usage = out  # (the part's usage: it comes after its last token)
                    continue
                self._part += list(out.tokens)
                self._written += out.count
                if out.finish_reason is not None:
                    self._end = out
                else:
                    self._pending.append(out)
        return self._pending.pop(0)

    async def _start(self) -> None:
        """The next part's request, once it is given (or the request's end)."""
        while not self._waiting and not self._ending:
            self._given.clear()
            await self._given.wait()
        if not self._waiting:
            self._done = True
            self._pending.append(Output(finished=True))
            return
        ids, sampling = self._waiting.popleft()
        self._taken.set()
        self.context += ids
        self._part, self._end, self._usage = [], None, Output()
        self._chunks = self.engine.stream(list(self.context), self.salt, sampling)

    def _ended(self) -> Output:
        """The running part's end: the output that ended it, with the part's counts."""
        end, first = self._end or Output(finish_reason="stop"), self._parts == 0
        self._parts += 1
        self.context += self._part[:-1]  # (its last sampled token dropped, as vLLM's streaming input does)
        self._chunks = None
        finished = self._ending and not self._waiting
        self._done = finished
        u = self._usage
        return Output(
            end.text, end.tokens, end.count, end.finish_reason, finished, end.stop,
            cached=u.cached if first else None, total=self._written, prompt=u.prompt if first else None, top=end.top,
        )

    async def give(self, ids: list[int], sampling: Sampling) -> None:
        while not self.offer(ids, sampling):
            if self._ending or self._done:
                raise RuntimeError("the request takes no more parts")
            self._taken.clear()
            await self._taken.wait()

    def offer(self, ids: list[int], sampling: Sampling) -> bool:
        if self._waiting or self._ending or self._done:
            return False
        self._waiting.append((list(ids), sampling))
        self._given.set()
        return True

    async def end(self) -> None:
        self._ending = True
        self._given.set()

    async def close(self) -> None:
        self._done, self._ending = True, True
        self._pending.clear()
        self._given.set()
        self._taken.set()
        if self._chunks is not None:
            with contextlib.suppress(Exception):
                await self._chunks.aclose()  # type: ignore[attr-defined]
            self._chunks = None


def _outputs(chunk: dict[str, Any]) -> list[Output]:
    """One streamed chunk as outputs: its usage (the engine's own counts), then each text piece
    (its token ids where asked, ``return_token_ids``; else one token each: vLLM streams a
    completion token by token), with the stop token that ended it."""
    out: list[Output] = []
    usage = chunk.get("usage")
    if usage:
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        out.append(Output(cached=cached, total=usage.get("completion_tokens") or None, prompt=usage.get("prompt_tokens") or None))
    for choice in chunk.get("choices") or ():
        top = None
        for entry in (choice.get("logprobs") or {}).get("top_logprobs") or ():
            top = {int(name.removeprefix("token_id:")): float(lp) for name, lp in (entry or {}).items()}
        text = choice.get("text") or ""
        reason = choice.get("finish_reason")
        ids = choice.get("token_ids")
        tokens: Sequence[int] = [int(t) for t in ids] if isinstance(ids, list) else ()
        stop = choice.get("stop_reason")
        stop = stop if reason == "stop" and isinstance(stop, int) and not isinstance(stop, bool) else None
        if text or reason or top or tokens:
            count = len(tokens) if ids is not None else (1 if text else 0)
            out.append(Output(text, tokens, count, finish_reason=reason, finished=reason is not None, stop=stop, top=top))
    return out


class CompletionsEngine:
    """A remote ``vllm serve`` of the same model (pipelines/remote.py): prompts rendered here (the
    same token ids, so the deployment's prefix cache sees the same prefixes), sent with this
    session's ``cache_salt``."""

    in_process = False

    def __init__(self, options: Settings) -> None:
        self.served_model = options.served_model
        self.remote = RemoteEngine(options.remote)

    async def start(self, model_path: str, progress: Callable[[str], Any]) -> None:
        await self.remote.start()

    async def stop(self) -> None:
        await self.remote.stop()

    @property
    def healthy(self) -> bool:
        return self.remote.healthy

    @property
    def failed(self) -> str | None:
        return None  # a remote deployment comes back on its own: unhealthy until it does

    def request(self, prompt: list[int], salt: str, sampling: Sampling, request_id: str, resumable: bool = False) -> _CompletionsRequest:
        return _CompletionsRequest(self, prompt, salt, sampling, request_id, resumable)

    async def prompt_logprobs(self, prompt: list[int], salt: str) -> list[float | None]:
        """The prompt echoed with its tokens' logprobs (vLLM's ``echo``: the first chunk's)."""
        body = self.body(prompt, salt, Sampling(max_tokens=1)) | {"echo": True, "logprobs": 0}
        found: list[float | None] = []
        async for chunk in self.remote.stream(body, path="/completions"):
            for choice in chunk.get("choices") or ():
                given = (choice.get("logprobs") or {}).get("token_logprobs") or []
                if not found and len(given) >= len(prompt):
                    found = [None if lp is None else float(lp) for lp in given[: len(prompt)]]
        return found

    def stream(self, prompt: list[int], salt: str, sampling: Sampling) -> AsyncIterator[dict[str, Any]]:
        """The deployment's streamed chunks of a completion of ``prompt``, its tokens' ids with them."""
        return self.remote.stream(self.body(prompt, salt, sampling, token_ids=True), path="/completions")

    def body(self, prompt: list[int], salt: str, s: Sampling, token_ids: bool = False) -> dict[str, Any]:
        """The completions request for ``prompt``, sampled with ``s`` (vLLM's own parameters beside
        OpenAI's: ``repetition_penalty``, ``structured_outputs``, ``ignore_eos``, token ids named;
        ``token_ids``: the ids of the tokens written returned with their text)."""
        body: dict[str, Any] = {"prompt": prompt, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": s.max_tokens, "temperature": s.temperature, "cache_salt": salt}
        optional = {
            "model": self.served_model,
            "repetition_penalty": s.repetition_penalty,
            "seed": s.seed,
            "stop": list(s.stop) or None,
            "stop_token_ids": list(s.stop_token_ids) or None,
            "allowed_token_ids": list(s.allowed_token_ids) if s.allowed_token_ids is not None else None,
            "logit_bias": dict.fromkeys(map(str, s.banned), -100) if s.banned else None,
            "structured_outputs": {"json": s.schema} if s.schema else None,
            "ignore_eos": s.ignore_eos or None,
            "logprobs": s.logprobs,
            "return_tokens_as_token_ids": True if s.logprobs is not None else None,
            "return_token_ids": token_ids or None,
        }
        body.update({key: value for key, value in optional.items() if value is not None})
        return body

    def stats(self) -> dict[str, float]:
        return self.remote.stats()


def engine(options: Settings) -> Engine:
    """The engine ``options`` name."""
    return CompletionsEngine(options) if options.engine == "remote" else VllmEngine(options)
