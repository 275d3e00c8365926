"""Workloads for trying the tracker, with the Python resource-tracker 0.5.0's names:
`cpu_single` keeps one core busy, `cpu_multi` several (one process each)."""

from __future__ import annotations

import os
import time


def cpu_single(duration: float = 1) -> None:
    """Keeps this interpreter's core busy for `duration` seconds of wall time."""
    end = time.monotonic() + duration
    x = 0
    while time.monotonic() < end:
        for i in range(1000):
            x += i * i


def _burn(duration: float) -> None:
    cpu_single(duration)


def cpu_multi(duration: float = 1, ncores: int = os.cpu_count() or 1) -> float:
    """Keeps `ncores` cores busy for `duration` seconds, one forked process each
    (children of this interpreter, so in its tree); returns the wall seconds taken."""
    import multiprocessing

    if ncores < 1:
        raise ValueError(f"ncores must be at least 1, not {ncores!r}")
    start = time.monotonic()
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_burn, args=(duration,)) for _ in range(ncores)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return time.monotonic() - start
