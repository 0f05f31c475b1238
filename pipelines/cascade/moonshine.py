"""The Moonshine listener: Moonshine Base English (Useful Sensors / Moonshine AI, MIT) on the project's
own onnxruntime, the CPU agent's ears.

Unlike Whisper, Moonshine has no 30-second window: its encoder takes the clip as it is, so a short
question costs little, and the cost grows with what was said. The weights come from the publisher's
``moonshine-cpp`` package as ``.ort`` files; ``models prepare`` reads them back into ONNX, computes
their int8 -> float arithmetic once and splits the merged decoder into its two branches
(``pipelines/models/moonshine.py``), so each step runs plain float matmuls.

**Hearing as the words grow.** ``hear`` takes the tokens of an earlier pass over the same turn
(``hint``: the turn heard a few hundred milliseconds before). The decoder reads them all in one pass
(teacher forcing) and keeps the longest run of them that it would have written itself (greedy, token
by token: the same argmax), then decodes on from there. Greedily, the result is exactly what a pass
from nothing writes; with the beam (below), what a beam from the kept tokens writes. Either way a
turn heard while it is spoken leaves only its last words to decode at the pause. The encoder still reads the whole clip each time (its attention spans the clip).

**A lead of silence.** Each clip is heard after ``LEAD_S`` of digital silence: on the bench's
requests that took the word error rate from 0.174 to 0.154.

**Long clips in parts.** A clip over ``PART_S`` is heard in parts cut at a quiet moment (Moonshine
was trained on short clips: 30 s of one speaker came back as no words at all).

**Not empty unless sure.** At the first step the end of the text must beat the likeliest word by
``EMPTY_MARGIN``: Moonshine sometimes ends a clip of clear speech before its first word. And a clip
that comes back empty though its end is loud (cut in a word or right after one) is heard again with
``AGAIN_TRAIL_S`` of silence after it ("Good morning!" cut at its last word: empty, then right).

**Words first.** Before some clips cut right at their last word (the pass taken when the user goes
quiet) Moonshine writes a list's number ("1. What is 12 times 7?", once "8." alone), and some clips
it quotes whole ("\"'How many days are there in a week?'"): where the likeliest first token is a
quote mark, or a number the decoder would follow with a full stop, the likeliest first token that
begins a word is taken instead (nobody says a list's number or a quote mark; a number said first
stays a number).

**English letters only.** The tokenizer is a multilingual one (Cyrillic, CJK, and byte pieces of any
character): its tokens that hold a letter of another script, and its lone bytes (pieces of a character
it has no token for), are never written (Latin letters with accents, dashes, curly quotes, "€" and
"°" are tokens of their own, and stay). An espeak "What are one hundred euros in yen?" cut 40 ms
after the speech came back "我們呢, 呢, 呢", greedily and with the beam; now "1001, 1001, 1001," and
"¶¶ ¶¶ ¶¶": a clip this model does not hear (cut elsewhere, through the server, it heard it word for
word), but no words of a language the thinker would answer in.

**Bounded.** At most ``TOKENS_PER_S`` tokens per second of audio (plus a few): v1 models can repeat
themselves on short or noisy clips, and a pass over 30 s of one speaker or over noise must not run
away; ``unloop`` cuts a sentence said twice.

**A beam where it is unsure.** Greedy decoding takes each likeliest token and is stuck with it:
"Lisbon" came out "lesbians", "Give Peter a call" "Give the giraffe out". After the hint's tokens
the decoder agrees with, up to ``beam`` hypotheses go on side by side in one batch, each dropped
once it falls ``BEAM_NATS`` behind the best, and the likeliest whole transcript is taken; where the
decoder is sure that is one hypothesis, and costs what greedy does. A turn heard as it is spoken
keeps what the passes before agreed on, so the pause's pass searches only its last words (searching
from the hint's first unsure token instead cost 28 ms more at the median through the server, for
the same word error rate, 2026-11-29). Measured: see ``BEAM``.

**Keywords.** A session's ``audio.input.transcription.keywords`` (names, towns) reach the beam
(``keywords.py``): a hypothesis that writes one scores more, and the beam keeps its likeliest
hypotheses as they are beside those the keywords rank first. With keywords there is always a beam,
``BEAM`` wide at least (a greedy listener told keywords searches too: one hypothesis and its
gains did not reach "Oslo" from "our slope"). A name heard that sounds as a keyword is spelt
("John", a keyword "Jon") is then written the keyword's way (``keywords.respell``).

``hear(..., ends=True)`` also says how sure the decoder is that the words end where it stopped
them, from its own distributions, as ``WhisperListener`` does: P(the last word) x P(an end mark or
the end of the text right after it).
"""

