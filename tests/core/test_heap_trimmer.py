"""When a server gives back what freed buffers left in the heap
(:class:`edge_core.memory.HeapTrimmer`), against a fake ``/proc/self/statm``; the real
gateway's memory is in tests/e2e/test_abuse_memory.py."""

from __future__ import annotations

import resource
from pathlib import Path

from edge_core.memory import HeapTrimmer

MiB = 1 << 20
PAGE = resource.getpagesize()


class Process:
    """A fake process: its resident memory in ``statm``, and a trim that brings it down
    to what is in use."""

    def __init__(self, root: Path, resident: int) -> None:
        self.statm = root / "statm"
        self.in_use = resident
        self.set(resident)

    def set(self, resident: int) -> None:
        self.statm.write_text(f"{10 * resident // PAGE} {resident // PAGE} 0 0 0 0 0\n")

    def resident(self) -> int:
        return int(self.statm.read_text().split()[1]) * PAGE

    def trim(self) -> None:
        self.set(self.in_use)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def trimmer(process: Process, clock: Clock | None = None) -> HeapTrimmer:
    return HeapTrimmer(statm=str(process.statm), trim=process.trim, clock=clock or Clock())


def test_a_quiet_process_above_its_floor_is_trimmed_every_five_seconds(tmp_path: Path) -> None:
    """Within 4 MiB of the lowest a trim left, or growing, nothing is trimmed; quiet
    and above it, a trim at most every 5 s (freed pages show in resident memory only
    once trimmed, so only a look can tell)."""
    process, clock = Process(tmp_path, 100 * MiB), Clock()
    heap = trimmer(process, clock)
    for resident in (102, 103, 101, 110, 115):
        process.set(resident * MiB)
        clock.now += 0.5
        assert not heap.check()
    clock.now = 4.9
    assert not heap.check()  # 115 again, quiet: but not 5 s since the last trim yet
    clock.now = 5.0
    assert heap.check()
    process.set(115 * MiB)  # in use: the trim gave nothing back
    process.in_use = 115 * MiB
    clock.now += 1
    assert not heap.check()
    clock.now += 5
    assert heap.check()  # every 5 s while above the floor
    assert heap.trims == 2


def test_growth_is_trimmed_and_once_more_when_it_stops(tmp_path: Path) -> None:
    """A burst of large requests: a trim when memory grew past the mark (what the
    requests still hold stays), and one more at the first check that finds it no longer
    growing, which gives back the rest; then none while nothing grows."""
    process = Process(tmp_path, 100 * MiB)
    heap = trimmer(process)
    process.in_use = 160 * MiB  # a request in flight
    process.set(200 * MiB)
    assert heap.check()
    assert process.resident() == 160 * MiB
    process.set(170 * MiB)  # still growing (less than 16 MiB): the next request
    assert not heap.check()
    process.in_use = 100 * MiB  # the burst is over: its pieces are free
    assert heap.check()  # no longer growing
    assert process.resident() == 100 * MiB
    for _ in range(3):
        assert not heap.check()
    assert heap.trims == 2


def test_memory_in_use_moves_the_mark_up(tmp_path: Path) -> None:
    """Memory that a trim cannot give back (a model loaded) is not trimmed at every
    look: after the growth's trim and its follow-up, only every 5 s."""
    process = Process(tmp_path, 100 * MiB)
    heap = trimmer(process)
    process.in_use = 300 * MiB
    process.set(300 * MiB)
    assert heap.check()
    assert heap.check()  # the follow-up: nothing more to give back
    for _ in range(5):
        assert not heap.check()
    assert heap.trims == 2


def test_what_a_burst_left_is_given_back_though_it_dipped_on_the_way(tmp_path: Path) -> None:
    """A dip in the middle of a burst takes the follow-up trim, and what is left free
    when the burst is over is given back within 5 s all the same (the review's case:
    in use 160, 158, 170, then 100 MiB while resident memory stayed at 173)."""
    process, clock = Process(tmp_path, 100 * MiB), Clock()
    heap = trimmer(process, clock)
    process.in_use = 160 * MiB
    process.set(200 * MiB)
    assert heap.check()  # grown: trimmed to what the requests hold
    process.in_use = 158 * MiB
    assert heap.check()  # a dip, taken for the end: the follow-up
    process.in_use = 170 * MiB
    process.set(173 * MiB)
    assert not heap.check()  # growing again, by less than 16 MiB
    process.in_use = 100 * MiB  # the burst is over
    assert not heap.check()
    clock.now += 5
    assert heap.check()
    assert process.resident() == 100 * MiB
    assert not heap.check()


def test_without_proc_or_malloc_trim_it_does_nothing(tmp_path: Path) -> None:
    missing = HeapTrimmer(statm=str(tmp_path / "absent"), trim=lambda: None)
    assert missing.resident() is None
    assert not missing.check()
    process = Process(tmp_path, 100 * MiB)
    untrimmable = HeapTrimmer(statm=str(process.statm))
    untrimmable._trim = None  # a C library without malloc_trim (musl)
    process.set(900 * MiB)
    assert not untrimmable.check()


def test_the_real_process_is_read_and_glibcs_trim_is_called(tmp_path: Path) -> None:
    """This process's ``/proc/self/statm`` is read, and glibc's ``malloc_trim`` is
    found and called (the growth comes from a fake ``statm``: whether an allocation
    grows resident memory depends on what the heap already holds)."""
    resident = HeapTrimmer().resident()
    assert resident is not None and resident > 10 * MiB
    process = Process(tmp_path, 100 * MiB)
    heap = HeapTrimmer(statm=str(process.statm))  # the real malloc_trim
    process.set(200 * MiB)
    assert heap.check()
    assert heap.trims == 1
