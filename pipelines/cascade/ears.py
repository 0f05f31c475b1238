"""The cascade's ears by name: the listener for a model of ``realtime-omni models``."""

from __future__ import annotations

from pipelines.cascade.listener import Listener


def open_listener(name: str, model_dir: str, threads: int = 2) -> Listener:
    """The listener for ``name`` (its prepared directory ``model_dir``): Moonshine's or Whisper's."""
    if name.startswith("moonshine"):
        from pipelines.cascade.moonshine import MoonshineListener

        return MoonshineListener(model_dir, threads)
    from pipelines.cascade.listener import WhisperListener

    return WhisperListener(model_dir, threads)