from __future__ import annotations

import math
import unicodedata
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

import numpy as np

from pipelines.cascade.keywords import NOTHING, Expected, State, respell
from pipelines.cascade.listener import Words, ending, ends_sentence, is_mark, unloop

START, END = 1, 2  # <s>, </s>
TOKENS_PER_S = 6.5  # the publisher's own cap for its v1 models
EXTRA_TOKENS = 4  # a word or two of a clip shorter than a second
MIN_SAMPLES = 1600  # 0.1 s: less is no word (and too short for the encoder's convolutions)
# silence put before every clip: Moonshine Base v1 int8 mishears a clip that starts with its first
# word (bench.ears, 240 espeak requests: WER 0.174 as cut, 0.154 with 0.5 s before, 0.156 with
# 0.25 s either side; 0.5 s after alone made it worse)
LEAD_S = 0.5
# silence put after every clip: none. Digital silence after the words helps the synthetic voices
# and hurts people's speech (2026-11-29, Zen 3): bench.ears offline (its clips keep 300 ms after
# the speech) with 0 / 0.1 / 0.2 / 0.3 s more: Piper's 120 requests WER 0.079 / 0.064 / 0.051 /
# 0.041, espeak en-us 0.163 / 0.159 / 0.156 / 0.158, the human set (11 clips) 0.064 / 0.082 /
# 0.091 / 0.127 (its telephone conversation 0.175 -> 0.300). A clip cut right at its last word
# (the pass when the user goes quiet) is heard worst: Piper's clips so cut 0.228 with none, 0.091
# with 0.3 s (a probe over 70 tool requests), some with a list number written first ("1. What is
# 12 times 7?"). Where people's speech stops losing by it (a pad of the clip's own noise floor?), it
# is worth having; until measured so, 0.
TRAIL_S = 0.0
# ... but a clip that comes back empty while its last 100 ms are loud (``LOUD``) is heard again with
# this much after it: espeak's "Good morning!" cut at its last word, as the pass when the user goes
# quiet cuts it, came back empty (the end 3.2 logits ahead of "Good", as far as over silence), and so
# did the turn through the server; with 0.1 s after, "Good morning." (2026-11-29)
AGAIN_TRAIL_S = 0.1
LOUD = 300.0  # RMS of int16 samples (-40 dBFS): what is louder may be speech
# Moonshine was trained on clips up to ~30 s, and on 30 s of one speaker it wrote nothing at all: a
# longer clip is heard in parts of at most this long, each cut at its quietest 100 ms past 2/3 of it
PART_S = 20.0
# an empty transcript only when the decoder is sure of it: at the first step the end must beat the
# likeliest word by this much (logits), else the word is taken. Two espeak sentences in one clip
# came back empty (the end 0.6 ahead of "The"); silence, noise, a hum, a click: 3.0 to 11.4 ahead.
EMPTY_MARGIN = 2.0
# the beam (``MoonshineListener.beam``): at most this many hypotheses, each within BEAM_NATS of
# the best (log probability); 1: greedy. bench.ears, 2026-11-29, Zen 3 (AVX2), greedy -> this beam:
# offline, clips cut 40 ms after the speech, WER espeak 0.172 -> 0.131, Piper 0.051 -> 0.039, people
# 0.064 -> 0.073 (11 clips: one word), time per clip p50 112 -> 147 ms (espeak, with the cache gathered only
# when a hypothesis moves); through the server
# (espeak, 24 requests), commit -> completed p50 171 -> 214 ms, WER 0.167 -> 0.093. A beam of 6
# within 8: espeak 0.122, Piper 0.035, no slower.
BEAM = 4
BEAM_NATS = 4.0


