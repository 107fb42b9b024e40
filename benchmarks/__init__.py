"""Benchmark scripts (run as python -m benchmarks.NAME) and the machine's engine lock the tests share."""
