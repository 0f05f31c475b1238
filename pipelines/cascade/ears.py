"""The cascade's ears by name: the listener for a model of ``realtime-omni models``."""

from __future__ import annotations

from typing import Literal

from pipelines.cascade.listener import Listener


def open_listener(name: str, model_dir: str, threads: int = 2, beam_size: int = 0, window: Literal["fit", "full"] = "fit") -> Listener:
    """The listener for ``name`` (its prepared directory ``model_dir``): Moonshine's or Whisper's
    (``window`` is Whisper's; ``beam_size`` 0: the listener's own, Moonshine's beam where it is
    unsure, Whisper's greedy)."""
    if name.startswith("moonshine"):
        from pipelines.cascade.moonshine import BEAM, MoonshineListener

        return MoonshineListener(model_dir, threads, beam_size or BEAM)
    from pipelines.cascade.listener import WhisperListener

    return WhisperListener(model_dir, threads, beam_size or 1, window=window)
