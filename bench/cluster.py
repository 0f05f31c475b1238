"""A deployment of several replicas on this machine, all on loopback: ``redis-server``, N
``realtime-omni serve`` processes sharing it (``--state-url``), and nginx in front of them with
the project's own deploy/nginx.conf (its replica addresses and port replaced). The deployment
test (tests/deploy/) and the load figure (``python -m bench cluster_load``) start it the same way.

Needs Debian's ``nginx`` and ``redis-server`` (scripts/test installs them).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .common import ServerURL, free_port, stop, wait_ready

NGINX_CONF = Path(__file__).parents[1] / "deploy" / "nginx.conf"
Preexec = Callable[[], None] | None  # run in a child before its program (subprocess's preexec_fn)


def missing() -> list[str]:
    """The programs a cluster needs that this machine lacks."""
    found = {"nginx": shutil.which("nginx") or (os.path.exists("/usr/sbin/nginx") and "/usr/sbin/nginx"), "redis-server": shutil.which("redis-server")}
    return [name for name, path in found.items() if not path]


@dataclass
class Replica:
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Cluster:
    redis_url: str
    port: int  # nginx's
    replicas: list[Replica] = field(default_factory=list)

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1"


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited during startup")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout_s:g} s")


@contextlib.contextmanager
def redis_server(port: int | None = None, *, preexec_fn: Preexec = None) -> Iterator[ServerURL]:
    """A throwaway ``redis-server`` on a loopback port (``port``, or a free one), nothing saved;
    yields its URL (``.process``: the server, to stop it early). ``preexec_fn`` runs in the child
    before the program (bench.cgroup: a group to start in)."""
    port = port or free_port()
    with tempfile.TemporaryDirectory() as folder:
        cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", folder, "--loglevel", "warning"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, preexec_fn=preexec_fn)
        try:
            _wait_port(port, proc, "redis-server")
            url = ServerURL(f"redis://127.0.0.1:{port}/0")
            url.process = proc
            yield url
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=10)


def nginx_conf(port: int, upstreams: list[int]) -> str:
    """deploy/nginx.conf with these replica ports and this listening port; the replicas' route
    tags are r1, r2, ... in that order (``cluster`` starts them so)."""
    text = NGINX_CONF.read_text()
    servers = "".join(f"    server 127.0.0.1:{p} max_fails=1 fail_timeout=5s;\n" for p in upstreams)
    text, n = re.subn(r"(    server 127\.0\.0\.1:\d+ [^\n]*\n)+", servers, text)
    assert n == 1, "deploy/nginx.conf: no upstream server lines found"
    routes = "".join(f"    ~^sess_r{i}_ realtime_omni_r{i};\n" for i in range(1, len(upstreams) + 1))
    text, n = re.subn(r"(    ~\^sess_r\d+_ +realtime_omni_r\d+;\n)+", routes, text)
    assert n == 1, "deploy/nginx.conf: no route lines in its map"
    alone = "".join(f"upstream realtime_omni_r{i} {{ server 127.0.0.1:{p}; }}\n" for i, p in enumerate(upstreams, 1))
    text, n = re.subn(r"(upstream realtime_omni_r\d+ \{[^}]*\}\n)+", alone, text)
    assert n == 1, "deploy/nginx.conf: no upstream per replica"
    text, n = re.subn(r"listen 127\.0\.0\.1:\d+;", f"listen 127.0.0.1:{port};", text)
    assert n == 1, "deploy/nginx.conf: no listen line found"
    return text


@contextlib.contextmanager
def nginx(upstreams: list[int], *, preexec_fn: Preexec = None) -> Iterator[int]:
    """nginx (in the foreground, as a user's would run the site file) balancing ``upstreams``;
    yields its port."""
    port = free_port()
    with nginx_site(nginx_conf(port, upstreams), [port], preexec_fn=preexec_fn):
        yield port


@contextlib.contextmanager
def nginx_site(site_text: str, ports: list[int], *, preexec_fn: Preexec = None) -> Iterator[None]:
    """nginx in the foreground with ``site_text`` in its http block (as a user's conf.d would hold
    it), once it listens on every one of ``ports``; stopped gracefully after."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "site.conf").write_text(site_text)
        main = f"""
daemon off;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 16384; }}
http {{
    access_log off;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    include {root}/site.conf;
}}
"""
        (root / "nginx.conf").write_text(main)
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        proc = subprocess.Popen([binary, "-c", str(root / "nginx.conf"), "-p", folder], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, preexec_fn=preexec_fn)
        try:
            for port in ports:
                _wait_port(port, proc, f"nginx (see {root}/error.log)")
            yield
        finally:
            proc.send_signal(signal.SIGQUIT)  # graceful: finish the requests in flight
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def replica(config: dict[str, Any], redis_url: str, *, workers: int = 1, port: int | None = None, preexec_fn: Preexec = None) -> Iterator[Replica]:
    """``realtime-omni serve`` sharing ``redis_url``, ready (``/healthz`` 200) when yielded."""
    port = port or free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump({**config, "port": port}, f)
        path = f.name
    log = Path(tempfile.gettempdir()) / f"realtime-omni-replica-{port}.log"
    with open(log, "w") as out:
        cmd = [sys.executable, "-m", "host", "serve", "--config", path, "--state-url", redis_url, "--workers", str(workers), "--log-level", "warning"]
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=preexec_fn)
        try:
            wait_ready(proc, f"http://127.0.0.1:{port}/healthz", 120, "a replica", log, every_s=0.1)
            yield Replica(port, proc, log)
        finally:
            if proc.poll() is None:
                stop(proc)
            os.unlink(path)


@contextlib.contextmanager
def cluster(config: dict[str, Any], replicas: int = 2, *, workers: int = 1, place: Callable[[str], Preexec] | None = None) -> Iterator[Cluster]:
    """Redis, ``replicas`` servers (each of ``workers`` processes) sharing it, nginx in front.
    ``place(role)`` ("redis", "replica-0", "replica-1", ..., "nginx") gives the ``preexec_fn`` each
    starts with (bench.cluster_load --quota: the cgroup it runs in)."""

    def where(role: str) -> Preexec:
        return place(role) if place is not None else None

    with contextlib.ExitStack() as stack:
        redis_url = stack.enter_context(redis_server(preexec_fn=where("redis")))
        started = [
            stack.enter_context(replica({**config, "route_tag": f"r{i + 1}"}, redis_url, workers=workers, preexec_fn=where(f"replica-{i}")))
            for i in range(replicas)
        ]
        port = stack.enter_context(nginx([r.port for r in started], preexec_fn=where("nginx")))
        yield Cluster(redis_url, port, started)
