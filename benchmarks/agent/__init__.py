"""The device's benchmarks (:mod:`~benchmarks.agent.commands` makes them commands).

Ratios are always measured side by side in one run (the machines are shared and
noisy): the things compared run interleaved, round by round.
"""
