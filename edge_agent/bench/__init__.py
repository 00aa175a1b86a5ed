"""Benchmarks: commands that measure, print a table and write JSON.

Ratios are always measured side by side in one run (the machines are shared
and noisy): the things compared run interleaved, round by round.
"""
