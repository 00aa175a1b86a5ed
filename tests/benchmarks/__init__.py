"""The tests of the project's benchmarks (`benchmarks/`): their pure parts, and each run
with tiny settings against the real servers it starts."""
