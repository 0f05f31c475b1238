"""Audio-native omni models (Qwen3-Omni, Qwen2.5-Omni, Ming-Omni) on vLLM-Omni.

The room's contract is the pipeline contract of ``pipelines/base.py``: ``pipeline.create(options)``
gives an ``OmniPipeline`` (``kind: omni`` in a config). Inside:

- ``pipeline.py``: the pipeline and its sessions (history as the prompt prefix, speculation, the
  turn streamed into the engine while the user speaks);
- ``engine.py``: the two engines behind one ``stream(body)``: a remote vLLM-Omni deployment (through
  ``pipelines/remote.py``) or ``AsyncOmni`` in this process (a GPU host).
"""
