"""Benchmarks and load tests. Run from the repository root: ``python -m bench.<name> --help``."""
