"""Servers in processes of their own: ``realtime-omni serve`` (``server_process``, ready when its
``/healthz`` answers: ``wait_ready``; drained, then killed if it lingers: ``stop``) and ``vllm
serve`` (``vllm_serve``), a free TCP port, and a deployment of replicas behind nginx sharing a
``redis-server`` (``cluster``, ``replica``, ``redis_server``).

The benchmarks start their servers the same way, so these live in ``bench/common.py`` and the
tests take them from here: bench never imports the tests (the tests test the benches), and a
test of the product names no bench module."""

from bench.cluster import cluster, nginx_site, redis_server, replica
from bench.common import free_port, server_process, stop, vllm_serve, wait_ready

__all__ = ["cluster", "free_port", "nginx_site", "redis_server", "replica", "server_process", "stop", "vllm_serve", "wait_ready"]
