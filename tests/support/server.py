"""A real server on a real socket, in a thread of the test process (so tests can read its own
accounting), plus helpers to run code on its event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from host.app import create_app
from host.runner import RealtimeUvicorn, uvicorn_config
from realtime_omni.config import ServerConfig, from_dict
from realtime_omni.server import Server

T = TypeVar("T")


class ServerThread:
    def __init__(self, config: ServerConfig | dict[str, Any]) -> None:
        self.config = config if isinstance(config, ServerConfig) else from_dict(config)
        self.server = Server(self.config)
        self.app = create_app(self.server)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.uvicorn = RealtimeUvicorn(uvicorn_config(self.app, self.server, log_level="warning"), self.server)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name=f"server-{self.port}", daemon=True)

    @property
    def http_url(self) -> str:
        return f"{'https' if self.config.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def ws_base(self) -> str:
        return f"{'wss' if self.config.tls else 'ws'}://127.0.0.1:{self.port}/v1"

    def _run(self) -> None:
        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            await self.uvicorn.serve(sockets=[self._sock])

        asyncio.run(main())

    def start(self) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + 60
        while not (self.uvicorn.started and self.server.ready):
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        self._thread.join(timeout=30)

    def _submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Run ``fn`` on the server's loop (a coroutine function is awaited there)."""
        assert self.loop is not None

        async def run() -> Any:
            result = fn()
            if asyncio.iscoroutine(result):
                result = await result
            return result

        return asyncio.run_coroutine_threadsafe(run(), self.loop)

    def call(self, fn: Callable[[], T]) -> T:
        """``fn``'s result, computed on the server's loop (from a thread that is not that loop)."""
        return self._submit(fn).result(timeout=30)

    async def acall(self, fn: Callable[[], T]) -> T:
        """The same, awaited from another event loop (the tests')."""
        return await asyncio.wrap_future(self._submit(fn))

    def session_tasks(self) -> list[str]:
        """Names of the server loop's tasks that belong to a realtime session."""

        def names() -> list[str]:
            return sorted(
                t.get_name()
                for t in asyncio.all_tasks()
                if t.get_name().split(":")[0] in {"response", "transcribe", "idle", "evict", "ws-read", "ws-write", "stage-0", "stage-1", "stage-2"}
            )

        return self.call(names)


async def wait_until(predicate: Callable[[], Any], timeout: float = 10.0) -> bool:
    """Poll ``await predicate()`` every 50 ms until it holds (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.05)
    return False


async def until_healthy(port: int, timeout: float = 15.0) -> bool:
    """Poll a server process's ``/healthz`` on ``port`` until it answers 200 (True) or ``timeout``."""
    import httpx

    async with httpx.AsyncClient() as http:

        async def ok() -> bool:
            try:
                return (await http.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200
            except httpx.TransportError:
                return False

        return await wait_until(ok, timeout)
