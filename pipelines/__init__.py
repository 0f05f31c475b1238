"""Model pipelines, by config ``kind``. Each module exposes ``create(options) -> Pipeline`` and is
imported only when chosen, so a server never imports engines it does not run."""

from __future__ import annotations

import importlib
from typing import Any

from pipelines.base import Pipeline, TurnModel

KINDS = {
    "synthetic": "pipelines.synthetic",
    "cascade": "pipelines.cascade.pipeline",
    "omni": "pipelines.omni.pipeline",
}


def create(kind: str, options: dict[str, Any]) -> Pipeline:
    try:
        module = KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown pipeline kind {kind!r}; known: {', '.join(sorted(KINDS))}") from None
    return importlib.import_module(module).create(options)


def turn_model(name: str, threads: int = 1) -> TurnModel:
    """semantic_vad's end-of-turn model on the sound, by name (not loaded yet: ``load()`` it in a
    worker thread); the turn-end policy (pipelines/turn_end/policy.py) weighs its verdict."""
    from pipelines.turn_end.smart_turn import create as create_turn_model

    return create_turn_model(name, threads)
