"""pipelines/speculation.py on its own: the moves of a session's one speculation, driven by hand and
by seeded random sequences checked against a small reference model (what was adopted, what was
counted, and that every production nobody adopted had its work stopped)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pipelines.base import Message, OutputChunk, Part, ResponseRequest, TextDelta
from pipelines.speculation import Ahead, Production, Speculation, SpeculationCounts


class Answer(Production):
    """A production that says its name, then writes on forever; it records being started and stopped."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.started = False
        self.stopped = asyncio.Event()
        super().__init__(self._produce(), 4, f"answer:{name}")

    async def _produce(self) -> AsyncIterator[OutputChunk]:
        self.started = True
        try:
            yield TextDelta(self.name)
            await asyncio.Event().wait()  # an engine still writing
            yield TextDelta("never")
        finally:
            self.stopped.set()


@dataclass(eq=False, kw_only=True)
class Spec(Speculation[Answer]):
    prompt: str
    voided: bool = False

    def void(self) -> None:
        self.voided = True


def counts() -> SpeculationCounts:
    return SpeculationCounts()


def request(*user_ids: str) -> ResponseRequest:
    items = [Message(i, "user", [Part("text", text="hi")]) for i in user_ids]
    return ResponseRequest("resp_1", [*items, Message("a1", "assistant", [Part("text", text="hello")])])


async def first(production: Production) -> str:
    chunk = await anext(production.output)
    assert isinstance(chunk, TextDelta)
    return chunk.text


async def test_a_bound_speculation_is_adopted_by_the_response_for_its_item_and_only_if_it_fits() -> None:
    ahead: Ahead[Spec] = Ahead(counts())
    spec = ahead.start(Spec(production=Answer("p1"), prompt="what time"))
    assert ahead.bind("u1") is spec and ahead.bind("u1") is None  # bound once
    assert await ahead.claim(request("u0")) is None and ahead.current is spec  # another item's response
    claimed = await ahead.claim(request("u0", "u1"))
    assert claimed is spec and ahead.current is None
    production = ahead.settle(spec, spec.prompt == "what time")
    assert production is spec.production and await first(production) == "p1"
    assert ahead.counts.stats() == {"speculations_started": 1, "speculations_adopted": 1, "speculations_discarded": 0}
    await production.cancel()
    await asyncio.wait_for(spec.production.stopped.wait(), 5)


async def test_a_speculation_that_does_not_fit_or_is_dropped_is_voided_and_its_work_stopped() -> None:
    ahead: Ahead[Spec] = Ahead(counts())
    old = ahead.start(Spec(production=Answer("old"), prompt="what"))
    new = ahead.start(Spec(production=Answer("new"), prompt="what time"))  # the user paused again
    assert old.voided and ahead.current is new
    ahead.bind("u1")
    spec = await ahead.claim(request("u1"))
    assert spec is new and ahead.settle(spec, False) is None and new.voided
    await ahead.close()
    assert all(not p.started or p.stopped.is_set() for p in (old.production, new.production))
    assert ahead.counts.stats() == {"speculations_started": 2, "speculations_adopted": 0, "speculations_discarded": 2}


async def test_claim_waits_for_the_production_its_task_is_making() -> None:
    ahead: Ahead[Spec] = Ahead(counts())
    spec = ahead.start(Spec(prompt="x"))
    ready = asyncio.Event()

    async def make() -> None:
        await ready.wait()
        spec.production = Answer("late")

    spec.task = asyncio.create_task(make())
    ahead.bind("u1")
    claim = asyncio.create_task(ahead.claim(request("u1")))
    await asyncio.sleep(0)
    assert not claim.done()
    ready.set()
    assert await asyncio.wait_for(claim, 5) is spec
    production = ahead.settle(spec, True)
    assert production is not None and await first(production) == "late"
    await production.cancel()


async def test_random_moves_agree_with_a_reference_model() -> None:
    """Seeded random sequences of pause / resume / commit / respond / clear, then close: each
    response gets the speculation the reference says it gets, the counts agree, and at the end
    every production but the adopted ones (which their responses stop) has been stopped."""
    for seed in range(40):
        rng = random.Random(seed)
        ahead: Ahead[Spec] = Ahead(counts())
        made: list[Spec] = []
        adopted: list[Spec] = []
        # the reference: the open speculation, its item, and the counts
        ref_open: Spec | None = None
        ref_item: str | None = None
        ref = counts().stats()
        turn = 0
        log = []
        for _ in range(rng.randint(1, 30)):
            move = rng.choice(["pause", "pause", "resume", "commit", "respond", "respond_other", "clear"])
            log.append(move)
            if move == "pause":
                spec = Spec(production=Answer(f"s{len(made)}"), prompt=rng.choice(["a", "b"]))
                made.append(spec)
                ahead.start(spec)
                ref["speculations_started"] += 1
                ref["speculations_discarded"] += ref_open is not None
                ref_open, ref_item = spec, None
            elif move in ("resume", "clear"):
                ahead.drop()
                ref["speculations_discarded"] += ref_open is not None
                ref_open, ref_item = None, None
            elif move == "commit":
                turn += 1
                ahead.bind(f"u{turn}")
                if ref_open is not None and ref_item is None:
                    ref_item = f"u{turn}"
            else:
                item = f"u{turn}" if move == "respond" else f"u{turn + 1}"
                spec = await ahead.claim(request(item))
                expected = ref_open if (ref_open is not None and ref_item == item) else None
                assert spec is expected, (seed, log)
                if spec is not None:
                    fits = spec.prompt == "a"
                    production = ahead.settle(spec, fits)
                    assert (production is spec.production) == fits, (seed, log)
                    ref["speculations_adopted" if fits else "speculations_discarded"] += 1
                    if fits:
                        adopted.append(spec)
                    ref_open, ref_item = None, None
            assert ahead.current is ref_open and ahead.counts.stats() == ref, (seed, log)
        await ahead.close()
        for spec in adopted:  # the response that adopted it stops it when it is done
            await spec.production.cancel()
        for spec in made:  # its work ended, or never began
            assert not spec.production.started or spec.production.stopped.is_set(), (seed, log)
        assert all(s.voided for s in made if s not in adopted), (seed, log)
