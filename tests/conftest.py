from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from realtime_omni import config as config_file
from tests.support.processes import server_process
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
        # a connection a test drops leaves its session for a resume this long (not 30 s): the
        # servers are shared, and later tests count their sessions
        "resume": {"grace_s": 2.0},
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


# Fixtures that start an engine: a test that uses one (directly or through another fixture) is an
# ``engine`` test wherever it lives (pyproject.toml's markers, docs/testing.md).
ENGINE_FIXTURES = frozenset({"cpu_server"})


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects on the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session", autouse=True)
def _need_espeak() -> None:
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng is required for the spoken fixtures (apt-get install espeak-ng)")


class CpuServer:
    """``realtime-omni serve`` with the embedded CPU cascade (configs/cpu.yaml), in its own process
    (vLLM starts its engine in a child process), shared by every test that needs it."""

    def __init__(self, ws_base: str, timings_log: Path, sip_port: int, mcp_url: str) -> None:
        self.ws_base = ws_base
        self.sip_port = sip_port  # its SIP bridge (UDP)
        self.mcp_url = mcp_url  # the one MCP server its sessions may call (a test serves it: tests/pipelines/test_cpu_mcp.py)
        self.http = ws_base.replace("ws://", "http://").removesuffix("/v1")
        self.timings_log = timings_log

    def stats(self) -> dict[str, float]:
        """The pipeline's own accounting and vLLM's counters, as /metrics publishes them."""
        text = httpx.get(f"{self.http}/metrics", timeout=10).text
        prefix = "realtime_pipeline_"
        return {
            line.split()[0][len(prefix) :]: float(line.split()[1]) for line in text.splitlines() if line.startswith(prefix)
        }

    def timings(self) -> list[dict[str, Any]]:
        lines = self.timings_log.read_text().splitlines() if self.timings_log.exists() else []
        return [json.loads(line) for line in lines]


def cpu_config(**thinker: Any) -> dict[str, Any]:
    config = config_file.raw("cpu")
    config["pipeline"]["options"]["thinker"].update(thinker)
    return config


@pytest.fixture(scope="session")
def cpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CpuServer]:
    from tests.support.ports import reserved_port
    from tests.support.sip import free_udp_port

    log = tmp_path_factory.mktemp("cpu") / "timings.jsonl"
    sip_port = free_udp_port()
    mcp_port, held = reserved_port()  # held for the session: a test serves it much later
    mcp_url = f"http://127.0.0.1:{mcp_port}/mcp"  # the MCP server a test serves (tests/pipelines/test_cpu_mcp.py)
    # three sentences at most: answers long enough to interrupt while the thinker still writes
    config = cpu_config(max_sentences=3)
    # semantic_vad's decisions wait for the words and their judgement however slow the box:
    # the tests are about what they weigh. On two busy cores the first judgement of a fresh server
    # has taken over 1.5 s (the default bound), and the decision then went on the sound alone
    # (docs/turn-taking.md; how fast it must be is issue 37's).
    config["turn_end"]["hearing_wait_ms"] = 10_000
    config["mcp"] = {"allowed_servers": [mcp_url]}
    with held, server_process({**config, "timings_log": str(log), "sip": {"port": sip_port}}, startup_s=900) as ws_base:
        yield CpuServer(ws_base, log, sip_port, mcp_url)
