"""The stand-ins for vLLM-Omni the omni pipeline is tested against: ``FakeOmniServer`` (a
deployment's OpenAI wire, in a thread), and ``AsyncOmni`` (the in-process engine), which
``ENGINE_CLASS`` names for ``InProcessOptions.engine_class``.

They are also a development tool (``python -m bench fake_omni``) and the engine of
``bench/omni_overhead.py``, so they live in ``bench/``; the tests of the pipeline take them from
here (``tests/pipelines/test_fake_omni.py`` tests the fakes themselves and imports them directly)."""

from bench.fake_async_omni import AsyncOmni, FakeOmniConfig, Timing
from bench.fake_omni import FakeOmniServer, Faults

ENGINE_CLASS = "bench.fake_async_omni:AsyncOmni"

__all__ = ["ENGINE_CLASS", "AsyncOmni", "FakeOmniConfig", "FakeOmniServer", "Faults", "Timing"]
