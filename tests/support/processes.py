"""Servers in processes of their own: ``realtime-omni serve`` (``server_process``, ready when its
``/healthz`` answers) and ``vllm serve`` (``vllm_serve``), and a free TCP port.

The benchmarks start their servers the same way, so these live in ``bench/common.py`` and the
tests take them from here: bench never imports the tests (the tests test the benches), and a
test of the product names no bench module."""

from bench.common import free_port, server_process, vllm_serve

__all__ = ["free_port", "server_process", "vllm_serve"]
