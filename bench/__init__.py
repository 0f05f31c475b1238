"""Benchmarks, load tests and fuzzers: clients of the product, run from the repository root as
``python -m bench <name>`` (or ``python -m bench.<name>``); ``python -m bench`` lists them. The
wheel does not ship this package and nothing in the product imports it."""
