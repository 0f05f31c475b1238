"""The embedded CPU voice agent: Moonshine or Whisper (ears) -> a small LLM on vLLM (thinker) -> Piper (voice).

The room's contract is the pipeline contract of ``pipelines/base.py``: ``pipeline.create(options)``
gives a ``CascadePipeline`` (``kind: cascade`` in a config); each client session opens a
``CascadeSession``. Inside:

- ``pipeline.py``: the shared models and worker threads, the accounting, the speed self-check;
  ``shared.py``: the options, and ``Models``, the port through which sessions use the pipeline;
- ``session.py``: a client session: the open turn, the streamed prompt, answering ahead at pauses,
  the transcripts; ``hearing.py``: what it hears at each pause (the words and the thinker's
  judgement of them, within the turn-end policy's bound); ``production.py``: one answer's stage
  chain (thinker -> clauses -> talker); ``prompts.py``: the conversation as the thinker's prompt;
- ``listener.py``: what every listener gives (``Words``), Whisper on CTranslate2; ``moonshine.py``: Moonshine; ``thinker.py``: the LLM's side (its tokenizer, its prompts, one
  loop reading its answers, its streamed requests and its judgement of a turn's words) over
  ``engines.py``, the engine port and its adapters (vLLM in process, a remote ``vllm serve``);
  ``talker.py``: Piper, and where a spoken answer's clauses are cut;
- ``calls/``: tool calls: the thinker's own call format parsed as it streams, calls written by steering
  the engine with values copied from what was said, and whether their values were said.

Nothing outside this room imports these modules but the registry (``pipelines/__init__.py``), the
benches and the tests.
"""
