"""Benchmarks: scripts that print medians and ratios (run them with the project installed)."""
