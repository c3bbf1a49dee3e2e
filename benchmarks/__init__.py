"""Benchmarks: compiled cost/memory analysis and side-by-side step timing."""
