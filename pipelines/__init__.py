"""Model pipelines, by config ``kind``. Each module exposes ``create(options) -> Pipeline`` and is
imported only when chosen, so a server never imports engines it does not run."""

from __future__ import annotations

import importlib
from typing import Any

from .base import Pipeline

KINDS = {
    "synthetic": "pipelines.synthetic",
    "cascade": "pipelines.cascade",
    "omni": "pipelines.omni",
}


def create(kind: str, options: dict[str, Any]) -> Pipeline:
    try:
        module = KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown pipeline kind {kind!r}; known: {', '.join(sorted(KINDS))}") from None
    return importlib.import_module(module).create(options)
