from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.server import ServerThread


def synthetic_config(**options: Any) -> dict[str, Any]:
    limits = options.pop("limits", {})
    session = options.pop("session", {"audio": {"input": {"transcription": {"model": "synthetic"}}}})
    extra = options.pop("server", {})
    return {
        "pipeline": {"kind": "synthetic", "options": options},
        "model": "realtime-omni-test",
        "limits": limits,
        "session": session,
        **extra,
    }


_servers: dict[str, ServerThread] = {}


@pytest.fixture(scope="session")
def make_server() -> Iterator[Any]:
    """Start (once per distinct config) a real server in a thread; stopped at the end of the run."""

    def make(**options: Any) -> ServerThread:
        key = repr(sorted(options.items()))
        if key not in _servers:
            _servers[key] = ServerThread(synthetic_config(**options)).start()
        return _servers[key]

    yield make
    for server in _servers.values():
        server.stop()
    _servers.clear()


@pytest.fixture(scope="session")
def server(make_server: Any) -> ServerThread:
    """The synthetic pipeline at zero latency."""
    return make_server()


@pytest.fixture(scope="session")
def slow_server(make_server: Any) -> ServerThread:
    """Answers with 40 words (9.6 s of audio) paced in real time: a response still running when a
    test interrupts, cancels or abandons it."""
    return make_server(chunk_interval_ms=40, reply=" ".join(["word"] * 40))


@pytest.fixture(scope="session", autouse=True)
def _need_espeak() -> None:
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng is required for the spoken fixtures (apt-get install espeak-ng)")
