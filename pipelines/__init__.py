"""Model pipelines, by config ``kind``. Each pipeline module exposes its options Struct and
``create(options) -> Pipeline``, and is imported only when chosen, so a server never imports
engines it does not run. Importing a pipeline module imports no engine either (vLLM, torch,
Whisper and Piper are imported when the pipeline starts), so a config's options are typed when it
is loaded (``options_type``), before anything heavy runs."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from pipelines.base import Pipeline, TurnModel


@dataclass(frozen=True)
class Kind:
    module: str  # the pipeline module: ``create(options) -> Pipeline``
    options: str  # the name of its options Struct in that module
    # the options that put its model on a remote engine's OpenAI base URL (``serve --engine-url``);
    # None: the pipeline has no engine
    remote_engine: Callable[[str], dict[str, Any]] | None = None


KINDS = {
    "synthetic": Kind("pipelines.synthetic", "SyntheticOptions"),
    # the thinker (the LLM) is the cascade's only part that runs on an engine
    "cascade": Kind("pipelines.cascade.pipeline", "CascadeOptions", lambda url: {"thinker": {"engine": "remote", "remote": {"url": url}}}),
    "omni": Kind("pipelines.omni.pipeline", "OmniOptions", lambda url: {"engine": "remote", "remote": {"url": url}}),
}


class UnknownKind(ValueError):
    def __init__(self, kind: object) -> None:
        super().__init__(f"unknown pipeline kind {kind!r}; known: {', '.join(sorted(KINDS))}")


def _kind(kind: str) -> Kind:
    try:
        return KINDS[kind]
    except (KeyError, TypeError):
        raise UnknownKind(kind) from None


def options_type(kind: str) -> type[msgspec.Struct]:
    """The options Struct of pipelines of ``kind`` (its module imported, no engine started)."""
    entry = _kind(kind)
    options: type[msgspec.Struct] = getattr(importlib.import_module(entry.module), entry.options)
    return options


def remote_engine(kind: str, url: str) -> dict[str, Any]:
    """The options (to merge into a config's) that run a ``kind`` pipeline's model on the remote
    engine at ``url``; ValueError for a pipeline with no engine."""
    entry = _kind(kind)
    if entry.remote_engine is None:
        raise ValueError(f"a {kind} pipeline has no engine to point at a URL")
    return entry.remote_engine(url)


def create(kind: str, options: msgspec.Struct | None = None) -> Pipeline:
    """A pipeline of ``kind`` with its typed ``options`` (``options_type(kind)``; None: its defaults)."""
    expected = options_type(kind)
    if options is None:
        options = expected()
    if not isinstance(options, expected):
        raise TypeError(f"a {kind} pipeline takes {expected.__name__}, not {type(options).__name__}")
    pipeline: Pipeline = importlib.import_module(_kind(kind).module).create(options)
    return pipeline


def turn_model(name: str, threads: int = 1) -> TurnModel:
    """semantic_vad's end-of-turn model on the sound, by name (not loaded yet: ``load()`` it in a
    worker thread); the turn-end policy (pipelines/turn_end/policy.py) weighs its verdict."""
    from pipelines.turn_end.smart_turn import create as create_turn_model

    return create_turn_model(name, threads)