def read_pieces(path: Path) -> list[bytes]:
    """The publisher's ``tokenizer.bin``: each token's bytes, in id order, each after one byte that
    gives its length. Byte-fallback tokens are the byte itself; "\u2581" marks a space."""
    data = path.read_bytes()
    pieces: list[bytes] = []
    i = 0
    while i < len(data):
        n = data[i]
        if n >= 0x80 or i + 1 + n > len(data):
            raise ValueError(f"{path}: not a tokenizer.bin (entry {len(pieces)} at byte {i})")
        pieces.append(data[i + 1 : i + 1 + n])
        i += 1 + n
    return pieces


class MoonshineListener:
    rate = 16000

    def __init__(self, model_dir: str, threads: int = 2, beam: int = BEAM) -> None:
        import onnxruntime as ort

        folder = Path(model_dir)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # the cores are shared with the thinker and the talker

        def load(name: str) -> ort.InferenceSession:
            return ort.InferenceSession(str(folder / name), options, providers=["CPUExecutionProvider"])

        self.encoder = load("encoder.onnx")
        self.first = load("decoder_first.onnx")  # input_ids (any length) + encoder states -> logits, the cache
        self.next = load("decoder_next.onnx")  # one token + the cache -> logits, the cache
        self.cache_names = [o.name for o in self.first.get_outputs()][1:]  # present.N.{decoder,encoder}.{key,value}
        self.pieces = read_pieces(folder / "tokenizer.bin")
        self.vocabulary = len(self.pieces)  # the logits are wider (32768): the rest are never words
        texts = [self._piece(i) for i in range(self.vocabulary)]  # (each token's text, read once for the sets below)
        words = range(END + 1, self.vocabulary)
        self._marks = frozenset(i for i in words if is_mark(texts[i]))
        self._ends = np.array(sorted(i for i in self._marks if ends_sentence(texts[i])) + [END])
        # the first token's sets (``_opening``)
        self._digits = frozenset(i for i in words if texts[i].strip().isascii() and texts[i].strip().isdigit())
        self._quotes = frozenset(i for i in words if texts[i].strip() and not texts[i].strip().strip("\"'\u201c\u201d\u2018\u2019"))
        self._spaces = frozenset(i for i in words if texts[i] == " ")
        self._stops = frozenset(i for i in words if texts[i].strip() == ".")
        self._words = np.array([i for i in words if texts[i][:1] == " " and texts[i][1:2].isascii() and texts[i][1:2].isalpha()])
        self._foreign = np.array([i for i in words if _foreign(self.pieces[i], texts[i])], np.int64)  # never written (English only)
        by_text: dict[str, list[int]] = defaultdict(list)  # (the keywords' matcher: tokens by their text, in lower case)
        foreign = frozenset(self._foreign.tolist())
        for i in words:
            if i not in foreign:
                by_text[texts[i].lower()].append(i)
        joins = np.array([texts[i][:1].isalnum() for i in range(self.vocabulary)])
        self.expected = lru_cache(maxsize=16)(lambda keywords: Expected(keywords, by_text, joins))  # keywords -> their matcher
        self.words_first = True  # the first token a word where the likeliest opens no words (False: the decoder's own)
        self.beam = beam  # hypotheses where the decoder is unsure (1: greedy)

    def _rows(self, logits: np.ndarray) -> np.ndarray:
        """The decoder's logits (any leading shape) over the vocabulary, foreign tokens at -inf."""
        rows = logits[..., : self.vocabulary]
        rows[..., self._foreign] = -np.inf
        return rows

    def _piece(self, token: int) -> str:
        return self.pieces[token].replace("\u2581".encode(), b" ").decode("utf-8", "replace")

    def decode(self, tokens: list[int] | tuple[int, ...]) -> str:
        text = b"".join(self.pieces[t] for t in tokens if END < t < self.vocabulary)
        return text.replace("\u2581".encode(), b" ").decode("utf-8", "replace").strip()

    def transcribe(self, pcm: np.ndarray) -> str:
        """int16 mono at 16 kHz -> text."""
        return self.hear(pcm, ends=False).text

    def hear(self, pcm: np.ndarray, ends: bool = True, hint: tuple[int, ...] = (), keywords: tuple[str, ...] = ()) -> Words:
        """The words of ``pcm``; ``hint``: the tokens of an earlier pass over its beginning;
        ``keywords``: words to expect (``keywords.py``)."""
        if len(pcm) < MIN_SAMPLES:
            return Words("", None)
        if len(pcm) > PART_S * self.rate:
            cut = _quietest(pcm, int(PART_S * self.rate * 2 / 3), int(PART_S * self.rate), self.rate // 10)
            head, tail = self.hear(pcm[:cut], False, hint, keywords), self.hear(pcm[cut:], ends, (), keywords)
            return Words(f"{head.text} {tail.text}".strip(), tail.ends if tail.text else None, head.tokens + tail.tokens)
        words = self._hear(pcm, ends, hint, keywords, TRAIL_S)
        if not words.text and _loud(pcm[-self.rate // 10 :]):  # (cut in a word, or right after one: heard again)
            return self._hear(pcm, ends, hint, keywords, AGAIN_TRAIL_S)
        return words

    def _hear(self, pcm: np.ndarray, ends: bool, hint: tuple[int, ...], keywords: tuple[str, ...], trail_s: float) -> Words:
        lead, trail = int(LEAD_S * self.rate), int(trail_s * self.rate)
        audio = np.zeros((1, lead + len(pcm) + trail), np.float32)
        audio[0, lead : lead + len(pcm)] = pcm.astype(np.float32) / 32768.0
        states = self.encoder.run(None, {"input_values": audio})[0]
        limit = int(math.ceil(len(pcm) / self.rate * TOKENS_PER_S)) + EXTRA_TOKENS
        hint = tuple(t for t in hint if END < t < self.vocabulary)[: limit - 1]
        tokens, logits = self._decode(states, hint, limit, self.expected(keywords) if keywords else None)
        text = respell(unloop(self.decode(tokens)), keywords)
        return Words(text, ending(tokens, logits, self._marks, self._ends) if ends and text else None, tuple(tokens))

    def _opening(self, first: np.ndarray, states: np.ndarray) -> int:
        """The first token, from its logits ``first``: the likeliest, unless it opens no words: a
        quote mark, or a list's number (a space or a digit the decoder goes on from, greedily,
        with digits and then a full stop). Then the likeliest that begins a word."""
        token = int(first.argmax())
        if not self.words_first:
            return token
        if token in self._quotes:
            return self._word(first)
        if token not in self._spaces and token not in self._digits:
            return token
        ids, after = [START, token], token
        for _ in range(5):  # (a space, then a number of up to four digit tokens)
            out = self.first.run(None, {"input_ids": np.array([ids], np.int64), "encoder_hidden_states": states})
            after = int(self._rows(out[0][0, -1]).argmax())
            if after not in self._digits:
                break
            ids.append(after)
        if len(ids) < 2 + (token in self._spaces) or after not in self._stops:
            return token
        return self._word(first)

    def _word(self, first: np.ndarray) -> int:
        """The likeliest first token that begins a word (a space, then a letter)."""
        return int(self._words[first[self._words].argmax()])

    def _decode(self, states: np.ndarray, hint: tuple[int, ...], limit: int, expected: Expected | None = None) -> tuple[list[int], list[np.ndarray]]:
        """The hint read in one pass, what of it the decoder agrees with kept, then the beam (or
        greedy decoding; the beam, one wide or more, where keywords are ``expected``): the tokens
        and each one's logits (the logits after the last token too, for the end)."""
        out = self.first.run(None, {"input_ids": np.array([[START, *hint]], np.int64), "encoder_hidden_states": states})
        scores = self._rows(out[0][0])
        guesses = scores.argmax(-1)
        guesses[0] = self._opening(scores[0], states)
        kept = 0
        while kept < len(hint) and guesses[kept] == hint[kept]:
            kept += 1
        tokens = list(hint[:kept])
        logits = [scores[i] for i in range(kept + 1)]  # logits[i]: what follows tokens[:i]
        cache = {
            name.replace("present", "past_key_values"): (value[:, :, : kept + 1] if ".decoder." in name else value)
            for name, value in zip(self.cache_names, out[1:])
        }
        token = int(guesses[kept])
        if not tokens and token == END:
            words = np.delete(scores[0], END)
            if scores[0][END] - words.max() < EMPTY_MARGIN:
                token = int(words.argmax()) + (int(words.argmax()) >= END)  # (an index of the row without END)
        if (self.beam > 1 or expected) and not (token == END and not tokens):
            banned = set() if tokens or not self.words_first else {int(scores[0].argmax())} - {token} | self._quotes  # (the openings words first passes over)
            return self._beam(tokens, logits, cache, limit, banned, expected)
        while token != END and len(tokens) < limit:
            tokens.append(token)
            out = self.next.run(None, {"input_ids": np.array([[token]], np.int64), **cache})
            for name, value in zip(self.cache_names, out[1:]):
                if ".decoder." in name:  # (the encoder's part is computed once, by the first pass)
                    cache[name.replace("present", "past_key_values")] = value
            logits.append(self._rows(out[0][0, -1]))
            token = int(logits[-1].argmax())
        return tokens, logits

    def _beam(
        self,
        tokens: list[int],
        logits: list[np.ndarray],
        cache: dict[str, np.ndarray],
        limit: int,
        banned: set[int] | frozenset[int],
        expected: Expected | None = None,
    ) -> tuple[list[int], list[np.ndarray]]:
        """Beam search on from ``tokens`` (``logits``: each one's row and the row after them;
        ``cache``: the decoder's, one row), its first step never a token in ``banned`` nor the end
        of an empty text: the likeliest whole hypothesis, its tokens and rows as ``_decode``'s.
        With keywords ``expected``, a hypothesis scores what they gain it beside its log P."""
        spelt: State = NOTHING
        for t in tokens if expected else ():
            spelt = expected.after(spelt, t)  # type: ignore[union-attr]
        # tokens, rows, score (log P, plus what keywords gained), log P, keywords spelt
        alive: list[tuple[list[int], list[np.ndarray], float, float, State]] = [(tokens, logits, 0.0, 0.0, spelt)]
        done: list[tuple[list[int], list[np.ndarray], float]] = []
        rows = logits[-1][None, :]
        beam = max(self.beam, BEAM) if expected else self.beam  # (a greedy listener told keywords searches too)
        while alive:
            steps = rows - _logsumexp(rows)  # log P of each next token, a row each
            width = min(beam, steps.shape[1])
            grown: list[tuple[float, float, int, int]] = []  # (score, log P, hypothesis, token)
            for b, (toks, hyp_rows, score, logp, spelt) in enumerate(alive):
                if len(toks) >= limit:  # (as long as the clip allows: done as it is)
                    done.append((toks, hyp_rows, score))
                    continue
                row = steps[b]
                if not toks:  # (the first step: an empty text is the greedy pass's call, EMPTY_MARGIN)
                    row = row.copy()
                    row[[END, *banned]] = -np.inf
                scored = expected.gains(spelt, row) if expected else row
                top = {int(t) for t in np.argpartition(-scored, width)[:width]}
                if expected:  # (and the hypotheses without the keywords' help: none crowded out by a keyword begun)
                    top.update(int(t) for t in np.argpartition(-row, width)[:width])
                grown += [(score + float(scored[t]), logp + float(row[t]), b, t) for t in top if np.isfinite(scored[t])]
            kept = self._best(grown, 0, done, alive, beam)
            if expected:  # the likeliest as they are, beside the likeliest with the keywords' gains
                kept += [k for k in self._best(grown, 1, done, alive, beam) if k not in kept]
            if not kept or (done and max(d[2] for d in done) >= max(k[2] for k in kept)):
                break
            parents = [b for b, _, _, _ in kept]
            if parents != list(range(len(alive))):  # (each hypothesis its parent's cache rows; none moved: as they are)
                cache = {name: value[parents] for name, value in cache.items()}
            out = self.next.run(None, {"input_ids": np.array([[t] for _, t, _, _ in kept], np.int64), **cache})
            for name, value in zip(self.cache_names, out[1:]):
                if ".decoder." in name:  # (the encoder's part is the same for every step)
                    cache[name.replace("present", "past_key_values")] = value
            rows = self._rows(out[0][:, -1])
            alive = [
                (alive[b][0] + [t], alive[b][1] + [rows[i]], score, logp, expected.after(alive[b][4], t) if expected else NOTHING)
                for i, (b, t, score, logp) in enumerate(kept)
            ]
        if not done:
            return tokens, logits
        toks, hyp_rows, _ = max(done, key=lambda d: d[2])
        return toks, hyp_rows

    def _best(
        self,
        grown: list[tuple[float, float, int, int]],
        by: int,
        done: list[tuple[list[int], list[np.ndarray], float]],
        alive: list[tuple[list[int], list[np.ndarray], float, float, State]],
        beam: int,
    ) -> list[tuple[int, int, float, float]]:
        """The ``beam`` best of ``grown`` by score (``by`` 0) or log P (1), each within BEAM_NATS of
        the best: (hypothesis, token, score, log P); those that end the text go to ``done``."""
        grown = sorted(grown, key=lambda g: g[by], reverse=True)
        best = grown[0][by] if grown else -np.inf
        kept: list[tuple[int, int, float, float]] = []
        for g in grown:
            score, logp, b, t = g
            if g[by] < best - BEAM_NATS or len(kept) >= beam:
                break
            if t == END:
                done.append((alive[b][0], alive[b][1], score))
            else:
                kept.append((b, t, score, logp))
        return kept


def _foreign(piece: bytes, text: str) -> bool:
    """A token an English listener never writes: a letter of a script other than Latin ("我",
    "ст"), or a lone byte of a character with no token of its own."""
    if len(piece) == 1 and piece[0] >= 0x80:
        return True
    return any(unicodedata.category(c).startswith("L") and not unicodedata.name(c, "").startswith("LATIN") for c in text)


def _logsumexp(rows: np.ndarray) -> np.ndarray:
    top = rows.max(axis=1, keepdims=True)
    return top + np.log(np.exp(rows - top).sum(axis=1, keepdims=True))


def _loud(pcm: np.ndarray) -> bool:
    return len(pcm) > 0 and float(np.sqrt(np.mean(np.square(pcm.astype(np.float64))))) > LOUD


def _quietest(pcm: np.ndarray, start: int, stop: int, window: int) -> int:
    """Where in ``pcm[start:stop]`` the ``window`` of least energy begins (a cut between words)."""
    x = pcm[start:stop].astype(np.float64) ** 2
    energy = np.convolve(x, np.ones(window), mode="valid")
    return start + int(energy[:: window // 4].argmin()) * (window // 4)
