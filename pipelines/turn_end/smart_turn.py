"""Smart Turn v3.2 (Daily, BSD-2-Clause): an end-of-turn classifier on the audio of a turn.

A Whisper-tiny-sized encoder with a classification head, exported to ONNX (about 8 MB, int8). It
takes the last 8 s of the turn at 16 kHz (shorter turns are padded with silence in front) as
Whisper log-mel features of the zero-mean, unit-variance waveform (dsp/logmel.py) and gives the
probability that the speaker has finished. Intonation, a trailing "and...", a filled pause: it
hears what a fixed silence cannot. The turn-end policy (``policy.py``) fuses it with what the
pipeline heard of the turn (its words, and the thinker's judgement of them) and the silence: on
synthetic speech, where the prosody the model listens for is weak, and on people's, the words carry
most of the answer.

The file comes out of the ``pipecat-ai`` wheel (``realtime-omni models prepare``, see
pipelines/models/__init__.py); pipecat itself is never imported. Inference runs in one worker thread per
server, on ``threads`` ONNX Runtime threads, once per pause of a speaker, never on the event loop.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dsp.logmel import RATE, log_mel
from dsp.resample import resample
from pipelines.base import TurnModel, TurnVerdict

if TYPE_CHECKING:
    import onnxruntime as ort

WINDOW_S = 8  # the model's input: the last 8 s of the turn
MODEL = "smart-turn-v3.2"


class SmartTurn(TurnModel):
    name = MODEL

    def __init__(self, path: Path | None = None, threads: int = 1) -> None:
        self.path = path
        self.threads = threads
        self._session: ort.InferenceSession | None = None
        self._input = "input_features"
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="smart-turn")
        self.decisions = 0
        self.cpu_ms_total = 0.0

    def load(self) -> None:
        import onnxruntime as ort

        if self._session is not None:
            return
        if self.path is None:
            from pipelines import models

            self.path = models.ensure(MODEL) / f"{MODEL}-cpu.onnx"
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        self._input = self._session.get_inputs()[0].name
        self.probability(np.zeros(RATE, np.int16), RATE)  # the first run pays one-time costs

    @staticmethod
    def features(pcm: np.ndarray, rate: int) -> np.ndarray:
        """(1, 80, 800) model input of a turn's int16 audio at ``rate``."""
        pcm = resample(pcm[-WINDOW_S * rate :], rate, RATE)
        x = pcm.astype(np.float32) / 32768.0
        x = x[-WINDOW_S * RATE :]
        x = np.pad(x, (WINDOW_S * RATE - len(x), 0))
        return log_mel(x, normalize=True)[None]

    def probability(self, pcm: np.ndarray, rate: int) -> float:
        """The verdict, computed here (blocking)."""
        assert self._session is not None, "load() first"
        out = self._session.run(None, {self._input: self.features(pcm, rate)})[0]
        return float(np.asarray(out).reshape(-1)[0])

    def _decide(self, pcm: np.ndarray, rate: int) -> TurnVerdict:
        start = time.thread_time()
        p = self.probability(pcm, rate)
        cpu_ms = (time.thread_time() - start) * 1000.0
        self.decisions += 1
        self.cpu_ms_total += cpu_ms
        return TurnVerdict(p, cpu_ms)

    async def judge(self, pcm: np.ndarray, rate: int) -> TurnVerdict:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._decide, pcm, rate)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._session = None


def create(model: str, threads: int = 1) -> TurnModel:
    if model != MODEL:
        raise ValueError(f"unknown end-of-turn model {model!r}; known: {MODEL}")
    return SmartTurn(threads=threads)
