"""Benchmarks behind ``mmserve bench``: each returns a JSON-able dict and writes its files."""
