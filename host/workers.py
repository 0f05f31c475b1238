"""``realtime-omni serve --workers N``: N server processes on one machine sharing one port, one
event loop each (one loop carries ~125-150 real-time sessions on two cores; more cores want more
loops).

This process binds the port and starts N workers (spawned, not forked: each loads its own
pipeline); the kernel hands each new connection to one of them. Each worker also listens on a
port of its own (bound to ``host``, chosen by the kernel), the address the other workers forward
a call's control and sidebands to: the workers are replicas like any other, sharing their keys,
session count and calls through ``state_url`` (Redis), which ``--workers`` therefore needs.

SIGTERM and SIGINT go on to every worker (each drains as a lone server would); a worker that
dies is started again after a second, until this process is told to stop; one that dies while
starting (a bad config, a model that will not load) stops them all.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import time
import urllib.parse
from collections.abc import Callable
from multiprocessing.context import SpawnProcess
from types import FrameType

from realtime_omni.config import ServerConfig

log = logging.getLogger(__name__)

RESTART_AFTER_S = 1.0
FAILED_START_S = 30.0  # a worker that dies this soon after starting will not do better restarted


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def advertised(config: ServerConfig, port: int, *, worker: bool = False) -> str:
    """The URL other replicas reach this process at: ``advertise_url`` (a worker: its host, with
    the worker's own port), else its bound address."""
    if config.advertise_url:
        if not worker:
            return config.advertise_url
        return urllib.parse.urlsplit(config.advertise_url)._replace(netloc=f"{urllib.parse.urlsplit(config.advertise_url).hostname}:{port}").geturl()
    host = config.host
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    elif ":" in host:
        host = f"[{host}]"
    return f"{'https' if config.tls else 'http'}://{host}:{port}"


def supervise(count: int, target: Callable[[socket.socket, int], None], config: ServerConfig) -> int:
    """Run ``target(shared_socket, worker_index)`` in ``count`` spawned processes until SIGTERM or
    SIGINT; returns the exit status (the largest a worker ended with at the end, 130 for SIGINT)."""
    shared = bind(config.host, config.port)
    ctx = multiprocessing.get_context("spawn")
    stopping: list[int] = []  # the signal that stops them (-1: a worker that failed to start)
    started: dict[int, float] = {}

    def start(index: int) -> SpawnProcess:
        proc = ctx.Process(target=target, args=(shared, index), name=f"realtime-omni-worker-{index}", daemon=False)
        proc.start()
        started[index] = time.monotonic()
        return proc

    def on_signal(sig: int, frame: FrameType | None) -> None:
        stopping.append(sig)
        for proc in workers:
            if proc.is_alive() and proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, sig)

    workers = [start(i) for i in range(count)]
    log.info("serving on %s:%d with %d workers (pids %s)", config.host, config.port, count, ", ".join(str(p.pid) for p in workers))
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stopping:
            for i, proc in enumerate(workers):
                if not proc.is_alive() and not stopping and time.monotonic() - started[i] < FAILED_START_S:
                    log.error("worker %d (pid %s) failed while starting (exit status %s); stopping the others", i, proc.pid, proc.exitcode)
                    on_signal(signal.SIGTERM, None)
                    stopping[0] = -1  # (not a signal: the exit status says why)
                elif not proc.is_alive() and not stopping:
                    log.error("worker %d (pid %s) exited with %s; starting it again", i, proc.pid, proc.exitcode)
                    time.sleep(RESTART_AFTER_S)
                    if not stopping:
                        workers[i] = start(i)
            time.sleep(0.2)
        for proc in workers:
            proc.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shared.close()
    if stopping[0] == signal.SIGINT:
        return 130
    codes = [p.exitcode for p in workers]
    return max((c for c in codes if c is not None and c > 0), default=1 if stopping[0] == -1 else 0)

