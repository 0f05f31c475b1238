"""Does input noise reduction help the transcriber? Word error rate with it off and on.

Spoken sentences (Piper's voice "joe", a neural voice, and espeak-ng's formant voices) are mixed with noise at a set signal-to-noise ratio and
transcribed by the agent's own Whisper (tiny.en): as they are, after RNNoise alone, and after
RNNoise with ``KEEP`` of the original mixed back in (``dsp/denoise.py``; the blend is what
``audio.input.noise_reduction`` turns on). The noises, made at run time:

    babble   six other speakers (espeak-ng voices) talking at once, as in a cafe
    fan      sox's brown noise through a low-pass filter, with a slow wobble: a fan or an engine
    white    sox's white noise: hiss

SNR is speech power (over the speech itself) to noise power. Reported: WER per noise and SNR, off
and on, the clean WER for reference, and RNNoise's cost (ms of CPU per second of audio).

    python -m bench.noise [--snr 10 5] [--sentences 24] [--voice piper|espeak]

Needs sox (apt-get install sox). Results go to bench/results/noise-*.json.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.audio import espeak, read_wav, speech_bounds
from bench.common import machine, save
from bench.metrics import wer
from dsp import denoise
from dsp.resample import resample

RATE = 16000
KEEP = 0.5  # the share of the original audio mixed back into RNNoise's output
VOICES = ("en-us", "en-gb", "en-us+f3")
SENTENCES = [
    "What is the weather going to be like tomorrow morning?",
    "Please book a table for four people at seven o'clock.",
    "How long does it take to drive from Berlin to Munich?",
    "Can you remind me to call my sister this evening?",
    "I would like to order a large pizza with mushrooms.",
    "What time does the train to London leave?",
    "Turn off the lights in the living room please.",
    "How many grams of sugar are in a spoonful?",
    "My flight has been cancelled and I need a new one.",
    "Tell me a short story about a brave little dog.",
    "What is the capital city of Australia?",
    "Send a message to Peter saying I will be late.",
    "How do I reset the password on my account?",
    "The package was supposed to arrive on Monday.",
    "Is it going to rain in Paris this weekend?",
    "Play some relaxing music in the kitchen.",
    "What is the difference between a frog and a toad?",
    "I lost my keys somewhere in the garden yesterday.",
    "How much does a ticket to the museum cost?",
    "Could you explain how a rainbow is formed?",
    "Add milk, eggs and bread to my shopping list.",
    "Where is the nearest pharmacy that is open now?",
    "Set an alarm for six thirty tomorrow.",
    "What was the score of the football match last night?",
]
BABBLE = [
    "The meeting has been moved to Thursday afternoon because of the holiday.",
    "She told me that the new restaurant downtown serves excellent noodles.",
    "We should probably leave early if we want to avoid the traffic on the bridge.",
    "My brother bought a second hand bicycle and painted it bright red.",
    "Nobody expected the concert to sell out within the first ten minutes.",
    "If you keep the receipt you can return the jacket within thirty days.",
]


def sox_noise(kind: str, seconds: float) -> np.ndarray:
    effects = {"fan": ["brownnoise", "lowpass", "600", "tremolo", "0.7", "30"], "white": ["whitenoise"]}[kind]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "noise.wav"
        cmd = ["sox", "-n", "-r", str(RATE), "-c", "1", "-b", "16", str(out), "synth", f"{seconds:.2f}", effects[0], *effects[1:]]
        subprocess.run(cmd, check=True, capture_output=True)
        pcm, _ = read_wav(out)
    return pcm


def babble(seconds: float, rng: np.random.Generator) -> np.ndarray:
    n = int(seconds * RATE)
    mix = np.zeros(n, np.float64)
    voices = ("en-us", "en-gb", "en-us+f3", "en-us+m3", "en-gb+f4", "en-us+m7")
    for k, text in enumerate(BABBLE):
        speech = espeak(text, RATE, voice=voices[k % len(voices)], wpm=150 + 10 * k).astype(np.float64)
        loop = np.tile(speech, n // len(speech) + 2)
        start = int(rng.integers(0, len(speech)))
        mix += loop[start : start + n]
    return mix


def mix(speech: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    bounds = speech_bounds(speech)
    active = speech[bounds[0] : bounds[1]] if bounds else speech
    p_speech = float(np.mean(active.astype(np.float64) ** 2))
    noise = noise[: len(speech)].astype(np.float64)
    p_noise = float(np.mean(noise**2)) or 1.0
    scaled = noise * np.sqrt(p_speech / (p_noise * 10 ** (snr_db / 10)))
    return np.clip(np.round(speech + scaled), -32768, 32767).astype(np.int16)


def piper_voice() -> Any:
    from pipelines import models
    from pipelines.cascade.talker import PiperTalker

    onnx = next(models.ensure("piper-joe", print).glob("*.onnx"))
    return PiperTalker(str(onnx), str(onnx) + ".json")


def fixtures(count: int, voice: str) -> list[tuple[str, np.ndarray]]:
    out = []
    piper = piper_voice() if voice == "piper" else None
    for k, text in enumerate(SENTENCES[:count]):
        speech = resample(piper.speak(text), piper.rate, RATE) if piper else espeak(text, RATE, voice=VOICES[k % len(VOICES)])
        pad = np.zeros(RATE // 2, np.int16)  # half a second of noise alone either side
        out.append((text, np.concatenate([pad, speech, pad])))
    return out


def run(snrs: list[float], count: int, voice: str, seed: int = 0) -> dict[str, Any]:
    from pipelines import models
    from pipelines.cascade.listener import WhisperListener

    ears = WhisperListener(str(models.ensure("whisper-tiny.en", print)), 2, 1)
    rng = np.random.default_rng(seed)
    items = fixtures(count, voice)
    total_s = sum(len(p) for _, p in items) / RATE
    result: dict[str, Any] = {"machine": machine(), "voice": voice, "sentences": len(items), "audio_s": round(total_s, 1), "conditions": {}}

    def score(clips: list[np.ndarray]) -> float:
        return round(float(np.mean([wer(text, ears.transcribe(c)) for (text, _), c in zip(items, clips)])), 4)

    result["clean"] = score([p for _, p in items])
    cpu = 0.0
    for kind in ("babble", "fan", "white"):
        for snr in snrs:
            noisy = []
            for _, pcm in items:
                seconds = len(pcm) / RATE + 0.1
                noise = babble(seconds, rng) if kind == "babble" else sox_noise(kind, seconds)
                noisy.append(mix(pcm, noise, snr))
            t = time.process_time()
            cleaned = [denoise.denoise(c, RATE) for c in noisy]
            cpu += time.process_time() - t
            blended = [denoise.denoise(c, RATE, keep=KEEP) for c in noisy]
            name = f"{kind}@{snr:g}dB"
            result["conditions"][name] = row = {"off": score(noisy), "rnnoise": score(cleaned), "blend": score(blended)}
            print(f"  {name:14} WER off {row['off']:.3f}  rnnoise {row['rnnoise']:.3f}  blend {row['blend']:.3f}", flush=True)
    result["rnnoise_cpu_ms_per_audio_s"] = round(1000 * cpu / (total_s * 3 * len(snrs)), 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--snr", type=float, nargs="+", default=[10.0, 5.0])
    parser.add_argument("--sentences", type=int, default=len(SENTENCES))
    parser.add_argument("--voice", choices=["piper", "espeak"], default="piper")
    args = parser.parse_args()
    result = run(args.snr, args.sentences, args.voice)
    print(f"clean WER {result['clean']:.3f}; RNNoise {result['rnnoise_cpu_ms_per_audio_s']} ms CPU per s of audio")
    print(f"{'condition':14} {'off':>8} {'rnnoise':>8} {'blend':>8}   (WER; blend = RNNoise + {KEEP:g} of the original)")
    for name, c in result["conditions"].items():
        print(f"{name:14} {c['off']:>8.3f} {c['rnnoise']:>8.3f} {c['blend']:>8.3f}")
    for col in ("off", "rnnoise", "blend"):
        result[f"mean_{col}"] = round(float(np.mean([c[col] for c in result["conditions"].values()])), 4)
    print(f"{'mean':14} {result['mean_off']:>8.3f} {result['mean_rnnoise']:>8.3f} {result['mean_blend']:>8.3f}")
    print("saved", save("noise", result))


if __name__ == "__main__":
    main()
