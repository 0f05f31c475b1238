"""Conversations to replay: a built-in set spoken locally at run time, or recorded WAV files.

Built-in (``--dataset builtin``): multi-turn conversations with known text, spoken by espeak-ng in
a few voices and speeds, and by Piper (the "joe" voice) when piper-tts is installed. Every
``barge_in_every``-th turn (``--barge-in-every``) is spoken over the previous answer.

A recorded dataset is a directory with one folder per conversation::

    DIR/
      booking/
        01.wav  01.txt      # one user turn: mono 16-bit WAV (any rate) and what it says
        02.wav  02.txt
        conversation.json   # optional: {"barge_in": [2]} -> turn 2 interrupts answer 1
      support-call/
        ...

Turns play in file-name order. The text is what input-transcript WER is scored against.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dsp.resample import resample

from .audio import espeak, read_wav

RATE = 24000  # what the harness streams (pcm16 24 kHz, the Realtime API default)

SCRIPTS = [
    ["Hi there, how are you today?", "What is the capital of France?", "What is it famous for?", "Thank you, that was helpful."],
    ["Can you recommend a good book?", "Is it a long read?", "What else did the author write?", "Great, I will look for it."],
    ["What should I cook for dinner tonight?", "I have rice and some vegetables.", "How long will that take?", "Sounds good, thanks."],
    ["How far away is the moon?", "How long would it take to fly there?", "Has anyone been there recently?", "That is amazing."],
    ["I need to book a table for two.", "Tomorrow at seven in the evening.", "Can we sit by the window?", "Perfect, see you then."],
    ["Tell me a fun fact about cats.", "Why do they purr?", "Do dogs do something similar?", "Thanks for the facts."],
]
ESPEAK_VOICES = [("en-us", 160), ("en-gb", 150), ("en-us", 185), ("en-gb", 170)]


@dataclass
class Turn:
    text: str
    audio: np.ndarray  # int16 mono at RATE
    barge_in: bool = False  # spoken over the previous answer, while it plays


@dataclass
class Conversation:
    name: str
    turns: list[Turn]


def _piper():  # type: ignore[no-untyped-def]
    try:
        from pipelines import models
        from pipelines.cascade.talker import PiperTalker

        folder = models.path("piper-joe")
        onnx = next(folder.glob("*.onnx"))
        return PiperTalker(str(onnx), str(onnx) + ".json", threads=1)
    except Exception:
        return None


def builtin(conversations: int = 6, barge_in_every: int = 0, piper: bool = True) -> list[Conversation]:
    """``conversations`` conversations (cycling through the scripts and voices)."""
    talker = _piper() if piper else None
    out = []
    for i in range(conversations):
        script = SCRIPTS[i % len(SCRIPTS)]
        use_piper = talker is not None and i % 3 == 2
        voice, wpm = ESPEAK_VOICES[i % len(ESPEAK_VOICES)]
        turns = []
        for k, text in enumerate(script):
            if use_piper:
                pcm = resample(talker.speak(text), talker.rate, RATE)
            else:
                pcm = espeak(text, RATE, voice=voice, wpm=wpm)
            barge = bool(barge_in_every) and k > 0 and k % barge_in_every == 0
            turns.append(Turn(text, pcm, barge))
        out.append(Conversation(f"builtin-{i:02d}-{'piper' if use_piper else voice}", turns))
    return out


def from_directory(root: Path) -> list[Conversation]:
    if not root.is_dir():
        raise FileNotFoundError(f"dataset directory not found: {root}")
    out = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        meta = json.loads((folder / "conversation.json").read_text()) if (folder / "conversation.json").exists() else {}
        barge = set(meta.get("barge_in", []))
        turns = []
        for k, wav in enumerate(sorted(folder.glob("*.wav")), 1):
            pcm, rate = read_wav(wav)
            txt = wav.with_suffix(".txt")
            text = txt.read_text().strip() if txt.exists() else ""
            turns.append(Turn(text, resample(pcm, rate, RATE), k in barge))
        if turns:
            out.append(Conversation(folder.name, turns))
    if not out:
        raise ValueError(f"no conversations (folders of NN.wav + NN.txt) in {root}")
    return out


def load(name: str, conversations: int = 6, barge_in_every: int = 0) -> list[Conversation]:
    if name == "builtin":
        return builtin(conversations, barge_in_every)
    if name == "builtin-espeak":
        return builtin(conversations, barge_in_every, piper=False)
    return from_directory(Path(name))
